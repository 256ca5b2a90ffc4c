//! `[http]`: the listen addresses, the limits and timeouts of the server, and the bearer
//! tokens of its roles (read from files or the environment; re-read by
//! [`crate::config::tokens`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::tokens::{self, RoleTokens, Source, TokenError};
use super::values::{count, duration, seconds_at_least_one};
use crate::domain::roles::{Role, Roles};

/// `[http]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawHttp {
    /// `http.listen`: address of the API.
    listen: String,
    /// `http.admin_listen`: address of `/metrics` and the probes (empty: `http.listen`).
    admin_listen: String,
    /// `http.allow_anonymous`: whether an intake without a token may leave loopback.
    allow_anonymous: bool,
    /// `http.header_timeout`: time to send a request's head.
    header_timeout: String,
    /// `http.request_timeout`: time from a request's head to its answer.
    request_timeout: String,
    /// `http.max_connections`: connections served at once.
    max_connections: i64,
    /// `http.max_concurrent_intake`: `POST /v1/events` handled at once.
    max_concurrent_intake: i64,
    /// `http.max_subscribers`: change-feed streams served at once.
    max_subscribers: i64,
    /// `http.changes_heartbeat`: the comment sent on an idle change-feed stream.
    changes_heartbeat: String,
    /// `http.intake_token_file`: tokens of the producers (empty: open).
    intake_token_file: String,
    /// `http.query_token_file`: tokens of the readers (empty: open).
    query_token_file: String,
    /// `http.metrics_token_file`: tokens of the operators (empty: open).
    metrics_token_file: String,
    /// `http.token_reload_interval`: how often the token files are read again.
    token_reload_interval: String,
    /// `http.max_staleness`: how old a query's answer may be when it is given.
    max_staleness: String,
    /// `http.cache_bytes`: the most the answers kept for that may weigh.
    cache_bytes: i64,
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
            max_subscribers: 512,
            changes_heartbeat: "15s".into(),
            intake_token_file: String::new(),
            query_token_file: String::new(),
            metrics_token_file: String::new(),
            token_reload_interval: "5s".into(),
            max_staleness: "1s".into(),
            cache_bytes: DEFAULT_CACHE_BYTES as i64,
        }
    }
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
    /// Most change-feed streams (`GET /v1/boards/{board}/changes`) served at once; further
    /// ones answer 503. Each holds one of `max_connections`.
    pub max_subscribers: usize,
    /// How often an idle change-feed stream gets a comment, so that proxies and clients see
    /// it alive (`http.changes_heartbeat`).
    pub changes_heartbeat: Duration,
    /// Bearer tokens per role.
    pub tokens: HttpTokens,
    /// How old a query's answer may be when it is given (`http.max_staleness`): an answer
    /// read from Redis is given again, without reading Redis, for this long unless this
    /// process changed what it read; also the answers' `Cache-Control: max-age`. Zero:
    /// every query reads Redis.
    pub max_staleness: Duration,
    /// The most the kept answers may weigh, in bytes (`http.cache_bytes`); the least
    /// recently used go first. Zero: none kept.
    pub cache_bytes: u64,
}

/// `http.cache_bytes` by default: 64 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// The longest `http.max_staleness`.
const MAX_STALENESS_MS: i64 = 60_000;

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

impl RawHttp {
    /// The validated `[http]` section (its tokens read).
    pub(super) fn validate(&self) -> Result<HttpSettings, ConfigError> {
        let (listen, admin_listen) = self.addresses()?;
        Ok(HttpSettings {
            listen,
            admin_listen,
            allow_anonymous: self.allow_anonymous,
            token_reload_interval: seconds_at_least_one(
                "http.token_reload_interval",
                &self.token_reload_interval,
            )?,
            header_timeout: seconds_at_least_one("http.header_timeout", &self.header_timeout)?,
            request_timeout: seconds_at_least_one("http.request_timeout", &self.request_timeout)?,
            max_connections: count("http.max_connections", self.max_connections, 1..=65_536)?,
            max_concurrent_intake: count(
                "http.max_concurrent_intake",
                self.max_concurrent_intake,
                1..=1_024,
            )?,
            max_subscribers: count("http.max_subscribers", self.max_subscribers, 1..=100_000)?,
            changes_heartbeat: seconds_at_least_one(
                "http.changes_heartbeat",
                &self.changes_heartbeat,
            )?,
            tokens: self.tokens()?,
            max_staleness: self.max_staleness()?,
            cache_bytes: count("http.cache_bytes", self.cache_bytes, 0..=(1 << 40))? as u64,
        })
    }

    /// `http.max_staleness`: from 0 to [`MAX_STALENESS_MS`].
    fn max_staleness(&self) -> Result<Duration, ConfigError> {
        match duration("http.max_staleness", &self.max_staleness)? {
            ms if ms > MAX_STALENESS_MS => Err(invalid(
                "http.max_staleness",
                &self.max_staleness,
                "must be at most 60s",
            )),
            ms => Ok(Duration::from_millis(ms as u64)),
        }
    }

    /// `http.listen` and `http.admin_listen` (which must differ).
    fn addresses(&self) -> Result<(SocketAddr, Option<SocketAddr>), ConfigError> {
        let address = |key: &str, text: &str| -> Result<SocketAddr, ConfigError> {
            text.parse()
                .map_err(|e| invalid(key, text, format!("not a socket address: {e}")))
        };
        let listen = address("http.listen", &self.listen)?;
        let admin_listen = match self.admin_listen.as_str() {
            "" => None,
            text => {
                let admin = address("http.admin_listen", text)?;
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
        Ok((listen, admin_listen))
    }

    /// The tokens of the three roles.
    fn tokens(&self) -> Result<HttpTokens, ConfigError> {
        Ok(HttpTokens {
            intake: token(
                "http.intake_token_file",
                &self.intake_token_file,
                "ROLLBOARD_INTAKE_TOKEN",
            )?,
            query: token(
                "http.query_token_file",
                &self.query_token_file,
                "ROLLBOARD_QUERY_TOKEN",
            )?,
            metrics: token(
                "http.metrics_token_file",
                &self.metrics_token_file,
                "ROLLBOARD_METRICS_TOKEN",
            )?,
        })
    }
}

/// A role's tokens: the environment variable `env` wins over the file named by `key`.
/// Either may hold two tokens, one per line (a rotation in progress).
fn token(key: &'static str, file: &str, env: &str) -> Result<Arc<RoleTokens>, ConfigError> {
    if let Some(value) = std::env::var_os(env) {
        let text = value
            .into_string()
            .map_err(|_| invalid(key, env, format!("{env} is not UTF-8")))?;
        let tokens = tokens::parse(&text).map_err(|e| match e {
            TokenError::Empty => invalid(key, env, format!("{env} is set but empty")),
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
    let tokens = tokens::read_file(&path).map_err(|e| invalid(key, file, e.to_string()))?;
    Ok(Arc::new(RoleTokens::new(key, Source::File(path), tokens)))
}

/// Refuses an intake open to anyone on an address other than loopback (see
/// [`crate::config::Settings::check_exposure`]).
pub(super) fn check_exposure(http: &HttpSettings, roles: Roles) -> Result<(), ConfigError> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::testing::{refusal, BOARD};
    use crate::config::Settings;

    #[test]
    fn http_limits_have_defaults() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.http.header_timeout, Duration::from_secs(10));
        assert_eq!(s.http.request_timeout, Duration::from_secs(30));
        assert_eq!(s.http.max_connections, 1024);
        assert_eq!(s.http.max_concurrent_intake, 4);
        assert_eq!(s.http.max_subscribers, 512);
        assert_eq!(s.http.changes_heartbeat, Duration::from_secs(15));
        let e = refusal(&format!("[http]\nmax_subscribers = 0\n{BOARD}"));
        assert!(e.contains("http.max_subscribers"), "{e}");
    }

    #[test]
    fn answers_are_kept_a_second_in_64_mib_by_default() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.http.max_staleness, Duration::from_secs(1));
        assert_eq!(s.http.cache_bytes, 64 << 20);
        let s = Settings::from_toml(&format!(
            "[http]\nmax_staleness = \"0s\"\ncache_bytes = 0\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.http.max_staleness, Duration::ZERO);
        assert_eq!(s.http.cache_bytes, 0);
        let e = refusal(&format!("[http]\nmax_staleness = \"2m\"\n{BOARD}"));
        assert!(e.contains("http.max_staleness") && e.contains("60s"), "{e}");
        let e = refusal(&format!("[http]\nmax_staleness = \"soon\"\n{BOARD}"));
        assert!(e.contains("http.max_staleness"), "{e}");
        let e = refusal(&format!("[http]\ncache_bytes = -1\n{BOARD}"));
        assert!(e.contains("http.cache_bytes"), "{e}");
    }

    #[test]
    fn absurd_http_limits_are_refused_naming_the_key() {
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
}
