//! `[log]`: the output format and the tracing filter.

use serde::Deserialize;

use super::error::{invalid, ConfigError};

/// `[log]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawLog {
    /// `log.format`: `text` or `json`.
    format: String,
    /// `log.level`: a tracing filter directive.
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

impl RawLog {
    /// The validated `[log]` section.
    pub(super) fn validate(self) -> Result<LogSettings, ConfigError> {
        let format = match self.format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(invalid("log.format", other, "expected text or json")),
        };
        if tracing_subscriber::EnvFilter::try_new(&self.level).is_err() {
            return Err(invalid(
                "log.level",
                &self.level,
                "not a log level or filter directive",
            ));
        }
        Ok(LogSettings {
            format,
            level: self.level,
        })
    }
}
