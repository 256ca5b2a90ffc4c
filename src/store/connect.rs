//! Connecting to Redis and checking it at start-up: the pool and the dedicated stream
//! client (with TLS), loading the Lua library, `PING`, the permission probe of the Redis user
//! ([`Denied`], [`Refused`]) and the check of each board's stored settings ([`Conflicts`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::TlsConnector;

use tracing::warn;

use super::calls::{probe_args, Calling, PERMISSION_PROBE};
use super::{reply_err, Scripts, Store, StoreError};
use crate::config::tls::tls_client_config;
use crate::config::{Durability, ScriptCalls};
use crate::config::{RedisSettings, TlsFiles};
use crate::domain::board::{Board, View, DEFAULTED_SETTINGS};
use crate::domain::keys::{InstanceKeys, Keys};
use crate::metrics::Metrics;

/// How the connection behaves when Redis goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconnect {
    /// Fail at once (command-line tools).
    Never,
    /// Reconnect forever with exponential backoff (the daemon).
    Forever,
}

/// The text of every Lua script and shared piece, for the permission probe: a function
/// runs with the caller's ACL, so every command it calls is one the Redis user needs.
fn lua_sources() -> impl Iterator<Item = &'static str> {
    let pieces = super::lua::PIECES.into_iter().map(|(_, text, _)| text);
    super::lua::SCRIPTS
        .into_iter()
        .map(|(_, text)| text)
        .chain(pieces)
}

/// Every name a Lua source might call as a command: each quoted upper-case word, whether
/// it is passed to `redis.call` directly or through a helper such as `variadic('HSET', ...)`.
/// Option words among them (`LIMIT`, `WITHSCORES`) are not commands; the probe skips
/// names Redis does not know. Sorted and deduplicated.
pub fn script_commands() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for source in lua_sources() {
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
                    "EVAL (the permission check): {}",
                    e.details()
                )]))
            }
            _ => None,
        }
    }
}

/// A setting of a board whose value in Redis differs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Board name.
    pub board: String,
    /// The setting (`mode`, `tie_break`, `allow_negative`, `scale`, `window`, `slice`,
    /// `windows`, `dense_rank`, `scope`).
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
             put the setting back, or give the board a new name (it starts empty; remove the old board's keys \
             with `rollboard drop-board {}` once nothing reads them)",
            self.board,
            self.setting,
            shown(&self.configured),
            self.setting,
            shown(&self.stored),
            self.key,
            self.board
        )
    }
}

/// A setting's value as a message shows it: an unscoped board's `scope` is `(none)`.
fn shown(value: &str) -> &str {
    if value.is_empty() {
        "(none)"
    } else {
        value
    }
}

/// Every setting that differs between the configuration and Redis: a process with any
/// refuses to start (exit 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct Conflicts(pub Vec<Conflict>);

/// The (setting, value) pairs of a fingerprint written by [`View::fingerprint`].
/// A stored record of settings (not empty) completed with the value each setting of
/// [`DEFAULTED_SETTINGS`] it lacks stands for: it was written before the setting existed,
/// or by a board that left it at its default.
fn with_defaults(stored: &mut HashMap<String, String>) {
    if stored.is_empty() {
        return;
    }
    for (setting, default) in DEFAULTED_SETTINGS {
        stored
            .entry(setting.to_string())
            .or_insert_with(|| default.to_string());
    }
}

/// The settings a board wants pinned, completed likewise: a board at the default of a
/// setting of [`DEFAULTED_SETTINGS`] wants that default, so data written with another
/// value is refused.
fn with_defaults_wanted(wanted: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut out = wanted.to_vec();
    for (setting, default) in DEFAULTED_SETTINGS {
        if !out.iter().any(|(s, _)| *s == setting) {
            out.push((setting, default.to_string()));
        }
    }
    out
}

fn parse_fingerprint(text: &str) -> HashMap<String, String> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The command (with its subcommand) and the key of a probe, e.g. `("XACK", Some("rb:events"))`
/// or `("FUNCTION LOAD", None)`.
fn probe_parts(probe: &[String]) -> (String, Option<&str>) {
    let command = probe.first().map(String::as_str).unwrap_or_default();
    let key = match command {
        "FUNCTION" | "SCRIPT" | "XGROUP" | "XINFO" => {
            return (
                probe[..probe.len().min(2)].join(" "),
                probe
                    .get(2)
                    .filter(|_| command != "FUNCTION" && command != "SCRIPT")
                    .map(String::as_str),
            )
        }
        "PING" | "MULTI" | "EXEC" | "WAIT" | "ROLE" | "TIME" => None,
        "FCALL" | "EVALSHA" => probe.get(3),
        "XREADGROUP" | "XREAD" => probe.len().checked_sub(2).and_then(|i| probe.get(i)),
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
            None if command == "WAIT" => WAIT_DENIED.to_string(),
            None => command.clone(),
        };
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// How a denied `WAIT` is named: a service that refuses it replicates by itself, and
/// rollboard then asks no replica to acknowledge.
pub const WAIT_DENIED: &str = "WAIT (a service that refuses WAIT replicates for you: set \
                               redis.min_replicas_acked = 0)";

/// A probe: one command's words.
fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| w.to_string()).collect()
}

/// The probes of loading the scripts and checking that a server holds them, as `calling`
/// does it (the calls themselves are probed on the keys they touch).
fn loading_probes(calling: Calling) -> Vec<Vec<String>> {
    match calling {
        Calling::Functions => vec![
            words(&["FUNCTION", "LOAD", "REPLACE", "#!lua name=probe\n"]),
            words(&["FUNCTION", "LIST", "LIBRARYNAME", "probe"]),
        ],
        Calling::Eval => vec![
            words(&["SCRIPT", "LOAD", "return 1"]),
            words(&["SCRIPT", "EXISTS", "0"]),
        ],
    }
}

/// The probes of the stream commands (intake, consumer, trimming, dead letters).
fn stream_probes(stream: &str, dead_letter: &str) -> Vec<Vec<String>> {
    vec![
        words(&["PING"]),
        words(&["TIME"]),
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
        // A clean exit removes its consumer when it holds nothing pending.
        words(&["XPENDING", stream, "g", "-", "+", "1", "c"]),
        words(&["XGROUP", "DELCONSUMER", stream, "g", "c"]),
        words(&["XTRIM", stream, "MINID", "~", "0-1"]),
        words(&["XLEN", stream]),
        words(&["XADD", dead_letter, "MAXLEN", "~", "1", "*", "f", "v"]),
        words(&["XLEN", dead_letter]),
    ]
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
                // Redirections come back to rollboard as outage errors, and the call is
                // retried whole. fred 10.1 follows an ASK by writing `ASKING` to the target
                // and taking the next reply read on that connection as its answer, whatever
                // is already in flight there (the replies of other calls shift by one), and
                // then sends the command to the slot's old owner again. Following a MOVED,
                // it re-reads the slot map before it gives up, so the retry goes straight
                // to the new owner. Append transactions re-read the slot map themselves
                // after a redirection (see [`crate::ingest::stream::append`]).
                c.max_redirections = 0;
                // No `CLUSTER INFO` on each new cluster connection: the Redis user needs no
                // permission for it (deploy/redis/users.acl grants none), and a failing
                // cluster answers `CLUSTERDOWN`, an outage rollboard waits out anyway.
                c.disable_cluster_health_check = true;
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
        Ok(
            Self::connect_builder(builder, &redis.key_prefix, size, reconnect)
                .await?
                .with_durability(redis.durability)
                .with_calls_in_flight(redis.calls_in_flight)
                .with_script_calls(redis.scripts)
                .with_transactions(redis.transactions),
        )
    }

    async fn connect_builder(
        builder: Builder,
        prefix: &str,
        size: usize,
        reconnect: Reconnect,
    ) -> Result<Store, StoreError> {
        // One connection more than asked, for the reads (see [`Store::reader`]).
        let pool = builder.build_pool(size.max(1) + 1)?;
        let failed = Arc::new(std::sync::Mutex::new(None));
        for client in pool.clients() {
            use fred::interfaces::EventInterface;
            // The listeners run for the life of the client; their handles are not needed.
            let on_error = failed.clone();
            drop(client.on_error(move |(error, _)| {
                // Bounded: the detail is Redis's or the OS's text, shown in a 503.
                let detail: String = error.details().chars().take(200).collect();
                if let Ok(mut last) = on_error.lock() {
                    *last = Some(detail);
                }
                std::future::ready(Ok(()))
            }));
            let on_reconnect = failed.clone();
            drop(client.on_reconnect(move |_| {
                if let Ok(mut last) = on_reconnect.lock() {
                    *last = None;
                }
                std::future::ready(Ok(()))
            }));
        }
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
            next: AtomicUsize::new(0),
            in_flight: super::calls_in_flight(crate::config::DEFAULT_CALLS_IN_FLIGHT),
            keys: Keys::new(prefix),
            scripts: Scripts::new(),
            metrics: None,
            durability: Durability::default(),
            replicas_auto: tokio::sync::OnceCell::new(),
            legacy: Default::default(),
            packs_by_slot: Default::default(),
            failed,
            generations: Default::default(),
            script_calls: ScriptCalls::Auto,
            calling: tokio::sync::OnceCell::new(),
            judging: super::apply::judge::Judging::new(Some(builder)),
        })
    }

    /// Calls the scripts as `scripts` says (`redis.scripts`; `auto` by default).
    pub fn with_script_calls(mut self, scripts: ScriptCalls) -> Store {
        self.script_calls = scripts;
        self.calling = tokio::sync::OnceCell::new();
        self
    }

    /// Judges small instances in the worker (`redis.transactions`, on by default), or
    /// leaves every instance to `fold.lua` (see `apply::judge`).
    pub fn with_transactions(mut self, on: bool) -> Store {
        if !on {
            self.judging = super::apply::judge::Judging::new(None);
        }
        self
    }

    /// Counts this store's writes in `generations`, shared with the other stores of the
    /// process (see [`Generations`](super::Generations)).
    pub fn with_generations(mut self, generations: Arc<super::Generations>) -> Store {
        self.generations = generations;
        self
    }

    /// Observes the duration of every script call in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Store {
        metrics.scripts(&super::SCRIPT_NAMES);
        self.metrics = Some(metrics);
        self
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

    /// Records each board's shaping settings in Redis the first time the board is seen,
    /// and lists every setting whose stored value differs from `boards` (empty: all agree).
    /// Data written under other settings would be misread (scores, tie-break prefixes,
    /// slice numbers), so a process with conflicts must not start.
    pub async fn check_settings(&self, boards: &[Board]) -> Result<Vec<Conflict>, StoreError> {
        let mut conflicts = Vec::new();
        for board in boards {
            let key = self.keys.settings(&board.name);
            let wanted = board.pinned_settings();
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
            if !stored.contains_key("scope") && stored.contains_key("shards") {
                // An instance's fingerprint of a sharded board: only an unscoped board is
                // sharded (its registry lists shards, not scope values).
                stored.insert("scope".into(), String::new());
            } else if !stored.contains_key("scope") {
                // Recorded by an older version, which did not pin `scope`: the keys that
                // exist tell whether the data was built scoped.
                if let Some((scope, key)) = self.scope_in_data(board).await? {
                    stored.insert("scope".into(), scope);
                    source = key;
                }
            }
            let before = conflicts.len();
            with_defaults(&mut stored);
            for (setting, configured) in with_defaults_wanted(&wanted).iter() {
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
                // The whole record on first sight; `scope` alone into a record written
                // before it was pinned.
                let args: Vec<Value> = wanted
                    .iter()
                    .flat_map(|(k, v)| [Value::from(*k), Value::from(v.as_str())])
                    .collect();
                // The record as it is after the write: another process that checked at the
                // same moment with other settings may have written it first, and then this
                // one must refuse.
                let mut recorded: HashMap<String, String> = self
                    .client()
                    .eval(
                        "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) \
                         else redis.call('HSETNX', KEYS[1], ARGV[#ARGV - 1], ARGV[#ARGV]) end \
                         return redis.call('HGETALL', KEYS[1])",
                        vec![key.clone()],
                        args,
                    )
                    .await?;
                with_defaults(&mut recorded);
                for (setting, configured) in with_defaults_wanted(&wanted).iter() {
                    match recorded.get(*setting) {
                        Some(v) if v != configured => conflicts.push(Conflict {
                            board: board.name.clone(),
                            setting,
                            stored: v.clone(),
                            configured: configured.clone(),
                            key: key.clone(),
                        }),
                        _ => {}
                    }
                }
            }
        }
        Ok(conflicts)
    }

    /// Whether the board's data in Redis was built without a scope (`""`, with the
    /// unscoped instance's key that exists) or with one (the configured scope field, which
    /// older versions did not record, with the scope registry); `None` when there is no
    /// data to tell.
    async fn scope_in_data(&self, board: &Board) -> Result<Option<(String, String)>, StoreError> {
        let unscoped = self.instance(&board.widest(), None);
        for key in [unscoped.meta(), unscoped.result(), unscoped.slices()] {
            let exists: i64 = self.client().exists(&key).await?;
            if exists > 0 {
                return Ok(Some((String::new(), key)));
            }
        }
        let registry = self.keys.scopes(&board.name);
        let scopes: i64 = self.client().exists(&registry).await?;
        if scopes > 0 {
            // The field's name was not recorded: only "scoped" is known, so a scoped
            // configuration is taken as the one the data was built with.
            let field = board
                .scope
                .clone()
                .unwrap_or_else(|| "a scope field".into());
            return Ok(Some((field, registry)));
        }
        Ok(None)
    }

    /// The settings fingerprint stored in the `meta` of one of the board's instances (the
    /// unscoped one, or the first few registered scopes or shards), with the key it was
    /// read from. An unscoped rolling board's data may have been built with another number
    /// of shards than configured: both its unscoped instance and its registered shards
    /// are looked at.
    async fn instance_fingerprint(
        &self,
        board: &Board,
    ) -> Result<Option<(String, String)>, StoreError> {
        let unscoped_rolling = !board.is_scoped() && board.period.is_none();
        let mut scopes: Vec<Option<String>> = Vec::new();
        if !board.is_scoped() {
            scopes.push(None);
        }
        if board.has_many_instances() || unscoped_rolling {
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
            scopes.extend(some.into_iter().map(Some));
        }
        let widest = board.widest();
        for scope in scopes {
            let meta = self.instance(&widest, scope.as_deref()).meta();
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
        let calling = self.calling().await?;
        let mut probes = stream_probes(stream, dead_letter);
        probes.extend(loading_probes(calling));
        probes.extend(self.job_probes(calling));
        probes.extend(self.board_probes(calling, boards));
        let status: Vec<i64> = self
            .client()
            .eval(PERMISSION_PROBE, stream, probe_args(&probes))
            .await?;
        if status == [-1] {
            warn!(
                "the server offers no redis.acl_check_cmd: the redis user's permissions are \
                 not checked at start, and a denied command fails when it is first sent"
            );
            return Ok(Vec::new());
        }
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

    /// The probes of the daemon's own commands (lease, replica confirmation).
    fn job_probes(&self, calling: Calling) -> Vec<Vec<String>> {
        let (call, lease_script) = calling.command(&self.scripts.lease);
        let mut probes = Vec::new();
        // Each tick of a scheduled job runs under a lease (`lease.lua`).
        for job in ["roll", "resummarize"] {
            let (lease, tick) = (self.keys.lease(job), self.keys.lease_tick(job));
            probes.extend([
                words(&[call, lease_script, "2", &lease, &tick]),
                words(&["GET", &lease]),
                words(&["SET", &lease, "v", "NX", "PX", "1"]),
                words(&["PEXPIRE", &lease, "1"]),
                words(&["DEL", &lease]),
                words(&["GET", &tick]),
                words(&["SET", &tick, "1", "PX", "1"]),
            ]);
        }
        if self.durability.replicas != Some(0) {
            // Confirmations: a short-lived key, then WAIT; ROLE decides the default count.
            probes.extend([
                words(&["SET", &self.keys.sync(Some("0")), "1", "PX", "1"]),
                words(&["WAIT", "0", "0"]),
                words(&["ROLE"]),
            ]);
        }
        probes
    }

    /// The probes of every command the scripts and the roll run on each board's keys.
    fn board_probes(&self, calling: Calling, boards: &[Board]) -> Vec<Vec<String>> {
        let (call, apply) = calling.command(&self.scripts.fold);
        let mut probes = Vec::new();
        let lua = script_commands();
        for board in boards {
            let k = self.instance(&board.widest(), None);
            let (meta, settings) = (k.meta(), self.keys.settings(&board.name));
            let (scopes, window) = (self.keys.scopes(&board.name), self.keys.window(&board.name));
            // A change stream lies outside the instance's base (`rb:changes:{board}`): a key
            // pattern that covers the base may miss it.
            let changes = board.changes.map(|_| k.changes());
            // A narrower window's keys carry its width after the hash tag
            // (`rb:{board}:w:24h:meta`, `rb:changes:{board}:24h`), which a key pattern
            // covering the widest's may miss too: one window stands for the others.
            let narrower = board
                .narrower_views()
                .first()
                .and_then(View::window_suffix)
                .map(|suffix| k.in_window(&suffix));
            let narrower_meta = narrower.as_ref().map(InstanceKeys::meta);
            let narrower_changes = narrower
                .as_ref()
                .filter(|_| board.changes.is_some())
                .map(InstanceKeys::changes);
            for key in [&meta, &settings, &scopes, &window]
                .into_iter()
                .chain(changes.as_ref())
                .chain(narrower_meta.as_ref())
                .chain(narrower_changes.as_ref())
            {
                probes.push(words(&[call, apply, "1", key]));
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
            if board.dense_rank {
                // `verify` reads the distinct totals back.
                probes.push(words(&["ZSCAN", &k.dense(), "0"]));
            }
            if let Some(narrower) = &narrower {
                // `verify` and the queries read a narrower window's ranking.
                probes.extend([
                    words(&["ZSCAN", &narrower.result(), "0"]),
                    words(&["HMGET", &narrower.meta(), "f"]),
                ]);
            }
            if board.changes.is_some() {
                // The change feed's streams (`GET /v1/boards/{board}/changes`), of each
                // window.
                let feed = self.keys.changes(&board.name, None, None);
                for feed in std::iter::once(&feed).chain(narrower_changes.as_ref()) {
                    probes.extend([
                        words(&["XINFO", "STREAM", feed]),
                        words(&["XRANGE", feed, "-", "+", "COUNT", "1"]),
                        words(&["XREAD", "COUNT", "1", "STREAMS", feed, "0-0"]),
                    ]);
                }
            }
        }
        probes
    }

    /// Whether a pooled connection is up (all of them are down while Redis is unreachable).
    /// Commands sent meanwhile wait for the reconnection, up to the command timeout, so a
    /// job that must not hang checks first.
    pub fn is_connected(&self) -> bool {
        self.pool.clients().iter().any(|c| c.is_connected())
    }

    /// When Redis is known to be down, the last connection error: no connection is up and
    /// the last connection event was an error (a lost connection, a refused reconnection).
    /// A store still making its first connection is not known down: a command sent then
    /// waits for it.
    pub fn known_down(&self) -> Option<String> {
        if self.is_connected() {
            return None;
        }
        self.failed.lock().ok().and_then(|last| last.clone())
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
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("src/store/lua")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".lua") && !crate::store::lua::PIECES.iter().any(|p| p.0 == f))
            .collect();
        files.sort();
        let probed: Vec<String> = crate::store::lua::SCRIPTS
            .iter()
            .map(|(f, _)| f.to_string())
            .collect();
        assert_eq!(probed, files, "lua::SCRIPTS lists every script");
    }

    #[test]
    fn the_shipped_acl_grants_every_command_the_scripts_call() {
        let options = [
            // A subcommand: `XGROUP DELCONSUMER` is probed as such at start.
            "DELCONSUMER",
            "LIMIT",
            "MAXLEN",
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
            let command_lower = command.to_ascii_lowercase();
            // A container command (XGROUP) is granted subcommand by subcommand.
            let container = format!("{command_lower}|");
            assert!(
                granted
                    .iter()
                    .any(|g| *g == command_lower || g.starts_with(&container)),
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
            probe(&["FUNCTION", "LOAD", "return 1"]),
        ];
        let denied: Vec<&Vec<String>> = [0, 2, 4, 5, 6, 7].iter().map(|&i| &probes[i]).collect();
        assert_eq!(
            describe_denied(&probes, &denied),
            ["XACK on key rb:events", "HDEL", "key x:c", "FUNCTION LOAD"]
        );
    }
}
