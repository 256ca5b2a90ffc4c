//! The stream consumers: one per partition, each with its own reader (a blocking
//! `XREADGROUP` stalls every command queued behind it on its connection), and one per
//! partition of another layout while it holds unfinished entries.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use super::Shared;
use crate::ingest::consumer::Ingest;
use crate::ingest::stream;
use crate::store::{Reconnect, Store};

/// One consumer per partition of `ingest.partitions`, each with a reader of its own.
pub(super) async fn build(shared: &Shared) -> anyhow::Result<Vec<Ingest>> {
    let settings = &shared.settings;
    let mut consumers = Vec::new();
    for key in stream::keys(&settings.ingest) {
        let reader = Store::dedicated_with(&settings.redis, Reconnect::Forever)
            .await
            .context("cannot create the stream reader")?;
        shared.metrics.watch_reconnects(&reader);
        consumers.push(
            Ingest::new(
                shared.store.clone(),
                reader,
                settings.ingest.clone(),
                shared.boards.clone(),
                shared.metrics.clone(),
            )
            .reading(key, false)
            .with_clock(shared.clock.clone()),
        );
    }
    Ok(consumers)
}

/// Spawns each of `consumers`, instrumented with a span naming its stream.
pub(super) fn spawn(consumers: Vec<Ingest>, shared: &Shared) {
    for consumer in consumers {
        let span = tracing::info_span!("consumer", stream = %consumer.stream());
        spawn_one(consumer, span, shared);
    }
}

/// Spawns `consumer` on the daemon's tracker, instrumented with `span`.
fn spawn_one(
    consumer: Ingest,
    span: tracing::Span,
    shared: &Shared,
) -> tokio::task::JoinHandle<()> {
    let ingest = &shared.settings.ingest;
    shared.tracker.spawn(
        consume(
            consumer,
            shared.store.clone(),
            ingest.group.clone(),
            ingest.consumer.clone(),
            shared.cancel.clone(),
        )
        .instrument(span),
    )
}

/// Runs `consumer` (reading `stream`) until `cancel` fires; on that clean exit, with its own
/// pending list drained, removes it from the group, so that a replaced pod's name does not
/// stay in the group for ever. A consumer still holding entries stays: another claims them.
async fn consume(
    consumer: Ingest,
    store: Arc<Store>,
    group: String,
    name: String,
    cancel: CancellationToken,
) {
    let stream = consumer.stream().to_string();
    consumer.run(cancel.clone()).await;
    if !cancel.is_cancelled() {
        return;
    }
    match store.forget_consumer(&stream, &group, &name).await {
        Ok(true) => info!(stream = %stream, consumer = %name, "consumer removed from the group"),
        Ok(false) => {
            info!(stream = %stream, consumer = %name, "consumer holds pending entries (or no group); left in the group")
        }
        Err(e) => warn!(stream = %stream, error = %e, "cannot remove the consumer from the group"),
    }
}

/// Reads partitions of other layouts (left by a change of `ingest.partitions`) while they
/// hold entries the group has not finished: checked at start and every `claim_idle`, one
/// consumer per such partition, which stops once the group has nothing left there.
pub(super) async fn watch_retired(shared: Shared) {
    let Shared {
        store,
        settings,
        cancel,
        ..
    } = &shared;
    let ingest = &settings.ingest;
    let mut running: Vec<(String, tokio::task::JoinHandle<()>)> = Vec::new();
    loop {
        running.retain(|(_, task)| !task.is_finished());
        for key in crate::domain::partition::retired_keys(&ingest.stream, ingest.partitions) {
            if running.iter().any(|(k, _)| *k == key) {
                continue;
            }
            match stream::holds_work(store.client(), &key, &ingest.group).await {
                Ok(false) => {}
                Ok(true) => {
                    if let Some(task) = read_retired(&shared, &key).await {
                        running.push((key, task));
                    }
                }
                // A user without rights on the other layouts' keys cannot have appended there.
                Err(e) if e.to_string().contains("NOPERM") => {
                    debug!(stream = %key, "no permission on a key of another layout; not read");
                }
                Err(e) => shared.metrics.redis_error(&e),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(ingest.claim_idle) => {}
        }
    }
}

/// Starts a consumer of the retired partition `key`, with a reader of its own; `None` when
/// the reader cannot be created (tried again at the next check).
async fn read_retired(shared: &Shared, key: &str) -> Option<tokio::task::JoinHandle<()>> {
    let ingest = &shared.settings.ingest;
    let reader = match Store::dedicated_with(&shared.settings.redis, Reconnect::Forever).await {
        Ok(reader) => reader,
        Err(e) => {
            warn!(error = %e, "cannot create a reader for a retired partition");
            return None;
        }
    };
    warn!(stream = %key, partitions = ingest.partitions,
          "a stream of another ingest.partitions layout holds unfinished entries; reading it until it is drained");
    let consumer = Ingest::new(
        shared.store.clone(),
        reader,
        ingest.clone(),
        shared.boards.clone(),
        shared.metrics.clone(),
    )
    .reading(key.to_string(), true)
    .with_clock(shared.clock.clone());
    let span = tracing::info_span!("consumer", stream = %key, retired = true);
    Some(spawn_one(consumer, span, shared))
}
