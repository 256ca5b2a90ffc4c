//! Calls whose keys' slot is being moved between two masters of a real cluster, set by hand
//! (`CLUSTER SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE`, then `SETSLOT ... NODE`): the
//! clients follow no redirection themselves (see `Store::connect`), so each call must either
//! give the right answer or a clean outage error, never another call's reply, and append
//! transactions must land exactly once.

use std::time::Duration;

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use rollboard::config::IngestSettings;
use rollboard::domain::board::Board;
use rollboard::domain::event::Field;
use rollboard::ingest::stream;
use rollboard::store::{Reconnect, Store, StoreError};

use crate::support::boards::{apply_events, apply_events_in, ev, ingest_settings, scoped};
use crate::support::cluster::{
    cli, one_replica_store, owner, survives_a_blocked_read_migrated, RedisCluster,
};
use crate::support::config::config_for_url;
use crate::support::keys::intake_stream;
use crate::support::wait::wait_for;

const NOW: i64 = 1_000_000;

/// A slot being moved from the master on `source` to the master on `target`.
struct Moving {
    slot: String,
    source: u16,
    target: u16,
    target_id: String,
}

/// The first of `prefix0`, `prefix1`, ... that `client` believes lives on `port`.
fn name_on(client: &Client, port: u16, prefix: &str, key: impl Fn(&str) -> String) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| owner(client, &key(name)) == port)
        .expect("a name on that node")
}

impl Moving {
    /// Sets the slot of `key` IMPORTING on another master and MIGRATING on its owner.
    fn begin(cluster: &RedisCluster, client: &Client, key: &str) -> Moving {
        let source = owner(client, key);
        let target = *cluster
            .masters()
            .iter()
            .find(|&&p| p != source)
            .expect("another master");
        let slot = ClusterRouting::hash_key(key.as_bytes()).to_string();
        let (source_id, target_id) = (cluster.id_of(source), cluster.id_of(target));
        for (port, state, node) in [
            (target, "IMPORTING", &source_id),
            (source, "MIGRATING", &target_id),
        ] {
            let reply = cli(port, &["CLUSTER", "SETSLOT", &slot, state, node]);
            assert_eq!(reply.trim(), "OK", "SETSLOT {state} on {port}");
        }
        Moving {
            slot,
            source,
            target,
            target_id,
        }
    }

    /// Moves `keys` (all in the slot) from the source to the target.
    fn migrate(&self, keys: &[&str]) {
        let target = self.target.to_string();
        for key in keys {
            let out = cli(
                self.source,
                &["MIGRATE", "127.0.0.1", &target, key, "0", "5000"],
            );
            assert_eq!(out.trim(), "OK", "MIGRATE {key}");
        }
    }

    /// Moves the keys of the slot still on the source.
    fn migrate_all(&self) {
        let left = cli(
            self.source,
            &["CLUSTER", "GETKEYSINSLOT", &self.slot, "1000"],
        );
        let left: Vec<&str> = left.lines().filter(|k| !k.is_empty()).collect();
        self.migrate(&left);
    }

    /// Moves the slot's remaining keys and hands the slot to the target on every master, the
    /// target first and the source next (were the source told first and the target lost,
    /// the slot would have no owner; Valkey also hands it to each master's replicas
    /// first), then waits until every node knows.
    fn finish(&self, cluster: &RedisCluster) {
        self.migrate_all();
        let first = [self.target, self.source];
        let others = cluster.masters().into_iter().filter(|p| !first.contains(p));
        for port in first.into_iter().chain(others) {
            let reply = cli(
                port,
                &["CLUSTER", "SETSLOT", &self.slot, "NODE", &self.target_id],
            );
            assert_eq!(
                reply.trim(),
                "OK",
                "SETSLOT NODE on {port}: {:?}",
                cluster.topology()
            );
        }
        cluster.wait_slot_owner(self.slot.parse().expect("a slot"), self.target);
    }

    /// Keys of the slot on `port`.
    fn keys_on(&self, port: u16) -> i64 {
        cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &self.slot])
            .trim()
            .parse()
            .expect("a count")
    }
}

/// Ingest settings with the default stream names and `partitions`.
fn ingest(partitions: usize) -> IngestSettings {
    IngestSettings {
        claim_idle: Duration::from_secs(1),
        ..ingest_settings(intake_stream(), partitions)
    }
}

/// An event with `id`.
fn event(id: &str) -> Vec<Field> {
    vec![
        (b"id".to_vec(), id.as_bytes().to_vec()),
        (b"user".to_vec(), b"u1".to_vec()),
        (b"amount".to_vec(), b"1".to_vec()),
    ]
}

/// A store on `cluster` (a pool of one connection) and its client.
async fn connect(cluster: &RedisCluster, reconnect: Reconnect) -> (Store, Client) {
    let store = Store::connect(&cluster.url(), "rb", 1, reconnect)
        .await
        .expect("connect");
    let client = store.client().clone();
    (store, client)
}

/// A store and client on `cluster`, `rb:events` holding `e0`, and its slot beginning to move.
async fn moving_stream(cluster: &RedisCluster, reconnect: Reconnect) -> (Store, Client, Moving) {
    let (store, client) = connect(cluster, reconnect).await;
    first_event(&client).await;
    let moving = Moving::begin(cluster, &client, intake_stream());
    (store, client, moving)
}

/// Appends the event `e0` to `rb:events`, which the tests then move.
async fn first_event(client: &Client) {
    stream::append(client, &ingest(1), &[event("e0")])
        .await
        .expect("first append");
}

/// The `id` fields of every entry of `stream`, in order, read with a client that knows the
/// current slot map.
async fn ids_in(cluster: &RedisCluster, stream: &str) -> Vec<String> {
    let (_fresh, client) = connect(cluster, Reconnect::Never).await;
    let v: Value = client.xrange(stream, "-", "+", None).await.expect("XRANGE");
    stream::parse_entries(v)
        .into_iter()
        .map(|e| {
            let fields = e.fields.expect("fields");
            let id = fields
                .iter()
                .find(|(k, _)| k == b"id")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            id.expect("an id field")
        })
        .collect()
}

/// The part of `key` its slot is hashed from: its hash tag, else the whole key.
fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

/// A call that holds its connection to the node of `key` for about 300 ms, then resolves to
/// nil: `BLPOP` on an empty list in `key`'s slot. The connection's next commands wait
/// behind it, as behind a slow script, while the node serves the others. (A script cannot
/// wait 300 ms on every server: since Redis 7.2, and in Valkey, it sees `TIME` frozen at its
/// start, and a loop on it spins until `busy-reply-threshold`, 5 s, and gets its node failed
/// over.) fred is told the call does not block, so it pipelines behind it as behind any.
fn slow_call(
    client: &fred::clients::Client,
    key: String,
) -> tokio::task::JoinHandle<Result<fred::types::Value, fred::error::Error>> {
    use fred::prelude::*;
    use fred::types::{ClusterHash, CustomCommand};
    let list = format!("{{{}}}:slow", hash_tag(&key));
    assert_eq!(
        ClusterRouting::hash_key(list.as_bytes()),
        ClusterRouting::hash_key(key.as_bytes())
    );
    let client = client.clone();
    tokio::spawn(async move {
        client
            .custom(
                CustomCommand::new_static("BLPOP", ClusterHash::FirstKey, false),
                vec![list.as_str(), "0.3"],
            )
            .await
    })
}

/// The stream has been MIGRATEd to the target while the slot is still moving: the source
/// answers the transaction with ASK. The append follows no ASK (its confirmation would wait
/// for the source's replicas): it fails as an outage, having written nothing, and a call in
/// flight on the target keeps its reply. Tried again once the slot is handed over, each
/// event lands once, on the target.
#[tokio::test]
async fn an_append_to_a_stream_moved_mid_migration_is_an_outage_and_lands_once_after() {
    let cluster = RedisCluster::start();
    let (_store, client, moving) = moving_stream(&cluster, Reconnect::Never).await;
    let (settings, key) = (ingest(1), intake_stream());
    moving.migrate(&[key]);
    assert_eq!(
        (moving.keys_on(moving.source), moving.keys_on(moving.target)),
        (0, 1)
    );

    let other = name_on(&client, moving.target, "other", |n| n.to_string());
    let slow = slow_call(&client, other);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let batch = [event("e1"), event("e2"), event("e3")];
    let error = stream::append(&client, &settings, &batch)
        .await
        .expect_err("the append follows no ASK");
    let error = StoreError::from(error);
    assert!(error.is_outage(), "{error}");
    let slow = slow.await.expect("join").expect("the slow call's reply");
    assert_eq!(slow, Value::Null);

    moving.finish(&cluster);
    assert_eq!(ids_in(&cluster, key).await, ["e0"], "nothing was appended");
    let written = stream::append(&client, &settings, &batch)
        .await
        .expect("the append after the slot moved");
    assert_eq!(written, vec![key.to_string()]);
    assert_eq!(ids_in(&cluster, key).await, ["e0", "e1", "e2", "e3"]);
    assert_eq!(
        (moving.keys_on(moving.source), moving.keys_on(moving.target)),
        (0, 1)
    );
}

/// The slot is MIGRATING but the stream is still on the source: no redirection, the events
/// land there once, and move with the key.
#[tokio::test]
async fn an_append_to_a_stream_not_yet_moved_lands_once_on_the_source() {
    let cluster = RedisCluster::start();
    let (_store, client, moving) = moving_stream(&cluster, Reconnect::Never).await;
    let (settings, key) = (ingest(1), intake_stream());
    stream::append(&client, &settings, &[event("e1"), event("e2")])
        .await
        .expect("append on the source");
    assert_eq!(cli(moving.source, &["XLEN", key]).trim(), "3");
    assert_eq!(moving.keys_on(moving.target), 0);
    moving.migrate(&[key]);
    moving.finish(&cluster);
    assert_eq!(ids_in(&cluster, key).await, ["e0", "e1", "e2"]);
}

/// The slot has moved and the client's slot map is stale: the transaction meets MOVED,
/// the client re-reads the map and appends on the new owner, once; the client still works.
async fn append_after_the_slot_moved(reconnect: Reconnect) {
    let cluster = RedisCluster::start();
    let (_store, client, moving) = moving_stream(&cluster, reconnect).await;
    let (settings, key) = (ingest(1), intake_stream());
    moving.migrate(&[key]);
    moving.finish(&cluster);
    assert_eq!(
        owner(&client, key),
        moving.source,
        "the client's map is stale"
    );
    stream::append(&client, &settings, &[event("e1"), event("e2")])
        .await
        .expect("the append follows MOVED");
    stream::append(&client, &settings, &[event("e3")])
        .await
        .expect("the client still works");
    assert_eq!(ids_in(&cluster, key).await, ["e0", "e1", "e2", "e3"]);
    assert_eq!(cli(moving.target, &["XLEN", key]).trim(), "4");
}

/// Through a client that does not reconnect (`rollboard send`'s).
#[tokio::test]
async fn an_append_after_the_slot_moved_lands_once_on_the_new_owner() {
    append_after_the_slot_moved(Reconnect::Never).await;
}

/// Through a client that reconnects (the daemon's, which takes `POST /v1/events`).
#[tokio::test]
async fn a_daemon_append_after_the_slot_moved_lands_once_on_the_new_owner() {
    append_after_the_slot_moved(Reconnect::Forever).await;
}

/// Several partitions appended at once, one of them moved mid-migration: that partition's
/// transaction fails as an outage (the others may be appended), and the append tried again
/// once the slot is handed over puts every event in its partition, the moved partition's
/// once each.
#[tokio::test]
async fn a_partitioned_append_with_one_partition_moving_lands_every_event() {
    let cluster = RedisCluster::start();
    let (_store, client) = connect(&cluster, Reconnect::Never).await;
    let settings = ingest(4);
    let keys = stream::keys(&settings);
    let ids: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let first: Vec<Vec<Field>> = ids[..20].iter().map(|id| event(id)).collect();
    stream::append(&client, &settings, &first)
        .await
        .expect("first append");
    let moving = Moving::begin(&cluster, &client, &keys[1]);
    moving.migrate(&[&keys[1]]);
    let rest: Vec<Vec<Field>> = ids[20..].iter().map(|id| event(id)).collect();
    let error = stream::append(&client, &settings, &rest)
        .await
        .expect_err("one partition is moving");
    assert!(StoreError::from(error.clone()).is_outage(), "{error}");
    moving.finish(&cluster);
    stream::append(&client, &settings, &rest)
        .await
        .expect("the append tried again");
    let mut seen = Vec::new();
    for (p, key) in keys.iter().enumerate() {
        let in_partition = ids_in(&cluster, key).await;
        for id in &in_partition {
            assert_eq!(
                rollboard::domain::partition::partition_of(id.as_bytes(), 4),
                p,
                "{id} in partition {p}"
            );
            let copies = in_partition.iter().filter(|i| *i == id).count();
            assert!(
                copies <= if p == 1 { 1 } else { 2 },
                "{id}: {copies} copies"
            );
        }
        seen.extend(in_partition);
    }
    seen.sort();
    seen.dedup();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(seen, expected);
}

/// A board named `name` with slices of a minute.
fn board(name: &str) -> Board {
    crate::support::boards::board(name, 60_000, 10)
}

/// (member, total) of the board's top 10.
async fn top(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
) -> Result<Vec<(String, i64)>, StoreError> {
    let page = store.top(&board.widest(), scope, 0, 10, NOW).await?;
    Ok(page
        .entries
        .into_iter()
        .map(|e| (e.member, e.total))
        .collect())
}

/// A query on an instance whose slot is moving: with some of its keys moved the source
/// answers ASK (Redis 7.0; TRYAGAIN on later versions), with all of them too; the query
/// gives a clean outage error, and a query of another board in flight on the target keeps
/// its own answer. Once the slot is the target's, the query answers right at once.
#[tokio::test]
async fn a_query_of_a_moving_instance_is_right_or_an_outage() {
    let cluster = RedisCluster::start();
    let (store, client) = connect(&cluster, Reconnect::Never).await;
    let keys = store.keys().clone();
    let moved = board("moved");
    let k = store.instance(&moved.widest(), None);
    let batch = [ev("a", NOW - 10, "ann", 5), ev("b", NOW - 5, "bob", 7)];
    apply_events(&store, &moved, &batch, NOW).await;
    let moving = Moving::begin(&cluster, &client, &k.meta());
    let staying = board(&name_on(&client, moving.target, "stay", |n| {
        keys.instance(n, None).meta()
    }));
    apply_events(&store, &staying, &[ev("c", NOW - 10, "cid", 3)], NOW).await;
    let want = vec![("bob".to_string(), 7), ("ann".to_string(), 5)];
    // The slot is only marked, the keys are all on the source: no redirection.
    assert_eq!(top(&store, &moved, None).await.expect("top"), want);

    // Some of the keys it reads moved (the meta Hash does not exist before a roll), then
    // all of them.
    for key in [k.result(), k.members()] {
        moving.migrate(&[&key]);
        let slow = slow_call(&client, keys.instance(&staying.name, None).meta());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (redirected, other) =
            tokio::join!(top(&store, &moved, None), top(&store, &staying, None));
        assert_eq!(
            other.expect("the other query"),
            vec![("cid".to_string(), 3)]
        );
        let error = redirected.expect_err("a moving instance is not read");
        assert!(error.is_outage(), "{error}");
        assert_eq!(slow.await.expect("join").expect("slow"), Value::Null);
    }

    moving.finish(&cluster);
    assert_eq!(
        top(&store, &moved, None).await.expect("top after the move"),
        want
    );
    assert_eq!(
        top(&store, &staying, None)
            .await
            .expect("top of the other board"),
        vec![("cid".to_string(), 3)]
    );
}

/// A scoped query also reads the board's watermark (another slot). Once that slot has
/// moved, the query answers right at once, like the instance's own read.
#[tokio::test]
async fn a_scoped_query_after_the_watermark_moved_answers_at_once() {
    let cluster = RedisCluster::start();
    let (store, client) = connect(&cluster, Reconnect::Never).await;
    let scoped = scoped(board("rooms"));
    apply_events_in(&store, &scoped, "r1", &[ev("a", NOW - 10, "ann", 5)], NOW).await;
    let floor = store
        .raise_board_watermark(&scoped.widest(), 1, NOW)
        .await
        .expect("floor");
    let window = store.keys().window(&scoped.name);
    let instance = store.instance(&scoped.widest(), Some("r1")).meta();
    assert_ne!(
        ClusterRouting::hash_key(window.as_bytes()),
        ClusterRouting::hash_key(instance.as_bytes())
    );
    let want = vec![("ann".to_string(), 5)];
    assert_eq!(top(&store, &scoped, Some("r1")).await.expect("top"), want);

    let moving = Moving::begin(&cluster, &client, &window);
    moving.migrate(&[&window]);
    moving.finish(&cluster);
    assert_eq!(
        top(&store, &scoped, Some("r1"))
            .await
            .expect("top after the watermark moved"),
        want
    );
    assert_eq!(
        cli(moving.target, &["HGET", &window, "expired_through"]).trim(),
        floor.to_string()
    );
}

/// A roll script (through `Store::eval`) on a key whose slot is moving: run on the source
/// while the key is there, an outage error while it is moved but the slot still moving,
/// and run on the target at once after the slot is handed over.
#[tokio::test]
async fn a_roll_script_on_a_moving_slot_runs_once_where_the_key_is() {
    let cluster = RedisCluster::start();
    let (store, client) = connect(&cluster, Reconnect::Never).await;
    let b = board("rolled");
    let window = store.keys().window(&b.name);
    let raise = async |to: i64| store.raise_board_watermark(&b.widest(), to, NOW).await;
    assert_eq!(raise(100).await.expect("floor"), 100);
    let moving = Moving::begin(&cluster, &client, &window);
    assert_eq!(raise(200).await.expect("on the source"), 200);
    moving.migrate(&[&window]);
    let error = raise(300).await.expect_err("moved while the slot moves");
    assert!(error.is_outage(), "{error}");
    moving.finish(&cluster);
    assert_eq!(
        cli(moving.target, &["HGET", &window, "expired_through"]).trim(),
        "200",
        "nothing ran while the slot moved"
    );
    assert_eq!(raise(300).await.expect("on the target"), 300);
    assert_eq!(
        cli(moving.target, &["HGET", &window, "expired_through"]).trim(),
        "300"
    );
}

/// A fresh cluster, a store on it, its pool client, a dedicated stream reader, and the
/// settings of one unpartitioned [`intake_stream`], created with its consumer group.
async fn stream_rig() -> (RedisCluster, Store, Client, Client, IngestSettings) {
    let cluster = RedisCluster::start();
    let (store, client) = connect(&cluster, Reconnect::Never).await;
    let reader = Store::dedicated(&cluster.url(), Reconnect::Never)
        .await
        .expect("reader");
    let settings = ingest(1);
    stream::ensure_group(&client, intake_stream(), &settings.group)
        .await
        .expect("group");
    (cluster, store, client, reader, settings)
}

/// Appends the events `ids` to `rb:events` through `client`, then reads what is new for the
/// consumer (`XREADGROUP >`) through `reader`.
async fn append_and_read_new(client: &Client, reader: &Client, ids: &[&str]) -> Vec<stream::Entry> {
    let settings = ingest(1);
    let events: Vec<Vec<Field>> = ids.iter().map(|id| event(id)).collect();
    stream::append(client, &settings, &events)
        .await
        .expect("append");
    stream::read(reader, &settings, intake_stream(), ">", Some(100))
        .await
        .expect("read new")
}

/// Reads `rb:events` from `id` through `reader` once its stream has moved, trying again
/// (three tries in all) while the read meets an outage.
async fn read_after_the_move(reader: &Client, id: &str) -> Vec<stream::Entry> {
    let mut tries = 0;
    loop {
        tries += 1;
        match stream::read(reader, &ingest(1), intake_stream(), id, Some(100)).await {
            Ok(entries) => break entries,
            Err(e) if tries < 3 && e.is_outage() => {}
            Err(e) => panic!("read {id} after {tries} tries: {e}"),
        }
    }
}

/// The dedicated reader's stream moves with entries read but not acknowledged: reads fail
/// as outages while the slot moves, and once it has moved the consumer's pending entries
/// are read again from the target, and new entries after them.
#[tokio::test]
async fn the_stream_reader_recovers_its_pending_entries_after_the_stream_moved() {
    let (cluster, _store, client, reader, settings) = stream_rig().await;
    let got = append_and_read_new(&client, &reader, &["e1", "e2"]).await;
    assert_eq!(got.len(), 2);
    let moving = Moving::begin(&cluster, &client, intake_stream());
    moving.migrate(&[intake_stream()]);
    for id in ["0", ">"] {
        let error = stream::read(&reader, &settings, intake_stream(), id, Some(100))
            .await
            .expect_err("the stream is moving");
        assert!(error.is_outage(), "{error}");
    }
    moving.finish(&cluster);
    let ids = |entries: Vec<stream::Entry>| -> Vec<String> {
        entries.into_iter().map(|e| e.id).collect()
    };
    let pending = read_after_the_move(&reader, "0").await;
    assert_eq!(ids(pending), ids(got));
    let new = append_and_read_new(&client, &reader, &["e3"]).await;
    assert_eq!(new.len(), 1);
}

/// The dedicated reader is blocked in `XREADGROUP >` on the source when the stream is
/// MIGRATEd away and the slot handed over: the blocked read ends empty or with an outage
/// error, never with entries, and the pending entry and the one appended meanwhile (on the
/// target) are both read afterwards, once each.
#[tokio::test]
async fn a_blocked_stream_read_survives_its_stream_moving_away() {
    if !survives_a_blocked_read_migrated("a_blocked_stream_read_survives_its_stream_moving_away") {
        return;
    }
    let (cluster, _store, client, reader, settings) = stream_rig().await;
    let first = append_and_read_new(&client, &reader, &["e1"]).await;
    assert_eq!(first.len(), 1);
    let source = owner(&client, intake_stream());
    let blocked = {
        let (reader, settings) = (reader.clone(), settings.clone());
        tokio::spawn(async move {
            stream::read(&reader, &settings, intake_stream(), ">", Some(3000)).await
        })
    };
    assert!(
        wait_for(Duration::from_secs(5), || async {
            // Blocked (`b`), not merely the last command of a read that has returned.
            cli(source, &["CLIENT", "LIST"])
                .lines()
                .any(|c| c.contains(" flags=b ") && c.contains(" cmd=xreadgroup "))
        })
        .await,
        "the read blocks on the source"
    );
    let moving = Moving::begin(&cluster, &client, intake_stream());
    moving.migrate(&[intake_stream()]);
    moving.finish(&cluster);
    stream::append(&client, &settings, &[event("e2")])
        .await
        .expect("append after the slot moved");
    // Redis 7.0 ends the read with MOVED once the slot is handed over.
    match blocked.await.expect("join") {
        Ok(entries) => assert!(entries.is_empty(), "{entries:?}"),
        Err(e) => assert!(e.is_outage() || e.to_string().contains("NOGROUP"), "{e}"),
    }

    let pending = read_after_the_move(&reader, "0").await;
    assert_eq!(pending, first);
    let new = read_after_the_move(&reader, ">").await;
    assert_eq!(new.len(), 1, "{new:?}");
    let id = new[0]
        .fields
        .as_ref()
        .and_then(|f| f.iter().find(|(k, _)| k == b"id").map(|(_, v)| v.clone()));
    assert_eq!(id.as_deref(), Some(b"e2".as_slice()));
    assert_eq!(moving.keys_on(moving.target), 1);
}

/// An append confirmed with `min_replicas_acked = 1` while its stream's slot is moving, the
/// stream already on the target and the confirmation's own key still on the source, and the
/// target's replica frozen: the events can only be confirmed by the target's replica, so the
/// append must fail or its confirmation must. (Following the ASK put the events on the
/// target while `WAIT` went to the source, whose replica confirmed them.)
#[tokio::test]
async fn an_append_confirmed_while_its_slot_moves_waits_for_the_replica_that_holds_it() {
    let cluster = RedisCluster::start();
    let store =
        one_replica_store(&cluster.url(), Reconnect::Never, Duration::from_millis(300)).await;
    let client = store.client().clone();
    let settings = ingest(1);
    let key = intake_stream();
    let written = stream::append(&client, &settings, &[event("e0")])
        .await
        .expect("first append");
    store.confirm_writes(&written).await.expect("confirmed");
    let moving = Moving::begin(&cluster, &client, key);
    moving.migrate(&[key]);
    assert_eq!(
        (moving.keys_on(moving.source), moving.keys_on(moving.target)),
        (1, 1),
        "the confirmation's key stays on the source"
    );
    let replica = cluster.replica_of(moving.target);
    cluster.signal(replica, true);
    let appended = stream::append(&client, &settings, &[event("e1")]).await;
    let confirmed = match &appended {
        Ok(written) => Some(store.confirm_writes(written).await),
        Err(_) => None,
    };
    cluster.signal(replica, false);
    match (appended, confirmed) {
        (Err(e), _) => assert!(StoreError::from(e.clone()).is_outage(), "{e}"),
        (Ok(_), Some(Err(e))) => assert!(e.is_outage(), "{e}"),
        (Ok(_), _) => panic!("confirmed by a replica of the master that does not hold it"),
    }
}

/// The daemon (writes confirmed by one replica) after the events stream's slot has moved:
/// every `POST /v1/events` is accepted at once. The intake's pool has one writing client,
/// so the append (which re-reads the slot map after the MOVED) and its confirmation use the
/// same, fresh map. (A confirmation on another client of a pool, whose map is still stale,
/// is redirected and fails as an outage, by design: see `Store::confirm_writes`.)
#[tokio::test]
async fn posts_after_the_events_slot_moved_are_accepted_at_once() {
    use crate::support::daemon::Daemon;

    // The daemon's consumer is blocked in XREADGROUP on the stream that moves.
    if !survives_a_blocked_read_migrated("posts_after_the_events_slot_moved_are_accepted_at_once") {
        return;
    }
    let cluster = RedisCluster::start();
    let (store, _) = connect(&cluster, Reconnect::Never).await;
    let (_dir, port, config) = config_for_url(&cluster.url(), "a", "");
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replacen("[redis]\n", "[redis]\nmin_replicas_acked = 1\n", 1);
    std::fs::write(&config, text).expect("config");
    let daemon = Daemon::start(&config, port).await;
    let http = reqwest::Client::new();
    let post = |n: usize| {
        let (http, base) = (http.clone(), daemon.base.clone());
        async move {
            http.post(format!("{base}/v1/events"))
                .json(&serde_json::json!({"id": format!("p{n}"), "room": "r1", "user": "u1", "amount": 1}))
                .send()
                .await
                .expect("post")
                .status()
                .as_u16()
        }
    };
    assert_eq!(post(0).await, 202, "log:\n{}", daemon.logs());
    let moving = Moving::begin(&cluster, store.client(), intake_stream());
    moving.migrate(&[intake_stream()]);
    moving.finish(&cluster);
    for n in 1..=8 {
        assert_eq!(post(n).await, 202, "post {n}; log:\n{}", daemon.logs());
    }
    let ids = ids_in(&cluster, intake_stream()).await;
    let want: Vec<String> = (0..=8).map(|n| format!("p{n}")).collect();
    assert_eq!(ids, want);
    assert!(daemon.terminate().await.success());
}

/// An apply whose instance sits in a slot on the move fails as an outage of kind
/// `redirected` (the consumer retries the batch) and counts nothing; once the slot has
/// moved, the retry counts every event once.
#[tokio::test]
async fn an_apply_across_a_slot_move_counts_each_event_once() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let b = board("applied");
    apply_events(&store, &b, &[ev("a0", NOW - 500, "x", 10)], NOW).await;
    let moving = Moving::begin(
        &cluster,
        store.client(),
        &store.instance(&b.widest(), None).meta(),
    );
    moving.migrate_all();
    let batch = [ev("a1", NOW - 400, "x", 5), ev("a2", NOW - 300, "y", 7)];
    if let Err(e) = store.apply(&b, None, &batch, NOW).await {
        assert!(e.is_outage(), "{e}");
        assert_eq!(e.kind(), "redirected", "{e}");
    }
    moving.finish(&cluster);
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
    assert_eq!(
        top(&store, &b, None).await.expect("top"),
        vec![("x".to_string(), 15), ("y".to_string(), 7)]
    );
}

/// A key whose slot is being moved, reached through a connection with a call in flight on
/// the target node: the call in flight gets its own reply, the redirected command an outage
/// error (retried by rollboard), and once the slot has moved the retry reaches the new
/// owner. fred 10.1, left to follow the ASK itself, reads the in-flight call's reply as the
/// answer to its `ASKING` and hands that call `OK` instead.
#[tokio::test]
async fn a_moving_slot_leaves_the_replies_of_other_calls_alone() {
    let cluster = RedisCluster::start();
    let (_store, client) = connect(&cluster, Reconnect::Never).await;
    let key = "moving";
    let _: () = client.set(key, 41, None, None, false).await.expect("set");
    let moving = Moving::begin(&cluster, &client, key);
    let still = name_on(&client, moving.target, "still", |n| n.to_string());
    moving.migrate(&[key]);

    // About 300 ms on the target, then the reply nil.
    let slow = slow_call(&client, still);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The source answers ASK: the key is on the target now.
    let redirected = client.incr::<i64, _>(key).await;
    let slow = slow.await.expect("join");
    assert_eq!(slow.expect("the slow call's reply"), Value::Null);
    let error = StoreError::from(redirected.expect_err("a redirection is not followed"));
    assert!(error.is_outage(), "{error}");

    moving.finish(&cluster);
    assert_eq!(
        cli(moving.target, &["GET", key]).trim(),
        "41",
        "nothing ran"
    );
    // The first try may meet MOVED (the client then re-reads the slot map), the next
    // reaches the target.
    let mut tries = 0;
    let incremented = loop {
        tries += 1;
        match client.incr::<i64, _>(key).await {
            Ok(n) => break n,
            Err(e) if tries < 5 && StoreError::from(e.clone()).is_outage() => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("after {tries} tries: {e}"),
        }
    };
    assert_eq!(incremented, 42);
    assert!(tries <= 2, "{tries} tries");
    assert_eq!(cli(moving.target, &["GET", key]).trim(), "42");
}
