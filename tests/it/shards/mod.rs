//! Sharded boards (`shards = K`, src/store/shards.rs): one ranking spread over K
//! instances, a member in the shard its name hashes to, every answer merged from one
//! read per shard. The property: a sharded board answers exactly as the model of one
//! unsharded ranking, and as the same board unsharded fed the same events.

mod every_answer_matches_the_model;
mod over_http;

use rollboard::domain::board::Board;
use rollboard::domain::ranking::{Entry, Percentile};

use crate::support::boards::HOUR;
use crate::support::model::{competition_ranks, Instance, Row};
use crate::windows::every_window_matches_the_model::windowed;

/// The model of a board's one ranking per window, as a board with several windows keeps
/// them: the widest window alone remembers ids and decides what is late.
pub use crate::windows::every_window_matches_the_model::Windows;

/// The width of a test board's slices.
pub const SLICE: i64 = HOUR;

/// A board of hourly slices ranking the windows of `hours` (one listed: a board of one
/// window, `windows` left empty as on a board built in code), spread over `shards`.
pub fn sharded(name: &str, hours: &[i64], shards: u32) -> Board {
    let mut b = windowed(name, hours);
    if hours.len() == 1 {
        b.windows.clear();
    }
    b.shards = shards;
    b
}

/// What the model says one window ranks: its rows in order, with competition ranks.
pub struct Ranked {
    /// The rows, best first.
    pub rows: Vec<Row>,
    competition: Vec<u64>,
}

impl Ranked {
    /// The ranking of `model`, in the order of `board`.
    pub fn of(model: &Instance, board: &Board) -> Ranked {
        let rows = model.ranking(board);
        let totals: Vec<i64> = rows.iter().map(|r| r.1).collect();
        Ranked {
            competition: competition_ranks(&totals),
            rows,
        }
    }

    /// How many members are ranked.
    pub fn count(&self) -> u64 {
        self.rows.len() as u64
    }

    /// The 0-based position of `member`, if ranked.
    pub fn position(&self, member: &str) -> Option<usize> {
        self.rows.iter().position(|r| r.0 == member)
    }

    /// The entries at positions `from..to` (cut to the ranking).
    pub fn entries(&self, from: usize, to: usize) -> Vec<Entry> {
        let to = to.min(self.rows.len());
        (from.min(to)..to).map(|i| self.entry(i)).collect()
    }

    /// The entry at position `i`.
    pub fn entry(&self, i: usize) -> Entry {
        let (member, total, last_ts) = self.rows[i].clone();
        let rank = i as u64 + 1;
        Entry {
            rank,
            competition_rank: self.competition[i],
            dense_rank: None,
            percentile: Percentile::of(rank, self.count()).expect("a rank within the count"),
            member,
            total,
            last_ts,
        }
    }
}
