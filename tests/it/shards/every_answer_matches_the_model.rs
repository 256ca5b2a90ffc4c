//! A sharded board against the model: boards spread over 2 to 5 shards (and over one, as
//! a control), incremental and resummarize, each tie-break, with and without refunds,
//! ranking one window or two, and a few members with small amounts (so equal totals in
//! different shards are common) take tips, refunds (some to exactly 0), redeliveries,
//! events late for every window or the narrower only, batches cut over several apply
//! calls, time moving on without a roll, and rolls. After every step the sharded board's
//! `top` (every page of 1 to 4 entries and one of everything), `rank` and `around`
//! (radius 0 to 3) of every member and of one never seen, `ranks` of subsets (with
//! repeats and unranked members) and the member in every window equal the model, and
//! equal the answers of the same board unsharded fed the same events (all but `as_of`,
//! the time the server wrote each); each shard holds exactly the members hashed to it.
//! On one server and on the cluster fixture, where the shards sit on several masters.

use std::collections::HashSet;

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use futures_util::future::join_all;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak, View};
use rollboard::domain::ranking::{MemberRank, MemberWindows, Page, Subset, SubsetEntry};
use rollboard::store::{ApplyEvent, Outcome, Store};

use super::{sharded, Ranked, Windows, SLICE};
use crate::support::asserts::{assert_verified, side_by_side};
use crate::support::boards::{entry, ev, ingest_settings, roll_all, Consumer, HOUR, T0};
use crate::support::cluster::{cli, owner};
use crate::support::env::env_count;
use crate::support::keys::intake_stream;
use crate::support::proptests::{run_cases_on_a_cluster, run_cases_threaded};

const QUARTER: i64 = HOUR / 4;

/// The members' names: prefixes of one another, upper and lower case and a multibyte
/// one, so that the order of equal totals (by name bytes) is tested across shards.
pub const NAMES: [&str; 12] = [
    "m1", "m10", "B", "a", "ab", "m1a", "zz", "Q9", "x-y", "é", "m2", "m0",
];

/// A member never seen by any board.
pub const NOBODY: &str = "nobody";

/// A board's shape.
#[derive(Debug, Clone)]
pub struct Shape {
    /// How many shards (1: the control, no shards).
    pub shards: u32,
    /// Its windows in hours, as listed (one or two).
    pub hours: Vec<i64>,
    pub resummarize: bool,
    pub tie: TieBreak,
    pub negative: bool,
    /// How many of [`NAMES`] take events.
    pub members: usize,
}

impl Shape {
    /// The board `name` of this shape, spread over `shards`.
    pub fn board(&self, name: &str, shards: u32) -> Board {
        let mut b = sharded(name, &self.hours, shards);
        if self.resummarize {
            b.mode = Mode::Resummarize;
        }
        b.tie_break = self.tie;
        b.allow_negative = self.negative;
        b
    }
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![1 => Just(1u32), 8 => 2u32..=5],
        Just(vec![1i64, 2, 3, 4]).prop_shuffle(),
        1usize..=2,
        any::<bool>(),
        prop_oneof![
            Just(TieBreak::Earliest),
            Just(TieBreak::Latest),
            Just(TieBreak::None)
        ],
        any::<bool>(),
        3usize..=12,
    )
        .prop_map(
            |(shards, mut hours, n, resummarize, tie, negative, members)| {
                hours.truncate(n);
                Shape {
                    shards,
                    hours,
                    resummarize,
                    tie,
                    negative,
                    members,
                }
            },
        )
}

/// One event as drawn: member (modulo the members), amount (0 made 1, made positive on
/// a board without refunds), slices back from now (modulo the widest window's slices + 2: some
/// in every window, some in the widest only, some late), minutes back within that.
type Drawn = (usize, i64, i64, i64);

#[derive(Debug, Clone)]
pub enum Step {
    /// New events; `echo`: the first sent again at the end; `behind`: judged by a clock
    /// 40 minutes behind; `cut`: the batch sent in two apply calls, cut there (modulo).
    Tips {
        events: Vec<Drawn>,
        echo: bool,
        behind: bool,
        cut: usize,
    },
    /// A refund of a member's whole total in the widest window, now: its total there
    /// becomes exactly 0 (boards with refunds only).
    Zero(usize),
    /// A batch sent before (the `k`-th, modulo), again with its ids.
    Redeliver(usize),
    /// Time moves this many quarter hours without a roll.
    Wait(i64),
    /// Time moves this many quarter hours and both jobs run.
    Roll(i64),
}

#[derive(Debug, Clone)]
pub struct Case {
    pub shape: Shape,
    pub steps: Vec<Step>,
    /// The subsets asked for with `ranks`: indices into the members, modulo the members
    /// + 1 (the last one: a member never seen).
    pub subsets: Vec<Vec<usize>>,
}

fn drawn() -> impl Strategy<Value = Drawn> {
    (0usize..12, -3i64..=3, 0i64..7, 0i64..60)
}

fn cases() -> impl Strategy<Value = Case> {
    let step = prop_oneof![
        6 => (prop::collection::vec(drawn(), 1..8), any::<bool>(), prop::bool::weighted(0.15), any::<usize>())
            .prop_map(|(events, echo, behind, cut)| Step::Tips { events, echo, behind, cut }),
        // More events than one apply call takes.
        1 => (prop::collection::vec(drawn(), 33..45), any::<usize>())
            .prop_map(|(events, cut)| Step::Tips { events, echo: false, behind: false, cut }),
        1 => (0usize..12).prop_map(Step::Zero),
        2 => (0usize..16).prop_map(Step::Redeliver),
        1 => (1i64..8).prop_map(Step::Wait),
        2 => (0i64..10).prop_map(Step::Roll),
    ];
    (
        shapes(),
        prop::collection::vec(step, 1..16),
        prop::collection::vec(prop::collection::vec(0usize..13, 0..7), 1..4),
    )
        .prop_map(|(shape, steps, subsets)| Case {
            shape,
            steps,
            subsets,
        })
}

/// Applies `events` to `b` at `now` as the consumer does (src/ingest/batch.rs): each
/// event to its member's shard, every shard's share in one [`Store::apply_shares`]
/// call; the outcomes in the order of `events`.
pub async fn apply_routed(
    store: &Store,
    b: &Board,
    events: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    let mut shares: Vec<(Option<String>, Vec<usize>)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        // `None`: the one instance of a board without shards.
        let shard = b.shard_of(&e.member);
        match shares.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, of)) => of.push(i),
            None => shares.push((shard, vec![i])),
        }
    }
    let owned: Vec<(Option<&str>, Vec<ApplyEvent>)> = shares
        .iter()
        .map(|(s, of)| {
            (
                s.as_deref(),
                of.iter().map(|&i| events[i].clone()).collect(),
            )
        })
        .collect();
    let borrowed: Vec<(Option<&str>, &[ApplyEvent])> =
        owned.iter().map(|(s, e)| (*s, e.as_slice())).collect();
    let results = store.apply_shares(b, &borrowed, now).await;
    let mut out = vec![None; events.len()];
    for ((_, of), result) in shares.iter().zip(results) {
        let outcomes = result.expect("apply");
        assert_eq!(outcomes.len(), of.len(), "one outcome per event");
        for (&i, o) in of.iter().zip(outcomes) {
            out[i] = Some(o);
        }
    }
    out.into_iter().map(|o| o.expect("an outcome")).collect()
}

/// `page` with `board` as its board, without `as_of` (the server's time of a write, and
/// null on a sharded board no event reached, where a resummarize run has no instance).
fn page_as(mut page: Page, board: &str) -> Page {
    page.envelope.board = board.to_string();
    page.envelope.as_of = None;
    page
}

fn rank_as(mut rank: MemberRank, board: &str) -> MemberRank {
    rank.envelope.board = board.to_string();
    rank.envelope.as_of = None;
    rank
}

fn subset_as(mut subset: Subset, board: &str) -> Subset {
    subset.envelope.board = board.to_string();
    subset.envelope.as_of = None;
    subset
}

fn windows_as(mut windows: MemberWindows, board: &str) -> MemberWindows {
    windows.board = board.to_string();
    windows
}

/// The rank answer the model gives for `member` (all but the times).
fn expected_rank(
    ranked: &Ranked,
    member: &str,
) -> (Option<u64>, Option<u64>, Option<i64>, Option<i64>, u64) {
    match ranked.position(member) {
        Some(i) => {
            let e = ranked.entry(i);
            (
                Some(e.rank),
                Some(e.competition_rank),
                Some(e.total),
                e.last_ts,
                ranked.count(),
            )
        }
        None => (None, None, None, None, ranked.count()),
    }
}

/// How a run's events reach its boards.
pub enum Path {
    /// [`apply_routed`] for the sharded board, [`Store::apply`] for the control: every
    /// outcome compared with the model's.
    Store,
    /// Stream entries (`user`, `amount`, `id`, `ts`) through the consumer's
    /// `process_batch`, which matches both boards and routes each event to its shard
    /// (src/domain/event.rs, src/ingest/batch.rs).
    Consumer(Box<Ingest>),
}

/// What the consumer's `process_batch` is called with.
pub struct Ingest {
    boards: Vec<Board>,
    settings: rollboard::config::IngestSettings,
    metrics: rollboard::metrics::Metrics,
}

/// One case's boards (sharded and its unsharded twin), the model and what was sent.
pub struct Run<'a> {
    path: Path,
    entries: usize,
    store: &'a Store,
    /// The board under test.
    pub b: Board,
    /// The same board without shards, fed the same events.
    pub control: Board,
    model: Windows,
    now: i64,
    members: Vec<&'static str>,
    subsets: Vec<Vec<&'static str>>,
    sent: Vec<Vec<ApplyEvent>>,
    next_id: usize,
}

impl<'a> Run<'a> {
    /// A run of `case` on `store`, the boards named `name` and `name`-control, fed
    /// through the store (`consumer` false) or the consumer.
    pub fn new(store: &'a Store, case: &Case, name: &str, consumer: bool) -> Run<'a> {
        let b = case.shape.board(name, case.shape.shards);
        let control = case.shape.board(&format!("{name}-control"), 1);
        let members: Vec<&'static str> = NAMES[..case.shape.members].to_vec();
        let subsets = case
            .subsets
            .iter()
            .map(|s| {
                s.iter()
                    .map(|&i| {
                        members
                            .get(i % (members.len() + 1))
                            .copied()
                            .unwrap_or(NOBODY)
                    })
                    .collect()
            })
            .collect();
        let path = if consumer {
            let boards = vec![b.clone(), control.clone()];
            Path::Consumer(Box::new(Ingest {
                metrics: rollboard::metrics::Metrics::new(&boards),
                boards,
                settings: ingest_settings(intake_stream(), 1),
            }))
        } else {
            Path::Store
        };
        Run {
            path,
            entries: 0,
            store,
            model: Windows::new(&b),
            b,
            control,
            now: T0 / SLICE * SLICE + SLICE / 2,
            members,
            subsets,
            sent: Vec::new(),
            next_id: 0,
        }
    }

    fn event(&mut self, (m, amount, back, minutes): Drawn) -> ApplyEvent {
        self.next_id += 1;
        // Ingest refuses an amount of zero.
        let amount = match amount {
            0 => 1,
            a if self.b.allow_negative => a,
            a if a > 0 => a,
            a => 1 - a,
        };
        let back = back % (self.b.widest().slices_in_window() + 2);
        let ts = self.now - back * SLICE - minutes * 60_000;
        let member = self.members[m % self.members.len()];
        ev(&format!("e{}", self.next_id), ts, member, amount)
    }

    /// Applies `events` at `now` to the model and to both boards: through the store, the
    /// sharded board's in two apply calls cut at `cut` (modulo), every outcome as the
    /// model's; through the consumer, in two batches cut there.
    async fn apply(&mut self, events: &[ApplyEvent], now: i64, cut: usize) {
        let expected: Vec<Outcome> = events.iter().map(|e| self.model.apply(e, now)).collect();
        let cut = cut % (events.len() + 1);
        if let Path::Consumer(ingest) = &self.path {
            let Ingest {
                boards,
                settings,
                metrics,
            } = ingest.as_ref();
            let consumer = Consumer::new(self.store, boards, settings, metrics);
            for part in [&events[..cut], &events[cut..]] {
                let mut batch = Vec::with_capacity(part.len());
                for e in part {
                    self.entries += 1;
                    let (amount, ts) = (e.amount.to_string(), e.ts.to_string());
                    let fields = [
                        ("user", e.member.as_str()),
                        ("amount", amount.as_str()),
                        ("id", e.id.as_str()),
                        ("ts", ts.as_str()),
                    ];
                    batch.push(entry(&format!("{now}-{}", self.entries), &fields));
                }
                if !batch.is_empty() {
                    consumer
                        .process(intake_stream(), &batch, now)
                        .await
                        .expect("batch");
                }
            }
            return;
        }
        let mut got = Vec::with_capacity(events.len());
        for part in [&events[..cut], &events[cut..]] {
            if !part.is_empty() {
                got.extend(apply_routed(self.store, &self.b, part, now).await);
            }
        }
        assert_eq!(got, expected, "outcomes of {events:?} at {now}");
        let twin = self
            .store
            .apply(&self.control, None, events, now)
            .await
            .expect("apply");
        assert_eq!(twin, expected, "outcomes of the control");
    }

    async fn step(&mut self, step: &Step) -> bool {
        match step {
            Step::Tips {
                events,
                echo,
                behind,
                cut,
            } => {
                let mut batch: Vec<ApplyEvent> = events.iter().map(|&d| self.event(d)).collect();
                if *echo {
                    batch.push(batch[0].clone());
                }
                // The consumer refuses events too far ahead of its clock.
                let at = if *behind && matches!(self.path, Path::Store) {
                    self.now - 40 * 60_000
                } else {
                    self.now
                };
                self.apply(&batch, at, *cut).await;
                self.sent.push(batch);
            }
            Step::Zero(m) => {
                let member = self.members[m % self.members.len()];
                let widest = self.model.windows.last().expect("a window");
                let total = widest.totals().get(member).map_or(0, |t| t.0);
                if self.b.allow_negative && total != 0 {
                    self.next_id += 1;
                    let refund = ev(&format!("e{}", self.next_id), self.now, member, -total);
                    let batch = vec![refund];
                    self.apply(&batch, self.now, 0).await;
                    self.sent.push(batch);
                }
            }
            Step::Redeliver(k) => {
                if !self.sent.is_empty() {
                    let batch = self.sent[k % self.sent.len()].clone();
                    self.apply(&batch, self.now, batch.len() / 2).await;
                }
            }
            Step::Wait(m) => self.now += m * QUARTER,
            Step::Roll(m) => {
                self.now += m * QUARTER;
                self.roll().await;
                return true;
            }
        }
        false
    }

    /// Both jobs over both boards at the current time, the model rolled too; every
    /// instance verifies clean.
    pub async fn roll(&mut self) {
        roll_all(
            self.store,
            &[self.b.clone(), self.control.clone()],
            self.now,
            10,
        )
        .await;
        self.model.roll_all(self.now);
        let mut scopes: Vec<Option<String>> = self.b.shard_names().into_iter().map(Some).collect();
        if scopes.is_empty() {
            scopes.push(None);
        }
        for view in self.b.views() {
            for scope in &scopes {
                assert_verified(self.store, &view, scope.as_deref()).await;
            }
        }
    }

    /// Every answer of the sharded board equals the control's; with `fresh` (the
    /// rankings show every event: always on an incremental board, after a roll on a
    /// resummarize one) the model's too, and each shard holds exactly its members.
    pub async fn check(&self, fresh: bool, step: &Step) {
        let (store, now) = (self.store, self.now);
        let mut asked: Vec<&str> = self.members.clone();
        asked.push(NOBODY);
        let twins = self.control.views();
        for (view, twin) in self.b.views().iter().zip(&twins) {
            let ranked = Ranked::of(self.model.window(view.window_ms()), view.board());
            let what = format!("window {} after {step:?}", view.window_name());
            let count = ranked.count();
            let mut pages: Vec<(u64, u64)> = vec![(0, 1000)];
            for offset in 0..=count + 1 {
                pages.extend((1..=4).map(|limit| (offset, limit)));
            }
            let tops = join_all(pages.iter().map(|&(offset, limit)| async move {
                let (got, want) =
                    side_by_side((view, twin), |b| store.top(b, None, offset, limit, now)).await;
                (got, want)
            }))
            .await;
            for (&(offset, limit), (got, want)) in pages.iter().zip(tops) {
                let got = page_as(got, &twin.board().name);
                assert_eq!(
                    got,
                    page_as(want, &twin.board().name),
                    "top {offset}+{limit} of {what}"
                );
                if fresh {
                    let (o, l) = (offset as usize, limit as usize);
                    assert_eq!(
                        got.entries,
                        ranked.entries(o, o + l),
                        "top {offset}+{limit} of {what}"
                    );
                    assert_eq!(got.envelope.count, count, "count of {what}");
                }
            }
            let ranks = join_all(asked.iter().map(|&m| async move {
                let got = store.rank(view, None, m, now).await.expect("rank");
                let want = store.rank(twin, None, m, now).await.expect("rank");
                (got, want)
            }))
            .await;
            for (m, (got, want)) in asked.iter().zip(ranks) {
                let got = rank_as(got, &twin.board().name);
                assert_eq!(
                    got,
                    rank_as(want, &twin.board().name),
                    "rank of {m} in {what}"
                );
                if fresh {
                    let answered = (
                        got.rank,
                        got.competition_rank,
                        got.total,
                        got.last_ts,
                        got.envelope.count,
                    );
                    assert_eq!(answered, expected_rank(&ranked, m), "rank of {m} in {what}");
                    let percentile = got
                        .rank
                        .and_then(|r| rollboard::domain::ranking::Percentile::of(r, count));
                    assert_eq!(got.percentile, percentile, "percentile of {m} in {what}");
                }
            }
            let arounds: Vec<(&str, u64)> = asked
                .iter()
                .flat_map(|&m| (0..=3).map(move |r| (m, r)))
                .collect();
            let answers = join_all(arounds.iter().map(|&(m, r)| async move {
                let got = store.around(view, None, m, r, now).await.expect("around");
                let want = store.around(twin, None, m, r, now).await.expect("around");
                (got, want)
            }))
            .await;
            for (&(m, r), (got, want)) in arounds.iter().zip(answers) {
                let name = &twin.board().name;
                let got = got.map(|p| page_as(p, name)).map_err(|n| rank_as(n, name));
                let want = want.map(|p| page_as(p, name)).map_err(|n| rank_as(n, name));
                assert_eq!(got, want, "around {m} radius {r} in {what}");
                if fresh {
                    match (ranked.position(m), &got) {
                        (Some(i), Ok(page)) => {
                            let r = r as usize;
                            let want = ranked.entries(i.saturating_sub(r), i + r + 1);
                            assert_eq!(page.entries, want, "around {m} radius {r} in {what}");
                            assert_eq!(page.envelope.count, count);
                        }
                        (None, Err(rank)) => {
                            assert_eq!(rank.rank, None, "around {m} in {what}");
                            assert_eq!(rank.envelope.count, count);
                        }
                        (at, got) => {
                            panic!("around {m} in {what}: {got:?}, the model ranks it at {at:?}")
                        }
                    }
                }
            }
            let subsets = join_all(self.subsets.iter().map(|s| async move {
                let got = store.ranks(view, None, s, now).await.expect("ranks");
                let want = store.ranks(twin, None, s, now).await.expect("ranks");
                (got, want)
            }))
            .await;
            for (s, (got, want)) in self.subsets.iter().zip(subsets) {
                let got = subset_as(got, &twin.board().name);
                assert_eq!(
                    got,
                    subset_as(want, &twin.board().name),
                    "ranks of {s:?} in {what}"
                );
                if fresh {
                    assert_eq!(
                        got.entries,
                        expected_subset(&ranked, s),
                        "ranks of {s:?} in {what}"
                    );
                    assert_eq!(got.envelope.count, count);
                }
            }
            if fresh {
                self.assert_shards_hold_their_members(view, &ranked).await;
            }
        }
        let all = join_all(asked.iter().map(|&m| async move {
            let got = store
                .rank_in_windows(&self.b, None, m, now)
                .await
                .expect("all windows");
            let want = store
                .rank_in_windows(&self.control, None, m, now)
                .await
                .expect("all windows");
            (got, want)
        }))
        .await;
        for (m, (got, want)) in asked.iter().zip(all) {
            let got = windows_as(got, &self.control.name);
            assert_eq!(
                got,
                windows_as(want, &self.control.name),
                "all windows of {m} after {step:?}"
            );
            if !fresh {
                continue;
            }
            let listed = self.b.window_list();
            assert_eq!(got.windows.len(), listed.len());
            for (w, window) in listed.iter().zip(&got.windows) {
                let view = self.b.view(Some(&w.name)).expect("a listed window");
                let ranked = Ranked::of(self.model.window(view.window_ms()), view.board());
                assert_eq!(window.window, w.name);
                let answered = (
                    window.rank,
                    window.competition_rank,
                    window.total,
                    None::<i64>,
                    window.count,
                );
                let (rank, competition, total, _, count) = expected_rank(&ranked, m);
                assert_eq!(
                    answered,
                    (rank, competition, total, None, count),
                    "window {} of {m} after {step:?}",
                    w.name
                );
            }
        }
    }

    /// Each shard's ranking holds exactly the ranked members its name hashes to.
    async fn assert_shards_hold_their_members(&self, view: &View<'_>, ranked: &Ranked) {
        for shard in view.board().shard_names() {
            let key = self.store.instance(view, Some(&shard)).result();
            let held: u64 = self
                .store
                .client()
                // Totals are whole numbers: above 0 is at least 1.
                .zcount(&key, 1.0, f64::INFINITY)
                .await
                .expect("ZCOUNT");
            let want = ranked
                .rows
                .iter()
                .filter(|r| view.board().shard_of(&r.0).as_deref() == Some(shard.as_str()))
                .count() as u64;
            assert_eq!(held, want, "members ranked in {key}");
        }
    }
}

/// The subset answer the model gives for `asked`: the ranked members once each, in the
/// board's order, then the others as asked.
fn expected_subset(ranked: &Ranked, asked: &[&str]) -> Vec<SubsetEntry> {
    let mut seen = HashSet::new();
    let asked: Vec<&str> = asked.iter().copied().filter(|m| seen.insert(*m)).collect();
    let mut positions: Vec<usize> = asked.iter().filter_map(|m| ranked.position(m)).collect();
    positions.sort_unstable();
    let mut out: Vec<SubsetEntry> = positions
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let e = ranked.entry(i);
            SubsetEntry {
                member: e.member,
                rank: Some(e.rank),
                competition_rank: Some(e.competition_rank),
                dense_rank: None,
                subset_rank: Some(k as u64 + 1),
                total: Some(e.total),
                percentile: Some(e.percentile),
            }
        })
        .collect();
    out.extend(
        asked
            .iter()
            .filter(|m| ranked.position(m).is_none())
            .map(|m| SubsetEntry {
                member: m.to_string(),
                rank: None,
                competition_rank: None,
                dense_rank: None,
                subset_rank: None,
                total: None,
                percentile: None,
            }),
    );
    out
}

/// Runs `case` with boards named `name`; its run (after a last roll and check).
pub async fn run_case<'a>(store: &'a Store, case: &Case, name: &str, consumer: bool) -> Run<'a> {
    let mut run = Run::new(store, case, name, consumer);
    let incremental = run.b.mode == Mode::Incremental;
    for step in &case.steps {
        let rolled = run.step(step).await;
        run.check(incremental || rolled, step).await;
    }
    // The last roll brings a resummarize board up to the model too.
    run.now += QUARTER;
    run.roll().await;
    run.check(true, &Step::Roll(1)).await;
    run
}

#[test]
fn every_answer_of_a_sharded_board_matches_the_model() {
    let cases_n = env_count("SHARDS_CASES", 48) as u32;
    run_cases_threaded("sharded boards", cases_n, &cases(), async |store, case| {
        run_case(store, &case, "sharded", false).await;
    });
}

#[test]
fn every_event_through_the_consumer_reaches_its_shard() {
    let cases_n = env_count("SHARDS_CONSUMER_CASES", 16) as u32;
    run_cases_threaded(
        "sharded boards fed by the consumer",
        cases_n,
        &cases(),
        async |store, case| {
            run_case(store, &case, "sharded", true).await;
        },
    );
}

#[test]
fn every_answer_of_a_sharded_board_matches_the_model_on_a_cluster() {
    let cases_n = env_count("SHARDS_CLUSTER_CASES", 10) as u32;
    run_cases_on_a_cluster(
        "sharded boards on a cluster",
        cases_n,
        &cases(),
        async |store, _n, case| {
            let run = run_case(store, &case, "sharded", false).await;
            let b = &run.b;
            // Each shard's keys in a slot of their own; four shards on several masters.
            let mut slots = HashSet::new();
            let mut masters = HashSet::new();
            for shard in b.shard_names() {
                let key = store.instance(&b.widest(), Some(&shard)).result();
                slots.insert(ClusterRouting::hash_key(key.as_bytes()));
                masters.insert(owner(store.client(), &key));
                // The shard's data is on that master: it answers for the key itself.
                let held = cli(owner(store.client(), &key), &["EXISTS", &key]);
                assert!(!held.starts_with("MOVED"), "{key}: {held}");
            }
            assert_eq!(slots.len(), b.shard_names().len(), "one slot per shard");
            if b.shards >= 4 {
                assert!(
                    masters.len() > 1,
                    "the shards of {b} on one master: {masters:?}"
                );
            }
        },
    );
}
