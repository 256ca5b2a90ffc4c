//! The start-up permission check (`Store::check_permissions`, deploy/redis/README.md) probes
//! a narrower window's keys of a board with several: they carry the window after the hash
//! tag (`rb:{tips}:w:2h:meta`, `rb:changes:{tips}:2h`), so a Redis user whose key patterns
//! cover only the widest window's keys is refused at start, not at its first apply. The
//! shipped user's `~rb:*` covers them.

use rollboard::domain::board::{Board, Changes};
use rollboard::store::{Outcome, Reconnect, Store};

use crate::support::acl::{acl_server, acl_url, denied, store_as};
use crate::support::boards::{apply_events, apply_events_in, board, ev, roll_board, HOUR};
use crate::support::keys::instance;
use crate::support::redis::RedisServer;
use crate::windows::one_ingest_every_window::two_windows;

const NOW: i64 = 1_763_700_000_000;

/// `board` with a change feed of its top 3.
fn fed(mut board: Board) -> Board {
    board.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    board
}

#[tokio::test]
async fn a_user_that_may_not_write_a_narrower_window_is_refused_at_start() {
    let redis = RedisServer::start();
    // Every key but a narrower window's: after an instance's hash tag only a kind (which
    // never starts with `w`), and change streams without a window.
    let store = store_as(
        &redis,
        "widest",
        &[
            "~rb:{*}:[a-v]*",
            "~rb:changes:{*}",
            "~rb:board:*",
            "~rb:events*",
            "~rb:job:*",
            "~rb:sync:*",
        ],
    )
    .await;
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    // Enough for a board with one window, feed and all.
    let one = fed(board("one", HOUR, 6));
    assert_eq!(denied(&store, &one).await, Vec::<String>::new());
    apply_events(&store, &one, &[ev("a", now, "ann", 1)], now).await;

    let tips = two_windows("tips");
    assert_eq!(
        denied(&store, &tips).await,
        [
            "key rb:{tips}:w:2h:meta",
            "ZSCAN on key rb:{tips}:w:2h:result"
        ]
    );
    // What the check spares the daemon: every apply fails, and writes nothing.
    let failed = store
        .apply(&tips, None, &[ev("a", now, "ann", 1)], now)
        .await;
    assert!(
        format!("{failed:?}").contains("NOPERM"),
        "the apply answered {failed:?}"
    );
    assert_eq!(
        redis
            .cli(&["EXISTS", &instance("tips", None).result()])
            .trim(),
        "0"
    );

    // With the narrower window's instance keys allowed, its change stream is named.
    let ok = redis.cli(&["ACL", "SETUSER", "widest", "~rb:{*}:w:*"]);
    assert_eq!(ok.trim(), "OK");
    assert_eq!(denied(&store, &tips).await, Vec::<String>::new());
    assert_eq!(
        denied(&store, &fed(two_windows("fed"))).await,
        vec!["key rb:changes:{fed}:2h".to_string()]
    );
}

#[tokio::test]
async fn the_shipped_user_writes_and_reads_every_window() {
    let dir = tempfile::tempdir().expect("dir");
    let redis = acl_server(dir.path(), &[]);
    let store = Store::connect(&acl_url(&redis), "rb", 1, Reconnect::Never)
        .await
        .expect("connect as the rollboard user");
    let mut tips = fed(two_windows("tips"));
    tips.scope = Some("room".into());
    assert_eq!(denied(&store, &tips).await, Vec::<String>::new());
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    let out = apply_events_in(
        &store,
        &tips,
        "r1",
        &[ev("a", now, "ann", 7), ev("b", now - 3 * HOUR, "ann", 5)],
        now,
    )
    .await;
    assert_eq!(out, vec![Outcome::Applied; 2]);
    let short = tips.view(Some("2h")).expect("2h");
    let rank = store
        .rank(&short, Some("r1"), "ann", now)
        .await
        .expect("rank in the 2h window");
    assert_eq!(rank.total, Some(7));
    let verified = rollboard::roll::verify(&store, &short, Some("r1"), 100)
        .await
        .expect("verify the 2h window");
    assert!(verified.differences.is_empty(), "{verified:?}");
    roll_board(&store, &tips, now + 2 * HOUR).await;
    let rank = store
        .rank(&short, Some("r1"), "ann", now + 2 * HOUR)
        .await
        .expect("rank after the roll");
    assert_eq!(rank.total, None);
}
