//! The dead-letter stream read back: listing letters and replaying them
//! (`rollboard dead-letters list|replay`).
//!
//! A letter holds the original fields (a field named like one of [`RESERVED`] kept as
//! `orig.<name>`), `reason`, `detail`, `source_id` and `source_stream` (see
//! [`crate::ingest::stream::DeadLetter`]). What a replay may do depends on the reason:
//!
//! * `overflow` and `apply_failed` were judged per board instance: the event was applied to
//!   its other boards and instances, and refused by the one instance the detail names
//!   ([`crate::ingest::stream::refused_by`]). Such a letter is applied to that instance only, so
//!   that the instances that counted it never see it again.
//! * Every other reason refused the event as a whole, before anything was applied. Such a
//!   letter is validated again as the consumer validates an event and applied to every
//!   instance it matches.
//!
//! Either way the event keeps its idempotency key (its `id`, else the key the consumer
//! derived from `source_stream` and `source_id`,
//! [`crate::domain::event::entry_key`]) and its time (its `ts`, else
//! the time of `source_id`), and goes through [`Store::apply`], the consumer's atomic
//! scripts. So a replay that is repeated, or run again after a crash, finds the key
//! remembered and counts nothing twice. A letter is deleted (XDEL) only once an apply took
//! it, or found it already counted, and enough replicas hold that; a letter nothing took
//! stays where it is.

use std::collections::BTreeSet;

use fred::prelude::*;

use crate::config::IngestSettings;
use crate::domain::board::Board;
use crate::domain::event::{parse_entry, Event, Field, Reason, Rejection};
use crate::ingest::stream::{self, instance_label, refused_by, DeadLetter, RESERVED};
use crate::store::{redirected, ApplyEvent, Outcome, Store, StoreError};

/// Letters read from the stream per XRANGE call.
const PAGE: u64 = 100;

/// One entry of the dead-letter stream, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Letter {
    /// The dead-letter entry's own stream ID.
    pub entry_id: String,
    /// The `reason` field as written (see [`Letter::reason`]).
    pub reason: String,
    /// The `detail` field.
    pub detail: String,
    /// The event's stream entry ID (`source_id`).
    pub source_id: String,
    /// The stream (partition) the event was read from; absent in letters written before
    /// partitions existed, which all came from `ingest.stream`.
    pub source_stream: Option<String>,
    /// The board and scope that refused the event, for `overflow` and `apply_failed`.
    pub refused_by: Option<(String, Option<String>)>,
    /// The event's original fields, `orig.<name>` renamed back to `<name>`.
    pub fields: Vec<Field>,
}

impl Letter {
    /// Takes a dead-letter entry apart.
    pub fn from_entry(entry_id: String, entry: Vec<Field>) -> Letter {
        let mut letter = Letter {
            entry_id,
            reason: String::new(),
            detail: String::new(),
            source_id: String::new(),
            source_stream: None,
            refused_by: None,
            fields: Vec::with_capacity(entry.len()),
        };
        for (name, value) in entry {
            let text = || String::from_utf8_lossy(&value).into_owned();
            match name.as_slice() {
                b"reason" => letter.reason = text(),
                b"detail" => letter.detail = text(),
                b"source_id" => letter.source_id = text(),
                b"source_stream" => letter.source_stream = Some(text()),
                _ => {
                    let original = name
                        .strip_prefix(b"orig.")
                        .filter(|n| RESERVED.iter().any(|r| r.as_bytes() == *n))
                        .map(<[u8]>::to_vec);
                    letter.fields.push((original.unwrap_or(name), value));
                }
            }
        }
        if matches!(
            letter.reason(),
            Some(Reason::Overflow | Reason::ApplyFailed)
        ) {
            letter.refused_by = refused_by(&letter.detail);
        }
        letter
    }

    /// The reason, when it is one this version knows.
    pub fn reason(&self) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == self.reason)
    }

    /// Whether the event's fields match `board`: its member, amount and scope fields.
    fn matches(&self, board: &Board) -> bool {
        let has = |name: &str| self.fields.iter().any(|(k, _)| k == name.as_bytes());
        has(&board.member) && has(&board.amount) && board.scope.as_deref().is_none_or(has)
    }
}

/// Which letters a command takes. Every given condition must hold.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only letters with this reason.
    pub reason: Option<Reason>,
    /// Only letters of this board: refused by one of its instances (`overflow`,
    /// `apply_failed`), or whose event matches it (the other reasons).
    pub board: Option<String>,
    /// Only these dead-letter entry IDs (any, when empty).
    pub ids: Vec<String>,
}

impl Selection {
    /// Whether `letter` is selected; `boards` are the configured boards.
    pub fn takes(&self, letter: &Letter, boards: &[Board]) -> bool {
        if self.reason.is_some_and(|r| r.as_str() != letter.reason) {
            return false;
        }
        let Some(name) = &self.board else {
            return true;
        };
        match &letter.refused_by {
            Some((board, _)) => board == name,
            None => boards
                .iter()
                .find(|b| &b.name == name)
                .is_some_and(|b| letter.matches(b)),
        }
    }
}

/// Reads the dead-letter stream page by page, oldest first, up to the newest letter
/// present when it started: letters written meanwhile (a replay may write some) are left
/// to the next run.
pub struct Pages<'a> {
    client: &'a Client,
    stream: &'a str,
    /// Exclusive start of the next page (`None`: the stream's start).
    after: Option<String>,
    /// The last entry to read; `None` once there is nothing more.
    last: Option<String>,
    /// Given entry IDs still to read, instead of a range.
    ids: Option<std::vec::IntoIter<String>>,
}

impl<'a> Pages<'a> {
    /// Pages over `stream` for `selection` (its entry IDs, if any, else everything).
    pub async fn open(
        client: &'a Client,
        stream: &'a str,
        selection: &Selection,
    ) -> Result<Pages<'a>, StoreError> {
        let ids = (!selection.ids.is_empty()).then(|| {
            // In stream order, each once.
            let ordered: BTreeSet<(u64, u64, &String)> = selection
                .ids
                .iter()
                .map(|id| {
                    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
                    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0), id)
                })
                .collect();
            ordered
                .into_iter()
                .map(|(_, _, id)| id.clone())
                .collect::<Vec<_>>()
                .into_iter()
        });
        let newest: Value = redirected(|| client.xrevrange(stream, "+", "-", Some(1))).await?;
        let last = stream::parse_entries(newest)
            .into_iter()
            .next()
            .map(|e| e.id);
        Ok(Pages {
            client,
            stream,
            after: None,
            last,
            ids,
        })
    }

    /// The next page of letters; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Vec<Letter>>, StoreError> {
        let (start, end, count) = if let Some(ids) = &mut self.ids {
            match ids.next() {
                Some(id) => (id.clone(), id, None),
                None => return Ok(None),
            }
        } else {
            let Some(last) = &self.last else {
                return Ok(None);
            };
            let start = match &self.after {
                Some(after) => format!("({after}"),
                None => "-".to_string(),
            };
            (start, last.clone(), Some(PAGE))
        };
        let page: Value = redirected(|| {
            self.client
                .xrange(self.stream, start.as_str(), end.as_str(), count)
        })
        .await?;
        let entries = stream::parse_entries(page);
        if self.ids.is_none() {
            match entries.last() {
                Some(e) if e.id != end && entries.len() as u64 == PAGE => {
                    self.after = Some(e.id.clone())
                }
                _ => self.last = None,
            }
        }
        Ok(Some(
            entries
                .into_iter()
                .map(|e| Letter::from_entry(e.id, e.fields.unwrap_or_default()))
                .collect(),
        ))
    }
}

/// What replaying one letter did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Counted by at least one instance; the letter was deleted.
    Replayed {
        /// The instances that counted it now ([`instance_label`]).
        applied: Vec<String>,
        /// New letters written for the instances that refused it, as the consumer would
        /// have written them: the reason and the instance (`overflow board b`).
        relettered: Vec<String>,
    },
    /// Every instance it went to had counted it already; the letter was deleted.
    Duplicate,
    /// Nothing took it: why. The letter stays.
    Refused(String),
    /// Dry run: the instances it would go to.
    Would(Vec<String>),
}

/// Tally of a replay run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Letters counted now (or, in a dry run, that would be tried).
    pub replayed: u64,
    /// Letters found already counted.
    pub duplicates: u64,
    /// Letters still refused, left in the stream.
    pub refused: u64,
    /// New letters written for instances that refused a replayed event.
    pub relettered: u64,
}

impl Counts {
    /// Adds one letter's outcome.
    pub fn add(&mut self, replay: &Replay) {
        match replay {
            Replay::Replayed { relettered, .. } => {
                self.replayed += 1;
                self.relettered += relettered.len() as u64;
            }
            Replay::Duplicate => self.duplicates += 1,
            Replay::Refused(_) => self.refused += 1,
            Replay::Would(_) => self.replayed += 1,
        }
    }
}

/// One delivery of a letter: an instance it goes to, and the event as the consumer applied
/// it there.
struct Delivery<'b> {
    board: &'b Board,
    scope: Option<String>,
    event: ApplyEvent,
}

impl Delivery<'_> {
    fn label(&self) -> String {
        instance_label(&self.board.name, self.scope.as_deref())
    }
}

/// The one instance (board name, scope) a letter goes to, when only one refused it.
type Only<'l> = Option<(&'l String, &'l Option<String>)>;

/// Replays letters against the configured boards.
pub struct Replayer<'a> {
    store: &'a Store,
    boards: &'a [Board],
    ingest: &'a IngestSettings,
    now: i64,
    dry_run: bool,
    bare_keys: bool,
}

impl<'a> Replayer<'a> {
    /// A replayer applying at time `now` (lateness and `future` are judged against it).
    pub fn new(
        store: &'a Store,
        boards: &'a [Board],
        ingest: &'a IngestSettings,
        now: i64,
    ) -> Self {
        Replayer {
            store,
            boards,
            ingest,
            now,
            dry_run: false,
            bare_keys: false,
        }
    }

    /// Resolve and report, but write nothing.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Key an event without `id` by its bare `source_id` whatever its `source_stream`, as
    /// versions before `<stream>/<entry ID>` keys did on partitions: for letters they wrote.
    pub fn bare_keys(mut self, bare_keys: bool) -> Self {
        self.bare_keys = bare_keys;
        self
    }

    /// The instances `letter` goes to, each with the event as the consumer applied it, or
    /// why it cannot go anywhere.
    fn deliveries(&self, letter: &Letter) -> Result<Vec<Delivery<'a>>, String> {
        let (boards, only) = self.judged_by(letter)?;
        if letter.source_id.is_empty() {
            return Err("the letter has no source_id".into());
        }
        let event = self.parse(letter, boards)?;
        let deliveries: Vec<Delivery> = event
            .updates
            .into_iter()
            .filter(|u| only.is_none_or(|(_, scope)| &u.scope == scope))
            .map(|u| Delivery {
                board: &boards[u.board],
                scope: u.scope,
                event: ApplyEvent {
                    id: event.id.clone(),
                    ts: event.ts,
                    member: u.member,
                    amount: u.amount,
                },
            })
            .collect();
        if let (true, Some((name, scope))) = (deliveries.is_empty(), only) {
            return Err(format!(
                "the event's fields no longer name the instance {}",
                instance_label(name, scope.as_deref())
            ));
        }
        Ok(deliveries)
    }

    /// The boards `letter` is validated for, and the one instance it goes to when a single
    /// instance refused it (`overflow`, `apply_failed`); or why it cannot be replayed.
    fn judged_by<'l>(&self, letter: &'l Letter) -> Result<(&'a [Board], Only<'l>), String> {
        match letter.reason() {
            None => Err(format!("unknown reason {:?}", letter.reason)),
            Some(Reason::Overflow | Reason::ApplyFailed) => {
                let (name, scope) = letter
                    .refused_by
                    .as_ref()
                    .ok_or("its detail names no board instance")?;
                let board = self
                    .boards
                    .iter()
                    .find(|b| &b.name == name)
                    .ok_or_else(|| format!("board {name} is not configured"))?;
                // Validated for the refusing board alone: the others have it already, and
                // may have changed since.
                Ok((std::slice::from_ref(board), Some((name, scope))))
            }
            Some(_) => Ok((self.boards, None)),
        }
    }

    /// The letter's event validated again for `boards`, keyed as the consumer keyed it.
    fn parse(&self, letter: &Letter, boards: &[Board]) -> Result<Event, String> {
        let source_stream = letter
            .source_stream
            .as_deref()
            .unwrap_or(&self.ingest.stream);
        let primary = if self.bare_keys {
            source_stream
        } else {
            &self.ingest.stream
        };
        parse_entry(
            &letter.fields,
            source_stream,
            primary,
            &letter.source_id,
            boards,
            self.now,
            self.ingest.max_future_ms,
        )
        .map_err(|r| r.to_string())
    }

    /// Replays every letter of the dead-letter stream that `selection` takes, oldest first,
    /// up to the newest present at the start; `each` sees every outcome as it happens, and
    /// `counts` tallies them (also when a Redis failure stops the run: the letters not yet
    /// replayed stay, and a new run takes them).
    pub async fn run(
        &self,
        selection: &Selection,
        counts: &mut Counts,
        mut each: impl FnMut(&Letter, &Replay),
    ) -> Result<(), StoreError> {
        let client = self.store.client();
        let mut pages = Pages::open(client, &self.ingest.dead_letter_stream, selection).await?;
        while let Some(page) = pages.next().await? {
            for letter in page {
                if !selection.takes(&letter, self.boards) {
                    continue;
                }
                let replay = self.replay(&letter).await?;
                counts.add(&replay);
                each(&letter, &replay);
            }
        }
        Ok(())
    }

    /// Replays one letter (see the module documentation). Fails only when Redis does
    /// (an outage, or a write that could not be confirmed): the letter then stays, and a
    /// new run finishes it.
    pub async fn replay(&self, letter: &Letter) -> Result<Replay, StoreError> {
        let deliveries = match self.deliveries(letter) {
            Ok(deliveries) => deliveries,
            Err(why) => return Ok(Replay::Refused(why)),
        };
        if self.dry_run {
            return Ok(Replay::Would(
                deliveries.iter().map(Delivery::label).collect(),
            ));
        }
        let mut tried = Tried::default();
        for delivery in &deliveries {
            let outcome = self.apply(delivery).await?;
            if let Some(rejection) = tried.note(delivery, outcome)? {
                tried.letters.push(self.reletter(letter, rejection));
            }
        }
        if tried.taken.is_empty() {
            return Ok(Replay::Refused(tried.refusals.join("; ")));
        }
        self.take(letter, &tried).await?;
        if tried.applied.is_empty() {
            return Ok(Replay::Duplicate);
        }
        Ok(Replay::Replayed {
            applied: tried.applied,
            relettered: tried.relettered,
        })
    }

    /// Applies the letter's event to one instance; an outage is returned as the error
    /// (Redis as a whole is failing: the letter stays for the next run), any other
    /// failure as the outcome.
    async fn apply(
        &self,
        delivery: &Delivery<'_>,
    ) -> Result<Result<Vec<Outcome>, StoreError>, StoreError> {
        let outcome = self
            .store
            .apply(
                delivery.board,
                delivery.scope.as_deref(),
                std::slice::from_ref(&delivery.event),
                self.now,
            )
            .await;
        match outcome {
            Err(e) if e.is_outage() => Err(e),
            outcome => Ok(outcome),
        }
    }

    /// A new letter for the event of `letter`, refused by one instance on replay.
    fn reletter(&self, letter: &Letter, rejection: Rejection) -> DeadLetter {
        DeadLetter {
            fields: letter.fields.clone(),
            source_id: letter.source_id.clone(),
            source_stream: letter
                .source_stream
                .clone()
                .unwrap_or_else(|| self.ingest.stream.clone()),
            rejection,
        }
    }

    /// Settles a letter some instance took: writes the new letters of the instances that
    /// refused it, waits until enough replicas hold all that was written, then deletes it.
    async fn take(&self, letter: &Letter, tried: &Tried<'_, '_>) -> Result<(), StoreError> {
        // As the consumer: the instances that refused the event get letters of their own,
        // written before this one is deleted. A crash in between leaves both; a new run
        // writes the new ones again, and every copy names the event by the same key, so
        // replaying them all still counts it once per instance.
        let mut written: Vec<String> = tried
            .taken
            .iter()
            .flat_map(|d| {
                let registry = d
                    .scope
                    .as_ref()
                    .map(|_| self.store.keys().scopes(&d.board.name));
                std::iter::once(
                    self.store
                        .instance(&d.board.widest(), d.scope.as_deref())
                        .meta(),
                )
                .chain(registry)
            })
            .collect();
        if !tried.letters.is_empty() {
            stream::dead_letter(self.store.client(), self.ingest, &tried.letters).await?;
            written.push(self.ingest.dead_letter_stream.clone());
        }
        self.store.confirm_writes(&written).await?;
        let stream = self.ingest.dead_letter_stream.as_str();
        let _: i64 =
            redirected(|| self.store.client().xdel(stream, letter.entry_id.as_str())).await?;
        Ok(())
    }
}

/// What the instances a letter went to made of it.
#[derive(Default)]
struct Tried<'d, 'b> {
    /// The instances that counted it now.
    applied: Vec<String>,
    /// The instances that counted it, now or before.
    taken: Vec<&'d Delivery<'b>>,
    /// Why each instance that did not count it refused it.
    refusals: Vec<String>,
    /// New letters for the instances that refused it for good.
    letters: Vec<DeadLetter>,
    /// The reason and instance of each new letter (`overflow board b`).
    relettered: Vec<String>,
}

impl<'d, 'b> Tried<'d, 'b> {
    /// Notes what the apply of `delivery` said; the rejection to write a new letter for,
    /// when its instance refused the event as the consumer would have dead-lettered it.
    fn note(
        &mut self,
        delivery: &'d Delivery<'b>,
        outcome: Result<Vec<Outcome>, StoreError>,
    ) -> Result<Option<Rejection>, StoreError> {
        let refused = |reason: Reason, detail: String| {
            (
                format!("{reason}: {detail}"),
                Rejection::new(reason, detail),
            )
        };
        let refusal = match outcome.as_deref() {
            Ok([Outcome::Applied]) => {
                self.applied.push(delivery.label());
                self.taken.push(delivery);
                return Ok(None);
            }
            Ok([Outcome::Duplicate]) => {
                self.taken.push(delivery);
                return Ok(None);
            }
            Ok([Outcome::Late]) => {
                self.refusals.push(format!(
                    "late: ts {} is outside the window of {}",
                    delivery.event.ts,
                    delivery.label()
                ));
                return Ok(None);
            }
            Ok([Outcome::Overflow]) => refused(
                Reason::Overflow,
                format!(
                    "{}: the total would pass 2^53-1; applied to the other boards only",
                    delivery.label()
                ),
            ),
            Ok(other) => {
                return Err(StoreError::Reply(format!(
                    "apply: one outcome expected, got {other:?}"
                )))
            }
            Err(e) => refused(
                Reason::ApplyFailed,
                format!(
                    "{}: apply failed on replay: {e}; applied to the other boards only",
                    delivery.label()
                ),
            ),
        };
        self.refusals.push(refusal.0);
        self.relettered
            .push(format!("{} {}", refusal.1.reason, delivery.label()));
        Ok(Some(refusal.1))
    }
}

/// Whether `id` is a stream entry ID as XRANGE takes it: `<ms>-<seq>` or `<ms>`.
pub fn is_entry_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('-') {
        Some((ms, seq)) => digits(ms) && digits(seq),
        None => digits(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::board::{Dedup, Mode, TieBreak};

    fn board(name: &str, member: &str, scope: Option<&str>) -> Board {
        Board {
            name: name.into(),
            member: member.into(),
            scope: scope.map(Into::into),
            amount: "amount".into(),
            scale: 0,
            window_ms: 7 * 86_400_000,
            windows: Vec::new(),
            slice_ms: 3_600_000,
            mode: Mode::Incremental,
            tie_break: TieBreak::Earliest,
            allow_negative: false,
            dense_rank: false,
            changes: None,
            dedup: Dedup::Window,
            period: None,
            shards: 1,
        }
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<Field> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_letter_reads_back_as_written() {
        let written = DeadLetter {
            fields: fields(&[("user", "u1"), ("room", "r\"1"), ("detail", "mine")]),
            source_id: "17-3".into(),
            source_stream: "rb:events:{2}".into(),
            rejection: Rejection::new(
                Reason::Overflow,
                format!(
                    "{}: the total would pass 2^53-1",
                    instance_label("fans", Some("r\"1"))
                ),
            ),
        };
        let letter = Letter::from_entry("20-0".into(), written.entry());
        assert_eq!(letter.reason(), Some(Reason::Overflow));
        assert_eq!(letter.source_id, "17-3");
        assert_eq!(letter.source_stream.as_deref(), Some("rb:events:{2}"));
        assert_eq!(
            letter.refused_by,
            Some(("fans".to_string(), Some("r\"1".to_string())))
        );
        assert_eq!(letter.fields, written.fields, "orig.detail is renamed back");
    }

    #[test]
    fn only_instance_reasons_name_a_refusing_instance() {
        let letter = Letter::from_entry(
            "1-0".into(),
            fields(&[
                ("room", "r1"),
                ("reason", "amount"),
                ("detail", "board rooms: looks like a name"),
                ("source_id", "1-0"),
            ]),
        );
        assert_eq!(letter.refused_by, None);
        assert_eq!(letter.source_stream, None);
    }

    #[test]
    fn selection_by_board_takes_the_refusing_board_or_the_matched_one() {
        let boards = vec![
            board("rooms", "room", None),
            board("fans", "user", Some("room")),
        ];
        let overflow = Letter::from_entry(
            "1-0".into(),
            fields(&[
                ("room", "r1"),
                ("user", "u1"),
                ("amount", "5"),
                ("reason", "overflow"),
                ("detail", "board rooms: the total would pass 2^53-1"),
                ("source_id", "1-0"),
            ]),
        );
        let late = Letter::from_entry(
            "2-0".into(),
            fields(&[
                ("room", "r1"),
                ("amount", "5"),
                ("reason", "late"),
                ("detail", "ts 1 is outside the window"),
                ("source_id", "1-0"),
            ]),
        );
        let by = |board: &str| Selection {
            board: Some(board.into()),
            ..Selection::default()
        };
        assert!(by("rooms").takes(&overflow, &boards));
        assert!(!by("fans").takes(&overflow, &boards), "fans counted it");
        assert!(by("rooms").takes(&late, &boards));
        assert!(!by("fans").takes(&late, &boards), "no user field");
        assert!(!by("nope").takes(&late, &boards));
        let late_only = Selection {
            reason: Some(Reason::Late),
            ..Selection::default()
        };
        assert!(late_only.takes(&late, &boards));
        assert!(!late_only.takes(&overflow, &boards));
    }

    #[test]
    fn entry_ids_are_checked_before_redis_sees_them() {
        for good in ["1-0", "1764000000000-12", "17"] {
            assert!(is_entry_id(good), "{good}");
        }
        for bad in ["", "-", "1-", "-1", "a-1", "1-0-0", "+", "(1-0"] {
            assert!(!is_entry_id(bad), "{bad}");
        }
    }
}
