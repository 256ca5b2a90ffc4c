//! Every Redis operation on leaderboard data: typed operations over fred, one Lua script
//! per atomic operation (`src/lua/*.lua`). Stream commands (read, ack, append) live with
//! the consumer and the intake.
//!
//! Commands go through a small connection pool; concurrent calls on one connection are
//! pipelined by fred, so applying many instances at once costs one round trip.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};

use fred::types::config::TlsConnector;

use crate::board::{Board, Mode, TieBreak};
use crate::config::{RedisSettings, TlsFiles};
use crate::keys::{InstanceKeys, Keys};
use crate::metrics::Metrics;
use crate::query::{decode_member, encode_member, Entry, MemberRank, Page};

/// A failed Redis operation.
#[derive(Debug, thiserror::Error)]
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
    /// A small fixed label for metrics: `connection`, `timeout`, `script` or `other`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Redis(e) => match e.kind() {
                ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Tls | ErrorKind::Auth => {
                    "connection"
                }
                ErrorKind::Timeout => "timeout",
                _ if e.details().contains("script")
                    || e.details().starts_with("NOSCRIPT")
                    || e.details().starts_with("ROLLBOARD") =>
                {
                    "script"
                }
                _ => "other",
            },
            StoreError::Reply(_) => "other",
        }
    }
}

/// The (setting, value) pairs of a fingerprint written by [`Board::fingerprint`].
fn parse_fingerprint(text: &str) -> HashMap<String, String> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl StoreError {
    /// Whether the error is about Redis as a whole (unreachable, timed out, out of memory,
    /// loading, failing over) rather than about the data one call touched: such a batch
    /// is retried as a whole, never dead-lettered.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Redis(e) => {
                matches!(self.kind(), "connection" | "timeout")
                    || [
                        "OOM",
                        "LOADING",
                        "BUSY",
                        "MASTERDOWN",
                        "CLUSTERDOWN",
                        "TRYAGAIN",
                        "READONLY",
                        "NOREPLICAS",
                        "MOVED",
                        "ASK",
                    ]
                    .iter()
                    .any(|p| e.details().starts_with(p))
            }
            StoreError::Reply(_) => false,
        }
    }
}

fn reply_err(what: impl Into<String>) -> StoreError {
    StoreError::Reply(what.into())
}

/// The command (with its subcommand) and the key of a probe, e.g. `("XACK", Some("rb:events"))`
/// or `("SCRIPT LOAD", None)`.
fn probe_parts(probe: &[String]) -> (String, Option<&str>) {
    let command = probe.first().map(String::as_str).unwrap_or_default();
    let key = match command {
        "SCRIPT" | "XGROUP" | "XINFO" => {
            return (
                probe[..probe.len().min(2)].join(" "),
                probe
                    .get(2)
                    .filter(|_| command != "SCRIPT")
                    .map(String::as_str),
            )
        }
        "PING" | "MULTI" | "EXEC" => None,
        "EVALSHA" | "EVAL" => probe.get(3),
        "XREADGROUP" => probe.len().checked_sub(2).and_then(|i| probe.get(i)),
        _ => probe.get(1),
    };
    (command.to_string(), key.map(String::as_str))
}

/// The denied probes in a few words: a key no probed command may touch is named once
/// (`key other:{b}:meta`), so is a command denied on every key it was probed on (`HDEL`);
/// other denials read `COMMAND on key K` (or `COMMAND` for one without a key).
fn describe_denied(probes: &[Vec<String>], denied: &[&Vec<String>]) -> Vec<String> {
    type Parts<'a> = (String, Option<&'a str>);
    let parts: Vec<Parts> = probes.iter().map(|p| probe_parts(p)).collect();
    let refused: Vec<Parts> = denied.iter().map(|p| probe_parts(p)).collect();
    let whole = |matches: &dyn Fn(&Parts) -> bool| {
        let probed = parts.iter().filter(|p| matches(p)).count();
        probed > 1 && refused.iter().filter(|p| matches(p)).count() == probed
    };
    let mut out: Vec<String> = Vec::new();
    for (command, key) in &refused {
        let line = match key {
            Some(key) if whole(&|p| p.1 == Some(*key)) => format!("key {key}"),
            _ if whole(&|p| &p.0 == command) => command.clone(),
            Some(key) => format!("{command} on key {key}"),
            None => command.clone(),
        };
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// Reads a board's watermark as stored by `floor.lua`.
fn parse_floor(v: Option<String>) -> Result<Option<i64>, StoreError> {
    v.map(|w| {
        w.parse()
            .map_err(|_| reply_err(format!("board watermark {w:?} is not a number")))
    })
    .transpose()
}

/// A setting of a board whose value in Redis differs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Board name.
    pub board: String,
    /// The setting (`mode`, `tie_break`, `allow_negative`, `scale`, `window`, `slice`).
    pub setting: &'static str,
    /// Its value when the board's data was created.
    pub stored: String,
    /// Its value in this process's configuration.
    pub configured: String,
    /// The key holding the stored settings.
    pub key: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "board {}: {} is {} in the configuration but the board's data in Redis was built with {} = {} ({}); \
             put the setting back, or give the board a new name (it starts empty; delete the old keys when done)",
            self.board, self.setting, self.configured, self.setting, self.stored, self.key
        )
    }
}

/// Every setting that differs between the configuration and Redis: a process with any
/// refuses to start (exit 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct Conflicts(pub Vec<Conflict>);

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

/// Result of expiring one chunk of a slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Slice fields subtracted and deleted by this call.
    pub fields: u64,
    /// Members that left the instance (no live events remain).
    pub members_removed: u64,
}

struct Scripts {
    apply: Script,
    watermark: Script,
    expire: Script,
    drop_slice: Script,
    trim_seen: Script,
    query: Script,
    stage: Script,
    swap: Script,
    cleanup: Script,
    floor: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            apply: Script::from_lua(include_str!("lua/apply.lua")),
            watermark: Script::from_lua(include_str!("lua/watermark.lua")),
            expire: Script::from_lua(include_str!("lua/expire.lua")),
            drop_slice: Script::from_lua(include_str!("lua/drop_slice.lua")),
            trim_seen: Script::from_lua(include_str!("lua/trim_seen.lua")),
            query: Script::from_lua(include_str!("lua/query.lua")),
            stage: Script::from_lua(include_str!("lua/stage.lua")),
            swap: Script::from_lua(include_str!("lua/swap.lua")),
            cleanup: Script::from_lua(include_str!("lua/cleanup.lua")),
            floor: Script::from_lua(include_str!("lua/floor.lua")),
        }
    }

    /// The `script` label of `script` (one of [`SCRIPT_NAMES`]).
    fn name(&self, script: &Script) -> &'static str {
        let named = [
            (&self.apply, "apply"),
            (&self.watermark, "watermark"),
            (&self.expire, "expire"),
            (&self.drop_slice, "drop_slice"),
            (&self.trim_seen, "trim_seen"),
            (&self.query, "query"),
            (&self.stage, "stage"),
            (&self.swap, "swap"),
            (&self.cleanup, "cleanup"),
            (&self.floor, "floor"),
        ];
        named
            .iter()
            .find(|(s, _)| std::ptr::eq(*s, script))
            .map_or("other", |(_, name)| name)
    }

    fn all(&self) -> [&Script; 10] {
        [
            &self.floor,
            &self.stage,
            &self.swap,
            &self.cleanup,
            &self.apply,
            &self.watermark,
            &self.expire,
            &self.drop_slice,
            &self.trim_seen,
            &self.query,
        ]
    }
}

/// The `script` label values of `rollboard_script_duration_seconds`: one per Lua script.
pub const SCRIPT_NAMES: [&str; 10] = [
    "apply",
    "watermark",
    "expire",
    "drop_slice",
    "trim_seen",
    "query",
    "stage",
    "swap",
    "cleanup",
    "floor",
];

/// How the connection behaves when Redis goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// Fail at once (command-line tools).
    Never,
    /// Reconnect forever with exponential backoff (the daemon).
    Forever,
}

/// Typed access to rollboard's Redis data.
pub struct Store {
    pool: Pool,
    keys: Keys,
    scripts: Scripts,
    /// Where script call durations are observed (the daemon's metrics), if anywhere.
    metrics: Option<Arc<Metrics>>,
}

fn mode_flag(board: &Board) -> &'static str {
    match board.mode {
        Mode::Incremental => "i",
        Mode::Resummarize => "r",
    }
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
        (d.fract() == 0.0 && d.abs() <= crate::board::MAX_TOTAL as f64).then_some(d as i64)
    })
}

/// Most events in one apply script call. DESIGN.md section 7: no call may hold Redis for
/// more than about 2 ms; the apply script costs up to ~23 µs of Redis time per event on
/// the reference machine when every event moves a distinct member of a large ranking, and
/// calls of 64 such events ran 1.5 ms at the median but 4–7 ms in the tail (`cargo bench
/// --bench rollboard -- expiry`, its fill), so a call holds at most 32.
pub const APPLY_CHUNK: usize = 32;

/// Most fields of a dead slice that one `expire.lua` call expires. DESIGN.md section 7: no
/// call may hold Redis for more than about 2 ms; an expired field costs ~16 µs of Redis
/// time on the reference machine when its member leaves a 1M-member ranking, and calls of
/// 64 fields ran 1.0 ms at the median but 5 ms at p99 on the shared 2-core machine (`cargo
/// bench --bench rollboard -- expiry`). The roll job splits each HSCAN page of
/// `schedule.chunk` fields into calls of at most this many.
pub const EXPIRE_CALL_FIELDS: usize = 32;

/// Most rows that one `stage.lua` call writes into the scratch keys of a recomputation
/// (same bound and measurement as [`EXPIRE_CALL_FIELDS`]: ~11 µs of Redis time per row on
/// the reference machine while the scratch ranking grows to 1M members).
pub const STAGE_CALL_ROWS: usize = 64;

/// Most idempotency keys that one `trim_seen.lua` call forgets (same bound; `ZREM` from a
/// 1M-member `seen` ZSet).
pub const TRIM_CALL_IDS: usize = 256;

/// The KEYS and ARGV of one `apply.lua` call (layout documented in the script).
pub fn apply_call(
    board: &Board,
    k: &InstanceKeys,
    fingerprint: &str,
    events: &[ApplyEvent],
    now: i64,
) -> (Vec<String>, Vec<Value>) {
    let mut slices: Vec<i64> = Vec::new();
    let mut members: Vec<&str> = Vec::new();
    let mut member_index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut rows: Vec<(usize, usize)> = Vec::with_capacity(events.len());
    for e in events {
        let n = board.slice_of(e.ts);
        let s = match slices.iter().position(|&x| x == n) {
            Some(i) => i,
            None => {
                slices.push(n);
                slices.len() - 1
            }
        };
        let m = *member_index.entry(e.member.as_str()).or_insert_with(|| {
            members.push(e.member.as_str());
            members.len() - 1
        });
        rows.push((s, m));
    }
    let mut keys = k.apply_keys();
    keys.extend(slices.iter().map(|&n| k.slice(n)));
    let mut args: Vec<Value> =
        Vec::with_capacity(10 + 2 * slices.len() + members.len() + 5 * events.len());
    args.extend([
        Value::from(now),
        Value::from(board.slices_in_window()),
        Value::from(board.slice_ms),
        Value::from(mode_flag(board)),
        Value::from(tie_flag(board)),
        Value::from(negative_flag(board)),
        Value::from(fingerprint),
        Value::from(slices.len() as i64),
        Value::from(members.len() as i64),
        Value::from(events.len() as i64),
    ]);
    for &n in &slices {
        args.extend([Value::from(n), Value::from(board.forget_at(n))]);
    }
    args.extend(members.iter().map(|&m| Value::from(m)));
    for (e, (s, m)) in events.iter().zip(rows) {
        args.extend([
            Value::from(e.id.as_str()),
            Value::from(s as i64 + 1),
            Value::from(m as i64 + 1),
            Value::from(e.ts),
            Value::from(e.amount),
        ]);
    }
    (keys, args)
}

/// A TLS file that cannot be used, with the setting that names it.
#[derive(Debug, thiserror::Error)]
#[error("{key} = {path:?}: {reason}")]
pub struct TlsError {
    /// The setting, e.g. `redis.tls_ca_file`.
    pub key: &'static str,
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The rustls client configuration for `files`: the server's certificate is verified
/// against the CA file (the system's roots when there is none), and a client certificate
/// is presented when one is given (mutual TLS).
pub fn tls_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let fail = |key: &'static str, path: &std::path::Path, reason: String| TlsError {
        key,
        path: path.to_path_buf(),
        reason,
    };
    let certs = |key: &'static str, path: &std::path::Path| {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| fail(key, path, format!("cannot read PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(fail(key, path, "holds no PEM certificate".into()));
        }
        Ok(certs)
    };
    let mut roots = rustls::RootCertStore::empty();
    match &files.ca_file {
        Some(path) => {
            for cert in certs("redis.tls_ca_file", path)? {
                roots.add(cert).map_err(|e| {
                    fail(
                        "redis.tls_ca_file",
                        path,
                        format!("not a CA certificate: {e}"),
                    )
                })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            fail(
                "redis.tls_ca_file",
                files.ca_file.as_deref().unwrap_or("".as_ref()),
                e.to_string(),
            )
        })?
        .with_root_certificates(roots);
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certs("redis.tls_cert_file", cert)?;
            let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                fail(
                    "redis.tls_key_file",
                    key,
                    format!("cannot read a PEM private key: {e}"),
                )
            })?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                fail(
                    "redis.tls_key_file",
                    key,
                    format!("does not fit redis.tls_cert_file: {e}"),
                )
            })
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The source of every Lua script, for the permission probe: a script runs with the
/// caller's ACL, so every command it calls is one the Redis user needs.
const LUA_SOURCES: &[(&str, &str)] = &[
    ("apply.lua", include_str!("lua/apply.lua")),
    ("cleanup.lua", include_str!("lua/cleanup.lua")),
    ("drop_slice.lua", include_str!("lua/drop_slice.lua")),
    ("expire.lua", include_str!("lua/expire.lua")),
    ("floor.lua", include_str!("lua/floor.lua")),
    ("query.lua", include_str!("lua/query.lua")),
    ("stage.lua", include_str!("lua/stage.lua")),
    ("swap.lua", include_str!("lua/swap.lua")),
    ("trim_seen.lua", include_str!("lua/trim_seen.lua")),
    ("watermark.lua", include_str!("lua/watermark.lua")),
];

/// Asks Redis whether the current user may run each command of ARGV (groups of a count
/// followed by that many words), without running any; returns one status per group:
/// 1 allowed, 0 denied, 2 not a command Redis knows (`acl_check_cmd` raises an error).
const PERMISSION_PROBE: &str = r#"
local status, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, i + 1, i + n))
  if not ok then
    status[#status + 1] = 2
  elseif allowed then
    status[#status + 1] = 1
  else
    status[#status + 1] = 0
  end
  i = i + n + 1
end
return status
"#;

/// Every name a Lua source might call as a command: each quoted upper-case word, whether
/// it is passed to `redis.call` directly or through a helper such as `variadic('HSET', ...)`.
/// Option words among them (`LIMIT`, `WITHSCORES`) are not commands; the probe skips
/// names Redis does not know. Sorted and deduplicated.
pub fn script_commands() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, source) in LUA_SOURCES {
        let bytes = source.as_bytes();
        for (i, &quote) in bytes.iter().enumerate() {
            if quote != b'\'' && quote != b'"' {
                continue;
            }
            // A quote, a run of capitals, the same quote (a comment's apostrophe matches
            // nothing, as a capital run needs a closing quote right after it).
            let word = &bytes[i + 1..];
            let len = word
                .iter()
                .take_while(|b| b.is_ascii_uppercase() || **b == b'_')
                .count();
            if len > 0 && word.get(len) == Some(&quote) {
                out.push(String::from_utf8_lossy(&word[..len]).into_owned());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Commands the Redis user of rollboard may not run, found at start-up by
/// [`Store::check_permissions`], e.g. `XACK on key rb:events`, `HDEL` or `key other:{b}:meta`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the redis user lacks permissions rollboard needs (grant them as in deploy/redis/users.acl): {}",
    .0.join(", ")
)]
pub struct Denied(pub Vec<String>);

/// Redis or TLS refused this client at start-up (wrong credentials, a certificate that
/// does not verify): a setting to fix, not an outage to wait out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redis refused the connection: {0}")]
pub struct Refused(pub String);

impl Refused {
    /// The refusal a connection error stands for, if it is one rather than an outage: an
    /// authentication error, or a TLS certificate that did not verify on either side
    /// (rustls reports those through the handshake's I/O error).
    pub fn from_error(e: &fred::error::Error) -> Option<Refused> {
        let details = e.details();
        if e.kind() == &ErrorKind::Auth {
            return Some(Refused(format!(
                "the credentials of redis.url were not accepted: {details}"
            )));
        }
        let tls = e.kind() == &ErrorKind::Tls
            || [
                "InvalidCertificate",
                "AlertReceived",
                "invalid peer certificate",
            ]
            .iter()
            .any(|m| details.contains(m));
        tls.then(|| {
            Refused(format!(
                "the TLS handshake failed (see redis.tls_ca_file, redis.tls_cert_file, \
                 redis.tls_key_file): {details}"
            ))
        })
    }
}

impl Denied {
    /// A `NOPERM` error as a denial (the probe itself was refused: EVAL is not allowed).
    pub fn from_error(e: &StoreError) -> Option<Denied> {
        match e {
            StoreError::Redis(e) if e.details().starts_with("NOPERM") => {
                Some(Denied(vec![format!(
                    "EVAL (scripts and the permission check): {}",
                    e.details()
                )]))
            }
            _ => None,
        }
    }
}

impl Store {
    fn builder(url: &str, reconnect: Reconnect) -> Result<Builder, StoreError> {
        Self::builder_tls(url, None, reconnect)
    }

    fn builder_tls(
        url: &str,
        tls: Option<&TlsFiles>,
        reconnect: Reconnect,
    ) -> Result<Builder, StoreError> {
        let mut config = Config::from_url(url)?;
        if let Some(files) = tls {
            let client = tls_client_config(files).map_err(|e| {
                StoreError::Redis(fred::error::Error::new(ErrorKind::Tls, e.to_string()))
            })?;
            config.tls = Some(TlsConnector::from(client).into());
        }
        // The daemon starts without Redis and catches up when it appears; tools fail fast.
        config.fail_fast = reconnect == Reconnect::Never;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(5);
                c.internal_command_timeout = Duration::from_secs(10);
                c.max_command_attempts = 3;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = Duration::from_secs(30);
            });
        if reconnect == Reconnect::Forever {
            builder.set_policy(ReconnectPolicy::new_exponential(0, 100, 10_000, 2));
        }
        Ok(builder)
    }

    /// Connects a pool of `size` connections to `url` (redis://, rediss://, redis-cluster://).
    /// With [`Reconnect::Never`] this waits for the connection and fails if there is none;
    /// with [`Reconnect::Forever`] it returns at once and commands wait for the connection.
    pub async fn connect(
        url: &str,
        prefix: &str,
        size: usize,
        reconnect: Reconnect,
    ) -> Result<Store, StoreError> {
        Self::connect_builder(Self::builder(url, reconnect)?, prefix, size, reconnect).await
    }

    /// As [`Store::connect`], with every `[redis]` setting (TLS files included).
    pub async fn connect_with(
        redis: &RedisSettings,
        size: usize,
        reconnect: Reconnect,
    ) -> Result<Store, StoreError> {
        let builder = Self::builder_tls(&redis.url, redis.tls.as_ref(), reconnect)?;
        Self::connect_builder(builder, &redis.key_prefix, size, reconnect).await
    }

    async fn connect_builder(
        builder: Builder,
        prefix: &str,
        size: usize,
        reconnect: Reconnect,
    ) -> Result<Store, StoreError> {
        let pool = builder.build_pool(size.max(1))?;
        match reconnect {
            Reconnect::Never => {
                pool.init().await?;
            }
            Reconnect::Forever => {
                // The connection tasks run on their own; dropping the handles detaches them.
                drop(pool.connect_pool());
            }
        }
        Ok(Store {
            pool,
            keys: Keys::new(prefix),
            scripts: Scripts::new(),
            metrics: None,
        })
    }

    /// Observes the duration of every script call in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Store {
        self.metrics = Some(metrics);
        self
    }

    /// Runs one call of `script`, timing it when metrics are attached.
    async fn timed<T>(&self, script: &Script, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        if let Some(metrics) = &self.metrics {
            metrics.script_call(self.scripts.name(script), started.elapsed().as_secs_f64());
        }
        out
    }

    /// A single extra connection for the stream reader: its blocking XREADGROUP must not
    /// stall the commands queued behind it on a shared connection.
    ///
    /// Commands on it are sent once and never resent: `XREADGROUP >` is not idempotent. If
    /// the connection drops after Redis delivered a batch, a resend would deliver the next
    /// batch and leave the first one in the pending list, unseen, until `claim_idle`. With
    /// one attempt the lost reply is an error instead, and the consumer re-reads its own
    /// pending entries.
    pub async fn dedicated(url: &str, reconnect: Reconnect) -> Result<Client, StoreError> {
        Self::dedicated_builder(Self::builder(url, reconnect)?, reconnect).await
    }

    /// As [`Store::dedicated`], with every `[redis]` setting (TLS files included).
    pub async fn dedicated_with(
        redis: &RedisSettings,
        reconnect: Reconnect,
    ) -> Result<Client, StoreError> {
        let builder = Self::builder_tls(&redis.url, redis.tls.as_ref(), reconnect)?;
        Self::dedicated_builder(builder, reconnect).await
    }

    async fn dedicated_builder(
        mut builder: Builder,
        reconnect: Reconnect,
    ) -> Result<Client, StoreError> {
        builder.with_connection_config(|c| c.max_command_attempts = 1);
        let client = builder.build()?;
        match reconnect {
            Reconnect::Never => {
                client.init().await?;
            }
            Reconnect::Forever => {
                drop(client.connect());
            }
        }
        Ok(client)
    }

    /// Whether every script is in the server's cache; loads the missing ones.
    pub async fn ensure_scripts(&self) -> Result<(), StoreError> {
        let hashes: Vec<String> = self
            .scripts
            .all()
            .iter()
            .map(|s| s.sha1().to_string())
            .collect();
        let present: Vec<bool> = self.client().script_exists(hashes).await?;
        if present.iter().all(|p| *p) {
            return Ok(());
        }
        self.load_scripts().await
    }

    /// The key schema.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// One client of the pool, for plain commands.
    pub fn client(&self) -> &Client {
        self.pool.next()
    }

    /// The pool, for callers that need every connection (e.g. to watch reconnects).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Loads every script into the server's cache (`SCRIPT LOAD`); on a cluster, on every node.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in self.scripts.all() {
            script.load(self.client()).await?;
        }
        Ok(())
    }

    /// Records each board's shaping settings in Redis the first time the board is seen,
    /// and lists every setting whose stored value differs from `boards` (empty: all agree).
    /// Data written under other settings would be misread (scores, tie-break prefixes,
    /// slice numbers), so a process with conflicts must not start.
    pub async fn check_settings(&self, boards: &[Board]) -> Result<Vec<Conflict>, StoreError> {
        let mut conflicts = Vec::new();
        for board in boards {
            let key = self.keys.settings(&board.name);
            let wanted = board.shaping_settings();
            let mut stored: HashMap<String, String> = self.client().hgetall(&key).await?;
            let mut source = key.clone();
            if stored.is_empty() {
                // First start with this check (or the key was lost): the instances' own
                // fingerprints tell what the data was built with.
                if let Some((meta, fingerprint)) = self.instance_fingerprint(board).await? {
                    stored = parse_fingerprint(&fingerprint);
                    source = meta;
                }
            }
            let before = conflicts.len();
            for (setting, configured) in &wanted {
                match stored.get(*setting) {
                    Some(v) if v != configured => conflicts.push(Conflict {
                        board: board.name.clone(),
                        setting,
                        stored: v.clone(),
                        configured: configured.clone(),
                        key: source.clone(),
                    }),
                    _ => {}
                }
            }
            if conflicts.len() == before {
                let args: Vec<Value> = wanted
                    .iter()
                    .flat_map(|(k, v)| [Value::from(*k), Value::from(v.as_str())])
                    .collect();
                let _: Value = self
                    .client()
                    .eval(
                        "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end return 1",
                        vec![key],
                        args,
                    )
                    .await?;
            }
        }
        Ok(conflicts)
    }

    /// The settings fingerprint stored in the `meta` of one of the board's instances (the
    /// unscoped one, or the first few registered scopes), with the key it was read from.
    async fn instance_fingerprint(
        &self,
        board: &Board,
    ) -> Result<Option<(String, String)>, StoreError> {
        let scopes: Vec<Option<String>> = if board.is_scoped() {
            let some: Vec<String> = self
                .client()
                .zrange(
                    self.keys.scopes(&board.name),
                    0,
                    15,
                    None,
                    false,
                    None,
                    false,
                )
                .await?;
            some.into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        for scope in scopes {
            let meta = self.instance(board, scope.as_deref()).meta();
            let fingerprint: Option<String> = self.client().hget(&meta, "settings").await?;
            if let Some(f) = fingerprint {
                return Ok(Some((meta, f)));
            }
        }
        Ok(None)
    }

    /// The commands and keys the Redis user may not use, checked with
    /// `redis.acl_check_cmd` inside one script (nothing is run or written): the scripts'
    /// commands on each board's keys, the plain commands rollboard sends, and the stream
    /// commands on `stream` and `dead_letter`. Empty: every permission is there.
    pub async fn check_permissions(
        &self,
        boards: &[Board],
        stream: &str,
        dead_letter: &str,
    ) -> Result<Vec<String>, StoreError> {
        let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let sha = "0".repeat(40);
        let mut probes: Vec<Vec<String>> = vec![
            words(&["PING"]),
            words(&["SCRIPT", "LOAD", "return 1"]),
            words(&["SCRIPT", "EXISTS", &sha]),
            words(&["MULTI"]),
            words(&["EXEC"]),
            words(&[
                "XREADGROUP",
                "GROUP",
                "g",
                "c",
                "COUNT",
                "1",
                "STREAMS",
                stream,
                ">",
            ]),
            words(&["XACK", stream, "g", "0-1"]),
            words(&["XAUTOCLAIM", stream, "g", "c", "0", "0-0"]),
            words(&["XADD", stream, "*", "f", "v"]),
            words(&["XGROUP", "CREATE", stream, "g", "0", "MKSTREAM"]),
            words(&["XINFO", "GROUPS", stream]),
            words(&["XADD", dead_letter, "*", "f", "v"]),
        ];
        let lua = script_commands();
        for board in boards {
            let k = self.instance(board, None);
            let (meta, settings) = (k.meta(), self.keys.settings(&board.name));
            let (scopes, window) = (self.keys.scopes(&board.name), self.keys.window(&board.name));
            for key in [&meta, &settings, &scopes, &window] {
                probes.push(words(&["EVALSHA", &sha, "1", key]));
                probes.push(words(&["EVAL", "return 1", "1", key]));
                for command in &lua {
                    // The key three times: enough arguments for every key spec the
                    // scripts use (RENAME takes two keys).
                    probes.push(words(&[command, key, key, key]));
                }
            }
            probes.extend([
                words(&["HGETALL", &settings]),
                words(&["HGET", &meta, "f"]),
                words(&["HGET", &window, "f"]),
                words(&["HMGET", &meta, "f"]),
                words(&["HSCAN", &k.members(), "0"]),
                words(&["ZRANGE", &scopes, "0", "1"]),
                words(&["ZADD", &scopes, "GT", "0", "m"]),
                words(&["ZSCAN", &scopes, "0"]),
                words(&["ZSCAN", &k.result(), "0"]),
                words(&["ZRANGEBYSCORE", &k.slices(), "0", "1"]),
                words(&["DEL", &meta]),
                words(&["UNLINK", &meta]),
            ]);
        }
        let mut args: Vec<Value> = Vec::new();
        for probe in &probes {
            args.push(Value::from(probe.len() as i64));
            args.extend(probe.iter().map(|w| Value::from(w.as_str())));
        }
        let status: Vec<i64> = self.client().eval(PERMISSION_PROBE, (), args).await?;
        if status.len() != probes.len() {
            return Err(reply_err(
                "permission probe: one status per command expected",
            ));
        }
        let known: Vec<Vec<String>> = probes
            .iter()
            .zip(&status)
            .filter(|(_, s)| **s != 2)
            .map(|(p, _)| p.clone())
            .collect();
        let denied: Vec<&Vec<String>> = probes
            .iter()
            .zip(&status)
            .filter(|(_, s)| **s == 0)
            .map(|(p, _)| p)
            .collect();
        Ok(describe_denied(&known, &denied))
    }

    /// Whether a pooled connection is up (all of them are down while Redis is unreachable).
    /// Commands sent meanwhile wait for the reconnection, up to the command timeout, so a
    /// job that must not hang checks first.
    pub fn is_connected(&self) -> bool {
        self.pool.clients().iter().any(|c| c.is_connected())
    }

    /// The error a job reports when it did not start because Redis is unreachable.
    pub fn not_connected() -> StoreError {
        StoreError::Redis(fred::error::Error::new(
            ErrorKind::IO,
            "not connected to redis",
        ))
    }

    /// Answers `PING`.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let _: String = self.client().ping(None).await?;
        Ok(())
    }

    /// The keys of one instance.
    pub fn instance(&self, board: &Board, scope: Option<&str>) -> InstanceKeys {
        self.keys.instance(&board.name, scope)
    }

    async fn eval(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let call = script.evalsha_with_reload(self.client(), keys, args);
        Ok(self.timed(script, call).await?)
    }

    /// Records scope values of a scoped board in its registry (score: newest slice seen).
    /// Runs before the apply so that no instance holding data is ever unregistered.
    pub async fn register_scopes(
        &self,
        board: &Board,
        scopes: &[(String, i64)],
    ) -> Result<(), StoreError> {
        if scopes.is_empty() {
            return Ok(());
        }
        let args: Vec<Value> = ["GT".into()]
            .into_iter()
            .chain(
                scopes
                    .iter()
                    .flat_map(|(scope, n)| [Value::from(*n), Value::from(scope.as_str())]),
            )
            .collect();
        let key = self.keys.scopes(&board.name);
        let _: Value = self
            .client()
            .custom(
                CustomCommand::new_static("ZADD", ClusterHash::FirstKey, false),
                [vec![Value::from(key)], args].concat(),
            )
            .await?;
        Ok(())
    }

    /// Every registered scope of a scoped board.
    pub async fn scopes(&self, board: &Board) -> Result<Vec<String>, StoreError> {
        let key = self.keys.scopes(&board.name);
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self.scan("ZSCAN", &key, &cursor, 1000).await?;
            out.extend(page.into_iter().map(|(scope, _)| scope));
            if next == "0" {
                break;
            }
            cursor = next;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Removes a scope from the registry if its newest slice is at or below `watermark`
    /// (race-free: an apply registers its slice first, with a higher score).
    pub async fn unregister_scope(
        &self,
        board: &Board,
        scope: &str,
        watermark: i64,
    ) -> Result<bool, StoreError> {
        let key = self.keys.scopes(&board.name);
        let removed: i64 = self
            .client()
            .eval(
                "local s = redis.call('ZSCORE', KEYS[1], ARGV[1]) \
                 if s and tonumber(s) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end \
                 return 0",
                vec![key],
                vec![Value::from(scope), Value::from(watermark)],
            )
            .await?;
        Ok(removed == 1)
    }

    /// Applies `events` to one instance, in stream order, as a sequence of bounded atomic
    /// script calls of at most [`APPLY_CHUNK`] events each; one outcome per event.
    ///
    /// Each call remembers the ids it applied, so a crash between two calls (or a retry of
    /// the whole batch) neither loses nor double-counts anything: the calls already made
    /// answer `Duplicate` for their events the next time.
    pub async fn apply(
        &self,
        board: &Board,
        scope: Option<&str>,
        events: &[ApplyEvent],
        now: i64,
    ) -> Result<Vec<Outcome>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // One connection for every call of the instance, awaited in turn: the calls must
        // run in stream order (the first of two events with one id wins).
        let client = self.client();
        let mut now = now;
        if let Some(scope) = scope {
            let newest = events
                .iter()
                .map(|e| board.slice_of(e.ts))
                .max()
                .unwrap_or_default();
            // The instance may be one that no roll visits (its scope left the registry), so
            // it is judged against the board's watermark too, read after the registration:
            // a roll that raised it before that read is seen here; one that raised it after
            // lists the scope and rolls the instance itself.
            let pipeline = client.pipeline();
            let _: () = pipeline
                .custom(
                    CustomCommand::new_static("ZADD", ClusterHash::FirstKey, false),
                    vec![
                        Value::from(self.keys.scopes(&board.name)),
                        "GT".into(),
                        Value::from(newest),
                        Value::from(scope),
                    ],
                )
                .await?;
            let _: () = pipeline
                .hget(self.keys.window(&board.name), "expired_through")
                .await?;
            let (_, floor): (Value, Option<String>) = pipeline.all().await?;
            if let Some(floor) = parse_floor(floor)? {
                now = now.max(board.horizon_time(floor));
            }
        }
        let k = self.instance(board, scope);
        let fingerprint = board.fingerprint();
        let mut out = Vec::with_capacity(events.len());
        for chunk in events.chunks(APPLY_CHUNK) {
            let (keys, args) = apply_call(board, &k, &fingerprint, chunk, now);
            let call = self.scripts.apply.evalsha_with_reload(client, keys, args);
            let reply = self.timed(&self.scripts.apply, call).await?;
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
        }
        Ok(out)
    }

    /// Raises the board's own watermark (see [`Keys::window`]) to at least `target`; returns
    /// it. Every roll does this before it touches an instance.
    pub async fn raise_floor(
        &self,
        board: &Board,
        target: i64,
        now: i64,
    ) -> Result<i64, StoreError> {
        let v = self
            .eval(
                &self.scripts.floor,
                vec![self.keys.window(&board.name)],
                vec![target.into(), now.into()],
            )
            .await?;
        as_i64(&v).ok_or_else(|| reply_err("floor: not a number"))
    }

    /// The board's own watermark, if a roll ever set it.
    pub async fn floor(&self, board: &Board) -> Result<Option<i64>, StoreError> {
        let v: Option<String> = self
            .client()
            .hget(self.keys.window(&board.name), "expired_through")
            .await?;
        parse_floor(v)
    }

    /// Raises the instance's watermark to at least `target`; returns the watermark and the
    /// registered slices at or below it (the ones to expire), oldest first.
    pub async fn raise_watermark(
        &self,
        board: &Board,
        scope: Option<&str>,
        target: i64,
        now: i64,
    ) -> Result<(i64, Vec<i64>), StoreError> {
        let k = self.instance(board, scope);
        let out = as_array(
            self.eval(
                &self.scripts.watermark,
                vec![k.meta(), k.slices()],
                vec![target.into(), now.into(), board.fingerprint().into()],
            )
            .await?,
        )
        .ok_or_else(|| reply_err("watermark: not an array"))?;
        let mut it = out.into_iter();
        let w = it
            .next()
            .as_ref()
            .and_then(as_i64)
            .ok_or_else(|| reply_err("watermark: no watermark"))?;
        let slices = it
            .next()
            .and_then(as_array)
            .unwrap_or_default()
            .iter()
            .map(|v| as_i64(v).ok_or_else(|| reply_err("watermark: slice is not a number")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((w, slices))
    }

    /// One page of `HSCAN`/`ZSCAN`/`SSCAN`: the next cursor and the (field, value) pairs.
    pub async fn scan(
        &self,
        command: &'static str,
        key: &str,
        cursor: &str,
        count: usize,
    ) -> Result<(String, Vec<(String, String)>), StoreError> {
        let v: Value = self
            .client()
            .custom(
                CustomCommand::new_static(command, ClusterHash::FirstKey, false),
                vec![
                    Value::from(key),
                    Value::from(cursor),
                    "COUNT".into(),
                    Value::from(count as i64),
                ],
            )
            .await?;
        let mut parts = as_array(v)
            .ok_or_else(|| reply_err("scan: not an array"))?
            .into_iter();
        let next = parts
            .next()
            .and_then(as_string)
            .ok_or_else(|| reply_err("scan: no cursor"))?;
        let items = parts.next().and_then(as_array).unwrap_or_default();
        let mut pairs = Vec::with_capacity(items.len() / 2);
        let mut it = items.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            let f = as_string(f).ok_or_else(|| reply_err("scan: field is not text"))?;
            let v = as_string(v).ok_or_else(|| reply_err("scan: value is not text"))?;
            pairs.push((f, v));
        }
        Ok((next, pairs))
    }

    /// Subtracts and deletes the given fields of dead slice `n` in one script call,
    /// exactly once: a field that a concurrent or crashed roller already expired is no
    /// longer in the slice and is skipped. The amounts are read by the script itself (a
    /// dead slice never changes). Callers pass at most [`EXPIRE_CALL_FIELDS`] names.
    pub async fn expire_chunk(
        &self,
        board: &Board,
        scope: Option<&str>,
        n: i64,
        members: &[String],
    ) -> Result<Expired, StoreError> {
        let k = self.instance(board, scope);
        let keys = vec![
            k.meta(),
            k.result(),
            k.members(),
            k.refs(),
            k.totals(),
            k.slice(n),
        ];
        let args: Vec<Value> = [
            Value::from(mode_flag(board)),
            Value::from(negative_flag(board)),
            Value::from(board.fingerprint()),
        ]
        .into_iter()
        .chain(members.iter().map(|m| Value::from(m.as_str())))
        .collect();
        let out = as_array(self.eval(&self.scripts.expire, keys, args).await?)
            .ok_or_else(|| reply_err("expire: not an array"))?;
        let field = |i: usize| {
            out.get(i)
                .and_then(as_i64)
                .map(|v| v as u64)
                .ok_or_else(|| reply_err("expire: missing count"))
        };
        Ok(Expired {
            fields: field(0)?,
            members_removed: field(1)?,
        })
    }

    /// Unregisters slice `n` if it is empty; false when fields remain.
    pub async fn drop_slice(
        &self,
        board: &Board,
        scope: Option<&str>,
        n: i64,
    ) -> Result<bool, StoreError> {
        let k = self.instance(board, scope);
        let v = self
            .eval(
                &self.scripts.drop_slice,
                vec![k.slices(), k.slice(n)],
                vec![n.into()],
            )
            .await?;
        Ok(as_i64(&v) == Some(1))
    }

    /// Forgets up to `chunk` idempotency keys due at `now` (callers keep `chunk` at or
    /// below [`TRIM_CALL_IDS`]); returns how many.
    pub async fn trim_seen(
        &self,
        board: &Board,
        scope: Option<&str>,
        now: i64,
        chunk: usize,
    ) -> Result<u64, StoreError> {
        let k = self.instance(board, scope);
        let v = self
            .eval(
                &self.scripts.trim_seen,
                vec![k.seen()],
                vec![now.into(), (chunk as i64).into()],
            )
            .await?;
        as_i64(&v)
            .map(|n| n as u64)
            .ok_or_else(|| reply_err("trim_seen: not a number"))
    }

    fn lookup_key(&self, board: &Board, k: &InstanceKeys) -> String {
        match board.mode {
            Mode::Incremental => k.members(),
            Mode::Resummarize => k.ranked(),
        }
    }

    async fn query(
        &self,
        board: &Board,
        scope: Option<&str>,
        args: Vec<Value>,
        now: i64,
    ) -> Result<Snapshot, StoreError> {
        let k = self.instance(board, scope);
        let keys = vec![k.meta(), k.result(), self.lookup_key(board, &k)];
        let client = self.client();
        let snapshot = self.timed(
            &self.scripts.query,
            self.scripts.query.evalsha_with_reload(client, keys, args),
        );
        // A scoped instance follows the board's watermark too (see [`Store::raise_floor`]);
        // both reads go out together on one connection, so this costs no extra round trip.
        let (out, floor) = if scope.is_some() {
            let floor = client
                .hget::<Option<String>, _, _>(self.keys.window(&board.name), "expired_through");
            let (out, floor) = tokio::try_join!(snapshot, floor)?;
            (out, parse_floor(floor)?)
        } else {
            (snapshot.await?, None)
        };
        let out = as_array(out).ok_or_else(|| reply_err("query: not an array"))?;
        let mut it = out.into_iter();
        let expired = it.next().as_ref().and_then(as_i64).max(floor);
        let mut num = || {
            it.next()
                .as_ref()
                .and_then(as_i64)
                .ok_or_else(|| reply_err("query: missing number"))
        };
        let count = num()?.max(0) as u64;
        let rank = num()?;
        let first_competition = num()?.max(0) as u64;
        let start = num()?.max(0) as u64;
        let rows = it.next().and_then(as_array).unwrap_or_default();
        let (window_from, window_to) = board.live_range(now, expired);
        let mut entries = Vec::with_capacity(rows.len() / 2);
        let mut rows = rows.into_iter();
        while let (Some(z), Some(s)) = (rows.next(), rows.next()) {
            let total = score(&s)
                .ok_or_else(|| reply_err(format!("query: score {s:?} is not an exact integer")))?;
            let z = as_string(z).ok_or_else(|| reply_err("query: member is not text"))?;
            let (member, last_ts) = decode_member(board.tie_break, &z);
            let rank = start + entries.len() as u64 + 1;
            let competition_rank = match entries.last() {
                None => first_competition,
                Some(Entry {
                    total: prev,
                    competition_rank,
                    ..
                }) if *prev == total => *competition_rank,
                Some(_) => rank,
            };
            entries.push(Entry {
                rank,
                competition_rank,
                member,
                total,
                last_ts,
            });
        }
        Ok(Snapshot {
            count,
            rank: u64::try_from(rank).ok().map(|r| r + 1),
            window_from,
            window_to,
            entries,
        })
    }

    fn page(board: &Board, scope: Option<&str>, snap: Snapshot) -> Page {
        Page {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            scale: board.scale,
            count: snap.count,
            window_from: snap.window_from,
            window_to: snap.window_to,
            entries: snap.entries,
        }
    }

    /// The ranking from position `offset` (0-based), at most `limit` entries.
    pub async fn top(
        &self,
        board: &Board,
        scope: Option<&str>,
        offset: u64,
        limit: u64,
        now: i64,
    ) -> Result<Page, StoreError> {
        let snap = self
            .query(
                board,
                scope,
                vec![
                    "top".into(),
                    (offset.min(i64::MAX as u64) as i64).into(),
                    (limit as i64).into(),
                ],
                now,
            )
            .await?;
        Ok(Self::page(board, scope, snap))
    }

    /// The position of `member`; its rank fields are null when it is not on the board.
    pub async fn rank(
        &self,
        board: &Board,
        scope: Option<&str>,
        member: &str,
        now: i64,
    ) -> Result<MemberRank, StoreError> {
        let snap = self
            .query(board, scope, vec!["rank".into(), member.into()], now)
            .await?;
        let entry = snap
            .entries
            .into_iter()
            .next()
            .filter(|_| snap.rank.is_some());
        Ok(MemberRank {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            scale: board.scale,
            count: snap.count,
            window_from: snap.window_from,
            window_to: snap.window_to,
            member: member.to_string(),
            rank: entry.as_ref().map(|e| e.rank),
            competition_rank: entry.as_ref().map(|e| e.competition_rank),
            total: entry.as_ref().map(|e| e.total),
            last_ts: entry.and_then(|e| e.last_ts),
        })
    }

    /// The entries from `rank - radius` to `rank + radius` around `member`; `None` when
    /// the member is not on the board.
    pub async fn around(
        &self,
        board: &Board,
        scope: Option<&str>,
        member: &str,
        radius: u64,
        now: i64,
    ) -> Result<Option<Page>, StoreError> {
        let snap = self
            .query(
                board,
                scope,
                vec!["around".into(), member.into(), (radius as i64).into()],
                now,
            )
            .await?;
        if snap.rank.is_none() {
            return Ok(None);
        }
        Ok(Some(Self::page(board, scope, snap)))
    }
}

/// One member of a recomputed instance, as written by [`Store::stage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The member.
    pub member: String,
    /// Its exact total over the live slices.
    pub total: i64,
    /// How many live slices hold it.
    pub slices: i64,
    /// The tie-break time to record when `members` has lost the member (a repair by
    /// rebuild); `None` skips such a member (it left the instance while being summed).
    pub fallback_ts: Option<i64>,
}

/// Which scratch structures [`Store::stage`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTargets {
    /// The ranking ZSet.
    pub result: bool,
    /// The resummarize lookup Hash (member -> zmember as ranked).
    pub ranked: bool,
    /// The live-slice counts.
    pub refs: bool,
    /// The live totals.
    pub totals: bool,
    /// Write `result`/`ranked` only for totals above 0.
    pub positive_only: bool,
}

impl StageTargets {
    fn flags(self) -> String {
        [
            (self.result, 'r'),
            (self.ranked, 'n'),
            (self.refs, 'f'),
            (self.totals, 't'),
            (self.positive_only, 'p'),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| *c)
        .collect()
    }

    /// The (scratch, live) key pairs these targets replace.
    fn pairs(self, k: &InstanceKeys, token: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.result {
            out.push((k.scratch(token, "result"), k.result()));
        }
        if self.ranked {
            out.push((k.scratch(token, "ranked"), k.ranked()));
        }
        if self.refs {
            out.push((k.scratch(token, "refs"), k.refs()));
        }
        if self.totals {
            out.push((k.scratch(token, "totals"), k.totals()));
        }
        out
    }
}

/// How long scratch keys of a recomputation live if their run dies, in ms.
const SCRATCH_TTL_MS: i64 = 15 * 60 * 1000;

impl Store {
    /// The registered slices above `watermark` (the live ones), oldest first.
    pub async fn live_slices(
        &self,
        board: &Board,
        scope: Option<&str>,
        watermark: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let k = self.instance(board, scope);
        let v: Vec<String> = self
            .client()
            .zrangebyscore(k.slices(), format!("({watermark}"), "+inf", false, None)
            .await?;
        v.iter()
            .map(|s| {
                s.parse()
                    .map_err(|_| reply_err(format!("slice registry holds {s:?}")))
            })
            .collect()
    }

    /// The instance's `expired_through` and `gen` (change counter).
    pub async fn meta(
        &self,
        board: &Board,
        scope: Option<&str>,
    ) -> Result<(Option<i64>, String), StoreError> {
        let k = self.instance(board, scope);
        let (w, gen): (Option<String>, Option<String>) = self
            .client()
            .hmget(k.meta(), vec!["expired_through", "gen"])
            .await?;
        Ok((
            w.and_then(|w| w.parse().ok()),
            gen.unwrap_or_else(|| "0".into()),
        ))
    }

    /// Writes one chunk of a recomputed instance into the scratch keys of run `token`;
    /// returns how many members were skipped because they have left the instance, and
    /// the members given their fallback tie-break time (see [`Staged::fallback_ts`]).
    /// Callers pass at most [`STAGE_CALL_ROWS`] rows.
    pub async fn stage(
        &self,
        board: &Board,
        scope: Option<&str>,
        token: &str,
        targets: StageTargets,
        rows: &[Staged],
    ) -> Result<(u64, Vec<String>), StoreError> {
        let k = self.instance(board, scope);
        let keys = vec![
            k.members(),
            k.scratch(token, "result"),
            k.scratch(token, "ranked"),
            k.scratch(token, "refs"),
            k.scratch(token, "totals"),
            k.scratch(token, "marker"),
        ];
        let mut args: Vec<Value> = vec![targets.flags().into(), SCRATCH_TTL_MS.into()];
        for r in rows {
            args.extend([
                Value::from(r.member.as_str()),
                Value::from(r.total),
                Value::from(r.slices),
                r.fallback_ts.map_or(Value::from(""), |ts| {
                    Value::from(encode_member(board.tie_break, &r.member, ts))
                }),
            ]);
        }
        let out = as_array(self.eval(&self.scripts.stage, keys, args).await?)
            .ok_or_else(|| reply_err("stage: not an array"))?;
        let mut it = out.into_iter();
        let skipped = it
            .next()
            .as_ref()
            .and_then(as_i64)
            .ok_or_else(|| reply_err("stage: no count"))?;
        let repaired = it
            .next()
            .and_then(as_array)
            .unwrap_or_default()
            .into_iter()
            .filter_map(as_string)
            .collect();
        Ok((skipped.max(0) as u64, repaired))
    }

    /// Renames the scratch keys of run `token` over the live ones, atomically, and then
    /// frees the replaced values with `UNLINK` (never inside the script call). Refused
    /// (false) when the run already swapped, when `expected_gen` is given and an apply or
    /// expiry happened since it was read, or when `watermark` is given and a sum above a
    /// higher watermark was already swapped in.
    pub async fn swap(
        &self,
        board: &Board,
        scope: Option<&str>,
        token: &str,
        targets: StageTargets,
        expected_gen: Option<&str>,
        watermark: Option<i64>,
    ) -> Result<bool, StoreError> {
        let k = self.instance(board, scope);
        let mut keys = vec![k.meta(), k.scratch(token, "marker")];
        let mut trash = Vec::new();
        for (scratch, live) in targets.pairs(&k, token) {
            let old = format!("{scratch}:old");
            keys.extend([scratch, live, old.clone()]);
            trash.push(old);
        }
        let args = vec![
            Value::from(expected_gen.unwrap_or("")),
            watermark.map_or(Value::from(""), Value::from),
            Value::from(SCRATCH_TTL_MS),
        ];
        let v = self.eval(&self.scripts.swap, keys, args).await?;
        let swapped = as_i64(&v) == Some(1);
        if swapped {
            // The replaced values were renamed away inside the script; UNLINK frees them
            // in Redis's background thread instead of inside a call. Best effort: the swap
            // has happened whatever this answers, and their TTL frees them otherwise.
            let freed: Result<i64, _> = self.client().unlink(trash).await;
            drop(freed);
        }
        Ok(swapped)
    }

    /// Deletes the scratch keys of an abandoned run.
    pub async fn discard(
        &self,
        board: &Board,
        scope: Option<&str>,
        token: &str,
    ) -> Result<(), StoreError> {
        let k = self.instance(board, scope);
        let keys: Vec<String> = ["result", "ranked", "refs", "totals", "marker"]
            .iter()
            .map(|w| k.scratch(token, w))
            .collect();
        // UNLINK: a scratch copy of a large ranking is freed in the background.
        let _: i64 = self.client().unlink(keys).await?;
        Ok(())
    }

    /// Deletes the derived keys of an instance that holds no slice and no idempotency key
    /// (its `meta` stays, so its watermark keeps judging late events); true when done.
    pub async fn cleanup(&self, board: &Board, scope: Option<&str>) -> Result<bool, StoreError> {
        let k = self.instance(board, scope);
        let keys = vec![
            k.slices(),
            k.seen(),
            k.result(),
            k.members(),
            k.ranked(),
            k.refs(),
            k.totals(),
        ];
        let v = self.eval(&self.scripts.cleanup, keys, Vec::new()).await?;
        Ok(as_i64(&v) == Some(1))
    }

    /// Every (member, total) pair of the stored ranking ZSet, decoded.
    pub async fn result_entries(
        &self,
        board: &Board,
        scope: Option<&str>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let k = self.instance(board, scope);
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self.scan("ZSCAN", &k.result(), &cursor, 1000).await?;
            for (z, s) in page {
                let total = score(&Value::from(s.as_str()))
                    .ok_or_else(|| reply_err(format!("score {s:?} is not an exact integer")))?;
                out.push((decode_member(board.tie_break, &z).0, total));
            }
            if next == "0" {
                return Ok(out);
            }
            cursor = next;
        }
    }
}

struct Snapshot {
    count: u64,
    rank: Option<u64>,
    window_from: i64,
    window_to: i64,
    entries: Vec<Entry>,
}

#[cfg(test)]
mod permission_tests {
    use super::*;

    /// The commands granted by the shipped ACL file, lower-cased as written there.
    fn granted() -> Vec<String> {
        let acl = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/redis/users.acl"
        ))
        .expect("deploy/redis/users.acl");
        acl.split_whitespace()
            .filter_map(|rule| rule.strip_prefix('+'))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_lua_file_is_probed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("src/lua")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".lua"))
            .collect();
        files.sort();
        let probed: Vec<String> = LUA_SOURCES.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(probed, files, "LUA_SOURCES lists every script");
    }

    #[test]
    fn the_shipped_acl_grants_every_command_the_scripts_call() {
        let options = [
            "LIMIT",
            "PX",
            "WITHSCORES",
            "GT",
            "NX",
            "XX",
            "CH",
            "REV",
            "BYSCORE",
        ];
        let granted = granted();
        let commands = script_commands();
        for needed in ["HDEL", "HSET", "ZMSCORE", "ZADD", "EXISTS"] {
            assert!(
                commands.iter().any(|c| c == needed),
                "{needed}: {commands:?}"
            );
        }
        for command in commands.iter().filter(|c| !options.contains(&c.as_str())) {
            assert!(
                granted.contains(&command.to_ascii_lowercase()),
                "{command} is called by a script but not granted in deploy/redis/users.acl"
            );
        }
    }

    #[test]
    fn denials_name_whole_keys_and_whole_commands_once() {
        let probe = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        let probes = vec![
            probe(&["XACK", "rb:events", "g", "0-1"]),
            probe(&["HSET", "rb:a", "rb:a"]),
            probe(&["HDEL", "rb:a", "rb:a"]),
            probe(&["HSET", "rb:b", "rb:b"]),
            probe(&["HDEL", "rb:b", "rb:b"]),
            probe(&["HSET", "x:c", "x:c"]),
            probe(&["HDEL", "x:c", "x:c"]),
            probe(&["SCRIPT", "LOAD", "return 1"]),
        ];
        let denied: Vec<&Vec<String>> = [0, 2, 4, 5, 6, 7].iter().map(|&i| &probes[i]).collect();
        assert_eq!(
            describe_denied(&probes, &denied),
            ["XACK on key rb:events", "HDEL", "key x:c", "SCRIPT LOAD"]
        );
    }
}
