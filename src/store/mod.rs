//! Every Redis operation on leaderboard data: typed operations over fred, one Lua script
//! per atomic operation (`src/store/lua/*.lua`). Stream commands (read, ack, append) live with
//! the consumer and the intake.
//!
//! Commands go through a small connection pool; concurrent calls on one connection are
//! pipelined by fred, so applying many instances at once costs one round trip. One more
//! connection carries the reads alone (top, rank, around), so that a query never waits
//! behind writes queued on its own connection, and the writing scripts' work queued in
//! Redis at once is bounded (`redis.max_calls_in_flight`, see [`crate::config::DEFAULT_CALLS_IN_FLIGHT`]): a query
//! waits behind at most that much work, whatever the ingest rate.
//!
//! # Layout
//!
//! One file per concern, each with its own `impl Store` block:
//!
//! * `mod.rs`: [`Store`] and [`StoreError`], the script table and the timed script call,
//!   and the small reply decoders the other files share.
//! * `connect.rs`: connecting (pool, dedicated client, TLS) and the start-up checks: the
//!   Redis user's permissions and the boards' stored settings.
//! * `calls.rs`: loading the scripts and calling them, as functions or by `EVALSHA`
//!   (`redis.scripts`).
//! * `apply.rs`: bounded apply calls and the scope registry.
//! * `expire.rs`: the board and instance watermarks, expiry chunks, dropping slices and
//!   forgetting idempotency keys.
//! * `stage.rs`: resummarize: staging a recomputation in scratch keys and swapping it in.
//! * `query.rs`: the top / rank / around reads.
//! * `shards.rs`: the same reads of a sharded board, merged from every shard's.
//! * `replicas.rs`: confirming writes only once enough replicas hold them (`WAIT`).
//! * `changes.rs`: reading the change feeds (where one stands, its entries after an ID,
//!   the blocking wait for new ones).
//! * `drop.rs`: finding every key of one board (registries, then a key scan per master)
//!   and deleting them in bounded `UNLINK` batches (`rollboard drop-board`).
//! * `lua.rs`: the scripts' text as Redis receives it.

mod apply;
mod calls;
mod changes;
mod connect;
mod drop;
mod expire;
mod generations;
mod lease;
pub mod lua;
mod periods;
mod query;
mod replicas;
mod scopes;
mod shards;
mod stage;

pub use apply::{
    apply_call, apply_chunk, apply_order, fold_call, fold_chunk_len, fold_chunks, fold_group_cost,
    id_digest, ApplyEvent, FoldCall, Outcome, Share, APPLY_CHUNK, DIGEST_CONTEXT, FOLD_BUDGET,
    FOLD_EVENT_COST, FOLD_GROUP_COST,
};
pub use changes::{wait_feed, FeedEntry, FeedId, FeedState, FEED_PAGE};
pub use connect::{script_commands, Conflict, Conflicts, Denied, Reconnect, Refused, WAIT_DENIED};
pub use drop::{scan_denied, BoardKeys, UNLINK_BATCH};
pub use expire::{Expired, Trimmed, EXPIRE_CALL_FIELDS, TRIM_CALL_IDS, TRIM_CALL_LOG};
pub use generations::{tag, Generations};
pub use lease::{Lease, TICK_RECORD};
pub use periods::{ForgottenPeriods, PeriodState, PERIOD_DELETE_MARGIN_MS};
pub use replicas::NOREPLICAS;
pub use shards::SHARDED_DEPTH;
pub use stage::{
    StageTargets, Staged, Summed, SwapCheck, CHANGES_RETAIN_MS, RESUM_AT_LEAST_EVERY_MS,
    STAGE_CALL_ROWS,
};

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use self::calls::Calling;
use crate::config::{Durability, ScriptCalls};
use crate::domain::board::{Board, Changes, Mode, TieBreak, View};
use crate::domain::keys::{InstanceKeys, Keys};
use crate::metrics::Metrics;

/// A failed Redis operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The client or server reported an error. Not marked as the error's source: the
    /// message already includes it, and `{:#}` would print it twice.
    #[error("redis: {0}")]
    Redis(fred::error::Error),
    /// The server answered in a shape the scripts never produce.
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
}

impl From<fred::error::Error> for StoreError {
    fn from(e: fred::error::Error) -> Self {
        StoreError::Redis(e)
    }
}

impl StoreError {
    /// A small fixed label for metrics (one of [`crate::metrics::ERROR_KINDS`]):
    /// `connection`, `timeout`, `replicas` (too few replicas acknowledged a write in time),
    /// `redirected` (a cluster slot moving or moved), `unavailable` (Redis answered that it
    /// cannot serve the command now: [`UNAVAILABLE`]), `data` (the data is wrong: see
    /// [`StoreError::is_outage`]) or `other`. Every kind but `data` is an outage.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Redis(e) => {
                let details = e.details();
                match e.kind() {
                    ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Tls | ErrorKind::Auth => {
                        "connection"
                    }
                    ErrorKind::Timeout => "timeout",
                    _ if DATA_ERRORS.iter().any(|p| error_code(details) == *p) => "data",
                    _ if details.starts_with(NOREPLICAS) => "replicas",
                    _ if REDIRECTIONS.iter().any(|p| details.starts_with(p)) => "redirected",
                    _ if UNAVAILABLE.iter().any(|p| error_code(details) == *p) => "unavailable",
                    _ => "other",
                }
            }
            StoreError::Reply(_) => "data",
        }
    }

    /// Whether the error may clear by itself or by an operator's fix of Redis, so that the
    /// same call can succeed later: then the events it carried are retried (never
    /// dead-lettered, never acked before they are applied) and the intake answers 503 with
    /// `Retry-After`. Only errors that prove the data itself is wrong are not outages:
    ///
    /// * `WRONGTYPE`: a key under rollboard's names holds a type rollboard never writes
    ///   there (Redis 7 answers so for a script's `redis.call` as well, with ` script: ...`
    ///   appended);
    /// * `ROLLBOARD ...`: a script's own check found stored data rollboard did not write
    ///   (`src/store/lua/*.lua`, written nothing);
    /// * [`StoreError::Reply`]: Redis ran the command and answered in a shape rollboard's
    ///   scripts never produce (a stored value that does not parse). Redis answered, so it
    ///   is up; the same call answers the same again, so waiting cannot help.
    ///
    /// Everything else is an outage, the errors rollboard does not recognise included (a
    /// Lua runtime `ERR`, `NOPERM` after an ACL change, a future Redis's new codes): a
    /// retry costs a delay, a dead letter of good money is a loss.
    pub fn is_outage(&self) -> bool {
        self.kind() != "data"
    }
}

impl crate::metrics::Failure for StoreError {
    fn kind(&self) -> &'static str {
        StoreError::kind(self)
    }

    fn is_replica_ack_failure(&self) -> bool {
        StoreError::is_replica_ack_failure(self)
    }
}

/// The error codes (an error reply's first word) that prove the data is wrong.
const DATA_ERRORS: [&str; 2] = ["WRONGTYPE", "ROLLBOARD"];

/// The error codes by which Redis says that it cannot serve a command now, for reasons
/// of its own: persistence failing (`MISCONF`), a replica (`READONLY`), `maxmemory`
/// (`OOM`), loading its data (`LOADING`), a script running (`BUSY`), a replica whose
/// master is down (`MASTERDOWN`), the cluster failing (`CLUSTERDOWN`), a transaction
/// refused for one of these (`EXECABORT`).
pub const UNAVAILABLE: [&str; 8] = [
    "MISCONF",
    "READONLY",
    "OOM",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "EXECABORT",
];

/// The code of an error reply: its first word (`WRONGTYPE` of `WRONGTYPE Operation
/// against a key ... script: ...`).
fn error_code(details: &str) -> &str {
    details.split_whitespace().next().unwrap_or("")
}

/// The weight of a call's fixed part (the reads every call makes whatever it holds), in the
/// units of [`FOLD_BUDGET`]: measured, a one-event call costs Redis about a sixth of a
/// full one.
const CALL_FIXED_COST: u32 = 60;

/// The weight of a full-size call: every call but a small `fold.lua` one.
const FULL_CALL: u32 = FOLD_BUDGET as u32 + CALL_FIXED_COST;

/// Typed access to rollboard's Redis data.
pub struct Store {
    /// The write connections, then the read connection.
    pool: Pool,
    /// Round robin over the write connections.
    next: AtomicUsize,
    /// Work units of writing script calls that may be in Redis at once.
    in_flight: tokio::sync::Semaphore,
    keys: Keys,
    scripts: Scripts,
    /// Where script call durations are observed (the daemon's metrics), if anywhere.
    metrics: Option<Arc<Metrics>>,
    /// Replicas that must hold writes before they are confirmed.
    durability: Durability,
    /// The replica count decided from the topology when `durability` leaves it open.
    replicas_auto: tokio::sync::OnceCell<u32>,
    /// Instances (by legacy `seen` key) found holding the raw-id ZSet of the layout before
    /// digests, and when: their apply calls carry the raw ids for a while.
    legacy: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
    /// Whether the server refused a packed call whose instances sit in several slots
    /// (`CROSSSLOT`: a proxy or a cluster node in front of a client that is not a
    /// cluster's): then packs hold the instances of one slot only.
    packs_by_slot: std::sync::atomic::AtomicBool,
    /// The last connection error, cleared by a (re)connection: with no connection up, Redis
    /// is known to be down (see [`Store::known_down`]).
    failed: Arc<std::sync::Mutex<Option<String>>>,
    /// What this process wrote, by hash tag (see [`Generations`]).
    generations: Arc<Generations>,
    /// How the scripts are to be called (`redis.scripts`).
    script_calls: ScriptCalls,
    /// How they are called, once `auto` has chosen (see [`Store::calling`]).
    calling: tokio::sync::OnceCell<Calling>,
    /// The connections small instances are judged on in the worker (see `apply::judge`).
    judging: apply::judge::Judging,
}

/// One script of rollboard's, by both of its names (see [`calls`]), with its `script`
/// label.
struct Function {
    /// `rollboard_<version>_<script>`: its function in the library ([`lua::library`]).
    name: String,
    /// The SHA1 digest of its text for `EVALSHA` ([`lua::eval_scripts`]).
    sha: String,
    /// One of [`SCRIPT_NAMES`].
    label: &'static str,
}

impl Function {
    fn new(label: &'static str) -> Function {
        let file = format!("{label}.lua");
        let sha = lua::eval_scripts()
            .iter()
            .find(|s| s.file == file)
            .map(|s| s.sha.clone())
            .unwrap_or_default();
        Function {
            name: lua::library().function(&file),
            sha,
            label,
        }
    }
}

struct Scripts {
    fold: Function,
    watermark: Function,
    expire: Function,
    drop_slice: Function,
    trim_seen: Function,
    query: Function,
    stage: Function,
    swap: Function,
    cleanup: Function,
    floor: Function,
    lease: Function,
    forget_consumer: Function,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            fold: Function::new("fold"),
            watermark: Function::new("watermark"),
            expire: Function::new("expire"),
            drop_slice: Function::new("drop_slice"),
            trim_seen: Function::new("trim_seen"),
            query: Function::new("query"),
            stage: Function::new("stage"),
            swap: Function::new("swap"),
            cleanup: Function::new("cleanup"),
            floor: Function::new("floor"),
            lease: Function::new("lease"),
            forget_consumer: Function::new("forget_consumer"),
        }
    }
}

/// The `script` label values of `rollboard_script_duration_seconds`: one per Lua script.
pub const SCRIPT_NAMES: [&str; 12] = [
    "fold",
    "watermark",
    "expire",
    "drop_slice",
    "trim_seen",
    "query",
    "stage",
    "swap",
    "cleanup",
    "floor",
    "lease",
    "forget_consumer",
];

impl Store {
    /// Redis's clock (`TIME`), in epoch milliseconds: the one clock every replica and the
    /// CLI judge time by (see [`crate::domain::clock`]).
    pub async fn time_ms(&self) -> Result<i64, StoreError> {
        // On a cluster any node answers: its masters' clocks are one clock to within NTP's
        // error, far below a slice.
        let (seconds, micros): (String, String) = self
            .client()
            .custom(
                CustomCommand::new_static("TIME", ClusterHash::Random, false),
                Vec::<Value>::new(),
            )
            .await?;
        match (seconds.parse::<i64>(), micros.parse::<i64>()) {
            (Ok(s), Ok(us)) => Ok(s * 1_000 + us / 1_000),
            _ => Err(reply_err(format!("TIME: {seconds:?} {micros:?}"))),
        }
    }

    /// Runs one call of `script`, timing it when metrics are attached.
    async fn timed<T>(&self, script: &Function, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        if let Some(metrics) = &self.metrics {
            metrics.script_call(script.label, started.elapsed().as_secs_f64());
        }
        out
    }

    /// The key schema.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// One client of the pool, for plain commands and writes.
    pub fn client(&self) -> &Client {
        // The pool always holds at least one write connection besides the reader.
        let clients = self.pool.clients();
        &clients[self.next.fetch_add(1, Ordering::Relaxed) % (clients.len() - 1)]
    }

    /// The connection that carries only reads.
    fn reader(&self) -> &Client {
        let clients = self.pool.clients();
        &clients[clients.len() - 1]
    }

    /// Runs `call`, a writing script call of `weight` work units (one event of `fold.lua`
    /// is [`FOLD_EVENT_COST`], a full call is [`FOLD_BUDGET`]; the fixed part of a call is
    /// added here), once the calls already in Redis leave room for it. Redis runs one
    /// script at a time and serves its clients in turn, so this bounds how long a query
    /// (or any other client) waits behind rollboard's writes.
    async fn bounded<T>(&self, weight: u32, call: impl Future<Output = T>) -> T {
        // The semaphore is never closed, so acquiring cannot fail; if it ever did, the
        // call would simply go unbounded.
        let _permit = self
            .in_flight
            .acquire_many((weight + CALL_FIXED_COST).min(FULL_CALL))
            .await
            .ok();
        call.await
    }

    /// Sets how many full-size writing script calls may be in Redis at once (at least 1).
    pub fn with_calls_in_flight(mut self, calls: usize) -> Store {
        self.in_flight = calls_in_flight(calls);
        self
    }

    /// The pool, for callers that need every connection (e.g. to watch reconnects).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The keys of one instance: `scope`'s (or the unscoped one) in the window `view`.
    pub fn instance(&self, view: &View<'_>, scope: Option<&str>) -> InstanceKeys {
        self.keys
            .instance_in(&view.board().name, scope, view.window_suffix().as_deref())
    }

    async fn eval(
        &self,
        script: &Function,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let call = Box::pin(redirected(|| {
            self.fcall(self.client(), script, keys.clone(), args.clone())
        }));
        Ok(self
            .bounded(FOLD_BUDGET as u32, self.timed(script, call))
            .await?)
    }
}

impl Store {
    /// `FCALL` (or `EVALSHA`, see [`calls`]) of `function` on `client`. A server without
    /// rollboard's scripts (restarted without persistence, a new master, a flush) answers
    /// that it does not hold the script and runs nothing: the scripts are loaded and the
    /// call sent once more.
    async fn fcall(
        &self,
        client: &Client,
        function: &Function,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        let calling = self.calling_for_call().await?;
        let out = calls::reloading(client, calling, function, || async {
            match calling {
                Calling::Functions => {
                    client
                        .fcall(function.name.as_str(), keys.clone(), args.clone())
                        .await
                }
                Calling::Eval => {
                    client
                        .evalsha(function.sha.as_str(), keys.clone(), args.clone())
                        .await
                }
            }
        })
        .await;
        self.wrote(function, &keys);
        out
    }

    /// Counts a call of `function` on `keys` in the process's [`Generations`] unless it
    /// only reads: whatever it answered (a call that failed or timed out may have written
    /// all it was to write), after it answered, so that a read that began before the
    /// write and ends after it is never kept as current.
    fn wrote(&self, function: &Function, keys: &[String]) {
        if function.label == "query" {
            return;
        }
        self.wrote_keys(keys);
    }

    /// Counts a write of `keys` in the process's [`Generations`] (one count per hash tag
    /// is enough: the keys of one call share it, but an `UNLINK` batch may not).
    fn wrote_keys(&self, keys: &[String]) {
        let mut last = None;
        for key in keys {
            let tag = generations::tag(key);
            if last != Some(tag) {
                self.generations.wrote(key);
                last = Some(tag);
            }
        }
    }

    /// The process's write counters, shared by its stores.
    pub fn generations(&self) -> &Arc<Generations> {
        &self.generations
    }
}

/// The servers that hold data: every master of a cluster (`Some`), or the one server
/// (`None`, the client's own connection).
async fn masters(client: &Client) -> Result<Vec<Option<fred::types::config::Server>>, StoreError> {
    if !client.is_clustered() {
        return Ok(vec![None]);
    }
    if client.cached_cluster_state().is_none() {
        client.wait_for_connect().await?;
    }
    let primaries = client
        .cached_cluster_state()
        .map(|state| state.unique_primary_nodes())
        .unwrap_or_default();
    if primaries.is_empty() {
        return Err(reply_err("no cluster routing table after connecting"));
    }
    Ok(primaries.into_iter().map(Some).collect())
}

/// `command` with `args` sent to every master (see [`masters`]); their replies, in turn.
async fn on_every_master(
    client: &Client,
    command: CustomCommand,
    args: Vec<Value>,
) -> Result<Vec<Value>, StoreError> {
    let mut replies = Vec::new();
    for master in masters(client).await? {
        let reply: Value = match master {
            Some(server) => {
                client
                    .with_cluster_node(server)
                    .custom(command.clone(), args.clone())
                    .await?
            }
            None => client.custom(command.clone(), args.clone()).await?,
        };
        replies.push(reply);
    }
    Ok(replies)
}

/// Pauses before each new try of a redirected call (see [`redirected`]).
const REDIRECTION_WAITS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(20),
    Duration::from_millis(100),
];

/// Runs `call` again while Redis redirects it: its slot has moved (MOVED; the client has
/// read the new slot map before giving up) or is moving (ASK, until the keys' slot has
/// moved). A redirected call ran nothing, so the new try cannot count anything twice. The
/// clients follow no redirection themselves (see [`Store::connect`]). Still redirected
/// after the last try, the error goes to the caller, an outage like any other.
pub(crate) async fn redirected<T, F, Fut>(mut call: F) -> Result<T, fred::error::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, fred::error::Error>>,
{
    for wait in REDIRECTION_WAITS {
        match call().await {
            Err(e)
                if [REDIRECTED, TRANSACTION_REDIRECTED]
                    .iter()
                    .any(|p| e.details().starts_with(p)) =>
            {
                tokio::time::sleep(wait).await
            }
            reply => return reply,
        }
    }
    call().await
}

/// How fred fails a command it was told not to follow to another node.
const REDIRECTED: &str = "Too many redirections";

/// How fred fails a transaction it was told not to follow to another node.
pub(crate) const TRANSACTION_REDIRECTED: &str = "Max redirections exceeded";

/// How a call fails when a cluster slot it touches is moving or has moved: fred's own
/// errors for the redirections it did not follow, and Redis's.
const REDIRECTIONS: [&str; 5] = [
    REDIRECTED,
    TRANSACTION_REDIRECTED,
    "MOVED",
    "ASK",
    "TRYAGAIN",
];

/// The semaphore of [`Store::bounded`] for `calls` full-size calls.
fn calls_in_flight(calls: usize) -> tokio::sync::Semaphore {
    tokio::sync::Semaphore::new(calls.clamp(1, 1024) * FULL_CALL as usize)
}

fn reply_err(what: impl Into<String>) -> StoreError {
    StoreError::Reply(what.into())
}

/// Reads a board's watermark as stored by `floor.lua`.
fn parse_watermark(v: Option<String>) -> Result<Option<i64>, StoreError> {
    v.map(|w| {
        w.parse()
            .map_err(|_| reply_err(format!("board watermark {w:?} is not a number")))
    })
    .transpose()
}

fn mode_flag(board: &Board) -> &'static str {
    match board.mode {
        Mode::Incremental => "i",
        Mode::Resummarize => "r",
    }
}

/// The two ARGV every writing script takes for its change feed (changes.lua): the size of
/// the top it watches and the stream's cap, `0, 0` for a call without a feed.
fn feed_args(feed: Option<Changes>) -> [Value; 2] {
    feed.map_or([Value::from(0), Value::from(0)], |f| {
        [Value::from(i64::from(f.top)), Value::from(f.max_len as i64)]
    })
}

fn tie_flag(board: &Board) -> &'static str {
    match board.tie_break {
        TieBreak::Earliest => "e",
        TieBreak::Latest => "l",
        TieBreak::None => "n",
    }
}

fn negative_flag(board: &Board) -> &'static str {
    if board.allow_negative {
        "1"
    } else {
        "0"
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::String(s) => s.parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Double(d) if d.fract() == 0.0 => Some(*d as i64),
        _ => None,
    }
}

fn as_string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        Value::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

fn as_array(v: Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) => Some(a),
        Value::Null => Some(Vec::new()),
        _ => None,
    }
}

/// Parses a ZSet score written by rollboard: an integer below 2^53 in magnitude.
fn score(v: &Value) -> Option<i64> {
    as_i64(v).or_else(|| {
        let text = match v {
            Value::String(s) => s.to_string(),
            Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            _ => return None,
        };
        let d: f64 = text.parse().ok()?;
        (d.fract() == 0.0 && d.abs() <= crate::domain::board::MAX_TOTAL as f64).then_some(d as i64)
    })
}

#[cfg(test)]
mod outage_tests {
    use super::StoreError;
    use fred::error::{Error, ErrorKind};

    fn redis(kind: ErrorKind, details: &str) -> StoreError {
        StoreError::Redis(Error::new(kind, details.to_string()))
    }

    /// The text Redis 7.0 answers when a script's `redis.call` meets a key of the wrong
    /// type (checked on redis-server 7.0.15): the code stays first, the script is named
    /// after it. fred reads the code as `InvalidArgument`.
    const WRONGTYPE_IN_SCRIPT: &str = "WRONGTYPE Operation against a key holding the wrong \
        kind of value script: c922d9b97a3c0537b65dbd30cdddae9464a48081, on @user_script:2.";

    /// Only errors that prove the data wrong are not outages: WRONGTYPE, from a plain
    /// command or from inside a script, rollboard's own script errors, and replies in a
    /// shape the scripts never produce.
    #[test]
    fn only_errors_that_prove_the_data_wrong_are_not_outages() {
        for error in [
            redis(
                ErrorKind::InvalidArgument,
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            ),
            redis(ErrorKind::InvalidArgument, WRONGTYPE_IN_SCRIPT),
            redis(
                ErrorKind::Unknown,
                "ROLLBOARD corrupt: rb:{b}:meta gen is not an integer (nothing was written)",
            ),
            redis(
                ErrorKind::Unknown,
                "ROLLBOARD settings: the board was created with i|e|0, this process has r|e|0",
            ),
            StoreError::Reply("board watermark \"abc\" is not a number".into()),
        ] {
            assert!(!error.is_outage(), "{error}");
            assert_eq!(error.kind(), "data", "{error}");
        }
    }

    /// Redis saying that it cannot serve a command now is an outage, whatever the reason:
    /// persistence failing, a replica, maxmemory, loading, a script running, failing over.
    #[test]
    fn redis_unable_to_serve_now_is_an_outage() {
        for details in [
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
             persist to disk. Commands that may modify the data set are disabled, because \
             this instance is configured to report errors during writes if RDB snapshotting \
             fails (stop-writes-on-bgsave-error option). Please check the Redis logs for \
             details about the RDB error.",
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN \
             NOSCRIPT.",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "CLUSTERDOWN The cluster is down",
            "EXECABORT Transaction discarded because of previous errors.",
        ] {
            let error = redis(ErrorKind::Unknown, details);
            assert!(error.is_outage(), "{details}");
            assert_eq!(error.kind(), "unavailable", "{details}");
        }
        // The code is the first word: BUSYGROUP is not BUSY.
        assert_eq!(
            redis(
                ErrorKind::Unknown,
                "BUSYGROUP Consumer Group name already exists"
            )
            .kind(),
            "other"
        );
    }

    /// An error rollboard does not recognise is an outage: a Lua runtime error, a
    /// permission taken away, a code a later Redis may add.
    #[test]
    fn unrecognised_errors_are_an_outage() {
        for details in [
            "ERR user_script:2: attempt to perform arithmetic on local 'x' (a nil value) \
             script: 242f54952dd2a23d43390c62a80d97084cd0139f, on @user_script:2.",
            "ERR Error running script, Script killed by user with SCRIPT KILL...",
            "NOPERM User rollboard has no permissions to run the 'evalsha' command",
            "NOSCRIPT No matching script. Please use EVAL.",
            "SOMETHINGNEW a code no Redis sends today",
            "",
        ] {
            let error = redis(ErrorKind::Unknown, details);
            assert!(error.is_outage(), "{details}");
            assert_eq!(error.kind(), "other", "{details}");
        }
        // A client-side failure to reach or hear from Redis.
        for (kind, label) in [
            (ErrorKind::IO, "connection"),
            (ErrorKind::Canceled, "connection"),
            (ErrorKind::Timeout, "timeout"),
        ] {
            let error = redis(kind, "Request timed out.");
            assert!(error.is_outage());
            assert_eq!(error.kind(), label);
        }
        let replicas = redis(ErrorKind::Unknown, super::NOREPLICAS);
        assert!(replicas.is_outage());
        assert_eq!(replicas.kind(), "replicas");
    }

    /// Redirections beyond fred's attempts (slots moving) are retried, never dead-lettered.
    #[test]
    fn redirections_beyond_the_attempts_are_an_outage() {
        for (kind, details) in [
            (ErrorKind::Unknown, "Too many failed write attempts."),
            (ErrorKind::Routing, "Too many redirections."),
            (ErrorKind::Routing, "Max attempts reached."),
            (ErrorKind::Unknown, "Max redirections exceeded"),
            (
                ErrorKind::Unknown,
                "TRYAGAIN Multiple keys request during rehashing of slot",
            ),
        ] {
            assert!(redis(kind, details).is_outage(), "{details}");
        }
    }

    /// Calls that met a moving slot are told apart from other failures in the metrics.
    #[test]
    fn redirections_have_a_kind_of_their_own() {
        for (kind, details) in [
            (ErrorKind::Routing, "Too many redirections."),
            (ErrorKind::Unknown, "Max redirections exceeded"),
            (
                ErrorKind::Unknown,
                "TRYAGAIN Multiple keys request during rehashing of slot",
            ),
            (ErrorKind::Unknown, "MOVED 3999 127.0.0.1:6381"),
            (ErrorKind::Unknown, "ASK 3999 127.0.0.1:6381"),
        ] {
            assert_eq!(redis(kind, details).kind(), "redirected");
        }
    }

    /// Every label [`StoreError::kind`] gives is registered with the metrics.
    #[test]
    fn every_kind_is_a_registered_label() {
        for error in [
            redis(ErrorKind::Unknown, "MISCONF x"),
            redis(ErrorKind::Unknown, "WRONGTYPE x"),
            redis(ErrorKind::Unknown, "ERR x"),
            redis(ErrorKind::Unknown, "MOVED 1 127.0.0.1:1"),
            redis(ErrorKind::Unknown, super::NOREPLICAS),
            redis(ErrorKind::IO, "x"),
            redis(ErrorKind::Timeout, "x"),
        ] {
            assert!(
                crate::metrics::ERROR_KINDS.contains(&error.kind()),
                "{error}"
            );
        }
    }
}
