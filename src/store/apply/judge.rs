//! Small instances judged in the worker and written with native commands.
//!
//! Most instances of a scoped board get an event or two a batch. A packed `fold.lua` call
//! judges each in Lua, and that Lua (its tables, strings and steps, not the commands it
//! runs) is most of what such an instance costs Redis. Here the worker judges the common
//! shape itself instead, exactly as `fold.lua` would, and Redis runs native commands only:
//!
//! 1. `WATCH` every key of the pack's instances, then read what `fold.lua` reads, with the
//!    same variadic commands (`HMGET` of `meta`, of the digest table's state and bucket 0,
//!    of `members` and of each slice's fields; `ZMSCORE` of the slice registry; `LLEN` of
//!    each forget log, so that its type is checked too), pipelined;
//! 2. `ZMSCORE` of the members' ranking entries, whose names the first read gave;
//! 3. judge each instance as `fold.lua` does, and write what it would write, in one
//!    `MULTI` … `EXEC`. An `EXEC` that Redis aborts (another client wrote a watched key in
//!    between: a roll, another replica) wrote nothing, and the pack is read and judged again.
//!
//! The writes are the script's, byte for byte, so the layout is unchanged: a release that
//! judges in Lua only reads and writes the same keys. Whatever the worker does not judge
//! goes to `fold.lua` as before: an instance of another shape (several windows, a change
//! feed, dense rank, negative amounts, a resummarize board), one whose digest table is past
//! one bucket or not yet marked free of the legacy ZSet, one holding a duplicate, a value at
//! the 2^53 - 1 edge, a value that is not written as the scripts write it, a key of another
//! type, or a pack whose `EXEC` was aborted [`TRIES`] times. On a cluster (or behind a proxy
//! that refused a packed call) every instance goes to `fold.lua`; so does every one once the
//! server refuses `WATCH` (an ACL without it), for the rest of the process's life.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use fred::clients::ExclusivePool;
use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::join_all;
use tracing::warn;

use super::{digests_by_slice, ApplyEvent, Grouped, InstanceApply, Outcome};
use crate::domain::board::{Board, Mode, TieBreak};
use crate::store::{Store, StoreError};

/// 2^53 - 1: the largest integer the scripts hold exactly (common.lua's LIMIT).
const LIMIT: i64 = 9_007_199_254_740_991;
/// Entries a digest table's bucket holds on average before it splits (digest.lua).
const LOAD: usize = 16;
/// Bytes of a digest, and of a table entry (the digest and its slice's tag).
const DIGEST: usize = 16;
const ENTRY: usize = 20;
/// Slice tags are slice numbers mod 2^32; an entry counts while its tag is ahead of the
/// forgettable slice by less than 2^31.
const WRAP: i64 = 1 << 32;
const HALF: i64 = 1 << 31;
/// The highest level a digest table's state may name (table_state in digest.lua).
const MAX_LEVEL: u32 = 40;
/// `EXEC`s aborted before a pack goes to `fold.lua` instead.
pub(crate) const TRIES: usize = 3;
/// The most keys one transaction watches (but a single instance's): Redis 7.0 compares
/// each key a `WATCH` names with every key its connection watches already, so a pack's
/// instances go in transactions of about this many keys, at once on connections of
/// their own.
const WATCHED: usize = 64;
/// How long a judge connection waits before it is made again, once lost.
const RECONNECT_DELAY: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest a transaction may take from its `WATCH` being sent to its `EXEC` being
/// sent, less than [`RECONNECT_DELAY`]: past it the transaction is given up (`UNWATCH`)
/// and tried again, so that its `EXEC` cannot reach a connection made after its `WATCH`.
const STALE: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a transaction waits for its connection to be made again.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Connections kept for transactions: `WATCH` belongs to a connection, so each is held by
/// one pack from its `WATCH` to its `EXEC`.
const CONNECTIONS: usize = 4;

/// The work budget of one instance's chunk judged here, in the units of
/// [`FOLD_BUDGET`](super::FOLD_BUDGET): Redis runs native commands only, each a few
/// microseconds a member, so a chunk holds four `fold.lua` calls' worth.
const JUDGE_BUDGET: usize = 4 * super::FOLD_BUDGET;

/// How many events from the front of `events` (one instance's, in the order it judges
/// them) one judged chunk takes: as [`fold_chunk_len`](super::fold_chunk_len), within
/// [`JUDGE_BUDGET`].
pub(crate) fn chunk_len(board: &Board, events: &[ApplyEvent]) -> usize {
    super::fold_chunk_len_within(board, events, super::MAX_REQUEST_ARGS, JUDGE_BUDGET)
}

/// Whether `board`'s instances are of the shape judged here: one window, no change feed,
/// no dense rank, no negative amounts, no calendar period.
pub(crate) fn judges(board: &Board) -> bool {
    !board.has_several_windows()
        && board.incremental_feed().is_none()
        && !board.dense_rank
        && !board.allow_negative
        && board.period.is_none()
}

/// The connections the worker judges on, made at the first need.
pub(crate) struct Judging {
    /// How to connect (the store's own settings), `None` where judging is off.
    builder: Option<Builder>,
    pool: tokio::sync::OnceCell<Option<ExclusivePool>>,
    /// Set once the server refused `WATCH` or `MULTI`: every instance goes to `fold.lua`.
    refused: AtomicBool,
}

impl Judging {
    pub(crate) fn new(builder: Option<Builder>) -> Judging {
        Judging {
            builder,
            pool: tokio::sync::OnceCell::new(),
            refused: AtomicBool::new(false),
        }
    }

    /// Whether instances may be judged here.
    pub(crate) fn on(&self) -> bool {
        self.builder.is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// The connections, made (and their permissions checked) at the first need; `None`
    /// when the server refuses a transaction's commands (judging is then off).
    async fn pool(&self) -> Result<Option<&ExclusivePool>, StoreError> {
        let Some(builder) = &self.builder else {
            return Err(super::reply_err("judging: no connection settings"));
        };
        self.pool
            .get_or_try_init(|| async {
                let mut config = builder
                    .get_config()
                    .cloned()
                    .ok_or_else(|| super::reply_err("judging: no connection settings"))?;
                // A command sent while the connection is being made again fails at once
                // instead of waiting for the new one: a transaction's `EXEC` must reach the
                // connection its `WATCH` did, and a new connection is made only
                // RECONNECT_DELAY after the old one was lost, longer than a transaction is
                // let take (STALE). And each command is sent once: a lost reply fails the
                // batch, whose retry finds the ids it applied.
                config.fail_fast = true;
                let mut own = Builder::from_config(config);
                own.set_performance_config(builder.get_performance_config().clone());
                own.set_connection_config(builder.get_connection_config().clone());
                own.with_connection_config(|c| c.max_command_attempts = 1);
                own.set_policy(fred::types::config::ReconnectPolicy::new_constant(
                    0,
                    RECONNECT_DELAY.as_millis() as u32,
                ));
                let pool = own.build_exclusive_pool(CONNECTIONS)?;
                drop(pool.init().await?);
                // Redis runs the commands after a refused `MULTI` one by one, outside any
                // transaction: a user without it judges nothing here. (A refused `WATCH`
                // is met before any write, and turns judging off then.)
                for client in pool.clients() {
                    let client = client.lock().await;
                    for probe in ["MULTI", "DISCARD"] {
                        let reply: Result<Value, _> =
                            client.custom(command(probe), Vec::<Value>::new()).await;
                        if let Err(e) = reply {
                            if refused(&e) {
                                return Ok(None);
                            }
                            return Err(e.into());
                        }
                    }
                }
                Ok(Some(pool))
            })
            .await
            .map(Option::as_ref)
    }
}

/// Waits (a while) for `client`'s connection, if it is being made again.
async fn connected(client: &Client) -> Result<(), fred::error::Error> {
    if client.is_connected() {
        return Ok(());
    }
    match tokio::time::timeout(CONNECT_WAIT, client.wait_for_connect()).await {
        Ok(connected) => connected,
        Err(_) => Err(fred::error::Error::new(
            fred::error::ErrorKind::IO,
            "judging: no connection to Redis",
        )),
    }
}

/// How one instance was judged here.
enum Verdict {
    /// Not judged here: it goes to `fold.lua`.
    Fold,
    /// Judged, nothing to write (every event late).
    Judged(Vec<Outcome>),
    /// Judged: these writes make it so.
    Write(Vec<Outcome>, Vec<(&'static str, Vec<Value>)>),
}

/// One instance of a pack, with its events grouped as a `fold.lua` call would send them.
struct Instance<'a> {
    apply: &'a InstanceApply<'a>,
    grouped: Grouped<'a>,
    /// The events' digests, slice by slice in the order of `grouped.slices`, and how many
    /// each slice has.
    blob: Vec<u8>,
    counts: Vec<usize>,
    /// Each slice's groups, by index into `grouped.groups`.
    by_slice: Vec<Vec<usize>>,
}

impl<'a> Instance<'a> {
    fn new(apply: &'a InstanceApply<'a>, events: &'a [ApplyEvent]) -> Instance<'a> {
        let grouped = Grouped::of(apply.board, events);
        let (blob, counts) = digests_by_slice(events, &grouped.slice_of, grouped.slices.len());
        let mut by_slice = vec![Vec::new(); grouped.slices.len()];
        for (g, group) in grouped.groups.iter().enumerate() {
            by_slice[group.1].push(g);
        }
        Instance {
            apply,
            grouped,
            blob,
            counts,
            by_slice,
        }
    }

    /// The keys whose values the instance's writes are made from: `meta`, the digest
    /// table, `members`, the ranking (or `totals`) and the slices' fields. Not the slice
    /// registry, which a write adds a live slice to whatever it held (only a roll, which
    /// raises `meta`'s watermark first, removes one), nor the forget logs, which a write
    /// appends to (the roll that takes entries from one changes the digest table too).
    /// Redis 7.0 checks each key a `WATCH` names against every key the connection
    /// watches already, so each one left out saves work that grows with the pack.
    fn watched(&self) -> Vec<String> {
        let k = &self.apply.k;
        let mut keys = vec![
            k.meta(),
            k.members(),
            k.seen_table(),
            if self.incremental() {
                k.result()
            } else {
                k.totals()
            },
        ];
        keys.extend(self.grouped.slices.iter().map(|&n| k.slice(n)));
        keys
    }

    /// How many keys [`Instance::watched`] names.
    fn watched_len(&self) -> usize {
        4 + self.grouped.slices.len()
    }

    /// Whether the instance's board ranks as it applies (else its totals are kept beside
    /// its slices, and a job sums its ranking).
    fn incremental(&self) -> bool {
        self.apply.board.mode == Mode::Incremental
    }

    /// The first reads (see the module documentation), added to `out`: [`Instance::reads`]
    /// commands; on a resummarize board the members' totals too.
    fn read(&self, out: &mut Commands) {
        let k = &self.apply.k;
        let g = &self.grouped;
        let names = |names: &[&str]| names.iter().map(|&n| Value::from(n)).collect();
        out.push(
            "HMGET",
            k.meta(),
            names(&["expired_through", "settings", "gen", "last_roll"]),
        );
        out.push(
            "HMGET",
            k.seen_table(),
            names(&["#L", "#p", "#n", "#c", "0"]),
        );
        out.push("HMGET", k.members(), names(&g.members));
        let numbers: Vec<Value> = g.slices.iter().map(|&n| Value::from(n)).collect();
        out.push("ZMSCORE", k.slices(), numbers);
        for (s, &n) in g.slices.iter().enumerate() {
            let fields: Vec<&str> = self.by_slice[s]
                .iter()
                .map(|&i| g.members[g.groups[i].0])
                .collect();
            out.push("HMGET", k.slice(n), names(&fields));
        }
        for &n in &g.slices {
            out.push("LLEN", k.seen_log(n), Vec::new());
        }
        if !self.incremental() {
            out.push("HMGET", k.totals(), names(&g.members));
        }
    }

    fn reads(&self) -> usize {
        4 + 2 * self.grouped.slices.len() + usize::from(!self.incremental())
    }
}

/// Commands to send together, in order ([`send_all`]).
#[derive(Default)]
struct Commands(Vec<(&'static str, Vec<Value>)>);

impl Commands {
    /// Adds `name key args...`.
    fn push(&mut self, name: &'static str, key: String, args: Vec<Value>) {
        self.0.push((name, with_key(key, args)));
    }

    /// Adds `name args...` (a command without a key, or whose arguments are all keys).
    fn push_args(&mut self, name: &'static str, args: Vec<Value>) {
        self.0.push((name, args));
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Sends `commands` on `client`, in their order and in one write (but after a `MULTI`: see
/// [`issue`]), and waits for every reply: each reply (or error) in the commands' order.
/// Each command is sent as it is first polled, so they are polled once each, in order,
/// before any is awaited; fred writes the commands queued together at once (a `Pipeline`
/// would flush after each command: a system call and a read by Redis each). Each is
/// written once (the connection's `max_command_attempts` is 1): a command never reaches a
/// connection other than the one the ones before it went to.
async fn send_all(client: &Client, commands: Commands) -> Vec<Result<Value, fred::error::Error>> {
    use futures_util::future::maybe_done;
    let mut sent: Vec<_> = commands
        .0
        .into_iter()
        .map(|(name, args)| maybe_done(issue(client, name, args)))
        .collect();
    std::future::poll_fn(|cx| {
        for one in &mut sent {
            let _ = std::future::Future::poll(std::pin::Pin::new(&mut *one), cx);
        }
        std::task::Poll::Ready(())
    })
    .await;
    for one in &mut sent {
        one.await;
    }
    sent.into_iter()
        .map(|mut one| {
            std::pin::Pin::new(&mut one)
                .take_output()
                .unwrap_or_else(|| Err(fred::error::Error::new_canceled()))
        })
        .collect()
}

/// Sends `name args...` on `client`: as fred's own command where it has one, so that the
/// commands queued after it go out in the same write (fred flushes the connection after
/// every custom command, and where nothing else is queued); `MULTI` and `EXEC`, which have
/// none outside fred's transactions, as custom commands (each ends a write).
fn issue(
    client: &Client,
    name: &'static str,
    mut args: Vec<Value>,
) -> futures_util::future::BoxFuture<'static, Result<Value, fred::error::Error>> {
    use futures_util::FutureExt;
    let client = client.clone();
    async move {
        let key = |v: Value| -> Key {
            match v {
                Value::Bytes(b) => Key::from(b),
                Value::String(s) => Key::from(s),
                other => Key::from(other.as_string().unwrap_or_default()),
            }
        };
        let keys = |args: Vec<Value>| -> Vec<Key> { args.into_iter().map(key).collect() };
        let rest = if args.is_empty() {
            Vec::new()
        } else {
            args.split_off(1)
        };
        let first = args.pop().map(key);
        let k = || first.clone().unwrap_or_else(|| Key::from(""));
        match name {
            "WATCH" => {
                let mut all: Vec<Key> = first.into_iter().collect();
                all.extend(keys(rest));
                client.watch(all).await.map(|()| Value::from("OK"))
            }
            "UNWATCH" => client.unwatch().await.map(|()| Value::from("OK")),
            "HMGET" => client.hmget(k(), keys(rest)).await,
            "HDEL" => client.hdel(k(), keys(rest)).await,
            "HSET" => {
                let mut pairs = Vec::with_capacity(rest.len() / 2);
                let mut it = rest.into_iter();
                while let (Some(f), Some(v)) = (it.next(), it.next()) {
                    pairs.push((key(f), v));
                }
                client.hset(k(), pairs).await
            }
            "ZMSCORE" => client.zmscore(k(), rest).await,
            "ZREM" => client.zrem(k(), rest).await,
            "ZADD" => {
                // Scores are exact integers (at most 2^53 - 1), which an f64 holds and
                // fred writes back digit for digit.
                let mut pairs = Vec::with_capacity(rest.len() / 2);
                let mut it = rest.into_iter();
                while let (Some(score), Some(member)) = (it.next(), it.next()) {
                    let score = score
                        .as_string()
                        .and_then(|s| s.parse::<i64>().ok())
                        .ok_or_else(|| {
                            fred::error::Error::new(
                                fred::error::ErrorKind::InvalidArgument,
                                "judging: a score that is not an integer",
                            )
                        })?;
                    pairs.push((score as f64, member));
                }
                client.zadd(k(), None, None, false, false, pairs).await
            }
            "RPUSH" => client.rpush(k(), rest).await,
            "LLEN" => client.llen(k()).await,
            "ZCARD" => client.zcard(k()).await,
            "EXISTS" => client.exists(k()).await,
            _ => {
                let mut all: Vec<Value> = first.map(Value::from).into_iter().collect();
                all.extend(rest);
                client.custom(command(name), all).await
            }
        }
    }
    .boxed()
}

/// A custom command routed by its first key.
fn command(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

fn with_key(key: String, rest: Vec<Value>) -> Vec<Value> {
    let mut args = Vec::with_capacity(1 + rest.len());
    args.push(Value::from(key));
    args.extend(rest);
    args
}

/// A bulk reply's bytes (`None` for nil), or `Err` for any other reply.
fn bulk(v: &Value) -> Result<Option<&[u8]>, ()> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.as_bytes())),
        Value::Bytes(b) => Ok(Some(b)),
        _ => Err(()),
    }
}

/// The items of an array reply of `n` items.
fn items(v: &Value, n: usize) -> Result<&[Value], ()> {
    match v {
        Value::Array(items) if items.len() == n => Ok(items),
        _ => Err(()),
    }
}

/// An integer as the scripts read one (`integer` in common.lua) where that reading agrees
/// with Rust's: digits with an optional sign, at most 2^53 - 1 in magnitude. Anything else
/// (a form only Lua reads, or a corrupt value) is left to the script.
fn integer(v: &[u8]) -> Result<i64, ()> {
    let n: i64 = std::str::from_utf8(v)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    if n.abs() > LIMIT {
        return Err(());
    }
    Ok(n)
}

/// An integer written as the scripts write one (`counter` in common.lua).
fn counter(v: &[u8]) -> Result<i64, ()> {
    let n = integer(v)?;
    if n.to_string().as_bytes() != v {
        return Err(());
    }
    Ok(n)
}

/// The ZSet member of `name` with tie-break time `t` (members.lua's `zmember_at`).
fn zmember_at(name: &str, t: i64, tie: TieBreak) -> String {
    match tie {
        TieBreak::None => name.to_string(),
        TieBreak::Earliest => format!("{:016}:{name}", LIMIT - t),
        TieBreak::Latest => format!("{t:016}:{name}"),
    }
}

/// The ZSet member and tie-break time that a `members` value stands for, in the form the
/// scripts write today (a time); an older form, or a corrupt one, is left to the script.
fn zmember_of(v: &[u8], name: &str, tie: TieBreak) -> Result<(String, Option<i64>), ()> {
    if tie == TieBreak::None {
        return Ok((name.to_string(), None));
    }
    if v.is_empty() || v.len() > 16 || !v.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    let t: i64 = std::str::from_utf8(v)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    if t > LIMIT {
        return Err(());
    }
    Ok((zmember_at(name, t, tie), Some(t)))
}

/// The 4-byte tag of slice `n` (digest.lua's `tag_of`).
fn tag_of(n: i64) -> [u8; 4] {
    (n.rem_euclid(WRAP) as u32).to_be_bytes()
}

/// The bucket hash of a digest or table entry: its first four bytes, big-endian.
fn hash_of(d: &[u8]) -> u64 {
    u64::from(u32::from_be_bytes([d[0], d[1], d[2], d[3]]))
}

/// The bucket of hash `h` in a table of level `level` and split pointer `split` (`locate`
/// in digest.lua).
fn address(h: u64, level: u32, split: u64) -> u64 {
    let x = h % (1 << level);
    if x < split {
        h % (1 << (level + 1))
    } else {
        x
    }
}

/// Whether a table entry still counts: its slice tag is ahead of `through` (the newest
/// forgettable slice, mod 2^32) by less than 2^31 (`held_of` in digest.lua).
fn counts(entry: &[u8], through: i64) -> bool {
    let tag = i64::from(u32::from_be_bytes([
        entry[16], entry[17], entry[18], entry[19],
    ]));
    let x = (tag - through).rem_euclid(WRAP);
    x > 0 && x < HALF
}

/// The buckets that holding `n` entries would split, in order, in a table of level
/// `level` and split pointer `split` (`splits_ahead` in digest.lua); `Err` past `most`
/// (a table whose state says more than its inserts can make: left to the script).
fn splits_ahead(level: u32, split: u64, n: usize, most: usize) -> Result<Vec<u64>, ()> {
    let (mut sp, mut size) = (split, 1u64 << level);
    let mut out = Vec::new();
    while n as u64 > LOAD as u64 * (size + sp) {
        if out.len() == most {
            return Err(());
        }
        out.push(sp);
        sp += 1;
        if sp == size {
            sp = 0;
            size *= 2;
        }
    }
    Ok(out)
}

/// Which of an instance's slices are late, and where its live digests are in the digest
/// table: what the second reads need.
struct Plan {
    late: Vec<bool>,
    /// The events in slices that are not late.
    live: usize,
    /// The bucket of each digest of the instance's blob (0 for a late one's).
    addr: Vec<u64>,
    /// The buckets to read besides bucket 0 (read with the table's state): those the live
    /// digests are in and those their inserts would split.
    wanted: Vec<u64>,
    /// How many splits the inserts make at most (their buckets are in `wanted`).
    splits: usize,
    /// Whether the legacy `seen` ZSet must be found absent (watched, then `EXISTS`)
    /// before the table is marked free of it: a table not yet marked, written to.
    legacy_check: bool,
}

fn plan(inst: &Instance<'_>, read: &Read<'_>) -> Result<Plan, ()> {
    let board = inst.apply.board;
    let g = &inst.grouped;
    let late: Vec<bool> = g
        .slices
        .iter()
        .map(|&n| n <= read.watermark || board.forget_at(n) <= read.now)
        .collect();
    let live: usize = inst
        .counts
        .iter()
        .zip(&late)
        .filter(|(_, &l)| !l)
        .map(|(c, _)| c)
        .sum();
    let mut addr = vec![0u64; inst.blob.len() / DIGEST];
    let mut wanted = Vec::new();
    let mut splits = 0;
    if live > 0 {
        let mut listed: HashSet<u64> = HashSet::from([0]);
        let mut k = 0;
        for (s, &c) in inst.counts.iter().enumerate() {
            if !late[s] {
                for (j, a) in addr.iter_mut().enumerate().skip(k).take(c) {
                    *a = address(hash_of(&inst.blob[j * DIGEST..]), read.level, read.split);
                    if listed.insert(*a) {
                        wanted.push(*a);
                    }
                }
            }
            k += c;
        }
        // At most one split per LOAD inserts, and one more.
        let ahead = splits_ahead(read.level, read.split, read.held + live, live / LOAD + 1)?;
        splits = ahead.len();
        for a in ahead {
            if listed.insert(a) {
                wanted.push(a);
            }
        }
    }
    Ok(Plan {
        late,
        live,
        addr,
        wanted,
        splits,
        legacy_check: live > 0 && !read.clean,
    })
}

/// The buckets an instance's judgement reads: bucket 0 from the first reads, the others
/// of `plan.wanted` from `reply` (their `HMGET`), each a whole number of entries.
fn buckets_of<'r>(
    read: &Read<'r>,
    plan: &Plan,
    reply: Option<&'r Value>,
) -> Result<HashMap<u64, &'r [u8]>, ()> {
    let mut buckets = HashMap::from([(0, read.bucket)]);
    if let Some(reply) = reply {
        for (&a, v) in plan.wanted.iter().zip(items(reply, plan.wanted.len())?) {
            let v = bulk(v)?.unwrap_or_default();
            if v.len() % ENTRY != 0 {
                return Err(());
            }
            buckets.insert(a, v);
        }
    }
    Ok(buckets)
}

/// The state the first reads gave one instance, checked.
struct Read<'r> {
    /// The time the events are judged at, the watermark and `gen` (gate.lua).
    now: i64,
    watermark: i64,
    gen: i64,
    /// Whether `meta` holds no settings yet.
    unpinned: bool,
    /// The digest table's level, split pointer and entries held (0, 0, 0 for a table
    /// with no state yet: `stated` false), and its bucket 0.
    level: u32,
    split: u64,
    held: usize,
    stated: bool,
    bucket: &'r [u8],
    /// Whether `#c` marks the instance free of the legacy `seen` ZSet (else the second
    /// reads check that it holds none, as `fold.lua` does, and the writes mark it).
    clean: bool,
    /// Each member's `members` value.
    members: &'r [Value],
    /// Whether the registry lists each slice.
    listed: Vec<bool>,
    /// Each slice's fields of its groups, in `by_slice` order.
    fields: Vec<&'r [Value]>,
    /// Each member's total on a resummarize board (`None`: an incremental one, whose
    /// totals are scores, read next).
    totals: Option<&'r [Value]>,
}

/// Checks the first reads of `inst` (`replies`: its 4 + 2S replies) as gate.lua,
/// digest.lua and members.lua would, leaving to the script whatever they would refuse or
/// this side does not judge.
fn first_reads<'r>(inst: &Instance<'_>, replies: &'r [Value]) -> Result<Read<'r>, ()> {
    let board = inst.apply.board;
    let g = &inst.grouped;
    let s_count = g.slices.len();
    let meta = items(&replies[0], 4)?;
    let (expired, settings, gen, rolled) = (
        bulk(&meta[0])?,
        bulk(&meta[1])?,
        bulk(&meta[2])?,
        bulk(&meta[3])?,
    );
    let mut now = inst.apply.now;
    if let Some(rolled) = rolled {
        now = now.max(counter(rolled)?);
    }
    let gen = match gen {
        Some(gen) => counter(gen)?,
        None => 0,
    };
    if settings.is_some_and(|s| s != inst.apply.fingerprint.as_bytes()) {
        return Err(());
    }
    let widest = board.widest();
    let mut watermark = now.div_euclid(board.slice_ms) - widest.slices_in_window();
    if let Some(expired) = expired {
        watermark = watermark.max(integer(expired)?);
    }
    let table = items(&replies[1], 5)?;
    let (l, p, n, clean, bucket) = (
        bulk(&table[0])?,
        bulk(&table[1])?,
        bulk(&table[2])?,
        bulk(&table[3])?,
        bulk(&table[4])?,
    );
    // A table with no state (a new instance's), or one with a state in range
    // (table_state in digest.lua); any other is left to the script, which refuses it.
    let (level, split, held, stated) = match (l, p, n) {
        (None, None, None) => (0, 0, 0, false),
        (Some(l), Some(p), Some(n)) => {
            let level = u32::try_from(integer(l)?).map_err(|_| ())?;
            let split = u64::try_from(integer(p)?).map_err(|_| ())?;
            if level > MAX_LEVEL || split >= 1 << level {
                return Err(());
            }
            let held = usize::try_from(integer(n)?).map_err(|_| ())?;
            (level, split, held, true)
        }
        _ => return Err(()),
    };
    let bucket = bucket.unwrap_or_default();
    if bucket.len() % ENTRY != 0 {
        return Err(());
    }
    let members = items(&replies[2], g.members.len())?;
    let listed = items(&replies[3], s_count)?
        .iter()
        .map(|v| bulk(v).map(|v| v.is_some()))
        .collect::<Result<Vec<bool>, ()>>()?;
    let mut fields = Vec::with_capacity(s_count);
    for s in 0..s_count {
        fields.push(items(&replies[4 + s], inst.by_slice[s].len())?);
    }
    for log in &replies[4 + s_count..4 + 2 * s_count] {
        if !matches!(log, Value::Integer(_)) {
            return Err(());
        }
    }
    let totals = match replies.get(4 + 2 * s_count) {
        Some(totals) => Some(items(totals, g.members.len())?),
        None => None,
    };
    Ok(Read {
        now,
        watermark,
        gen,
        unpinned: settings.is_none(),
        level,
        split,
        held,
        stated,
        // digest.lua reads no mark without a state.
        clean: stated && clean == Some(b"1".as_slice()),
        bucket,
        members,
        listed,
        fields,
        totals,
    })
}

/// Each member's ZSet member and tie-break time before the call (`None` for a member
/// `members` does not know), from the first reads.
type Known = Vec<Option<(String, Option<i64>)>>;

fn known_members(inst: &Instance<'_>, read: &Read<'_>) -> Result<Known, ()> {
    let tie = inst.apply.board.tie_break;
    inst.grouped
        .members
        .iter()
        .zip(read.members)
        .map(|(name, v)| match bulk(v)? {
            Some(v) => zmember_of(v, name, tie).map(Some),
            None => Ok(None),
        })
        .collect()
}

/// Judges `inst` from its reads as `fold.lua` would (`scores`: on an incremental board the
/// `ZMSCORE` of its known members' ZSet members, in order), and says what to write.
fn judge(
    inst: &Instance<'_>,
    read: &Read<'_>,
    known: &Known,
    scores: &[Value],
    plan: &Plan,
    buckets: &HashMap<u64, &[u8]>,
) -> Result<Verdict, ()> {
    let board = inst.apply.board;
    let g = &inst.grouped;
    let through = board.forgettable_through(inst.apply.now).rem_euclid(WRAP);
    let now = read.now;
    let (late, live) = (&plan.late, plan.live);
    let outcomes: Vec<Outcome> = g
        .slice_of
        .iter()
        .map(|&s| {
            if late[s] {
                Outcome::Late
            } else {
                Outcome::Applied
            }
        })
        .collect();
    if live == 0 {
        return Ok(Verdict::Judged(outcomes));
    }
    // A live digest its bucket holds in an entry that still counts (held_of in
    // digest.lua) goes to the script, which judges duplicates.
    let bucket = |a: u64| buckets.get(&a).copied().ok_or(());
    let mut slice_digests = Vec::with_capacity(g.slices.len());
    let mut at = 0;
    for &c in &inst.counts {
        slice_digests.push((at / DIGEST, &inst.blob[at..at + DIGEST * c]));
        at += DIGEST * c;
    }
    for (s, &(first, digests)) in slice_digests.iter().enumerate() {
        if late[s] {
            continue;
        }
        for (k, d) in (first..).zip(digests.chunks_exact(DIGEST)) {
            let held = bucket(plan.addr[k])?
                .chunks_exact(ENTRY)
                .any(|e| &e[..DIGEST] == d && counts(e, through));
            if held {
                return Err(());
            }
        }
    }
    // Member state: totals, by their scores or their fields in `totals`.
    let mut total0 = vec![0i64; g.members.len()];
    match read.totals {
        Some(totals) => {
            for (m, v) in totals.iter().enumerate() {
                if let Some(v) = bulk(v)? {
                    total0[m] = integer(v)?;
                }
            }
        }
        None => {
            let mut scored = scores.iter();
            for (m, known) in known.iter().enumerate() {
                if known.is_some() {
                    let score = scored.next().ok_or(())?;
                    if let Some(score) = bulk(score)? {
                        total0[m] = integer(score)?;
                    }
                }
            }
        }
    }
    // The live groups: each member's bound, newest time, new total; each field's value.
    let mut bound = vec![0i64; g.members.len()];
    let mut newest: Vec<Option<i64>> = vec![None; g.members.len()];
    let mut total = total0.clone();
    let mut slice_writes: Vec<(usize, Vec<Value>)> = Vec::new();
    for (s, groups) in inst.by_slice.iter().enumerate() {
        if late[s] || groups.is_empty() {
            continue;
        }
        let mut pairs = Vec::with_capacity(2 * groups.len());
        for (k, &gi) in groups.iter().enumerate() {
            let (m, _, sum, abs, ts) = g.groups[gi];
            // A time the scripts hold only rounded (below 0, past 2^53 - 1: the Store
            // API's, never an event's) is theirs to write.
            if !(0..=LIMIT).contains(&ts) {
                return Err(());
            }
            let old = match bulk(&read.fields[s][k])? {
                Some(v) => Some(integer(v)?),
                None => None,
            };
            if old.unwrap_or(0).abs().saturating_add(abs) > LIMIT {
                return Err(());
            }
            bound[m] = bound[m].saturating_add(abs);
            newest[m] = Some(newest[m].map_or(ts, |t: i64| t.max(ts)));
            total[m] += sum;
            pairs.push(Value::from(g.members[m]));
            pairs.push(Value::from((old.unwrap_or(0) + sum).to_string()));
        }
        slice_writes.push((s, pairs));
    }
    if total0
        .iter()
        .zip(&bound)
        .any(|(t, b)| t.abs().saturating_add(*b) > LIMIT)
    {
        return Err(());
    }

    // The writes, in fold.lua's order.
    let k = &inst.apply.k;
    let mut writes: Vec<(&'static str, Vec<Value>)> = Vec::new();
    // The inserts, then the splits they call for (write_table in digest.lua).
    let mut dirty: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (s, &(first, digests)) in slice_digests.iter().enumerate() {
        if late[s] {
            continue;
        }
        let tag = tag_of(g.slices[s]);
        let mut log = vec![Value::from(k.seen_log(g.slices[s]))];
        for (k, d) in (first..).zip(digests.chunks_exact(DIGEST)) {
            let a = plan.addr[k];
            let v = match dirty.entry(a) {
                std::collections::btree_map::Entry::Occupied(v) => v.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => v.insert(bucket(a)?.to_vec()),
            };
            v.extend_from_slice(d);
            v.extend_from_slice(&tag);
            log.push(Value::Bytes(d[..4].to_vec().into()));
        }
        writes.push(("RPUSH", log));
    }
    // `#n` may count fewer entries than the table holds (a bucket written before the
    // table had a state): a split that drops forgettable entries then takes it below 0,
    // as digest.lua's does. The splits are those `plan` read the buckets of, no more.
    let (mut level, mut split) = (read.level, read.split);
    let mut held = (read.held + live) as i64;
    let mut size = 1u64 << level;
    let mut splits = 0;
    while held > (LOAD as u64 * (size + split)) as i64 {
        splits += 1;
        if splits > plan.splits {
            return Err(());
        }
        let v = match dirty.get(&split) {
            Some(v) => v.clone(),
            None => bucket(split)?.to_vec(),
        };
        let (mut stay, mut moved) = (Vec::new(), Vec::new());
        for e in v.chunks_exact(ENTRY) {
            if !counts(e, through) {
                held -= 1;
            } else if hash_of(e) % (2 * size) == split {
                stay.extend_from_slice(e);
            } else {
                moved.extend_from_slice(e);
            }
        }
        dirty.insert(split, stay);
        dirty.insert(split + size, moved);
        split += 1;
        if split == size {
            (level, split, size) = (level + 1, 0, 2 * size);
        }
    }
    let mut table = vec![
        Value::from(k.seen_table()),
        Value::from("#n"),
        Value::from(held.to_string()),
    ];
    if !read.stated || level != read.level {
        table.push(Value::from("#L"));
        table.push(Value::from(level.to_string()));
    }
    if !read.stated || split != read.split {
        table.push(Value::from("#p"));
        table.push(Value::from(split.to_string()));
    }
    if !read.clean {
        table.push(Value::from("#c"));
        table.push(Value::from("1"));
    }
    let mut emptied = vec![Value::from(k.seen_table())];
    for (a, v) in dirty {
        if v.is_empty() {
            emptied.push(Value::from(a.to_string()));
        } else {
            table.push(Value::from(a.to_string()));
            table.push(Value::Bytes(v.into()));
        }
    }
    writes.push(("HSET", table));
    if emptied.len() > 1 {
        writes.push(("HDEL", emptied));
    }
    let mut registered = vec![Value::from(k.slices())];
    for (s, pairs) in slice_writes {
        let n = g.slices[s];
        writes.push(("HSET", with_key(k.slice(n), pairs)));
        if !read.listed[s] {
            registered.push(Value::from(n.to_string()));
            registered.push(Value::from(n.to_string()));
        }
    }
    if registered.len() > 1 {
        writes.push(("ZADD", registered));
    }
    let tie = board.tie_break;
    let incremental = read.totals.is_none();
    let (mut moved, mut removed, mut added, mut totals) = (
        vec![Value::from(k.members())],
        vec![Value::from(k.result())],
        vec![Value::from(k.result())],
        vec![Value::from(k.totals())],
    );
    for (m, name) in g.members.iter().enumerate() {
        let Some(t) = newest[m] else {
            continue;
        };
        let old = known[m].as_ref();
        let zi = match (tie, old) {
            (TieBreak::None, _) => name.to_string(),
            (_, Some((z, Some(t0)))) if t <= *t0 => z.clone(),
            _ => zmember_at(name, t, tie),
        };
        let changed = old.is_none_or(|(z, _)| *z != zi);
        if changed {
            moved.push(Value::from(*name));
            moved.push(Value::from(match tie {
                TieBreak::None => String::new(),
                _ => t.to_string(),
            }));
        }
        if !incremental {
            // write_members: a resummarize board's total beside its slices; its ranking
            // is the job's.
            if total[m] != total0[m] || old.is_none() {
                totals.push(Value::from(*name));
                totals.push(Value::from(total[m].to_string()));
            }
            continue;
        }
        if let Some((z, _)) = old.filter(|_| changed) {
            removed.push(Value::from(z.as_str()));
        }
        if changed || total[m] != total0[m] {
            added.push(Value::from(total[m].to_string()));
            added.push(Value::from(zi));
        }
    }
    for (cmd, args) in [
        ("HSET", moved),
        ("ZREM", removed),
        ("ZADD", added),
        ("HSET", totals),
    ] {
        if args.len() > 1 {
            writes.push((cmd, args));
        }
    }
    let mut meta = vec![
        Value::from(k.meta()),
        Value::from("gen"),
        Value::from((read.gen + 1).to_string()),
        Value::from("changed_ms"),
        Value::from(now.to_string()),
    ];
    if read.unpinned {
        meta.push(Value::from("settings"));
        meta.push(Value::from(inst.apply.fingerprint.as_str()));
    }
    writes.push(("HSET", meta));
    Ok(Verdict::Write(outcomes, writes))
}

/// Whether `e` says the server refused the command itself (an ACL without it, a proxy
/// that does not pass it, or one that takes the keys of one slot a command), rather than
/// failing it on its data.
fn refused(e: &fred::error::Error) -> bool {
    let details = e.details();
    details.starts_with("NOPERM")
        || details.starts_with("ERR unknown command")
        || details.starts_with("CROSSSLOT")
}

/// Whether `e` is the connection's, not the command's.
fn lost(e: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Timeout | ErrorKind::Tls
    )
}

impl Store {
    /// Judges the instances of one pack here where it can (see the module documentation):
    /// for each, in order, its outcomes (in the order of its events), or `None` for one
    /// left to `fold.lua`.
    pub(super) async fn judge_pack(
        &self,
        pack: &[(&InstanceApply<'_>, &[ApplyEvent])],
        weight: u32,
    ) -> Vec<Option<Result<Vec<Outcome>, StoreError>>> {
        let none = || pack.iter().map(|_| None).collect();
        if !self.judging.on() {
            return none();
        }
        let pool = match self.judging.pool().await {
            Ok(Some(pool)) => pool,
            Ok(None) => {
                warn!("the server refuses MULTI: every instance is judged by fold.lua");
                self.judging.refused.store(true, Ordering::Relaxed);
                return none();
            }
            Err(e) => return pack.iter().map(|_| Some(Err(e.clone()))).collect(),
        };
        // An instance met a second time in the pack (one scope in two shares) goes to
        // `fold.lua`, after the first is written: judged together, both would be judged
        // from the state before either.
        let mut met = HashSet::new();
        let (mut judged, mut again) = (Vec::new(), Vec::new());
        for (i, &(apply, events)) in pack.iter().enumerate() {
            if met.insert(apply.k.meta()) {
                judged.push(Instance::new(apply, events));
            } else {
                again.push(i);
            }
        }
        let instances = judged;
        // Transactions of at most WATCHED keys each, on connections of their own, at once.
        let mut groups: Vec<&[Instance]> = Vec::new();
        let (mut from, mut keys) = (0, 0);
        for (i, inst) in instances.iter().enumerate() {
            let own = inst.watched_len();
            if i > from && keys + own > WATCHED {
                groups.push(&instances[from..i]);
                (from, keys) = (i, 0);
            }
            keys += own;
        }
        groups.push(&instances[from..]);
        let share = weight / groups.len() as u32;
        let out: Vec<_> = join_all(
            groups
                .into_iter()
                .map(|group| self.judge_group(pool, group, share)),
        )
        .await
        .into_iter()
        .flatten()
        .collect();
        let mut out = out;
        for i in again {
            out.insert(i, None);
        }
        if let Some(metrics) = &self.metrics {
            let worker = out
                .iter()
                .filter(|o| o.as_ref().is_some_and(Result::is_ok))
                .count();
            let script = out.iter().filter(|o| o.is_none()).count();
            metrics.judged(worker as u64, script as u64);
        }
        out
    }

    /// [`Store::judge_pack`] for one transaction's instances, on a connection of its own.
    async fn judge_group(
        &self,
        pool: &ExclusivePool,
        instances: &[Instance<'_>],
        weight: u32,
    ) -> Vec<Option<Result<Vec<Outcome>, StoreError>>> {
        let none = || instances.iter().map(|_| None).collect();
        self.bounded(weight, async {
            let client = pool.acquire().await;
            if let Err(e) = connected(&client).await {
                let e = StoreError::from(e);
                return instances.iter().map(|_| Some(Err(e.clone()))).collect();
            }
            for _ in 0..TRIES {
                match self.judge_once(&client, instances).await {
                    Ok(Some(out)) => return out,
                    Ok(None) => {
                        if let Some(metrics) = &self.metrics {
                            metrics.judge_aborted();
                        }
                        continue;
                    }
                    Err(e) if refused(&e) => {
                        warn!(
                            error = %e,
                            "the server refused a transaction: every instance is judged by fold.lua from now on"
                        );
                        self.judging.refused.store(true, Ordering::Relaxed);
                        let _: Result<(), _> = client.unwatch().await;
                        return none();
                    }
                    Err(e) => {
                        let e = StoreError::from(e);
                        return instances.iter().map(|_| Some(Err(e.clone()))).collect();
                    }
                }
            }
            // Aborted every time: a busy instance, left to the scripts.
            none()
        })
        .await
    }

    /// One try of [`Store::judge_pack`] on `client`: `None` when Redis aborted its `EXEC`.
    #[allow(clippy::type_complexity)]
    async fn judge_once(
        &self,
        client: &Client,
        instances: &[Instance<'_>],
    ) -> Result<Option<Vec<Option<Result<Vec<Outcome>, StoreError>>>>, fred::error::Error> {
        let watched: Vec<Value> = instances
            .iter()
            .flat_map(Instance::watched)
            .map(Value::from)
            .collect();
        let started = std::time::Instant::now();
        let mut first = Commands::default();
        first.push_args("WATCH", watched);
        for inst in instances {
            inst.read(&mut first);
        }
        let mut replies = send_all(client, first).await.into_iter();
        match replies.next() {
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => return Err(fred::error::Error::new_canceled()),
        }
        // Each instance's first reads, checked; an error among them (a key of another
        // type) leaves the instance to the script, which answers it.
        let mut firsts: Vec<Option<Vec<Value>>> = Vec::with_capacity(instances.len());
        for inst in instances {
            let mut own = Vec::with_capacity(inst.reads());
            let mut failed = false;
            for _ in 0..inst.reads() {
                match replies.next() {
                    Some(Ok(v)) => own.push(v),
                    Some(Err(e)) if lost(&e) => return Err(e),
                    _ => failed = true,
                }
            }
            firsts.push((!failed).then_some(own));
        }
        let reads: Vec<Option<(Read, Known)>> = instances
            .iter()
            .zip(&firsts)
            .map(|(inst, replies)| {
                let read = first_reads(inst, replies.as_deref()?).ok()?;
                let known = known_members(inst, &read).ok()?;
                Some((read, known))
            })
            .collect();
        let plans: Vec<Option<Plan>> = instances
            .iter()
            .zip(&reads)
            .map(|(inst, read)| plan(inst, &read.as_ref()?.0).ok())
            .collect();
        // The second reads: on an incremental board the ranking entries of the known
        // members (a resummarize one's totals were read with the rest), and the digest
        // table's buckets past bucket 0 that the judgement needs.
        let mut second = Commands::default();
        for ((inst, read), plan) in instances.iter().zip(&reads).zip(&plans) {
            let (Some((_, known)), Some(plan)) = (read, plan) else {
                continue;
            };
            if inst.incremental() {
                let zs: Vec<Value> = known
                    .iter()
                    .flatten()
                    .map(|(z, _)| Value::from(z.as_str()))
                    .collect();
                if zs.is_empty() {
                    second.push("ZCARD", inst.apply.k.result(), Vec::new());
                } else {
                    second.push("ZMSCORE", inst.apply.k.result(), zs);
                }
            }
            if !plan.wanted.is_empty() {
                let fields = plan.wanted.iter().map(|a| Value::from(a.to_string()));
                second.push("HMGET", inst.apply.k.seen_table(), fields.collect());
            }
            if plan.legacy_check {
                second.push("WATCH", inst.apply.k.seen(), Vec::new());
                second.push("EXISTS", inst.apply.k.seen(), Vec::new());
            }
        }
        let mut seconds = if second.is_empty() {
            Vec::new().into_iter()
        } else {
            send_all(client, second).await.into_iter()
        };
        // Each instance's second replies, taken in the order they were queued: its
        // scores, `None` where its read failed on the data (left to the script).
        let mut next = |wanted: bool| -> Result<Option<Option<Value>>, fred::error::Error> {
            if !wanted {
                return Ok(Some(None));
            }
            match seconds.next() {
                Some(Ok(v)) => Ok(Some(Some(v))),
                Some(Err(e)) if lost(&e) => Err(e),
                _ => Ok(None),
            }
        };
        let mut verdicts = Vec::with_capacity(instances.len());
        for ((inst, read), plan) in instances.iter().zip(&reads).zip(&plans) {
            let (Some((read, known)), Some(plan)) = (read, plan) else {
                verdicts.push(Verdict::Fold);
                continue;
            };
            let scores = next(inst.incremental())?;
            let buckets = next(!plan.wanted.is_empty())?;
            let watched = next(plan.legacy_check)?;
            let legacy = next(plan.legacy_check)?;
            let verdict = (|| {
                let scores = match scores.ok_or(())? {
                    Some(Value::Array(scores)) => scores,
                    Some(Value::Integer(_)) | None => Vec::new(),
                    Some(_) => return Err(()),
                };
                let buckets = buckets_of(read, plan, buckets.as_ref().ok_or(())?.as_ref())?;
                // A table not yet marked: judged here only when no legacy ZSet exists.
                watched.ok_or(())?;
                match legacy.ok_or(())? {
                    None | Some(Value::Integer(0)) => {}
                    Some(_) => return Err(()),
                }
                judge(inst, read, known, &scores, plan, &buckets)
            })();
            verdicts.push(verdict.unwrap_or(Verdict::Fold));
        }
        let writes: usize = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Write(_, w) => w.len(),
                _ => 0,
            })
            .sum();
        if writes == 0 {
            let _: Value = client
                .custom(command("UNWATCH"), Vec::<Value>::new())
                .await?;
        } else {
            // `MULTI`, the writes and `EXEC` as plain commands in one pipeline, each
            // written once: fred's own transactions are sent again on a new connection
            // when the first one is lost, and there, without the `WATCH` that guarded
            // them, they would apply a second time what Redis may already have run.
            if started.elapsed() > STALE {
                // Too long since the `WATCH` (see STALE): read and judged again.
                let _: Value = client
                    .custom(command("UNWATCH"), Vec::<Value>::new())
                    .await?;
                return Ok(None);
            }
            let mut trx = Commands::default();
            trx.push_args("MULTI", Vec::new());
            for verdict in &mut verdicts {
                if let Verdict::Write(_, commands) = verdict {
                    for (cmd, args) in commands.drain(..) {
                        trx.push_args(cmd, args);
                    }
                }
            }
            trx.push_args("EXEC", Vec::new());
            let mut replies = send_all(client, trx).await;
            // A command refused as it was queued makes Redis refuse the `EXEC` too
            // (EXECABORT): its own error says why.
            let refusal = replies[..replies.len() - 1]
                .iter()
                .find_map(|r| r.as_ref().err().cloned());
            let done = match (replies.pop(), refusal) {
                (Some(Err(e)), Some(why)) if !lost(&e) => Err(why),
                (Some(done), _) => done,
                (None, _) => Err(fred::error::Error::new_canceled()),
            };
            for (inst, verdict) in instances.iter().zip(&verdicts) {
                if let Verdict::Write(..) = verdict {
                    self.wrote_keys(&[inst.apply.k.meta()]);
                }
            }
            match done? {
                Value::Null => return Ok(None),
                Value::Array(replies) if replies.len() == writes => {}
                other => {
                    return Err(fred::error::Error::new(
                        fred::error::ErrorKind::Unknown,
                        format!("judging: EXEC answered {other:?}"),
                    ))
                }
            }
        }
        Ok(Some(
            verdicts
                .into_iter()
                .map(|v| match v {
                    Verdict::Fold => None,
                    Verdict::Judged(out) | Verdict::Write(out, _) => Some(Ok(out)),
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_read_only_where_lua_and_rust_agree() {
        assert_eq!(integer(b"42"), Ok(42));
        assert_eq!(integer(b"-7"), Ok(-7));
        assert_eq!(integer(b"9007199254740991"), Ok(LIMIT));
        assert_eq!(integer(b"9007199254740992"), Err(()));
        assert_eq!(integer(b" 1"), Err(()));
        assert_eq!(integer(b"1e3"), Err(()));
        assert_eq!(counter(b"+5"), Err(()));
        assert_eq!(counter(b"05"), Err(()));
        assert_eq!(counter(b"5"), Ok(5));
    }

    #[test]
    fn zset_members_carry_the_scripts_prefix() {
        assert_eq!(
            zmember_at("ann", 1_700_000_000_000, TieBreak::Latest),
            "0001700000000000:ann"
        );
        assert_eq!(
            zmember_at("ann", 1_700_000_000_000, TieBreak::Earliest),
            format!("{:016}:ann", LIMIT - 1_700_000_000_000)
        );
        assert_eq!(zmember_at("ann", 5, TieBreak::None), "ann");
        assert_eq!(
            zmember_of(b"0005", "ann", TieBreak::Latest),
            Ok(("0000000000000005:ann".to_string(), Some(5)))
        );
        assert!(zmember_of(b"0000000000000005:ann", "ann", TieBreak::Latest).is_err());
        assert_eq!(tag_of(-1), [255, 255, 255, 255]);
        assert_eq!(tag_of(258), [0, 0, 1, 2]);
    }
}
