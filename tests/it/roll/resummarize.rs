//! The resummarize job: new events are tracked only at its runs, an unchanged instance keeps
//! its ranking without a sum (and is summed again after an hour), a swap that runs twice or
//! reads an older sum changes nothing, and a scoped refund board rolls to empty and back.

use fred::prelude::*;
use rollboard::roll;
use rollboard::store::ApplyEvent;

use crate::support::asserts::{assert_no_scratch, assert_verified, verify_differences};
use crate::support::boards::{
    apply_events, board, count_at, ev, resummarize, resummarize_at_t0, roll_all, roll_board,
    scoped, total_at, DAY, HOUR, T0,
};
use crate::support::keys::instance;
use crate::support::model::{assert_matches, Instance};
use crate::support::redis::RedisServer;

#[tokio::test]
async fn a_swap_that_runs_twice_changes_nothing_the_second_time() {
    use rollboard::store::{StageTargets, Staged, SwapCheck};
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = resummarize("res", HOUR, 3);
    apply_events(&store, &b, &[ev("1", T0, "a", 5)], T0).await;
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let rows = [Staged {
        member: "a".into(),
        total: 5,
        slices: 1,
        fallback_ts: None,
    }];
    let at = |watermark| SwapCheck {
        watermark: Some(watermark),
        ..SwapCheck::default()
    };
    store
        .stage(&b.widest(), None, "t1", targets, &rows)
        .await
        .unwrap();
    assert!(store
        .swap(&b.widest(), None, "t1", targets, at(5))
        .await
        .unwrap());
    assert!(
        !store
            .swap(&b.widest(), None, "t1", targets, at(5))
            .await
            .unwrap(),
        "resent swap refused"
    );
    assert_eq!(
        total_at(&store, &b.widest(), "a", T0).await,
        Some(5),
        "ranking intact"
    );
    // A sum above an older watermark never replaces a newer one.
    store
        .stage(&b.widest(), None, "t2", targets, &[])
        .await
        .unwrap();
    assert!(!store
        .swap(&b.widest(), None, "t2", targets, at(4))
        .await
        .unwrap());
    assert_eq!(total_at(&store, &b.widest(), "a", T0).await, Some(5));
}

#[tokio::test]
async fn resummarize_tracks_new_events_only_at_its_runs() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = resummarize("res", HOUR, 3);
    apply_events(&store, &b, &[ev("1", T0, "a", 5)], T0).await;
    assert_eq!(
        count_at(&store, &b.widest(), None, T0).await,
        0,
        "nothing until the job runs"
    );
    roll_board(&store, &b, T0).await;
    assert_eq!(total_at(&store, &b.widest(), "a", T0).await, Some(5));
    apply_events(&store, &b, &[ev("2", T0 + 1, "a", 5)], T0).await;
    let lag = roll::verify(&store, &b.widest(), None, 10).await.unwrap();
    assert_eq!((lag.differences.len(), lag.amount_behind), (1, 5));
    assert!(!lag.fails(false) && lag.fails(true));
    roll_board(&store, &b, T0 + 2).await;
    let r = store.rank(&b.widest(), None, "a", T0).await.unwrap();
    assert_eq!((r.total, r.last_ts), (Some(10), Some(T0 + 1)));
    // No scratch key is left behind.
    assert_no_scratch(&redis, "res");
}

/// Calls of one command since the server started (`INFO commandstats`).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

#[tokio::test]
async fn a_resummarize_instance_that_did_not_change_keeps_its_ranking_without_a_sum() {
    let (redis, store, b, s0) = resummarize_at_t0("res", HOUR, 3).await;
    let mut model = Instance::default();
    let apply = async |model: &mut Instance, events: &[ApplyEvent], now: i64| {
        let expected = model.apply_all(&b.widest(), events, now);
        assert_eq!(apply_events(&store, &b, events, now).await, expected);
    };
    let run = async |now: i64| {
        let before = calls(&redis, "hscan");
        let report = roll_board(&store, &b, now).await;
        (report.resummed, calls(&redis, "hscan") - before)
    };

    apply(
        &mut model,
        &[ev("1", s0, "a", 5), ev("2", s0 + 1, "b", 7)],
        s0,
    )
    .await;
    assert_eq!(run(s0).await, (1, 1), "summed: one live slice listed");
    assert_matches(&store, &b.widest(), None, &model, s0).await;
    assert_eq!(run(s0 + 1).await, (0, 0), "nothing changed: not summed");
    assert_matches(&store, &b.widest(), None, &model, s0 + 1).await;

    // A duplicate changes nothing either.
    apply(&mut model, &[ev("1", s0, "a", 5)], s0 + 2).await;
    assert_eq!(run(s0 + 2).await, (0, 0), "a duplicate");

    // A new event, in a second slice: summed again, then left.
    apply(&mut model, &[ev("3", s0 + HOUR, "a", 4)], s0 + HOUR).await;
    assert_eq!(run(s0 + HOUR).await, (1, 2));
    assert_matches(&store, &b.widest(), None, &model, s0 + HOUR).await;
    assert_eq!(run(s0 + HOUR + 1).await, (0, 0));

    // The first slice dies: its expiry changes the instance, so the next sum runs.
    let later = s0 + 3 * HOUR;
    model.roll(&b.widest(), later);
    assert_eq!(
        run(later).await,
        (1, 2),
        "the dead slice listed to expire, the live one summed"
    );
    assert_matches(&store, &b.widest(), None, &model, later).await;
    assert_eq!(run(later + 1).await, (0, 0));
    assert_matches(&store, &b.widest(), None, &model, later + 1).await;

    // The watermark moves with no slice to expire: summed once more (a new window), then
    // left.
    let empty = s0 + 4 * HOUR;
    model.roll(&b.widest(), empty);
    assert_eq!(run(empty).await.0, 1);
    assert_eq!(run(empty + 1).await, (0, 0));
    assert_matches(&store, &b.widest(), None, &model, empty + 1).await;

    // The sums' record lost (an operator lowering a watermark drops it): summed again.
    redis.cli(&["HDEL", &instance("res", None).meta(), "summed_gen"]);
    assert_eq!(run(empty + 2).await.0, 1);
    assert_matches(&store, &b.widest(), None, &model, empty + 2).await;
    assert_verified(&store, &b.widest(), None).await;
}

#[tokio::test]
async fn an_unchanged_resummarize_ranking_is_summed_again_after_an_hour() {
    use rollboard::store::RESUM_AT_LEAST_EVERY_MS as EVERY;
    let (redis, store, b, d0) = resummarize_at_t0("daily", DAY, 7).await;
    apply_events(&store, &b, &[ev("1", d0, "a", 5)], d0).await;
    let resummed = async |now| roll_board(&store, &b, now).await.resummed;
    assert_eq!(resummed(d0).await, 1);
    assert_eq!(resummed(d0 + EVERY - 1).await, 0, "within the hour");
    // A write that no `gen` counts (by hand): shown once the hour is up.
    let slice = instance("daily", None).slice(b.slice_of(d0));
    redis.cli(&["HSET", &slice, "a", "8"]);
    assert_eq!(total_at(&store, &b.widest(), "a", d0).await, Some(5));
    assert_eq!(resummed(d0 + EVERY).await, 1, "an hour after the last sum");
    assert_eq!(total_at(&store, &b.widest(), "a", d0).await, Some(8));
    assert_eq!(resummed(d0 + EVERY + 1).await, 0);
}

#[tokio::test]
async fn a_sum_read_before_a_newer_one_of_the_same_window_is_not_swapped_over_it() {
    use rollboard::store::{StageTargets, Staged, SwapCheck};
    let (_redis, store, b, s0) = resummarize_at_t0("race", HOUR, 3).await;
    apply_events(&store, &b, &[ev("1", s0, "a", 5)], s0).await;
    roll_board(&store, &b, s0).await;
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let row = |total| Staged {
        member: "a".into(),
        total,
        slices: 1,
        fallback_ts: None,
    };
    // A slow run sums a = 5; meanwhile an event arrives and a faster run sums a = 9.
    let slow = store.summed(&b.widest(), None).await.unwrap();
    store
        .stage(&b.widest(), None, "slow", targets, &[row(5)])
        .await
        .unwrap();
    apply_events(&store, &b, &[ev("2", s0 + 1, "a", 4)], s0 + 1).await;
    roll_board(&store, &b, s0 + 1).await;
    let fast = store.summed(&b.widest(), None).await.unwrap();
    assert_ne!(fast.gen, slow.gen);
    assert_eq!(fast.summed_gen.as_deref(), Some(fast.gen.as_str()));
    let watermark = fast.summed_through.expect("summed_through");
    assert_eq!(slow.summed_through, Some(watermark), "the same window");
    // The slow run's swap comes last: refused, the newer ranking stays.
    let swap = async |run, gen| {
        let check = SwapCheck {
            watermark: Some(watermark),
            summed_at: Some((gen, s0 + 2)),
            ..SwapCheck::default()
        };
        store
            .swap(&b.widest(), None, run, targets, check)
            .await
            .unwrap()
    };
    let total_of_a = async || total_at(&store, &b.widest(), "a", s0 + 1).await;
    assert!(!swap("slow", slow.gen.as_str()).await);
    assert_eq!(total_of_a().await, Some(9));
    assert_eq!(store.summed(&b.widest(), None).await.unwrap(), fast);
    // A run that read the same `gen` may swap (its sum is as new).
    store
        .stage(&b.widest(), None, "twin", targets, &[row(9)])
        .await
        .unwrap();
    assert!(swap("twin", fast.gen.as_str()).await);
    assert_eq!(total_of_a().await, Some(9));
    let twin = store.summed(&b.widest(), None).await.unwrap();
    assert_eq!(
        (twin.summed_gen, twin.summed_through, twin.summed_ms),
        (fast.summed_gen, fast.summed_through, Some(s0 + 2))
    );
}

/// A scoped, resummarize, `allow_negative` board without tie-break (a shape none of the
/// fixtures has): a refund takes a member to exactly 0 and below while its slices expire one
/// by one, the ranking follows the live slices at every roll, the emptied scope leaves the
/// registry and Redis, a late copy of its last tip stays late, and a new tip brings the
/// scope back with the right total.
#[tokio::test]
async fn a_scoped_resummarize_refund_board_rolls_to_empty_and_comes_back() {
    use rollboard::domain::board::{Mode, TieBreak};
    use rollboard::store::Outcome;
    const SLICE: i64 = 1_000;
    let mut b = scoped(board("fansneg", SLICE, 3));
    b.mode = Mode::Resummarize;
    b.allow_negative = true;
    b.tie_break = TieBreak::None;
    let boards = vec![b.clone()];
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let s0: i64 = 1_000;
    let at = |slice: i64| slice * SLICE + 100;
    let ev = crate::support::boards::ev;
    let scope = Some("r1");
    let only_u2 = || (1, vec![("u2".to_string(), 3)]);
    // Rolls every instance at `now`, then the scope's count and ranking.
    let rolled_totals = |now: i64| {
        let (store, b, boards) = (&store, &b, &boards);
        async move {
            roll_all(store, boards, now, 100).await;
            let page = store
                .top(&b.widest(), scope, 0, 10, now)
                .await
                .expect("top");
            let ranked: Vec<(String, i64)> = page
                .entries
                .iter()
                .map(|e| (e.member.clone(), e.total))
                .collect();
            (page.envelope.count, ranked)
        }
    };

    let now = at(s0 + 1);
    let out = store
        .apply(
            &b,
            scope,
            &[
                ev("t1", at(s0), "u1", 10),
                ev("r1", at(s0 + 1), "u1", -10),
                ev("t2", at(s0 + 1), "u2", 3),
            ],
            now,
        )
        .await
        .expect("apply");
    assert_eq!(out, [Outcome::Applied; 3]);
    assert_eq!(rolled_totals(now).await, only_u2(), "u1 at exactly 0");

    // s0 leaves the window: u1 is at -10 with one live slice.
    let now = at(s0 + 3);
    assert_eq!(rolled_totals(now).await, only_u2());
    let out = store
        .apply(&b, scope, &[ev("t3", at(s0 + 2), "u1", 4)], now)
        .await
        .expect("apply");
    assert_eq!(out, [Outcome::Applied]);
    assert_eq!(rolled_totals(now).await, only_u2(), "u1 at -6");

    // s0 + 1 leaves: the refund and u2's tip go, u1 holds only its last tip.
    let now = at(s0 + 4);
    assert_eq!(rolled_totals(now).await, (1, vec![("u1".to_string(), 4)]));

    // s0 + 2 leaves: the scope is empty and cleaned up.
    let now = at(s0 + 5);
    assert_eq!(rolled_totals(now).await, (0, vec![]));
    assert!(store.scopes(&b).await.expect("scopes").is_empty());
    let k = store.instance(&b.widest(), scope);
    let left: i64 = store
        .client()
        .exists(vec![
            k.result(),
            k.members(),
            k.refs(),
            k.totals(),
            k.seen_table(),
            k.ranked(),
        ])
        .await
        .expect("exists");
    assert_eq!(left, 0, "only meta is kept");

    // A late copy stays late; a new tip brings the scope back.
    let out = store
        .apply(&b, scope, &[ev("t3", at(s0 + 2), "u1", 4)], now)
        .await
        .expect("apply");
    assert_eq!(out, [Outcome::Late]);
    let out = store
        .apply(&b, scope, &[ev("t4", at(s0 + 5), "u1", 2)], now)
        .await
        .expect("apply");
    assert_eq!(out, [Outcome::Applied]);
    assert_eq!(rolled_totals(now).await, (1, vec![("u1".to_string(), 2)]));
    assert_eq!(store.scopes(&b).await.expect("scopes"), ["r1"]);
    let d = verify_differences(&store, &b, None).await;
    assert!(d.is_empty(), "{:?}", d);
}
