//! Applying events: chains of bounded `fold.lua` calls of events summed per (member, slice),
//! and calls of at most [`APPLY_CHUNK`] events judged one by one ('each') where a grouped
//! call cannot judge them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::join_all;
use tracing::warn;

use super::{
    as_array, as_i64, feed_args, mode_flag, negative_flag, parse_watermark, reply_err, tie_flag,
    Store, StoreError,
};
use crate::domain::board::Board;
use crate::domain::keys::{unique_token, InstanceKeys};
use crate::domain::limits::{per_request, MAX_REQUEST_ARGS};

pub(super) mod judge;

/// What became of one event at one board instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Counted.
    Applied,
    /// Its idempotency key was already applied.
    Duplicate,
    /// Its slice has left the instance's window.
    Late,
    /// It would take a total past 2^53 - 1.
    Overflow,
}

/// One instance's share of a batch: its scope (or shard; `None` on an unscoped board) and
/// its events, in stream order.
pub type Share<'a> = (Option<&'a str>, &'a [ApplyEvent]);

/// One event as applied to one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyEvent {
    /// Idempotency key.
    pub id: String,
    /// Event time, epoch ms.
    pub ts: i64,
    /// The ranked member.
    pub member: String,
    /// Amount in minor units.
    pub amount: i64,
}

/// Most events in one apply script call. docs/design.md, *Bounded calls*: no call may hold Redis for
/// more than about 2 ms; the apply script costs up to ~23 µs of Redis time per event on
/// the reference machine when every event moves a distinct member of a large ranking, and
/// calls of 64 such events ran 1.5 ms at the median but 4–7 ms in the tail (`cargo bench
/// --bench rollboard -- expiry`, its fill), so a call holds at most 32.
pub const APPLY_CHUNK: usize = 32;

/// Most events in one apply script call to `board`: [`APPLY_CHUNK`] divided by its
/// windows, since such a call writes every event in each window it falls in (its digest
/// is checked once), so that a call stays within the same bound; and no more than keep the
/// call within [`MAX_REQUEST_ARGS`] were every event of another slice and member.
pub fn apply_chunk(board: &Board) -> usize {
    apply_chunk_within(board, MAX_REQUEST_ARGS)
}

/// [`apply_chunk`] for a cap of `max_args` arguments a request.
fn apply_chunk_within(board: &Board, max_args: usize) -> usize {
    let shape = CallShape::of(board);
    let mut n = (APPLY_CHUNK / board.windows.len().max(1)).max(1);
    while n > 1 && shape.apply_args(n, n, n, true) > max_args {
        n -= 1;
    }
    n
}

/// What the size of a `fold.lua` request to one board depends on besides
/// its events: the board's narrower windows and the keys every window adds (a change
/// stream, distinct totals). Counts the arguments of [`call_head`], [`narrower_windows`],
/// [`apply_call`] and [`fold_call`] without building them (pinned against them by the
/// tests), so that a call is cut before it would pass [`MAX_REQUEST_ARGS`].
#[derive(Debug, Clone, Copy)]
struct CallShape {
    /// Narrower windows (0 on a board with one).
    narrower: usize,
    /// The keys each window adds after its slices: its change stream, its distinct totals.
    tail: usize,
}

/// `FCALL`, the function's name and the key count.
const FCALL_ARGS: usize = 3;

/// The fixed keys of an instance that every apply and fold call passes
/// ([`InstanceKeys::apply_keys`]).
const APPLY_KEYS: usize = 8;

/// The ARGV [`call_head`] writes: eleven numbers and flags, then the feed's two.
const HEAD_ARGS: usize = 13;

impl CallShape {
    fn of(board: &Board) -> CallShape {
        CallShape {
            narrower: board.narrower_views().len(),
            tail: usize::from(board.incremental_feed().is_some()) + usize::from(board.dense_rank),
        }
    }

    /// The KEYS of a call whose events fall in `slices` slices: the instance's, each
    /// slice's Hash and forget log, its tail; per narrower window six, each slice's Hash,
    /// its tail.
    fn keys(self, slices: usize) -> usize {
        APPLY_KEYS + 2 * slices + self.tail + self.narrower * (6 + slices + self.tail)
    }

    /// The ARGV [`narrower_windows`] writes: their count, the dense flag, two per window.
    fn window_args(self) -> usize {
        2 + 2 * self.narrower
    }

    /// The arguments of one `fold.lua` request of `slices` slices and `members` members,
    /// chained: the head, the digests and the numbers (one argument each), the members'
    /// names, the two chain tokens, and on a board with several windows the narrower
    /// windows' ARGV.
    fn fold_args(self, slices: usize, members: usize) -> usize {
        let windows = if self.narrower > 0 {
            self.window_args()
        } else {
            0
        };
        FCALL_ARGS + self.keys(slices) + HEAD_ARGS + 2 + members + 2 + windows
    }

    /// The arguments of one `fold.lua` request judging each of `events` events on its own
    /// ([`apply_call`]), in `slices` slices naming `members` members: 'each', the head, the
    /// digests and the numbers, the members' names, the two chain tokens, the narrower
    /// windows' ARGV, and with `raw_ids` each event's id.
    fn apply_args(self, slices: usize, members: usize, events: usize, raw_ids: bool) -> usize {
        FCALL_ARGS
            + 1
            + self.keys(slices)
            + HEAD_ARGS
            + 2
            + members
            + 2
            + self.window_args()
            + if raw_ids { events } else { 0 }
    }
}

/// Domain separation of [`id_digest`]: BLAKE3 in key derivation mode with this context.
pub const DIGEST_CONTEXT: &str = "rollboard 2026-11 idempotency key digest v1";

/// The 16-byte digest under which an event id is remembered: the first 128 bits of its
/// BLAKE3 hash (key derivation mode, [`DIGEST_CONTEXT`]). BLAKE3 is collision resistant
/// without a secret, so for `n` ids remembered in one slice of one instance the chance
/// that two distinct ids share a digest (the later would count as a duplicate) is at most
/// n² / 2^129, n being the ids an instance remembers at once: about 1.5·10^-21 for 10^9.
pub fn id_digest(id: &str) -> [u8; 16] {
    let mut hasher = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    hasher.update(id.as_bytes());
    let mut out = [0u8; 16];
    hasher.finalize_xof().fill(&mut out);
    out
}

/// How long an instance found holding a legacy `seen` ZSet has its apply calls carry the
/// raw ids before the (cheap) check is trusted again.
///
/// The legacy `seen` ZSet (the idempotency layout before digests) is removed in 0.3 or
/// after 2027-03-01, whichever comes first; until then apply calls carry raw ids to an
/// instance that still holds it and the roll drains it.
const LEGACY_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

/// What grouped `fold.lua` calls and those judging each event share: the KEYS (the instance's fixed keys, then
/// each slice's Hash and forget log, then on a board with a change feed its stream, then on
/// a `dense_rank` board its distinct totals) and the first thirteen ARGV, `count` being the events of
/// a call judging each event or the groups of a grouped one.
fn call_head(
    board: &Board,
    k: &InstanceKeys,
    fingerprint: &str,
    slices: &[i64],
    members: usize,
    count: usize,
    now: i64,
) -> (Vec<String>, Vec<Value>) {
    let mut keys = k.apply_keys();
    keys.extend(slices.iter().map(|&n| k.slice(n)));
    keys.extend(slices.iter().map(|&n| k.seen_log(n)));
    let feed = board.incremental_feed();
    keys.extend(feed.map(|_| k.changes()));
    keys.extend(board.dense_rank.then(|| k.dense()));
    let mut args: Vec<Value> = Vec::with_capacity(14 + 3 * slices.len() + members + 5 * count);
    args.extend([
        Value::from(now),
        Value::from(board.widest().slices_in_window()),
        Value::from(board.slice_ms),
        Value::from(mode_flag(board)),
        Value::from(tie_flag(board)),
        Value::from(negative_flag(board)),
        Value::from(fingerprint),
        Value::from(slices.len() as i64),
        Value::from(members as i64),
        Value::from(count as i64),
        Value::from(board.forgettable_through(now)),
    ]);
    args.extend(feed_args(feed));
    (keys, args)
}

/// What `fold.lua` calls take for the narrower windows of a board with
/// several (the widest's keys are `k`): their KEYS (per window: meta, result, members,
/// slices, refs, totals, the Hash of each of `slices`, then its change stream and its
/// distinct totals where the board has them) and their ARGV: V, the number of narrower
/// windows (0 on a board with one), '1' on a `dense_rank` board, then per window its slices
/// per window and its settings fingerprint.
fn narrower_windows(board: &Board, k: &InstanceKeys, slices: &[i64]) -> (Vec<String>, Vec<Value>) {
    let narrower = board.narrower_views();
    let mut keys = Vec::new();
    let mut args = Vec::with_capacity(2 + 2 * narrower.len());
    args.push(Value::from(narrower.len() as i64));
    args.push(Value::from(if board.dense_rank { "1" } else { "0" }));
    for view in &narrower {
        let vk = k.in_window(&view.window_suffix().unwrap_or_default());
        keys.extend([
            vk.meta(),
            vk.result(),
            vk.members(),
            vk.slices(),
            vk.refs(),
            vk.totals(),
        ]);
        keys.extend(slices.iter().map(|&n| vk.slice(n)));
        keys.extend(board.incremental_feed().map(|_| vk.changes()));
        keys.extend(board.dense_rank.then(|| vk.dense()));
        args.extend([
            Value::from(view.slices_in_window()),
            Value::from(view.fingerprint()),
        ]);
    }
    (keys, args)
}

/// The KEYS and ARGV of one `fold.lua` call judging each of `events` on its own, in their
/// order ('each', layout documented in the script): each event a group of its own, its
/// digest the group's. With `raw_ids` the events' ids follow, for an instance that still
/// holds the legacy `seen` ZSet.
pub fn apply_call(
    board: &Board,
    k: &InstanceKeys,
    fingerprint: &str,
    events: &[ApplyEvent],
    now: i64,
    raw_ids: bool,
) -> (Vec<String>, Vec<Value>) {
    let mut slices: Vec<i64> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    let mut members: Vec<&str> = Vec::new();
    let mut member_index: HashMap<&str, usize> = HashMap::new();
    let mut rows: Vec<(usize, usize)> = Vec::with_capacity(events.len());
    for e in events {
        let n = board.slice_of(e.ts);
        let s = match slices.iter().position(|&x| x == n) {
            Some(i) => i,
            None => {
                slices.push(n);
                counts.push(0);
                slices.len() - 1
            }
        };
        counts[s] += 1;
        let m = *member_index.entry(e.member.as_str()).or_insert_with(|| {
            members.push(e.member.as_str());
            members.len() - 1
        });
        rows.push((s, m));
    }
    let (mut keys, head) = call_head(
        board,
        k,
        fingerprint,
        &slices,
        members.len(),
        events.len(),
        now,
    );
    let mut args = Vec::with_capacity(1 + head.len() + 2 + members.len() + 4 + events.len());
    args.push(Value::from("each"));
    args.extend(head);
    let blob: Vec<u8> = events.iter().flat_map(|e| id_digest(&e.id)).collect();
    args.push(Value::Bytes(blob.into()));
    let mut numbers = Vec::with_capacity(3 * slices.len() + 5 * events.len());
    for (&n, &c) in slices.iter().zip(&counts) {
        numbers.extend([n, board.forget_at(n), c]);
    }
    for (e, (s, m)) in events.iter().zip(rows) {
        let abs = i64::try_from(e.amount.unsigned_abs()).unwrap_or(i64::MAX);
        numbers.extend([m as i64 + 1, s as i64 + 1, e.amount, abs, e.ts]);
    }
    args.push(Value::Bytes(packed(&numbers).into()));
    args.extend(members.iter().map(|&m| Value::from(m)));
    // Never chained: both tokens ''; then the narrower windows, V being sent on every board.
    args.extend([Value::from(""), Value::from("")]);
    let (window_keys, window_args) = narrower_windows(board, k, &slices);
    keys.extend(window_keys);
    args.extend(window_args);
    if raw_ids {
        args.extend(events.iter().map(|e| Value::from(e.id.as_str())));
    }
    (keys, args)
}

/// The work budget of one `fold.lua` call: each event costs [`FOLD_EVENT_COST`], each
/// (member, slice) group [`FOLD_GROUP_COST`] per window of the board (see
/// [`fold_group_cost`]). On the reference machine a call costs about
/// 100 µs, plus ~6.5 µs of Redis time per event (its digest checked and remembered) and
/// ~9 µs per group on a 100 000-member instance, ~25 µs on a 1 000 000-member one (the
/// slice field, the member's total and ranking entry: random reads of large structures);
/// profiled with `INFO commandstats` around calls cut short at each phase. Calls of 60
/// distinct members ran a p50 of 1.7 ms and a max of 4.3 ms on the 1M-member fill
/// (`cargo bench --bench rollboard -- table`), so a group costs 10 units: at most 25
/// distinct members (or 150 events of one member) per call, about 0.7 ms at the p50.
pub const FOLD_BUDGET: usize = 300;
/// What one event costs of [`FOLD_BUDGET`].
pub const FOLD_EVENT_COST: usize = 2;
/// What one (member, slice) group costs of [`FOLD_BUDGET`] in each window of its board.
pub const FOLD_GROUP_COST: usize = 10;

/// What one (member, slice) group of `board` costs of [`FOLD_BUDGET`]: [`FOLD_GROUP_COST`]
/// per window. A group's work (its slice field, its member's total and ranking entry) is
/// done again in every window its slice counts in, while an event's digest is checked and
/// remembered once, in the widest window: so a call on a board with three windows holds
/// about a third as many distinct members as one on a board with one, and its work stays
/// within the budget.
pub fn fold_group_cost(board: &Board) -> usize {
    FOLD_GROUP_COST * board.windows.len().max(1)
}

/// One `fold.lua` call: its KEYS and ARGV, and the slice index (0-based, in the call's
/// slice table) of each of its events, for reading the reply.
#[derive(Debug)]
pub struct FoldCall {
    /// KEYS, as [`apply_call`]'s.
    pub keys: Vec<String>,
    /// ARGV (layout documented in `fold.lua`).
    pub args: Vec<Value>,
    /// The slice index of each event, in the events' order.
    pub slice_of: Vec<usize>,
    /// The call's work in [`FOLD_BUDGET`] units (see [`fold_chunk_len`]).
    pub cost: usize,
    /// Where the two chain tokens are in `args` when the narrower windows' ARGV follow
    /// them (a board with several windows: sent as '' until [`FoldCall::chained`]); on a
    /// board with one window they are the last two, when sent at all.
    chain_at: Option<usize>,
}

impl FoldCall {
    /// The call chained after the one that leaves the token `after` (if any): it runs only
    /// once that one's events were judged, and then leaves `token` (see `fold.lua`).
    pub fn chained(mut self, after: Option<&str>, token: &str) -> Self {
        let tokens = [Value::from(after.unwrap_or("")), Value::from(token)];
        match self.chain_at {
            Some(at) => {
                for (slot, value) in self.args[at..at + 2].iter_mut().zip(tokens) {
                    *slot = value;
                }
            }
            None => self.args.extend(tokens),
        }
        self
    }
}

/// How one `fold.lua` call ended.
enum Folded {
    /// Its events were judged: one outcome each, in order.
    Judged(Vec<Outcome>),
    /// Its events must be judged one by one (nothing was written).
    Slow,
    /// It did not run: the call it was chained after was not judged (nothing was written).
    NotRun,
}

/// `events` cut into the chunks of successive [`fold_call`]s (see [`fold_chunk_len`]).
pub fn fold_chunks<'a>(board: &Board, mut events: &'a [ApplyEvent]) -> Vec<&'a [ApplyEvent]> {
    let mut chunks = Vec::new();
    while !events.is_empty() {
        let (chunk, rest) = events.split_at(fold_chunk_len(board, events));
        chunks.push(chunk);
        events = rest;
    }
    chunks
}

/// How many events from the front of `events` one [`fold_call`] takes: as many as fit
/// [`FOLD_BUDGET`] (a group costing [`fold_group_cost`]) and keep the request within
/// [`MAX_REQUEST_ARGS`] (its slices' keys and its members' names), and no id twice (a
/// repeat starts the next call, where the first occurrence is already remembered). At
/// least one.
pub fn fold_chunk_len(board: &Board, events: &[ApplyEvent]) -> usize {
    fold_chunk_len_within(board, events, MAX_REQUEST_ARGS, FOLD_BUDGET)
}

/// [`fold_chunk_len`] for a cap of `max_args` arguments a request and a work budget of
/// `budget` units.
fn fold_chunk_len_within(
    board: &Board,
    events: &[ApplyEvent],
    max_args: usize,
    budget: usize,
) -> usize {
    let mut ids: HashSet<&str> = HashSet::new();
    let mut groups: HashSet<(&str, i64)> = HashSet::new();
    let mut slices: HashSet<i64> = HashSet::new();
    let mut members: HashSet<&str> = HashSet::new();
    let group_cost = fold_group_cost(board);
    let shape = CallShape::of(board);
    let mut cost = 0;
    for (i, e) in events.iter().enumerate() {
        let n = board.slice_of(e.ts);
        cost += FOLD_EVENT_COST;
        if groups.insert((e.member.as_str(), n)) {
            cost += group_cost;
            slices.insert(n);
            members.insert(e.member.as_str());
        }
        let args = shape.fold_args(slices.len(), members.len());
        if (i > 0 && (cost > budget || args > max_args)) || !ids.insert(e.id.as_str()) {
            return i;
        }
    }
    events.len()
}

/// The `fold.lua` call for `events` (see [`fold_chunk_len`] for what one call may hold):
/// the events' amounts summed per (member, slice) here, their digests sent one per event.
pub fn fold_call(
    board: &Board,
    k: &InstanceKeys,
    fingerprint: &str,
    events: &[ApplyEvent],
    now: i64,
) -> FoldCall {
    let grouped = Grouped::of(board, events);
    let (blob, counts) = digests_by_slice(events, &grouped.slice_of, grouped.slices.len());
    let (mut keys, mut args) = call_head(
        board,
        k,
        fingerprint,
        &grouped.slices,
        grouped.members.len(),
        grouped.groups.len(),
        now,
    );
    args.push(Value::Bytes(blob.into()));
    let cost = events.len() * FOLD_EVENT_COST + grouped.groups.len() * fold_group_cost(board);
    // The slices' and the groups' numbers, in one MessagePack array: the script unpacks
    // them in one call, where each decimal argument would cost it a `tonumber`.
    let mut numbers = Vec::with_capacity(3 * grouped.slices.len() + 5 * grouped.groups.len());
    for (&n, &c) in grouped.slices.iter().zip(&counts) {
        numbers.extend([n, board.forget_at(n), c as i64]);
    }
    for &(m, s, sum, abs, newest) in &grouped.groups {
        numbers.extend([m as i64 + 1, s as i64 + 1, sum, abs, newest]);
    }
    args.push(Value::Bytes(packed(&numbers).into()));
    args.extend(grouped.members.iter().map(|&m| Value::from(m)));
    // A board with several windows: the chain tokens (none yet), then the narrower
    // windows'; a board with one sends neither here.
    let mut chain_at = None;
    if board.has_several_windows() {
        let (window_keys, window_args) = narrower_windows(board, k, &grouped.slices);
        chain_at = Some(args.len());
        args.extend([Value::from(""), Value::from("")]);
        keys.extend(window_keys);
        args.extend(window_args);
    }
    FoldCall {
        keys,
        args,
        slice_of: grouped.slice_of,
        cost,
        chain_at,
    }
}

/// `numbers` as one MessagePack array of integers (`cmsgpack.unpack` in the script).
fn packed(numbers: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + 9 * numbers.len());
    // A call holds a few hundred numbers (FOLD_BUDGET); a count beyond u32 would be
    // refused by the script, which checks it against its S and G.
    let len = u32::try_from(numbers.len()).unwrap_or(u32::MAX);
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_array_len(&mut out, len);
    for &n in numbers {
        let _ = rmp::encode::write_sint(&mut out, n);
    }
    out
}

/// How a `fold.lua` call whose events fall in the slices `slice_of` (by index, per event)
/// ended, from its reply.
fn folded(slice_of: &[usize], reply: Value) -> Result<Folded, StoreError> {
    let reply = as_array(reply).ok_or_else(|| reply_err("fold: not an array"))?;
    let mut late = vec![false; slice_of.len()];
    let mut codes = reply.iter().map(as_i64);
    let kind = codes.next().flatten();
    for s in codes {
        match s {
            Some(s) if s >= 1 => {
                for (l, &of) in late.iter_mut().zip(slice_of) {
                    *l |= of as i64 == s - 1;
                }
            }
            _ => return Err(reply_err(format!("fold: bad late slice {s:?}"))),
        }
    }
    let counted = match kind {
        Some(0) => Outcome::Applied,
        Some(1) => Outcome::Duplicate,
        Some(2) => return Ok(Folded::Slow),
        Some(3) => return Ok(Folded::NotRun),
        other => return Err(reply_err(format!("fold: unknown outcome {other:?}"))),
    };
    Ok(Folded::Judged(
        late.iter()
            .map(|&l| if l { Outcome::Late } else { counted })
            .collect(),
    ))
}

/// What one instance of a packed `fold.lua` call adds to its work besides its events and
/// groups (in [`FOLD_BUDGET`] units): the fixed reads and writes of an instance (its
/// `meta`, digest table, members, totals, slice registry and forget logs), about 13
/// commands and 35 µs of Redis time in a small `fans_7d` instance on the reference machine
/// (`INFO commandstats` over `cargo bench --bench ingest -- e2e`), where a unit is about
/// 2.3 µs. A pack stays within [`FOLD_BUDGET`] in all: about a dozen small instances.
pub const PACK_INSTANCE_COST: usize = 15;

/// The error a packed call's reply gives for one instance (`{ -1, error }`), as the call
/// of its own would have failed; `None` for a reply that is not one.
fn instance_error(reply: &Value) -> Option<StoreError> {
    let Value::Array(parts) = reply else {
        return None;
    };
    match parts.as_slice() {
        [code, message] if as_i64(code) == Some(-1) => {
            // A message may quote stored bytes that are not UTF-8; its code stays first.
            let message = match message {
                Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                other => other.as_str().map(|m| m.to_string()).unwrap_or_default(),
            };
            Some(StoreError::Redis(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                message,
            )))
        }
        _ => None,
    }
}

/// What a packed instance of a board with one window sends after its members (where a
/// call of its own sends nothing): its two chain tokens (''), V (0) and the dense flag.
fn one_window_tail(dense: bool) -> [Value; 4] {
    [
        Value::from(""),
        Value::from(""),
        Value::from(0),
        Value::from(if dense { "1" } else { "0" }),
    ]
}

/// The KEYS and ARGV of one packed `fold.lua` call of `pack`, calls to a board whose
/// `dense` flag is `dense_rank` (layout in `fold.lua`).
fn packed_call(pack: &[FoldCall], dense: bool) -> (Vec<String>, Vec<Value>) {
    let mut keys = Vec::with_capacity(pack.iter().map(|c| c.keys.len()).sum());
    let mut args =
        Vec::with_capacity(2 + 2 * pack.len() + pack.iter().map(|c| c.args.len()).sum::<usize>());
    args.push(Value::from("many"));
    args.push(Value::from(pack.len() as i64));
    for call in pack {
        let tail = if call.chain_at.is_none() { 4 } else { 0 };
        args.push(Value::from(call.keys.len() as i64));
        args.push(Value::from((call.args.len() + tail) as i64));
    }
    for call in pack {
        keys.extend(call.keys.iter().cloned());
        args.extend(call.args.iter().cloned());
        if call.chain_at.is_none() {
            args.extend(one_window_tail(dense));
        }
    }
    (keys, args)
}

/// The arguments a packed call of `instances` instances sends besides their KEYS and
/// ARGV: `FCALL`, the function, the key count, 'many', P, two counts per instance and the
/// tail of each on a board with one window ([`one_window_tail`]).
fn pack_overhead(instances: usize) -> usize {
    FCALL_ARGS + 2 + 6 * instances
}

/// `calls` (each one instance's whole share of a batch, unchained) cut into packs, in
/// order: each within [`FOLD_BUDGET`] (a call's cost and [`PACK_INSTANCE_COST`] each) and
/// [`MAX_REQUEST_ARGS`] in all, and on a cluster of one slot each (`slot_of`: `None` on a
/// single server, where every key meets in one call). A call too large to share a pack
/// is a pack of its own.
fn pack<T>(
    calls: Vec<(T, FoldCall)>,
    slot_of: impl Fn(&FoldCall) -> Option<u16>,
) -> Vec<Vec<(T, FoldCall)>> {
    /// A pack as it fills: its slot, its weight and arguments so far, its calls.
    struct Open<T> {
        slot: Option<u16>,
        weight: usize,
        size: usize,
        calls: Vec<(T, FoldCall)>,
    }
    let mut packs: Vec<Open<T>> = Vec::new();
    for (tag, call) in calls {
        let slot = slot_of(&call);
        let weight = call.cost + PACK_INSTANCE_COST;
        let size = call.keys.len() + call.args.len();
        let open = packs.iter_mut().rev().find(|p| {
            p.slot == slot
                && p.weight + weight <= FOLD_BUDGET
                && p.size + size + pack_overhead(p.calls.len() + 1) <= MAX_REQUEST_ARGS
        });
        match open {
            Some(p) => {
                p.weight += weight;
                p.size += size;
                p.calls.push((tag, call));
            }
            None => packs.push(Open {
                slot,
                weight,
                size,
                calls: vec![(tag, call)],
            }),
        }
    }
    packs.into_iter().map(|p| p.calls).collect()
}

/// The order to apply `events` in, member by member (members in the order of their first
/// event, each one's events in stream order), when it differs from theirs; `None` to keep
/// theirs.
///
/// One instance's events are judged the same in either order when no id repeats among
/// them: an event is a duplicate when its id was applied before the batch (repeats within
/// it keep stream order: the first wins), late by its time alone, and a member's total,
/// slice fields and tie-break time (the newest time of its events) depend on that
/// member's events only, whose order is kept (so is which of them would pass 2^53 - 1).
/// Grouped so, a fold call holds more of a member's events in one group (a skewed
/// workload's busy members have many in a batch), and groups cost a call far more than
/// events do.
fn by_member(events: &[ApplyEvent]) -> Option<Vec<usize>> {
    let mut ids = HashSet::with_capacity(events.len());
    if events.len() < 3 || !events.iter().all(|e| ids.insert(e.id.as_str())) {
        return None;
    }
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        first.entry(e.member.as_str()).or_insert(i);
    }
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| first[events[i].member.as_str()]);
    (order.iter().enumerate().any(|(k, &i)| k != i)).then_some(order)
}

/// The order [`Store::apply`] judges one instance's `events` in: indices into `events`,
/// member by member (the members in the order of their first event, each member's events
/// in stream order), or stream order when an id repeats among them.
pub fn apply_order(events: &[ApplyEvent]) -> Vec<usize> {
    by_member(events).unwrap_or_else(|| (0..events.len()).collect())
}

/// `judged`, the outcomes of an instance's events taken in `order` (indices into them, as
/// [`by_member`] gives; `None`: their own order), put back in the events' order.
fn in_stream_order(order: Option<&[usize]>, judged: Vec<Outcome>) -> Vec<Outcome> {
    let Some(order) = order else {
        return judged;
    };
    let mut out = vec![Outcome::Applied; judged.len()];
    for (&i, outcome) in order.iter().zip(judged) {
        out[i] = outcome;
    }
    out
}

/// An instance's events in the order they are judged in, and that order (indices into
/// them, as [`by_member`] gives; `None`: their own).
type Ordered<'a> = (Option<Vec<usize>>, std::borrow::Cow<'a, [ApplyEvent]>);

/// Scopes one `ZADD` of [`registrations`] registers: `ZADD`, the key and `GT`, then two
/// arguments a scope.
const REGISTER_PIECE: usize = per_request(3, 2);

/// The `ZADD GT` arguments (the command's name aside) that register each scope of `shares`
/// in `registry`, scored by the newest slice of its events: one `ZADD` per
/// [`REGISTER_PIECE`] scopes, in the shares' order. `GT` judges each scope on its own, so
/// several `ZADD`s register exactly what one would.
fn registrations(
    registry: &str,
    board: &Board,
    shares: &[(&str, &[ApplyEvent])],
) -> Vec<Vec<Value>> {
    shares
        .chunks(REGISTER_PIECE)
        .map(|piece| {
            let mut zadd = Vec::with_capacity(2 + 2 * piece.len());
            zadd.push(Value::from(registry));
            zadd.push("GT".into());
            for (scope, events) in piece {
                let newest = events
                    .iter()
                    .map(|e| board.slice_of(e.ts))
                    .max()
                    .unwrap_or_default();
                zadd.push(Value::from(newest));
                zadd.push(Value::from(*scope));
            }
            zadd
        })
        .collect()
}

/// A fold call's events aggregated per (member, slice), in order of first appearance.
struct Grouped<'a> {
    /// The slices the events fall in.
    slices: Vec<i64>,
    /// The members the events name.
    members: Vec<&'a str>,
    /// (member index, slice index, sum, sum of absolute values, newest time).
    groups: Vec<(usize, usize, i64, i64, i64)>,
    /// Each event's slice index.
    slice_of: Vec<usize>,
}

impl<'a> Grouped<'a> {
    fn of(board: &Board, events: &'a [ApplyEvent]) -> Grouped<'a> {
        let mut grouped = Grouped {
            slices: Vec::new(),
            members: Vec::new(),
            groups: Vec::new(),
            slice_of: Vec::with_capacity(events.len()),
        };
        let mut slice_index: HashMap<i64, usize> = HashMap::new();
        let mut member_index: HashMap<&str, usize> = HashMap::new();
        let mut group_index: HashMap<(usize, usize), usize> = HashMap::new();
        for e in events {
            let n = board.slice_of(e.ts);
            let s = *slice_index.entry(n).or_insert_with(|| {
                grouped.slices.push(n);
                grouped.slices.len() - 1
            });
            let m = *member_index.entry(e.member.as_str()).or_insert_with(|| {
                grouped.members.push(e.member.as_str());
                grouped.members.len() - 1
            });
            let g = *group_index.entry((m, s)).or_insert_with(|| {
                grouped.groups.push((m, s, 0, 0, e.ts));
                grouped.groups.len() - 1
            });
            let group = &mut grouped.groups[g];
            group.2 = group.2.saturating_add(e.amount);
            group.3 = group.3.saturating_add(e.amount.saturating_abs());
            group.4 = group.4.max(e.ts);
            grouped.slice_of.push(s);
        }
        grouped
    }
}

/// The events' id digests grouped by slice, in the slice table's order, and the number of
/// events per slice.
fn digests_by_slice(
    events: &[ApplyEvent],
    slice_of: &[usize],
    slices: usize,
) -> (Vec<u8>, Vec<usize>) {
    let mut counts = vec![0usize; slices];
    for &s in slice_of {
        counts[s] += 1;
    }
    let mut blob = vec![0u8; 16 * events.len()];
    let mut offset = Vec::with_capacity(slices);
    let mut at = 0;
    for &c in &counts {
        offset.push(at);
        at += 16 * c;
    }
    for (e, &s) in events.iter().zip(slice_of) {
        blob[offset[s]..offset[s] + 16].copy_from_slice(&id_digest(&e.id));
        offset[s] += 16;
    }
    (blob, counts)
}

/// One instance's apply, as every call of it sees it (made once the instance's scope, if
/// any, is registered and the time its events are judged by is known).
struct InstanceApply<'a> {
    /// The one connection every call of the instance goes on (stream order).
    client: &'a Client,
    /// The board.
    board: &'a Board,
    /// The instance's keys.
    k: InstanceKeys,
    /// The settings pin of the board's widest window ([`View::fingerprint`](crate::domain::board::View::fingerprint)), whose
    /// instance's keys `k` are (the call writes the narrower windows' beside them).
    fingerprint: String,
    /// The time the events are judged by.
    now: i64,
}

impl Store {
    /// Whether apply calls to the instance whose legacy `seen` key is `seen` should carry
    /// the raw ids (it held the legacy ZSet a moment ago).
    fn holds_legacy_seen(&self, seen: &str) -> bool {
        let Ok(known) = self.legacy.lock() else {
            return false;
        };
        known
            .get(seen)
            .is_some_and(|at| at.elapsed() < LEGACY_MEMORY)
    }

    fn remember_legacy_seen(&self, seen: &str) {
        if let Ok(mut known) = self.legacy.lock() {
            known.retain(|_, at| at.elapsed() < LEGACY_MEMORY);
            known.insert(seen.to_string(), std::time::Instant::now());
        }
    }

    /// Whether several instances' keys go in one call only when they share a slot: a
    /// cluster, or a proxy that refused a packed call.
    fn clustered(&self) -> bool {
        // The reader's config, which every connection shares (`client()` would take the
        // next write connection's turn).
        self.reader().is_clustered() || self.packs_by_slot.load(Ordering::Relaxed)
    }

    /// Whether `board`'s instances are judged in the worker (see `judge`): one server,
    /// and a board of the shape judged there.
    fn judges_here(&self, board: &Board) -> bool {
        !self.clustered() && self.judging.on() && judge::judges(board)
    }

    /// Applies `events` to one instance, judged as in stream order (taken in the order
    /// [`apply_order`] gives), as a sequence of bounded atomic script calls of at most
    /// [`apply_chunk`] events each; one outcome per event, in the events' order.
    ///
    /// Each call remembers the ids it applied, so a crash between two calls (or a retry of
    /// the whole batch) neither loses nor double-counts anything: the calls already made
    /// answer `Duplicate` for their events the next time. The calls are sent at once, on
    /// one connection, each chained after the one before it (it runs only once that one's
    /// events were judged): Redis does not wait for this side between them.
    ///
    /// On a period board the events are split by period first, each period an instance
    /// of its own (see `periods.rs`).
    pub async fn apply(
        &self,
        board: &Board,
        scope: Option<&str>,
        events: &[ApplyEvent],
        now: i64,
    ) -> Result<Vec<Outcome>, StoreError> {
        match &board.period {
            Some(calendar) if !events.is_empty() => {
                self.apply_periods(board, calendar, scope, events, now)
                    .await
            }
            _ => self.apply_instance(board, scope, events, now).await,
        }
    }

    /// [`Store::apply`] for each of `shares`, instances of one board; one result per
    /// share, in order. The scopes (or shards) of a board with many instances are
    /// registered at once, in one round trip: a batch touches hundreds of a scoped
    /// board's instances, most with an event or two.
    pub async fn apply_shares(
        &self,
        board: &Board,
        shares: &[Share<'_>],
        now: i64,
    ) -> Vec<Result<Vec<Outcome>, StoreError>> {
        let registered: Option<Vec<(&str, &[ApplyEvent])>> = shares
            .iter()
            .map(|&(scope, events)| scope.filter(|_| !events.is_empty()).map(|s| (s, events)))
            .collect();
        let registered = match registered {
            Some(registered) if board.period.is_none() && registered.len() > 1 => registered,
            // One instance (an unscoped board has one), or a period board (each period an
            // instance of its own, registered as it is applied).
            _ => {
                return join_all(
                    shares
                        .iter()
                        .map(|&(scope, events)| self.apply(board, scope, events, now)),
                )
                .await
            }
        };
        let now = match self
            .register_scopes(self.client(), board, &registered, now)
            .await
        {
            Ok(now) => now,
            Err(e) => return shares.iter().map(|_| Err(e.clone())).collect(),
        };
        let widest = board.widest();
        let fingerprint = widest.fingerprint();
        let applies: Vec<InstanceApply> = registered
            .iter()
            .map(|&(scope, _)| InstanceApply {
                client: self.client(),
                board,
                fingerprint: fingerprint.clone(),
                now,
                k: self.instance(&widest, Some(scope)),
            })
            .collect();
        // The instances whose share is one unchained fold call go in packs, when the
        // server lets several instances' keys meet in one call (one server, or one slot
        // of a cluster); every other goes as before, call by call.
        let mut ordered: Vec<Ordered> = Vec::new();
        let mut packable = Vec::new();
        let mut alone = Vec::new();
        for (i, (apply, &(_, events))) in applies.iter().zip(&registered).enumerate() {
            let order = by_member(events);
            let events: std::borrow::Cow<[ApplyEvent]> = match &order {
                Some(order) => order.iter().map(|&j| events[j].clone()).collect(),
                None => events.into(),
            };
            let one_call = !self.holds_legacy_seen(&apply.k.seen())
                && fold_chunk_len(board, &events) == events.len();
            if one_call {
                let call = fold_call(board, &apply.k, &apply.fingerprint, &events, now);
                packable.push((i, call));
            } else {
                alone.push(i);
            }
            ordered.push((order, events));
        }
        let clustered = self.clustered();
        let packs = pack(packable, |call| {
            clustered.then(|| {
                call.keys
                    .first()
                    .map(|k| ClusterRouting::hash_key(k.as_bytes()))
                    .unwrap_or_default()
            })
        });
        // On one server, the instances of the common shape are judged here first (see
        // `judge`); those it leaves go to `fold.lua`.
        let judging = self.judges_here(board);
        let (ordered, applies_ref) = (&ordered, &applies);
        let packed = join_all(packs.into_iter().map(|pack| async move {
            let weight: usize = pack.iter().map(|(_, c)| c.cost + PACK_INSTANCE_COST).sum();
            let (members, calls): (Vec<usize>, Vec<FoldCall>) = pack.into_iter().unzip();
            let judged = if judging {
                let shares: Vec<(&InstanceApply, &[ApplyEvent])> = members
                    .iter()
                    .map(|&i| (&applies_ref[i], &ordered[i].1[..]))
                    .collect();
                self.judge_pack(&shares, weight as u32).await
            } else {
                members.iter().map(|_| None).collect()
            };
            let mut done = Vec::with_capacity(members.len());
            let (mut left, mut left_calls) = (Vec::new(), Vec::new());
            for ((i, call), judged) in members.into_iter().zip(calls).zip(judged) {
                match judged {
                    Some(judged) => done.push((
                        i,
                        judged.map(|j| in_stream_order(ordered[i].0.as_deref(), j)),
                    )),
                    None => {
                        left.push(i);
                        left_calls.push(call);
                    }
                }
            }
            if left.is_empty() {
                return done;
            }
            let replies = self
                .fold_packed(self.client(), board, left_calls, judging)
                .await;
            done.extend(
                join_all(left.into_iter().zip(replies).map(|(i, reply)| {
                    let (order, events) = &ordered[i];
                    let apply = &applies_ref[i];
                    async move {
                        let judged = self.fold_finished(apply, events, reply).await;
                        (
                            i,
                            judged.map(|judged| in_stream_order(order.as_deref(), judged)),
                        )
                    }
                }))
                .await,
            );
            done
        }));
        let (applies, registered) = (&applies, &registered);
        let one_by_one =
            join_all(alone.iter().map(|&i| async move {
                (i, self.apply_prepared(&applies[i], registered[i].1).await)
            }));
        let (packed, one_by_one) = futures_util::join!(packed, one_by_one);
        let mut results: Vec<Option<Result<Vec<Outcome>, StoreError>>> =
            registered.iter().map(|_| None).collect();
        for (i, result) in packed.into_iter().flatten().chain(one_by_one) {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(reply_err("apply: an instance was not applied"))))
            .collect()
    }

    /// The outcomes of an instance's `events` whose one fold call ended as `reply` (in
    /// their order): that call's, or, where it answered `slow`, those of the `fold.lua`
    /// calls that judged them one by one instead.
    async fn fold_finished(
        &self,
        apply: &InstanceApply<'_>,
        events: &[ApplyEvent],
        reply: Result<Folded, StoreError>,
    ) -> Result<Vec<Outcome>, StoreError> {
        match reply? {
            Folded::Judged(outcomes) => Ok(outcomes),
            Folded::Slow => {
                let mut out = Vec::with_capacity(events.len());
                let mut raw_ids = false;
                for part in events.chunks(apply_chunk(apply.board)) {
                    self.apply_exact(apply, part, &mut raw_ids, &mut out)
                        .await?;
                }
                Ok(out)
            }
            Folded::NotRun => Err(reply_err("fold: an unchained call did not run")),
        }
    }

    /// [`Store::apply`] to the one instance `scope` names.
    pub(super) async fn apply_instance(
        &self,
        board: &Board,
        scope: Option<&str>,
        events: &[ApplyEvent],
        now: i64,
    ) -> Result<Vec<Outcome>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // One connection for every call of the instance: the calls must run in stream
        // order (the first of two events with one id wins).
        let client = self.client();
        let now = match scope {
            Some(scope) => {
                self.register_scopes(client, board, &[(scope, events)], now)
                    .await?
            }
            None => now,
        };
        let widest = board.widest();
        let apply = InstanceApply {
            client,
            board,
            fingerprint: widest.fingerprint(),
            now,
            k: self.instance(&widest, scope),
        };
        self.apply_prepared(&apply, events).await
    }

    /// Applies `events` as `apply` prepared them: to its instance, whose scope (if any) is
    /// registered and `now` judged; one outcome per event, in their order. The events go
    /// member by member where that judges every event as stream order would (see
    /// [`by_member`]): a call then folds each member's events into as few groups as it can.
    async fn apply_prepared(
        &self,
        apply: &InstanceApply<'_>,
        events: &[ApplyEvent],
    ) -> Result<Vec<Outcome>, StoreError> {
        let Some(order) = by_member(events) else {
            return self.apply_in_order(apply, events).await;
        };
        let grouped: Vec<ApplyEvent> = order.iter().map(|&i| events[i].clone()).collect();
        let judged = self.apply_in_order(apply, &grouped).await?;
        Ok(in_stream_order(Some(&order), judged))
    }

    /// [`Store::apply_prepared`] in the order of `events`: chains of `fold.lua` calls,
    /// ones judging each event where a grouped call cannot judge the events.
    async fn apply_in_order(
        &self,
        apply: &InstanceApply<'_>,
        events: &[ApplyEvent],
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut out = Vec::with_capacity(events.len());
        let mut raw_ids = self.holds_legacy_seen(&apply.k.seen());
        let mut rest = events;
        while !rest.is_empty() {
            let judged = if raw_ids {
                // An instance still holding raw ids goes event by event, as its layout
                // requires.
                let chunk = &rest[..rest.len().min(apply_chunk(apply.board))];
                self.apply_exact(apply, chunk, &mut raw_ids, &mut out)
                    .await?;
                chunk.len()
            } else {
                self.fold_some(apply, rest, &mut raw_ids, &mut out).await?
            };
            rest = &rest[judged..];
        }
        Ok(out)
    }

    /// Registers each scope of `shares` in its board's registry (score: the newest slice
    /// of its events; one `ZADD GT` per [`REGISTER_PIECE`] scopes, pipelined with the
    /// watermark read after them, one round trip) and returns the time to judge the events
    /// by: `now`, raised to the board's watermark and last roll.
    ///
    /// The instance may be one that no roll visits (its scope left the registry), so it
    /// is judged against the board's watermark too, read after the registration: a roll
    /// that raised it before that read is seen here; one that raised it after lists the
    /// scope and rolls the instance itself.
    async fn register_scopes(
        &self,
        client: &Client,
        board: &Board,
        shares: &[(&str, &[ApplyEvent])],
        now: i64,
    ) -> Result<i64, StoreError> {
        let pipeline = fred::clients::Pipeline::from(self.once(client));
        for zadd in registrations(&self.keys.scopes(&board.name), board, shares) {
            let _: () = pipeline
                .custom(
                    CustomCommand::new_static("ZADD", ClusterHash::FirstKey, false),
                    zadd,
                )
                .await?;
        }
        let _: () = pipeline
            .hmget(
                self.keys.window(&board.name),
                vec!["expired_through", "last_roll"],
            )
            .await?;
        let mut replies: Vec<Value> = pipeline.all().await?;
        let (watermark, rolled): (Option<String>, Option<String>) = replies
            .pop()
            .ok_or_else(|| reply_err("scope registration: no watermark read"))?
            .convert()?;
        let mut now = now;
        if let Some(watermark) = parse_watermark(watermark)? {
            now = now.max(board.widest().time_of_watermark(watermark));
        }
        // Time never goes back: the board's last roll time is a floor too (the instance's
        // own is read by the script).
        if let Some(rolled) = rolled {
            // As the scripts write it (no '+', no leading zero), as floor.lua reads it.
            let parsed = rolled
                .parse::<i64>()
                .ok()
                .filter(|n| n.to_string() == rolled);
            let rolled = parsed.ok_or_else(|| {
                reply_err(format!(
                    "ROLLBOARD corrupt: {} last_roll {rolled:?} is not an integer",
                    self.keys.window(&board.name)
                ))
            })?;
            now = now.max(rolled);
        }
        Ok(now)
    }

    /// Folds the front of `rest` in one chain of `fold.lua` calls; returns how many events
    /// were judged (at least one), their outcomes appended to `out`.
    async fn fold_some(
        &self,
        apply: &InstanceApply<'_>,
        rest: &[ApplyEvent],
        raw_ids: &mut bool,
        out: &mut Vec<Outcome>,
    ) -> Result<usize, StoreError> {
        // On one server, an instance of the common shape is judged here first, a chunk at
        // a time (see `judge`); what it leaves goes to `fold.lua`.
        if self.judges_here(apply.board) {
            let len = judge::chunk_len(apply.board, rest);
            let chunk = &rest[..len];
            let weight = u32::try_from(len * FOLD_EVENT_COST).unwrap_or(u32::MAX);
            if let Some(Some(outcomes)) = self.judge_pack(&[(apply, chunk)], weight).await.pop() {
                out.extend(outcomes?);
                return Ok(len);
            }
        }
        let chunks = fold_chunks(apply.board, rest);
        let replies = self.fold_chained(apply, &chunks).await;
        // Events judged, from the front of `rest`.
        let mut judged = 0;
        for (chunk, reply) in chunks.iter().zip(replies) {
            match reply? {
                Folded::Judged(outcomes) => out.extend(outcomes),
                // Judged event by event instead (the fold call wrote nothing); the calls
                // after it did not run and are sent again.
                Folded::Slow => {
                    judged += chunk.len();
                    for part in chunk.chunks(apply_chunk(apply.board)) {
                        self.apply_exact(apply, part, raw_ids, out).await?;
                    }
                    break;
                }
                Folded::NotRun => break,
            }
            judged += chunk.len();
        }
        if judged == 0 {
            return Err(reply_err("fold: the first call of a chain did not run"));
        }
        Ok(judged)
    }

    /// Sends one `fold.lua` call per chunk at once, on `client`, chained so that each runs
    /// only after the one before it was judged (see the chain tokens in `fold.lua`); the
    /// replies in the chunks' order. A chain is cut where a call answers `slow` or fails:
    /// the calls after it answer `NotRun`, having written nothing.
    async fn fold_chained(
        &self,
        apply: &InstanceApply<'_>,
        chunks: &[&[ApplyEvent]],
    ) -> Vec<Result<Folded, StoreError>> {
        let InstanceApply {
            client,
            board,
            k,
            fingerprint,
            now,
        } = apply;
        let call = |chunk| fold_call(board, k, fingerprint, chunk, *now);
        if let [chunk] = chunks {
            return vec![self.fold(client, call(chunk)).await];
        }
        let tokens: Vec<String> = chunks.iter().map(|_| unique_token()).collect();
        join_all(chunks.iter().enumerate().map(|(i, &chunk)| {
            let after = i.checked_sub(1).map(|p| tokens[p].as_str());
            self.fold(client, call(chunk).chained(after, &tokens[i]))
        }))
        .await
    }

    /// One `fold.lua` call and how it ended.
    async fn fold(&self, client: &Client, call: FoldCall) -> Result<Folded, StoreError> {
        let reply = self
            .bounded(
                call.cost as u32,
                self.timed(
                    &self.scripts.fold,
                    self.fcall_once(&self.scripts.fold, client, call.keys, call.args),
                ),
            )
            .await?;
        folded(&call.slice_of, reply)
    }

    /// The calls of `pack` (several instances' [`FoldCall`]s, unchained) in one packed
    /// `fold.lua` call (see [`pack`]), each judged as by a call of its own; how each
    /// ended, in order. A pack of one is sent as that one call, unless `kept` (what the
    /// worker did not judge of a larger pack): an error reply quoting bytes that are not
    /// UTF-8 reaches this side whole only inside a packed call's reply.
    async fn fold_packed(
        &self,
        client: &Client,
        board: &Board,
        mut pack: Vec<FoldCall>,
        kept: bool,
    ) -> Vec<Result<Folded, StoreError>> {
        if pack.len() == 1 && !kept {
            let call = pack.pop().map(|call| self.fold(client, call));
            return match call {
                Some(call) => vec![call.await],
                None => Vec::new(),
            };
        }
        let weight: usize = pack.iter().map(|c| c.cost + PACK_INSTANCE_COST).sum();
        let (keys, args) = packed_call(&pack, board.dense_rank);
        let sent = self
            .bounded(
                weight as u32,
                self.timed(
                    &self.scripts.fold,
                    self.fcall_once(&self.scripts.fold, client, keys, args),
                ),
            )
            .await;
        let replies = match sent {
            // A server that takes one slot a call (nothing ran): this pack's calls each
            // by itself, and from now on packs of one slot.
            Err(e) if e.details().starts_with("CROSSSLOT") => {
                self.packs_by_slot.store(true, Ordering::Relaxed);
                warn!(
                    "packed fold calls refused ({}): packing one slot a call from now on",
                    e.details()
                );
                return join_all(pack.into_iter().map(|call| self.fold(client, call))).await;
            }
            Ok(reply) => as_array(reply)
                .filter(|r| r.len() == pack.len())
                .ok_or_else(|| reply_err("fold: a packed call's reply is not one per instance")),
            Err(e) => Err(e.into()),
        };
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => return pack.iter().map(|_| Err(e.clone())).collect(),
        };
        pack.iter()
            .zip(replies)
            .map(|(call, reply)| match instance_error(&reply) {
                Some(e) => Err(e),
                None => folded(&call.slice_of, reply),
            })
            .collect()
    }

    /// One `fold.lua` call of at most [`apply_chunk`] events, each judged on its own; the
    /// outcomes are appended to `out`.
    async fn apply_exact(
        &self,
        apply: &InstanceApply<'_>,
        chunk: &[ApplyEvent],
        raw_ids: &mut bool,
        out: &mut Vec<Outcome>,
    ) -> Result<(), StoreError> {
        let InstanceApply {
            client,
            board,
            k,
            fingerprint,
            now,
        } = apply;
        let reply = loop {
            let (keys, args) = apply_call(board, k, fingerprint, chunk, *now, *raw_ids);
            let call = self.fcall_once(&self.scripts.fold, client, keys, args);
            match self
                .bounded(FOLD_BUDGET as u32, self.timed(&self.scripts.fold, call))
                .await
            {
                // The instance still holds raw ids of the layout before digests: the
                // call wrote nothing, and is repeated with the raw ids.
                Err(e) if !*raw_ids && e.details().contains("ROLLBOARD legacy-seen") => {
                    self.remember_legacy_seen(&k.seen());
                    *raw_ids = true;
                }
                reply => break reply?,
            }
        };
        let statuses = as_array(reply).ok_or_else(|| reply_err("apply: not an array"))?;
        if statuses.len() != chunk.len() {
            return Err(reply_err("apply: one status per event expected"));
        }
        for v in &statuses {
            out.push(match as_i64(v) {
                Some(0) => Outcome::Applied,
                Some(1) => Outcome::Duplicate,
                Some(2) => Outcome::Late,
                Some(3) => Outcome::Overflow,
                _ => return Err(reply_err(format!("apply: unknown status {v:?}"))),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{
        apply_call, apply_chunk, apply_chunk_within, apply_order, fold_call, fold_chunk_len,
        fold_chunk_len_within, fold_chunks, ApplyEvent, CallShape, FCALL_ARGS, FOLD_BUDGET,
        FOLD_EVENT_COST, FOLD_GROUP_COST,
    };
    use crate::domain::board::{Board, Changes, Dedup, Mode, TieBreak, Window};
    use crate::domain::keys::Keys;
    use crate::domain::limits::MAX_REQUEST_ARGS;
    use fred::prelude::Value;
    use std::collections::HashSet;

    const HOUR: i64 = 3_600_000;

    fn board(windows: &[i64], dense_rank: bool, feed: bool) -> Board {
        Board {
            name: "tips".into(),
            member: "user".into(),
            scope: None,
            amount: "amount".into(),
            scale: 0,
            window_ms: windows.iter().copied().max().unwrap_or(HOUR) * HOUR,
            windows: windows
                .iter()
                .map(|&h| Window {
                    name: format!("{h}h"),
                    ms: h * HOUR,
                })
                .collect(),
            slice_ms: HOUR,
            mode: Mode::Incremental,
            tie_break: TieBreak::Earliest,
            allow_negative: false,
            dedup: Dedup::Window,
            dense_rank,
            changes: feed.then_some(Changes {
                top: 3,
                max_len: 100,
            }),
            period: None,
            shards: 1,
        }
    }

    /// Three events of two members over two slices: S = 2, M = 2, G = 3.
    fn events() -> Vec<ApplyEvent> {
        let now = 1_000 * HOUR;
        [("a", 0, "ann"), ("b", HOUR, "ann"), ("c", 0, "bob")]
            .into_iter()
            .map(|(id, back, member)| ApplyEvent {
                id: id.into(),
                ts: now - back,
                member: member.into(),
                amount: 1,
            })
            .collect()
    }

    /// A board with one window: 8 + 2S KEYS (and its feed and distinct totals), 14 + 3S +
    fn tip(id: &str, member: &str) -> ApplyEvent {
        ApplyEvent {
            id: id.into(),
            ts: 0,
            member: member.into(),
            amount: 1,
        }
    }

    /// Member by member, in the order of each member's first event, each member's events
    /// in stream order; stream order kept when an id repeats.
    #[test]
    fn an_instances_events_go_member_by_member_unless_an_id_repeats() {
        let events = [
            tip("1", "b"),
            tip("2", "a"),
            tip("3", "b"),
            tip("4", "c"),
            tip("5", "a"),
            tip("6", "b"),
        ];
        assert_eq!(apply_order(&events), vec![0, 2, 5, 1, 4, 3]);
        let mut repeated = events.clone();
        repeated[5].id = "2".into();
        assert_eq!(apply_order(&repeated), (0..6).collect::<Vec<_>>());
        assert_eq!(apply_order(&events[..2]), vec![0, 1]);
    }

    /// The numbers in one argument and the M names, then the two chain tokens last when
    /// chained: the layout of the calls before boards could have several windows.
    #[test]
    fn a_fold_call_of_one_window_is_laid_out_as_before_several() {
        let k = Keys::new("rb").instance("tips", None);
        for (dense, feed) in [(false, false), (true, true)] {
            let b = board(&[24], dense, feed);
            let call = fold_call(&b, &k, &b.widest().fingerprint(), &events(), 1_000 * HOUR);
            let tail = usize::from(dense) + usize::from(feed);
            assert_eq!(call.keys.len(), 8 + 2 * 2 + tail);
            assert_eq!(call.args.len(), 15 + 2);
            assert_eq!(call.cost, 3 * FOLD_EVENT_COST + 3 * FOLD_GROUP_COST);
            let chained = call.chained(Some("t0"), "t1");
            assert_eq!(chained.args.len(), 15 + 2 + 2);
            assert_eq!(
                chained.args[chained.args.len() - 2..],
                ["t0", "t1"].map(Value::from)
            );
        }
    }

    /// A board with three windows: per narrower window 6 + S KEYS (and its feed and
    /// distinct totals); after the groups the chain tokens ('' until chained), V, the
    /// dense flag and a pair per narrower window; a group costs per window.
    #[test]
    fn a_fold_call_of_several_windows_follows_the_chain_tokens_with_the_narrower_ones() {
        let k = Keys::new("rb").instance("tips", None);
        let b = board(&[24, 1, 168], true, true);
        let call = fold_call(&b, &k, &b.widest().fingerprint(), &events(), 1_000 * HOUR);
        assert_eq!(call.keys.len(), 8 + 2 * 2 + 2 + 2 * (6 + 2 + 2));
        assert_eq!(call.keys[14], "rb:{tips}:w:1h:meta");
        assert_eq!(call.keys[24], "rb:{tips}:w:1d:meta");
        assert_eq!(call.cost, 3 * FOLD_EVENT_COST + 3 * 3 * FOLD_GROUP_COST);
        let groups_end = 15 + 2;
        assert_eq!(call.args.len(), groups_end + 2 + 2 + 2 * 2);
        let chained = call.chained(None, "t1");
        let tail = &chained.args[groups_end..];
        assert_eq!(tail[..2], ["", "t1"].map(Value::from));
        assert_eq!(tail[2], Value::from(2));
        assert_eq!(tail[3], Value::from("1"));
        assert_eq!(tail[4], Value::from(1));
        assert_eq!(tail[6], Value::from(24));
        // Three windows hold about a third of the distinct members of one.
        let many: Vec<ApplyEvent> = (0..100)
            .map(|i| ApplyEvent {
                id: format!("e{i}"),
                ts: 1_000 * HOUR,
                member: format!("m{i}"),
                amount: 1,
            })
            .collect();
        let one = board(&[168], false, false);
        assert_eq!(fold_chunk_len(&one, &many), 25);
        assert_eq!(fold_chunk_len(&b, &many), 9);
    }

    /// Boards of every shape a call's size depends on: one window, three, or eight (the
    /// most a board may have), with and without a change feed and distinct totals.
    fn shapes() -> Vec<Board> {
        let eight = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut out = Vec::new();
        for windows in [&[24][..], &[24, 1, 168], &eight] {
            for (dense, feed) in [(false, false), (true, false), (true, true)] {
                out.push(board(windows, dense, feed));
            }
        }
        out
    }

    /// `n` events cycling over `slices` slices and `members` members.
    fn spread(n: usize, slices: usize, members: usize) -> Vec<ApplyEvent> {
        (0..n)
            .map(|i| ApplyEvent {
                id: format!("e{i}"),
                ts: 1_000 * HOUR - (i % slices) as i64 * HOUR,
                member: format!("m{}", i % members),
                amount: 1,
            })
            .collect()
    }

    /// The arguments of the request that sends `keys` and `args` by `FCALL`.
    fn request(keys: &[String], args: &[Value]) -> usize {
        FCALL_ARGS + keys.len() + args.len()
    }

    /// The counts a call is cut by are the arguments the call builders write, in every
    /// shape of board and call (a fold call counted chained, its largest form).
    #[test]
    fn the_counted_arguments_are_those_the_calls_carry() {
        let k = Keys::new("rb").instance("tips", None);
        for b in shapes() {
            let shape = CallShape::of(&b);
            let fingerprint = b.widest().fingerprint();
            for (n, slices, members) in [(1, 1, 1), (3, 2, 2), (12, 4, 3), (20, 5, 20)] {
                let events = spread(n, slices, members);
                let s = events
                    .iter()
                    .map(|e| b.slice_of(e.ts))
                    .collect::<HashSet<_>>()
                    .len();
                let m = events
                    .iter()
                    .map(|e| e.member.as_str())
                    .collect::<HashSet<_>>()
                    .len();
                let fold = fold_call(&b, &k, &fingerprint, &events, 1_000 * HOUR)
                    .chained(Some("t0"), "t1");
                assert_eq!(request(&fold.keys, &fold.args), shape.fold_args(s, m));
                for raw in [false, true] {
                    let (keys, args) = apply_call(&b, &k, &fingerprint, &events, 1_000 * HOUR, raw);
                    assert_eq!(request(&keys, &args), shape.apply_args(s, m, n, raw));
                }
            }
        }
    }

    /// A fold call is cut where its request would pass the cap: each new member adds its
    /// name, each new slice its keys, a member's further events in one slice nothing.
    #[test]
    fn a_fold_call_is_cut_before_its_request_passes_the_cap() {
        let k = Keys::new("rb").instance("tips", None);
        let b = board(&[24], false, false);
        // 30 arguments and one per member: 5 members fit 35.
        let members = spread(20, 1, 20);
        assert_eq!(CallShape::of(&b).fold_args(1, 5), 35);
        assert_eq!(fold_chunk_len_within(&b, &members, 35, FOLD_BUDGET), 5);
        assert_eq!(fold_chunk_len(&b, &members), 20);
        let call = fold_call(&b, &k, "f", &members[..5], 1_000 * HOUR).chained(None, "t");
        assert_eq!(request(&call.keys, &call.args), 35);
        // One member's events in one slice: the budget cuts, not the cap.
        let one = spread(200, 1, 1);
        assert_eq!(fold_chunk_len_within(&b, &one, 35, FOLD_BUDGET), 145);
        // A new slice adds two keys: 3 slices of one member fit 35 (31 + 2 + 2).
        let slices = spread(10, 10, 1);
        assert_eq!(fold_chunk_len_within(&b, &slices, 35, FOLD_BUDGET), 3);
        // The first event always goes, whatever the cap.
        assert_eq!(fold_chunk_len_within(&b, &members, 1, FOLD_BUDGET), 1);
    }

    /// An apply call holds no more events than keep its request within the cap were each
    /// of another slice and member; at the real cap that is the budget's bound.
    #[test]
    fn an_apply_call_holds_no_more_events_than_fit_the_cap() {
        let b = board(&[24], false, false);
        // 31 arguments and 4 per event (its slice's two keys, its member, its raw id; its
        // digest and numbers ride in two arguments whatever their count).
        assert_eq!(CallShape::of(&b).apply_args(24, 24, 24, true), 31 + 4 * 24);
        assert_eq!(apply_chunk_within(&b, 31 + 4 * 24), 24);
        assert_eq!(apply_chunk_within(&b, 1), 1);
        assert_eq!(apply_chunk(&b), super::APPLY_CHUNK);
        assert_eq!(apply_chunk(&board(&[24, 1, 168], true, true)), 10);
    }

    /// The largest calls any board can send, every event of its own slice and member,
    /// stay within the cap: each fold call of a chain, and an apply call of as many events
    /// as one may hold, raw ids and all.
    #[test]
    fn the_largest_apply_and_fold_calls_fit_one_request() {
        let k = Keys::new("rb").instance("tips", None);
        let events = spread(400, 400, 400);
        for b in shapes() {
            let fingerprint = b.widest().fingerprint();
            for chunk in fold_chunks(&b, &events) {
                let call =
                    fold_call(&b, &k, &fingerprint, chunk, 1_000 * HOUR).chained(Some("a"), "b");
                assert!(request(&call.keys, &call.args) <= MAX_REQUEST_ARGS);
            }
            let chunk = &events[..apply_chunk(&b)];
            let (keys, args) = apply_call(&b, &k, &fingerprint, chunk, 1_000 * HOUR, true);
            assert!(request(&keys, &args) <= MAX_REQUEST_ARGS);
        }
    }

    /// A batch's scopes are registered in `ZADD`s of at most the cap's worth of arguments,
    /// every scope once, in the shares' order, scored by its newest slice.
    #[test]
    fn scopes_are_registered_in_zadds_within_the_cap() {
        let b = board(&[24], false, false);
        let events: Vec<ApplyEvent> = spread(2, 2, 1);
        let scopes: Vec<String> = (0..4_500).map(|i| format!("room{i}")).collect();
        let shares: Vec<(&str, &[ApplyEvent])> =
            scopes.iter().map(|s| (s.as_str(), &events[..])).collect();
        let zadds = super::registrations("rb:board:tips:scopes", &b, &shares);
        assert_eq!(zadds.len(), 3);
        let mut registered = Vec::new();
        for zadd in &zadds {
            let request = 1 + zadd.len();
            assert!(request <= MAX_REQUEST_ARGS);
            assert_eq!(zadd[..2], ["rb:board:tips:scopes", "GT"].map(Value::from));
            for pair in zadd[2..].chunks(2) {
                assert_eq!(pair[0], Value::from(1_000));
                registered.push(pair[1].as_str().expect("a scope").to_string());
            }
        }
        assert_eq!(zadds[0].len(), 2 + 2 * super::REGISTER_PIECE);
        assert_eq!(registered, scopes);
        assert_eq!(super::registrations("k", &b, &shares[..1]).len(), 1);
    }
}
