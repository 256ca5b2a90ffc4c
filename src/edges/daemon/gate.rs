//! The start-up gate: the daemon waits until Redis answers, then refuses to start when the
//! Redis user lacks a permission or a board's settings conflict with its data. Nothing
//! touches board data, and no listener opens, before the gate passes.

use std::time::Duration;

use fred::interfaces::EventInterface;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::config::Settings;
use crate::ingest::stream;
use crate::metrics::Metrics;
use crate::store::{Conflicts, Denied, Refused, Store, StoreError};

/// A connection's error events, as fred broadcasts them.
type ErrorEvents = broadcast::Receiver<(fred::error::Error, Option<fred::types::config::Server>)>;

/// Waits until Redis answers the permission probe and the board settings check.
/// `Ok(false)`: shutdown came first; an error: the Redis user lacks a permission, or a
/// board's settings conflict with its data (the daemon must not start either way).
pub(super) async fn settings_gate(
    store: &Store,
    settings: &Settings,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> anyhow::Result<bool> {
    let mut backoff = Duration::from_millis(100);
    let mut permitted = false;
    // Connection errors never reach a queued command (it waits for the reconnection), so
    // they are watched here: credentials or a certificate that Redis or rustls refuse stop
    // the start, anything else is retried.
    let mut errors = store.client().error_rx();
    loop {
        if !permitted && !store.is_connected() {
            if !wait_for_connection(&mut errors, settings, metrics, cancel, backoff).await? {
                return Ok(false);
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        if !permitted {
            permitted = permissions(store, settings, metrics, cancel).await?;
        }
        if permitted && board_settings(store, settings, metrics, cancel).await? {
            return Ok(true);
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(false),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Waits up to `backoff` for the connection, logging its errors; `Ok(false)`: shutdown
/// came first; an error: Redis or rustls refused the credentials or the certificate.
async fn wait_for_connection(
    errors: &mut ErrorEvents,
    settings: &Settings,
    metrics: &Metrics,
    cancel: &CancellationToken,
    backoff: Duration,
) -> anyhow::Result<bool> {
    tokio::select! {
        _ = cancel.cancelled() => return Ok(false),
        error = errors.recv() => {
            if let Ok((error, _)) = error {
                if let Some(refused) = Refused::from_error(&error) {
                    cancel.cancel();
                    return Err(refused.into());
                }
                let e = StoreError::Redis(error);
                metrics.redis_error(&e);
                warn!(redis = %settings.redis.host(), error = %e, "cannot connect to redis yet; retrying");
            }
        }
        _ = tokio::time::sleep(backoff) => {}
    }
    Ok(true)
}

/// Probes the Redis user's permissions: `Ok(true)` when it has every one it needs,
/// `Ok(false)` when Redis did not answer (retried), an error when one is denied.
async fn permissions(
    store: &Store,
    settings: &Settings,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> anyhow::Result<bool> {
    match stream::check_permissions(store, &settings.boards, &settings.ingest).await {
        Ok(denied) if denied.is_empty() => Ok(true),
        Ok(denied) => {
            cancel.cancel();
            Err(Denied(denied).into())
        }
        Err(e) => {
            if let Some(denied) = Denied::from_error(&e) {
                cancel.cancel();
                return Err(denied.into());
            }
            metrics.redis_error(&e);
            warn!(error = %e, "cannot check the redis permissions yet; retrying");
            Ok(false)
        }
    }
}

/// Checks the boards' pinned settings against their data: `Ok(true)` when they agree,
/// `Ok(false)` when Redis did not answer (retried), an error on a conflict.
async fn board_settings(
    store: &Store,
    settings: &Settings,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> anyhow::Result<bool> {
    match store.check_settings(&settings.boards).await {
        Ok(conflicts) if conflicts.is_empty() => Ok(true),
        Ok(conflicts) => {
            cancel.cancel();
            Err(Conflicts(conflicts).into())
        }
        Err(e) => {
            metrics.redis_error(&e);
            warn!(error = %e, "cannot check the board settings in redis yet; retrying");
            Ok(false)
        }
    }
}
