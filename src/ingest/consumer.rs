//! The Redis Stream consumer: read a batch with XREADGROUP, validate, group by board
//! instance, apply (one script call per instance, pipelined), dead-letter what is
//! malformed, and XACK only after all of that succeeded. The stream commands themselves
//! live in [`crate::ingest::stream`].
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

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::IngestSettings;
use crate::domain::board::Board;
use crate::domain::clock::Clock;
use crate::domain::event::{parse_entry, Reason, Rejection};
use crate::ingest::stream::{self, ensure_group};
use crate::ingest::stream::{group_info, DeadLetter, Entry};
use crate::metrics::{Metrics, Skip};
use crate::store::{ApplyEvent, Outcome, Store, StoreError};

/// A board instance: board index and scope value.
type Instance = (usize, Option<String>);

/// Rounds of the drain before exiting; each reads up to one batch of this consumer's own
/// pending entries (normally there are none left).
const DRAIN_ROUNDS: usize = 8;
/// How long the drain before exiting may take in all, well inside the daemon's grace period.
const DRAIN_BUDGET: Duration = Duration::from_secs(10);

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
        let mut backlog = true;
        let mut pass = "0".to_string();
        let mut holding = Holding::new();
        let mut backoff = Duration::from_millis(100);
        let mut last_claim: Option<Instant> = None;
        let mut ahead: Option<Vec<Entry>> = None;
        let mut last_trim: Option<Instant> = None;
        while !cancel.is_cancelled() {
            let stepped = self
                .step(
                    (&mut backlog, &mut pass),
                    &mut holding,
                    &mut last_claim,
                    &mut ahead,
                    &cancel,
                )
                .await;
            match stepped {
                Ok(_) if holding.stalled => {
                    holding.stalled = false;
                    self.metrics
                        .consumer_step(holding.error.as_ref().map(|e| e as _));
                    if let Some(e) = &holding.error {
                        self.metrics.redis_error(e);
                        warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "consumer step met an outage; nothing unapplied was acked");
                    }
                    // Cancel-safe, as the back-off after an error below.
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Ok(busy) => {
                    backoff = Duration::from_millis(100);
                    self.metrics
                        .consumer_step(holding.error.as_ref().map(|e| e as _));
                    if last_trim.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                        self.trim().await;
                        last_trim = Some(Instant::now());
                    }
                    if self.retired && !busy && !backlog {
                        match self.finished().await {
                            Ok(true) => {
                                info!(stream = %self.stream, "retired partition drained");
                                // No consumer reads it after this one: trim what it acked
                                // last, whatever the time since the previous trim.
                                self.trim().await;
                                break;
                            }
                            Ok(false) => {}
                            Err(e) => self.metrics.redis_error(&e),
                        }
                    }
                }
                Err(e) => {
                    ahead = None;
                    self.metrics.redis_error(&e);
                    self.metrics.consumer_step(Some(&e));
                    if e.to_string().contains("NOGROUP") {
                        self.group_ready.store(false, Ordering::SeqCst);
                    }
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "consumer step failed; nothing unapplied was acked");
                    // Whatever was read stays pending for us: re-read it before new entries.
                    backlog = true;
                    pass = "0".to_string();
                    // Cancel-safe: nothing is in flight during the back-off, and both
                    // futures can be dropped at any point.
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        // A batch read ahead just before the signal is finished too, not left to redelivery.
        if let Some(entries) = ahead {
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
        self.drain().await;
        reconnects.abort();
        info!("consumer stopped");
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

    /// One step: a batch of the own pending entries while `backlog` is set (a pass from
    /// the entry after `pass`, see [`Holding`]), else a claim when due and one batch of new
    /// entries. Returns whether there was anything to do.
    async fn step(
        &self,
        (backlog, pass): (&mut bool, &mut String),
        holding: &mut Holding,
        last_claim: &mut Option<Instant>,
        ahead: &mut Option<Vec<Entry>>,
        cancel: &CancellationToken,
    ) -> Result<bool, StoreError> {
        if !self.group_ready.load(Ordering::SeqCst) {
            ensure_group(self.store.client(), &self.stream, &self.settings.group).await?;
            self.group_ready.store(true, Ordering::SeqCst);
        }
        if self.reader_reconnected.swap(false, Ordering::SeqCst) {
            *backlog = true;
            *pass = "0".to_string();
        }
        // Entries held by an outage are tried again in a pass over the own pending entries,
        // never while a batch read ahead (pending for us as well) waits to be processed.
        if !*backlog && ahead.is_none() && holding.due() {
            holding.retry_at = None;
            *backlog = true;
            *pass = "0".to_string();
        }
        if *backlog {
            let entries = self.read(pass, None).await?;
            match entries.last() {
                None => {
                    *backlog = false;
                    *pass = "0".to_string();
                    holding.pass_ended();
                }
                Some(last) => {
                    // Held entries stay pending: the pass goes on after them, not again.
                    let last = last.id.clone();
                    debug!(entries = entries.len(), "re-processing own pending entries");
                    holding.note(self.process(entries).await?);
                    // A pass is paced by its own back-off, not batch by batch: the entries
                    // after the held ones, and the new ones after the pass, wait for it.
                    holding.stalled = false;
                    *pass = last;
                }
            }
            return Ok(true);
        }
        let claim_every = (self.settings.claim_idle / 2).max(Duration::from_millis(100));
        if last_claim.is_none_or(|t| t.elapsed() >= claim_every) {
            // The batch read ahead is ours and about to be processed: a claim must not
            // process it a second time (it may have been idle past claim_idle while the
            // previous batch was applied, or retried).
            let held: HashSet<&str> = ahead.iter().flatten().map(|e| e.id.as_str()).collect();
            self.claim(&held, holding).await?;
            *last_claim = Some(Instant::now());
        }
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
        let entries = match ahead.take() {
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
        holding.note(processed?);
        let next = next?;
        if !next.is_empty() {
            *ahead = Some(next);
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
    async fn claim(&self, held: &HashSet<&str>, holding: &mut Holding) -> Result<(), StoreError> {
        let mut start = "0-0".to_string();
        // Bounded: at most a few batches per claim round, the rest at the next round.
        for _ in 0..10 {
            let (next, mut entries) =
                stream::claim(self.store.client(), &self.settings, &self.stream, &start).await?;
            entries.retain(|e| !held.contains(e.id.as_str()));
            if !entries.is_empty() {
                info!(
                    entries = entries.len(),
                    stream = %self.stream,
                    "claimed entries left pending by another consumer"
                );
                holding.note(self.process(entries).await?);
            }
            if next == "0-0" {
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

/// The whole of one batch of `stream`, independent of how it was read: validate, apply,
/// dead-letter, ack. Returns after the XACK; on error nothing is acked. An event one of
/// whose instances met an outage is neither acked nor dead-lettered: its entry stays
/// pending (see [`Held`]) while the rest of the batch is acked, so that one master out of
/// service holds back only the events that touch it.
pub async fn process_batch(
    store: &Store,
    boards: &[Board],
    settings: &IngestSettings,
    metrics: &Metrics,
    stream: &str,
    entries: &[Entry],
    now: i64,
) -> Result<Held, StoreError> {
    // (position in the batch, dead letter): written in stream order.
    let mut dead: Vec<(usize, DeadLetter)> = Vec::new();
    let mut events = Vec::new();
    for (position, entry) in entries.iter().enumerate() {
        let Some(fields) = &entry.fields else {
            warn!(id = %entry.id, "pending entry was deleted from the stream; acking it");
            continue;
        };
        match parse_entry(
            fields,
            stream,
            &settings.stream,
            &entry.id,
            boards,
            now,
            settings.max_future_ms,
        ) {
            Ok(event) => events.push((position, entry, event)),
            Err(rejection) => dead.push((
                position,
                DeadLetter {
                    fields: fields.clone(),
                    source_id: entry.id.clone(),
                    source_stream: stream.to_string(),
                    rejection,
                },
            )),
        }
    }

    // One batch per board instance, events in stream order; remember where each went.
    let mut groups: BTreeMap<Instance, Vec<(usize, ApplyEvent)>> = BTreeMap::new();
    for (k, (_, _, event)) in events.iter().enumerate() {
        for u in &event.updates {
            groups.entry((u.board, u.scope.clone())).or_default().push((
                k,
                ApplyEvent {
                    id: event.id.clone(),
                    ts: event.ts,
                    member: u.member.clone(),
                    amount: u.amount,
                },
            ));
        }
    }
    let batches: Vec<(&Board, Option<&str>, Vec<ApplyEvent>)> = groups
        .iter()
        .map(|((b, scope), evs)| {
            (
                &boards[*b],
                scope.as_deref(),
                evs.iter().map(|(_, e)| e.clone()).collect(),
            )
        })
        .collect();
    let outcomes = apply_with_retries(store, metrics, &batches, now).await;
    // The dead letter of valid event `k` (its position in the batch first, for ordering).
    let letter = |k: usize, reason: Reason, detail: String| {
        let (position, entry, _) = events[k];
        (
            position,
            DeadLetter {
                fields: entry.fields.clone().unwrap_or_default(),
                source_id: entry.id.clone(),
                source_stream: stream.to_string(),
                rejection: Rejection::new(reason, detail),
            },
        )
    };

    // Valid events left pending by an outage of one of their instances, and that outage.
    let mut held = vec![false; events.len()];
    let mut held_by: Option<StoreError> = None;
    let mut late = vec![0usize; events.len()];
    let mut late_boards: Vec<Vec<&str>> = vec![Vec::new(); events.len()];
    let mut tally: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
    for (((b, scope), evs), results) in groups.iter().zip(&outcomes) {
        let board = &boards[*b];
        let instance = stream::instance_label(&board.name, scope.as_deref());
        let results = match results {
            Ok(results) => results,
            Err(outage) if outage.is_outage() => {
                warn!(board = %board.name, scope = scope.as_deref(), events = evs.len(), error = %outage, "apply of a board instance met an outage; its events stay pending and are retried");
                for (k, _) in evs {
                    held[*k] = true;
                }
                held_by.get_or_insert_with(|| outage.clone());
                continue;
            }
            Err(failure) => {
                let how = if metrics.is_failing(&board.name, scope.as_deref()) {
                    "again"
                } else {
                    "through every retry"
                };
                metrics.apply_gave_up(&board.name, scope.as_deref(), evs.len());
                for (k, _) in evs {
                    dead.push(letter(
                        *k,
                        Reason::ApplyFailed,
                        format!(
                            "{instance}: apply failed {how}: {failure}; applied to the other boards only"
                        ),
                    ));
                }
                continue;
            }
        };
        let counts = tally.entry(board.name.as_str()).or_default();
        for ((k, _), outcome) in evs.iter().zip(results) {
            match outcome {
                Outcome::Applied => counts[0] += 1,
                Outcome::Duplicate => counts[1] += 1,
                Outcome::Late => {
                    counts[2] += 1;
                    late[*k] += 1;
                    late_boards[*k].push(board.name.as_str());
                }
                Outcome::Overflow => dead.push(letter(
                    *k,
                    Reason::Overflow,
                    format!(
                        "{instance}: the total would pass 2^53-1; applied to the other boards only"
                    ),
                )),
            }
        }
    }
    for (name, [applied, duplicate, late]) in &tally {
        metrics.applied(name, *applied);
        metrics.skipped(name, Skip::Duplicate, *duplicate);
        metrics.skipped(name, Skip::Late, *late);
    }
    for (k, (_, _, event)) in events.iter().enumerate() {
        if !held[k] && late[k] > 0 && late[k] == event.updates.len() {
            dead.push(letter(
                k,
                Reason::Late,
                format!(
                    "ts {} is outside the window of every board it matches ({})",
                    event.ts,
                    late_boards[k].join(", ")
                ),
            ));
        }
    }
    // A held event is dead-lettered (overflow, apply_failed) only once it is applied
    // everywhere else, by the try that acks it: a letter now would be written again then.
    let held_at: HashSet<usize> = events
        .iter()
        .zip(&held)
        .filter(|(_, held)| **held)
        .map(|((position, _, _), _)| *position)
        .collect();
    dead.retain(|(position, _)| !held_at.contains(position));
    dead.sort_by_key(|(position, _)| *position);
    let dead: Vec<DeadLetter> = dead.into_iter().map(|(_, d)| d).collect();

    if !dead.is_empty() {
        stream::dead_letter(store.client(), settings, &dead).await?;
        for d in &dead {
            warn!(source_id = %d.source_id, source_stream = %d.source_stream, reason = %d.rejection.reason, detail = %d.rejection.detail, "event dead-lettered");
            metrics.dead_lettered(d.rejection.reason);
        }
    }
    // Every entry but those of a held event: those stay pending, to be applied later.
    let held_ids: HashSet<&str> = events
        .iter()
        .zip(&held)
        .filter(|(_, held)| **held)
        .map(|((_, entry, _), _)| entry.id.as_str())
        .collect();
    let acked: Vec<&str> = entries
        .iter()
        .map(|e| e.id.as_str())
        .filter(|id| !held_ids.contains(id))
        .collect();
    if !acked.is_empty() {
        // Nothing is acked before enough replicas hold what this batch wrote.
        // (The instances, and the registry of each scope the batch registered; not those
        // that met an outage: they wrote nothing, and their master may be out of reach.)
        let mut written: Vec<String> = groups
            .keys()
            .zip(&outcomes)
            .filter(|(_, outcome)| !outcome.as_ref().is_err_and(StoreError::is_outage))
            .flat_map(|((b, scope), _)| {
                let board = &boards[*b];
                let registry = scope.as_ref().map(|_| store.keys().scopes(&board.name));
                std::iter::once(store.instance(board, scope.as_deref()).meta()).chain(registry)
            })
            .collect();
        if !dead.is_empty() {
            written.push(settings.dead_letter_stream.clone());
        }
        store.confirm_writes(&written).await?;
        stream::ack(store.client(), settings, stream, &acked).await?;
    }
    Ok(Held {
        entries: held_ids.len(),
        acked: acked.len(),
        error: held_by,
    })
}

/// What a batch left pending because an instance it touched met an outage.
#[derive(Debug, Default)]
pub struct Held {
    /// Entries left pending (not acked, not dead-lettered), to be applied later.
    pub entries: usize,
    /// Entries acked.
    pub acked: usize,
    /// The first outage met, when any entry was held.
    pub error: Option<StoreError>,
}

/// Attempts an instance's apply gets when it fails for a reason other than an outage,
/// before its events are dead-lettered (`apply_failed`). An instance that already failed
/// this way gets one attempt per batch until it succeeds again, so a broken board holds
/// the other boards' events back for at most one retry sequence.
pub const APPLY_ATTEMPTS: u32 = 5;
/// Wait before the first retry; doubled for each next one (0.1 + 0.2 + 0.4 + 0.8 s).
const RETRY_DELAY: Duration = Duration::from_millis(100);

/// Applies every instance's share of a batch, concurrently; the outcome of each, in
/// order. An outage ([`StoreError::is_outage`]: Redis unreachable, out of memory, unable
/// to persist, a replica, ...) is returned at once in its instance's place: the caller
/// leaves that instance's events pending, never dead-letters them. Any other failure
/// proves the instance's data wrong; it is retried (see [`APPLY_ATTEMPTS`]) and then
/// returned in the instance's place, for its events to be dead-lettered.
async fn apply_with_retries(
    store: &Store,
    metrics: &Metrics,
    batches: &[(&Board, Option<&str>, Vec<ApplyEvent>)],
    now: i64,
) -> Vec<Result<Vec<Outcome>, StoreError>> {
    let mut results: Vec<Option<Result<Vec<Outcome>, StoreError>>> =
        batches.iter().map(|_| None).collect();
    let mut todo: Vec<usize> = (0..batches.len()).collect();
    let mut delay = RETRY_DELAY;
    for attempt in 1..=APPLY_ATTEMPTS {
        let outs = join_all(todo.iter().map(|&i| {
            let (board, scope, events) = &batches[i];
            store.apply(board, *scope, events, now)
        }))
        .await;
        let mut again = Vec::new();
        for (i, out) in todo.iter().copied().zip(outs) {
            let (board, scope, _) = &batches[i];
            match out {
                Ok(outcomes) => {
                    metrics.apply_ok(&board.name, *scope);
                    results[i] = Some(Ok(outcomes));
                }
                // Not retried here: Redis (or the one master holding this instance) cannot
                // serve it now, and the instance's events stay pending for a later try.
                Err(e) if e.is_outage() => results[i] = Some(Err(e)),
                Err(e) => {
                    metrics.apply_failed(&board.name, *scope, &e);
                    if attempt == APPLY_ATTEMPTS || metrics.is_failing(&board.name, *scope) {
                        results[i] = Some(Err(e));
                    } else {
                        again.push(i);
                    }
                }
            }
        }
        if again.is_empty() {
            break;
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
        todo = again;
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(reply_missing())))
        .collect()
}

fn reply_missing() -> StoreError {
    StoreError::Reply("apply: no attempt was made".into())
}
