//! Core flows on a real Redis Cluster: a master killed or failed over, slots resharded under
//! load, and replicas too few or too slow to confirm a write; what was acked is never lost.

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use rollboard::store::{Reconnect, Store};

use crate::support::asserts::{assert_drained_into_model_at, assert_state};
use crate::support::boards::test_boards;
use crate::support::cli::{assert_success, rollboard, stderr, stdout};
use crate::support::cluster::{cli, one_replica_store, RedisCluster};
use crate::support::config::{
    config_for_url, edit_config, write_config, write_config_url, write_file,
};
use crate::support::daemon::Daemon;
use crate::support::env::{env_count, env_seed};
use crate::support::events::{
    models, post_fields, read_unacked, stream_len, tip, tip_or_payment, xadd_all, Fields,
};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::proptests::SplitMix;
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained, wait_for};

/// The fixture itself: six nodes, three masters with 16384 slots between them, each with
/// a synced replica; a killed master's replica takes over and the killed node rejoins.
#[test]
fn a_cluster_starts_fails_over_and_heals() {
    let mut cluster = RedisCluster::start();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{:?}", cluster.topology());
    let victim = masters[0];
    let replica = cluster.replica_of(victim);
    let took = cluster.kill_master(victim);
    eprintln!("failover after kill -9 took {took:?}");
    assert!(cluster.masters().contains(&replica));
    cluster.restart(victim);
    assert_eq!(cluster.replica_of(replica), victim);
    assert_eq!(cluster.force_failover(replica), victim);
}

/// The core flows on a cluster, one cluster for all of them: the daemon fed through the
/// stream, `send` and HTTP (malformed events dead-lettered), killed with -9 mid-backlog and
/// restarted, a dead consumer's entries taken over with `XAUTOCLAIM`, the CLI queries, a
/// roll three days ahead (catch-up), `verify` and `rebuild`: every board equals the model.
#[tokio::test]
async fn core_flows_on_a_cluster_equal_the_model() {
    let (_cluster, store, (dir, port, config)) = cluster_and_config().await;
    let boards = test_boards();
    let now = rollboard::domain::clock::local_ms();
    let event = |i: usize| tip_or_payment(i, now, 0);
    let mut events: Vec<Fields> = (0..1000).map(event).collect();

    // Stream, send, HTTP; bad events are dead-lettered.
    let daemon = Daemon::start(&config, port).await;
    xadd_all(store.client(), intake_stream(), &events[..600]).await;
    let bad: Vec<Fields> = (0..5)
        .map(|i| {
            vec![
                ("room".into(), "r1".into()),
                ("user".into(), "u1".into()),
                ("amount".into(), "lots".into()),
                ("id".into(), format!("bad{i}")),
            ]
        })
        .collect();
    xadd_all(store.client(), intake_stream(), &bad).await;
    let lines: Vec<String> = events[600..800]
        .iter()
        .map(|f| {
            serde_json::to_string(&f.iter().cloned().collect::<HashMap<_, _>>()).expect("json")
        })
        .collect();
    let file = write_file(dir.path(), "events.jsonl", &lines.join("\n"));
    let out = rollboard(Some(&config), &["send", file.to_str().expect("path")], &[]);
    assert!(
        out.status.success(),
        "{}",
        crate::support::cli::stderr(&out)
    );
    let r = post_fields(&daemon.base, &events[800..]).await;
    let status = r.status().as_u16();
    assert_eq!(status, 202, "{}", r.text().await.unwrap_or_default());
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    let dead = stream_len(&store, dead_letter_stream()).await;
    assert_eq!(dead, 5);

    // kill -9 mid-backlog, restart: nothing lost, nothing doubled.
    let more: Vec<Fields> = (1000..6000).map(event).collect();
    xadd_all(store.client(), intake_stream(), &more).await;
    events.extend(more);
    let applying = crate::support::wait::wait_for(Duration::from_secs(30), || async {
        daemon
            .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await
            > 1000.0
    })
    .await;
    assert!(applying, "log:\n{}", daemon.logs());
    daemon.kill().await;
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model_at(&store, &events, &daemon, now).await;

    // A consumer that read and died: its entries are claimed after claim_idle.
    let more: Vec<Fields> = (6000..6300).map(event).collect();
    assert!(daemon.terminate().await.success());
    xadd_all(store.client(), intake_stream(), &more).await;
    events.extend(more);
    read_unacked(&store, "rollboard", "b", 100).await;
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model_at(&store, &events, &daemon, now).await;

    // Queries through the CLI agree with the model.
    let model = models(&events, &boards, now);
    let fans = boards
        .iter()
        .position(|b| b.name == "fans_7d")
        .expect("fans_7d");
    let expected = model[&(fans, Some("r3".to_string()))].ranking(&boards[fans]);
    let out = rollboard(
        Some(&config),
        &[
            "top", "fans_7d", "--scope", "r3", "--limit", "1000", "--json",
        ],
        &[],
    );
    assert_success(&out, "top");
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(page["count"].as_u64(), Some(expected.len() as u64));
    let (member, total, _) = &expected[0];
    let out = rollboard(
        Some(&config),
        &["rank", "fans_7d", member, "--scope", "r3", "--json"],
        &[],
    );
    assert_success(&out, "rank");
    let rank: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(rank["rank"], 1, "{rank}");
    assert_eq!(rank["total"].to_string(), total.to_string(), "{rank}");
    assert!(daemon.terminate().await.success());

    // Roll three days ahead (tips_24h empties), verify, rebuild, verify.
    let later = now + 3 * 86_400_000;
    let out = rollboard(
        Some(&config),
        &["roll", "--at", &later.to_string(), "--force"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        crate::support::cli::stderr(&out)
    );
    assert_state(&store, &boards, &models(&events, &boards, later), later).await;
    let out = rollboard(Some(&config), &["verify", "--strict"], &[]);
    assert_success(&out, "verify");
    for board in ["rooms_7d", "fans_7d", "tips_24h"] {
        let out = rollboard(Some(&config), &["rebuild", board], &[]);
        assert!(
            out.status.success(),
            "rebuild {board}: {}",
            crate::support::cli::stderr(&out)
        );
    }
    let out = rollboard(Some(&config), &["verify"], &[]);
    assert_success(&out, "verify");
}

/// Slots move between masters with `redis-cli --cluster reshard` while events are appended
/// and the daemon ingests and rolls: every board still equals the model, `verify` passes.
#[tokio::test]
async fn resharding_under_load_equals_the_model() {
    use fred::prelude::*;

    let (cluster, store, (_dir, port, config)) = cluster_and_config().await;
    let now = rollboard::domain::clock::local_ms();
    let event = move |i: usize| tip_or_payment(i, now, 0);
    let daemon = Daemon::start(&config, port).await;
    // Appends 25 events every 50 ms until the resharding is over.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeder = {
        let client = store.client().clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut events: Vec<Fields> = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let chunk: Vec<Fields> = (events.len()..events.len() + 25).map(event).collect();
                xadd_all(&client, intake_stream(), &chunk).await;
                events.extend(chunk);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            events
        })
    };
    let masters = cluster.masters();
    // Every master gives slots to the next one: instance keys, registries and the stream
    // move while they are written.
    let moves: Vec<(u16, u16)> = (0..masters.len())
        .map(|k| (masters[k], masters[(k + 1) % masters.len()]))
        .collect();
    let reshard = tokio::task::spawn_blocking({
        let ports = moves.clone();
        move || {
            for (from, to) in ports {
                cluster.reshard(from, to, 1000);
            }
            cluster
        }
    });
    let cluster = reshard.await.expect("reshard");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let events = feeder.await.expect("feeder");
    eprintln!("{} events appended while 3000 slots moved", events.len());
    let slots: Vec<usize> = cluster
        .topology()
        .iter()
        .filter(|n| n.master)
        .map(|n| n.slots)
        .collect();
    eprintln!("slots per master after resharding: {slots:?}");
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    // Every event is valid and a moving slot is an outage, retried: nothing set aside.
    let dead: i64 = store
        .client()
        .xlen(dead_letter_stream())
        .await
        .expect("XLEN");
    assert_eq!(
        dead,
        0,
        "dead letters while slots moved; log:\n{}",
        daemon.logs()
    );
    assert!(daemon.terminate().await.success());
    let out = rollboard(Some(&config), &["verify", "--strict"], &[]);
    assert_success(&out, "verify");
}

/// A fresh cluster, a store on it, and a configuration for consumer `a` there (see
/// [`config_for_url`]; the daemon not started).
async fn cluster_and_config() -> (
    RedisCluster,
    Store,
    (tempfile::TempDir, u16, std::path::PathBuf),
) {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let config = config_for_url(&cluster.url(), "a", "");
    (cluster, store, config)
}

/// How many masters the failover test kills (`ROLLBOARD_FAILOVER_RUNS`).
fn failover_runs() -> usize {
    env_count("ROLLBOARD_FAILOVER_RUNS", 5)
}

/// The failover test's seed: `ROLLBOARD_FAILOVER_SEED`, else the clock.
fn failover_seed() -> u64 {
    env_seed("ROLLBOARD_FAILOVER_SEED")
}

/// POSTs `events` to the daemon until it answers 202 (a producer that retries with its own
/// ids, as docs/operations.md says); returns how many attempts were refused.
async fn post_until_accepted(http: &reqwest::Client, base: &str, events: &[Fields]) -> u64 {
    let body: Vec<HashMap<String, String>> =
        events.iter().map(|f| f.iter().cloned().collect()).collect();
    let mut refused = 0;
    loop {
        let status = http
            .post(format!("{base}/v1/events"))
            .json(&body)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        if status == 202 {
            return refused;
        }
        assert!(
            status == 503 || status == 0,
            "intake answered {status} during a failover"
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the daemon ingests and rolls and producers POST events, masters are killed with
/// -9 at seeded random points (each time the killed node restarts and rejoins as a
/// replica), then one `CLUSTER FAILOVER` is forced. With `redis.min_replicas_acked` at its
/// default (1 here) nothing that was acked or answered 202 is lost, nothing is counted
/// twice, and `verify` passes. While the first master is down, the CLI works with a URL
/// naming it as the first of several seeds, and fails with a URL naming only it.
#[tokio::test]
async fn masters_killed_under_load_lose_nothing_acked() {
    let runs = failover_runs();
    let seed = failover_seed();
    eprintln!("failover test: seed {seed} (ROLLBOARD_FAILOVER_SEED), {runs} kills");
    let mut rng = SplitMix(seed);
    let mut cluster = RedisCluster::start();
    let (dir, port, config) = config_for_url(&cluster.url(), "a", "");
    // To see what the setting prevents, run with ROLLBOARD_FAILOVER_MIN_REPLICAS=0.
    if let Ok(n) = std::env::var("ROLLBOARD_FAILOVER_MIN_REPLICAS") {
        edit_config(
            &config,
            "[redis]\n",
            &format!("[redis]\nmin_replicas_acked = {n}\n"),
        );
    }
    let boards = test_boards();
    let now = rollboard::domain::clock::local_ms();
    let event = move |i: usize| tip_or_payment(i, now, 0);
    let daemon = Daemon::start(&config, port).await;
    // Producers: 25 events per request, every 50 ms, each retried until accepted.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeder = {
        let done = done.clone();
        let base = daemon.base.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut events, mut refused) = (Vec::new(), 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let chunk: Vec<Fields> = (events.len()..events.len() + 25).map(event).collect();
                refused += post_until_accepted(&http, &base, &chunk).await;
                events.extend(chunk);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (events, refused)
        })
    };
    let mut took = Vec::new();
    for run in 1..=runs {
        let delay = Duration::from_millis(500 + rng.next() % 2_000);
        tokio::time::sleep(delay).await;
        let masters = cluster.masters();
        let victim = masters[(rng.next() % masters.len() as u64) as usize];
        let (c, d) = tokio::task::spawn_blocking(move || {
            let d = cluster.kill_master(victim);
            (cluster, d)
        })
        .await
        .expect("kill");
        cluster = c;
        eprintln!("run {run}: killed master {victim} after {delay:?}; failover took {d:?}");
        took.push(d);
        if run == 1 {
            let mut seeds = vec![victim];
            seeds.extend(cluster.ports().into_iter().filter(|p| *p != victim));
            let several = write_config_url(
                dir.path(),
                &RedisCluster::url_with_seeds(&seeds),
                free_port(),
                "seeds",
                "",
            );
            let out = rollboard(Some(&several), &["top", "rooms_7d", "--json"], &[]);
            assert!(out.status.success(), "first seed down: {}", stderr(&out));
            let only = write_config_url(
                dir.path(),
                &RedisCluster::url_with_seeds(&[victim]),
                free_port(),
                "dead",
                "",
            );
            let out = rollboard(Some(&only), &["top", "rooms_7d"], &[]);
            assert!(!out.status.success(), "only seed down: {}", stdout(&out));
        }
        cluster = tokio::task::spawn_blocking(move || {
            cluster.restart(victim);
            cluster
        })
        .await
        .expect("restart");
    }
    let masters = cluster.masters();
    let target = masters[(rng.next() % masters.len() as u64) as usize];
    let cluster = tokio::task::spawn_blocking(move || {
        let promoted = cluster.force_failover(target);
        eprintln!("forced failover from {target} to {promoted}");
        cluster
    })
    .await
    .expect("failover");
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (events, refused) = feeder.await.expect("feeder");
    // A fresh connection: the one opened before the kills does not reconnect.
    let store = cluster.store().await;
    if !drained(&store).await {
        let log = daemon.logs();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "seed {seed}: not drained: {:?}; log tail:\n{}",
            rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
                .await,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    let ack_failures = daemon
        .metric("rollboard_replica_ack_failures_total", &[])
        .await;
    let mut waits = 0u64;
    for port in cluster.masters() {
        let stats = cli(port, &["INFO", "commandstats"]);
        waits += stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    if std::env::var("ROLLBOARD_FAILOVER_MIN_REPLICAS").as_deref() != Ok("0") {
        assert!(waits > 0, "no WAIT reached the current masters");
    }
    eprintln!(
        "failover test: seed {seed}: {} events, {refused} POSTs refused and retried, \
         {ack_failures} replica-ack failures, failovers took {took:?}; boards equal the model",
        events.len()
    );
    assert!(daemon.terminate().await.success());
    let out = rollboard(Some(&config), &["verify", "--strict"], &[]);
    assert_success(&out, "verify");
}

/// With `redis.min_replicas_acked = 1` and no replica: the consumer applies but acks
/// nothing (counted in `rollboard_replica_ack_failures_total`), `POST /v1/events` answers
/// 503 with a JSON error naming the setting, and `send` fails. Once a replica attaches,
/// the redelivered batches (now all duplicates, which write nothing) are confirmed and
/// acked, and the boards equal the model: nothing lost, nothing counted twice.
#[tokio::test]
async fn without_enough_replicas_nothing_is_acked_or_confirmed() {
    let (primary, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let port = free_port();
    let config = write_config(dir.path(), &primary, port, "a", "");
    edit_config(
        &config,
        "[redis]\n",
        "[redis]\nmin_replicas_acked = 1\nreplica_ack_timeout = \"100ms\"\n",
    );
    let now = rollboard::domain::clock::local_ms();
    let mut events: Vec<Fields> = (0..300).map(|i| tip(i, now)).collect();
    let daemon = Daemon::start(&config, port).await;
    xadd_all(store.client(), intake_stream(), &events).await;
    let refused = wait_for(Duration::from_secs(20), || async {
        daemon
            .metric("rollboard_replica_ack_failures_total", &[])
            .await
            >= 2.0
    })
    .await;
    assert!(refused, "log:\n{}", daemon.logs());
    let (pending, _) =
        rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
            .await
            .expect("xinfo")
            .expect("group");
    assert!(pending > 0, "entries were acked without a replica");

    let more: Vec<Fields> = (300..310).map(|i| tip(i, now)).collect();
    let r = post_fields(&daemon.base, &more).await;
    assert_eq!(r.status().as_u16(), 503);
    let error: serde_json::Value = r.json().await.expect("json error");
    let message = error["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("NOREPLICAS") && message.contains("redis.min_replicas_acked"),
        "{error}"
    );
    // The events were appended (a retry with the same ids is harmless), just not confirmed.
    events.extend(more);
    let line =
        serde_json::to_string(&tip(310, now).into_iter().collect::<HashMap<_, _>>()).expect("json");
    let file = write_file(dir.path(), "one.jsonl", &line);
    let out = rollboard(Some(&config), &["send", file.to_str().expect("path")], &[]);
    assert!(!out.status.success(), "send confirmed without a replica");
    assert!(stderr(&out).contains("NOREPLICAS"), "{}", stderr(&out));
    events.push(tip(310, now));

    // A replica attaches: everything pending is confirmed and acked.
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    assert!(daemon.terminate().await.success());
}

/// A confirmation whose connection drops while its `WAIT` blocks confirms nothing, and is
/// not resent. The client would otherwise send the tiny write and the `WAIT` again on the
/// new connection, which on a cluster may lead to another master: after a failover, the
/// replica that took over, once it has a replica of its own, confirms there writes that
/// died with the old master. (That is how the frozen-replica case below lost a batch.)
#[tokio::test]
async fn a_confirmation_cut_short_by_a_reconnect_confirms_nothing() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    assert!(
        wait_for(Duration::from_secs(20), || async {
            primary
                .cli(&["INFO", "replication"])
                .contains("state=online")
        })
        .await,
        "the replica never synced"
    );
    let store =
        one_replica_store(&primary.url(), Reconnect::Forever, Duration::from_secs(10)).await;
    // (Fails fast until the pool is connected.)
    assert!(
        wait_for(Duration::from_secs(10), || async {
            store.confirm_writes(&[intake_stream()]).await.is_ok()
        })
        .await,
        "not confirmed while the replica runs"
    );
    let freeze = |sig: &str| {
        let status = Command::new("kill")
            .args([sig, &replica.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    freeze("-STOP");
    let confirm = tokio::spawn(async move { store.confirm_writes(&[intake_stream()]).await });
    let waiting = || {
        primary
            .cli(&["CLIENT", "LIST"])
            .lines()
            .find(|l| l.contains(" cmd=wait "))
            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
            .map(str::to_string)
    };
    assert!(
        wait_for(Duration::from_secs(10), || async { waiting().is_some() }).await,
        "no WAIT blocked on the primary"
    );
    let id = waiting().expect("a blocked WAIT");
    assert_eq!(primary.cli(&["CLIENT", "KILL", "ID", &id]).trim(), "1");
    // Either the confirmation fails, or the client resends it (a new blocked `WAIT`).
    assert!(
        wait_for(Duration::from_secs(10), || async {
            confirm.is_finished() || waiting().is_some_and(|w| w != id)
        })
        .await,
        "the confirmation neither failed nor was resent"
    );
    freeze("-CONT");
    match confirm.await.expect("task") {
        Ok(()) => panic!("a confirmation was resent on a new connection and confirmed"),
        Err(e) => assert!(e.is_outage(), "{e}"),
    }
}

/// One run of [`frozen_replicas_then_a_dead_master`]: a daemon under `prefix` with
/// `redis.min_replicas_acked = replicas`; every replica frozen (SIGSTOP, behind 48 MB of
/// other writes) while 2000 events are ingested; then a master that does not hold the stream is killed with -9, the
/// replicas resume, the dead master's replica takes over (without the writes it never
/// received) and the killed node rejoins. Returns how many board instances differ from the
/// model of the events afterwards, out of how many.
async fn frozen_replicas_then_a_dead_master(
    cluster: RedisCluster,
    dir: &std::path::Path,
    prefix: &str,
    replicas: u32,
) -> (RedisCluster, usize, usize) {
    use rollboard::ingest::stream::group_info;

    let port = free_port();
    let config = write_config_url(dir, &cluster.url(), port, prefix, "");
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text
        .replacen(
            "[redis]\n",
            &format!(
                "[redis]\nkey_prefix = \"{prefix}\"\nmin_replicas_acked = {replicas}\n\
                 replica_ack_timeout = \"200ms\"\n"
            ),
            1,
        )
        .replacen(
            "[ingest]\n",
            &format!(
                "[ingest]\nstream = \"{prefix}:events\"\ndead_letter_stream = \"{prefix}:dead\"\n"
            ),
            1,
        );
    std::fs::write(&config, text).expect("config");
    let stream = format!("{prefix}:events");
    let store = Store::connect(&cluster.url(), prefix, 2, Reconnect::Never)
        .await
        .expect("connect");
    let daemon = Daemon::start(&config, port).await;
    let group = |store: &Store| {
        let stream = stream.clone();
        let client = store.client().clone();
        async move { group_info(&client, &stream, "rollboard").await }
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            matches!(group(&store).await, Ok(Some(_)))
        })
        .await,
        "no group; log:\n{}",
        daemon.logs()
    );
    let masters = cluster.masters();
    let holds = |port: u16, key: &str| cli(port, &["EXISTS", key]).trim() == "1";
    let stream_master = *masters
        .iter()
        .find(|m| holds(**m, &stream))
        .expect("a master holds the stream");
    let frozen: Vec<u16> = masters.iter().map(|m| cluster.replica_of(*m)).collect();
    for replica in &frozen {
        cluster.signal(*replica, true);
    }
    // A stopped replica still receives what fits in its socket buffers (megabytes on
    // loopback) and applies it when it resumes. 48 MB written first to every master but the
    // stream's fills those buffers, so the events' writes stay in the masters' own output
    // buffers, which die with them.
    {
        use fred::prelude::*;
        use fred::types::cluster::ClusterRouting;
        let state = store
            .client()
            .cached_cluster_state()
            .expect("routing table");
        let pad = "x".repeat(1 << 20);
        for m in masters.iter().filter(|m| **m != stream_master) {
            let key = (0u32..)
                .map(|n| format!("{prefix}:pad:{{{n}}}"))
                .find(|k| {
                    state
                        .get_server(ClusterRouting::hash_key(k.as_bytes()))
                        .is_some_and(|s| s.port == *m)
                })
                .expect("a key on the master");
            for _ in 0..48 {
                let _: () = store
                    .client()
                    .set(&key, pad.as_str(), None, None, false)
                    .await
                    .expect("pad");
            }
        }
    }
    let now = rollboard::domain::clock::local_ms();
    let events: Vec<Fields> = (0..2000).map(|i| tip_or_payment(i, now, 0)).collect();
    xadd_all(store.client(), &stream, &events).await;
    let boards = test_boards();
    let applied = wait_for(Duration::from_secs(30), || async {
        let rooms = daemon
            .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await;
        if replicas == 0 {
            matches!(group(&store).await, Ok(Some((0, Some(0)))))
        } else {
            // The consumer retries its first batch until replicas acknowledge it.
            rooms > 0.0
                && daemon
                    .metric("rollboard_replica_ack_failures_total", &[])
                    .await
                    > 0.0
        }
    })
    .await;
    assert!(applied, "log:\n{}", daemon.logs());
    let (pending, lag) = group(&store).await.expect("xinfo").expect("group");
    eprintln!(
        "min_replicas_acked = {replicas}: replicas frozen, events applied; {pending} pending, lag {lag:?}"
    );
    // The victim: the master (not the stream's) holding the most instances.
    let model = models(&events, &boards, now);
    let meta = |(b, scope): &(usize, Option<String>)| {
        store
            .instance(&boards[*b].widest(), scope.as_deref())
            .meta()
    };
    let victim = *masters
        .iter()
        .filter(|m| **m != stream_master)
        .max_by_key(|m| model.keys().filter(|k| holds(**m, &meta(k))).count())
        .expect("a victim");
    let on_victim = model.keys().filter(|k| holds(victim, &meta(k))).count();
    assert!(on_victim > 0, "no instance on the victim");
    let mut cluster = cluster;
    cluster.kill_node(victim);
    for replica in &frozen {
        cluster.signal(*replica, false);
    }
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_failover(victim);
        cluster.restart(victim);
        cluster
    })
    .await
    .expect("failover");
    let store = Store::connect(&cluster.url(), prefix, 2, Reconnect::Never)
        .await
        .expect("connect");
    let drained = wait_for(Duration::from_secs(60), || async {
        matches!(group(&store).await, Ok(Some((0, Some(0)))))
    })
    .await;
    assert!(drained, "not drained; log:\n{}", daemon.logs());
    // Instances that differ from the model (resummarize ones after a job run or two).
    let mut differ = 0;
    for ((b, scope), instance) in &model {
        let board = &boards[*b];
        let expected = instance.ranking(board);
        let same = wait_for(Duration::from_secs(3), || async {
            store
                .top(&board.widest(), scope.as_deref(), 0, 1000, now)
                .await
                .map(|p| {
                    p.entries
                        .iter()
                        .map(|e| (e.member.clone(), e.total, e.last_ts))
                        .collect::<Vec<_>>()
                })
                .ok()
                == Some(expected.clone())
        })
        .await;
        if !same {
            differ += 1;
            let got = store
                .top(&board.widest(), scope.as_deref(), 0, 1000, now)
                .await;
            let got = got.map(|p| p.entries.into_iter().take(3).collect::<Vec<_>>());
            eprintln!(
                "{} {scope:?} differs: expected {:?}, got {got:?}",
                board.name,
                &expected[..expected.len().min(3)]
            );
        }
    }
    eprintln!(
        "min_replicas_acked = {replicas}: killed {victim} holding {on_victim} of {} instances; \
         afterwards {differ} differ from the model",
        model.len()
    );
    if differ > 0 && replicas > 0 {
        let dead = cli(
            cluster.masters()[0],
            &["-c", "XLEN", &format!("{prefix}:dead")],
        );
        eprintln!("dead letters: {}", dead.trim());
        let log = daemon.logs();
        for line in log.lines().filter(|l| !l.contains("INFO")).take(60) {
            eprintln!("LOG {line}");
        }
    }
    assert!(daemon.terminate().await.success());
    (cluster, differ, model.len())
}

/// What `redis.min_replicas_acked` prevents, made certain instead of left to timing: all
/// replicas are frozen (SIGSTOP) while the daemon ingests, then a master is killed with -9
/// and its replica (without those writes) takes over. With the setting at 1 nothing is
/// acked while the replicas are frozen, the batches are redelivered after the failover, and
/// every board equals the model. At 0 the same sequence acks events whose writes then die
/// with the master: boards lose amounts, as they do on a cluster without the setting.
#[tokio::test]
async fn acked_writes_survive_a_master_dying_before_its_replicas_caught_up() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let (cluster, differ, total) =
        frozen_replicas_then_a_dead_master(cluster, dir.path(), "rb", 1).await;
    assert_eq!(
        differ, 0,
        "{differ} of {total} instances lost or doubled amounts"
    );
    let (_cluster, differ, total) =
        frozen_replicas_then_a_dead_master(cluster, dir.path(), "rc", 0).await;
    assert!(
        differ > 0,
        "without replica acks the dead master's acked writes should be gone ({total} instances)"
    );
}
