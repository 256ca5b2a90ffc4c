//! `[redis]`: the connection URL, the key prefix, the TLS files, how many replicas confirm a
//! write, and the limits of the work sent to Redis. Also the helpers that keep the URL's
//! password out of logs and errors.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::tls::{self, TlsFiles};
use super::values::{count, duration, non_empty};

/// Full-size writing script calls in Redis at once, by default (`redis.max_calls_in_flight`).
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 4;

/// The URL schemes `redis.url` accepts.
const SCHEMES: [&str; 4] = [
    "redis://",
    "rediss://",
    "redis-cluster://",
    "rediss-cluster://",
];

/// `[redis]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRedis {
    /// `redis.url`: where Redis is.
    url: String,
    /// `redis.key_prefix`: prefix of every key written.
    key_prefix: String,
    /// `redis.tls_ca_file`: CA certificates to trust (empty: the system's).
    tls_ca_file: String,
    /// `redis.tls_cert_file`: client certificate chain (empty: none).
    tls_cert_file: String,
    /// `redis.tls_key_file`: client private key (empty: none).
    tls_key_file: String,
    /// `redis.min_replicas_acked`: replicas that must hold a write (unset: by topology).
    min_replicas_acked: Option<i64>,
    /// `redis.replica_ack_timeout`: how long one `WAIT` may block.
    replica_ack_timeout: String,
    /// `redis.max_calls_in_flight`: full-size writing script calls at once.
    max_calls_in_flight: i64,
    /// `redis.max_clock_skew`: the clock skew reported as one.
    max_clock_skew: String,
    /// `redis.scripts`: how the Lua scripts are loaded and called.
    scripts: String,
    /// `redis.transactions`: whether small instances are judged in the worker.
    transactions: bool,
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
            scripts: "auto".into(),
            transactions: true,
        }
    }
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
    /// How the Lua scripts are loaded and called (`redis.scripts`).
    pub scripts: ScriptCalls,
    /// Whether the small instances of a batch are judged in the worker and written with
    /// `MULTI`/`EXEC` under `WATCH` (`redis.transactions`), rather than judged by
    /// `fold.lua`: the same writes, for a fraction of Redis's work.
    pub transactions: bool,
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

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &self.redacted_url())
            .field("key_prefix", &self.key_prefix)
            .field("tls", &self.tls)
            .field("durability", &self.durability)
            .field("calls_in_flight", &self.calls_in_flight)
            .field("max_clock_skew_ms", &self.max_clock_skew_ms)
            .field("scripts", &self.scripts)
            .field("transactions", &self.transactions)
            .finish()
    }
}

/// How rollboard loads its Lua scripts into Redis and calls them (`redis.scripts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScriptCalls {
    /// Functions where the server and the user allow them, else [`ScriptCalls::Eval`]:
    /// decided once, at the first need, and logged.
    #[default]
    Auto,
    /// One library, loaded with `FUNCTION LOAD`, its functions called with `FCALL`.
    Functions,
    /// Each script loaded with `SCRIPT LOAD` and called with `EVALSHA` (a service that
    /// refuses `FUNCTION` and `FCALL`).
    Eval,
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

impl RawRedis {
    /// The validated `[redis]` section.
    pub(super) fn validate(self) -> Result<RedisSettings, ConfigError> {
        let url = self.url()?;
        let tls = self.tls_files(&url)?;
        let key_prefix = non_empty("redis.key_prefix", &self.key_prefix)?;
        if key_prefix.contains(['{', '}']) {
            return Err(invalid(
                "redis.key_prefix",
                &key_prefix,
                "must not contain { or } (they delimit hash tags)",
            ));
        }
        let durability = self.durability()?;
        let calls_in_flight = count(
            "redis.max_calls_in_flight",
            self.max_calls_in_flight,
            1..=1024,
        )?;
        Ok(RedisSettings {
            url,
            key_prefix,
            tls,
            durability,
            calls_in_flight,
            max_clock_skew_ms: duration("redis.max_clock_skew", &self.max_clock_skew)?,
            scripts: self.scripts()?,
            transactions: self.transactions,
        })
    }

    /// `redis.scripts`: `auto`, `functions` or `eval`.
    fn scripts(&self) -> Result<ScriptCalls, ConfigError> {
        match self.scripts.as_str() {
            "auto" => Ok(ScriptCalls::Auto),
            "functions" => Ok(ScriptCalls::Functions),
            "eval" => Ok(ScriptCalls::Eval),
            other => Err(invalid(
                "redis.scripts",
                other,
                "expected \"auto\", \"functions\" or \"eval\"",
            )),
        }
    }

    /// `redis.url`: one of the known schemes, and a URL the client accepts.
    fn url(&self) -> Result<String, ConfigError> {
        let url = &self.url;
        if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
            return Err(invalid(
                "redis.url",
                redact_url(url),
                "expected a redis://, rediss:// or redis-cluster:// URL",
            ));
        }
        fred::prelude::Config::from_url(url)
            .map_err(|e| invalid("redis.url", redact_url(url), e.details().to_string()))?;
        Ok(url.clone())
    }

    /// `redis.min_replicas_acked` and `redis.replica_ack_timeout`.
    fn durability(&self) -> Result<Durability, ConfigError> {
        let replicas = match self.min_replicas_acked {
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
        let timeout_text = &self.replica_ack_timeout;
        let timeout_ms = duration("redis.replica_ack_timeout", timeout_text)?;
        if !(10..=4_000).contains(&timeout_ms) {
            return Err(invalid(
                "redis.replica_ack_timeout",
                timeout_text,
                "must be between 10ms and 4s (an intake request waits at most 5s for redis)",
            ));
        }
        Ok(Durability {
            replicas,
            timeout: Duration::from_millis(timeout_ms as u64),
        })
    }

    /// The TLS files, each checked by loading it (a refusal names the key).
    fn tls_files(&self, url: &str) -> Result<Option<TlsFiles>, ConfigError> {
        let path = |text: &str| (!text.is_empty()).then(|| PathBuf::from(text));
        let files = TlsFiles {
            ca_file: path(&self.tls_ca_file),
            cert_file: path(&self.tls_cert_file),
            key_file: path(&self.tls_key_file),
        };
        let given = [
            ("redis.tls_ca_file", &self.tls_ca_file),
            ("redis.tls_cert_file", &self.tls_cert_file),
            ("redis.tls_key_file", &self.tls_key_file),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{redact_url, redis_host};
    use crate::config::testing::{refusal, BOARD};
    use crate::config::Settings;

    #[test]
    fn a_url_that_is_not_redis_is_refused_naming_it() {
        let e = refusal(&format!("[redis]\nurl = \"http://x\"\n{BOARD}"));
        assert!(e.contains("redis.url") && e.contains("http://x"), "{e}");
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
}
