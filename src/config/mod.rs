//! Settings: raw serde structs read by the `config` crate (file, then `ROLLBOARD__*`
//! environment overrides), validated into [`Settings`] with real types.
//!
//! Every refusal names the key and the value, so an operator can fix the file without
//! reading code.
//!
//! # Layout
//!
//! One file per section of the file, each with its raw struct (defaults,
//! `deny_unknown_fields`), its validated struct and its validation: [`daemon`],
//! [`redis`] (with [`tls`]), [`ingest`], [`schedule`], [`http`] (with [`tokens`], their
//! re-reading), [`log`] and [`boards`]. [`load`] reads the file and the environment,
//! `error` says what is wrong and where it was set, `values` parses the value kinds the
//! sections share.

pub mod boards;
pub mod daemon;
mod error;
pub mod http;
pub mod ingest;
pub mod load;
pub mod log;
pub mod redis;
pub mod schedule;
pub mod tls;
pub mod tokens;
mod values;

use serde::Deserialize;

pub use crate::config::boards::MAX_SLICES_REACHED;
pub use crate::config::error::ConfigError;
pub use crate::config::http::{HttpSettings, HttpTokens};
pub use crate::config::ingest::{IngestSettings, MAX_STREAM_BYTES};
pub use crate::config::load::{resolve_path, DEFAULT_PATH};
pub use crate::config::log::{LogFormat, LogSettings};
pub use crate::config::redis::{Durability, RedisSettings, ScriptCalls, DEFAULT_CALLS_IN_FLIGHT};
pub use crate::config::schedule::ScheduleSettings;
pub use crate::config::tls::TlsFiles;
pub use crate::config::tokens::Token;
use crate::domain::board::Board;
use crate::domain::roles::Roles;

/// The whole file as written: one raw struct per section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawSettings {
    /// `[daemon]`.
    daemon: daemon::RawDaemon,
    /// `[redis]`.
    redis: redis::RawRedis,
    /// `[ingest]`.
    ingest: ingest::RawIngest,
    /// `[schedule]`.
    schedule: schedule::RawSchedule,
    /// `[http]`.
    http: http::RawHttp,
    /// `[log]`.
    log: log::RawLog,
    /// `[[boards]]`.
    boards: Vec<boards::RawBoard>,
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

impl RawSettings {
    /// Each section validated in turn; the first refusal is returned.
    fn validate(self) -> Result<Settings, ConfigError> {
        let redis = self.redis.validate()?;
        let (ingest, dedup) = self.ingest.validate()?;
        let schedule = self.schedule.validate()?;
        let http = self.http.validate()?;
        let log = self.log.validate()?;
        let roles = self.daemon.validate()?;
        let boards = boards::validate(self.boards, dedup, ingest.max_future_ms)?;
        Ok(Settings {
            roles,
            redis,
            ingest,
            schedule,
            http,
            log,
            boards,
        })
    }
}

impl Settings {
    /// The board called `name`.
    pub fn board(&self, name: &str) -> Option<&Board> {
        self.boards.iter().find(|b| b.name == name)
    }

    /// Refuses an intake open to anyone on an address other than loopback: a daemon
    /// listening on the pod's or the host's address without `http.intake_token_file` would
    /// take events from whoever reaches the port, unless the operator says so. Checked by
    /// `rollboard run` once its roles are known (a process without `intake` serves no
    /// intake), before it reaches Redis or opens a port.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        http::check_exposure(&self.http, self.roles)
    }
}

/// What the unit tests of every section share: a minimal valid board and the refusal of a
/// text.
#[cfg(test)]
mod testing {
    /// One valid board, appended to a section under test.
    pub const BOARD: &str =
        "[[boards]]\nname = \"r\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n";

    /// The error `text` is refused with.
    pub fn refusal(text: &str) -> String {
        match super::Settings::from_toml(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::BOARD;
    use super::Settings;
    use crate::domain::board::{Dedup, Mode, TieBreak};

    #[test]
    fn defaults_fill_everything() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(s.redis.key_prefix, "rb");
        assert_eq!(s.ingest.stream, "rb:events");
        assert_eq!(s.ingest.partitions, 1);
        assert_eq!(s.ingest.batch_size, 10_000);
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
        assert_eq!(b.widest().slices_in_window(), 28);
        assert_eq!(b.dedup, Dedup::Window);
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
}
