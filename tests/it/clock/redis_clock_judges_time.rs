//! One clock: the window, expiry and the forgetting of ids are judged by
//! Redis's clock, so no replica's clock and no `roll --at` can make a tip count twice or
//! make live money vanish.

use std::collections::HashMap;
use std::time::Duration;

use rollboard::domain::board::{Board, Dedup};
use rollboard::metrics::Metrics;

use crate::support::asserts::verify_differences;
use crate::support::boards::{
    board, entry, ingest_settings, redis_now, roll_all, total_at, Consumer,
};
use crate::support::cli::run_rollboard;
use crate::support::config::write_config;
use crate::support::daemon::Daemon;
use crate::support::env::faketime_library;
use crate::support::events::{xadd_all, Fields};
use crate::support::keys::{intake_stream, schema};
use crate::support::proptests::runtime_with_store;
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained, wait_for};

const MINUTE: i64 = 60_000;

/// A board of one-minute slices over a one-hour window that forgets ids a minute after
/// their slice ends, and the list of boards that holds it alone.
fn forgetful() -> (Board, Vec<Board>) {
    let mut b = board("forgetful", MINUTE, 3_600_000 / MINUTE);
    b.dedup = Dedup::AfterSlice(MINUTE);
    (b.clone(), vec![b])
}

/// Dead letters in `rb:events:dead`, as (reason, id) pairs.
async fn letters(store: &rollboard::store::Store) -> Vec<(String, String)> {
    crate::support::events::letters(store)
        .await
        .into_iter()
        .map(|(_, f)| {
            (
                f.get("reason").cloned().unwrap_or_default(),
                f.get("id").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// One batch of `entries` through the consumer's path, judged at `now`.
async fn deliver(
    store: &rollboard::store::Store,
    boards: &[rollboard::domain::board::Board],
    entries: &[rollboard::ingest::stream::Entry],
    now: i64,
) {
    let metrics = Metrics::new(boards);
    let settings = ingest_settings(intake_stream(), 1);
    Consumer::new(store, boards, &settings, &metrics)
        .process(intake_stream(), entries, now)
        .await
        .expect("batch");
}

/// A forced roll ahead of the clock forgets the ids of slices that are still in the
/// window; the applies after it judge time from that roll on, so a redelivered tip is late,
/// never counted a second time.
#[tokio::test]
async fn a_redelivered_tip_after_a_forced_roll_ahead_is_never_counted_twice() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (b, boards) = forgetful();
    let t = 1_763_700_000_000 + 30_000;
    let tip = |entry_id: &str| {
        entry(
            entry_id,
            &[
                ("user", "u1"),
                ("amount", "7"),
                ("id", "tip-1"),
                ("ts", &t.to_string()),
            ],
        )
    };
    deliver(&store, &boards, &[tip(&format!("{t}-0"))], t).await;
    assert_eq!(total_at(&store, &b.widest(), "u1", t).await, Some(7));
    // Five minutes ahead: the ids of the tip's slice (forgotten one minute after it ends)
    // are due and forgotten.
    let reports = roll_all(&store, &boards, t + 5 * MINUTE, 100).await;
    assert!(
        reports.iter().map(|r| r.ids_forgotten).sum::<u64>() >= 1,
        "{reports:?}"
    );
    // The same tip again, judged by a consumer whose clock is still at t.
    deliver(&store, &boards, &[tip(&format!("{t}-1"))], t).await;
    assert_eq!(
        total_at(&store, &b.widest(), "u1", t + 5 * MINUTE).await,
        Some(7),
        "the redelivered tip counted twice"
    );
    assert_eq!(
        letters(&store).await,
        vec![("late".to_string(), "tip-1".to_string())]
    );
}

/// With a `dedup_window` duration, a tip arriving after its slice's ids may be forgotten
/// is refused as late: nothing a duration trades away can count a tip twice.
#[tokio::test]
async fn a_tip_whose_ids_may_be_forgotten_is_late_not_counted_again() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (b, boards) = forgetful();
    let t = 1_763_700_000_000 + 30_000;
    let fields = [
        ("user", "u1"),
        ("amount", "7"),
        ("id", "tip-1"),
        ("ts", "1763700030000"),
    ];
    deliver(&store, &boards, &[entry(&format!("{t}-0"), &fields)], t).await;
    // Its slice ended at t + 30 s; its ids may be forgotten a minute later.
    let later = t + 30_000 + MINUTE;
    roll_all(&store, &boards, later, 100).await;
    deliver(
        &store,
        &boards,
        &[entry(&format!("{later}-0"), &fields)],
        later,
    )
    .await;
    assert_eq!(total_at(&store, &b.widest(), "u1", later).await, Some(7));
    assert_eq!(
        letters(&store).await,
        vec![("late".to_string(), "tip-1".to_string())]
    );
    // One millisecond earlier it is still remembered, hence a duplicate, not late.
    let redis2 = RedisServer::start();
    let store2 = redis2.store("rb").await;
    deliver(&store2, &boards, &[entry(&format!("{t}-0"), &fields)], t).await;
    deliver(
        &store2,
        &boards,
        &[entry(&format!("{}-0", later - 1), &fields)],
        later - 1,
    )
    .await;
    assert_eq!(
        total_at(&store2, &b.widest(), "u1", later - 1).await,
        Some(7)
    );
    assert!(letters(&store2).await.is_empty());
}

#[tokio::test]
async fn roll_at_a_time_later_than_redis_now_needs_force() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &redis, free_port(), "a", "");
    let store = redis.store("rb").await;
    let now = redis_now(&store).await;
    // One second ahead was accepted before (anything within ingest.max_future).
    let ahead = (now + 1_000).to_string();
    let out = run_rollboard(&config, &["roll", "--at", &ahead]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Redis's clock") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        redis.cli(&["EXISTS", &schema().window("rooms_7d")]).trim(),
        "0",
        "a refused roll wrote a watermark"
    );
    let past = (now - 1_000).to_string();
    assert_eq!(
        run_rollboard(&config, &["roll", "--at", &past])
            .status
            .code(),
        Some(0)
    );
    let out = run_rollboard(&config, &["roll", "--at", &ahead, "--force"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Config text for a daemon on `port` with one 10-minute board of 1-minute slices whose
/// ids are remembered 5 minutes after their slice ends.
fn short_window_config(
    dir: &std::path::Path,
    redis: &RedisServer,
    port: u16,
    consumer: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{consumer}.toml"));
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{}\"\n[ingest]\nconsumer = \"{consumer}\"\nblock = \"100ms\"\nclaim_idle = \"1s\"\n\
             batch_size = 50\ndedup_window = \"5m\"\n[schedule]\nroll = \"* * * * * *\"\nresummarize = \"* * * * * *\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\n\n[[boards]]\nname = \"tips_10m\"\nmember = \"user\"\nwindow = \"10m\"\nslice = \"1m\"\n",
            redis.url()
        ),
    )
    .expect("write config");
    path
}

/// Starts `rollboard run` with its own clock `offset` (e.g. `+10m`) by Debian's libfaketime
/// (preloaded directly, so that signals reach the daemon itself). The monotonic clock stays
/// real, so its timers run as usual.
fn skewed_daemon(config: &std::path::Path, port: u16, offset: &str) -> Daemon {
    let library = faketime_library();
    let env = [
        ("LD_PRELOAD", library.display().to_string()),
        ("FAKETIME", offset.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
    ];
    Daemon::spawn_with(config, port, &env)
}

/// Two daemons whose clocks are 10 minutes off Redis's, one each way, share the stream
/// and both roll every second. Every tip is appended twice (same id and ts). With each
/// judging time by its own clock, the one ahead expired the whole 10-minute window and the
/// one behind took the redeliveries for new tips; by Redis's clock every tip counts once.
#[tokio::test]
async fn daemons_ten_minutes_off_either_way_count_every_tip_exactly_once() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let store = redis.store("rb").await;
    let (pa, pb) = (free_port(), free_port());
    let a = skewed_daemon(
        &short_window_config(dir.path(), &redis, pa, "ahead"),
        pa,
        "+10m",
    );
    let b = skewed_daemon(
        &short_window_config(dir.path(), &redis, pb, "behind"),
        pb,
        "-10m",
    );
    a.wait_up().await;
    b.wait_up().await;
    let now = redis_now(&store).await;
    let mut expected: HashMap<String, i64> = HashMap::new();
    let mut events: Vec<Fields> = Vec::new();
    for i in 0..300usize {
        let user = format!("u{}", i % 11);
        let amount = 1 + (i % 5) as i64;
        *expected.entry(user.clone()).or_default() += amount;
        let fields: Fields = vec![
            ("user".into(), user),
            ("amount".into(), amount.to_string()),
            ("id".into(), format!("tip-{i}")),
            ("ts".into(), (now - (i as i64 * 307) % 90_000).to_string()),
        ];
        events.push(fields.clone());
        events.push(fields);
    }
    for chunk in events.chunks(60) {
        xadd_all(store.client(), intake_stream(), chunk).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(drained(&store).await, "a:\n{}\nb:\n{}", a.logs(), b.logs());
    // A roll after the last apply (the roll time reported is Redis's).
    let drained_at = redis_now(&store).await as f64 / 1000.0;
    // Each tick runs on one replica (a lease), so either may have rolled.
    async fn rolled_after(d: &Daemon, at: f64) -> bool {
        d.metric("rollboard_last_roll_timestamp_seconds", &[]).await > at + 1.0
    }
    assert!(
        wait_for(Duration::from_secs(20), || async {
            rolled_after(&a, drained_at).await || rolled_after(&b, drained_at).await
        })
        .await,
        "no roll after the last apply; a:\n{}",
        a.logs()
    );
    let board = rollboard::config::Settings::from_toml(
        "[[boards]]\nname = \"tips_10m\"\nmember = \"user\"\nwindow = \"10m\"\nslice = \"1m\"\n",
    )
    .expect("board")
    .boards
    .remove(0);
    let page = store
        .top(&board.widest(), None, 0, 100, redis_now(&store).await)
        .await
        .expect("top");
    let got: HashMap<String, i64> = page
        .entries
        .iter()
        .map(|e| (e.member.clone(), e.total))
        .collect();
    assert_eq!(got, expected, "a:\n{}\nb:\n{}", a.logs(), b.logs());
    assert!(
        letters(&store).await.is_empty(),
        "{:?}",
        letters(&store).await
    );
    // Each says how far off it is, and stays ready: its work does not depend on its clock.
    for (d, sign) in [(&a, 1.0), (&b, -1.0)] {
        let skew = d.metric("rollboard_clock_skew_seconds", &[]).await;
        assert!((skew - sign * 600.0).abs() < 5.0, "skew {skew}");
        assert_eq!(d.metric("rollboard_clock_skewed", &[]).await, 1.0);
        let (status, body) = d.get("/readyz").await;
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["clock_skewed"], true, "{body}");
        assert_eq!(body["degraded"], true, "{body}");
    }
    assert!(a.logs().contains("clock is off"), "{}", a.logs());
    let config = short_window_config(dir.path(), &redis, free_port(), "verify");
    let out = run_rollboard(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(a.terminate().await.code(), Some(0));
    assert_eq!(b.terminate().await.code(), Some(0));
}

/// One step of a skewed-replicas case.
#[derive(Debug, Clone)]
enum Step {
    /// Replica `r` delivers events `start..start + len` (wrapping), as new stream entries.
    Deliver { r: usize, start: usize, len: usize },
    /// Replica `r` rolls at its clock's now.
    Roll { r: usize },
}

fn steps() -> impl proptest::strategy::Strategy<Value = (Vec<i64>, bool, Vec<Step>)> {
    use proptest::prelude::*;
    let step = prop_oneof![
        3 => (0..3usize, 0..EVENTS, 1..12usize).prop_map(|(r, start, len)| Step::Deliver { r, start, len }),
        1 => (0..3usize).prop_map(|r| Step::Roll { r }),
    ];
    (
        proptest::collection::vec(-600_000i64..=600_000, 3),
        any::<bool>(),
        proptest::collection::vec(step, 6..30),
    )
}

/// Events per case.
const EVENTS: usize = 40;

/// Three replicas whose own clocks are off by up to ±10 minutes (each measured against
/// Redis, as the daemon does) deliver and redeliver the same events and roll, in a random
/// order, on a board of 1 s slices over 5 s whose ids are remembered for the window or for
/// 1.5 s after their slice. Whatever the skews: every event counts at most once, the
/// stored ranking is exactly the events that were applied and are still live, `verify`
/// finds nothing, and an event is refused as late only when Redis's clock says so.
#[test]
fn replicas_with_clocks_skewed_at_random_count_every_event_once() {
    use fred::prelude::*;
    let (rt, _redis, store) = runtime_with_store();
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 16,
        ..proptest::test_runner::Config::default()
    });
    runner
        .run(&steps(), |(skews, window_dedup, steps)| {
            rt.block_on(async {
                let _: () = store.client().flushall(false).await.expect("flushall");
                run_skewed(&store, &skews, window_dedup, &steps).await;
            });
            Ok(())
        })
        .expect("skewed replicas");
}

async fn run_skewed(
    store: &rollboard::store::Store,
    skews: &[i64],
    window_dedup: bool,
    steps: &[Step],
) {
    const SLICE: i64 = 1_000;
    const TOLERANCE: i64 = 50;
    let mut b = board("skewed", SLICE, 5);
    if !window_dedup {
        b.dedup = Dedup::AfterSlice(1_500);
    }
    let boards = vec![b.clone()];
    let mut clocks = Vec::new();
    for &skew in skews {
        let clock = rollboard::domain::clock::Clock::with_local(2_000, move || {
            rollboard::domain::clock::local_ms() + skew
        });
        let measured = clock.sync(store.time_ms()).await.expect("sync");
        assert!(
            (measured - skew).abs() < 1_000,
            "measured {measured} for {skew}"
        );
        clocks.push(clock);
    }
    let t0 = redis_now(store).await;
    // (id, member, amount, ts): from 7 s ago (already out of the 5 s window) to now.
    let events: Vec<(String, String, i64, i64)> = (0..EVENTS)
        .map(|i| {
            (
                format!("e{i}"),
                format!("m{}", i % 5),
                1 + (i % 7) as i64,
                t0 - (i as i64 * 173) % 7_000,
            )
        })
        .collect();
    let mut applied: std::collections::BTreeSet<usize> = Default::default();
    let mut entry_no = 0u64;
    let all_steps = steps.iter().cloned().chain([Step::Roll { r: 0 }]);
    for step in all_steps {
        match step {
            Step::Deliver { r, start, len } => {
                let picked: Vec<usize> = (start..start + len).map(|i| i % EVENTS).collect();
                let batch: Vec<_> = picked
                    .iter()
                    .map(|&i| {
                        entry_no += 1;
                        let (id, member, amount, ts) = &events[i];
                        entry(
                            &format!("{}-{entry_no}", t0),
                            &[
                                ("user", member),
                                ("amount", &amount.to_string()),
                                ("id", id),
                                ("ts", &ts.to_string()),
                            ],
                        )
                    })
                    .collect();
                let before = letters(store).await.len();
                deliver(store, &boards, &batch, clocks[r].now()).await;
                let after = redis_now(store).await + TOLERANCE;
                let refused: std::collections::HashSet<String> = letters(store)
                    .await
                    .into_iter()
                    .skip(before)
                    .map(|(reason, id)| {
                        assert_eq!(reason, "late", "{id}");
                        id
                    })
                    .collect();
                let (watermark, _) = store.meta(&b.widest(), None).await.expect("meta");
                for &i in &picked {
                    let (id, _, _, ts) = &events[i];
                    if refused.contains(id) {
                        // Late by Redis's clock (or by a roll made by it), never by a
                        // replica's own.
                        assert!(
                            b.widest().is_late(*ts, after, watermark),
                            "{id} at {ts} refused as late by replica {r} (skew {}), Redis at {after}, watermark {watermark:?}",
                            skews[r]
                        );
                    } else {
                        applied.insert(i);
                    }
                }
            }
            Step::Roll { r } => {
                roll_all(store, &boards, clocks[r].now(), 100).await;
            }
        }
    }
    let (watermark, _) = store.meta(&b.widest(), None).await.expect("meta");
    let w = watermark.expect("rolled");
    let mut expected: std::collections::BTreeMap<String, i64> = Default::default();
    for &i in &applied {
        let (_, member, amount, ts) = &events[i];
        if b.slice_of(*ts) > w {
            *expected.entry(member.clone()).or_default() += amount;
        }
    }
    let page = store
        .top(&b.widest(), None, 0, 100, redis_now(store).await)
        .await
        .expect("top");
    let got: std::collections::BTreeMap<String, i64> = page
        .entries
        .iter()
        .map(|e| (e.member.clone(), e.total))
        .collect();
    assert_eq!(got, expected, "skews {skews:?}, steps {steps:?}");
    let d = verify_differences(store, &b, None).await;
    assert!(d.is_empty(), "{:?}", d);
}
