//! rollboard's Lua library on a cluster: each master holds its own copy, and one that lost
//! it (`FUNCTION FLUSH`, a restart without persistence) gets it back.

use crate::support::boards::{apply_events, board, now_ms};
use crate::support::cluster::{cli, RedisCluster};
use crate::support::events::stepped_events;
use crate::support::model::Instance;

/// Whether the server on `port` holds this build's library.
fn holds_library(port: u16) -> bool {
    let name = &rollboard::store::lua::library().name;
    cli(port, &["FUNCTION", "LIST", "LIBRARYNAME", name]).contains(name.as_str())
}

/// The library flushed from every master, then from each master alone: the readiness
/// check asks every master and loads it where it is missing. Then one master loses it again: the board whose slot it
/// serves applies and answers queries as the model, and that master holds it again.
#[tokio::test]
async fn every_master_gets_the_library_back() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let masters = cluster.masters();
    for &port in &masters {
        cli(port, &["FUNCTION", "FLUSH"]);
        assert!(!holds_library(port));
    }
    store.ensure_library().await.expect("ensure the library");
    for &port in &masters {
        assert!(holds_library(port), "master {port} lacks the library");
    }
    // Each master in turn the only one without it: the check asks every master.
    for &port in &masters {
        cli(port, &["FUNCTION", "FLUSH"]);
        store.ensure_library().await.expect("ensure the library");
        assert!(
            holds_library(port),
            "master {port} left without the library"
        );
    }

    let board = board("libless", 3_600_000, 24);
    let owner = cluster.owner_of(&store.instance(&board.widest(), None).meta());
    cli(owner, &["FUNCTION", "FLUSH"]);
    let now = now_ms();
    let events = stepped_events(50, now, 1000, 7);
    let mut model = Instance::default();
    for e in &events {
        model.apply(&board.widest(), e, now);
    }
    let got = apply_events(&store, &board, &events, now).await;
    assert!(
        got.iter().all(|o| *o == rollboard::store::Outcome::Applied),
        "{got:?}"
    );
    assert!(holds_library(owner));
    cli(owner, &["FUNCTION", "FLUSH"]);
    crate::support::model::assert_matches(&store, &board.widest(), None, &model, now).await;
    assert!(holds_library(owner));
}
