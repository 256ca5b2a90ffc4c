//! Waiting for a condition (never for a fixed time): a check polled until it holds, streams drained.

use std::time::{Duration, Instant};

use crate::support::keys::intake_stream;
use rollboard::store::Store;

/// Polls `check` until it returns true or `limit` passes.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the group has delivered and acknowledged everything in `rb:events`.
pub async fn drained(store: &Store) -> bool {
    wait_for(Duration::from_secs(180), || async {
        matches!(
            rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
                .await,
            Ok(Some((0, Some(0))))
        )
    })
    .await
}

/// Waits until the group has delivered and acknowledged everything in each of `streams`.
pub async fn drained_streams(store: &Store, streams: &[String]) -> bool {
    wait_for(Duration::from_secs(60), || async {
        for stream in streams {
            let info =
                rollboard::ingest::stream::group_info(store.client(), stream, "rollboard").await;
            if !matches!(info, Ok(Some((0, Some(0))))) {
                return false;
            }
        }
        true
    })
    .await
}
