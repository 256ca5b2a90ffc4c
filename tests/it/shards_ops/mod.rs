//! A sharded board (`shards = K`) at its edges and in operation: every refusal of the
//! setting, a changed shard count refused at start, where events and queries go, rolls,
//! cleanup, verify, rebuild and drop-board over every shard, the merged answers against
//! one instance's, and keys of the wrong type or a master lost in one shard.

mod a_changed_shard_count_is_refused;
mod attacks;
mod config_refusals;
mod merged_answers_equal_one_instance;
mod readers_meet_a_sharded_board;
mod rolls_verify_rebuild_and_drop;
mod routing_and_dedup;

use std::collections::BTreeMap;

use rollboard::domain::board::Board;
use rollboard::store::{ApplyEvent, Outcome, Store};
use serde_json::Value;

use crate::support::boards::{board, HOUR, T0};

/// Half past an hour: `now0() - k * HOUR` is in the k-th hourly slice before now's.
pub fn now0() -> i64 {
    T0 / HOUR * HOUR + HOUR / 2
}

/// A board `name` of hourly slices and a 6h window spread over `k` shards.
pub fn sharded(name: &str, k: u32) -> Board {
    let mut b = board(name, HOUR, 6);
    b.shards = k;
    b
}

/// A board `name` of hourly slices ranking the last 2 and 6 hours (2h listed first).
pub fn two_windows(name: &str) -> Board {
    let mut b = board(name, HOUR, 6);
    b.windows = ["2h", "6h"]
        .iter()
        .map(|w| rollboard::domain::board::Window {
            name: w.to_string(),
            ms: w.trim_end_matches('h').parse::<i64>().expect("hours") * HOUR,
        })
        .collect();
    b
}

/// Names `<prefix>0`, `<prefix>1`, ... until each of the board's shards holds `per` of
/// them; per shard, in shard order.
pub fn members_by_shard(b: &Board, prefix: &str, per: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); b.shards as usize];
    let mut i = 0;
    while out.iter().any(|s| s.len() < per) {
        let name = format!("{prefix}{i}");
        let shard = shard_index(b, &name);
        if out[shard].len() < per {
            out[shard].push(name);
        }
        i += 1;
    }
    out
}

/// The index of the shard of `member` (`#3` -> 3).
pub fn shard_index(b: &Board, member: &str) -> usize {
    b.shard_of(member).expect("a sharded board")[1..]
        .parse()
        .expect("a shard number")
}

/// Applies `events` to a sharded board as ingest does: each to its member's shard, the
/// shards of the batch at once (`Store::apply_shares`); the outcomes in the order given.
pub async fn apply_sharded(
    store: &Store,
    b: &Board,
    events: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    let mut by_shard: BTreeMap<String, Vec<(usize, ApplyEvent)>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let shard = b.shard_of(&e.member).expect("a sharded board");
        by_shard.entry(shard).or_default().push((i, e.clone()));
    }
    let lists: Vec<(String, Vec<ApplyEvent>)> = by_shard
        .into_iter()
        .map(|(s, evs)| (s, evs.iter().map(|(_, e)| e.clone()).collect()))
        .collect();
    let shares: Vec<(Option<&str>, &[ApplyEvent])> = lists
        .iter()
        .map(|(s, evs)| (Some(s.as_str()), evs.as_slice()))
        .collect();
    let results = store.apply_shares(b, &shares, now).await;
    let mut out: Vec<Option<Outcome>> = vec![None; events.len()];
    let mut positions = BTreeMap::<String, Vec<usize>>::new();
    for (i, e) in events.iter().enumerate() {
        positions
            .entry(b.shard_of(&e.member).expect("shard"))
            .or_default()
            .push(i);
    }
    for ((shard, _), result) in lists.iter().zip(results) {
        let outcomes = result.unwrap_or_else(|e| panic!("apply to {shard}: {e}"));
        for (&i, o) in positions[shard].iter().zip(outcomes) {
            out[i] = Some(o);
        }
    }
    out.into_iter().map(|o| o.expect("an outcome")).collect()
}

/// An answer as JSON with its board name and `as_of` taken out (a sharded board and its
/// unsharded twin answer alike but for those).
pub fn comparable(answer: &impl serde::Serialize) -> Value {
    let mut v = serde_json::to_value(answer).expect("JSON");
    if let Some(o) = v.as_object_mut() {
        o.remove("board");
        o.remove("as_of");
    }
    v
}
