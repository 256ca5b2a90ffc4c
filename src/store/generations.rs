//! What this process wrote, as counters a cache can key its answers by: every script call
//! that writes (and every `UNLINK` of board data) raises the counter of the hash tag it
//! wrote, after Redis answered, so a read that takes the counters before it reads Redis
//! and finds them unchanged afterwards knows this process changed nothing it read.
//!
//! The counters are a fixed table indexed by a hash of the tag: two tags sharing a
//! counter only make a cache refill more often, never serve an answer this process made
//! stale, and the table's size does not grow with the number of instances. Writes by other
//! processes (another replica, the command line) are not seen here: a cache bounds them by
//! time (see `http.max_staleness` in docs/configuration.md).

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters in the table: a power of two.
const SLOTS: usize = 4096;

/// The write counters of one process, shared by its stores (the daemon's and its API's).
pub struct Generations {
    slots: Box<[AtomicU64]>,
}

impl Default for Generations {
    fn default() -> Self {
        Generations {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations").finish_non_exhaustive()
    }
}

impl Generations {
    /// A table with every counter at 0.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, key: &str) -> &AtomicU64 {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(tag(key));
        &self.slots[(hash as usize) & (SLOTS - 1)]
    }

    /// Records a write of `key` (its hash tag's counter goes up by one).
    pub fn wrote(&self, key: &str) {
        self.slot(key).fetch_add(1, Ordering::AcqRel);
    }

    /// The sum of the counters of `keys`' tags: it grows whenever this process writes
    /// any of them.
    pub fn of<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> u64 {
        keys.into_iter()
            .map(|k| self.slot(k).load(Ordering::Acquire))
            .fold(0u64, u64::wrapping_add)
    }
}

/// The part of `key` that decides its cluster slot: the text between its first `{` and the
/// next `}` when that is not empty, else the whole key (Redis Cluster's rule).
pub fn tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_what_redis_cluster_hashes() {
        assert_eq!(tag("rb:{fans_7d:room42}:result"), "fans_7d:room42");
        assert_eq!(tag("rb:{rooms}:w:1d:result"), "rooms");
        assert_eq!(tag("rb:board:rooms:window"), "rb:board:rooms:window");
        assert_eq!(tag("rb:{}:x"), "rb:{}:x");
        assert_eq!(tag("rb:{open"), "rb:{open");
    }

    #[test]
    fn a_write_moves_the_sum_of_its_own_tag_only() {
        let g = Generations::new();
        let read = ["rb:{rooms}:meta", "rb:{rooms}:w:1d:meta"];
        let before = g.of(read);
        g.wrote("rb:{rooms}:result");
        assert_eq!(g.of(read), before + 2, "both keys share the tag");
        let other = g.of(["rb:{fans:r1}:meta"]);
        g.wrote("rb:{rooms}:slices");
        assert_eq!(g.of(["rb:{fans:r1}:meta"]), other);
    }
}
