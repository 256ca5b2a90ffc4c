//! The change stream against the model (docs/design.md, *The change feed*): random tips,
//! refunds, redeliveries, rolls and rolls that die between their expiry calls. Every apply
//! and every resummarize swap writes exactly the entries its change of the top makes (none
//! for a duplicate), and the stream, replayed in order from empty, gives the model's top
//! at every step; on one server and on the cluster fixture.

use proptest::prelude::*;
use rollboard::domain::board::{Board, Changes, Mode};
use rollboard::store::{ApplyEvent, Store};

use crate::support::boards::{
    apply_scoped_model, raise_for_roll_at, roll_board, scoped, variants, HOUR, T0,
};
use crate::support::feed::{changes_after, expected_changes, replay, tip_events, Change, Tip};
use crate::support::model::Instance;
use crate::support::proptests::{run_cases, run_cases_on_a_cluster};

/// The size of the watched top: small beside the members, so that it churns.
const TOP: usize = 3;
const SLICE: i64 = HOUR;

#[derive(Debug, Clone)]
enum Step {
    /// Events (member, amount, slices back from now).
    Tips(Vec<Tip>),
    /// The last tips sent again, with their ids.
    Redeliver,
    /// Time moves this many slices and both jobs run.
    Roll(i64),
    /// Time moves this many slices and a roll dies after expiring `k` fields of the oldest
    /// dead slice (an incremental board; elsewhere a roll).
    Crash(i64, usize),
}

#[derive(Debug, Clone)]
struct Case {
    variant: usize,
    steps: Vec<Step>,
}

fn cases() -> impl Strategy<Value = Case> {
    let step = prop_oneof![
        4 => prop::collection::vec((0usize..7, -4i64..9, 0i64..3), 1..8).prop_map(Step::Tips),
        1 => Just(Step::Redeliver),
        2 => (0i64..3).prop_map(Step::Roll),
        1 => (1i64..3, 0usize..5).prop_map(|(a, k)| Step::Crash(a, k)),
    ];
    (0usize..4, prop::collection::vec(step, 1..24))
        .prop_map(|(variant, steps)| Case { variant, steps })
}

/// The four board shapes, each with a feed of its top 3.
fn feed_board(variant: usize, scope: Option<&str>) -> Board {
    let mut b = variants(SLICE, 3).swap_remove(variant);
    if scope.is_some() {
        b = scoped(b);
    }
    b.changes = Some(Changes {
        top: TOP as u32,
        max_len: 100_000,
    });
    b
}

/// The model's top: member and total, best first.
fn model_top(model: &Instance, b: &Board) -> Vec<(String, i64)> {
    model
        .ranking(b)
        .into_iter()
        .take(TOP)
        .map(|(m, t, _)| (m, t))
        .collect()
}

fn names(top: &[(String, i64)]) -> Vec<String> {
    top.iter().map(|(m, _)| m.clone()).collect()
}

/// One case's board, the model, the top the stored ranking holds and the reader of its
/// feed.
struct Run<'a> {
    store: &'a Store,
    b: Board,
    scope: Option<&'a str>,
    model: Instance,
    /// The top the stored ranking holds: the model's as of the last roll on a resummarize
    /// board, whose applies leave its ranking alone.
    shown: Vec<(String, i64)>,
    /// Whether a roll died part-way since the last complete one: the ranking then still
    /// holds fields of a dead slice that the model dropped.
    torn: bool,
    now: i64,
    /// The stream read so far, and the top replayed from it.
    last: Option<String>,
    replayed: Vec<String>,
}

impl Run<'_> {
    fn incremental(&self) -> bool {
        self.b.mode == Mode::Incremental
    }

    /// Reads the entries written since the last read and replays them; the entries.
    async fn read(&mut self) -> Vec<Change> {
        let key = self.store.instance(&self.b.widest(), self.scope).changes();
        let (changes, last) = changes_after(self.store, &key, self.last.as_deref()).await;
        self.last = last;
        replay(&mut self.replayed, &changes, TOP);
        changes
    }

    /// Applies `events` (a redelivery when `again`): an incremental board writes exactly
    /// the change of its top, a resummarize board and a duplicate nothing.
    async fn tips(&mut self, events: &[ApplyEvent], again: bool) {
        apply_scoped_model(
            self.store,
            &self.b,
            self.scope,
            &mut self.model,
            events,
            self.now,
        )
        .await;
        let changes = self.read().await;
        if again || !self.incremental() {
            assert!(changes.is_empty(), "wrote {changes:?}");
        } else if !self.torn {
            let top = model_top(&self.model, &self.b);
            assert_eq!(changes, expected_changes(&self.shown, &top, "tip"));
            self.shown = top;
        }
    }

    /// A roll that raises the watermark and dies after expiring `k` fields of the oldest
    /// dead slice: each expiry call's entries fit the top the reader holds.
    async fn crash(&mut self, k: usize) {
        let (b, scope) = (&self.b, self.scope);
        let (_, dead) = raise_for_roll_at(self.store, b, scope, self.now).await;
        if let Some(&n) = dead.first() {
            let key = self.store.instance(&b.widest(), scope).slice(n);
            let (_, fields) = self.store.scan("HSCAN", &key, "0", 1000).await.unwrap();
            let part: Vec<String> = fields.into_iter().map(|(f, _)| f).take(k).collect();
            self.store
                .expire_chunk(&b.widest(), scope, n, &part)
                .await
                .unwrap();
        }
        let changes = self.read().await;
        assert!(changes.iter().all(|c| c.cause == "roll"), "{changes:?}");
        self.torn = true;
    }

    /// Both jobs, complete: the reader's top is the model's again; a resummarize board's
    /// one swap writes exactly its change.
    async fn roll(&mut self) {
        roll_board(self.store, &self.b, self.now).await;
        self.model.roll(&self.b.widest(), self.now);
        let changes = self.read().await;
        let top = model_top(&self.model, &self.b);
        if !self.incremental() {
            assert_eq!(changes, expected_changes(&self.shown, &top, "roll"));
        }
        assert!(changes.iter().all(|c| c.cause == "roll"), "{changes:?}");
        self.shown = top;
        self.torn = false;
    }
}

async fn run_case(store: &Store, scope: Option<&str>, case: Case) {
    let b = feed_board(case.variant, scope);
    let mut run = Run {
        store,
        b,
        scope,
        model: Instance::default(),
        shown: Vec::new(),
        torn: false,
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
                run.tips(&sent, false).await;
            }
            Step::Redeliver => run.tips(&sent, true).await,
            Step::Crash(advance, k) if run.incremental() => {
                run.now += advance * SLICE;
                run.crash(*k).await;
            }
            Step::Roll(advance) | Step::Crash(advance, _) => {
                run.now += advance * SLICE;
                run.roll().await;
            }
        }
        if !run.torn {
            assert_eq!(run.replayed, names(&run.shown), "after {step:?}");
        }
    }
}

#[test]
fn the_stream_replays_into_every_top_the_model_goes_through() {
    run_cases(64, &cases(), async |store, case| {
        run_case(store, None, case).await
    });
}

#[test]
fn the_stream_replays_the_model_on_a_cluster() {
    run_cases_on_a_cluster(
        "change feed on a cluster",
        12,
        &cases(),
        async |store, n, case| run_case(store, Some(&format!("room{n}")), case).await,
    );
}
