//! `changes_max_len` may be as low as `changes_top` (src/config/boards.rs), but one call
//! can write more entries than that: up to 2 N when the whole top is replaced, N(N-1)/2 when
//! it turns over. Each XADD trims to the cap, so the call trims away its own first entries
//! before any reader can read them: a reader that has read everything up to the call, and
//! then everything after it, still cannot replay it.

use rollboard::domain::board::Changes;

use crate::support::feed::{changes_after, replay};
use crate::support::*;

const SLICE: i64 = 60_000;

#[tokio::test]
#[ignore = "break: with changes_max_len = changes_top (accepted), a call replacing the whole top \
            writes 2 N entries and trims its own `left` entries away; the lower bound of \
            changes_max_len should be what one call can write (max(2N, N(N-1)/2))"]
async fn a_reader_that_never_falls_behind_replays_every_call() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = board("tight", SLICE, 4);
    b.changes = Some(Changes { top: 3, max_len: 3 });
    let now = T0 / SLICE * SLICE + SLICE / 2;
    let key = store.instance(&b, None).changes();
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
