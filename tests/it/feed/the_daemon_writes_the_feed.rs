//! End to end: a daemon whose configuration gives two boards a change feed (one scoped)
//! ingests events XADDed to its intake stream; each instance's stream, replayed from
//! empty, is the instance's top as queried, and sending the same entries again (a
//! producer's retry) adds no entry.

use rollboard::config::Settings;
use rollboard::domain::board::Board;
use rollboard::store::Store;

use crate::support::asserts::ranked;
use crate::support::boards::redis_now;
use crate::support::config::{board_table, server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::events::{tip, xadd_all, Fields};
use crate::support::feed::{changes_after, replay};
use crate::support::keys::intake_stream;
use crate::support::wait::drained;

/// A board of the last day's tips keeping a feed of its top 3, and one by room keeping a
/// feed of each room's top 2.
fn feed_boards() -> String {
    let top = board_table(
        "top_24h",
        "user",
        "24h",
        "changes_top = 3\nchanges_max_len = 1000\n",
    );
    let by_room = "scope = \"room\"\ntie_break = \"latest\"\nchanges_top = 2\n";
    top + &board_table("room_top", "user", "24h", by_room)
}

/// The stream of one instance replayed from empty, and its top as the store ranks it.
async fn replayed_and_ranked(
    store: &Store,
    b: &Board,
    scope: Option<&str>,
    now: i64,
) -> (Vec<String>, Vec<String>, usize) {
    let n = b.changes.expect("a feed").top as usize;
    let key = store.instance(&b.widest(), scope).changes();
    let (changes, _) = changes_after(store, &key, None).await;
    let mut top = Vec::new();
    replay(&mut top, &changes, n);
    let ranked: Vec<String> = ranked(store, b, scope, now)
        .await
        .into_iter()
        .take(n)
        .map(|(m, _, _)| m)
        .collect();
    (top, ranked, changes.len())
}

/// The instances of `b` the tips of [`tip`] go to: the unscoped one, or rooms r0 to r6.
fn tipped_scopes(b: &Board) -> Vec<Option<String>> {
    match b.scope {
        None => vec![None],
        Some(_) => (0..7).map(|r| Some(format!("r{r}"))).collect(),
    }
}

#[tokio::test]
async fn the_daemon_writes_each_instances_feed_once() {
    let (redis, dir, port, config) = server_and_config(|dir, redis, port| {
        write_config(dir, redis, port, "feed", &feed_boards())
    });
    let _dir = dir;
    let store = redis.store("rb").await;
    let boards = Settings::from_toml(&feed_boards()).expect("valid").boards;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    let events: Vec<Fields> = (0..120).map(|i| tip(i, now)).collect();
    xadd_all(store.client(), intake_stream(), &events).await;
    assert!(drained(&store).await, "the events were not applied");
    let mut written = Vec::new();
    for b in &boards {
        for scope in &tipped_scopes(b) {
            let (top, ranked, n) = replayed_and_ranked(&store, b, scope.as_deref(), now).await;
            assert_eq!(top, ranked, "{} {scope:?}", b.name);
            assert!(!top.is_empty());
            written.push(n);
        }
    }
    // The same entries again: every event a duplicate, no entry written.
    xadd_all(store.client(), intake_stream(), &events).await;
    assert!(drained(&store).await, "the events were not applied");
    let mut again = Vec::new();
    for b in &boards {
        for scope in &tipped_scopes(b) {
            again.push(
                replayed_and_ranked(&store, b, scope.as_deref(), now)
                    .await
                    .2,
            );
        }
    }
    assert_eq!(again, written);
    daemon.kill().await;
}
