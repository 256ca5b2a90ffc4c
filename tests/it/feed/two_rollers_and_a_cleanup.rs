//! Two rollers of one scoped resummarize instance (replicas whose ticks overlap, or an
//! operator's `roll` beside the daemon's; swap.lua is written for that race). Roller A
//! expires the last live slice, and its run's swap is refused because roller B raised the
//! watermark after A summed; A then cleans the instance up. The ranking A deletes there
//! still ranks the members whose `left` entries only a swap writes: unless the clean-up
//! waits for that swap, the stream keeps them for ever while every query answers empty.

use rollboard::domain::board::{Changes, Mode};
use rollboard::store::SwapCheck;

use crate::support::asserts::ranked;
use crate::support::boards::{apply_events_in, board, ev, roll_board, scoped, RANKING, T0};
use crate::support::feed::{changes_after, replay};
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;

#[tokio::test]
async fn a_cleanup_after_a_refused_swap_leaves_no_member_in_the_feed() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = scoped(board("rooms", SLICE, 4));
    b.mode = Mode::Resummarize;
    b.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    let scope = Some("r1");
    let now = T0 / SLICE * SLICE + SLICE / 2;
    apply_events_in(&store, &b, "r1", &[ev("a", now, "alice", 5)], now).await;
    roll_board(&store, &b, now).await;
    let key = store.instance(&b.widest(), scope).changes();
    let mut top = Vec::new();
    let (changes, last) = changes_after(&store, &key, None).await;
    replay(&mut top, &changes, 3);
    assert_eq!(top, ["alice"]);

    // Roller A: the slice dies; A expires it and sums nothing.
    let later = now + 4 * SLICE;
    let target = b.slice_of(later) - b.widest().slices_in_window();
    let (w, dead) = store
        .raise_watermark(&b.widest(), scope, target, later)
        .await
        .expect("raise");
    assert_eq!(dead, vec![b.slice_of(now)]);
    let n = dead[0];
    let slice = store.instance(&b.widest(), scope).slice(n);
    let (_, fields) = store.scan("HSCAN", &slice, "0", 100).await.expect("hscan");
    let names: Vec<String> = fields.into_iter().map(|(f, _)| f).collect();
    store
        .expire_chunk(&b.widest(), scope, n, &names)
        .await
        .expect("expire");
    assert!(store
        .drop_slice(&b.widest(), scope, n)
        .await
        .expect("drop slice"));
    let summed = store.summed(&b.widest(), scope).await.expect("summed");
    store
        .stage(&b.widest(), scope, "runA", RANKING, &[])
        .await
        .expect("stage");
    // Roller B, a moment later, raises the watermark past A's.
    store
        .raise_watermark(&b.widest(), scope, target + 1, later + SLICE)
        .await
        .expect("raise");
    // A's swap is refused; A cleans up.
    let check = SwapCheck {
        watermark: Some(w),
        summed_at: Some((&summed.gen, later)),
        ..SwapCheck::default()
    };
    assert!(!store
        .swap(&b.widest(), scope, "runA", RANKING, check)
        .await
        .expect("swap"));
    store
        .discard(&b.widest(), scope, "runA")
        .await
        .expect("discard");
    let cleaned = store.cleanup(&b.widest(), scope).await.expect("cleanup");
    if cleaned {
        assert!(store
            .unregister_scope(&b, "r1", w)
            .await
            .expect("unregister"));
    }
    // B's roll, and every roll after it.
    roll_board(&store, &b, later + SLICE).await;
    roll_board(&store, &b, later + 2 * SLICE).await;
    let (changes, _) = changes_after(&store, &key, last.as_deref()).await;
    replay(&mut top, &changes, 3);
    assert_eq!(ranked(&store, &b, scope, later + 2 * SLICE).await, vec![]);
    assert_eq!(top, Vec::<String>::new(), "the feed still ranks them");
}
