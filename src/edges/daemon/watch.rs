//! The background watchers: Redis connection errors logged as they happen, and the
//! consumer groups' pending and lag and the streams' lengths polled into the metrics.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::Settings;
use crate::ingest::stream::{self, group_info};
use crate::metrics::Metrics;
use crate::store::Store;

/// Logs every connection error of the pool's first connection, naming the Redis host
/// (never the password), until `cancel` fires. Commands sent meanwhile wait for the
/// reconnection, so without this an outage would show only as their timeouts.
pub(super) async fn log_connection_errors(
    store: Arc<Store>,
    host: String,
    cancel: CancellationToken,
) {
    use fred::interfaces::EventInterface;
    let Some(client) = store.pool().clients().first() else {
        return;
    };
    let mut errors = client.error_rx();
    loop {
        // Cancel safety: a broadcast receive loses nothing when it is dropped.
        let received = tokio::select! {
            _ = cancel.cancelled() => return,
            received = errors.recv() => received,
        };
        match received {
            Ok((error, _)) => {
                warn!(redis = %host, error = %error, "redis connection error; reconnecting")
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Reports each partition's pending and lag every 5 s, and their sums.
pub(super) async fn poll_groups(
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    settings: Arc<Settings>,
    cancel: CancellationToken,
) {
    let ingest = &settings.ingest;
    let keys = stream::keys(ingest);
    loop {
        let (mut pending, mut lag, mut known) = (0, Some(0), false);
        for key in &keys {
            match group_info(store.client(), key, &ingest.group).await {
                Ok(Some((p, l))) => {
                    metrics.stream_group(key, p, l);
                    pending += p;
                    lag = lag.zip(l).map(|(a, b)| a + b);
                    known = true;
                }
                Ok(None) => {}
                Err(e) => metrics.redis_error(&e),
            }
        }
        if known {
            metrics.consumer(pending, lag);
        }
        for key in keys.iter().chain([&ingest.dead_letter_stream]) {
            match stream::length(store.client(), key).await {
                Ok(length) => metrics.stream_length(key, length),
                Err(e) => metrics.redis_error(&e),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}
