//! Settings: raw serde structs read by the `config` crate (file, then `ROLLBOARD__*`
//! environment overrides), validated into [`Settings`] with real types.
//!
//! Every refusal names the key and the value, so an operator can fix the file without
//! reading code.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

pub use crate::config::tokens::Token;
use crate::domain::board::{parse_duration_ms, Board, Dedup, Mode, TieBreak};
use crate::domain::roles::{Role, Roles};
pub mod tls;
pub mod tokens;

/// Full-size writing script calls in Redis at once, by default (`redis.max_calls_in_flight`).
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 4;

use crate::config::tokens::{RoleTokens, Source};

/// Default location of the config file.
pub const DEFAULT_PATH: &str = "config/rollboard.toml";

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or an environment override could not be read or does not fit the schema.
    #[error("cannot read configuration: {0}")]
    Read(String),
    /// A key holds a value that is not acceptable.
    #[error("invalid configuration: `{key}` = {value:?}: {reason}{}", shown_origin(.origin))]
    Invalid {
        /// Dotted path of the key, e.g. `boards[1].window`.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
        /// Where the value came from: `environment variable ROLLBOARD__...` or
        /// `file <path>` (unknown until the sources are known).
        origin: Option<String>,
    },
}

fn shown_origin(origin: &Option<String>) -> String {
    origin
        .as_deref()
        .map(|o| format!(" (set by {o})"))
        .unwrap_or_default()
}

/// The environment variable that sets the dotted `key` (e.g. `ingest.batch_size` from
/// `ROLLBOARD__INGEST__BATCH_SIZE`; names are matched without regard to case, as the
/// `config` crate reads them), if one is set.
fn env_var_for(key: &str) -> Option<String> {
    if key.contains('[') {
        // Array elements (`boards[1]...`) cannot be set from the environment.
        return None;
    }
    let wanted = format!("ROLLBOARD__{}", key.replace('.', "__"));
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .find(|name| name.eq_ignore_ascii_case(&wanted))
}

/// The dotted key a `config` crate error is about: `... for key `ingest.batch_size` ...`,
/// or for an unknown field, that field under its table (`ingest.batchsize`).
fn key_in_message(message: &str) -> Option<String> {
    let quoted = |after: &str| -> Option<String> {
        let start = message.find(after)? + after.len();
        let rest = &message[start..];
        Some(rest[..rest.find('`')?].to_string())
    };
    let table = quoted("for key `");
    match quoted("unknown field `") {
        Some(field) => Some(match table {
            Some(table) => format!("{table}.{field}"),
            None => field,
        }),
        None => table,
    }
}

/// `e` with where its value came from: the environment variable that set the key, else
/// `file` (when there is one).
fn locate(e: ConfigError, file: Option<&Path>) -> ConfigError {
    let in_file = || file.map(|p| p.display().to_string());
    match e {
        ConfigError::Invalid {
            key,
            value,
            reason,
            origin: None,
        } => {
            let origin = env_var_for(&key)
                .map(|var| format!("environment variable {var}"))
                .or_else(|| in_file().map(|p| format!("file {p}")));
            ConfigError::Invalid {
                key,
                value,
                reason,
                origin,
            }
        }
        ConfigError::Read(why) => {
            let var = key_in_message(&why).and_then(|key| env_var_for(&key));
            match (var, in_file()) {
                (Some(var), _) => {
                    let why = why.trim_end_matches(" in the environment");
                    ConfigError::Read(format!("environment variable {var}: {why}"))
                }
                (None, Some(path)) => ConfigError::Read(format!("{path}: {why}")),
                (None, None) => ConfigError::Read(why),
            }
        }
        located => located,
    }
}

fn invalid(
    key: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
        origin: None,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawSettings {
    daemon: RawDaemon,
    redis: RawRedis,
    ingest: RawIngest,
    schedule: RawSchedule,
    http: RawHttp,
    log: RawLog,
    boards: Vec<RawBoard>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawRedis {
    url: String,
    key_prefix: String,
    tls_ca_file: String,
    tls_cert_file: String,
    tls_key_file: String,
    min_replicas_acked: Option<i64>,
    replica_ack_timeout: String,
    max_calls_in_flight: i64,
    max_clock_skew: String,
}

impl Default for RawRedis {
    fn default() -> Self {
        RawRedis {
            url: "redis://127.0.0.1:6379".into(),
            key_prefix: "rb".into(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            min_replicas_acked: None,
            replica_ack_timeout: "2s".into(),
            max_calls_in_flight: DEFAULT_CALLS_IN_FLIGHT as i64,
            max_clock_skew: "2s".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawIngest {
    stream: String,
    partitions: i64,
    group: String,
    consumer: String,
    batch_size: i64,
    block: String,
    claim_idle: String,
    dead_letter_stream: String,
    dead_letter_max_len: i64,
    retain: String,
    dedup_window: String,
    max_future: String,
}

impl Default for RawIngest {
    fn default() -> Self {
        RawIngest {
            stream: "rb:events".into(),
            partitions: 1,
            group: "rollboard".into(),
            consumer: String::new(),
            batch_size: 500,
            block: "1s".into(),
            claim_idle: "30s".into(),
            dead_letter_stream: "rb:events:dead".into(),
            dead_letter_max_len: 100_000,
            retain: "1m".into(),
            dedup_window: "window".into(),
            max_future: "5m".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawDaemon {
    roles: RawRoles,
}

/// `daemon.roles`: a list, or one comma-separated string (what an environment override,
/// `ROLLBOARD__DAEMON__ROLES=intake,query`, gives).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRoles {
    List(Vec<String>),
    Text(String),
}

impl Default for RawDaemon {
    fn default() -> Self {
        RawDaemon {
            roles: RawRoles::List(Role::ALL.iter().map(|r| r.as_str().to_string()).collect()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawSchedule {
    roll: String,
    resummarize: String,
    chunk: i64,
    lease: String,
}

impl Default for RawSchedule {
    fn default() -> Self {
        RawSchedule {
            roll: "0 * * * * *".into(),
            resummarize: "0 * * * * *".into(),
            chunk: 250,
            lease: "30s".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawHttp {
    listen: String,
    admin_listen: String,
    allow_anonymous: bool,
    header_timeout: String,
    request_timeout: String,
    max_connections: i64,
    max_concurrent_intake: i64,
    intake_token_file: String,
    query_token_file: String,
    metrics_token_file: String,
    token_reload_interval: String,
}

impl Default for RawHttp {
    fn default() -> Self {
        RawHttp {
            listen: "127.0.0.1:9464".into(),
            admin_listen: String::new(),
            allow_anonymous: false,
            header_timeout: "10s".into(),
            request_timeout: "30s".into(),
            max_connections: 1024,
            max_concurrent_intake: 4,
            intake_token_file: String::new(),
            query_token_file: String::new(),
            metrics_token_file: String::new(),
            token_reload_interval: "5s".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLog {
    format: String,
    level: String,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            format: "text".into(),
            level: "info".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBoard {
    name: String,
    member: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default = "default_amount")]
    amount: String,
    #[serde(default)]
    scale: i64,
    window: String,
    slice: String,
    #[serde(default = "default_mode")]
    mode: String,
    #[serde(default = "default_tie_break")]
    tie_break: String,
    #[serde(default)]
    allow_negative: bool,
}

fn default_amount() -> String {
    "amount".into()
}
fn default_mode() -> String {
    "incremental".into()
}
fn default_tie_break() -> String {
    "earliest".into()
}

/// Validated settings of the whole process.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What this process runs (`daemon.roles`; `rollboard run --roles` replaces it).
    pub roles: Roles,
    /// Redis connection.
    pub redis: RedisSettings,
    /// Stream consumer.
    pub ingest: IngestSettings,
    /// Roll and resummarize jobs.
    pub schedule: ScheduleSettings,
    /// HTTP listener.
    pub http: HttpSettings,
    /// Logging.
    pub log: LogSettings,
    /// The boards, in file order.
    pub boards: Vec<Board>,
}

/// Redis connection settings.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://`, `rediss://` or `redis-cluster://` URL (it may hold a password: print
    /// [`RedisSettings::redacted_url`] instead).
    pub url: String,
    /// Prefix of every key rollboard writes.
    pub key_prefix: String,
    /// TLS settings beyond the system's root certificates (`rediss://` only).
    pub tls: Option<TlsFiles>,
    /// Replicas of every master written to that must hold a batch's writes before it is
    /// acked, or an append before it is confirmed (`redis.min_replicas_acked`, unset: 1
    /// when every master has a replica, else 0), and how long to wait for them
    /// (`redis.replica_ack_timeout`).
    pub durability: Durability,
    /// Full-size writing script calls in Redis at once (`redis.max_calls_in_flight`): what
    /// a query may wait behind while the daemon ingests or rolls.
    pub calls_in_flight: usize,
    /// How far this process's own clock may be from Redis's (`TIME`) before the process
    /// says so (`redis.max_clock_skew`, ms). Time is always Redis's; this only reports.
    pub max_clock_skew_ms: i64,
}

impl RedisSettings {
    /// The URL with its password (if any) replaced by `***`, for logs and errors.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// The Redis server(s) of the URL as `host:port` (comma-separated for a cluster's
    /// seed list), never the user or password: what logs and errors name.
    pub fn host(&self) -> String {
        redis_host(&self.url)
    }
}

/// The `host:port` part of a Redis URL (port 6379 when none is given), without its
/// user-info; the URL itself (redacted) when it has no `scheme://`.
pub fn redis_host(url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else {
        return redact_url(url);
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let hosts = authority
        .rfind('@')
        .map_or(authority, |at| &authority[at + 1..]);
    hosts
        .split(',')
        .map(|host| {
            // A bracketed IPv6 address holds colons of its own.
            let has_port = match host.rfind(']') {
                Some(close) => host[close..].contains(':'),
                None => host.contains(':'),
            };
            if has_port || host.is_empty() {
                host.to_string()
            } else {
                format!("{host}:6379")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &self.redacted_url())
            .field("key_prefix", &self.key_prefix)
            .field("tls", &self.tls)
            .field("durability", &self.durability)
            .field("calls_in_flight", &self.calls_in_flight)
            .field("max_clock_skew_ms", &self.max_clock_skew_ms)
            .finish()
    }
}

/// `url` with the password of its user-info part replaced by `***` (a URL without one is
/// returned as it is).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let (user_info, host) = authority.split_at(at);
    let user = match user_info.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{scheme}://{user}{host}{tail}")
}

/// `line` with the password of every URL in it replaced by `***` (a line of the file quoted
/// in a syntax error may hold `redis.url`).
fn redact_line(line: &str) -> String {
    let Some(at) = line.find("://") else {
        return line.to_string();
    };
    let scheme_start = line[..at]
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '-' || c == '+' || c == '.'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let rest = &line[at + 3..];
    let end = at + 3 + rest.find(['"', '\'', ' ', '\t']).unwrap_or(rest.len());
    format!(
        "{}{}{}",
        &line[..scheme_start],
        redact_url(&line[scheme_start..end]),
        redact_line(&line[end..])
    )
}

/// Files that configure TLS to Redis: the CA that signed the server's certificate and,
/// for mutual TLS, the client's certificate chain and key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates to trust instead of the system's (`redis.tls_ca_file`).
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (`redis.tls_cert_file`).
    pub cert_file: Option<PathBuf>,
    /// Client private key (`redis.tls_key_file`).
    pub key_file: Option<PathBuf>,
}

/// How many replicas must hold a write before rollboard confirms it (`[redis]`
/// `min_replicas_acked`, `replica_ack_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    /// Replicas per master; `None`: 1 when every master has a replica, else 0 (decided
    /// at the first confirmation).
    pub replicas: Option<u32>,
    /// How long one `WAIT` may block.
    pub timeout: Duration,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            replicas: Some(0),
            timeout: Duration::from_secs(2),
        }
    }
}

/// The bearer tokens of the HTTP roles; a role without one is open. Clones share the
/// tokens, so a re-read (see [`crate::config::tokens`]) is seen by every clone.
#[derive(Debug, Clone)]
pub struct HttpTokens {
    /// Producer: `POST /v1/events` (`http.intake_token_file`, `ROLLBOARD_INTAKE_TOKEN`).
    pub intake: Arc<RoleTokens>,
    /// Reader: `GET /v1/boards...` (`http.query_token_file`, `ROLLBOARD_QUERY_TOKEN`).
    pub query: Arc<RoleTokens>,
    /// Operator: `GET /metrics` (`http.metrics_token_file`, `ROLLBOARD_METRICS_TOKEN`).
    pub metrics: Arc<RoleTokens>,
}

impl HttpTokens {
    /// The three roles, for the re-reader.
    pub fn roles(&self) -> Vec<Arc<RoleTokens>> {
        vec![
            self.intake.clone(),
            self.query.clone(),
            self.metrics.clone(),
        ]
    }
}

/// Stream consumer settings.
#[derive(Debug, Clone)]
pub struct IngestSettings {
    /// Stream the events arrive on (with several partitions, the stem of their keys).
    pub stream: String,
    /// Stream keys the events are spread over (see [`crate::ingest::stream`]).
    pub partitions: usize,
    /// Consumer group name.
    pub group: String,
    /// Consumer name within the group (the host name when configured empty).
    pub consumer: String,
    /// Most entries read per batch.
    pub batch_size: usize,
    /// XREADGROUP block timeout.
    pub block: Duration,
    /// Idle time after which another consumer's pending entries are claimed.
    pub claim_idle: Duration,
    /// Stream malformed events are moved to.
    pub dead_letter_stream: String,
    /// About how many letters the dead-letter stream keeps (`XADD … MAXLEN ~`): the oldest
    /// go first.
    pub dead_letter_max_len: usize,
    /// Acked history kept on the intake streams past what every consumer group still
    /// needs (see [`crate::ingest::stream::trim`]).
    pub retain: Duration,
    /// How far ahead of the clock an event time may be, in ms.
    pub max_future_ms: i64,
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// 6-field cron of the roll job (incremental boards).
    pub roll: String,
    /// 6-field cron of the resummarize job.
    pub resummarize: String,
    /// Fields listed per HSCAN page by the roll and resummarize jobs (script calls are split
    /// into smaller, fixed budgets: see `store::EXPIRE_CALL_FIELDS`).
    pub chunk: usize,
    /// How long a replica's lease on a job's tick lasts without renewal (the holder renews
    /// it every third of this while it runs): how soon another replica takes the job over
    /// when the holder dies.
    pub lease: Duration,
}

/// HTTP settings.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Listen address of the API (loopback unless configured otherwise).
    pub listen: SocketAddr,
    /// Listen address of `/metrics`, `/healthz` and `/readyz` (`http.admin_listen`); when
    /// set, the API's address no longer serves them, so that a network policy can open
    /// one port to the monitoring and the other to the clients.
    pub admin_listen: Option<SocketAddr>,
    /// Whether an intake without a token may listen on an address other than loopback
    /// (`http.allow_anonymous`).
    pub allow_anonymous: bool,
    /// How often the token files are read again (`http.token_reload_interval`).
    pub token_reload_interval: Duration,
    /// How long a client may take to send a request's head (line and headers); also how
    /// long an idle connection is kept.
    pub header_timeout: Duration,
    /// How long one request may take from its head to the answer, body upload included.
    pub request_timeout: Duration,
    /// Most connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Most `POST /v1/events` requests handled at once; further ones answer 503.
    pub max_concurrent_intake: usize,
    /// Bearer tokens per role.
    pub tokens: HttpTokens,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// Text or JSON.
    pub format: LogFormat,
    /// A tracing filter directive, e.g. `info` or `rollboard=debug`.
    pub level: String,
}

impl Settings {
    /// Reads the file at `path` (required), applies `ROLLBOARD__SECTION__KEY` environment
    /// overrides and validates the result.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let text = read_text(path)
            .map_err(|why| ConfigError::Read(format!("{}: {why}", path.display())))?;
        Self::parse(&text).map_err(|e| locate(e, Some(path)))
    }

    /// Parses settings from TOML text (environment overrides included); an error names the
    /// environment variable that set the key at fault, if one did.
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        Self::parse(text).map_err(|e| locate(e, None))
    }

    fn parse(text: &str) -> Result<Settings, ConfigError> {
        let raw: RawSettings = ::config::Config::builder()
            .add_source(::config::File::from_str(text, ::config::FileFormat::Toml))
            .add_source(env_source())
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::Read(read_error(text, &e.to_string())))?;
        raw.validate()
    }

    /// The board called `name`.
    pub fn board(&self, name: &str) -> Option<&Board> {
        self.boards.iter().find(|b| b.name == name)
    }
}

/// Resolves the config path: `--config` wins over `ROLLBOARD_CONFIG`, then the default.
pub fn resolve_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("ROLLBOARD_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// Largest config file read: far above any real one, and it keeps `--config /dev/zero` from
/// filling the memory.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The file as text, refused when it is not UTF-8 (a binary file is never echoed).
fn read_text(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        format!("not a UTF-8 text file (line {line})")
    })
}

/// A reading error of the `config` crate in one line: the TOML parser's excerpt of the
/// file (which may be a whole binary line) is replaced by the start of the line, escaped.
fn read_error(text: &str, message: &str) -> String {
    let is_excerpt = |l: &str| {
        let l = l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
        l.starts_with('|')
    };
    let mut parts: Vec<String> = message
        .lines()
        .filter(|l| !l.trim().is_empty() && !is_excerpt(l))
        .map(|l| l.trim().to_string())
        .collect();
    let line_no = parts.first().and_then(|first| {
        let rest = first.strip_prefix("TOML parse error at line ")?;
        rest.split(',').next()?.parse::<usize>().ok()
    });
    let shown = |line: &str| {
        let line = redact_line(line);
        let line = line.as_str();
        let shown: String = line.chars().take(60).collect();
        let more = if shown.len() < line.len() { "..." } else { "" };
        format!("{shown:?}{more}")
    };
    if let Some(line) = line_no.and_then(|n| text.lines().nth(n.checked_sub(1)?)) {
        parts.insert(1, shown(line));
    } else if message.contains("too large to fit") {
        // The `config` crate reports an integer beyond 64 bits without its place: find it.
        let beyond = text.lines().enumerate().find(|(_, line)| {
            line.split_once('=').is_some_and(|(_, value)| {
                let value = value.trim().replace('_', "");
                let digits = value.trim_start_matches(['-', '+']);
                !digits.is_empty()
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && value.parse::<i64>().is_err()
            })
        });
        if let Some((i, line)) = beyond {
            let key = line.split_once('=').map_or("", |(k, _)| k.trim());
            return format!(
                "line {} ({}): `{key}` is an integer beyond 64 bits",
                i + 1,
                shown(line)
            );
        }
    }
    parts.join(": ")
}

fn env_source() -> ::config::Environment {
    // `prefix_separator("__")` keeps ROLLBOARD_CONFIG (the file path) out of the settings.
    // Values stay strings (a consumer named "007" stays "007"); numeric and boolean keys
    // are converted when the settings are deserialized.
    ::config::Environment::with_prefix("ROLLBOARD")
        .prefix_separator("__")
        .separator("__")
}

/// Longest duration any key accepts: 100 years keeps every time computed from it (such as
/// `now - window`) far inside the ±2^53 ms that scores and replies carry exactly.
const MAX_DURATION_MS: i64 = 36_500 * 86_400_000;

/// Longest `ingest.stream`: the key of an event without `id` read from a partition,
/// `<stream>:{63}/<entry ID>` (an entry ID is at most 41 bytes), must fit in an `id` field
/// ([`crate::domain::event::MAX_ID_BYTES`]) for the dead-letter replay to carry it.
pub const MAX_STREAM_BYTES: usize = crate::domain::event::MAX_ID_BYTES - ":{63}/".len() - 41;

/// Most slices a board's window and `ingest.max_future` may span together: the digest
/// table tags each remembered id with its slice number mod 2^32 and counts it while the
/// tag is less than 2^31 slices above the slice whose ids may be forgotten (`counts` in
/// `fold.lua` and `apply.lua`); a few slices of margin for the rounding of each bound.
pub const MAX_SLICES_REACHED: i64 = (1 << 31) - 4;

/// Most letters `ingest.dead_letter_max_len` may keep: a cap, not a way to switch it off.
pub const MAX_DEAD_LETTERS: i64 = 1_000_000_000;

fn duration(key: &str, text: &str) -> Result<i64, ConfigError> {
    match parse_duration_ms(text) {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        Some(_) => Err(invalid(key, text, "must be at most 36500d")),
        None => Err(invalid(
            key,
            text,
            "not a duration such as 500ms, 30s, 5m, 6h or 7d",
        )),
    }
}

fn seconds_at_least_one(key: &str, text: &str) -> Result<Duration, ConfigError> {
    match duration(key, text)? {
        ms if ms < 1_000 => Err(invalid(key, text, "must be at least 1s")),
        ms => Ok(Duration::from_millis(ms as u64)),
    }
}

fn count(
    key: &str,
    value: i64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<usize, ConfigError> {
    if range.contains(&value) {
        Ok(value as usize)
    } else {
        Err(invalid(
            key,
            value.to_string(),
            format!("must be between {} and {}", range.start(), range.end()),
        ))
    }
}

fn positive_duration(key: &str, text: &str) -> Result<i64, ConfigError> {
    match duration(key, text)? {
        0 => Err(invalid(key, text, "must be longer than zero")),
        ms => Ok(ms),
    }
}

/// The lease of a job tick: at least 1 s (it is renewed every third of it, and a renewal
/// must reach Redis in time), at most an hour (a dead holder blocks the job that long).
fn lease_duration(text: &str) -> Result<Duration, ConfigError> {
    match duration("schedule.lease", text)? {
        ms if !(1_000..=3_600_000).contains(&ms) => {
            Err(invalid("schedule.lease", text, "must be between 1s and 1h"))
        }
        ms => Ok(Duration::from_millis(ms as u64)),
    }
}

/// The roles named in `daemon.roles`: at least one, each known.
fn roles(raw: &RawRoles) -> Result<Roles, ConfigError> {
    let names: Vec<String> = match raw {
        RawRoles::List(names) => names.clone(),
        RawRoles::Text(text) => text
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect(),
    };
    let mut roles = Vec::with_capacity(names.len());
    for name in &names {
        roles.push(Role::parse(name).ok_or_else(|| {
            invalid(
                "daemon.roles",
                name,
                "expected intake, query, consume or jobs",
            )
        })?);
    }
    if roles.is_empty() {
        return Err(invalid(
            "daemon.roles",
            "[]",
            "name at least one of intake, query, consume, jobs",
        ));
    }
    Ok(Roles::of(&roles))
}

fn non_empty(key: &str, text: &str) -> Result<String, ConfigError> {
    if text.is_empty() {
        Err(invalid(key, text, "must not be empty"))
    } else {
        Ok(text.to_string())
    }
}

/// The cron grammar accepted: in each field, a comma-separated list of numbers, three-letter
/// month or day names and `*`, as ranges (`a-b`) and steps (`/n`). The scheduler's extensions
/// (`L`, `W`, `#`, `?`, a `+` for day-of-month AND day-of-week) are refused: with them, as
/// with an empty list item, an expression may parse yet never fire, and the scheduler then
/// searches for its next time for seconds to minutes before the daemon could start.
fn plain_cron(expr: &str) -> Result<(), String> {
    for field in expr.split_whitespace() {
        for item in field.split(',') {
            if item.is_empty() {
                return Err(format!("field {field:?} has an empty list item"));
            }
            for part in item.split(['-', '/']) {
                let number = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
                let name = part.len() == 3 && part.bytes().all(|b| b.is_ascii_alphabetic());
                if !(part == "*" || number || name) {
                    return Err(format!(
                        "{part:?} in field {field:?}: only numbers, three-letter names, *, \
                         ranges a-b, steps /n and lists a,b are accepted"
                    ));
                }
            }
        }
    }
    Ok(())
}

fn check_cron(key: &str, expr: &str) -> Result<String, ConfigError> {
    if expr.split_whitespace().count() != 6 {
        return Err(invalid(
            key,
            expr,
            "expected a 6-field cron expression, seconds first",
        ));
    }
    plain_cron(expr).map_err(|why| invalid(key, expr, why))?;
    tokio_cron_scheduler::Job::new_async(expr, |_, _| Box::pin(async {}))
        .map(|_| expr.to_string())
        .map_err(|e| invalid(key, expr, format!("not a valid cron expression: {e}")))
}

/// The TLS files of `[redis]`, each checked by loading it (a refusal names the key).
fn tls_files(raw: &RawRedis, url: &str) -> Result<Option<TlsFiles>, ConfigError> {
    let path = |text: &str| (!text.is_empty()).then(|| PathBuf::from(text));
    let files = TlsFiles {
        ca_file: path(&raw.tls_ca_file),
        cert_file: path(&raw.tls_cert_file),
        key_file: path(&raw.tls_key_file),
    };
    let given = [
        ("redis.tls_ca_file", &raw.tls_ca_file),
        ("redis.tls_cert_file", &raw.tls_cert_file),
        ("redis.tls_key_file", &raw.tls_key_file),
    ];
    let Some((first, value)) = given.iter().find(|(_, v)| !v.is_empty()) else {
        return Ok(None);
    };
    if !url.starts_with("rediss") {
        return Err(invalid(
            *first,
            value.as_str(),
            "TLS files need a rediss:// (or rediss-cluster://) redis.url",
        ));
    }
    match (&files.cert_file, &files.key_file) {
        (Some(_), None) => {
            return Err(invalid(
                "redis.tls_key_file",
                "",
                "must be set with redis.tls_cert_file (the client certificate's key)",
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                "redis.tls_cert_file",
                "",
                "must be set with redis.tls_key_file (the key's certificate)",
            ))
        }
        _ => {}
    }
    tls::tls_client_config(&files)
        .map_err(|e| invalid(e.key, e.path.display().to_string(), e.reason))?;
    Ok(Some(files))
}

/// A role's tokens: the environment variable `env` wins over the file named by `key`.
/// Either may hold two tokens, one per line (a rotation in progress).
fn token(key: &'static str, file: &str, env: &str) -> Result<Arc<RoleTokens>, ConfigError> {
    if let Some(value) = std::env::var_os(env) {
        let text = value
            .into_string()
            .map_err(|_| invalid(key, env, format!("{env} is not UTF-8")))?;
        let tokens = crate::config::tokens::parse(&text).map_err(|e| match e {
            crate::config::tokens::TokenError::Empty => {
                invalid(key, env, format!("{env} is set but empty"))
            }
            e => invalid(key, env, format!("{env}: {e}")),
        })?;
        return Ok(Arc::new(RoleTokens::new(
            key,
            Source::Env(env.into()),
            tokens,
        )));
    }
    if file.is_empty() {
        return Ok(Arc::new(RoleTokens::open(key)));
    }
    let path = PathBuf::from(file);
    let tokens =
        crate::config::tokens::read_file(&path).map_err(|e| invalid(key, file, e.to_string()))?;
    Ok(Arc::new(RoleTokens::new(key, Source::File(path), tokens)))
}

impl Settings {
    /// Refuses an intake open to anyone on an address other than loopback: a daemon
    /// listening on the pod's or the host's address without `http.intake_token_file` would
    /// take events from whoever reaches the port, unless the operator says so. Checked by
    /// `rollboard run` once its roles are known (a process without `intake` serves no
    /// intake), before it reaches Redis or opens a port.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        check_exposure(&self.http, self.roles)
    }
}

fn check_exposure(http: &HttpSettings, roles: Roles) -> Result<(), ConfigError> {
    if !roles.has(Role::Intake)
        || http.listen.ip().is_loopback()
        || !http.tokens.intake.is_open()
        || http.allow_anonymous
    {
        return Ok(());
    }
    Err(invalid(
        "http.listen",
        http.listen.to_string(),
        "not a loopback address, and the intake has no token: set http.intake_token_file \
         (or ROLLBOARD_INTAKE_TOKEN), listen on 127.0.0.1, or set http.allow_anonymous = true \
         to accept events from anyone who reaches the port",
    ))
}

impl RawSettings {
    fn validate(self) -> Result<Settings, ConfigError> {
        let url = self.redis.url.clone();
        if ![
            "redis://",
            "rediss://",
            "redis-cluster://",
            "rediss-cluster://",
        ]
        .iter()
        .any(|scheme| url.starts_with(scheme))
        {
            return Err(invalid(
                "redis.url",
                redact_url(&url),
                "expected a redis://, rediss:// or redis-cluster:// URL",
            ));
        }
        fred::prelude::Config::from_url(&url)
            .map_err(|e| invalid("redis.url", redact_url(&url), e.details().to_string()))?;
        let tls = tls_files(&self.redis, &url)?;
        let key_prefix = non_empty("redis.key_prefix", &self.redis.key_prefix)?;
        if key_prefix.contains(['{', '}']) {
            return Err(invalid(
                "redis.key_prefix",
                &key_prefix,
                "must not contain { or } (they delimit hash tags)",
            ));
        }
        let replicas = match self.redis.min_replicas_acked {
            None => None,
            Some(n @ 0..=16) => Some(n as u32),
            Some(n) => {
                return Err(invalid(
                    "redis.min_replicas_acked",
                    n.to_string(),
                    "must be between 0 (off) and 16",
                ))
            }
        };
        let timeout_text = &self.redis.replica_ack_timeout;
        let timeout_ms = duration("redis.replica_ack_timeout", timeout_text)?;
        if !(10..=4_000).contains(&timeout_ms) {
            return Err(invalid(
                "redis.replica_ack_timeout",
                timeout_text,
                "must be between 10ms and 4s (an intake request waits at most 5s for redis)",
            ));
        }
        let durability = Durability {
            replicas,
            timeout: Duration::from_millis(timeout_ms as u64),
        };
        let calls_in_flight = self.redis.max_calls_in_flight;
        if !(1..=1024).contains(&calls_in_flight) {
            return Err(invalid(
                "redis.max_calls_in_flight",
                calls_in_flight.to_string(),
                "must be between 1 and 1024",
            ));
        }

        let ingest = self.ingest;
        let dedup = match ingest.dedup_window.as_str() {
            "window" => Dedup::Window,
            other => Dedup::AfterSlice(duration("ingest.dedup_window", other)?),
        };
        if !(1..=10_000).contains(&ingest.batch_size) {
            return Err(invalid(
                "ingest.batch_size",
                ingest.batch_size.to_string(),
                "must be between 1 and 10000",
            ));
        }
        let max_partitions = crate::domain::partition::MAX_PARTITIONS;
        if !(1..=max_partitions as i64).contains(&ingest.partitions) {
            return Err(invalid(
                "ingest.partitions",
                ingest.partitions.to_string(),
                format!("must be between 1 and {max_partitions}"),
            ));
        }
        if ingest.stream.len() > MAX_STREAM_BYTES {
            return Err(invalid(
                "ingest.stream",
                &ingest.stream,
                format!(
                    "is {} bytes long, at most {MAX_STREAM_BYTES} are allowed (an event without \
                     `id` read from a partition is keyed by the partition's key and its entry \
                     ID, and the key must fit in an `id` field to be replayed)",
                    ingest.stream.len()
                ),
            ));
        }
        if ingest.partitions > 1 && ingest.stream.contains(['{', '}']) {
            return Err(invalid(
                "ingest.stream",
                &ingest.stream,
                "must not contain { or } when ingest.partitions is above 1 (each partition key gets its own hash tag)",
            ));
        }
        let consumer = if ingest.consumer.is_empty() {
            hostname::get()
                .ok()
                .and_then(|h| h.into_string().ok())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "rollboard".into())
        } else {
            ingest.consumer
        };
        let ingest_settings = IngestSettings {
            stream: non_empty("ingest.stream", &ingest.stream)?,
            partitions: ingest.partitions as usize,
            group: non_empty("ingest.group", &ingest.group)?,
            consumer,
            batch_size: ingest.batch_size as usize,
            block: Duration::from_millis(positive_duration("ingest.block", &ingest.block)? as u64),
            claim_idle: Duration::from_millis(positive_duration(
                "ingest.claim_idle",
                &ingest.claim_idle,
            )? as u64),
            dead_letter_stream: non_empty("ingest.dead_letter_stream", &ingest.dead_letter_stream)?,
            dead_letter_max_len: count(
                "ingest.dead_letter_max_len",
                ingest.dead_letter_max_len,
                1..=MAX_DEAD_LETTERS,
            )?,
            retain: Duration::from_millis(duration("ingest.retain", &ingest.retain)? as u64),
            max_future_ms: duration("ingest.max_future", &ingest.max_future)?,
        };
        // Every key any partition layout reads as events: the daemon drains the other
        // layouts' keys too (entries left by a change of `ingest.partitions`), so dead
        // letters written to one of them would be applied again.
        let mut stream_keys = crate::domain::partition::partition_keys(
            &ingest_settings.stream,
            crate::domain::partition::MAX_PARTITIONS,
        );
        stream_keys.push(ingest_settings.stream.clone());
        if stream_keys.contains(&ingest_settings.dead_letter_stream) {
            return Err(invalid(
                "ingest.dead_letter_stream",
                &ingest_settings.dead_letter_stream,
                "must differ from ingest.stream and the keys of its partitions (in any layout)",
            ));
        }

        if !(1..=5_000).contains(&self.schedule.chunk) {
            return Err(invalid(
                "schedule.chunk",
                self.schedule.chunk.to_string(),
                "must be between 1 and 5000",
            ));
        }
        let schedule = ScheduleSettings {
            roll: check_cron("schedule.roll", &self.schedule.roll)?,
            resummarize: check_cron("schedule.resummarize", &self.schedule.resummarize)?,
            chunk: self.schedule.chunk as usize,
            lease: lease_duration(&self.schedule.lease)?,
        };

        let listen = self.http.listen.parse().map_err(|e| {
            invalid(
                "http.listen",
                &self.http.listen,
                format!("not a socket address: {e}"),
            )
        })?;
        let admin_listen = match self.http.admin_listen.as_str() {
            "" => None,
            text => {
                let admin: SocketAddr = text.parse().map_err(|e| {
                    invalid(
                        "http.admin_listen",
                        text,
                        format!("not a socket address: {e}"),
                    )
                })?;
                if admin == listen {
                    return Err(invalid(
                        "http.admin_listen",
                        text,
                        "must differ from http.listen (leave it empty to serve everything there)",
                    ));
                }
                Some(admin)
            }
        };
        let http = HttpSettings {
            listen,
            admin_listen,
            allow_anonymous: self.http.allow_anonymous,
            token_reload_interval: seconds_at_least_one(
                "http.token_reload_interval",
                &self.http.token_reload_interval,
            )?,
            header_timeout: seconds_at_least_one("http.header_timeout", &self.http.header_timeout)?,
            request_timeout: seconds_at_least_one(
                "http.request_timeout",
                &self.http.request_timeout,
            )?,
            max_connections: count(
                "http.max_connections",
                self.http.max_connections,
                1..=65_536,
            )?,
            max_concurrent_intake: count(
                "http.max_concurrent_intake",
                self.http.max_concurrent_intake,
                1..=1_024,
            )?,
            tokens: HttpTokens {
                intake: token(
                    "http.intake_token_file",
                    &self.http.intake_token_file,
                    "ROLLBOARD_INTAKE_TOKEN",
                )?,
                query: token(
                    "http.query_token_file",
                    &self.http.query_token_file,
                    "ROLLBOARD_QUERY_TOKEN",
                )?,
                metrics: token(
                    "http.metrics_token_file",
                    &self.http.metrics_token_file,
                    "ROLLBOARD_METRICS_TOKEN",
                )?,
            },
        };

        let format = match self.log.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(invalid("log.format", other, "expected text or json")),
        };
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid(
                "log.level",
                &self.log.level,
                "not a log level or filter directive",
            ));
        }

        let roles = roles(&self.daemon.roles)?;

        let mut names = HashSet::new();
        let mut boards = Vec::with_capacity(self.boards.len());
        for (i, raw) in self.boards.into_iter().enumerate() {
            let board = raw.validate(i, dedup)?;
            // The digest table tags each remembered id with its slice number mod 2^32 and
            // keeps it while the tag is less than 2^31 slices above the forget point: the
            // window's slices plus those an event ahead of the clock can land in must fit.
            let reach = board.slices_in_window() + ingest_settings.max_future_ms / board.slice_ms;
            if reach > MAX_SLICES_REACHED {
                return Err(invalid(
                    format!("boards[{i}].slice"),
                    format!("{}ms", board.slice_ms),
                    format!(
                        "too narrow: the window and ingest.max_future span {reach} slices, at \
                         most {MAX_SLICES_REACHED} are allowed"
                    ),
                ));
            }
            if !names.insert(board.name.clone()) {
                return Err(invalid(
                    format!("boards[{i}].name"),
                    &board.name,
                    "duplicate board name",
                ));
            }
            boards.push(board);
        }

        Ok(Settings {
            roles,
            redis: RedisSettings {
                url,
                key_prefix,
                tls,
                durability,
                calls_in_flight: calls_in_flight as usize,
                max_clock_skew_ms: duration("redis.max_clock_skew", &self.redis.max_clock_skew)?,
            },
            ingest: ingest_settings,
            schedule,
            http,
            log: LogSettings {
                format,
                level: self.log.level,
            },
            boards,
        })
    }
}

impl RawBoard {
    fn validate(self, i: usize, dedup: Dedup) -> Result<Board, ConfigError> {
        let key = |k: &str| format!("boards[{i}].{k}");
        if !crate::domain::board::is_board_name(&self.name) {
            return Err(invalid(
                key("name"),
                &self.name,
                "must match [a-z0-9_-]{1,64}",
            ));
        }
        let member = non_empty(&key("member"), &self.member)?;
        let amount = non_empty(&key("amount"), &self.amount)?;
        let scope = match self.scope {
            Some(s) => Some(non_empty(&key("scope"), &s)?),
            None => None,
        };
        if scope.as_deref() == Some(member.as_str())
            || member == amount
            || scope.as_deref() == Some(amount.as_str())
        {
            return Err(invalid(
                key("member"),
                &member,
                "member, scope and amount must be different fields",
            ));
        }
        if !(0..=15).contains(&self.scale) {
            return Err(invalid(
                key("scale"),
                self.scale.to_string(),
                "must be between 0 and 15",
            ));
        }
        let window_ms = positive_duration(&key("window"), &self.window)?;
        let slice_ms = positive_duration(&key("slice"), &self.slice)?;
        if window_ms % slice_ms != 0 {
            return Err(invalid(
                key("window"),
                &self.window,
                format!("must be a whole multiple of the slice ({})", self.slice),
            ));
        }
        let mode = match self.mode.as_str() {
            "incremental" => Mode::Incremental,
            "resummarize" => Mode::Resummarize,
            other => {
                return Err(invalid(
                    key("mode"),
                    other,
                    "expected incremental or resummarize",
                ))
            }
        };
        let tie_break = match self.tie_break.as_str() {
            "earliest" => TieBreak::Earliest,
            "latest" => TieBreak::Latest,
            "none" => TieBreak::None,
            other => {
                return Err(invalid(
                    key("tie_break"),
                    other,
                    "expected earliest, latest or none",
                ))
            }
        };
        Ok(Board {
            name: self.name,
            member,
            scope,
            amount,
            scale: self.scale as u32,
            window_ms,
            slice_ms,
            mode,
            tie_break,
            allow_negative: self.allow_negative,
            dedup,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOARD: &str =
        "[[boards]]\nname = \"r\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n";

    fn refusal(text: &str) -> String {
        match Settings::from_toml(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn retain_may_be_zero_and_the_dead_letter_cap_may_not() {
        let s = Settings::from_toml(&format!(
            "[ingest]\nretain = \"0s\"\ndead_letter_max_len = 10\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.ingest.retain, Duration::ZERO);
        assert_eq!(s.ingest.dead_letter_max_len, 10);
        let e = refusal(&format!("[ingest]\ndead_letter_max_len = 0\n{BOARD}"));
        assert!(e.contains("ingest.dead_letter_max_len"), "{e}");
        let e = refusal(&format!("[ingest]\nretain = \"soon\"\n{BOARD}"));
        assert!(e.contains("ingest.retain"), "{e}");
    }

    #[test]
    fn defaults_fill_everything() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(s.redis.key_prefix, "rb");
        assert_eq!(s.ingest.stream, "rb:events");
        assert_eq!(s.ingest.partitions, 1);
        assert_eq!(s.ingest.batch_size, 500);
        assert_eq!(s.ingest.block, Duration::from_secs(1));
        assert_eq!(s.ingest.claim_idle, Duration::from_secs(30));
        assert_eq!(s.ingest.max_future_ms, 300_000);
        assert_eq!(s.ingest.retain, Duration::from_secs(60));
        assert_eq!(s.ingest.dead_letter_max_len, 100_000);
        assert_eq!(s.schedule.chunk, 250);
        assert_eq!(s.http.listen.to_string(), "127.0.0.1:9464");
        let b = &s.boards[0];
        assert_eq!(b.amount, "amount");
        assert_eq!(b.scale, 0);
        assert_eq!(b.mode, Mode::Incremental);
        assert_eq!(b.tie_break, TieBreak::Earliest);
        assert!(!b.allow_negative);
        assert_eq!(b.slices_in_window(), 28);
        assert_eq!(b.dedup, Dedup::Window);
    }

    #[test]
    fn roles_default_to_all_and_are_checked() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.roles, Roles::ALL);
        assert_eq!(s.schedule.lease, Duration::from_secs(30));
        let s = Settings::from_toml(&format!(
            "[daemon]\nroles = [\"query\", \"intake\"]\n[schedule]\nlease = \"5s\"\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.roles.to_string(), "intake,query");
        assert_eq!(s.schedule.lease, Duration::from_secs(5));
        let s = Settings::from_toml(&format!("[daemon]\nroles = \"consume, jobs\"\n{BOARD}"))
            .expect("valid");
        assert_eq!(s.roles.to_string(), "consume,jobs");
        let e = refusal(&format!(
            "[daemon]\nroles = [\"intake\", \"write\"]\n{BOARD}"
        ));
        assert!(e.contains("daemon.roles") && e.contains("write"), "{e}");
        let e = refusal(&format!("[daemon]\nroles = []\n{BOARD}"));
        assert!(e.contains("daemon.roles"), "{e}");
        let e = refusal(&format!("[schedule]\nlease = \"500ms\"\n{BOARD}"));
        assert!(e.contains("schedule.lease"), "{e}");
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/rollboard.toml"
        ))
        .expect("config/rollboard.toml");
        let s = Settings::from_toml(&text).expect("valid");
        assert_eq!(s.boards.len(), 3);
        assert!(s.board("fans_7d").expect("fans_7d").is_scoped());
    }

    #[test]
    fn environment_overrides_keep_strings_as_written() {
        std::env::set_var("ROLLBOARD__INGEST__CONSUMER", "007");
        let s = Settings::from_toml(BOARD);
        std::env::remove_var("ROLLBOARD__INGEST__CONSUMER");
        assert_eq!(s.expect("valid").ingest.consumer, "007");
    }

    #[test]
    fn refusals_name_key_and_value() {
        let e = refusal(&format!("{BOARD}bogus = 1\n"));
        assert!(e.contains("bogus"), "{e}");
        let e = refusal(&BOARD.replace("7d", "7h5m"));
        assert!(e.contains("boards[0].window") && e.contains("7h5m"), "{e}");
        let e = refusal(&BOARD.replace("\"7d\"", "\"25h\""));
        assert!(
            e.contains("boards[0].window") && e.contains("whole multiple"),
            "{e}"
        );
        let e = refusal(&BOARD.replace("\"r\"", "\"Rooms!\""));
        assert!(e.contains("boards[0].name") && e.contains("Rooms!"), "{e}");
        let e = refusal(&format!("{BOARD}{BOARD}"));
        assert!(
            e.contains("boards[1].name") && e.contains("duplicate"),
            "{e}"
        );
        let e = refusal(&format!("[redis]\nurl = \"http://x\"\n{BOARD}"));
        assert!(e.contains("redis.url") && e.contains("http://x"), "{e}");
        let e = refusal(&format!("[ingest]\npartitions = 0\n{BOARD}"));
        assert!(
            e.contains("ingest.partitions") && e.contains("between 1 and 64"),
            "{e}"
        );
        let e = refusal(&format!("[ingest]\npartitions = 65\n{BOARD}"));
        assert!(e.contains("ingest.partitions") && e.contains("65"), "{e}");
        let e = refusal(&format!(
            "[ingest]\npartitions = 2\nstream = \"{{rb}}:events\"\n{BOARD}"
        ));
        assert!(e.contains("ingest.stream") && e.contains("hash tag"), "{e}");
        let e = refusal(&format!(
            "[ingest]\npartitions = 2\ndead_letter_stream = \"rb:events:{{1}}\"\n{BOARD}"
        ));
        assert!(e.contains("ingest.dead_letter_stream"), "{e}");
        let e = refusal(&format!("[ingest]\nblock = \"soon\"\n{BOARD}"));
        assert!(e.contains("ingest.block") && e.contains("soon"), "{e}");
        let e = refusal(&format!("[schedule]\nroll = \"* * * * *\"\n{BOARD}"));
        assert!(e.contains("schedule.roll"), "{e}");
        let e = refusal(&format!("{BOARD}mode = \"fast\"\n"));
        assert!(e.contains("boards[0].mode") && e.contains("fast"), "{e}");
        let e = refusal(&format!("[redis]\nunknown_key = 1\n{BOARD}"));
        assert!(e.contains("unknown_key"), "{e}");
    }

    #[test]
    fn calls_in_flight_default_to_four_and_are_bounded() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.redis.calls_in_flight, 4);
        let s = Settings::from_toml(&format!("[redis]\nmax_calls_in_flight = 1\n{BOARD}"))
            .expect("valid");
        assert_eq!(s.redis.calls_in_flight, 1);
        for bad in ["0", "-3", "1025"] {
            let e = refusal(&format!("[redis]\nmax_calls_in_flight = {bad}\n{BOARD}"));
            assert!(
                e.contains("redis.max_calls_in_flight") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn replica_acks_default_to_the_topology_and_are_bounded() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.redis.durability.replicas, None);
        assert_eq!(s.redis.durability.timeout, Duration::from_secs(2));
        let s = Settings::from_toml(&format!(
            "[redis]\nmin_replicas_acked = 0\nreplica_ack_timeout = \"250ms\"\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.redis.durability.replicas, Some(0));
        assert_eq!(s.redis.durability.timeout, Duration::from_millis(250));
        for bad in ["-1", "17"] {
            let e = refusal(&format!("[redis]\nmin_replicas_acked = {bad}\n{BOARD}"));
            assert!(
                e.contains("redis.min_replicas_acked") && e.contains(bad),
                "{e}"
            );
        }
        for bad in ["5s", "1ms", "soon"] {
            let e = refusal(&format!(
                "[redis]\nreplica_ack_timeout = \"{bad}\"\n{BOARD}"
            ));
            assert!(
                e.contains("redis.replica_ack_timeout") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn absurd_sizes_are_refused_naming_the_key() {
        let e = refusal(&BOARD.replace("\"7d\"", "\"10000000000d\""));
        assert!(
            e.contains("boards[0].window") && e.contains("36500d"),
            "{e}"
        );
        let e = refusal(&format!("[ingest]\nbatch_size = 10001\n{BOARD}"));
        assert!(e.contains("ingest.batch_size"), "{e}");
        let e = refusal(&format!(
            "[ingest]\nbatch_size = 99999999999999999999\n{BOARD}"
        ));
        assert!(e.contains("line 2") && e.contains("batch_size"), "{e}");
        let e = refusal(&format!("[http]\nheader_timeout = \"10ms\"\n{BOARD}"));
        assert!(
            e.contains("http.header_timeout") && e.contains("10ms"),
            "{e}"
        );
        let e = refusal(&format!("[http]\nmax_connections = 0\n{BOARD}"));
        assert!(e.contains("http.max_connections"), "{e}");
        let e = refusal(&format!("[http]\nmax_concurrent_intake = -1\n{BOARD}"));
        assert!(e.contains("http.max_concurrent_intake"), "{e}");
        let e = refusal(&format!("[http]\nrequest_timeout = \"soon\"\n{BOARD}"));
        assert!(e.contains("http.request_timeout"), "{e}");
    }

    #[test]
    fn http_limits_have_defaults() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.http.header_timeout, Duration::from_secs(10));
        assert_eq!(s.http.request_timeout, Duration::from_secs(30));
        assert_eq!(s.http.max_connections, 1024);
        assert_eq!(s.http.max_concurrent_intake, 4);
    }

    #[test]
    fn hosts_are_named_without_credentials() {
        assert_eq!(redis_host("redis://u:pw@10.0.0.5:6380/0"), "10.0.0.5:6380");
        assert_eq!(
            redis_host("rediss://:p@ss@cache.internal"),
            "cache.internal:6379"
        );
        assert_eq!(redis_host("redis://[::1]:7000"), "[::1]:7000");
        assert_eq!(redis_host("redis://[::1]"), "[::1]:6379");
        assert_eq!(
            redis_host("redis-cluster://pw@a:7000,b:7001"),
            "a:7000,b:7001"
        );
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("redis://rollboard:pw@127.0.0.1:6379/0"),
            "redis://rollboard:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact_url("rediss://:p@ss@h:1"), "rediss://:***@h:1");
        assert_eq!(redact_url("redis://pw@h"), "redis://***@h");
        assert_eq!(redact_url("redis://h:1?x=a@b"), "redis://h:1?x=a@b");
        let s = Settings::from_toml(&format!(
            "[redis]\nurl = \"redis://u:hunter2@127.0.0.1:6379\"\n{BOARDS}",
            BOARDS = BOARD
        ))
        .expect("valid");
        assert!(!format!("{s:?}").contains("hunter2"));
        let e = refusal(&format!("[redis]\nurl = \"http://u:hunter2@x\"\n{BOARD}"));
        assert!(!e.contains("hunter2") && e.contains("redis.url"), "{e}");
    }

    #[test]
    fn a_syntax_error_on_the_url_line_does_not_show_the_password() {
        let e = refusal(&format!("[redis]\nurl = \"redis://u:hunter2@h:1\n{BOARD}"));
        assert!(!e.contains("hunter2") && e.contains("u:***@h:1"), "{e}");
        assert_eq!(
            redact_line("a = \"redis://u:p@h\" b = 'rediss://:q@g/0'"),
            "a = \"redis://u:***@h\" b = 'rediss://:***@g/0'"
        );
    }

    #[test]
    fn cron_expressions_that_never_fire_are_refused_at_once() {
        // Each of these made loading take from seconds to minutes (found by the config fuzz
        // target): the scheduler searched for a next time that never comes.
        for expr in [
            "0 * * * * +",
            "0 , * * * *",
            ", * * * * *",
            "0 * * , * *",
            "0 * * * * L",
        ] {
            let e = refusal(&format!("[schedule]\nroll = \"{expr}\"\n{BOARD}"));
            assert!(e.contains("schedule.roll"), "{expr}: {e}");
        }
        for expr in [
            "0 * * * * *",
            "*/15 0-59 * * JAN-DEC MON,TUE",
            "30 5 1 1,15 * *",
        ] {
            assert_eq!(plain_cron(expr), Ok(()), "{expr}");
        }
    }

    #[test]
    fn a_syntax_error_on_a_url_line_after_a_multibyte_character_is_reported() {
        // The scheme's start was found one byte after the last non-scheme character, which
        // panicked inside a multi-byte one (found by the config fuzz target).
        assert_eq!(redact_line("«redis://u:p@h»"), "«redis://u:***@h»");
        assert_eq!(redact_line("é://u:p@h"), "é://u:***@h");
        let e = refusal(&format!("[redis]\nurl = «redis://u:hunter2@h:1»\n{BOARD}"));
        assert!(!e.contains("hunter2") && e.contains("u:***@h:1"), "{e}");
    }

    #[test]
    fn tokens_come_from_files_or_the_environment_and_never_show() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("reader.token");
        std::fs::write(&file, "  t0ken-from-file\n").expect("write");
        let text = format!("[http]\nquery_token_file = \"{}\"\n{BOARD}", file.display());
        std::env::set_var("ROLLBOARD_METRICS_TOKEN", "t0ken-from-env");
        let s = Settings::from_toml(&text);
        std::env::remove_var("ROLLBOARD_METRICS_TOKEN");
        let s = s.expect("valid");
        let tokens = &s.http.tokens;
        assert!(tokens.query.accepts(b"t0ken-from-file"));
        assert!(!tokens.query.accepts(b"t0ken-from-fil"));
        assert!(tokens.metrics.accepts(b"t0ken-from-env"));
        assert!(tokens.intake.is_open());
        let shown = format!("{s:?}");
        assert!(!shown.contains("t0ken"), "{shown}");

        std::fs::write(&file, "\n").expect("write");
        let e = refusal(&text);
        assert!(
            e.contains("http.query_token_file") && e.contains("empty"),
            "{e}"
        );
        let e = refusal(&format!(
            "[http]\nintake_token_file = \"/nonexistent/token\"\n{BOARD}"
        ));
        assert!(e.contains("http.intake_token_file"), "{e}");
    }

    #[test]
    fn an_anonymous_intake_listens_on_loopback_unless_allowed() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert!(s.http.listen.ip().is_loopback());
        assert_eq!(s.http.admin_listen, None);
        assert_eq!(s.http.token_reload_interval, Duration::from_secs(5));
        let exposure = |text: &str| Settings::from_toml(text).expect("valid").check_exposure();
        for listen in ["0.0.0.0:9464", "[::]:9464", "10.1.2.3:80"] {
            let e = exposure(&format!("[http]\nlisten = \"{listen}\"\n{BOARD}"))
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains("http.listen") && e.contains("http.allow_anonymous"),
                "{e}"
            );
            exposure(&format!(
                "[http]\nlisten = \"{listen}\"\nallow_anonymous = true\n{BOARD}"
            ))
            .expect("allowed");
            // A process that serves no intake exposes none.
            exposure(&format!(
                "[daemon]\nroles = \"query,consume,jobs\"\n[http]\nlisten = \"{listen}\"\n{BOARD}"
            ))
            .expect("no intake");
        }
        exposure(&format!("[http]\nlisten = \"[::1]:9464\"\n{BOARD}")).expect("loopback");
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("intake.token");
        std::fs::write(&file, "old\nnew\n").expect("write");
        let s = Settings::from_toml(&format!(
            "[http]\nlisten = \"0.0.0.0:9464\"\nadmin_listen = \"0.0.0.0:9465\"\n\
             intake_token_file = \"{}\"\n{BOARD}",
            file.display()
        ))
        .expect("a token guards the intake");
        assert_eq!(s.http.admin_listen.map(|a| a.port()), Some(9465));
        assert!(s.http.tokens.intake.accepts(b"old") && s.http.tokens.intake.accepts(b"new"));
        let e = refusal(&format!(
            "[http]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:1\"\n{BOARD}"
        ));
        assert!(e.contains("http.admin_listen"), "{e}");
        let e = refusal(&format!("[http]\nadmin_listen = \"nowhere\"\n{BOARD}"));
        assert!(
            e.contains("http.admin_listen") && e.contains("nowhere"),
            "{e}"
        );
        std::fs::write(&file, "a\nb\nc\n").expect("write");
        let e = refusal(&format!(
            "[http]\nintake_token_file = \"{}\"\n{BOARD}",
            file.display()
        ));
        assert!(
            e.contains("http.intake_token_file") && e.contains("at most 2"),
            "{e}"
        );
    }

    #[test]
    fn a_binary_file_is_named_not_shown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("binary.toml");
        std::fs::write(&path, [0x00u8, 0xff, 0xfe, 0x41, 0x0a, 0x80]).expect("write");
        let e = Settings::load(&path).expect_err("refused").to_string();
        assert_eq!(e.matches("binary.toml").count(), 1, "{e}");
        assert!(e.contains("not a UTF-8 text file"), "{e}");
        std::fs::write(&path, format!("\u{1}{}\n", "x".repeat(500))).expect("write");
        let e = Settings::load(&path).expect_err("refused").to_string();
        assert_eq!(e.matches("binary.toml").count(), 1, "{e}");
        assert!(
            e.len() < 300 && !e.contains('\n') && e.contains("line 1"),
            "{e}"
        );
    }
}
