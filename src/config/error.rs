//! Why settings could not be loaded, and where the value at fault came from: every refusal
//! names the key and the value and, once the sources are known, the environment variable or
//! the file that set it.

use std::path::Path;

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

/// A refusal of `value` at `key`, its origin still unknown (see [`locate`]).
pub(super) fn invalid(
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
pub(super) fn locate(e: ConfigError, file: Option<&Path>) -> ConfigError {
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
