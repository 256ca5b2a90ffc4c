//! The Redis Stream consumer: read a batch with XREADGROUP (in calls of `read_piece`
//! entries, see [`crate::ingest::stream::read`]), validate, group by board
//! instance, apply (one script call per instance, pipelined), dead-letter what is
//! malformed, and XACK only after all of that succeeded. The stages of one batch live in
//! [`crate::ingest::batch`], the stream commands themselves in [`crate::ingest::stream`].
//!
//! One [`Ingest`] reads one stream key (one partition, see `ingest.partitions`) with its own
//! reader connection; the daemon runs one per partition, so every daemon reads every
//! partition and the daemons share each partition through the consumer group.
//!
//! Delivery is at-least-once and application exactly-once: a batch that fails anywhere is
//! not acked, stays in this consumer's pending list and is processed again (the apply
//! script skips what it already counted). On start the consumer first re-processes its
//! own pending entries; entries left pending by dead consumers are taken over with
//! XAUTOCLAIM after `claim_idle`.
//!
//! Every few seconds the consumer trims its stream to what every consumer group on it still
//! needs plus `ingest.retain` ([`crate::ingest::stream::trim`]); a failed trim only waits for the
//! next round.
//!
//! Shutdown leaves nothing of this consumer's pending: a read that was sent is always
//! awaited (Redis may already have delivered its entries) and its batch applied and acked,
//! and before exiting the consumer drains its own pending list. That matters because a
//! consumer name that never comes back (a replaced pod) would otherwise leave its last
//! batch to wait for another replica's `claim_idle`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use crate::ingest::batch::{process_batch, Held, APPLY_ATTEMPTS};

use crate::config::IngestSettings;
use crate::domain::board::Board;
use crate::domain::clock::Clock;
use crate::ingest::stream::{self, ensure_group};
use crate::ingest::stream::{group_info, Entry};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// Rounds of the drain before exiting; each reads up to one batch of this consumer's own
/// pending entries (normally there are none left).
const DRAIN_ROUNDS: usize = 8;
/// How long the drain before exiting may take in all, well inside the daemon's grace period.
const DRAIN_BUDGET: Duration = Duration::from_secs(10);

/// Batches of claimed entries a claim round processes at most; the rest waits for the next
/// round.
const CLAIM_BATCHES: usize = 10;

/// How often a consumer trims its stream at most ([`crate::ingest::stream::trim`]): a few Redis
/// calls per partition and replica, while the stream grows by at most this much traffic
/// between trims.
const TRIM_EVERY: Duration = Duration::from_secs(2);

/// The stream consumer of one process for one stream key (partition).
pub struct Ingest {
    store: Arc<Store>,
    reader: Client,
    settings: IngestSettings,
    /// The stream key this consumer reads.
    stream: String,
    /// A partition of another layout (`ingest.partitions` was changed): the consumer stops
    /// once the group has nothing left there.
    retired: bool,
    boards: Arc<Vec<Board>>,
    metrics: Arc<Metrics>,
    group_ready: Arc<AtomicBool>,
    /// Set when the reader (re)connects: read own pending entries before new ones.
    reader_reconnected: Arc<AtomicBool>,
    /// The time events are judged by (Redis's, see [`crate::domain::clock`]).
    clock: Arc<Clock>,
}

/// This consumer's entries held by an outage (see [`Held`]) and when to try them again:
/// a pass over the own pending entries, after a back-off that grows while they stay held.
struct Holding {
    /// The outage that held entries in the last pass or batch, for `/readyz`.
    error: Option<StoreError>,
    /// When the next pass over the own pending entries is due, if any is.
    retry_at: Option<Instant>,
    /// The wait before the next pass.
    backoff: Duration,
    /// Entries held since the current pass started.
    in_pass: usize,
    /// The last batch held every entry it had: the consumer waits before the next step,
    /// as after a failed one, instead of reading on at full speed into an outage.
    stalled: bool,
}

/// The first wait before held entries are tried again; doubled up to [`HOLD_MAX`].
const HOLD_FIRST: Duration = Duration::from_millis(100);
/// The longest wait before held entries are tried again.
const HOLD_MAX: Duration = Duration::from_secs(5);

impl Holding {
    fn new() -> Self {
        Holding {
            error: None,
            retry_at: None,
            backoff: HOLD_FIRST,
            in_pass: 0,
            stalled: false,
        }
    }

    /// Notes what one processed batch held.
    fn note(&mut self, held: Held) {
        self.stalled = held.entries > 0 && held.acked == 0;
        if held.entries > 0 {
            self.in_pass += held.entries;
            self.error = held.error;
            self.retry_at
                .get_or_insert_with(|| Instant::now() + self.backoff);
        }
    }

    /// A pass over the own pending entries ended: tried again later if it held any.
    fn pass_ended(&mut self) {
        if self.in_pass > 0 {
            self.retry_at = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(HOLD_MAX);
        } else {
            *self = Holding::new();
        }
        self.in_pass = 0;
    }

    /// Whether a pass over the own pending entries is due.
    fn due(&self) -> bool {
        self.retry_at.is_some_and(|t| t <= Instant::now())
    }
}

/// The wait after the first failed (or stalled) step in a row; doubled up to
/// [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest wait after a failed (or stalled) step.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What the consumer loop carries from one step to the next.
struct Progress {
    /// A pass over this consumer's own pending entries goes on: they are read before new ones.
    backlog: bool,
    /// Where the pass goes on: after this entry (`0`: from the start).
    pass: String,
    /// Entries held by an outage, and when to try them again.
    holding: Holding,
    /// The wait after the next failed (or stalled) step.
    backoff: Duration,
    /// When idle entries were last claimed.
    last_claim: Option<Instant>,
    /// A batch read while the previous one was applied: the next step processes it.
    ahead: Option<Vec<Entry>>,
    /// When the stream was last trimmed.
    last_trim: Option<Instant>,
}

impl Progress {
    /// The loop's start: a pass over the own pending entries first.
    fn new() -> Self {
        Progress {
            backlog: true,
            pass: "0".to_string(),
            holding: Holding::new(),
            backoff: BACKOFF_FIRST,
            last_claim: None,
            ahead: None,
            last_trim: None,
        }
    }

    /// Starts a pass over the own pending entries from the first.
    fn restart_pass(&mut self) {
        self.backlog = true;
        self.pass = "0".to_string();
    }
}

/// Waits `backoff`, then doubles it (up to [`BACKOFF_MAX`]); false when `cancel` fired
/// first.
async fn back_off(backoff: &mut Duration, cancel: &CancellationToken) -> bool {
    // Cancel-safe: nothing is in flight during the back-off, and both futures can be
    // dropped at any point.
    tokio::select! {
        _ = cancel.cancelled() => return false,
        _ = tokio::time::sleep(*backoff) => {}
    }
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
    true
}

impl Ingest {
    /// A consumer reading the first partition with its own connection `reader`
    /// (XREADGROUP blocks it); see [`Ingest::reading`] for the others.
    pub fn new(
        store: Arc<Store>,
        reader: Client,
        settings: IngestSettings,
        boards: Arc<Vec<Board>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let stream =
            crate::domain::partition::partition_key(&settings.stream, settings.partitions, 0);
        Ingest {
            store,
            reader,
            settings,
            stream,
            retired: false,
            boards,
            metrics,
            group_ready: Arc::new(AtomicBool::new(false)),
            reader_reconnected: Arc::new(AtomicBool::new(false)),
            clock: Arc::new(Clock::new(0)),
        }
    }

    /// The same consumer judging time by `clock` (the daemon's, synced with Redis) rather
    /// than by this process's own clock.
    pub fn with_clock(mut self, clock: Arc<Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same consumer reading `stream` instead; `retired` for a partition of another
    /// layout, which the consumer leaves once the group has nothing pending or unread there.
    pub fn reading(mut self, stream: String, retired: bool) -> Self {
        self.stream = stream;
        self.retired = retired;
        self
    }

    /// The stream key this consumer reads.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// A flag that is true once the consumer group is known to exist.
    pub fn group_ready(&self) -> Arc<AtomicBool> {
        self.group_ready.clone()
    }

    /// Consumes until `cancel` fires, then drains. Cancellation is observed between steps
    /// (and during the back-off after an error), never by dropping a read: a read that was
    /// sent ends by itself within `ingest.block`, and what it returned is applied and acked
    /// before the loop ends. Then this consumer's own pending list is drained, so that a
    /// clean exit leaves nothing of ours pending.
    pub async fn run(self, cancel: CancellationToken) {
        let reconnects = self.watch_reconnects();
        let mut progress = Progress::new();
        while !cancel.is_cancelled() {
            let stepped = self.step(&mut progress, &cancel).await;
            let go_on = match stepped {
                Ok(_) if progress.holding.stalled => self.stalled(&mut progress, &cancel).await,
                Ok(busy) => self.stepped(&mut progress, busy).await,
                Err(e) => self.failed(&mut progress, e, &cancel).await,
            };
            if !go_on {
                break;
            }
        }
        self.finish_ahead(progress.ahead).await;
        self.drain().await;
        reconnects.abort();
        info!("consumer stopped");
    }

    /// After a step whose batch held every entry it had: waits as after a failed step.
    /// False when the loop ends.
    async fn stalled(&self, progress: &mut Progress, cancel: &CancellationToken) -> bool {
        let holding = &mut progress.holding;
        holding.stalled = false;
        self.metrics
            .consumer_step(holding.error.as_ref().map(|e| e as _));
        if let Some(e) = &holding.error {
            self.metrics.redis_error(e);
            warn!(error = %e, retry_in_ms = progress.backoff.as_millis() as u64, "consumer step met an outage; nothing unapplied was acked");
        }
        back_off(&mut progress.backoff, cancel).await
    }

    /// After a step that went through (`busy`: it had something to do): trims when due,
    /// and leaves a retired partition once it is finished. False when the loop ends.
    async fn stepped(&self, progress: &mut Progress, busy: bool) -> bool {
        progress.backoff = BACKOFF_FIRST;
        self.metrics
            .consumer_step(progress.holding.error.as_ref().map(|e| e as _));
        if progress.last_trim.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
            self.trim().await;
            progress.last_trim = Some(Instant::now());
        }
        if self.retired && !busy && !progress.backlog {
            return !self.retired_drained().await;
        }
        true
    }

    /// After a failed step: whatever was read stays pending for us, and is re-read before
    /// new entries after a back-off. False when the loop ends.
    async fn failed(
        &self,
        progress: &mut Progress,
        e: StoreError,
        cancel: &CancellationToken,
    ) -> bool {
        progress.ahead = None;
        self.metrics.redis_error(&e);
        self.metrics.consumer_step(Some(&e));
        if e.to_string().contains("NOGROUP") {
            self.group_ready.store(false, Ordering::SeqCst);
        }
        warn!(error = %e, retry_in_ms = progress.backoff.as_millis() as u64, "consumer step failed; nothing unapplied was acked");
        // Whatever was read stays pending for us: re-read it before new entries.
        progress.restart_pass();
        back_off(&mut progress.backoff, cancel).await
    }

    /// Whether this retired partition is finished; if so, trims it a last time.
    async fn retired_drained(&self) -> bool {
        match self.finished().await {
            Ok(true) => {
                info!(stream = %self.stream, "retired partition drained");
                // No consumer reads it after this one: trim what it acked last, whatever
                // the time since the previous trim.
                self.trim().await;
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.metrics.redis_error(&e);
                false
            }
        }
    }

    /// A batch read ahead just before the signal is finished too, not left to redelivery.
    async fn finish_ahead(&self, ahead: Option<Vec<Entry>>) {
        let Some(entries) = ahead else {
            return;
        };
        match self.process(entries).await {
            Ok(held) if held.entries > 0 => {
                warn!(
                    entries = held.entries,
                    "part of the last batch met an outage; it stays pending and is redelivered"
                );
            }
            Ok(_) => {}
            Err(e) => {
                self.metrics.redis_error(&e);
                warn!(error = %e, "last batch not applied; it stays pending and is redelivered");
            }
        }
    }
    /// Flags every (re)connection of the reader: a reply lost with the old connection may
    /// have carried entries that are now pending for this consumer, so the next step reads
    /// its own pending list first.
    fn watch_reconnects(&self) -> tokio::task::JoinHandle<Result<(), fred::error::Error>> {
        let flag = self.reader_reconnected.clone();
        self.reader.on_reconnect(move |server| {
            let flag = flag.clone();
            async move {
                debug!(server = %server, "stream reader connected; own pending entries first");
                flag.store(true, Ordering::SeqCst);
                Ok(())
            }
        })
    }

    /// Applies and acks this consumer's own pending entries before exiting: a batch whose
    /// apply failed, or whose reply was lost, would otherwise wait for the next start or for
    /// another replica's `claim_idle`. Bounded in rounds and time, and tried only while the
    /// reader is connected: with Redis gone there is nothing to drain into.
    async fn drain(&self) {
        if !self.reader.is_connected() {
            warn!("redis unreachable at shutdown; own pending entries wait for the next start or a claim");
            return;
        }
        let deadline = tokio::time::Instant::now() + DRAIN_BUDGET;
        for _ in 0..DRAIN_ROUNDS {
            let round = async {
                let entries = self.read("0", None).await?;
                let count = entries.len();
                if count > 0 {
                    let held = self.process(entries).await?;
                    if let Some(e) = held.error {
                        // The same entries would come first in every round.
                        return Err(e);
                    }
                }
                Ok::<usize, StoreError>(count)
            };
            // Dropping `round` at the deadline is safe: reading id 0 delivers nothing new,
            // and a batch cut short is not acked, so it stays pending and its redelivery
            // changes nothing that was already applied.
            match tokio::time::timeout_at(deadline, round).await {
                Ok(Ok(0)) => {
                    debug!("nothing of this consumer left pending");
                    return;
                }
                Ok(Ok(count)) => info!(
                    entries = count,
                    "own pending entries applied before exiting"
                ),
                Ok(Err(e)) => {
                    self.metrics.redis_error(&e);
                    warn!(error = %e, "own pending entries not drained; they wait for the next start or a claim");
                    return;
                }
                Err(_) => {
                    warn!(
                        budget_ms = DRAIN_BUDGET.as_millis() as u64,
                        "drain ran out of time; the rest waits for the next start or a claim"
                    );
                    return;
                }
            }
        }
        warn!(
            rounds = DRAIN_ROUNDS,
            "own pending entries left after the drain; they wait for the next start or a claim"
        );
    }

    /// One step: a batch of the own pending entries while a pass over them goes on (see
    /// [`Holding`]), else a claim when due and one batch of new entries. Returns whether
    /// there was anything to do.
    async fn step(
        &self,
        progress: &mut Progress,
        cancel: &CancellationToken,
    ) -> Result<bool, StoreError> {
        if !self.group_ready.load(Ordering::SeqCst) {
            ensure_group(self.store.client(), &self.stream, &self.settings.group).await?;
            self.group_ready.store(true, Ordering::SeqCst);
        }
        if self.reader_reconnected.swap(false, Ordering::SeqCst) {
            progress.restart_pass();
        }
        // Entries held by an outage are tried again in a pass over the own pending entries,
        // never while a batch read ahead (pending for us as well) waits to be processed.
        if !progress.backlog && progress.ahead.is_none() && progress.holding.due() {
            progress.holding.retry_at = None;
            progress.restart_pass();
        }
        if progress.backlog {
            self.pass_step(progress).await?;
            return Ok(true);
        }
        self.claim_when_due(progress).await?;
        self.new_step(progress, cancel).await
    }

    /// One batch of the pass over the own pending entries, from the entry after
    /// `progress.pass`; the pass ends when there is none left.
    async fn pass_step(&self, progress: &mut Progress) -> Result<(), StoreError> {
        let entries = self.read(&progress.pass, None).await?;
        let Some(last) = entries.last() else {
            progress.backlog = false;
            progress.pass = "0".to_string();
            progress.holding.pass_ended();
            return Ok(());
        };
        // Held entries stay pending: the pass goes on after them, not again.
        let last = last.id.clone();
        debug!(entries = entries.len(), "re-processing own pending entries");
        progress.holding.note(self.process(entries).await?);
        // A pass is paced by its own back-off, not batch by batch: the entries after the
        // held ones, and the new ones after the pass, wait for it.
        progress.holding.stalled = false;
        progress.pass = last;
        Ok(())
    }

    /// Claims idle entries of other consumers, at most every half `claim_idle`.
    async fn claim_when_due(&self, progress: &mut Progress) -> Result<(), StoreError> {
        let claim_every = (self.settings.claim_idle / 2).max(Duration::from_millis(100));
        if progress
            .last_claim
            .is_none_or(|t| t.elapsed() >= claim_every)
        {
            // The batch read ahead is ours and about to be processed: a claim must not
            // process it a second time (it may have been idle past claim_idle while the
            // previous batch was applied, or retried).
            let held: HashSet<&str> = progress
                .ahead
                .iter()
                .flatten()
                .map(|e| e.id.as_str())
                .collect();
            self.claim(&held, &mut progress.holding).await?;
            progress.last_claim = Some(Instant::now());
        }
        Ok(())
    }

    /// One batch of new entries (the one read ahead, if any), processed while the next
    /// is read. Returns whether there was one.
    async fn new_step(
        &self,
        progress: &mut Progress,
        cancel: &CancellationToken,
    ) -> Result<bool, StoreError> {
        let block = self.settings.block.as_millis() as u64;
        // Deliberately not raced against `cancel`: `XREADGROUP >` is not cancel-safe. Once it
        // is sent, Redis may deliver entries into this consumer's pending list at any moment;
        // dropping the future loses the reply, not the delivery, and a consumer that then
        // exits leaves a whole batch pending. So after the signal no new read is started,
        // and a read in flight is awaited: it returns within `block`, and its entries are
        // applied and acked before the loop sees the cancellation.
        let read_new = || async {
            if cancel.is_cancelled() {
                return Ok(Vec::new());
            }
            self.read(">", Some(block)).await
        };
        let entries = match progress.ahead.take() {
            Some(entries) => entries,
            None => read_new().await?,
        };
        if entries.is_empty() {
            return Ok(false);
        }
        // Read the next batch while this one is applied, so that Redis never waits for this
        // side to fetch and decode it. If anything fails, both batches stay pending for
        // this consumer and are re-read as backlog.
        let (processed, next) = tokio::join!(self.process(entries), read_new());
        progress.holding.note(processed?);
        let next = next?;
        if !next.is_empty() {
            progress.ahead = Some(next);
        }
        Ok(true)
    }
    /// Whether a retired partition is finished: nothing of the group pending there and
    /// nothing undelivered.
    async fn finished(&self) -> Result<bool, StoreError> {
        Ok(
            match group_info(self.store.client(), &self.stream, &self.settings.group).await? {
                Some((pending, lag)) => pending == 0 && lag.unwrap_or(0) == 0,
                None => false,
            },
        )
    }

    /// Trims this consumer's stream to what every group on it still needs plus
    /// `ingest.retain`. A failure only delays the trim: it is counted, logged and tried
    /// again at the next round.
    async fn trim(&self) {
        let trimmed = stream::trim(
            self.store.client(),
            &self.stream,
            &self.settings.group,
            self.clock.now(),
            self.settings.retain,
        )
        .await;
        match trimmed {
            Ok(Some(t)) => {
                self.metrics
                    .stream_trimmed(&self.stream, &t.minid.to_string(), t.removed)
            }
            Ok(None) => {}
            Err(e) => {
                self.metrics.redis_error(&e);
                warn!(stream = %self.stream, error = %e, "stream not trimmed; trying again later");
            }
        }
    }

    async fn read(&self, id: &str, block: Option<u64>) -> Result<Vec<Entry>, StoreError> {
        stream::read(&self.reader, &self.settings, &self.stream, id, block).await
    }

    /// Takes over entries idle for `claim_idle` in other consumers' pending lists (and
    /// our own, e.g. left by a lost reply), except those in `held`, which this consumer
    /// is about to process anyway.
    ///
    /// Claims come in calls of at most `claim_piece` entries and are processed in batches
    /// of up to `ingest.batch_size`, in the order of the pending list.
    async fn claim(&self, held: &HashSet<&str>, holding: &mut Holding) -> Result<(), StoreError> {
        let batch_size = self.settings.batch_size;
        // Bounded: the calls of ten batches' claims per round, the rest at the next round.
        let calls =
            CLAIM_BATCHES * batch_size.div_ceil(self.settings.claim_piece.clamp(1, batch_size));
        let mut start = "0-0".to_string();
        let mut batch = Vec::new();
        for call in 1..=calls {
            let count = batch_size - batch.len();
            let (next, mut entries) = stream::claim(
                self.store.client(),
                &self.settings,
                &self.stream,
                &start,
                count,
            )
            .await?;
            entries.retain(|e| !held.contains(e.id.as_str()));
            batch.extend(entries);
            let scanned = next == "0-0";
            if !batch.is_empty() && (batch.len() >= batch_size || scanned || call == calls) {
                info!(
                    entries = batch.len(),
                    stream = %self.stream,
                    "claimed entries left pending by another consumer"
                );
                holding.note(self.process(std::mem::take(&mut batch)).await?);
            }
            if scanned {
                break;
            }
            start = next;
        }
        Ok(())
    }

    /// Applies one batch, dead-letters what is malformed, then acks every entry but those
    /// held by an outage.
    pub async fn process(&self, entries: Vec<Entry>) -> Result<Held, StoreError> {
        let started = Instant::now();
        let outcome = process_batch(
            &self.store,
            &self.boards,
            &self.settings,
            &self.metrics,
            &self.stream,
            &entries,
            self.clock.now(),
        )
        .await;
        if outcome.is_ok() {
            self.metrics
                .batch(entries.len(), started.elapsed().as_secs_f64());
        }
        outcome
    }
}
