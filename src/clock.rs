//! The one clock: every replica and the CLI judge the window, expiry,
//! the forgetting of idempotency keys and `future` by Redis's clock (`TIME`), never by
//! their own. A [`Clock`] holds the offset between this process's clock and Redis's,
//! measured with [`Clock::sync`]; [`Clock::now`] is the local clock corrected by it.
//!
//! A process whose own clock is off by more than `redis.max_clock_skew` still works
//! exactly (it uses the offset); it only says so, in `/readyz`, a metric and a warning, so
//! that an operator fixes the host's clock.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::store::{Store, StoreError};

/// This process's own clock, in epoch milliseconds: only ever corrected by a [`Clock`].
pub fn local_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Redis's clock as seen from this process.
pub struct Clock {
    /// This process's own clock (epoch ms): [`local_ms`], or a skewed one in tests.
    local: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Redis's time minus the local time, in ms, as of the last sync.
    offset_ms: AtomicI64,
    /// Whether a sync ever succeeded.
    synced: AtomicBool,
    /// The skew above which the process says so.
    max_skew_ms: i64,
}

impl Clock {
    /// A clock not yet synced: the local clock until [`Clock::sync`] succeeds.
    pub fn new(max_skew_ms: i64) -> Clock {
        Clock::with_local(max_skew_ms, local_ms)
    }

    /// As [`Clock::new`], reading the process's own time from `local` (a clock that runs
    /// off, for tests of what skew does).
    pub fn with_local(max_skew_ms: i64, local: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock {
            local: Box::new(local),
            offset_ms: AtomicI64::new(0),
            synced: AtomicBool::new(false),
            max_skew_ms,
        }
    }

    /// A clock that runs `offset_ms` ahead of this process's own (for tests and for a
    /// clock measured elsewhere).
    pub fn with_offset(offset_ms: i64, max_skew_ms: i64) -> Clock {
        let clock = Clock::new(max_skew_ms);
        clock.offset_ms.store(offset_ms, Ordering::Relaxed);
        clock.synced.store(true, Ordering::Relaxed);
        clock
    }

    /// Redis's time now, in epoch ms, as well as this process can tell (to within half a
    /// round trip of the last sync, plus the drift since).
    pub fn now(&self) -> i64 {
        (self.local)().saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Measures the offset to Redis's clock (`TIME`, taken as read halfway through the
    /// round trip) and keeps it; returns the skew (local minus Redis, ms).
    pub async fn sync(&self, store: &Store) -> Result<i64, StoreError> {
        let before = (self.local)();
        let redis = store.time_ms().await?;
        let after = (self.local)();
        let offset = redis - (before + (after - before) / 2);
        self.offset_ms.store(offset, Ordering::Relaxed);
        self.synced.store(true, Ordering::Relaxed);
        Ok(-offset)
    }

    /// Whether a sync ever succeeded.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// This process's clock minus Redis's, in ms, as of the last sync (0 before any).
    pub fn skew_ms(&self) -> i64 {
        -self.offset_ms.load(Ordering::Relaxed)
    }

    /// Whether the skew is beyond `redis.max_clock_skew`.
    pub fn is_skewed(&self) -> bool {
        self.skew_ms().unsigned_abs() > self.max_skew_ms.unsigned_abs()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock")
            .field("offset_ms", &self.offset_ms)
            .field("synced", &self.synced)
            .field("max_skew_ms", &self.max_skew_ms)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_clock_runs_at_the_offset_and_reports_the_opposite_skew() {
        let clock = Clock::with_offset(-600_000, 2_000);
        let local = local_ms();
        let now = clock.now();
        assert!((now - (local - 600_000)).abs() < 1_000, "{now} vs {local}");
        assert_eq!(clock.skew_ms(), 600_000);
        assert!(clock.is_skewed());
        assert!(!Clock::with_offset(2_000, 2_000).is_skewed());
        assert!(Clock::with_offset(-2_001, 2_000).is_skewed());
        assert!(!Clock::new(2_000).is_synced());
    }
}
