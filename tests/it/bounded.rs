//! Bounded script calls (DESIGN.md sections 4 and 7): an expiry page split into calls of
//! any size, stopped between any two of them, and large stage/trim/swap runs still end
//! exactly in the model's state.

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::board::{Board, Mode};
use rollboard::roll::{self, Job, Report, RollError};
use rollboard::store::{ApplyEvent, Store, STAGE_CALL_ROWS, TRIM_CALL_IDS};
use tokio_util::sync::CancellationToken;

use crate::model::{assert_matches, Instance};
use crate::util::{board, ev, seen_logs, seen_table, RedisServer};

const HOUR: i64 = 3_600_000;
const T0: i64 = 1_763_700_000_000 / HOUR * HOUR;

async fn roll_all(store: &Store, b: &Board, now: i64, chunk: usize) -> Report {
    let reports = roll::run_once(
        store,
        std::slice::from_ref(b),
        Job::All,
        None,
        now,
        chunk,
        &CancellationToken::new(),
    )
    .await
    .expect("roll");
    assert_eq!(
        reports[0].instances_failed, 0,
        "{:?}",
        reports[0].first_error
    );
    reports[0].clone()
}

async fn assert_verified(store: &Store, b: &Board) {
    let v = roll::verify(store, b, None, 100).await.expect("verify");
    assert!(v.differences.is_empty(), "{}: {:?}", b.name, v.differences);
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
            let amount = if amount <= 0 && !case.negative {
                1 - amount
            } else {
                amount
            };
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
        model.apply(&b, e, now);
    }
    store.apply(&b, None, &events, now).await.unwrap();

    // A roll that raised the watermark, then expired the first slice in calls of random
    // sizes and died after `stop` of them.
    let later = s0 + 2 * HOUR;
    let (w, dead) = store
        .raise_watermark(&b, None, b.slice_of(s0), later)
        .await
        .unwrap();
    assert_eq!(w, b.slice_of(s0));
    let key = store.instance(&b, None).slice(b.slice_of(s0));
    let names = fields(store, &key).await;
    let mut at = 0;
    for &size in case.sizes.iter().take(case.stop) {
        if at >= names.len() {
            break;
        }
        let part = &names[at..(at + size).min(names.len())];
        store
            .expire_chunk(&b, None, b.slice_of(s0), part)
            .await
            .unwrap();
        at += part.len();
        // Between two calls the instance is consistent: what is left of the dead slice
        // still counts, the rest is gone, member by member.
        assert_verified(store, &b).await;
    }
    // A second roller, cancelled before any of its calls, changes nothing.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let mut report = Report::default();
    for n in &dead {
        let outcome = roll::expire_fields(
            store,
            &b,
            None,
            *n,
            &names,
            case.cancelled_per_call,
            &cancel,
            &mut report,
        )
        .await;
        assert!(matches!(outcome, Err(RollError::Cancelled)), "{outcome:?}");
    }
    assert_eq!(report.fields_expired, 0);
    assert_verified(store, &b).await;

    // The next roll finishes the slice: exactly the model.
    roll_all(store, &b, later, 1 + case.sizes[0] * 7).await;
    model.roll(&b, later);
    assert_matches(store, &b, None, &model, later).await;
    assert_verified(store, &b).await;
}

#[test]
fn expiry_split_at_random_points_with_crashes_between_calls_equals_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::start();
    let store = rt.block_on(redis.store("rb"));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases(), |case| {
            rt.block_on(async {
                let _: () = store.client().flushall(false).await.unwrap();
                run_case(&store, &case).await;
            });
            Ok(())
        })
        .expect("model equivalence");
}

#[tokio::test]
async fn large_instances_are_staged_trimmed_and_swapped_in_bounded_calls() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
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
            model.apply(&b, e, s0);
        }
        store.apply(&b, None, &events, s0).await.unwrap();
        // A default-sized chunk: the stage calls are split below it.
        roll_all(&store, &b, s0, 1000).await;
        assert_matches(&store, &b, None, &model, s0).await;
        // Resummarize again over the ranking just swapped in: the old one is renamed away
        // and unlinked, nothing of the run is left behind.
        roll_all(&store, &b, s0 + 1, 1000).await;
        assert_matches(&store, &b, None, &model, s0 + 1).await;
        let pattern = format!("rb:{{{}}}:tmp:*", b.name);
        assert_eq!(redis.cli(&["KEYS", &pattern]).trim(), "", "{b}");

        // Past the window: every member expires and every idempotency key is forgotten,
        // in more than one trim call.
        let gone = s0 + 3 * HOUR;
        let report = roll_all(&store, &b, gone, 1000).await;
        assert_eq!(report.ids_forgotten, members as u64, "{b}");
        model.roll(&b, gone);
        assert_matches(&store, &b, None, &model, gone).await;
        assert_verified(&store, &b).await;
        assert_eq!(seen_table(&store, &b, None).await, vec![], "{b}");
        assert_eq!(
            seen_logs(&store, &b, None).await,
            Vec::<String>::new(),
            "{b}"
        );
    }
}
