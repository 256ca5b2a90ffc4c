//! Batches of `ingest.batch_size = 10000` (the default, and the largest allowed) in the
//! situations a batch's size matters to: a consumer killed holding full batches and
//! another one claiming them, two consumers applying the same full batch at once, SIGTERM
//! with full batches in flight, and the memory one daemon holds for its batches against
//! the shipped sidecar's limit (deploy/kubernetes/deployment.yaml, 256 MiB).

use std::time::{Duration, Instant};

use rollboard::ingest::stream::group_info;
use rollboard::store::Store;

use crate::support::asserts::{assert_drained_into_model, assert_state};
use crate::support::boards::{now_ms, test_boards};
use crate::support::config::{edit_config, partitioned_config, write_config};
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::events::{models, tip_or_payment, xadd_all, Fields};
use crate::support::keys::{intake_stream, partition_stream};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained_streams, wait_for};

/// The default `ingest.batch_size`.
const BATCH: usize = 10_000;

/// The memory limit of the rollboard sidecar in deploy/kubernetes/deployment.yaml.
const SIDECAR_LIMIT_BYTES: u64 = 256 * 1024 * 1024;

/// Tips and payments with ids, all within the last hour.
fn feed(n: usize) -> Vec<Fields> {
    let now = now_ms();
    (0..n).map(|i| tip_or_payment(i, now, 0)).collect()
}

/// Pending entries of the group on `stream` (0 when the group is missing).
async fn pending(store: &Store, stream: &str) -> i64 {
    group_info(store.client(), stream, "rollboard")
        .await
        .ok()
        .flatten()
        .map_or(0, |(pending, _)| pending)
}

/// The daemon configuration at `path` with batches of [`BATCH`] and `claim_idle`.
fn large_batches(path: &std::path::Path, claim_idle: &str) {
    edit_config(path, "batch_size = 200", &format!("batch_size = {BATCH}"));
    edit_config(
        path,
        "claim_idle = \"1s\"",
        &format!("claim_idle = \"{claim_idle}\""),
    );
}

/// The peak resident memory (VmHWM) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// Four full batches of tips on the intake stream and a daemon started on `config` and
/// `port`, once it holds at least one full batch pending: the tips and the daemon.
async fn holding_a_full_batch(
    store: &Store,
    config: &std::path::Path,
    port: u16,
) -> (Vec<Fields>, Daemon) {
    let events = feed(4 * BATCH);
    xadd_all(store.client(), intake_stream(), &events).await;
    let daemon = Daemon::start(config, port).await;
    let holding = wait_for(Duration::from_secs(60), || async {
        pending(store, intake_stream()).await >= BATCH as i64
    })
    .await;
    assert!(holding, "never held a full batch; log:\n{}", daemon.logs());
    (events, daemon)
}

/// A consumer SIGKILLed while it holds at least one full batch of 10 000 (and the one read
/// ahead) pending: another daemon claims them after `claim_idle` and every board equals
/// the model, nothing lost, nothing counted twice.
#[tokio::test]
async fn a_consumer_killed_holding_full_batches_is_taken_over_exactly_once() {
    let (redis, store, dir, config_b, port_b) = redis_and_config("b").await;
    large_batches(&config_b, "2s");
    let (events, b) = holding_a_full_batch(&store, &config_b, port_b).await;
    b.kill().await;
    let left = pending(&store, intake_stream()).await;
    assert!(left >= BATCH as i64, "killed too late: {left} pending");
    let port_a = free_port();
    let config_a = write_config(dir.path(), &redis, port_a, "a", "");
    large_batches(&config_a, "2s");
    let a = Daemon::start(&config_a, port_a).await;
    assert_drained_into_model(&store, &events, &a).await;
    assert!(
        a.logs()
            .contains("claimed entries left pending by another consumer"),
        "a never claimed b's entries; log:\n{}",
        a.logs()
    );
    assert!(a.terminate().await.success());
}

/// Two consumers whose `claim_idle` is shorter than a batch of 10 000 takes to apply: each
/// claims the batch the other is applying and applies it too, at the same time. The
/// idempotency keys still count every event once.
#[tokio::test]
async fn two_consumers_applying_the_same_full_batches_count_each_event_once() {
    let (redis, store, dir, config_a, port_a) = redis_and_config("a").await;
    large_batches(&config_a, "20ms");
    let port_b = free_port();
    let config_b = write_config(dir.path(), &redis, port_b, "b", "");
    large_batches(&config_b, "20ms");
    let events = feed(6 * BATCH);
    xadd_all(store.client(), intake_stream(), &events).await;
    let a = Daemon::start(&config_a, port_a).await;
    let b = Daemon::start(&config_b, port_b).await;
    assert_drained_into_model(&store, &events, &a).await;
    let claimed = |d: &Daemon| {
        d.logs()
            .contains("claimed entries left pending by another consumer")
    };
    assert!(
        claimed(&a) || claimed(&b),
        "no batch was claimed while applied; logs:\n{}\n{}",
        a.logs(),
        b.logs()
    );
    let duplicates = a
        .metric("rollboard_events_skipped_total", &[("reason", "duplicate")])
        .await
        + b.metric("rollboard_events_skipped_total", &[("reason", "duplicate")])
            .await;
    assert!(
        duplicates > 0.0,
        "no event was applied twice, so nothing was tested"
    );
    assert!(a.terminate().await.success());
    assert!(b.terminate().await.success());
}

/// SIGTERM while a full batch of 10 000 is applied and another was read ahead: exit 0
/// within the grace period, nothing left pending, every board equal to the model.
#[tokio::test]
async fn sigterm_with_full_batches_in_flight_leaves_nothing_pending() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    large_batches(&config, "30s");
    let (events, daemon) = holding_a_full_batch(&store, &config, port).await;
    let started = Instant::now();
    let log = daemon.log.clone();
    let status = daemon.terminate().await;
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert_eq!(
        pending(&store, intake_stream()).await,
        0,
        "entries left pending after a clean exit; log:\n{log}"
    );
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

/// The peak resident memory of a daemon reading `partitions` partitions, each with a
/// backlog of three full batches of small tips, once it has drained them all; every board
/// equals the model.
async fn peak_memory_of_partitioned_backlog(partitions: usize) -> u64 {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = partitioned_config(dir.path(), &redis, port, "a", partitions);
    large_batches(&config, "30s");
    let events = feed(partitions * 3 * BATCH);
    for (p, part) in events.chunks(3 * BATCH).enumerate() {
        xadd_all(store.client(), &partition_stream(p), part).await;
    }
    let daemon = Daemon::start(&config, port).await;
    let keys: Vec<String> = (0..partitions).map(partition_stream).collect();
    let drained = drained_streams(&store, &keys).await;
    assert!(drained, "never drained; log:\n{}", daemon.logs());
    let peak = peak_rss(daemon.pid());
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    assert!(daemon.terminate().await.success());
    eprintln!(
        "{partitions} partition(s) of batches of {BATCH}: peak resident memory {} MiB",
        peak / (1024 * 1024)
    );
    peak
}

/// Four partitions, each with full batches of 10 000 small tips waiting: the daemon's
/// peak resident memory stays within the shipped sidecar's 256 MiB. Each partition's
/// consumer holds the batch it applies and the one it read ahead, about 30 MiB of small
/// tips at the default batch size (measured with the release binary: 135 MiB for four
/// partitions, 211 MiB for eight; 149 and 283 MiB before the daemon took mimalloc), so
/// docs/operations.md has more partitions raise the limit.
#[tokio::test]
async fn four_partitions_of_full_batches_fit_the_sidecar_memory_limit() {
    let peak = peak_memory_of_partitioned_backlog(4).await;
    assert!(
        peak < SIDECAR_LIMIT_BYTES,
        "peak resident memory {} MiB over the sidecar's 256 MiB limit",
        peak / (1024 * 1024)
    );
}
