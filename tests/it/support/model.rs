//! An in-memory model of docs/design.md (*Window and order*, *Exactly once*): what every board instance must hold after
//! any sequence of applies and rolls. Deliberately naive: it keeps every applied event.

use std::collections::HashMap;

use rollboard::domain::board::{Board, TieBreak, View, MAX_TOTAL};
use rollboard::store::{ApplyEvent, Outcome};

/// One applied event at one instance.
#[derive(Debug, Clone)]
pub struct Applied {
    slice: i64,
    ts: i64,
    member: String,
    amount: i64,
}

/// One board instance.
#[derive(Debug, Default, Clone)]
pub struct Instance {
    expired_through: Option<i64>,
    /// The latest roll time: applies judge time no earlier (time never goes back).
    last_roll: Option<i64>,
    events: Vec<Applied>,
    seen: HashMap<String, i64>,
    // Derived from `events` (kept only so that large tests stay linear).
    member_totals: HashMap<String, i64>,
    slice_totals: HashMap<(String, i64), i64>,
}

/// An expected ranked row: member, total, last_ts.
pub type Row = (String, i64, Option<i64>);

impl Instance {
    fn stored(&self) -> impl Iterator<Item = &Applied> {
        let w = self.expired_through.unwrap_or(i64::MIN);
        self.events.iter().filter(move |e| e.slice > w)
    }

    /// Applies one event as the apply script must, to the instance in the window `view`.
    pub fn apply(&mut self, view: &View<'_>, e: &ApplyEvent, now: i64) -> Outcome {
        let board = view.board();
        let now = self.last_roll.map_or(now, |r| r.max(now));
        let n = board.slice_of(e.ts);
        // Late once its slice left the window or its ids may be forgotten.
        if view.is_late(e.ts, now, self.expired_through) {
            return Outcome::Late;
        }
        if self.seen.get(&e.id).is_some_and(|&forget| forget > now) {
            return Outcome::Duplicate;
        }
        let total = self.member_totals.get(&e.member).copied().unwrap_or(0);
        let in_slice = self
            .slice_totals
            .get(&(e.member.clone(), n))
            .copied()
            .unwrap_or(0);
        if (total + e.amount).abs() > MAX_TOTAL || (in_slice + e.amount).abs() > MAX_TOTAL {
            return Outcome::Overflow;
        }
        self.events.push(Applied {
            slice: n,
            ts: e.ts,
            member: e.member.clone(),
            amount: e.amount,
        });
        self.seen.insert(e.id.clone(), board.forget_at(n));
        *self.member_totals.entry(e.member.clone()).or_default() += e.amount;
        *self.slice_totals.entry((e.member.clone(), n)).or_default() += e.amount;
        Outcome::Applied
    }

    /// Applies `events` in order to the instance in the window `view`, as [`Instance::apply`]
    /// does each; their outcomes.
    pub fn apply_all(&mut self, view: &View<'_>, events: &[ApplyEvent], now: i64) -> Vec<Outcome> {
        events.iter().map(|e| self.apply(view, e, now)).collect()
    }

    /// Rolls the instance in the window `view` at `now`.
    pub fn roll(&mut self, view: &View<'_>, now: i64) {
        self.last_roll = Some(self.last_roll.map_or(now, |r| r.max(now)));
        let target = view.board().slice_of(now) - view.slices_in_window();
        let w = self.expired_through.map_or(target, |w| w.max(target));
        self.expired_through = Some(w);
        self.events.retain(|e| e.slice > w);
        self.member_totals.clear();
        self.slice_totals.clear();
        for e in &self.events {
            *self.member_totals.entry(e.member.clone()).or_default() += e.amount;
            *self
                .slice_totals
                .entry((e.member.clone(), e.slice))
                .or_default() += e.amount;
        }
    }

    /// Exact totals of every member with events above the watermark.
    pub fn totals(&self) -> HashMap<String, (i64, i64)> {
        let mut out: HashMap<String, (i64, i64)> = HashMap::new();
        for e in self.stored() {
            let slot = out.entry(e.member.clone()).or_insert((0, i64::MIN));
            slot.0 += e.amount;
            slot.1 = slot.1.max(e.ts);
        }
        out
    }

    /// The ranking of docs/design.md (*Window and order*): totals above 0, by total, tie-break time, name.
    pub fn ranking(&self, board: &Board) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .totals()
            .into_iter()
            .filter(|(_, (t, _))| *t > 0)
            .map(|(m, (t, ts))| (m, t, (board.tie_break != TieBreak::None).then_some(ts)))
            .collect();
        rows.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| match board.tie_break {
                    TieBreak::Earliest => a.2.cmp(&b.2),
                    TieBreak::Latest => b.2.cmp(&a.2),
                    TieBreak::None => std::cmp::Ordering::Equal,
                })
                .then_with(|| b.0.as_bytes().cmp(a.0.as_bytes()))
        });
        rows
    }
}

/// Competition ranks of an ordered list of totals ("1, 2, 2, 4").
pub fn competition_ranks(totals: &[i64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(totals.len());
    for (i, t) in totals.iter().enumerate() {
        if i > 0 && totals[i - 1] == *t {
            let prev = out[i - 1];
            out.push(prev);
        } else {
            out.push(i as u64 + 1);
        }
    }
    out
}

/// Asserts that the stored ranking of one instance equals the model: every entry's rank,
/// competition rank, total and last_ts, the count, and `rank` of every member.
pub async fn assert_matches(
    store: &rollboard::store::Store,
    view: &View<'_>,
    scope: Option<&str>,
    model: &Instance,
    now: i64,
) {
    let board = view.board();
    let expected = model.ranking(board);
    let mut entries = Vec::new();
    let mut count;
    loop {
        let page = store
            .top(view, scope, entries.len() as u64, 1000, now)
            .await
            .expect("top");
        count = page.envelope.count;
        if page.entries.is_empty() {
            break;
        }
        entries.extend(page.entries);
    }
    let got: Vec<Row> = entries
        .iter()
        .map(|e| (e.member.clone(), e.total, e.last_ts))
        .collect();
    if let Some(i) = (0..got.len().max(expected.len())).find(|&i| got.get(i) != expected.get(i)) {
        panic!(
            "ranking of {}{scope:?} differs first at position {i}: stored {:?}, model {:?} ({} stored, {} expected)",
            board.name,
            got.get(i),
            expected.get(i),
            got.len(),
            expected.len()
        );
    }
    assert_eq!(
        count,
        expected.len() as u64,
        "count of {}{scope:?}",
        board.name
    );
    let ranks: Vec<u64> = entries.iter().map(|e| e.rank).collect();
    assert_eq!(ranks, (1..=expected.len() as u64).collect::<Vec<_>>());
    let totals: Vec<i64> = expected.iter().map(|r| r.1).collect();
    let competition: Vec<u64> = entries.iter().map(|e| e.competition_rank).collect();
    assert_eq!(
        competition,
        competition_ranks(&totals),
        "competition ranks of {}{scope:?}",
        board.name
    );
    for (i, (member, total, last_ts)) in expected.iter().enumerate() {
        let r = store.rank(view, scope, member, now).await.expect("rank");
        assert_eq!(r.rank, Some(i as u64 + 1), "rank of {member}");
        assert_eq!(r.total, Some(*total), "total of {member}");
        assert_eq!(r.last_ts, *last_ts, "last_ts of {member}");
        assert_eq!(
            r.competition_rank,
            Some(competition[i]),
            "competition rank of {member}"
        );
    }
    for (member, (total, _)) in model.totals() {
        if total <= 0 {
            let r = store.rank(view, scope, &member, now).await.expect("rank");
            assert_eq!(
                r.rank, None,
                "{member} with total {total} must not be ranked"
            );
        }
    }
}

/// Rolls `model` to `now`, then asserts the unscoped instance of `board` equals it and verifies clean.
pub async fn assert_rolled_and_verified(
    store: &rollboard::store::Store,
    board: &Board,
    model: &mut Instance,
    now: i64,
) {
    model.roll(&board.widest(), now);
    assert_matches(store, &board.widest(), None, model, now).await;
    crate::support::asserts::assert_verified(store, &board.widest(), None).await;
}
