//! One batch of stream entries, independent of how it was read, in stages: parse the
//! entries, group the valid events per board instance, apply each instance's share (with
//! retries), settle what the applies said, dead-letter what was refused or invalid, and
//! ack what is settled.
//!
//! An instance that meets an outage keeps only its own events pending ([`Held`]); the rest
//! of the batch is acked.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use futures_util::future::join_all;
use tracing::warn;

use crate::config::IngestSettings;
use crate::domain::board::{period_instance, Board};
use crate::domain::event::{parse_entry, Event, Reason, Rejection};
use crate::ingest::stream::{self, DeadLetter, Entry};
use crate::metrics::{Metrics, Skip};
use crate::store::{ApplyEvent, Outcome, Share, Store, StoreError};

/// A board instance: board index and scope value.
type Instance = (usize, Option<String>);

/// Per board instance, its events in stream order, each with the index of its valid event.
type Groups = BTreeMap<Instance, Vec<(usize, ApplyEvent)>>;

/// What an instance's apply returned: one outcome per event, or why there are none.
type Applied = Result<Vec<Outcome>, StoreError>;

/// A dead letter with the position of its entry in the batch (letters are written in
/// stream order).
type Letter = (usize, DeadLetter);

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
    let batch = Batch {
        store,
        boards,
        settings,
        metrics,
        stream,
    };
    let (events, mut dead) = batch.parse(entries, now);
    let groups = group(&events);
    let outcomes = apply_with_retries(store, metrics, &batch.shares(&groups), now).await;
    let settled = batch.settle(&events, &groups, &outcomes, &mut dead);
    let dead = in_stream_order(dead, &events, &settled.held);
    batch.dead_letter(&dead).await?;
    let applied = (&groups, outcomes.as_slice());
    batch
        .ack(entries, &events, settled, applied, !dead.is_empty())
        .await
}

/// The context every stage of one batch shares.
struct Batch<'a> {
    store: &'a Store,
    boards: &'a [Board],
    settings: &'a IngestSettings,
    metrics: &'a Metrics,
    /// The stream (partition) the batch was read from.
    stream: &'a str,
}

/// A valid event of the batch.
struct Valid<'e> {
    /// Its entry's position in the batch.
    position: usize,
    entry: &'e Entry,
    event: Event,
}

/// What the applies made of the valid events (indexed as they are).
struct Settled<'b> {
    /// Per valid event: left pending by an outage of one of its instances.
    held: Vec<bool>,
    /// The first outage met.
    held_by: Option<StoreError>,
    /// Per valid event: the boards that found it late.
    late: Vec<Vec<&'b str>>,
    /// Per board: events applied, duplicate, late.
    tally: BTreeMap<&'b str, [u64; 3]>,
}

impl<'a> Batch<'a> {
    /// Stage 1: the valid events, and a dead letter for each entry whose event is not.
    /// An entry deleted from the stream while pending is neither: it is acked.
    fn parse<'e>(&self, entries: &'e [Entry], now: i64) -> (Vec<Valid<'e>>, Vec<Letter>) {
        let mut dead = Vec::new();
        let mut events = Vec::new();
        for (position, entry) in entries.iter().enumerate() {
            let Some(fields) = &entry.fields else {
                warn!(id = %entry.id, "pending entry was deleted from the stream; acking it");
                continue;
            };
            match parse_entry(
                fields,
                self.stream,
                &self.settings.stream,
                &entry.id,
                self.boards,
                now,
                self.settings.max_future_ms,
            ) {
                Ok(event) => events.push(Valid {
                    position,
                    entry,
                    event,
                }),
                Err(rejection) => dead.push((
                    position,
                    DeadLetter {
                        fields: fields.clone(),
                        source_id: entry.id.clone(),
                        source_stream: self.stream.to_string(),
                        rejection,
                    },
                )),
            }
        }
        (events, dead)
    }

    /// Each instance's share of the batch, in the order of `groups`.
    fn shares<'g>(&self, groups: &'g Groups) -> Vec<(&'a Board, Option<&'g str>, Vec<ApplyEvent>)> {
        groups
            .iter()
            .map(|((b, scope), evs)| {
                (
                    &self.boards[*b],
                    scope.as_deref(),
                    evs.iter().map(|(_, e)| e.clone()).collect(),
                )
            })
            .collect()
    }

    /// Stage 4: what each instance's apply said, per event: held by an outage, dead-lettered
    /// (the instance failed, or the total would overflow), counted, or late everywhere.
    fn settle(
        &self,
        events: &[Valid],
        groups: &Groups,
        outcomes: &[Applied],
        dead: &mut Vec<Letter>,
    ) -> Settled<'a> {
        let mut settled = Settled {
            held: vec![false; events.len()],
            held_by: None,
            late: vec![Vec::new(); events.len()],
            tally: BTreeMap::new(),
        };
        for (((b, scope), evs), results) in groups.iter().zip(outcomes) {
            let board = &self.boards[*b];
            let scope = scope.as_deref();
            match results {
                Ok(results) => self.count(&mut settled, events, (board, scope), evs, results, dead),
                Err(outage) if outage.is_outage() => {
                    warn!(board = %board.name, scope, events = evs.len(), error = %outage, "apply of a board instance met an outage; its events stay pending and are retried");
                    for (k, _) in evs {
                        settled.held[*k] = true;
                    }
                    settled.held_by.get_or_insert_with(|| outage.clone());
                }
                Err(failure) => self.give_up(events, (board, scope), evs, failure, dead),
            }
        }
        for (name, [applied, duplicate, late]) in &settled.tally {
            self.metrics.applied(name, *applied);
            self.metrics.skipped(name, Skip::Duplicate, *duplicate);
            self.metrics.skipped(name, Skip::Late, *late);
        }
        self.late_everywhere(events, &settled, dead);
        settled
    }

    /// The outcomes of an instance whose apply succeeded: counted per board, late ones
    /// noted per event, overflows dead-lettered.
    fn count(
        &self,
        settled: &mut Settled<'a>,
        events: &[Valid],
        (board, scope): (&'a Board, Option<&str>),
        evs: &[(usize, ApplyEvent)],
        results: &[Outcome],
        dead: &mut Vec<Letter>,
    ) {
        let counts = settled.tally.entry(board.name.as_str()).or_default();
        for ((k, _), outcome) in evs.iter().zip(results) {
            match outcome {
                Outcome::Applied => counts[0] += 1,
                Outcome::Duplicate => counts[1] += 1,
                Outcome::Late => {
                    counts[2] += 1;
                    settled.late[*k].push(board.name.as_str());
                }
                Outcome::Overflow => dead.push(self.letter(
                    &events[*k],
                    Reason::Overflow,
                    format!(
                        "{}: the total would pass 2^53-1; applied to the other boards only",
                        stream::instance_label(&board.name, scope)
                    ),
                )),
            }
        }
    }

    /// An instance whose apply failed for good (not an outage): every event of its share is
    /// dead-lettered for it (`apply_failed`).
    fn give_up(
        &self,
        events: &[Valid],
        (board, scope): (&Board, Option<&str>),
        evs: &[(usize, ApplyEvent)],
        failure: &StoreError,
        dead: &mut Vec<Letter>,
    ) {
        let instance = stream::instance_label(&board.name, scope);
        let how = if self.metrics.is_failing(&board.name, scope) {
            "again"
        } else {
            "through every retry"
        };
        self.metrics.apply_gave_up(&board.name, scope, evs.len());
        for (k, _) in evs {
            dead.push(self.letter(
                &events[*k],
                Reason::ApplyFailed,
                format!(
                    "{instance}: apply failed {how}: {failure}; applied to the other boards only"
                ),
            ));
        }
    }

    /// A dead letter for every event not held that every board it matches found late.
    fn late_everywhere(&self, events: &[Valid], settled: &Settled, dead: &mut Vec<Letter>) {
        for (k, valid) in events.iter().enumerate() {
            let late = &settled.late[k];
            if !settled.held[k] && !late.is_empty() && late.len() == valid.event.updates.len() {
                dead.push(self.letter(
                    valid,
                    Reason::Late,
                    format!(
                        "ts {} is outside the window of every board it matches ({})",
                        valid.event.ts,
                        late.join(", ")
                    ),
                ));
            }
        }
    }

    /// The dead letter of a valid event, refused for `reason`.
    fn letter(&self, valid: &Valid, reason: Reason, detail: String) -> Letter {
        (
            valid.position,
            DeadLetter {
                fields: valid.entry.fields.clone().unwrap_or_default(),
                source_id: valid.entry.id.clone(),
                source_stream: self.stream.to_string(),
                rejection: Rejection::new(reason, detail),
            },
        )
    }

    /// Stage 5: writes the dead letters, then logs and counts each.
    async fn dead_letter(&self, dead: &[DeadLetter]) -> Result<(), StoreError> {
        if dead.is_empty() {
            return Ok(());
        }
        stream::dead_letter(self.store.client(), self.settings, dead).await?;
        for d in dead {
            warn!(source_id = %d.source_id, source_stream = %d.source_stream, reason = %d.rejection.reason, detail = %d.rejection.detail, "event dead-lettered");
            self.metrics.dead_lettered(d.rejection.reason);
        }
        Ok(())
    }

    /// Stage 6: acks every entry but those of a held event (they stay pending, to be applied
    /// later), once enough replicas hold what the batch wrote.
    async fn ack(
        &self,
        entries: &[Entry],
        events: &[Valid<'_>],
        settled: Settled<'_>,
        applied: (&Groups, &[Applied]),
        lettered: bool,
    ) -> Result<Held, StoreError> {
        let held_ids: HashSet<&str> = events
            .iter()
            .zip(&settled.held)
            .filter(|(_, held)| **held)
            .map(|(valid, _)| valid.entry.id.as_str())
            .collect();
        let acked: Vec<&str> = entries
            .iter()
            .map(|e| e.id.as_str())
            .filter(|id| !held_ids.contains(id))
            .collect();
        if !acked.is_empty() {
            let mut written = self.written(applied);
            if lettered {
                written.push(self.settings.dead_letter_stream.clone());
            }
            self.store.confirm_writes(&written).await?;
            stream::ack(self.store.client(), self.settings, self.stream, &acked).await?;
        }
        Ok(Held {
            entries: held_ids.len(),
            acked: acked.len(),
            error: settled.held_by,
        })
    }

    /// The keys whose writes must reach enough replicas before anything is acked: each
    /// instance's `meta`, and the registry of each scope the batch registered; not those
    /// that met an outage (they wrote nothing, and their master may be out of reach).
    fn written(&self, (groups, outcomes): (&Groups, &[Applied])) -> Vec<String> {
        groups
            .iter()
            .zip(outcomes)
            .filter(|(_, outcome)| !outcome.as_ref().is_err_and(StoreError::is_outage))
            .flat_map(|(((b, scope), evs), _)| {
                let board = &self.boards[*b];
                let registry = scope
                    .as_ref()
                    .map(|_| self.store.keys().scopes(&board.name));
                let Some(calendar) = &board.period else {
                    return std::iter::once(
                        self.store
                            .instance(&board.widest(), scope.as_deref())
                            .meta(),
                    )
                    .chain(registry)
                    .collect::<Vec<_>>();
                };
                // A period board's events went to the instance of their period, each
                // registered in the board's instance and period registries.
                let ids: BTreeSet<String> =
                    evs.iter().map(|(_, e)| calendar.span_at(e.ts).id).collect();
                let keys = self.store.keys();
                ids.iter()
                    .map(|id| {
                        let instance = period_instance(scope.as_deref(), id);
                        self.store.instance(&board.widest(), Some(&instance)).meta()
                    })
                    .chain([keys.scopes(&board.name), keys.periods(&board.name)])
                    .collect()
            })
            .collect()
    }
}

/// Stage 2: one share per board instance, events in stream order; each remembers the
/// index of its valid event.
fn group(events: &[Valid]) -> Groups {
    let mut groups = Groups::new();
    for (k, valid) in events.iter().enumerate() {
        for u in &valid.event.updates {
            groups.entry((u.board, u.scope.clone())).or_default().push((
                k,
                ApplyEvent {
                    id: valid.event.id.clone(),
                    ts: valid.event.ts,
                    member: u.member.clone(),
                    amount: u.amount,
                },
            ));
        }
    }
    groups
}

/// The letters to write, in stream order. A held event is dead-lettered (overflow,
/// apply_failed) only once it is applied everywhere else, by the try that acks it: a
/// letter now would be written again then.
fn in_stream_order(mut dead: Vec<Letter>, events: &[Valid], held: &[bool]) -> Vec<DeadLetter> {
    let held_at: HashSet<usize> = events
        .iter()
        .zip(held)
        .filter(|(_, held)| **held)
        .map(|(valid, _)| valid.position)
        .collect();
    dead.retain(|(position, _)| !held_at.contains(position));
    dead.sort_by_key(|(position, _)| *position);
    dead.into_iter().map(|(_, d)| d).collect()
}

/// Stage 3: applies every instance's share of a batch, concurrently; the outcome of each,
/// in order. An outage ([`StoreError::is_outage`]: Redis unreachable, out of memory,
/// unable to persist, a replica, ...) is returned at once in its instance's place: the
/// caller leaves that instance's events pending, never dead-letters them. Any other
/// failure proves the instance's data wrong; it is retried (see [`APPLY_ATTEMPTS`]) and
/// then returned in the instance's place, for its events to be dead-lettered.
async fn apply_with_retries(
    store: &Store,
    metrics: &Metrics,
    batches: &[(&Board, Option<&str>, Vec<ApplyEvent>)],
    now: i64,
) -> Vec<Applied> {
    let mut results: Vec<Option<Applied>> = batches.iter().map(|_| None).collect();
    let mut todo: Vec<usize> = (0..batches.len()).collect();
    let mut delay = RETRY_DELAY;
    for attempt in 1..=APPLY_ATTEMPTS {
        let outs = apply_by_board(store, batches, &todo, now).await;
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

/// Applies the instances `todo` (indices into `batches`), each board's at once (see
/// [`Store::apply_shares`]: its scopes or shards are registered in one round trip), the
/// boards concurrently; one result per index of `todo`, in order.
async fn apply_by_board(
    store: &Store,
    batches: &[(&Board, Option<&str>, Vec<ApplyEvent>)],
    todo: &[usize],
    now: i64,
) -> Vec<Applied> {
    let mut by_board: Vec<(&Board, Vec<usize>)> = Vec::new();
    for &i in todo {
        let board = batches[i].0;
        match by_board.iter_mut().find(|(b, _)| std::ptr::eq(*b, board)) {
            Some((_, of_board)) => of_board.push(i),
            None => by_board.push((board, vec![i])),
        }
    }
    let outs = join_all(by_board.iter().map(|(board, of_board)| {
        let shares: Vec<Share> = of_board
            .iter()
            .map(|&i| (batches[i].1, batches[i].2.as_slice()))
            .collect();
        async move { store.apply_shares(board, &shares, now).await }
    }))
    .await;
    let mut applied: Vec<Option<Applied>> = batches.iter().map(|_| None).collect();
    for ((_, of_board), results) in by_board.iter().zip(outs) {
        for (&i, result) in of_board.iter().zip(results) {
            applied[i] = Some(result);
        }
    }
    todo.iter()
        .map(|&i| applied[i].take().unwrap_or_else(|| Err(reply_missing())))
        .collect()
}

fn reply_missing() -> StoreError {
    StoreError::Reply("apply: no attempt was made".into())
}
