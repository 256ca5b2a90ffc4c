//! Faults between rollboard and Redis: connections cut right after a script call, an XACK or
//! a swap reached the server (the reply lost), a slow network, a network partition, Redis
//! killed and restarted with its append-only file, Redis out of memory. In every case the
//! result is exact: the events counted equal the events sent, none lost, none counted twice,
//! and `verify` finds nothing, without restarting the daemon.
//!
//! Every test prints its figures (`fault <name>: sent N applied N lost N doubled N`); the
//! docs/operations.md's "Failure modes" section quotes them. Every event of the daemon tests is a tip of
//! 1 to a room, so the totals of `rooms_7d` count events; every third one also carries a
//! payment in cents (refunds included) for `tips_24h`, checked exactly against the model.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollboard::domain::board::Board;
use rollboard::roll::{self, Job};
use rollboard::store::{ApplyEvent, Outcome, Reconnect, Store};
use tokio_util::sync::CancellationToken;

use crate::support::asserts::{assert_state, verify_differences};
use crate::support::boards::{apply_events, ev, now_ms, test_boards, variants, HOUR};
use crate::support::cli::assert_success;
use crate::support::config::config_for_url;
use crate::support::daemon::Daemon;
use crate::support::events::{models, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, instance, intake_stream};
use crate::support::model::{assert_matches, Instance};
use crate::support::proxy::Proxy;
use crate::support::redis::{fcall_calls, function_name, RedisServer};
use crate::support::wait::{drained, wait_for};

/// A small xorshift generator; the seed is printed with every failure.
struct Dice(u64);

impl Dice {
    fn from_clock() -> Dice {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Dice(seed)
    }

    fn roll(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `lo..=hi`.
    fn within(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.roll() % (hi - lo + 1)
    }
}

/// Events sent, and what the store counted of them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Figures {
    sent: i64,
    applied: i64,
    lost: i64,
    doubled: i64,
}

impl Figures {
    /// Prints the figures and asserts that nothing was lost or counted twice.
    fn check(&self, fault: &str) {
        eprintln!(
            "fault {fault}: sent {} applied {} lost {} doubled {}",
            self.sent, self.applied, self.lost, self.doubled
        );
        assert_eq!(
            (self.applied, self.lost, self.doubled),
            (self.sent, 0, 0),
            "{fault}: {self:?}"
        );
    }

    /// Adds one instance's counts: `model` is what the events sent add up to, the store's
    /// ranking what was counted (every event adds 1 to one member).
    async fn count(
        &mut self,
        store: &Store,
        board: &Board,
        scope: Option<&str>,
        model: &Instance,
        now: i64,
    ) {
        let mut stored: HashMap<String, i64> = HashMap::new();
        loop {
            let page = store
                .top(&board.widest(), scope, stored.len() as u64, 1000, now)
                .await
                .expect("top");
            if page.entries.is_empty() {
                break;
            }
            stored.extend(page.entries.into_iter().map(|e| (e.member, e.total)));
        }
        let expected: HashMap<String, i64> = model
            .totals()
            .into_iter()
            .map(|(m, (t, _))| (m, t))
            .collect();
        for (member, &want) in &expected {
            let got = stored.get(member).copied().unwrap_or(0);
            self.lost += (want - got).max(0);
            self.doubled += (got - want).max(0);
        }
        for (member, &got) in &stored {
            if !expected.contains_key(member) {
                self.doubled += got.max(0);
            }
        }
        self.applied += stored.values().sum::<i64>();
    }
}

/// Event `i` of a run tagged `tag`: a tip of 1 to one of 11 rooms (rooms_7d, fans_7d);
/// every third also a payment in cents for tips_24h, one in six of those a refund.
fn event(tag: &str, i: usize, now: i64) -> Fields {
    let mut fields: Fields = vec![
        ("room".into(), format!("r{}", i % 11)),
        ("user".into(), format!("u{}", i % 29)),
        ("amount".into(), "1".into()),
        ("id".into(), format!("{tag}{i}")),
        (
            "ts".into(),
            (now - (i as i64 * 997) % 3_000_000).to_string(),
        ),
    ];
    if i % 3 == 0 {
        let cents = if i % 18 == 0 {
            -(i as i64 % 500) - 1
        } else {
            100 + i as i64 % 900
        };
        let sign = if cents < 0 { "-" } else { "" };
        fields.push((
            "value".into(),
            format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100),
        ));
    }
    fields
}

fn events(tag: &str, range: std::ops::Range<usize>, now: i64) -> Vec<Fields> {
    range.map(|i| event(tag, i, now)).collect()
}

/// A daemon, its Redis, the test's own direct connection, and (optionally) a proxy between
/// the daemon and Redis.
struct Rig {
    redis: RedisServer,
    proxy: Option<Proxy>,
    store: Store,
    config: PathBuf,
    daemon: Daemon,
    _dir: tempfile::TempDir,
}

/// Starts Redis (with an fsync-always append-only file when `persistent`), a proxy when
/// `proxied`, and a daemon whose config is the test config with `edit` applied; waits for
/// `/readyz`.
async fn rig(persistent: bool, proxied: bool, edit: impl Fn(String) -> String) -> Rig {
    let redis = if persistent {
        RedisServer::start_persistent()
    } else {
        RedisServer::start()
    };
    let proxy = if proxied {
        Some(Proxy::start(redis.port).await)
    } else {
        None
    };
    let url = proxy.as_ref().map_or_else(|| redis.url(), Proxy::url);
    // Reconnects by itself, as the daemon does, so that it outlives a restart of Redis.
    let store = Store::connect(&redis.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect");
    let (dir, port, config) = config_for_url(&url, "a", "");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, edit(text)).expect("config");
    let daemon = Daemon::start(&config, port).await;
    let ready = daemon.readyz_becomes(200, Duration::from_secs(20)).await;
    assert!(ready, "daemon never got ready; log:\n{}", daemon.logs());
    Rig {
        redis,
        proxy,
        store,
        config,
        daemon,
        _dir: dir,
    }
}

impl Rig {
    fn proxy(&self) -> &Proxy {
        self.proxy.as_ref().expect("a proxied rig")
    }

    /// Waits for the stream to drain, checks every instance against the model of `sent`,
    /// runs `rollboard verify`, and returns the figures of rooms_7d.
    async fn settle(&self, sent: &[Fields]) -> Figures {
        assert!(
            drained(&self.store).await,
            "stream never drained; log:\n{}",
            self.daemon.logs()
        );
        let boards = test_boards();
        let now = now_ms();
        let models = models(sent, &boards, now);
        assert_state(&self.store, &boards, &models, now).await;
        let mut figures = Figures {
            sent: sent.len() as i64,
            ..Figures::default()
        };
        figures
            .count(&self.store, &boards[0], None, &models[&(0, None)], now)
            .await;
        verify_cli(&self.config).await;
        // Nothing was set aside: every event is valid, and an outage never dead-letters.
        let dead = self.redis.cli(&["XLEN", dead_letter_stream()]);
        assert_eq!(dead.trim(), "0", "dead letters after a fault");
        figures
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.daemon.metric(name, labels).await
    }
}

/// `rollboard verify` over every board exits 0 (run without blocking the runtime, which
/// also drives the proxy).
async fn verify_cli(config: &Path) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .arg("verify")
        .env_remove("ROLLBOARD_CONFIG")
        .output()
        .await
        .expect("run rollboard verify");
    assert_success(&out, "verify failed");
}

/// Rolls `boards` at `now` until a run rolls every instance; returns the failed runs.
async fn roll_until_complete(store: &Store, boards: &[Board], now: i64, chunk: usize) -> usize {
    let mut failed = 0;
    for _ in 0..10 {
        let run = roll::run_once(
            store,
            boards,
            Job::All,
            None,
            now,
            chunk,
            &CancellationToken::new(),
        )
        .await;
        match run {
            Ok(reports) if reports.iter().all(|r| r.complete()) => return failed,
            _ => failed += 1,
        }
    }
    panic!("no complete roll in 10 runs");
}

/// Connections cut right after an expiry chunk, a stage, a swap, a watermark or a slice-drop
/// call reached Redis, at random points of rolls that take many bounded calls: the next run
/// finishes the roll, and every board (incremental and resummarize, with and without
/// refunds) ends exactly in the model's state.
#[tokio::test]
async fn roll_calls_cut_at_random_points_end_in_the_model_state() {
    let boards = variants(HOUR, 4);
    let t0 = 1_763_700_000_000 / HOUR * HOUR;
    // 300 members in each of 4 slices, applied while all 4 are live; the roll 6 h later
    // expires 3 of them: 900 fields, in pages of 16, so ~60 expiry calls per board.
    let (members, slices) = (300usize, 4i64);
    let applied_at = t0 + 3 * HOUR + 1;
    let rolled_at = t0 + 6 * HOUR;
    let chunk = 16;
    // One round per entry, each at a random call of that script, at most the number of
    // calls it makes: two incremental boards make ~56 expiry calls each, the two
    // resummarize boards one swap each; the other scripts run a few times per board.
    let rounds: [(&str, u64); 5] = [
        ("expire", 100),
        ("stage", 3),
        ("expire", 100),
        ("swap", 2),
        ("drop_slice", 3),
    ];
    let mut dice = Dice::from_clock();
    let seed = dice.0;
    let mut total = Figures::default();
    for (round, (name, calls)) in rounds.into_iter().enumerate() {
        let redis = RedisServer::start();
        let proxy = Proxy::start(redis.port).await;
        let direct = redis.store("rb").await;
        let proxied = Store::connect(&proxy.url(), "rb", 2, Reconnect::Forever)
            .await
            .expect("connect through the proxy");
        let mut models: Vec<Instance> = vec![Instance::default(); boards.len()];
        for (b, board) in boards.iter().enumerate() {
            let events: Vec<ApplyEvent> = (0..slices)
                .flat_map(|s| {
                    (0..members).map(move |m| {
                        let amount = if board.allow_negative && m % 7 == 0 {
                            -3
                        } else {
                            1 + (m as i64 % 3) * i64::from(board.allow_negative)
                        };
                        ev(
                            &format!("e{s}-{m}"),
                            t0 + s * HOUR + m as i64,
                            &format!("m{m:03}"),
                            amount,
                        )
                    })
                })
                .collect();
            for e in &events {
                models[b].apply(&board.widest(), e, applied_at);
            }
            apply_events(&direct, board, &events, applied_at).await;
            models[b].roll(&board.widest(), rolled_at);
        }
        let nth = dice.within(1, calls) as usize;
        proxy.cut_at(&function_name(name), nth, 2);
        let failed = roll_until_complete(&proxied, &boards, rolled_at, chunk).await;
        eprintln!(
            "round {round}: cut after {name} call {nth} (seed {seed}): {} cuts, {failed} failed runs",
            proxy.cuts()
        );
        assert!(proxy.cuts() >= 1, "no cut made (seed {seed})");
        for (b, board) in boards.iter().enumerate() {
            assert_matches(&direct, &board.widest(), None, &models[b], rolled_at).await;
            let d = verify_differences(&direct, board, None).await;
            assert!(d.is_empty(), "{} (seed {seed}): {:?}", board.name, d);
            if !board.allow_negative {
                // Tips of 1: the totals count the events still in the window.
                total.sent += models[b].totals().values().map(|t| t.0).sum::<i64>();
                total
                    .count(&direct, board, None, &models[b], rolled_at)
                    .await;
            }
        }
    }
    total.check("roll calls cut (expire, stage, swap, drop_slice), 5 rounds");
}

/// Connections cut right after an apply call in the middle of a batch (a batch of 600 makes
/// several `fold.lua` calls per instance), after an XACK, and after the stage and
/// swap calls of the resummarize job (every second), while the daemon ingests: nothing lost,
/// nothing counted twice, and the daemon carries on by itself.
#[tokio::test]
async fn cuts_mid_batch_mid_ack_and_mid_swap_lose_nothing_and_double_nothing() {
    let rig = rig(false, true, |c| c).await;
    let proxy = rig.proxy();
    let now = now_ms();
    let patterns: [(&str, Vec<u8>); 4] = [
        ("apply", function_name("fold")),
        ("xack", b"XACK".to_vec()),
        ("stage", function_name("stage")),
        ("swap", function_name("swap")),
    ];
    let mut dice = Dice::from_clock();
    let seed = dice.0;
    let mut sent: Vec<Fields> = Vec::new();
    let mut fired: HashMap<&str, usize> = HashMap::new();
    for wave in 0..12 {
        let (name, pattern) = &patterns[wave % patterns.len()];
        let nth = match *name {
            "apply" => dice.within(2, 4),
            _ => dice.within(1, 3),
        } as usize;
        proxy.cut_at(pattern, nth, 1);
        let batch = events(&format!("w{wave}-"), 0..600, now);
        xadd_all(rig.store.client(), intake_stream(), &batch).await;
        sent.extend(batch);
        if wait_for(Duration::from_secs(5), || async { !proxy.armed() }).await {
            *fired.entry(name).or_default() += 1;
        }
        proxy.cut_at(pattern, 1, 0);
    }
    eprintln!("cuts made: {fired:?} (seed {seed})");
    assert!(
        fired.get("apply").copied().unwrap_or(0) >= 2,
        "apply cuts: {fired:?} (seed {seed})"
    );
    let figures = rig.settle(&sent).await;
    // A cut XACK, stage or swap is sent again on the new connection (they are idempotent);
    // a cut apply call is not (it fails its batch, applied again later). Each shows as a
    // reconnect.
    let reconnects = rig.metric("rollboard_redis_reconnects_total", &[]).await;
    eprintln!("reconnects counted: {reconnects}");
    assert!(reconnects >= 1.0, "no reconnect counted");
    assert!(
        rig.daemon.logs().contains("reconnected to redis"),
        "no log line about the reconnect"
    );
    figures.check("cuts mid-batch, mid-XACK, mid-stage/swap (12 waves)");
    assert!(rig.daemon.terminate().await.success());
}

/// An apply call whose connection is cut right after it reached Redis is not sent again on
/// the new connection (after a failover that connection may lead to another master, where
/// a confirmation would pass while the calls before it died with the old one): the apply
/// fails as an outage, and applying the whole batch again ends exactly in the model state,
/// the calls that had landed answering `Duplicate`. The calls of one instance are sent at
/// once, so the third may have reached Redis with the second (in the chunk that was let
/// through) or not at all; either way no call arrives twice.
#[tokio::test]
async fn an_apply_call_cut_after_it_reached_redis_is_not_resent() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    // Chains of `fold.lua` calls (the worker would judge these events itself).
    let store = proxy.store().await.with_transactions(false);
    let board = crate::support::boards::board("cut_once", HOUR, 24);
    let now = now_ms();
    // 70 events of distinct members: three `fold.lua` calls; the second one is cut.
    let events: Vec<ApplyEvent> = (0..70)
        .map(|i| ev(&format!("e{i}"), now - i * 1000, &format!("m{i}"), i + 1))
        .collect();
    let chunks = rollboard::store::fold_chunks(&board, &events);
    assert_eq!(chunks.len(), 3, "three calls expected");
    let mut model = Instance::default();
    for e in &events {
        model.apply(&board.widest(), e, now);
    }
    // A first apply elsewhere loads the library (a call answered "function not found"
    // counts as a call).
    let warm = crate::support::boards::board("warm", HOUR, 24);
    apply_events(&store, &warm, &[ev("w", now, "m", 1)], now).await;
    let before = fcall_calls(&redis);
    proxy.cut_at(&function_name("fold"), 2, 1);
    let failed = store.apply(&board, None, &events, now).await;
    assert!(!proxy.armed(), "the cut never happened: {failed:?}");
    let sent = fcall_calls(&redis) - before;
    eprintln!("fault apply cut once: {sent} apply calls reached redis; the apply: {failed:?}");
    assert!(failed.is_err(), "a cut apply call answered {failed:?}");
    // Whether the third call reached Redis: the member of its last event is known.
    let third = redis
        .cli(&[
            "HEXISTS",
            &instance("cut_once", None).members(),
            &events[69].member,
        ])
        .trim()
        == "1";
    let reached: usize = if third { 3 } else { 2 };
    assert_eq!(sent, reached as u64, "a call was sent again");
    let landed = chunks[..reached].iter().map(|c| c.len()).sum::<usize>();
    // The batch applied again, as a whole: the two calls that ran are duplicates.
    let again = apply_events(&store, &board, &events, now).await;
    let expected: Vec<Outcome> = (0..70)
        .map(|i| {
            if i < landed {
                Outcome::Duplicate
            } else {
                Outcome::Applied
            }
        })
        .collect();
    assert_eq!(again, expected);
    assert_matches(&store, &board.widest(), None, &model, now).await;
    let d = verify_differences(&store, &board, None).await;
    assert!(d.is_empty(), "{:?}", d);
}

/// 20-50 ms added to every chunk both ways while the daemon ingests and resummarizes
/// (claim_idle is 1 s in the test config, so slow batches meet the claim loop): the
/// results are exact and no entry is processed twice.
#[tokio::test]
async fn latency_on_every_chunk_changes_no_result() {
    let rig = rig(false, true, |c| c).await;
    let proxy = rig.proxy();
    let now = now_ms();
    let mut dice = Dice::from_clock();
    let mut sent: Vec<Fields> = Vec::new();
    for wave in 0..4 {
        let ms = dice.within(20, 50);
        proxy.latency(Duration::from_millis(ms));
        let batch = events(&format!("l{wave}-"), 0..500, now);
        xadd_all(rig.store.client(), intake_stream(), &batch).await;
        sent.extend(batch);
        // Let each latency work on a backlog for a while.
        let progressed = wait_for(Duration::from_secs(20), || async {
            rig.metric("rollboard_events_applied_total", &[]).await >= 1.0
        })
        .await;
        assert!(progressed, "log:\n{}", rig.daemon.logs());
    }
    let settled = rig.settle(&sent).await;
    proxy.latency(Duration::ZERO);
    let duplicates = rig
        .metric(
            "rollboard_events_skipped_total",
            &[("board", "rooms_7d"), ("reason", "duplicate")],
        )
        .await;
    eprintln!("duplicates skipped under latency: {duplicates}");
    // No batch was claimed or redelivered while it was still being applied.
    assert_eq!(duplicates, 0.0, "entries processed twice under latency");
    settled.check("latency 20-50 ms per chunk");
    assert!(rig.daemon.terminate().await.success());
}

/// A network partition of several seconds (connections open, nothing forwarded) while
/// the daemon ingests: `/readyz` answers 503 within its 2 s check, the Redis error counter
/// rises, a warning names the failed step; once the partition ends the daemon carries on by
/// itself and the results are exact.
#[tokio::test]
async fn a_partition_shows_in_readyz_metrics_and_log_and_heals_by_itself() {
    let rig = rig(false, true, |c| c).await;
    let proxy = rig.proxy();
    let now = now_ms();
    let mut sent = events("b", 0..2000, now);
    xadd_all(rig.store.client(), intake_stream(), &sent[..1000]).await;
    let errors_before = rig.metric("rollboard_redis_errors_total", &[]).await;
    proxy.blackhole(true);
    let partitioned = std::time::Instant::now();
    xadd_all(rig.store.client(), intake_stream(), &sent[1000..]).await;
    let unready = rig
        .daemon
        .readyz_becomes(503, Duration::from_secs(10))
        .await;
    assert!(unready, "readyz never reported the partition");
    let counted = wait_for(Duration::from_secs(15), || async {
        rig.metric("rollboard_redis_errors_total", &[]).await > errors_before
    })
    .await;
    assert!(
        counted,
        "no Redis error counted; log:\n{}",
        rig.daemon.logs()
    );
    let (_, body) = rig.daemon.get("/readyz").await;
    assert!(body.contains("\"redis\":false"), "{body}");
    assert_eq!(rig.metric("rollboard_redis_up", &[]).await, 0.0);
    // Keep the partition for a few failed probes (each waits 2 s for Redis).
    let long = wait_for(Duration::from_secs(20), || async {
        rig.daemon.get("/readyz").await.0 == 503
            && rig.metric("rollboard_redis_errors_total", &[]).await >= errors_before + 3.0
    })
    .await;
    assert!(long, "log:\n{}", rig.daemon.logs());
    eprintln!("partition lasted {:?}", partitioned.elapsed());
    proxy.blackhole(false);
    let ready = rig
        .daemon
        .readyz_becomes(200, Duration::from_secs(30))
        .await;
    assert!(ready, "never ready again; log:\n{}", rig.daemon.logs());
    let more = events("b2-", 0..500, now);
    xadd_all(rig.store.client(), intake_stream(), &more).await;
    sent.extend(more);
    let figures = rig.settle(&sent).await;
    let logs = rig.daemon.logs();
    assert!(
        logs.contains("readiness check failed"),
        "no log line about the partition:\n{logs}"
    );
    eprintln!(
        "redis errors counted: {}",
        rig.metric("rollboard_redis_errors_total", &[]).await
    );
    figures.check("blackhole (partition) during ingest");
    assert!(rig.daemon.terminate().await.success());
}

/// Redis killed (SIGKILL) and started again on the same port and directory while the
/// daemon ingests: with `appendfsync always` every write Redis acknowledged survives, so
/// nothing acked is lost and nothing applied is applied again. Then a graceful `SHUTDOWN`
/// with `appendfsync everysec` (the shutdown writes and syncs the file) during ingest.
#[tokio::test]
async fn redis_restarted_with_aof_during_ingest_loses_and_doubles_nothing() {
    let mut rig = rig(true, false, |c| c).await;
    let now = now_ms();
    let mut sent = events("k", 0..3000, now);
    for (phase, graceful) in [(0usize, false), (1, true)] {
        let part = &sent[phase * 1500..(phase + 1) * 1500];
        xadd_all(rig.store.client(), intake_stream(), part).await;
        // Restart once the daemon is part-way through the backlog.
        let started = wait_for(Duration::from_secs(20), || async {
            matches!(
                rollboard::ingest::stream::group_info(rig.store.client(), intake_stream(), "rollboard").await,
                Ok(Some((_, Some(lag)))) if lag < 1400
            )
        })
        .await;
        assert!(started, "ingest never started");
        let applied = rig
            .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await;
        eprintln!(
            "restart {phase} ({}) with {applied} of {} events applied",
            if graceful {
                "SHUTDOWN, everysec"
            } else {
                "SIGKILL, always"
            },
            (phase + 1) * 1500
        );
        if graceful {
            rig.redis.cli(&["CONFIG", "SET", "appendfsync", "everysec"]);
            rig.redis.shutdown_and_restart();
        } else {
            rig.redis.restart();
        }
        let ready = rig
            .daemon
            .readyz_becomes(200, Duration::from_secs(30))
            .await;
        assert!(ready, "never ready again; log:\n{}", rig.daemon.logs());
    }
    let more = events("k2-", 0..300, now);
    xadd_all(rig.store.client(), intake_stream(), &more).await;
    sent.extend(more);
    let figures = rig.settle(&sent).await;
    let reconnects = rig.metric("rollboard_redis_reconnects_total", &[]).await;
    let errors = rig.metric("rollboard_redis_errors_total", &[]).await;
    eprintln!("after two restarts: {reconnects} reconnects, {errors} Redis errors counted");
    assert!(reconnects >= 2.0, "each restart shows as a reconnect");
    assert!(
        rig.daemon.logs().contains("reconnected to redis"),
        "no log line about the reconnect"
    );
    figures.check("redis restarted (SIGKILL always, SHUTDOWN everysec) during ingest");
    assert!(rig.daemon.terminate().await.success());
}

/// Redis killed (SIGKILL, `appendfsync always`) and restarted in the middle of a roll that
/// takes many expiry calls (slowed by a proxy so that the kill lands inside it): the roll
/// fails or finishes, the next run completes it, and the boards end in the model's state.
#[tokio::test]
async fn redis_restarted_during_a_roll_ends_in_the_model_state() {
    let boards = variants(HOUR, 4);
    let t0 = 1_763_700_000_000 / HOUR * HOUR;
    let members = 400usize;
    let applied_at = t0 + 3 * HOUR + 1;
    let rolled_at = t0 + 6 * HOUR;
    let mut redis = RedisServer::start_persistent();
    let proxy = Proxy::start(redis.port).await;
    let direct = Store::connect(&redis.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect");
    let proxied = Store::connect(&proxy.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect through the proxy");
    let mut models: Vec<Instance> = vec![Instance::default(); boards.len()];
    let mut sent = 0i64;
    for (b, board) in boards.iter().enumerate() {
        let events: Vec<ApplyEvent> = (0..4i64)
            .flat_map(|s| {
                (0..members).map(move |m| {
                    ev(
                        &format!("e{s}-{m}"),
                        t0 + s * HOUR + m as i64,
                        &format!("m{m:03}"),
                        1,
                    )
                })
            })
            .collect();
        for e in &events {
            models[b].apply(&board.widest(), e, applied_at);
        }
        apply_events(&direct, board, &events, applied_at).await;
        models[b].roll(&board.widest(), rolled_at);
        sent += models[b].totals().values().map(|t| t.0).sum::<i64>();
    }
    proxy.latency(Duration::from_millis(5));
    let first_slice = direct
        .instance(&boards[0].widest(), None)
        .slice(boards[0].slice_of(t0));
    let roll = {
        let boards = boards.clone();
        tokio::spawn(async move {
            roll::run_once(
                &proxied,
                &boards,
                Job::All,
                None,
                rolled_at,
                8,
                &CancellationToken::new(),
            )
            .await
            .map(|r| r.iter().all(|r| r.complete()))
            .unwrap_or(false)
        })
    };
    // Kill once the first board's oldest slice is partly expired.
    let midway = wait_for(Duration::from_secs(30), || async {
        let left: usize = redis
            .cli(&["HLEN", &first_slice])
            .trim()
            .parse()
            .unwrap_or(members);
        left < members
    })
    .await;
    assert!(midway, "the roll never started expiring");
    redis.restart();
    let first = roll.await.expect("roll task");
    proxy.latency(Duration::ZERO);
    let proxied = Store::connect(&proxy.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect through the proxy");
    let failed = roll_until_complete(&proxied, &boards, rolled_at, 8).await;
    eprintln!("first roll complete: {first}; failed runs after it: {failed}");
    let mut figures = Figures {
        sent,
        ..Figures::default()
    };
    for (b, board) in boards.iter().enumerate() {
        assert_matches(&direct, &board.widest(), None, &models[b], rolled_at).await;
        let d = verify_differences(&direct, board, None).await;
        assert!(d.is_empty(), "{}: {:?}", board.name, d);
        figures
            .count(&direct, board, None, &models[b], rolled_at)
            .await;
    }
    figures.check("redis restarted (SIGKILL, appendfsync always) during a roll");
}

/// Redis at `maxmemory` with `noeviction` while events flow: the scripts are refused up
/// front (OOM, nothing half-written), the batch stays unacked and is retried, nothing is
/// dead-lettered; `/readyz` reports the failing boards and the error counter and a warning
/// say OOM. With the limit raised the backlog drains exactly.
#[tokio::test]
async fn maxmemory_refuses_scripts_and_the_backlog_drains_once_raised() {
    let rig = rig(false, true, |c| c).await;
    let now = now_ms();
    let sent = events("m", 0..3000, now);
    rig.redis
        .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    xadd_all(rig.store.client(), intake_stream(), &sent[..500]).await;
    let started = wait_for(Duration::from_secs(20), || async {
        rig.metric("rollboard_events_applied_total", &[]).await >= 1.0
    })
    .await;
    assert!(started);
    // The rest goes into the stream before the limit, which refuses XADD too; the daemon
    // is held off meanwhile (for well under its timeouts), so that the limit meets a backlog.
    rig.proxy().blackhole(true);
    xadd_all(rig.store.client(), intake_stream(), &sent[500..]).await;
    let errors_before = rig.metric("rollboard_redis_errors_total", &[]).await;
    rig.redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    rig.proxy().blackhole(false);
    let refused = wait_for(Duration::from_secs(20), || async {
        rig.metric("rollboard_redis_errors_total", &[]).await > errors_before
    })
    .await;
    assert!(
        refused,
        "no Redis error counted; log:\n{}",
        rig.daemon.logs()
    );
    let held =
        rollboard::ingest::stream::group_info(rig.store.client(), intake_stream(), "rollboard")
            .await
            .expect("group info");
    eprintln!("at maxmemory: (pending, lag) = {held:?}");
    assert!(
        held.is_some_and(|(pending, _)| pending > 0),
        "the refused batch stays pending: {held:?}"
    );
    // The error is counted before its warning is written, and the log reaches the test
    // through a pipe: wait for the line.
    let said_oom = wait_for(Duration::from_secs(10), || async {
        rig.daemon.logs().contains("OOM")
    })
    .await;
    assert!(said_oom, "no log line says OOM:\n{}", rig.daemon.logs());
    // Redis answers the readiness check, so the pod stays in service (queries work), but
    // `/readyz` says the consumer is stuck and why.
    let reported = wait_for(Duration::from_secs(10), || async {
        let (status, body) = rig.daemon.get("/readyz").await;
        status == 200 && body.contains("\"degraded\":true") && body.contains("OOM")
    })
    .await;
    let (_, body) = rig.daemon.get("/readyz").await;
    assert!(reported, "readyz at maxmemory: {body}");
    eprintln!("readyz at maxmemory: {body}");
    let dead = rig.redis.cli(&["XLEN", dead_letter_stream()]);
    assert_eq!(dead.trim(), "0", "nothing dead-lettered at maxmemory");
    rig.redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let figures = rig.settle(&sent).await;
    let (_, body) = rig.daemon.get("/readyz").await;
    assert!(body.contains("\"ingest_error\":null"), "{body}");
    figures.check("maxmemory (OOM, noeviction) during ingest");
    assert!(rig.daemon.terminate().await.success());
}
