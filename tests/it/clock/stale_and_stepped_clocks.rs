//! Clocks that are stale or stepped: a daemon whose measure of Redis's clock is stale while
//! its host's clock steps, and a replay on a host whose clock runs ahead, never count a tip
//! twice; the forget edge is judged alike by the fast and the exact apply path.

use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;

use crate::support::boards::{apply_events, board, ev, redis_now, total_at};
use crate::support::daemon::Daemon;
use crate::support::env::faketime_library;
use crate::support::events::{xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::drained;

/// libfaketime (preloaded directly, so that signals reach the daemon itself), its offset read
/// from `file` on every call: writing the file steps the daemon's clock as NTP would.
fn stepping_clock(file: &std::path::Path) -> Vec<(&'static str, String)> {
    let library = faketime_library();
    vec![
        ("LD_PRELOAD", library.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
    ]
}

/// A daemon config reaching Redis at `url`, rolling every second one 10-minute board of
/// 1-minute slices.
fn ten_minute_config(dir: &std::path::Path, url: &str, port: u16) -> std::path::PathBuf {
    let path = dir.join("tips.toml");
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{url}\"\n[ingest]\nconsumer = \"c\"\nblock = \"100ms\"\nclaim_idle = \"1s\"\n\
             [schedule]\nroll = \"* * * * * *\"\nresummarize = \"* * * * * *\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n[[boards]]\nname = \"tips_10m\"\nmember = \"user\"\n\
             window = \"10m\"\nslice = \"1m\"\n"
        ),
    )
    .expect("write config");
    path
}

/// The one board of [`ten_minute_config`]: 10 minutes of 1-minute slices.
fn tips_10m() -> rollboard::domain::board::Board {
    rollboard::config::Settings::from_toml(
        "[[boards]]\nname = \"tips_10m\"\nmember = \"user\"\nwindow = \"10m\"\nslice = \"1m\"\n",
    )
    .expect("board")
    .boards
    .remove(0)
}

/// A daemon whose host clock starts 10 minutes behind Redis's (libfaketime reading its
/// offset from `offset`, so a test can step it), as user `rb` (whose grants a test can
/// take away), on a 10-minute board of 1-minute slices.
struct SteppedRig {
    redis: RedisServer,
    _dir: tempfile::TempDir,
    offset: std::path::PathBuf,
    daemon: Daemon,
    store: Store,
    board: rollboard::domain::board::Board,
}

impl SteppedRig {
    async fn start() -> SteppedRig {
        let redis = RedisServer::start();
        redis.cli(&["ACL", "SETUSER", "rb", "on", ">pw", "~*", "&*", "+@all"]);
        let dir = tempfile::tempdir().expect("dir");
        let offset = dir.path().join("faketime");
        std::fs::write(&offset, "-10m\n").expect("write offset");
        let port = free_port();
        let url = format!("redis://rb:pw@127.0.0.1:{}", redis.port);
        let config = ten_minute_config(dir.path(), &url, port);
        let daemon = Daemon::spawn_with(&config, port, &stepping_clock(&offset));
        daemon.wait_up().await;
        let store = redis.store("rb").await;
        let board = tips_10m();
        SteppedRig {
            redis,
            _dir: dir,
            offset,
            daemon,
            store,
            board,
        }
    }

    /// Appends `events` and waits until the daemon has taken them.
    async fn send(&self, events: &[Fields]) {
        xadd_all(self.store.client(), intake_stream(), events).await;
        assert!(drained(&self.store).await, "{}", self.daemon.logs());
    }

    /// The daemon's measure of Redis's clock goes stale (user `rb` loses `TIME`), then the
    /// host's clock is stepped to Redis's; returns `settle` after the step.
    async fn go_stale_then_step(&self, settle: Duration) {
        self.redis.cli(&["ACL", "SETUSER", "rb", "-time"]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&self.offset, "+0\n").expect("write offset");
        tokio::time::sleep(settle).await;
    }
}

/// Tip `tip-1` of 7 from u1 at `ts`.
fn tip_1(ts: i64) -> Fields {
    vec![
        ("user".into(), "u1".into()),
        ("amount".into(), "7".into()),
        ("id".into(), "tip-1".into()),
        ("ts".into(), ts.to_string()),
    ]
}

/// The daemon's measure of Redis's clock goes stale (its `TIME` keeps failing) and then the
/// host's clock is stepped 10 minutes forward (NTP correcting a clock that ran behind).
/// The rolls after that must still be judged by Redis's clock: a roll at the stale measure
/// would be 10 minutes ahead, expiring a tip that is live for 2 more minutes, for good.
#[tokio::test]
async fn a_roll_is_never_ahead_of_redis_when_the_clock_measure_is_stale_and_the_host_clock_steps() {
    let rig = SteppedRig::start().await;
    let (store, b, daemon) = (&rig.store, &rig.board, &rig.daemon);
    // Live for 2 more minutes by Redis's clock (8 minutes old in a 10-minute window).
    rig.send(&[tip_1(redis_now(store).await - 8 * 60_000)])
        .await;
    assert_eq!(
        total_at(store, &b.widest(), "u1", redis_now(store).await).await,
        Some(7)
    );
    // The measure goes stale, then the host's clock is stepped to the right time.
    rig.go_stale_then_step(Duration::from_secs(4)).await;
    let now = redis_now(store).await;
    let (watermark, _) = store.meta(&b.widest(), None).await.expect("meta");
    assert!(
        watermark.is_none_or(|w| w <= b.slice_of(now) - b.widest().slices_in_window()),
        "watermark {watermark:?} is ahead of Redis's clock ({} by it); log:\n{}",
        b.slice_of(now) - b.widest().slices_in_window(),
        daemon.logs()
    );
    assert_eq!(
        total_at(store, &b.widest(), "u1", now).await,
        Some(7),
        "a live tip was expired; log:\n{}",
        daemon.logs()
    );
}

/// `dead-letters replay` judges time by Redis's clock, as the consumer does. A tip kept
/// once (id `tip-x`, 5 minutes ago) and a letter of the same tip sent again with a later
/// `ts` (same id): by Redis's clock the id is remembered, so the letter is a duplicate. A
/// replay on a host whose clock runs 10 minutes ahead must not take the first tip's slice
/// for forgotten and count the tip a second time.
#[tokio::test]
async fn a_replay_on_a_host_whose_clock_runs_ahead_never_counts_a_remembered_tip_twice() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = ten_minute_config(dir.path(), &redis.url(), free_port());
    let store = redis.store("rb").await;
    let b = tips_10m();
    let now = redis_now(&store).await;
    let applied = apply_events(&store, &b, &[ev("tip-x", now - 5 * 60_000, "u1", 7)], now).await;
    assert_eq!(applied, vec![rollboard::store::Outcome::Applied]);
    let later = (now + 4 * 60_000).to_string();
    let _: String = store
        .client()
        .xadd(
            dead_letter_stream(),
            false,
            None,
            "*",
            vec![
                ("user", "u1"),
                ("amount", "7"),
                ("id", "tip-x"),
                ("ts", later.as_str()),
                ("reason", "apply_failed"),
                (
                    "detail",
                    "board tips_10m: apply failed through every retry: boom; applied to the other boards only",
                ),
                ("source_id", "1-0"),
                ("source_stream", intake_stream()),
            ],
        )
        .await
        .expect("xadd");
    let library = faketime_library();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(&config)
        .args(["dead-letters", "replay"])
        .env_remove("ROLLBOARD_CONFIG")
        .env("LD_PRELOAD", library)
        .env("FAKETIME", "+10m")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("run rollboard");
    let total = total_at(&store, &b.widest(), "u1", redis_now(&store).await).await;
    assert_eq!(
        total,
        Some(7),
        "the tip counted twice: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// At the forget edge (`forget_at == now`) an event is late, one millisecond before it is
/// not, alike through a grouped fold.lua call (a chunk of new events) and an event-by-event one (a chunk that also
/// holds a duplicate, judged event by event), with `dedup_window` durations down to 0.
#[tokio::test]
async fn the_forget_edge_is_judged_alike_by_the_fast_and_the_exact_path() {
    use rollboard::domain::board::Dedup;
    use rollboard::store::Outcome::{Applied, Duplicate, Late};
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    const SLICE: i64 = 60_000;
    let base = 1_763_700_000_000 / SLICE * SLICE;
    for ms in [0, 1, 30_000] {
        let mut b = board("edge", SLICE, 10);
        b.dedup = Dedup::AfterSlice(ms);
        let ts = base + 5 * SLICE + 123;
        let edge = b.forget_at(b.slice_of(ts));
        for (now, expected) in [(edge, Late), (edge - 1, Applied)] {
            let _: () = store.client().flushall(false).await.expect("flushall");
            // A duplicate to send with the second chunk: a live slice's id, applied once.
            let live = edge + 2 * SLICE;
            apply_events(&store, &b, &[ev("old", live, "u2", 1)], now).await;
            let fast = apply_events(&store, &b, &[ev("a", ts, "u1", 5)], now).await;
            let exact = apply_events(
                &store,
                &b,
                &[ev("old", live, "u2", 1), ev("b", ts, "u1", 5)],
                now,
            )
            .await;
            assert_eq!(fast, vec![expected], "dedup {ms} ms, now {now}: fold");
            assert_eq!(
                exact,
                vec![Duplicate, expected],
                "dedup {ms} ms, now {now}: apply"
            );
            assert_eq!(
                b.widest().is_late(ts, now, None),
                expected == Late,
                "dedup {ms} ms, now {now}: Board::is_late"
            );
        }
    }
}

/// As [`a_roll_is_never_ahead_of_redis_when_the_clock_measure_is_stale_and_the_host_clock_steps`],
/// for the consumer: with its measure of Redis's clock stale and the host's clock stepped 10
/// minutes forward, a tip sent again with the same id and a later `ts` must still be a
/// duplicate (by Redis's clock the first one's id is remembered), not counted a second time.
#[tokio::test]
async fn a_consumer_whose_clock_measure_is_stale_and_whose_host_clock_steps_never_counts_a_tip_twice(
) {
    let rig = SteppedRig::start().await;
    let (store, b, daemon) = (&rig.store, &rig.board, &rig.daemon);
    let now = redis_now(store).await;
    rig.send(&[tip_1(now - 8 * 60_000)]).await;
    rig.go_stale_then_step(Duration::from_millis(500)).await;
    rig.send(&[tip_1(now + 60_000)]).await;
    assert_eq!(
        total_at(store, &b.widest(), "u1", redis_now(store).await).await,
        Some(7),
        "the tip counted twice; log:\n{}",
        daemon.logs()
    );
}
