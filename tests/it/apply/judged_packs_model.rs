//! Packs of small instances judged in the worker, against the in-memory model: random
//! batches of shares over a few scopes (one share a scope, as the consumer makes them:
//! two shares of one scope are judged in either order), ids repeated
//! inside a batch, across batches and as redeliveries, a member's events in several slices,
//! late events mixed in, totals at the 2^53 - 1 edge, each tie-break and a dedup window
//! shorter than the window. Every outcome and every instance's ranking is the model's.

use std::collections::HashMap;

use proptest::prelude::*;
use rollboard::domain::board::{Board, Dedup, TieBreak, MAX_TOTAL};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::boards::{board, ev, scoped};
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::run_cases;

/// The boards of the cases: scoped, incremental, one window, each tie-break; the last
/// forgets ids half a slice after their slice ends.
fn boards() -> Vec<Board> {
    let mut out = Vec::new();
    for (i, tie) in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None]
        .into_iter()
        .enumerate()
    {
        let mut b = scoped(board(&format!("p{i}"), 1_000, 4));
        b.tie_break = tie;
        out.push(b);
    }
    let mut short = scoped(board("short", 1_000, 4));
    short.dedup = Dedup::AfterSlice(500);
    out.push(short);
    out
}

/// A batch: its board, its shares (scope index, events) and the time it is applied at.
type Batch = (usize, Vec<(usize, Vec<ApplyEvent>)>, i64);

fn case() -> impl Strategy<Value = Vec<Batch>> {
    let amount = prop_oneof![12 => 1i64..6, 1 => Just(MAX_TOTAL / 2 + 1)];
    let event = (0u32..30, -6_000i64..600, 0usize..5, amount);
    let share = (0usize..5, prop::collection::vec(event, 1..6));
    let batch = (0usize..4, prop::collection::vec(share, 2..7), 0i64..1_200);
    prop::collection::vec(batch, 1..8).prop_map(|raw| {
        let mut now = 1_000_000;
        raw.into_iter()
            .map(|(b, shares, advance)| {
                now += advance;
                let mut merged: Vec<(usize, Vec<ApplyEvent>)> = Vec::new();
                for (scope, events) in shares {
                    let events = events.into_iter().map(|(id, offset, member, amount)| {
                        ev(
                            &format!("id{id}"),
                            now + offset,
                            ["a", "b", "c", "d", "ab"][member],
                            amount,
                        )
                    });
                    match merged.iter_mut().find(|(s, _)| *s == scope) {
                        Some((_, into)) => into.extend(events),
                        None => merged.push((scope, events.collect())),
                    }
                }
                let shares = merged;
                (b, shares, now)
            })
            .collect()
    })
}

async fn run_case(store: &Store, batches: &[Batch]) {
    let boards = boards();
    let mut model: HashMap<(usize, usize), Instance> = HashMap::new();
    for (b, shares, now) in batches {
        let board = &boards[*b];
        let names: Vec<String> = shares.iter().map(|(s, _)| format!("r{s}")).collect();
        let borrowed: Vec<(Option<&str>, &[ApplyEvent])> = shares
            .iter()
            .zip(&names)
            .map(|((_, events), name)| (Some(name.as_str()), events.as_slice()))
            .collect();
        let expected: Vec<Vec<Outcome>> = shares
            .iter()
            .map(|(s, events)| {
                let inst = model.entry((*b, *s)).or_default();
                events
                    .iter()
                    .map(|e| inst.apply(&board.widest(), e, *now))
                    .collect()
            })
            .collect();
        let got: Vec<Vec<Outcome>> = store
            .apply_shares(board, &borrowed, *now)
            .await
            .into_iter()
            .map(|r| r.expect("applied"))
            .collect();
        assert_eq!(got, expected, "{} at {now}: {shares:?}", board.name);
    }
    let now = batches.last().map_or(0, |b| b.2);
    for ((b, s), inst) in &model {
        let scope = format!("r{s}");
        assert_matches(store, &boards[*b].widest(), Some(&scope), inst, now).await;
    }
}

#[test]
fn judged_packs_behave_like_the_model() {
    run_cases(96, &case(), async |store, batches| {
        run_case(store, &batches).await;
    });
}
