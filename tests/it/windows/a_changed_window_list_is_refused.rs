//! The windows of a board are pinned by its data like every shaping setting: a window
//! added, removed or resized between two runs, or a board with one `window` given
//! several, is refused at start (exit 64, naming `windows`), and a script call made with
//! the edited list writes nothing. The same widths in another order or spelling are the
//! same board.

use std::path::{Path, PathBuf};

use rollboard::domain::board::Board;
use rollboard::store::Store;

use crate::support::boards::{apply_events, board, ev, snapshot, HOUR};
use crate::support::cli::{assert_exit, run_rollboard, stderr};
use crate::support::config::{board_of, edit_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::keys::{instance_in, schema};
use crate::support::redis::{free_port, RedisServer};

const NOW: i64 = 1_763_700_000_000;

/// The board `tips` of hourly slices with `window` (`window = "6h"` or
/// `windows = ["2h", "6h"]`), as a TOML table.
fn tips(window: &str) -> String {
    format!("[[boards]]\nname = \"tips\"\nmember = \"user\"\n{window}\nslice = \"1h\"\n")
}

/// A config for a daemon on `port` talking to `redis`, with `tips` beside the test boards.
fn config(dir: &Path, redis: &RedisServer, port: u16, window: &str) -> PathBuf {
    write_config(dir, redis, port, "a", &tips(window))
}

/// Records the settings of the configuration at `path` (a command that starts clean) and
/// writes data to `tips` with it.
async fn start_with_data(path: &Path, store: &Store) -> Board {
    let out = run_rollboard(path, &["verify"]);
    assert_exit(&out, 0, "the first run");
    let b = board_of(path, "tips");
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    apply_events(
        store,
        &b,
        &[ev("1", now, "ann", 7), ev("2", now - 3 * HOUR, "bob", 5)],
        now,
    )
    .await;
    b
}

/// Whether `out` is a refusal at start naming `windows`, saying what the data holds.
fn assert_refused_naming_windows(out: &std::process::Output, stored: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("board tips: windows is "), "{err}");
    assert!(
        err.contains(&format!(
            "built with windows = {stored} (rb:board:tips:settings)"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn a_window_added_removed_or_resized_is_refused_at_start() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let port = free_port();
    let path = config(dir.path(), &redis, port, "windows = [\"2h\", \"6h\"]");
    start_with_data(&path, &store).await;
    let recorded = "7200000ms 21600000ms";
    assert_eq!(
        redis
            .cli(&["HGET", &schema().settings("tips"), "windows"])
            .trim(),
        recorded
    );

    // A daemon restarted with a third window stops before it opens a listener.
    edit_config(
        &path,
        "windows = [\"2h\", \"6h\"]",
        "windows = [\"2h\", \"6h\", \"12h\"]",
    );
    let daemon = Daemon::spawn(&path, port);
    let log = daemon.log.clone();
    let status = daemon.wait_exit().await;
    assert_eq!(status.code(), Some(64), "{status:?}");
    let logged = std::fs::read_to_string(log).expect("log");
    assert!(
        logged.contains(
            "board tips: windows is 7200000ms 21600000ms 43200000ms in the configuration"
        ),
        "{logged}"
    );
    // The command line too, for each edit of the list.
    for edited in [
        "windows = [\"2h\", \"6h\", \"12h\"]",
        "windows = [\"1h\", \"2h\", \"6h\"]",
        "windows = [\"3h\", \"6h\"]",
        "windows = [\"6h\"]",
        "window = \"6h\"",
    ] {
        edit_config(&path, &tips_of_line(&path), edited);
        for args in [&["verify"][..], &["top", "tips"]] {
            assert_refused_naming_windows(&run_rollboard(&path, args), recorded);
        }
    }
    // The same widths in another order or spelling: the same board.
    for same in [
        "windows = [\"6h\", \"2h\"]",
        "windows = [\"120m\", \"6h\"]",
        "windows = [\"2h\", \"6h\"]",
    ] {
        edit_config(&path, &tips_of_line(&path), same);
        let out = run_rollboard(&path, &["verify"]);
        assert_exit(&out, 0, same);
    }
}

/// The line of the configuration at `path` that gives `tips` its window(s).
fn tips_of_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read config");
    let table = &text[text.find("name = \"tips\"").expect("tips")..];
    table
        .lines()
        .find(|l| l.starts_with("window"))
        .expect("a window line")
        .to_string()
}

#[tokio::test]
async fn a_board_with_one_window_given_several_is_refused_at_start() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let path = config(dir.path(), &redis, free_port(), "window = \"6h\"");
    start_with_data(&path, &store).await;
    // The record of a board with one window holds no `windows`.
    assert_eq!(
        redis
            .cli(&["HEXISTS", &schema().settings("tips"), "windows"])
            .trim(),
        "0"
    );
    edit_config(&path, "window = \"6h\"", "windows = [\"2h\", \"6h\"]");
    let out = run_rollboard(&path, &["verify"]);
    assert_refused_naming_windows(&out, "(none)");
    assert!(
        stderr(&out).contains("windows is 7200000ms 21600000ms in the configuration"),
        "{}",
        stderr(&out)
    );
    // Without the board-level record (data written before it existed), the instance's
    // own fingerprint tells the same.
    redis.cli(&["DEL", &schema().settings("tips")]);
    let err = stderr(&run_rollboard(&path, &["verify"]));
    assert!(
        err.contains("board tips: windows is 7200000ms 21600000ms in the configuration")
            && err.contains("built with windows = (none) (rb:{tips}:meta)"),
        "{err}"
    );
    // A list of one is the same board as its one `window`.
    edit_config(&path, "windows = [\"2h\", \"6h\"]", "windows = [\"6h\"]");
    let out = run_rollboard(&path, &["verify"]);
    assert_exit(&out, 0, "windows = [\"6h\"]");
}

#[tokio::test]
async fn an_apply_with_an_edited_window_list_writes_nothing() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = crate::windows::one_ingest_every_window::two_windows("tips");
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    apply_events(&store, &b, &[ev("1", now, "ann", 7)], now).await;
    let before = snapshot(&store, &b).await;
    assert!(
        before.contains_key(&instance_in("tips", None, "2h").result()),
        "{before:?}"
    );
    let with = |widths: &[i64]| {
        let mut edited = board("tips", HOUR, *widths.iter().max().expect("a width"));
        edited.windows = widths
            .iter()
            .map(|&h| rollboard::domain::board::Window {
                name: format!("{h}h"),
                ms: h * HOUR,
            })
            .collect();
        edited
    };
    // A window added (narrower, or wider), resized, or removed.
    for edited in [
        with(&[1, 2, 6]),
        with(&[2, 6, 12]),
        with(&[3, 6]),
        with(&[6]),
    ] {
        let err = store
            .apply(&edited, None, &[ev("2", now, "bob", 5)], now)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("windows="), "{err}");
        assert_eq!(snapshot(&store, &b).await, before, "{:?}", edited.windows);
    }
    // The board as configured still applies.
    let out = apply_events(&store, &b, &[ev("2", now, "bob", 5)], now).await;
    assert_eq!(out, vec![rollboard::store::Outcome::Applied]);
}
