//! A change stream is a key of its board's instance: `drop-board` lists and deletes it
//! with the instance's other keys (registered scopes, and scopes only the key scan finds),
//! and the roll's deletion of an archived period deletes that period's stream with it.

use fred::prelude::*;
use rollboard::config::Settings;
use rollboard::domain::board::{period_instance, Board, Changes};
use rollboard::store::Store;

use crate::support::boards::{
    apply_events, apply_events_in, board, ev, keys_matching, roll_board, scoped, DAY, HOUR, T0,
};
use crate::support::cluster::RedisCluster;
use crate::support::keys::{prefix, schema};
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;

fn with_feed(mut b: Board) -> Board {
    b.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    b
}

/// Half way through the slice of [`T0`].
fn mid_slice() -> i64 {
    T0 / SLICE * SLICE + SLICE / 2
}

/// A scoped board `rooms` with a change feed.
fn fed_rooms() -> Board {
    with_feed(scoped(board("rooms", SLICE, 4)))
}

/// Every key of the server (one server).
async fn all_keys(store: &Store) -> Vec<String> {
    let mut keys = keys_matching(store, "*").await;
    keys.sort();
    keys
}

#[tokio::test]
async fn drop_board_deletes_the_change_stream_of_every_instance() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let now = mid_slice();
    let plain = with_feed(board("tips", SLICE, 4));
    let rooms = with_feed(scoped(board("rooms", SLICE, 4)));
    // A board whose name starts the same way keeps its stream.
    let other = with_feed(board("tips_v2", SLICE, 4));
    let events = [ev("a", now, "alice", 5), ev("b", now, "bob", 3)];
    apply_events(&store, &plain, &events, now).await;
    apply_events(&store, &other, &events, now).await;
    for room in ["lobby", "a:b", "{c}", "d}e"] {
        apply_events_in(&store, &rooms, room, &events, now).await;
    }
    let streams = keys_matching(&store, &format!("{}:changes:*", prefix())).await;
    assert_eq!(streams.len(), 6, "{streams:?}");

    for b in [&plain, &rooms] {
        let found = store.board_keys(&b.name).await.expect("board keys");
        assert!(found.unrecognized.is_empty(), "{:?}", found.unrecognized);
        store.drop_board_keys(&found).await.expect("drop");
    }
    // What is left is the other board's, its stream included.
    let left = all_keys(&store).await;
    assert!(
        left.iter().all(|k| k.contains("tips_v2")),
        "left behind: {left:?}"
    );
    assert!(left.contains(&store.instance(&other.widest(), None).changes()));
}

#[tokio::test]
async fn a_scope_that_left_the_registry_still_has_its_stream_dropped() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (now, rooms) = (mid_slice(), fed_rooms());
    apply_events_in(&store, &rooms, "gone", &[ev("a", now, "alice", 5)], now).await;
    // The scope left the registry (as a roll that found it empty does): only the scan
    // finds its keys.
    let _: i64 = store
        .client()
        .zrem(schema().scopes(&rooms.name), "gone")
        .await
        .expect("zrem");
    let found = store.board_keys(&rooms.name).await.expect("board keys");
    store.drop_board_keys(&found).await.expect("drop");
    assert_eq!(all_keys(&store).await, Vec::<String>::new());
}

const DAY_BOARD: &str = "\n[[boards]]\nname = \"daily\"\nmember = \"user\"\nperiod = \"day\"\ntime_zone = \"UTC\"\nperiod_grace = \"0s\"\nkeep_periods = 1\nchanges_top = 3\nchanges_max_len = 50\n";

#[tokio::test]
async fn an_archived_period_is_deleted_with_its_change_stream() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = Settings::from_toml(DAY_BOARD)
        .expect("valid")
        .boards
        .remove(0);
    assert_eq!(
        b.changes,
        Some(Changes {
            top: 3,
            max_len: 50
        })
    );
    let calendar = b.period.expect("a period board");
    // Three days, one event each: the first day's instance is beyond keep_periods = 1.
    let day0 = T0 / DAY * DAY;
    for d in 0..3 {
        let ts = day0 + d * DAY + HOUR;
        apply_events(&store, &b, &[ev(&format!("e{d}"), ts, "alice", 1)], ts).await;
    }
    let first = calendar.span_at(day0 + HOUR);
    let stream = store
        .instance(&b.widest(), Some(&period_instance(None, &first.id)))
        .changes();
    assert_eq!(
        keys_matching(&store, &stream).await,
        vec![stream.clone()],
        "the first day's stream was written"
    );
    let now = day0 + 2 * DAY + 2 * HOUR;
    let forgotten = store
        .forget_periods(&b, &calendar, now)
        .await
        .expect("forget");
    assert_eq!(forgotten.periods, vec![first.id.clone()]);
    let left: Vec<String> = all_keys(&store)
        .await
        .into_iter()
        .filter(|k| k.contains(&first.id))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "the archived period's keys");
}

/// On a cluster: every master is scanned, and each instance's stream is deleted in its
/// slot with the instance's other keys.
#[tokio::test]
async fn drop_board_deletes_the_change_streams_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let (now, rooms) = (mid_slice(), fed_rooms());
    let rooms_v2 = with_feed(scoped(board("rooms_v2", SLICE, 4)));
    let names: Vec<String> = (0..12).map(|i| format!("room{i}")).collect();
    for room in &names {
        let events = [ev(&format!("a{room}"), now, "alice", 5)];
        apply_events_in(&store, &rooms, room, &events, now).await;
        apply_events_in(&store, &rooms_v2, room, &events, now).await;
    }
    let streams = |board: &Board| -> Vec<String> {
        names
            .iter()
            .map(|room| store.instance(&board.widest(), Some(room)).changes())
            .collect()
    };
    let exists = async |keys: Vec<String>| -> usize {
        let mut n = 0;
        for key in keys {
            let e: i64 = store.client().exists(key.as_str()).await.expect("exists");
            n += e as usize;
        }
        n
    };
    assert_eq!(exists(streams(&rooms)).await, 12);
    let found = store.board_keys(&rooms.name).await.expect("board keys");
    assert_eq!(found.counts().get("changes"), Some(&12));
    store.drop_board_keys(&found).await.expect("drop");
    assert_eq!(exists(streams(&rooms)).await, 0);
    assert_eq!(exists(streams(&rooms_v2)).await, 12);
}

/// docs/design.md: "A scoped instance whose slices and idempotency keys have all expired is
/// cleaned up and its scope leaves the registry; its `meta` Hash (a few dozen bytes)
/// stays". Its change stream stays a day more, for its readers to read its last `left`
/// entries, and then goes; an instance that takes events again keeps it.
#[tokio::test]
async fn an_emptied_scope_leaves_its_meta_and_a_stream_that_expires() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (now, rooms) = (mid_slice(), fed_rooms());
    apply_events_in(&store, &rooms, "r1", &[ev("a", now, "alice", 5)], now).await;
    let later = now + 10 * SLICE;
    let report = roll_board(&store, &rooms, later).await;
    assert_eq!(report.scopes_removed, 1);
    let k = store.instance(&rooms.widest(), Some("r1"));
    let (changes, _) = crate::support::feed::changes_after(&store, &k.changes(), None).await;
    assert_eq!(changes.len(), 2, "entered, then left: {changes:?}");
    let mut left: Vec<String> = all_keys(&store)
        .await
        .into_iter()
        .filter(|key| key.contains("{rooms:r1}"))
        .collect();
    left.sort();
    assert_eq!(left, vec![k.changes(), k.meta()]);
    let ttl = |key: String| {
        let store = &store;
        async move {
            let ms: i64 = store.client().pttl(key).await.expect("pttl");
            ms
        }
    };
    let retained = ttl(k.changes()).await;
    assert!(
        retained > 0 && retained <= rollboard::store::CHANGES_RETAIN_MS,
        "{retained}"
    );
    assert_eq!(ttl(k.meta()).await, -1);

    // Back before it expired: the stream is written again and stays.
    apply_events_in(&store, &rooms, "r1", &[ev("b", later, "bob", 2)], later).await;
    assert_eq!(ttl(k.changes()).await, -1);
    let (changes, _) = crate::support::feed::changes_after(&store, &k.changes(), None).await;
    assert_eq!(changes.len(), 3, "bob entered: {changes:?}");
}
