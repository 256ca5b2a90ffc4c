//! The resummarize job's "leave an unchanged instance as it is" rule (`gen`,
//! `summed_gen`, `summed_through`, `summed_ms` in `meta`) and the swap's refusal of a sum
//! read at an older `gen` above the same watermark.

use rollboard::domain::board::TieBreak;
use rollboard::roll;
use rollboard::store::{ApplyEvent, SwapCheck};

use crate::support::asserts::assert_no_scratch;
use crate::support::boards::{
    apply_events, apply_model, apply_scoped_model, count_at, ev, rank_at, resummarize,
    resummarize_at_t0, roll_and_match, roll_board, row, scoped, total_at, DAY, HOUR, RANKING, T0,
};
use crate::support::keys::{instance, schema};
use crate::support::model::{assert_matches, Instance};
use crate::support::redis::RedisServer;

/// `rollboard rebuild` restores a member whose `members` entry (its tie-break time) was
/// lost: stage.lua writes the fallback time into `members` and moves `gen`, and rebuild's
/// swap records the `gen` it summed at. A resummarize run of a replica that staged before
/// the repair (so it skipped the member: `members` did not know it) and swaps after the
/// rebuild summed at an older `gen`, so its swap is refused and the member stays ranked;
/// the next run sums again (rebuild records no run time) and shows the member (were the
/// run's swap let through, the repair's bump would still keep its record from being taken
/// for current, and the runs that follow from skipping the instance for up to an hour).
#[tokio::test]
async fn a_member_repaired_by_rebuild_is_not_lost_to_a_racing_run_for_an_hour() {
    // Day-wide slices: the watermark stays put for the whole test, as it does within a slice.
    let (redis, store, b, d0) = resummarize_at_t0("res", DAY, 7).await;
    apply_events(
        &store,
        &b,
        &[ev("1", d0, "a", 5), ev("2", d0 + 1, "x", 7)],
        d0,
    )
    .await;
    assert_eq!(roll_board(&store, &b, d0).await.resummed, 1);
    assert_eq!(total_at(&store, &b.widest(), "x", d0).await, Some(7));

    // x's tie-break time is lost (the case `rebuild` repairs), and another event arrives.
    redis.cli(&["HDEL", &instance("res", None).members(), "x"]);
    apply_events(&store, &b, &[ev("3", d0 + 2, "y", 3)], d0 + 2).await;

    // Replica A's run starts: gen moved, so it sums (a 5, x 7, y 3) and stages; x is
    // skipped, `members` does not know it.
    let before = store.summed(&b.widest(), None).await.unwrap();
    let watermark = before.summed_through.expect("summed once");
    assert_ne!(before.summed_gen.as_deref(), Some(before.gen.as_str()));
    let (skipped, _) = store
        .stage(
            &b.widest(),
            None,
            "replica-a",
            RANKING,
            &[row("a", 5), row("x", 7), row("y", 3)],
        )
        .await
        .unwrap();
    assert_eq!(
        skipped, 1,
        "x is skipped by the run that staged before the repair"
    );

    // The operator's rebuild runs meanwhile: x is restored and ranked.
    let rebuilt = roll::rebuild(&store, &b.widest(), None, 100).await.unwrap();
    assert_eq!(rebuilt.estimated, ["x"]);
    assert_eq!(total_at(&store, &b.widest(), "x", d0 + 3).await, Some(7));

    // Replica A swaps last: refused, its sum was read before the rebuild's.
    let check = SwapCheck {
        watermark: Some(watermark),
        summed_at: Some((before.gen.as_str(), d0 + 3)),
        ..SwapCheck::default()
    };
    assert!(!store
        .swap(&b.widest(), None, "replica-a", RANKING, check)
        .await
        .unwrap());
    store.discard(&b.widest(), None, "replica-a").await.unwrap();
    assert_eq!(total_at(&store, &b.widest(), "x", d0 + 3).await, Some(7));

    // The next run sums again (the rebuild recorded no run time) and keeps x ranked.
    assert_eq!(roll_board(&store, &b, d0 + 4).await.resummed, 1);
    let v = roll::verify(&store, &b.widest(), None, 100).await.unwrap();
    assert!(
        v.differences.is_empty(),
        "one run after the rebuild, the ranking still lacks {:?}",
        v.differences
    );
    assert_eq!(total_at(&store, &b.widest(), "x", d0 + 4).await, Some(7));
}

/// The same gap without a race: a rebuild that stops between its stage calls (which
/// already wrote the restored `members` entry) and its swap (a lost connection, a killed
/// CLI). The repair moves `gen`, so the next run sums again and ranks the member (without
/// the bump the sum record would stay current and the runs that follow would keep a
/// ranking without the member for up to an hour).
#[tokio::test]
async fn a_member_restored_by_an_interrupted_rebuild_is_ranked_at_the_next_run() {
    let (redis, store, b, d0) = resummarize_at_t0("res", DAY, 7).await;
    apply_events(&store, &b, &[ev("1", d0, "x", 7)], d0).await;
    roll_board(&store, &b, d0).await;
    // x's tie-break time is lost; an event of another member makes the next run sum,
    // without x (`members` does not know it).
    redis.cli(&["HDEL", &instance("res", None).members(), "x"]);
    apply_events(&store, &b, &[ev("2", d0 + 1, "a", 5)], d0 + 1).await;
    assert_eq!(roll_board(&store, &b, d0 + 2).await.resummed, 1);
    assert_eq!(total_at(&store, &b.widest(), "x", d0 + 2).await, None);

    // A rebuild stages its rows (x's fallback time is written into `members`) and stops
    // before its swap; its scratch keys are discarded, as `replace` does on an error.
    let mut x = row("x", 7);
    x.fallback_ts = Some(d0 + DAY - 1);
    let (_, repaired) = store
        .stage(&b.widest(), None, "rebuild", RANKING, &[row("a", 5), x])
        .await
        .unwrap();
    assert_eq!(repaired, ["x"]);
    store.discard(&b.widest(), None, "rebuild").await.unwrap();

    // The next run: a sum of the live slices now ranks x.
    roll_board(&store, &b, d0 + 3).await;
    let r = store.rank(&b.widest(), None, "x", d0 + 3).await.unwrap();
    assert_eq!(
        (r.total, r.last_ts),
        (Some(7), Some(d0 + DAY - 1)),
        "one run after the repair"
    );
}

/// A scoped instance that emptied, was cleaned up and left the registry, then got events
/// again before the watermark moved: the instance keeps its `meta` (and its sum record) and
/// the re-entry is summed at the same watermark.
#[tokio::test]
async fn a_scope_cleaned_up_and_back_at_the_same_watermark_is_summed() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = scoped(resummarize("fans", HOUR, 3));
    let s0 = T0 / HOUR * HOUR;
    let mut model = Instance::default();
    apply_scoped_model(
        &store,
        &b,
        Some("r"),
        &mut model,
        &[ev("1", s0, "a", 5)],
        s0,
    )
    .await;
    roll_and_match(&store, &b, Some("r"), &mut model, s0).await;

    // The slice dies: expired, summed (empty), cleaned up, unregistered.
    let dead = s0 + 3 * HOUR;
    let report = roll_board(&store, &b, dead).await;
    model.roll(&b.widest(), dead);
    assert_eq!((report.resummed, report.scopes_removed), (1, 1));
    assert!(store.scopes(&b).await.unwrap().is_empty());
    let record = store.summed(&b.widest(), Some("r")).await.unwrap();
    assert_eq!(record.summed_gen.as_deref(), Some(record.gen.as_str()));

    // Back within the same slice (same watermark): summed again, equal to the model.
    apply_scoped_model(
        &store,
        &b,
        Some("r"),
        &mut model,
        &[ev("2", dead + 1, "b", 2), ev("3", dead + 2, "a", 4)],
        dead + 2,
    )
    .await;
    let report = roll_board(&store, &b, dead + 3).await;
    model.roll(&b.widest(), dead + 3);
    assert_eq!(report.resummed, 1);
    assert_eq!(report.scopes_removed, 0);
    assert_eq!(
        store
            .summed(&b.widest(), Some("r"))
            .await
            .unwrap()
            .summed_through,
        record.summed_through
    );
    assert_matches(&store, &b.widest(), Some("r"), &model, dead + 3).await;
    assert_eq!(roll_board(&store, &b, dead + 4).await.resummed, 0);
    assert_matches(&store, &b.widest(), Some("r"), &model, dead + 4).await;
}

/// A refund that brings a member back to the same total changes only its tie-break time:
/// still a change (`gen` moves), so the next run shows the new time and order.
#[tokio::test]
async fn a_tie_break_time_that_moves_without_a_total_change_is_shown_at_the_next_run() {
    let (_redis, store, mut b, s0) = resummarize_at_t0("neg", HOUR, 3).await;
    b.allow_negative = true;
    b.tie_break = TieBreak::Latest;
    // a and b tie at 5, b the later.
    let tied = [ev("1", s0, "a", 5), ev("2", s0 + 10, "b", 5)];
    let mut model = Instance::default();
    apply_model(&store, &b, &mut model, &tied, s0 + 10).await;
    roll_and_match(&store, &b, None, &mut model, s0 + 10).await;
    assert_eq!(rank_at(&store, &b.widest(), "b", s0 + 10).await, Some(1));

    // a: +3 then -3, later than b's event; the total stays 5, the latest time moves.
    apply_model(
        &store,
        &b,
        &mut model,
        &[ev("3", s0 + 20, "a", 3), ev("4", s0 + 21, "a", -3)],
        s0 + 21,
    )
    .await;
    assert_eq!(
        roll_and_match(&store, &b, None, &mut model, s0 + 22).await,
        1
    );
    let a = store.rank(&b.widest(), None, "a", s0 + 22).await.unwrap();
    assert_eq!(
        (a.rank, a.total, a.last_ts),
        (Some(1), Some(5), Some(s0 + 21))
    );
    assert_eq!(roll_board(&store, &b, s0 + 23).await.resummed, 0);
}

/// A batch larger than one script call (several chained calls, each moving `gen`) is summed
/// whole at the next run; the same batch delivered again (duplicates only) moves no `gen`
/// and the run after it leaves the ranking as it is, equal to the model.
#[tokio::test]
async fn a_batch_of_many_calls_is_summed_whole_and_its_redelivery_changes_nothing() {
    let (_redis, store, b, s0) = resummarize_at_t0("big", HOUR, 3).await;
    let mut model = Instance::default();
    // 400 events of 150 members over two slices (the second one late for none).
    let events: Vec<ApplyEvent> = (0..400)
        .map(|i| {
            ev(
                &format!("e{i}"),
                s0 - HOUR + i * 9_000,
                &format!("m{}", i % 150),
                1 + i % 7,
            )
        })
        .collect();
    apply_model(&store, &b, &mut model, &events, s0 + 1).await;
    let gen = store.summed(&b.widest(), None).await.unwrap().gen;
    assert!(gen.parse::<u64>().unwrap() > 1, "several calls: gen {gen}");
    assert_eq!(
        roll_and_match(&store, &b, None, &mut model, s0 + 2).await,
        1
    );

    apply_model(&store, &b, &mut model, &events, s0 + 3).await;
    assert_eq!(store.summed(&b.widest(), None).await.unwrap().gen, gen);
    assert_eq!(roll_board(&store, &b, s0 + 4).await.resummed, 0);
    assert_matches(&store, &b.widest(), None, &model, s0 + 4).await;
}

/// A sum record that is not what this version writes (a `summed_gen` that is no number, or
/// a `summed_ms` that is none): the run sums, is not refused, and writes a record that the
/// next run trusts.
#[tokio::test]
async fn a_sum_record_that_is_not_a_number_is_summed_over() {
    let (redis, store, b, d0) = resummarize_at_t0("odd", DAY, 7).await;
    let mut model = Instance::default();
    apply_model(&store, &b, &mut model, &[ev("1", d0, "a", 5)], d0).await;
    roll_board(&store, &b, d0).await;
    let slice = instance("odd", None).slice(b.slice_of(d0));
    for (field, value) in [
        ("summed_gen", "abc"),
        ("summed_ms", "soon"),
        ("summed_gen", ""),
    ] {
        // A write no `gen` counts, to see whether the run sums.
        let amount = format!("{}", 6 + value.len());
        redis.cli(&["HSET", &slice, "a", &amount]);
        redis.cli(&["HSET", &instance("odd", None).meta(), field, value]);
        assert_eq!(
            roll_board(&store, &b, d0 + 1).await.resummed,
            1,
            "{field} = {value:?}"
        );
        assert_eq!(
            total_at(&store, &b.widest(), "a", d0 + 1).await,
            Some(6 + value.len() as i64),
            "{field} = {value:?}: swapped"
        );
        let record = store.summed(&b.widest(), None).await.unwrap();
        assert_eq!(record.summed_gen.as_deref(), Some(record.gen.as_str()));
        assert_eq!(record.summed_ms, Some(d0 + 1));
        assert_eq!(roll_board(&store, &b, d0 + 2).await.resummed, 0);
    }
    assert_no_scratch(&redis, "odd");
}

/// docs/operations.md "A watermark that is wrong": a forced roll far ahead records its sum above the
/// far watermark; the operator's script lowers the watermark and drops the record. The
/// first run at the clock sums again (not refused), the events sent after it count, and
/// the runs after it skip with a ranking equal to the model.
#[tokio::test]
async fn a_watermark_lowered_by_the_readme_procedure_is_summed_and_then_kept() {
    let (redis, store, b, s0) = resummarize_at_t0("fans_7d", HOUR, 3).await;
    apply_events(&store, &b, &[ev("1", s0, "a", 5)], s0).await;
    roll_board(&store, &b, s0).await;
    let ahead = s0 + 10 * HOUR;
    roll_board(&store, &b, ahead).await;
    let far = store.summed(&b.widest(), None).await.unwrap();
    assert_eq!(far.summed_through, Some(b.slice_of(ahead) - 3));
    assert_eq!(count_at(&store, &b.widest(), None, s0).await, 0);

    // docs/operations.md's script, at W = the clock's watermark.
    let w = (b.slice_of(s0 + 1) - 3).to_string();
    let lower = "local w = tonumber(redis.call('HGET', KEYS[1], 'expired_through'))
      if w and w > tonumber(ARGV[1]) then
        redis.call('HSET', KEYS[1], 'expired_through', ARGV[1])
        redis.call('HDEL', KEYS[1], 'summed_through', 'summed_gen', 'summed_ms', 'last_roll')
      end";
    for key in [schema().window("fans_7d"), instance("fans_7d", None).meta()] {
        redis.cli(&["EVAL", lower, "1", &key, &w]);
    }

    // The events sent again (their ids were forgotten) and a new one count once more.
    let mut model = Instance::default();
    apply_model(
        &store,
        &b,
        &mut model,
        &[ev("1", s0, "a", 5), ev("2", s0 + 1, "b", 6)],
        s0 + 1,
    )
    .await;
    assert_eq!(
        roll_and_match(&store, &b, None, &mut model, s0 + 2).await,
        1
    );
    let record = store.summed(&b.widest(), None).await.unwrap();
    assert_eq!(record.summed_through, Some(b.slice_of(s0) - 3));
    assert_eq!(roll_board(&store, &b, s0 + 3).await.resummed, 0);
    assert_matches(&store, &b.widest(), None, &model, s0 + 3).await;
}

/// Two replicas running the job on the same instance at once, many times, with events
/// applied between and during the runs: every swap either lands or is refused, no scratch
/// key stays, and once the events stop, at most one run later the ranking equals the model
/// and the runs after it skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_with_ingest_end_equal_to_the_model() {
    let redis = RedisServer::start();
    let one = redis.store("rb").await;
    let two = redis.store("rb").await;
    let b = resummarize("race", DAY, 7);
    let d0 = T0 / DAY * DAY;
    let mut model = Instance::default();
    for round in 0..40i64 {
        let now = d0 + round * 10;
        let events: Vec<ApplyEvent> = (0..5)
            .map(|i| {
                ev(
                    &format!("{round}-{i}"),
                    now + i,
                    &format!("m{}", (round * 5 + i) % 13),
                    1 + (round + i) % 4,
                )
            })
            .collect();
        let expected = model.apply_all(&b.widest(), &events, now + 5);
        let (x, y, applied) = tokio::join!(
            roll_board(&one, &b, now + 5),
            roll_board(&two, &b, now + 5),
            one.apply(&b, None, &events, now + 5),
        );
        assert_eq!(applied.unwrap(), expected);
        assert!(x.resummed <= 1 && y.resummed <= 1);
    }
    let end = d0 + 1_000;
    tokio::join!(roll_board(&one, &b, end), roll_board(&two, &b, end));
    model.roll(&b.widest(), end);
    // One more run: whichever of the racing swaps landed last, a record at an older gen
    // cannot claim the ranking is current.
    roll_board(&one, &b, end + 1).await;
    assert_matches(&one, &b.widest(), None, &model, end + 1).await;
    let record = one.summed(&b.widest(), None).await.unwrap();
    assert_eq!(record.summed_gen.as_deref(), Some(record.gen.as_str()));
    assert_eq!(roll_board(&two, &b, end + 2).await.resummed, 0);
    assert_matches(&two, &b.widest(), None, &model, end + 2).await;
    assert_no_scratch(&redis, "race");
}

/// Rolls at a time before the clock (`roll --at` in the past): the watermark does not go
/// back, so an unchanged instance is left as it is, and a changed one is summed above the
/// current watermark, exactly; the record's time is the roll's, so a run at the clock an
/// hour after it sums once more and changes nothing.
#[tokio::test]
async fn rolls_at_an_earlier_time_skip_or_sum_above_the_current_watermark() {
    use rollboard::store::RESUM_AT_LEAST_EVERY_MS as EVERY;
    let (_redis, store, b, s0) = resummarize_at_t0("past", HOUR, 3).await;
    let mut model = Instance::default();
    apply_model(&store, &b, &mut model, &[ev("1", s0, "a", 5)], s0).await;
    let clock = s0 + 3 * HOUR + 5;
    apply_model(&store, &b, &mut model, &[ev("2", clock, "b", 4)], clock).await;
    roll_and_match(&store, &b, None, &mut model, clock).await;
    let at_clock = store.summed(&b.widest(), None).await.unwrap();

    // A roll two hours back: nothing changed, left as it is.
    assert_eq!(roll_board(&store, &b, clock - 2 * HOUR).await.resummed, 0);
    assert_matches(&store, &b.widest(), None, &model, clock).await;

    // An event, then a roll two hours back: summed above the current watermark.
    apply_model(
        &store,
        &b,
        &mut model,
        &[ev("3", clock + 1, "a", 1)],
        clock + 1,
    )
    .await;
    assert_eq!(roll_board(&store, &b, clock - 2 * HOUR).await.resummed, 1);
    assert_matches(&store, &b.widest(), None, &model, clock + 1).await;
    let back = store.summed(&b.widest(), None).await.unwrap();
    assert_eq!(back.summed_through, at_clock.summed_through);
    assert_eq!(back.summed_ms, Some(clock - 2 * HOUR));

    // At the clock the record is two hours old: summed once more, same ranking, then left.
    assert_eq!(roll_board(&store, &b, clock + 2).await.resummed, 1);
    assert_eq!(roll_board(&store, &b, clock + 3).await.resummed, 0);
    assert!(clock + 3 - (clock - 2 * HOUR) > EVERY);
    assert_matches(&store, &b.widest(), None, &model, clock + 3).await;
}
