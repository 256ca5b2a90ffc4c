//! docs/design.md *Bounded calls*: no call may hold Redis for more than about 2 ms. A call
//! records one `passed` entry per pair of members of the top that swapped places, up to
//! N(N-1)/2: a swap writing 4950 of them (a top of 100 turned over) held Redis for ~13 ms,
//! so `changes_top` is at most 25, where one call writes at most 300. The test below turns
//! a top of 25 over in one swap: exactly 300 entries.

use rollboard::domain::board::{Changes, Mode};
use rollboard::store::ApplyEvent;

use crate::support::boards::{apply_events, board, ev, roll_board, T0};
use crate::support::feed::changes_after;
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;

#[tokio::test]
async fn one_call_writes_entries_in_proportion_to_the_top() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = board("bounded", SLICE, 4);
    b.changes = Some(Changes {
        top: 25,
        max_len: 100_000,
    });
    b.mode = Mode::Resummarize;
    b.allow_negative = true;
    let now = T0 / SLICE * SLICE + SLICE / 2;
    for (prefix, amount) in [("a", 1_000i64), ("b", -1_000)] {
        let events: Vec<ApplyEvent> = (0..25)
            .map(|i| {
                let a = if amount > 0 { amount + i } else { -2 * i };
                ev(&format!("{prefix}{i}"), now, &format!("m{i:03}"), a)
            })
            .collect();
        apply_events(&store, &b, &events, now).await;
        // The run's swap: first the whole top enters, then its order turns over.
        let key = store.instance(&b.widest(), None).changes();
        let before = changes_after(&store, &key, None).await.0.len();
        roll_board(&store, &b, now).await;
        let written = changes_after(&store, &key, None).await.0.len() - before;
        let most = if prefix == "a" { 25 } else { 300 };
        assert_eq!(written, most, "one swap");
    }
}
