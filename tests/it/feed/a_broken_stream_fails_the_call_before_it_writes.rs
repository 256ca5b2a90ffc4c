//! A change stream of another type (a key rollboard did not write) fails the apply, the
//! expiry and the swap before their first write: no total, id or slice field is written
//! without its entries, and once the key is gone the same events count, once.

use fred::prelude::*;
use rollboard::domain::board::{Board, Changes, Mode};
use rollboard::store::{Outcome, Store};

use crate::support::boards::{
    apply_model, ev, roll_board, run_jobs, set_string, snapshot, variants,
};
use crate::support::model::{assert_matches, Instance};
use crate::support::redis::RedisServer;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

fn with_feed(mut b: Board) -> Board {
    b.changes = Some(Changes {
        top: 2,
        max_len: 100,
    });
    b
}

/// Runs both jobs over `b` at `now`; how many instances failed.
async fn roll_failures(store: &Store, b: &Board, now: i64) -> u64 {
    let reports = run_jobs(store, std::slice::from_ref(b), now, 10).await;
    reports[0].instances_failed
}

async fn stream_len(store: &Store, key: &str) -> u64 {
    store.client().xlen(key).await.expect("xlen")
}

#[tokio::test]
async fn a_stream_of_another_type_fails_every_writing_call_before_it_writes() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for b in variants(SLICE, 4).into_iter().map(with_feed) {
        let _: () = store.client().flushall(false).await.expect("flush");
        let key = store.instance(&b.widest(), None).changes();
        let mut model = Instance::default();
        let first = [
            ev("a1", NOW - 1_500, "alice", 5),
            ev("b1", NOW - 10, "bob", 3),
        ];
        apply_model(&store, &b, &mut model, &first, NOW).await;
        // A resummarize board's ranking (and its feed) changes at its swap.
        if b.mode == Mode::Resummarize {
            assert_eq!(roll_failures(&store, &b, NOW).await, 0);
            model.roll(&b.widest(), NOW);
        }
        assert_eq!(stream_len(&store, &key).await, 2, "{}", b.name);

        set_string(&store, &key, "not a stream").await;
        let ranked = ranking(&store, &b).await;
        let before = snapshot(&store, &b).await;
        let second = [ev("c1", NOW - 5, "carol", 9)];
        if b.mode == Mode::Incremental {
            let failed = store.apply(&b, None, &second, NOW).await;
            assert!(failed.is_err(), "{}: {failed:?}", b.name);
            assert_eq!(
                snapshot(&store, &b).await,
                before,
                "{}: the apply wrote",
                b.name
            );
        } else {
            // A resummarize board's apply leaves the ranking, and so the feed, alone.
            apply_model(&store, &b, &mut model, &second, NOW).await;
        }
        let before = snapshot(&store, &b).await;

        // The roll past alice's slice: the expiry (or the swap) fails before its writes;
        // the watermark it raised first only makes the slice wait for the next roll.
        let later = NOW + 2 * SLICE;
        assert_eq!(roll_failures(&store, &b, later).await, 1, "{}", b.name);
        assert_eq!(
            ranking(&store, &b).await,
            ranked,
            "{}: the ranking changed",
            b.name
        );
        if b.mode == Mode::Incremental {
            let slice = store
                .instance(&b.widest(), None)
                .slice(b.slice_of(NOW - 1_500));
            assert_eq!(
                snapshot(&store, &b).await.get(&slice),
                before.get(&slice),
                "{}: the expiry claimed fields",
                b.name
            );
        }

        // The key gone, the same event counts once, and the next roll ends in the model.
        let _: () = store.client().del(&key).await.expect("del");
        if b.mode == Mode::Incremental {
            apply_model(&store, &b, &mut model, &second, later).await;
            assert_eq!(
                model.apply(&b.widest(), &second[0], later),
                Outcome::Duplicate
            );
        }
        roll_board(&store, &b, later).await;
        model.roll(&b.widest(), later);
        assert_matches(&store, &b.widest(), None, &model, later).await;
        assert!(stream_len(&store, &key).await > 0, "{}", b.name);
    }
}

/// The stored ranking: ZSet member and score, lowest first.
async fn ranking(store: &Store, b: &Board) -> Vec<(String, f64)> {
    let key = store.instance(&b.widest(), None).result();
    store
        .client()
        .zrange(key, 0, -1, None, false, None, true)
        .await
        .expect("zrange")
}
