//! Bounded script calls (docs/design.md, *Writes* and *Bounded calls*): an expiry page split into calls of
//! any size, stopped between any two of them, a resummarize run cut short between any two
//! of its stage calls, and large stage/trim/swap runs still end exactly in the model's
//! state.

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak};
use rollboard::roll::{self, Report, RollError};
use rollboard::store::{ApplyEvent, StageTargets, Staged, Store, STAGE_CALL_ROWS, TRIM_CALL_IDS};
use tokio_util::sync::CancellationToken;

use crate::support::asserts::assert_verified;
use crate::support::boards::{
    apply_events, board, ev, resummarize, roll_all, seen_logs, seen_table, HOUR,
};
use crate::support::keys::{instance, under};
use crate::support::model::{assert_matches, assert_rolled_and_verified, Instance};
use crate::support::proptests::{proptest_runner, run_cases, runtime_with_store};
use crate::support::redis::RedisServer;

const T0: i64 = 1_763_700_000_000 / HOUR * HOUR;

/// Rolls `b` alone; its report.
async fn roll_one(store: &Store, b: &Board, now: i64, chunk: usize) -> Report {
    roll_all(store, std::slice::from_ref(b), now, chunk)
        .await
        .remove(0)
}

/// Every field name of `key`, listed with HSCAN.
async fn fields(store: &Store, key: &str) -> Vec<String> {
    let (mut cursor, mut out) = ("0".to_string(), Vec::new());
    loop {
        let (next, page) = store.scan("HSCAN", key, &cursor, 1000).await.unwrap();
        out.extend(page.into_iter().map(|(f, _)| f));
        if next == "0" {
            return out;
        }
        cursor = next;
    }
}

/// One case: events over two slices, then a roll that expires the first slice in calls
/// of the given sizes and stops (a crash) after `stop` of them, possibly also stopped by
/// cancellation part-way through a split page, then a complete roll.
#[derive(Debug, Clone)]
struct Case {
    negative: bool,
    events: Vec<(usize, i64, bool)>,
    sizes: Vec<usize>,
    stop: usize,
    cancelled_per_call: usize,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        prop::collection::vec((0usize..40, -3i64..9, any::<bool>()), 1..120),
        prop::collection::vec(1usize..12, 1..30),
        0usize..30,
        1usize..8,
    )
        .prop_map(|(negative, events, sizes, stop, cancelled_per_call)| Case {
            negative,
            events,
            sizes,
            stop,
            cancelled_per_call,
        })
}

/// `amount` as a board takes it: as drawn when it takes refunds, else made positive.
fn allowed(amount: i64, negative: bool) -> i64 {
    if amount <= 0 && !negative {
        1 - amount
    } else {
        amount
    }
}

async fn run_case(store: &Store, case: &Case) {
    let mut b = board("split", HOUR, 2);
    b.allow_negative = case.negative;
    let s0 = b.slice_of(T0) * HOUR;
    let now = s0 + HOUR;
    let events: Vec<ApplyEvent> = case
        .events
        .iter()
        .enumerate()
        .map(|(i, &(m, amount, second))| {
            let amount = allowed(amount, case.negative);
            let ts = if second {
                s0 + HOUR + i as i64
            } else {
                s0 + i as i64
            };
            ev(&format!("e{i}"), ts, &format!("m{m:02}"), amount)
        })
        .collect();
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b.widest(), e, now);
    }
    apply_events(store, &b, &events, now).await;

    // A roll that raised the watermark, then expired the first slice in calls of random
    // sizes and died after `stop` of them.
    let later = s0 + 2 * HOUR;
    let (w, dead) = store
        .raise_watermark(&b.widest(), None, b.slice_of(s0), later)
        .await
        .unwrap();
    assert_eq!(w, b.slice_of(s0));
    let key = store.instance(&b.widest(), None).slice(b.slice_of(s0));
    let names = fields(store, &key).await;
    let mut at = 0;
    for &size in case.sizes.iter().take(case.stop) {
        if at >= names.len() {
            break;
        }
        let part = &names[at..(at + size).min(names.len())];
        store
            .expire_chunk(&b.widest(), None, b.slice_of(s0), part)
            .await
            .unwrap();
        at += part.len();
        // Between two calls the instance is consistent: what is left of the dead slice
        // still counts, the rest is gone, member by member.
        assert_verified(store, &b.widest(), None).await;
    }
    // A second roller, cancelled before any of its calls, changes nothing.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let mut report = Report::default();
    for n in &dead {
        let outcome = roll::InstanceRoll {
            store,
            view: &b.widest(),
            scope: None,
            now,
            chunk: case.cancelled_per_call,
            cancel: &cancel,
        }
        .expire_fields(*n, &names, case.cancelled_per_call, &mut report)
        .await;
        assert!(matches!(outcome, Err(RollError::Cancelled)), "{outcome:?}");
    }
    assert_eq!(report.fields_expired, 0);
    assert_verified(store, &b.widest(), None).await;

    // The next roll finishes the slice: exactly the model.
    roll_one(store, &b, later, 1 + case.sizes[0] * 7).await;
    model.roll(&b.widest(), later);
    assert_matches(store, &b.widest(), None, &model, later).await;
    assert_verified(store, &b.widest(), None).await;
}

#[test]
fn expiry_split_at_random_points_with_crashes_between_calls_equals_the_model() {
    run_cases(48, &cases(), async |store, case| {
        run_case(store, &case).await;
    });
}

/// One case of a resummarize run cut short: events over two live slices and a complete
/// run, then a run that stages its rows in calls of the given sizes and dies after `stop`
/// of them, with one new event applied after each of its calls, then a complete run
/// staging `chunk` rows per call, then a roll past the older slice.
#[derive(Debug, Clone)]
struct SwapCase {
    negative: bool,
    tie: TieBreak,
    before: Vec<(usize, i64, bool)>,
    during: Vec<(usize, i64, bool)>,
    sizes: Vec<usize>,
    stop: usize,
    chunk: usize,
}

fn swap_cases() -> impl Strategy<Value = SwapCase> {
    let event = (0usize..40, -3i64..9, any::<bool>());
    (
        (
            any::<bool>(),
            prop_oneof![
                Just(TieBreak::Earliest),
                Just(TieBreak::Latest),
                Just(TieBreak::None)
            ],
        ),
        prop::collection::vec(event.clone(), 1..80),
        prop::collection::vec(event, 0..12),
        prop::collection::vec(1usize..12, 1..12),
        0usize..12,
        1usize..40,
    )
        .prop_map(
            |((negative, tie), before, during, sizes, stop, chunk)| SwapCase {
                negative,
                tie,
                before,
                during,
                sizes,
                stop,
                chunk,
            },
        )
}

/// The events of one step of a [`SwapCase`], ids `{tag}{i}`.
fn swap_events(case: &SwapCase, raw: &[(usize, i64, bool)], tag: &str, s0: i64) -> Vec<ApplyEvent> {
    raw.iter()
        .enumerate()
        .map(|(i, &(m, amount, second))| {
            let amount = allowed(amount, case.negative);
            let ts = s0 + i as i64 + if second { HOUR } else { 0 };
            ev(&format!("{tag}{i}"), ts, &format!("m{m:02}"), amount)
        })
        .collect()
}

async fn run_swap_case(redis: &RedisServer, store: &Store, case: &SwapCase) {
    let mut b = resummarize("cut", HOUR, 2);
    b.allow_negative = case.negative;
    b.tie_break = case.tie;
    let s0 = b.slice_of(T0) * HOUR;
    let now = s0 + HOUR;
    let mut model = Instance::default();
    let before = swap_events(case, &case.before, "b", s0);
    for e in &before {
        model.apply(&b.widest(), e, now);
    }
    apply_events(store, &b, &before, now).await;
    roll_one(store, &b, now, case.chunk).await;
    assert_matches(store, &b.widest(), None, &model, now).await;
    let shown = model.clone();

    // The cut run stages what a run summing now would (each member's exact total over the
    // live slices), as resummarize does, and dies after `stop` calls. Ingest goes on.
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let mut rows: Vec<Staged> = model
        .totals()
        .into_iter()
        .map(|(member, (total, _))| Staged {
            slices: before
                .iter()
                .filter(|e| e.member == member)
                .map(|e| b.slice_of(e.ts))
                .collect::<std::collections::HashSet<_>>()
                .len() as i64,
            member,
            total,
            fallback_ts: None,
        })
        .collect();
    rows.sort_by(|x, y| x.member.cmp(&y.member));
    store
        .stage(&b.widest(), None, "cut", targets, &[])
        .await
        .unwrap();
    let during = swap_events(case, &case.during, "d", s0);
    let mut next = during.iter();
    let mut at = 0;
    for &size in case.sizes.iter().take(case.stop) {
        let part = &rows[at.min(rows.len())..(at + size).min(rows.len())];
        at += part.len();
        store
            .stage(&b.widest(), None, "cut", targets, part)
            .await
            .unwrap();
        if let Some(e) = next.next() {
            let expected = model.apply(&b.widest(), e, now);
            let got = apply_events(store, &b, std::slice::from_ref(e), now).await;
            assert_eq!(got, vec![expected], "{e:?}");
        }
        // Readers see the last complete run's ranking, untouched by the cut one.
        assert_matches(store, &b.widest(), None, &shown, now).await;
    }
    // The cut run's scratch keys go by themselves.
    let scratch = redis.cli(&["KEYS", &under(&instance("cut", None), "tmp:cut:*")]);
    let scratch: Vec<&str> = scratch.lines().filter(|l| !l.is_empty()).collect();
    assert!(!scratch.is_empty(), "the cut run's marker at least");
    for key in &scratch {
        let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no time to live: {ttl}");
    }
    // Events applied after the cut run are not shown until a complete run.
    for e in next {
        let expected = model.apply(&b.widest(), e, now);
        let got = apply_events(store, &b, std::slice::from_ref(e), now).await;
        assert_eq!(got, vec![expected], "{e:?}");
    }
    assert_matches(store, &b.widest(), None, &shown, now).await;

    // The next complete run shows exactly every event; it leaves none of its own keys.
    roll_one(store, &b, now, case.chunk).await;
    assert_matches(store, &b.widest(), None, &model, now).await;
    assert_verified(store, &b.widest(), None).await;
    let left = redis.cli(&["KEYS", &under(&instance("cut", None), "tmp:*")]);
    let mut left: Vec<&str> = left.lines().filter(|l| !l.is_empty()).collect();
    left.sort_unstable();
    let mut cut = scratch.clone();
    cut.sort_unstable();
    assert_eq!(left, cut, "only the cut run's scratch keys are left");

    // Past the older slice: the roll and the next run agree with the model.
    let later = s0 + 2 * HOUR;
    roll_one(store, &b, later, case.chunk).await;
    model.roll(&b.widest(), later);
    assert_matches(store, &b.widest(), None, &model, later).await;
    assert_verified(store, &b.widest(), None).await;
}

#[test]
fn resummarize_cut_at_random_points_with_ingest_between_calls_equals_the_model() {
    let (rt, redis, store) = runtime_with_store();
    let mut runner = proptest_runner(48);
    runner
        .run(&swap_cases(), |case| {
            rt.block_on(async {
                let _: () = store.client().flushall(false).await.unwrap();
                run_swap_case(&redis, &store, &case).await;
            });
            Ok(())
        })
        .expect("model equivalence");
}

#[tokio::test]
async fn large_instances_are_staged_trimmed_and_swapped_in_bounded_calls() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let members = 2 * STAGE_CALL_ROWS + TRIM_CALL_IDS + 7;
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = board(&format!("big_{}", mode.as_str()), HOUR, 2);
        b.mode = mode;
        let s0 = b.slice_of(T0) * HOUR;
        let events: Vec<ApplyEvent> = (0..members)
            .map(|i| {
                ev(
                    &format!("e{i}"),
                    s0 + i as i64,
                    &format!("m{i}"),
                    1 + i as i64 % 5,
                )
            })
            .collect();
        let mut model = Instance::default();
        for e in &events {
            model.apply(&b.widest(), e, s0);
        }
        apply_events(&store, &b, &events, s0).await;
        // A default-sized chunk: the stage calls are split below it.
        roll_one(&store, &b, s0, 1000).await;
        assert_matches(&store, &b.widest(), None, &model, s0).await;
        // Resummarize again over the ranking just swapped in: the old one is renamed away
        // and unlinked, nothing of the run is left behind.
        roll_one(&store, &b, s0 + 1, 1000).await;
        assert_matches(&store, &b.widest(), None, &model, s0 + 1).await;
        let pattern = under(&instance(&b.name, None), "tmp:*");
        assert_eq!(redis.cli(&["KEYS", &pattern]).trim(), "", "{b}");

        // Past the window: every member expires and every idempotency key is forgotten,
        // in more than one trim call.
        let gone = s0 + 3 * HOUR;
        let report = roll_one(&store, &b, gone, 1000).await;
        assert_eq!(report.ids_forgotten, members as u64, "{b}");
        assert_rolled_and_verified(&store, &b, &mut model, gone).await;
        assert_eq!(seen_table(&store, &b.widest(), None).await, vec![], "{b}");
        assert_eq!(
            seen_logs(&store, &b.widest(), None).await,
            Vec::<String>::new(),
            "{b}"
        );
    }
}
