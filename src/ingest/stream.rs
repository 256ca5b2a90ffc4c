//! The stream commands of ingest: append (intake), read, ack, claim and dead-letter
//! (consumer), trimming, and the consumer group's state. Which partition an event goes to
//! is [`crate::domain::partition`]'s rule.
//!
//! # Bounded streams
//!
//! The consumer trims every stream it reads ([`trim`]) to what every consumer group on it
//! still needs plus `ingest.retain` of acked history, and every dead letter is appended with
//! `MAXLEN ~ ingest.dead_letter_max_len` ([`dead_letter`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::{join_all, try_join_all};
use tracing::info;

use crate::config::IngestSettings;
use crate::domain::board::Board;
use crate::domain::event::{field, fresh_id, Field, Rejection};
use crate::domain::limits::{per_request, MAX_LETTER_FIELDS, MAX_REQUEST_ARGS};
use crate::domain::partition::{partition_key, partition_keys, partition_of};
use crate::store::{redirected, Store, StoreError, TRANSACTION_REDIRECTED};

/// Dead-letter field names that original fields must not overwrite (an original field of
/// one of these names is kept as `orig.<name>`).
pub const RESERVED: [&str; 4] = ["reason", "detail", "source_id", "source_stream"];

/// How long a read waits for the stream reader to (re)connect before the step fails.
const READER_CONNECT_WAIT: Duration = Duration::from_secs(5);
/// How long past its block timeout a read waits for its reply before it counts as lost.
const READ_REPLY_GRACE: Duration = Duration::from_secs(5);

/// The configured partitions' stream keys.
pub fn keys(settings: &IngestSettings) -> Vec<String> {
    partition_keys(&settings.stream, settings.partitions)
}

/// The Redis user's missing permissions for the boards, every partition and the
/// dead-letter stream (see `Store::check_permissions`).
///
/// One probe per board (and one per further partition): a probe's script call carries
/// several hundred arguments for each board it checks, so checking every board in one
/// would pass [`MAX_REQUEST_ARGS`] with a handful of boards; one board's stays within it
/// whatever the number of boards.
pub async fn check_permissions(
    store: &Store,
    boards: &[Board],
    settings: &IngestSettings,
) -> Result<Vec<String>, StoreError> {
    let mut denied = Vec::new();
    for (i, key) in keys(settings).iter().enumerate() {
        let each: Vec<&[Board]> = match boards {
            [_, ..] if i == 0 => boards.chunks(1).collect(),
            _ => vec![&[]],
        };
        for boards in each {
            for d in store
                .check_permissions(boards, key, &settings.dead_letter_stream)
                .await?
            {
                if !denied.contains(&d) {
                    denied.push(d);
                }
            }
        }
    }
    Ok(denied)
}

/// Whether `key` holds entries the group has not finished: it exists and the group is
/// missing there, has entries pending, or has not been delivered everything (lag not 0).
pub async fn holds_work(client: &Client, key: &str, group: &str) -> Result<bool, StoreError> {
    let exists: i64 = client.exists(key).await?;
    if exists == 0 {
        return Ok(false);
    }
    Ok(match group_info(client, key, group).await? {
        None => true,
        Some((pending, lag)) => pending > 0 || lag != Some(0),
    })
}

/// One stream entry; `fields` is `None` for an entry deleted while it was pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Stream entry ID.
    pub id: String,
    /// The entry's fields.
    pub fields: Option<Vec<Field>>,
}

/// An event on its way to the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The original fields.
    pub fields: Vec<Field>,
    /// The original stream entry ID.
    pub source_id: String,
    /// The stream (partition) the event was read from.
    pub source_stream: String,
    /// Why it was refused.
    pub rejection: Rejection,
}

impl DeadLetter {
    /// The dead-letter entry: original fields flat (renamed `orig.<name>` where they collide
    /// with `reason`, `detail`, `source_id` or `source_stream`), then those four. An entry
    /// of more than [`MAX_LETTER_FIELDS`] fields (only one added to the stream by hand can
    /// be) keeps its first ones, so that the letter is one request within
    /// [`MAX_REQUEST_ARGS`]; its `detail` then says how many it kept.
    pub fn entry(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let kept = self.fields.len().min(MAX_LETTER_FIELDS);
        let mut detail = self.rejection.detail.clone();
        if kept < self.fields.len() {
            detail.push_str(&format!(
                " (this letter keeps the first {kept} of the entry's {} fields: a request to \
                 Redis holds at most {MAX_REQUEST_ARGS} arguments)",
                self.fields.len()
            ));
        }
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = self.fields[..kept]
            .iter()
            .map(|(k, v)| {
                let name = if RESERVED.iter().any(|r| r.as_bytes() == k.as_slice()) {
                    [b"orig.".as_slice(), k].concat()
                } else {
                    k.clone()
                };
                (name, v.clone())
            })
            .collect();
        out.push((
            b"reason".to_vec(),
            self.rejection.reason.as_str().as_bytes().to_vec(),
        ));
        out.push((b"detail".to_vec(), detail.into_bytes()));
        out.push((b"source_id".to_vec(), self.source_id.as_bytes().to_vec()));
        out.push((
            b"source_stream".to_vec(),
            self.source_stream.as_bytes().to_vec(),
        ));
        out
    }
}

/// How the detail of a letter refused by one board instance (`overflow`, `apply_failed`)
/// begins: `board <name>`, then ` (scope "<value>")` for a scoped board, the value quoted
/// as Rust's `{:?}` writes it. [`refused_by`] reads it back, so that a replay goes to that
/// instance only.
pub fn instance_label(board: &str, scope: Option<&str>) -> String {
    match scope {
        Some(scope) => format!("board {board} (scope {scope:?})"),
        None => format!("board {board}"),
    }
}

/// The board instance a detail that begins with [`instance_label`] and `: ` names.
pub fn refused_by(detail: &str) -> Option<(String, Option<String>)> {
    let rest = detail.strip_prefix("board ")?;
    // Board names are `[a-z0-9_-]`, so the name ends at the first space or colon.
    let end = rest.find([' ', ':'])?;
    let (board, rest) = rest.split_at(end);
    if board.is_empty() {
        return None;
    }
    if rest.starts_with(": ") {
        return Some((board.to_string(), None));
    }
    let (scope, rest) = unquote(rest.strip_prefix(" (scope ")?)?;
    rest.starts_with("): ")
        .then(|| (board.to_string(), Some(scope)))
}

/// Reads back a string written with `{:?}` at the start of `text`; returns it and the
/// text after its closing quote. Undoes every escape `str`'s `Debug` writes: `\0`, `\t`,
/// `\r`, `\n`, `\\`, `\"`, `\'` and `\u{hex}`.
fn unquote(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('"')?.chars();
    let mut out = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some((out, chars.as_str())),
            '\\' => match chars.next()? {
                '0' => out.push('\0'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'n' => out.push('\n'),
                c @ ('\\' | '"' | '\'') => out.push(c),
                'u' => {
                    let rest = chars.as_str().strip_prefix('{')?;
                    let (hex, after) = rest.split_once('}')?;
                    out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
                    chars = after.chars();
                }
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}

fn bytes(v: Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Bytes(b) => b.to_vec(),
        Value::Integer(i) => i.to_string().into_bytes(),
        Value::Double(d) => d.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        _ => Vec::new(),
    }
}

/// Parses a list of `[id, [field, value, ...] | nil]` entries.
pub fn parse_entries(v: Value) -> Vec<Entry> {
    array(v)
        .into_iter()
        .filter_map(|e| {
            let mut parts = array(e).into_iter();
            let id = text(parts.next()?)?;
            let fields = match parts.next() {
                Some(Value::Array(flat)) => {
                    let mut it = flat.into_iter();
                    let mut fields = Vec::new();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        fields.push((bytes(k), bytes(v)));
                    }
                    Some(fields)
                }
                _ => None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

/// Parses an XREADGROUP reply for one stream (nil on timeout).
fn parse_read(v: Value) -> Vec<Entry> {
    array(v)
        .into_iter()
        .flat_map(|stream| {
            let mut parts = array(stream).into_iter();
            let _name = parts.next();
            parts.next().map(parse_entries).unwrap_or_default()
        })
        .collect()
}

/// Appends validated events in one MULTI/EXEC per partition: all of a partition's events
/// or, when Redis refuses any (e.g. out of memory, detected while queueing), none of them.
/// With one partition that is all of them or none; with several, the transactions of the
/// other partitions may have been appended when one fails (a retry is safe: every event
/// has its `id` by then, see below). Callers bound the number of events (a request, a
/// `send` batch).
///
/// An event without an `id` field is appended with a fresh one ([`fresh_id`]), given before
/// the transaction is built: the client retries the whole transaction when the connection
/// drops before EXEC's reply arrives, and the retry then appends the same ids again, which
/// the consumer skips as duplicates instead of counting the money twice. The id also
/// chooses the partition ([`partition_of`]). Returns the stream keys appended to.
pub async fn append(
    client: &Client,
    settings: &IngestSettings,
    events: &[Vec<Field>],
) -> Result<Vec<String>, fred::error::Error> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    // A cluster client routes a transaction by its slot, which it knows only once connected
    // (a daemon's pool may still be connecting); a plain client queues commands meanwhile.
    if client.is_clustered() && client.cached_cluster_state().is_none() {
        client.wait_for_connect().await?;
    }
    let partitions = settings.partitions.max(1);
    // Each partition's events in input order, with the id given to those without one.
    type Batch<'a> = Vec<(&'a [Field], Option<String>)>;
    let mut by_partition: BTreeMap<usize, Batch> = BTreeMap::new();
    for fields in events {
        let id = fresh_id(fields);
        let partition = match (&id, field(fields, "id")) {
            (Some(id), _) => partition_of(id.as_bytes(), partitions),
            (None, Some(id)) => partition_of(id, partitions),
            (None, None) => 0,
        };
        by_partition
            .entry(partition)
            .or_default()
            .push((fields.as_slice(), id));
    }
    let outcomes = join_all(by_partition.into_iter().map(|(partition, events)| {
        let stream = partition_key(&settings.stream, partitions, partition);
        async move {
            append_partition(client, &stream, &events).await?;
            Ok::<String, fred::error::Error>(stream)
        }
    }))
    .await;
    outcomes.into_iter().collect()
}

/// One partition's MULTI/EXEC of `events` on `stream`, tried again while Redis redirects
/// it (a redirected transaction ran nothing: Redis aborts it at EXEC).
///
/// The transaction follows no redirection, like every other call (see `Store::connect`):
/// * fred follows a MOVED in a transaction by reconnecting every connection of the client,
///   which a client without a reconnect policy (`rollboard send`) cannot do: its routing
///   task stops and the client is dead. Instead the slot map is re-read here and the
///   transaction tried again, on the new owner.
/// * an ASK (the slot is moving and the stream is already on the target) followed would put
///   the events on the target while the client's slot map still names the source, where
///   [`crate::store::Store::confirm_writes`] then waits for replicas of the wrong master.
///   The transaction is tried again after short pauses instead, like any redirected call
///   ([`crate::store::redirected`]: the stream's slot is handed over right after its few
///   keys have moved); still redirected, it fails as an outage.
async fn append_partition(
    client: &Client,
    stream: &str,
    events: &[(&[Field], Option<String>)],
) -> Result<(), fred::error::Error> {
    redirected(|| async {
        let tx = client.multi();
        let once = tx.with_options(&Options {
            max_redirections: Some(0),
            ..Options::default()
        });
        for (fields, id) in events {
            let pairs: Vec<(&[u8], &[u8])> = fields
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .chain(id.as_deref().map(|id| (b"id".as_slice(), id.as_bytes())))
                .collect();
            let _: () = once.xadd(stream, false, None, "*", pairs).await?;
        }
        let done = tx.exec::<Value>(true).await;
        if let Err(e) = &done {
            if e.details().starts_with(TRANSACTION_REDIRECTED) {
                client.sync_cluster().await?;
            }
        }
        done.map(drop)
    })
    .await
}

/// Creates the consumer group at ID 0 with MKSTREAM unless it exists (an existing group is
/// used as it is).
pub async fn ensure_group(client: &Client, stream: &str, group: &str) -> Result<(), StoreError> {
    let created: Result<Value, _> = client
        .custom(
            CustomCommand::new_static(
                "XGROUP",
                ClusterHash::Custom(fred::util::redis_keyslot(stream.as_bytes())),
                false,
            ),
            vec!["CREATE", stream, group, "0", "MKSTREAM"],
        )
        .await;
    match created {
        Ok(_) => {
            info!(stream, group, "consumer group created");
            Ok(())
        }
        Err(e) if e.details().contains("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads up to `ingest.batch_size` entries of `stream` for this consumer with
/// XREADGROUP: `id` `>` for new entries (blocking up to `block` ms), `0` (or the last
/// entry of the previous batch) for this consumer's own pending ones, in stream order.
///
/// The batch is read in calls of at most `read_piece` entries, back to back on the
/// reader: the first may block, the next ones do not and go on after the last entry of
/// the one before; a call that brings fewer than it asked for ends the batch. A call that
/// fails fails the read: the entries of the calls before it are pending for this consumer
/// (as those of a lost reply) and the consumer re-reads its own pending entries next.
///
/// The reader sends each command once: a read queued while it is still connecting can be
/// lost with that one attempt and never answered. So the read waits for the connection
/// first (nothing is sent yet, so giving up is safe), and bounds the wait for the reply: a
/// lost one surfaces as an error, after which the consumer re-reads its own pending
/// entries.
pub async fn read(
    reader: &Client,
    settings: &IngestSettings,
    stream: &str,
    id: &str,
    block: Option<u64>,
) -> Result<Vec<Entry>, StoreError> {
    if !reader.is_connected() {
        tokio::select! {
            connected = reader.wait_for_connect() => connected?,
            _ = tokio::time::sleep(READER_CONNECT_WAIT) => {
                return Err(StoreError::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::IO,
                    "the stream reader is not connected to redis",
                )));
            }
        }
    }
    let mut entries: Vec<Entry> = Vec::new();
    let mut block = block;
    while entries.len() < settings.batch_size {
        let want = (settings.batch_size - entries.len()).min(settings.read_piece.max(1));
        // New entries: `>` again delivers those after the last one delivered. Own pending
        // ones: from after the last entry read so far.
        let from = match entries.last() {
            Some(last) if id != ">" => last.id.as_str(),
            _ => id,
        };
        let piece = read_piece(reader, settings, stream, from, block, want).await?;
        let full = piece.len() >= want;
        entries.extend(piece);
        if !full {
            break;
        }
        block = None;
    }
    Ok(entries)
}

/// One XREADGROUP call of [`read`]: up to `count` entries after `id`.
async fn read_piece(
    reader: &Client,
    settings: &IngestSettings,
    stream: &str,
    id: &str,
    block: Option<u64>,
    count: usize,
) -> Result<Vec<Entry>, StoreError> {
    let options = Options {
        timeout: Some(Duration::from_millis(block.unwrap_or(0)) + READ_REPLY_GRACE),
        ..Options::default()
    };
    let v: Value = reader
        .with_options(&options)
        .xreadgroup(
            settings.group.as_str(),
            settings.consumer.as_str(),
            Some(count as u64),
            block,
            false,
            stream,
            id,
        )
        .await?;
    Ok(parse_read(v))
}

/// One XAUTOCLAIM call on `stream` from `start`: up to `count` (at most `claim_piece`)
/// entries idle for `claim_idle` in any consumer's pending list become this consumer's.
/// Returns the cursor to continue from (`0-0` when the pending list was scanned to its
/// end) and the claimed entries.
pub async fn claim(
    client: &Client,
    settings: &IngestSettings,
    stream: &str,
    start: &str,
    count: usize,
) -> Result<(String, Vec<Entry>), StoreError> {
    let v: Value = client
        .custom(
            CustomCommand::new_static("XAUTOCLAIM", ClusterHash::FirstKey, false),
            vec![
                Value::from(stream),
                settings.group.as_str().into(),
                settings.consumer.as_str().into(),
                (settings.claim_idle.as_millis() as i64).into(),
                start.into(),
                "COUNT".into(),
                (count.min(settings.claim_piece).max(1) as i64).into(),
            ],
        )
        .await?;
    let mut parts = array(v).into_iter();
    let next = parts.next().and_then(text).unwrap_or_else(|| "0-0".into());
    let entries = parts.next().map(parse_entries).unwrap_or_default();
    Ok((next, entries))
}

/// Appends dead letters to `ingest.dead_letter_stream`, one entry each, each append
/// trimming the stream to about `ingest.dead_letter_max_len` entries (`MAXLEN ~`: Redis
/// drops only whole nodes of the oldest letters, so the stream can hold up to one node,
/// `stream-node-max-entries` (100), more than the cap).
pub async fn dead_letter(
    client: &Client,
    settings: &IngestSettings,
    letters: &[DeadLetter],
) -> Result<(), StoreError> {
    try_join_all(letters.iter().map(|d| async move {
        let entry = d.entry();
        let pairs: Vec<(&[u8], &[u8])> = entry
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let _: Value = client
            .xadd(
                settings.dead_letter_stream.as_str(),
                false,
                ("MAXLEN", "~", settings.dead_letter_max_len as i64),
                "*",
                pairs,
            )
            .await?;
        Ok::<(), fred::error::Error>(())
    }))
    .await?;
    Ok(())
}

/// Most ids one `XACK` call takes: Redis's time for an ack grows with its ids (~0.3 ms for
/// 500 on the reference machine), so a batch of `ingest.batch_size` is acked in calls of
/// this many, sent at once.
pub const ACK_PIECE: usize = 500;

// `XACK`, the stream and the group, then the ids.
const _: () = assert!(ACK_PIECE <= per_request(3, 1));

/// Acknowledges entries of `stream` for the group (XACK, in calls of [`ACK_PIECE`] ids).
/// An entry whose ack failed stays pending and is applied again (as a duplicate) later.
pub async fn ack(
    client: &Client,
    settings: &IngestSettings,
    stream: &str,
    ids: &[&str],
) -> Result<(), StoreError> {
    futures_util::future::try_join_all(ids.chunks(ACK_PIECE).map(|piece| async move {
        let _: i64 = client
            .xack(stream, settings.group.as_str(), piece.to_vec())
            .await?;
        Ok::<_, StoreError>(())
    }))
    .await?;
    Ok(())
}

/// The group's pending count and lag on `stream` from XINFO GROUPS (lag is absent before
/// Redis 7).
pub async fn group_info(
    client: &Client,
    stream: &str,
    group: &str,
) -> Result<Option<(i64, Option<i64>)>, StoreError> {
    let v: Value = client.xinfo_groups(stream).await?;
    for g in array(v) {
        let mut it = array(g).into_iter();
        let mut name = None;
        let (mut pending, mut lag) = (0, None);
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            match text(k).as_deref() {
                Some("name") => name = text(v),
                Some("pending") => pending = v.as_i64().unwrap_or(0),
                Some("lag") => lag = v.as_i64(),
                _ => {}
            }
        }
        if name.as_deref() == Some(group) {
            return Ok(Some((pending, lag)));
        }
    }
    Ok(None)
}

/// A stream entry ID, `<ms>-<seq>`, ordered the way Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId {
    /// The milliseconds part.
    pub ms: u64,
    /// The sequence number within the millisecond.
    pub seq: u64,
}

impl StreamId {
    /// Reads `<ms>-<seq>` as Redis writes it.
    pub fn parse(text: &str) -> Option<StreamId> {
        let (ms, seq) = text.split_once('-')?;
        Some(StreamId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The smallest ID above this one (`None` above the largest ID there is).
    pub fn next(self) -> Option<StreamId> {
        match self.seq.checked_add(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => self.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What one consumer group on a stream still needs: every entry above its
/// `last-delivered-id` (unread) and every entry from its first pending one on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNeeds {
    /// The group's name.
    pub name: String,
    /// The group's `last-delivered-id` (XINFO GROUPS).
    pub last_delivered: StreamId,
    /// The smallest ID in the group's pending list (XPENDING), if any.
    pub first_pending: Option<StreamId>,
}

/// The lowest entry ID some group still needs: below it every group has read and acked
/// everything. `None` when the stream has no group (nothing is known to be read).
pub fn safe_minid(groups: &[GroupNeeds]) -> Option<StreamId> {
    groups
        .iter()
        .map(|g| {
            // Above the largest ID there is nothing unread, so the last one is kept.
            let unread = g.last_delivered.next().unwrap_or(g.last_delivered);
            g.first_pending.map_or(unread, |p| p.min(unread))
        })
        .min()
}

/// The `MINID` of a trim: `safe`, lowered so that entries younger than `retain` (by
/// Redis's clock `now_ms`, which also stamped the IDs) stay. Never above `safe`.
pub fn trim_bound(safe: StreamId, now_ms: i64, retain: Duration) -> StreamId {
    let cutoff = now_ms.saturating_sub(retain.as_millis() as i64).max(0) as u64;
    safe.min(StreamId { ms: cutoff, seq: 0 })
}

/// One trim of an intake stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    /// The `MINID` sent: entries below it may have been removed.
    pub minid: StreamId,
    /// Entries removed (whole nodes only, as `~` trims).
    pub removed: u64,
}

/// Every consumer group's needs on `stream`: XINFO GROUPS, then XPENDING per group.
///
/// The order is what makes the result safe to trim by at any later time. A consumer may
/// read, ack or claim between these reads and the trim; but `last-delivered-id` only grows,
/// so entries delivered after XINFO GROUPS (pending then, or unread later) have IDs above
/// the `last-delivered-id` read here, and entries pending at the trim were either pending
/// at XPENDING (not below its smallest) or delivered after it. The other order would miss
/// entries delivered between the two reads. (`XGROUP SETID` moving a group back is an
/// operator's rewind, which no trim can undo; see the README.)
pub async fn group_needs(client: &Client, stream: &str) -> Result<Vec<GroupNeeds>, StoreError> {
    let v: Value = client.xinfo_groups(stream).await?;
    let mut delivered = Vec::new();
    for g in array(v) {
        let mut it = array(g).into_iter();
        let (mut name, mut last) = (None, None);
        // `entries-read` and `lag` may be nil (Redis cannot always tell); the
        // `last-delivered-id` is always there, and it is all a trim needs.
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            match text(k).as_deref() {
                Some("name") => name = text(v),
                Some("last-delivered-id") => last = text(v).as_deref().and_then(StreamId::parse),
                _ => {}
            }
        }
        match (name, last) {
            (Some(name), Some(last)) => delivered.push((name, last)),
            _ => {
                return Err(StoreError::Reply(
                    "XINFO GROUPS: a group without name or last-delivered-id".into(),
                ))
            }
        }
    }
    try_join_all(
        delivered
            .into_iter()
            .map(|(name, last_delivered)| async move {
                let v: Value = client.xpending(stream, name.as_str(), ()).await?;
                // [count, smallest ID, largest ID, consumers]; the IDs are nil when none is pending.
                let first_pending = array(v).into_iter().nth(1).and_then(text);
                Ok::<GroupNeeds, StoreError>(GroupNeeds {
                    first_pending: first_pending.as_deref().and_then(StreamId::parse),
                    name,
                    last_delivered,
                })
            }),
    )
    .await
}

/// Trims `stream` to what every consumer group on it still needs plus `retain` of acked
/// history ([`group_needs`], [`safe_minid`], [`trim_bound`]): `XTRIM MINID ~`, which
/// removes only whole nodes below the bound, so it trims less, never more. Nothing is
/// trimmed while `group` (rollboard's) is missing: its entries are all unread.
///
/// Several replicas may trim the same stream at once: each bound is one some group state
/// allowed, and a trim never removes anything at or above its bound.
pub async fn trim(
    client: &Client,
    stream: &str,
    group: &str,
    now_ms: i64,
    retain: Duration,
) -> Result<Option<Trimmed>, StoreError> {
    let needs = group_needs(client, stream).await?;
    if !needs.iter().any(|g| g.name == group) {
        return Ok(None);
    }
    let Some(safe) = safe_minid(&needs) else {
        return Ok(None);
    };
    let minid = trim_bound(safe, now_ms, retain);
    let removed: i64 = client
        .xtrim(stream, ("MINID", "~", minid.to_string()))
        .await?;
    Ok(Some(Trimmed {
        minid,
        removed: removed.max(0) as u64,
    }))
}

/// The number of entries in `stream` (0 when it does not exist).
pub async fn length(client: &Client, stream: &str) -> Result<i64, StoreError> {
    Ok(client.xlen(stream).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Reason;

    #[test]
    fn dead_letters_keep_fields_flat_and_rename_collisions() {
        let d = DeadLetter {
            fields: vec![
                (b"room".to_vec(), b"r1".to_vec()),
                (b"reason".to_vec(), b"gift".to_vec()),
            ],
            source_id: "1-0".into(),
            source_stream: "rb:events".into(),
            rejection: Rejection::new(Reason::Amount, "bad"),
        };
        let names: Vec<String> = d
            .entry()
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "room",
                "orig.reason",
                "reason",
                "detail",
                "source_id",
                "source_stream"
            ]
        );
        assert_eq!(d.entry()[2].1, b"amount");
        assert_eq!(d.entry()[5].1, b"rb:events");
    }

    /// A letter of an entry with more fields than one request can carry keeps the first
    /// ones, says so in its detail, and is one `XADD … MAXLEN ~ n *` within the cap.
    #[test]
    fn a_letter_of_too_many_fields_keeps_what_one_request_holds() {
        let fields: Vec<Field> = (0..2_500)
            .map(|i| (format!("f{i}").into_bytes(), b"v".to_vec()))
            .collect();
        let mut d = DeadLetter {
            fields,
            source_id: "1-0".into(),
            source_stream: "rb:events".into(),
            rejection: Rejection::new(Reason::NoBoard, "the event matches no board"),
        };
        let entry = d.entry();
        assert_eq!(entry.len(), MAX_LETTER_FIELDS + 4);
        assert!(6 + 2 * entry.len() <= MAX_REQUEST_ARGS);
        assert_eq!(entry[MAX_LETTER_FIELDS - 1].0, b"f1991");
        let detail = String::from_utf8_lossy(&entry[MAX_LETTER_FIELDS + 1].1).into_owned();
        assert!(
            detail.starts_with("the event matches no board (this letter keeps the first 1992 of the entry's 2500 fields"),
            "{detail}"
        );
        // An entry that fits keeps every field and its detail as it was.
        d.fields.truncate(MAX_LETTER_FIELDS);
        let entry = d.entry();
        assert_eq!(entry.len(), MAX_LETTER_FIELDS + 4);
        assert_eq!(
            entry[MAX_LETTER_FIELDS + 1].1,
            b"the event matches no board"
        );
    }

    #[test]
    fn the_instance_named_in_a_detail_reads_back() {
        let scopes = [
            "r1",
            "with \"quotes\" and \\ backslash",
            "): board x: ",
            "名前 e\u{301} \u{200b}\u{fe0f} \u{10ffff}",
            "'",
            "\u{301}leading combining mark",
        ];
        for scope in scopes {
            let detail = format!(
                "{}: the total would pass 2^53-1",
                instance_label("fans_7d", Some(scope))
            );
            assert_eq!(
                refused_by(&detail),
                Some(("fans_7d".to_string(), Some(scope.to_string()))),
                "{detail}"
            );
        }
        assert_eq!(
            refused_by("board rooms_7d: apply failed"),
            Some(("rooms_7d".to_string(), None))
        );
        for other in [
            "the event matches no board",
            "board : x",
            "board fans (scope \"r1\": x",
            "board fans (scope \"r1): x",
            "board fans (scope \"\\q\"): x",
            "board rooms_7d",
        ] {
            assert_eq!(refused_by(other), None, "{other}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_scope_reads_back_from_its_detail(scope in proptest::prelude::any::<String>()) {
            let detail = format!("{}: applied to the other boards only", instance_label("b", Some(&scope)));
            proptest::prop_assert_eq!(refused_by(&detail), Some(("b".to_string(), Some(scope))));
        }
    }

    #[test]
    fn stream_replies_parse() {
        let v = Value::Array(vec![Value::Array(vec![
            Value::from("s"),
            Value::Array(vec![
                Value::Array(vec![
                    Value::from("1-0"),
                    Value::Array(vec![Value::from("a"), Value::from("1")]),
                ]),
                Value::Array(vec![Value::from("2-0"), Value::Null]),
            ]),
        ])]);
        let entries = parse_read(v);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0].fields,
            Some(vec![(b"a".to_vec(), b"1".to_vec())])
        );
        assert_eq!(entries[1].fields, None);
        assert!(parse_read(Value::Null).is_empty());
    }

    fn id(text: &str) -> StreamId {
        StreamId::parse(text).expect("an ID")
    }

    fn needs(name: &str, last: &str, pending: Option<&str>) -> GroupNeeds {
        GroupNeeds {
            name: name.into(),
            last_delivered: id(last),
            first_pending: pending.map(id),
        }
    }

    #[test]
    fn stream_ids_order_and_step_like_redis() {
        assert!(id("5-10") > id("5-9"));
        assert!(id("10-0") > id("9-99"));
        assert_eq!(id("5-1").next(), Some(id("5-2")));
        assert_eq!(id("5-18446744073709551615").next(), Some(id("6-0")));
        assert_eq!(id("18446744073709551615-18446744073709551615").next(), None);
        assert_eq!(id("1700000000000-3").to_string(), "1700000000000-3");
        for bad in ["", "5", "5-", "-5", "a-1", "1-2-3"] {
            assert_eq!(StreamId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_safe_bound_keeps_what_any_group_has_not_read_or_acked() {
        assert_eq!(safe_minid(&[]), None);
        // All read and acked: everything up to the last delivered entry may go.
        assert_eq!(safe_minid(&[needs("a", "9-0", None)]), Some(id("9-1")));
        // A pending entry is kept, and everything after it.
        assert_eq!(
            safe_minid(&[needs("a", "9-0", Some("4-2"))]),
            Some(id("4-2"))
        );
        // Another group that has read less holds the bound back.
        assert_eq!(
            safe_minid(&[needs("a", "9-0", None), needs("other", "0-0", None)]),
            Some(id("0-1"))
        );
        assert_eq!(
            safe_minid(&[
                needs("a", "9-0", Some("7-0")),
                needs("b", "8-0", Some("3-0"))
            ]),
            Some(id("3-0"))
        );
    }

    #[test]
    fn retain_only_lowers_the_bound() {
        let safe = id("100000-5");
        assert_eq!(trim_bound(safe, 200_000, Duration::ZERO), safe);
        assert_eq!(
            trim_bound(safe, 200_000, Duration::from_secs(60)),
            id("140000-0").min(safe)
        );
        assert_eq!(
            trim_bound(safe, 130_000, Duration::from_secs(60)),
            id("70000-0")
        );
        assert_eq!(trim_bound(safe, 10, Duration::from_secs(60)), id("0-0"));
    }
}
