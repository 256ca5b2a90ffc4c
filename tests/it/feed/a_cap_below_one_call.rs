//! One call can write up to 2 N entries when the whole top is replaced, N(N-1)/2 when it
//! turns over, and each XADD trims to `changes_max_len`: the configuration refuses a cap
//! below what one call may write, so a reader that has read everything up to a call, and
//! then everything after it, replays it, even at the smallest cap allowed.

use rollboard::domain::board::Changes;

use crate::support::boards::{apply_events, board, ev, T0};
use crate::support::feed::{changes_after, replay};
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;

#[tokio::test]
async fn a_reader_that_never_falls_behind_replays_every_call() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = board("tight", SLICE, 4);
    b.changes = Some(Changes { top: 3, max_len: 6 });
    let now = T0 / SLICE * SLICE + SLICE / 2;
    let key = store.instance(&b.widest(), None).changes();
    let first = [
        ev("a", now, "alice", 3),
        ev("b", now, "bob", 2),
        ev("c", now, "carol", 1),
    ];
    apply_events(&store, &b, &first, now).await;
    let (changes, last) = changes_after(&store, &key, None).await;
    let mut top = Vec::new();
    replay(&mut top, &changes, 3);
    assert_eq!(top, ["alice", "bob", "carol"]);
    // One call: three members above them all; the top of 3 is replaced whole.
    let second = [
        ev("d", now, "dave", 30),
        ev("e", now, "erin", 20),
        ev("f", now, "frank", 10),
    ];
    apply_events(&store, &b, &second, now).await;
    let (changes, _) = changes_after(&store, &key, last.as_deref()).await;
    assert_eq!(changes.len(), 6, "3 left and 3 entered: {changes:?}");
    replay(&mut top, &changes, 3);
    assert_eq!(top, ["dave", "erin", "frank"]);
}
