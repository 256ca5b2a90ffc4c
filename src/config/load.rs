//! Reading settings: the file (bounded, UTF-8 only), then `ROLLBOARD__*` environment
//! overrides, through the `config` crate; its errors are cut to one line that never shows a
//! password or a binary line.

use std::path::{Path, PathBuf};

use super::error::{locate, ConfigError};
use super::redis::redact_url;
use super::{RawSettings, Settings};

/// Default location of the config file.
pub const DEFAULT_PATH: &str = "config/rollboard.toml";

/// Largest config file read: far above any real one, and it keeps `--config /dev/zero` from
/// filling the memory.
const MAX_FILE_BYTES: u64 = 1 << 20;

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
}

/// Resolves the config path: `--config` wins over `ROLLBOARD_CONFIG`, then the default.
pub fn resolve_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("ROLLBOARD_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

fn env_source() -> ::config::Environment {
    // `prefix_separator("__")` keeps ROLLBOARD_CONFIG (the file path) out of the settings.
    // Values stay strings (a consumer named "007" stays "007"); numeric and boolean keys
    // are converted when the settings are deserialized.
    ::config::Environment::with_prefix("ROLLBOARD")
        .prefix_separator("__")
        .separator("__")
}

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
    if let Some(line) = line_no.and_then(|n| text.lines().nth(n.checked_sub(1)?)) {
        parts.insert(1, shown(line));
    } else if message.contains("too large to fit") {
        if let Some(beyond) = integer_beyond_64_bits(text) {
            return beyond;
        }
    }
    parts.join(": ")
}

/// The start of a line of the file, escaped and without passwords, for an error.
fn shown(line: &str) -> String {
    let line = redact_line(line);
    let line = line.as_str();
    let shown: String = line.chars().take(60).collect();
    let more = if shown.len() < line.len() { "..." } else { "" };
    format!("{shown:?}{more}")
}

/// The `config` crate reports an integer beyond 64 bits without its place: the first line
/// that holds one, as an error.
fn integer_beyond_64_bits(text: &str) -> Option<String> {
    let (i, line) = text.lines().enumerate().find(|(_, line)| {
        line.split_once('=').is_some_and(|(_, value)| {
            let value = value.trim().replace('_', "");
            let digits = value.trim_start_matches(['-', '+']);
            !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && value.parse::<i64>().is_err()
        })
    })?;
    let key = line.split_once('=').map_or("", |(k, _)| k.trim());
    Some(format!(
        "line {} ({}): `{key}` is an integer beyond 64 bits",
        i + 1,
        shown(line)
    ))
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

#[cfg(test)]
mod tests {
    use super::redact_line;
    use crate::config::testing::{refusal, BOARD};
    use crate::config::Settings;

    #[test]
    fn an_integer_beyond_64_bits_is_refused_naming_its_line() {
        let e = refusal(&format!(
            "[ingest]\nbatch_size = 99999999999999999999\n{BOARD}"
        ));
        assert!(e.contains("line 2") && e.contains("batch_size"), "{e}");
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
    fn a_syntax_error_on_a_url_line_after_a_multibyte_character_is_reported() {
        // The scheme's start was found one byte after the last non-scheme character, which
        // panicked inside a multi-byte one (found by the config fuzz target).
        assert_eq!(redact_line("«redis://u:p@h»"), "«redis://u:***@h»");
        assert_eq!(redact_line("é://u:p@h"), "é://u:***@h");
        let e = refusal(&format!("[redis]\nurl = «redis://u:hunter2@h:1»\n{BOARD}"));
        assert!(!e.contains("hunter2") && e.contains("u:***@h:1"), "{e}");
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
