//! A second property, wider than replays_the_model.rs in what it sends and stricter in when
//! it checks: batches of up to 60 events over 40 members (several fold calls per batch),
//! redeliveries mixed with new events (fold.lua answers `slow`, then judges each event on its own),
//! redeliveries alone, rolls, rolls that die after any number of expiry calls, and
//! rebuilds; every tie-break, `dense_rank`, refunds, resummarize boards, tops of 1 to 7.
//! After every step, with no exception for a torn roll, the stream replayed from its first
//! entry is the top the stored ranking holds (a query's answer); a step that judges every
//! event a duplicate writes nothing.

use proptest::prelude::*;
use rollboard::domain::board::{Board, Changes, Mode, TieBreak};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::asserts::ranked;
use crate::support::boards::{apply_events, board, raise_for_roll_at, roll_board, HOUR, T0};
use crate::support::env::env_count;
use crate::support::feed::{changes_after, replay, tip_events, Tip};
use crate::support::proptests::run_cases;

const SLICE: i64 = HOUR;

#[derive(Debug, Clone)]
enum Step {
    /// Events (member, amount, slices back from now).
    Tips(Vec<Tip>),
    /// The last batch again, alone.
    Redeliver,
    /// The last batch again with new events after it.
    RedeliverAnd(Vec<Tip>),
    /// Time moves this many slices and both jobs run.
    Roll(i64),
    /// Time moves this many slices and a roll dies after `k` expiry calls of one field.
    Crash(i64, usize),
    /// A rebuild (`verify --repair`'s swap).
    Rebuild,
}

#[derive(Debug, Clone)]
struct Case {
    variant: usize,
    top: u32,
    steps: Vec<Step>,
}

fn tips_strategy() -> impl Strategy<Value = Vec<(usize, i64, i64)>> {
    prop::collection::vec((0usize..40, -5i64..12, 0i64..3), 1..60)
}

fn cases() -> impl Strategy<Value = Case> {
    let step = prop_oneof![
        5 => tips_strategy().prop_map(Step::Tips),
        1 => Just(Step::Redeliver),
        2 => tips_strategy().prop_map(Step::RedeliverAnd),
        2 => (0i64..3).prop_map(Step::Roll),
        2 => (1i64..3, 0usize..12).prop_map(|(a, k)| Step::Crash(a, k)),
        1 => Just(Step::Rebuild),
    ];
    (0usize..6, 1u32..8, prop::collection::vec(step, 1..16)).prop_map(|(variant, top, steps)| {
        Case {
            variant,
            top,
            steps,
        }
    })
}

fn feed_board(variant: usize, top: u32) -> Board {
    let mut b = board(&format!("v{variant}"), SLICE, 3);
    match variant {
        0 => {}
        1 => {
            b.allow_negative = true;
            b.tie_break = TieBreak::Latest;
        }
        2 => b.tie_break = TieBreak::None,
        3 => {
            b.dense_rank = true;
            b.allow_negative = true;
        }
        4 => b.mode = Mode::Resummarize,
        _ => {
            b.mode = Mode::Resummarize;
            b.allow_negative = true;
            b.tie_break = TieBreak::None;
            b.dense_rank = true;
        }
    }
    b.changes = Some(Changes {
        top,
        max_len: 1_000_000,
    });
    b
}

struct Run<'a> {
    store: &'a Store,
    b: Board,
    now: i64,
    last: Option<String>,
    replayed: Vec<String>,
}

impl Run<'_> {
    /// Reads what was written since the last read and replays it: the stored top.
    async fn check(&mut self, what: &Step) -> usize {
        let key = self.store.instance(&self.b.widest(), None).changes();
        let (changes, last) = changes_after(self.store, &key, self.last.as_deref()).await;
        self.last = last;
        replay(
            &mut self.replayed,
            &changes,
            self.b.changes.unwrap().top as usize,
        );
        let stored: Vec<String> = ranked(self.store, &self.b, None, self.now)
            .await
            .into_iter()
            .take(self.b.changes.unwrap().top as usize)
            .map(|(m, _, _)| m)
            .collect();
        assert_eq!(self.replayed, stored, "after {what:?}");
        changes.len()
    }
}

async fn run_case(store: &Store, case: Case) {
    let b = feed_board(case.variant, case.top);
    let mut run = Run {
        store,
        b,
        now: T0 / SLICE * SLICE + SLICE / 2,
        last: None,
        replayed: Vec::new(),
    };
    let mut sent: Vec<ApplyEvent> = Vec::new();
    let mut next_id = 0;
    for step in &case.steps {
        match step {
            Step::Tips(tips) => {
                sent = tip_events(&run.b, tips, &mut next_id, run.now);
                apply_events(store, &run.b, &sent, run.now).await;
            }
            Step::Redeliver => {
                let outcomes = apply_events(store, &run.b, &sent, run.now).await;
                let written = run.check(step).await;
                if outcomes
                    .iter()
                    .all(|o| matches!(o, Outcome::Duplicate | Outcome::Late))
                {
                    assert_eq!(written, 0, "a redelivery wrote");
                }
            }
            Step::RedeliverAnd(tips) => {
                let mut batch = sent.clone();
                batch.extend(tip_events(&run.b, tips, &mut next_id, run.now));
                apply_events(store, &run.b, &batch, run.now).await;
                sent = batch;
            }
            Step::Roll(advance) => {
                run.now += advance * SLICE;
                roll_board(store, &run.b, run.now).await;
            }
            Step::Crash(advance, k) => {
                run.now += advance * SLICE;
                let b = &run.b.clone();
                let (_, dead) = raise_for_roll_at(store, b, None, run.now).await;
                if let Some(&n) = dead.first() {
                    let key = store.instance(&b.widest(), None).slice(n);
                    let (_, fields) = store.scan("HSCAN", &key, "0", 1000).await.unwrap();
                    for (f, _) in fields.into_iter().take(*k) {
                        store
                            .expire_chunk(&b.widest(), None, n, &[f])
                            .await
                            .unwrap();
                        run.check(step).await;
                    }
                }
            }
            Step::Rebuild => {
                rollboard::roll::rebuild(store, &run.b.widest(), None, 7)
                    .await
                    .expect("rebuild");
            }
        }
        run.check(step).await;
    }
}

#[test]
fn the_stream_replays_into_the_stored_top_after_every_call() {
    let cases_n = env_count("FEED_CASES", 96) as u32;
    run_cases(cases_n, &cases(), async |store, case| {
        run_case(store, case).await
    });
}
