//! The one clock: every replica and the CLI judge the window, expiry, the forgetting of
//! idempotency keys and `future` by Redis's clock (`TIME`), never by their own. A [`Clock`]
//! anchors Redis's time, measured with [`Clock::sync`], to this process's monotonic clock:
//! [`Clock::now`] is the last measure plus the monotonic time since. A step of the host's
//! wall clock (NTP, an operator, a VM resumed) therefore moves nothing, even while a
//! measure is stale; only the monotonic clock's drift between two measures (parts per
//! million) does.
//!
//! A process whose own wall clock is off by more than `redis.max_clock_skew` still works
//! exactly; it only says so, in `/readyz`, a metric and a warning, so that an operator fixes
//! the host's clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// This process's own wall clock, in epoch milliseconds: what events are stamped with
/// when appended, never what time is judged by.
pub fn local_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Redis's clock as seen from this process.
pub struct Clock {
    /// This process's own wall clock (epoch ms): [`local_ms`], or a skewed one in tests.
    local: Box<dyn Fn() -> i64 + Send + Sync>,
    /// The monotonic instant [`Clock::now`] counts from.
    origin: Instant,
    /// Redis's time at `origin` (epoch ms), as of the last measure.
    redis_at_origin: AtomicI64,
    /// This process's wall clock minus Redis's, in ms, as of the last measure.
    skew_ms: AtomicI64,
    /// The skew above which the process says so.
    max_skew_ms: i64,
}

impl Clock {
    /// A clock not yet synced: the local wall clock (as of now, then monotonic) until
    /// [`Clock::sync`] succeeds.
    pub fn new(max_skew_ms: i64) -> Clock {
        Clock::with_local(max_skew_ms, local_ms)
    }

    /// As [`Clock::new`], reading the process's own wall time from `local` (a clock that
    /// runs off, for tests of what skew does).
    pub fn with_local(max_skew_ms: i64, local: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        let start = local();
        Clock {
            local: Box::new(local),
            origin: Instant::now(),
            redis_at_origin: AtomicI64::new(start),
            skew_ms: AtomicI64::new(0),
            max_skew_ms,
        }
    }

    /// A clock that runs `offset_ms` ahead of this process's own wall clock (for tests and
    /// for a clock measured elsewhere).
    pub fn with_offset(offset_ms: i64, max_skew_ms: i64) -> Clock {
        let clock = Clock::new(max_skew_ms);
        clock
            .redis_at_origin
            .fetch_add(offset_ms, Ordering::Relaxed);
        clock.skew_ms.store(-offset_ms, Ordering::Relaxed);
        clock
    }

    /// Milliseconds of the monotonic clock since `origin`.
    fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Redis's time now, in epoch ms, as well as this process can tell: the last measure
    /// (to within half its round trip) plus the monotonic time since.
    pub fn now(&self) -> i64 {
        self.redis_at_origin
            .load(Ordering::Relaxed)
            .saturating_add(self.elapsed_ms())
    }

    /// Measures Redis's clock with `measure` (its `TIME` in ms, taken as read halfway
    /// through the round trip) and anchors [`Clock::now`] to it; returns the skew of this
    /// process's wall clock (local minus Redis, ms).
    pub async fn sync<E, F>(&self, measure: F) -> Result<i64, E>
    where
        F: std::future::IntoFuture<Output = Result<i64, E>>,
    {
        let (mono_before, wall_before) = (self.elapsed_ms(), (self.local)());
        let redis = measure.await?;
        let (mono_after, wall_after) = (self.elapsed_ms(), (self.local)());
        let mono_mid = mono_before + (mono_after - mono_before) / 2;
        let wall_mid = wall_before + (wall_after - wall_before) / 2;
        self.redis_at_origin
            .store(redis - mono_mid, Ordering::Relaxed);
        let skew = wall_mid - redis;
        self.skew_ms.store(skew, Ordering::Relaxed);
        Ok(skew)
    }

    /// This process's wall clock minus Redis's, in ms, as of the last measure (0 before
    /// any).
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }

    /// Whether the skew is beyond `redis.max_clock_skew`.
    pub fn is_skewed(&self) -> bool {
        self.skew_ms().unsigned_abs() > self.max_skew_ms.unsigned_abs()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock")
            .field("redis_at_origin", &self.redis_at_origin)
            .field("skew_ms", &self.skew_ms)
            .field("max_skew_ms", &self.max_skew_ms)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
    }

    #[test]
    fn a_step_of_the_wall_clock_does_not_move_the_clock() {
        let step = Arc::new(AtomicI64::new(0));
        let seen = step.clone();
        let clock = Clock::with_local(2_000, move || local_ms() + seen.load(Ordering::Relaxed));
        let before = clock.now();
        step.store(600_000, Ordering::Relaxed);
        let after = clock.now();
        assert!((after - before).abs() < 1_000, "{before} -> {after}");
    }
}
