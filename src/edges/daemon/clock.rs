//! Redis's clock as this process sees it: measured until it answers at start-up, then
//! measured again every [`CLOCK_SYNC`], the skew reported.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::domain::clock::Clock;
use crate::metrics::Metrics;
use crate::store::Store;

/// How often the offset to Redis's clock is measured again.
const CLOCK_SYNC: Duration = Duration::from_secs(5);

/// Measures the offset to Redis's clock until it succeeds; `false`: shutdown came first.
pub(super) async fn sync_clock(
    store: &Store,
    clock: &Clock,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(100);
    loop {
        match clock.sync(store.time_ms()).await {
            Ok(skew) => {
                metrics.clock_skew(skew, clock.is_skewed());
                if clock.is_skewed() {
                    warn!(
                        skew_ms = skew,
                        "this host's clock is off from Redis's; time is judged by Redis's"
                    );
                }
                return true;
            }
            Err(e) => {
                metrics.redis_error(&e);
                warn!(error = %e, "cannot read Redis's clock yet; retrying");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Measures the offset to Redis's clock every [`CLOCK_SYNC`], reporting the skew (a
/// warning each time it goes beyond `redis.max_clock_skew`). A failed measure keeps the
/// last offset: the local clock drifts by far less than a slice between two measures.
pub(super) async fn keep_clock(
    store: Arc<Store>,
    clock: Arc<Clock>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut skewed = clock.is_skewed();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(CLOCK_SYNC) => {}
        }
        match clock.sync(store.time_ms()).await {
            Ok(skew) => {
                metrics.clock_skew(skew, clock.is_skewed());
                if clock.is_skewed() && !skewed {
                    warn!(
                        skew_ms = skew,
                        "this host's clock is off from Redis's; time is judged by Redis's"
                    );
                } else if !clock.is_skewed() && skewed {
                    info!(
                        skew_ms = skew,
                        "this host's clock agrees with Redis's again"
                    );
                }
                skewed = clock.is_skewed();
            }
            Err(e) => metrics.redis_error(&e),
        }
    }
}
