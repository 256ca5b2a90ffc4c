//! Bearer tokens of the HTTP roles, and their re-reading without a restart.
//!
//! A role's tokens come from the environment (`ROLLBOARD_INTAKE_TOKEN` ...: read once) or
//! from a file (`http.intake_token_file` ...). A file holds one token per line, at most
//! [`MAX_TOKENS`]: during a rotation it holds the old and the new one, and both are
//! accepted. The file is read again every `http.token_reload_interval` (its content, not its
//! modification time: a Kubernetes Secret mounted as a directory is replaced by a symlink
//! swap, which no watch on the file itself sees) and at once on SIGHUP. A file that becomes
//! empty, unreadable or holds too many lines keeps the tokens read last and logs a warning:
//! a role that had a token is never opened by accident. No token is ever logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Tokens a role accepts at once: the current one and, during a rotation, the next one.
pub const MAX_TOKENS: usize = 2;

/// Largest token file read; a token is a line, far shorter.
const MAX_FILE_BYTES: u64 = 64 << 10;

/// A bearer token an HTTP client must present. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a token (whitespace around it is not part of it).
    pub fn new(text: &str) -> Option<Token> {
        let text = text.trim();
        (!text.is_empty()).then(|| Token(text.to_string()))
    }

    /// Whether `presented` is this token, compared in constant time (only the length,
    /// which is not secret, can show in the time taken).
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(presented).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.matches(other.0.as_bytes())
    }
}

/// Why a token file or variable gave no usable tokens. The messages never quote the content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The file cannot be opened or read.
    #[error("cannot read the token file: {0}")]
    Unreadable(String),
    /// The file is larger than any token file.
    #[error("the token file is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    /// The content is not UTF-8.
    #[error("the tokens are not UTF-8 text")]
    NotText,
    /// Nothing but whitespace.
    #[error("the token file is empty")]
    Empty,
    /// More lines than [`MAX_TOKENS`].
    #[error("{0} tokens, at most {MAX_TOKENS} (one per line: the current and the next)")]
    TooMany(usize),
}

/// The tokens in `text`: one per non-blank line, whitespace around each trimmed.
pub fn parse(text: &str) -> Result<Vec<Token>, TokenError> {
    let tokens: Vec<Token> = text.lines().filter_map(Token::new).collect();
    match tokens.len() {
        0 => Err(TokenError::Empty),
        n if n > MAX_TOKENS => Err(TokenError::TooMany(n)),
        _ => Ok(tokens),
    }
}

/// The tokens in the file at `path` (symlinks followed, as a mounted Secret needs).
pub fn read_file(path: &Path) -> Result<Vec<Token>, TokenError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| TokenError::Unreadable(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TokenError::Unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(TokenError::TooLarge);
    }
    let text = String::from_utf8(bytes).map_err(|_| TokenError::NotText)?;
    parse(&text)
}

/// Where a role's tokens come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No token: the role is open.
    Open,
    /// An environment variable, read once at start.
    Env(String),
    /// A file, read again while the daemon runs.
    File(PathBuf),
}

/// The tokens one role accepts now, shared by the HTTP handlers and the re-reader.
#[derive(Debug)]
pub struct RoleTokens {
    /// The configuration key naming the source, e.g. `http.intake_token_file` (for logs).
    key: &'static str,
    source: Source,
    current: RwLock<Vec<Token>>,
    /// The last failure reported, so that a file that stays broken warns once.
    failing: RwLock<Option<TokenError>>,
}

/// What one re-read did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// Nothing to re-read (an open role or an environment variable).
    Fixed,
    /// The file holds the tokens already in use.
    Unchanged,
    /// The file's tokens replaced the previous ones.
    Changed,
    /// The file gave no usable tokens; the previous ones stay.
    Kept(TokenError),
}

impl RoleTokens {
    /// A role whose tokens come from `source`, holding `tokens` (empty only when open).
    pub fn new(key: &'static str, source: Source, tokens: Vec<Token>) -> RoleTokens {
        RoleTokens {
            key,
            source,
            current: RwLock::new(tokens),
            failing: RwLock::new(None),
        }
    }

    /// A role without a token.
    pub fn open(key: &'static str) -> RoleTokens {
        RoleTokens::new(key, Source::Open, Vec::new())
    }

    /// Whether the role is open (no token configured): it stays open for the process's life,
    /// and a role with a token never becomes open.
    pub fn is_open(&self) -> bool {
        self.source == Source::Open
    }

    /// The role's name, for metric labels: `intake`, `query` or `metrics`.
    pub fn role(&self) -> &'static str {
        self.key
            .trim_start_matches("http.")
            .trim_end_matches("_token_file")
    }

    /// Where the tokens come from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// How many tokens are accepted now.
    pub fn len(&self) -> usize {
        self.current.read().map_or(0, |tokens| tokens.len())
    }

    /// Whether no token is accepted (only an open role).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `presented` is one of the tokens accepted now. Every token is compared, so
    /// the time taken does not tell which one matched.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        // A poisoned lock means a writer panicked mid-swap; refusing is the safe answer.
        let Ok(tokens) = self.current.read() else {
            return false;
        };
        tokens
            .iter()
            .fold(false, |found, token| token.matches(presented) | found)
    }

    /// Reads the file again (a role from a file only), replacing the tokens when it gives
    /// usable ones and keeping them otherwise; logs a change or a new failure, never a token.
    pub fn reload(&self) -> Reload {
        let Source::File(path) = &self.source else {
            return Reload::Fixed;
        };
        let outcome = match read_file(path) {
            Ok(tokens) => match self.current.write() {
                Ok(mut current) => {
                    if *current == tokens {
                        Reload::Unchanged
                    } else {
                        *current = tokens;
                        Reload::Changed
                    }
                }
                Err(_) => Reload::Kept(TokenError::Unreadable("internal lock poisoned".into())),
            },
            Err(e) => Reload::Kept(e),
        };
        let failure = match &outcome {
            Reload::Kept(e) => Some(e.clone()),
            _ => None,
        };
        let newly = self
            .failing
            .write()
            .map(|mut failing| {
                let newly = *failing != failure;
                *failing = failure;
                newly
            })
            .unwrap_or(true);
        match &outcome {
            Reload::Changed => info!(
                key = self.key,
                file = %path.display(),
                tokens = self.len(),
                "tokens re-read"
            ),
            Reload::Kept(e) if newly => warn!(
                key = self.key,
                file = %path.display(),
                error = %e,
                "the token file gives no usable token; the previous tokens stay valid"
            ),
            Reload::Unchanged if newly => info!(
                key = self.key,
                file = %path.display(),
                "the token file is readable again; tokens unchanged"
            ),
            _ => {}
        }
        outcome
    }
}

/// Told what each re-read of a token file did (the metrics implement it).
pub trait Observer: Send + Sync {
    /// `role` (see [`RoleTokens::role`]) was re-read with `outcome`.
    fn tokens_reloaded(&self, role: &'static str, outcome: &Reload);
}

/// Re-reads every role's token file every `interval` and at once on SIGHUP, telling
/// `observer`, until `cancel` fires. Installs the SIGHUP handler first: without one, SIGHUP
/// ends the process.
pub async fn watch(
    roles: Vec<Arc<RoleTokens>>,
    interval: Duration,
    observer: Arc<dyn Observer>,
    cancel: CancellationToken,
) {
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(e) => {
            warn!(error = %e, "cannot install the SIGHUP handler; token files are polled only");
            None
        }
    };
    let files = roles
        .iter()
        .any(|role| matches!(role.source, Source::File(_)));
    loop {
        // Cancel safety: `recv` and `sleep` lose nothing when dropped; a re-read is a whole
        // step after the wait.
        let signalled = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = async {
                match hangup.as_mut() {
                    Some(hangup) => hangup.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            _ = tokio::time::sleep(interval), if files => false,
        };
        if signalled {
            info!(signal = "SIGHUP", "re-reading the token files");
        }
        for role in &roles {
            let outcome = role.reload();
            observer.tokens_reloaded(role.role(), &outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_holds_one_or_two_tokens_one_per_line() {
        let tokens = parse("  old-token \n\nnew-token\n").expect("two");
        assert_eq!(tokens.len(), 2);
        assert!(tokens[0].matches(b"old-token") && tokens[1].matches(b"new-token"));
        assert_eq!(parse("only\n").expect("one").len(), 1);
        assert_eq!(parse(" \n\t\n").err(), Some(TokenError::Empty));
        assert_eq!(parse("a\nb\nc\n").err(), Some(TokenError::TooMany(3)));
    }

    #[test]
    fn a_file_that_breaks_keeps_the_last_tokens() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").expect("write");
        let role = RoleTokens::new(
            "http.intake_token_file",
            Source::File(path.clone()),
            read_file(&path).expect("tokens"),
        );
        assert!(role.accepts(b"first") && !role.accepts(b"second"));
        std::fs::write(&path, "first\nsecond\n").expect("write");
        assert_eq!(role.reload(), Reload::Changed);
        assert!(role.accepts(b"first") && role.accepts(b"second"));
        assert_eq!(role.reload(), Reload::Unchanged);
        std::fs::write(&path, "").expect("write");
        assert_eq!(role.reload(), Reload::Kept(TokenError::Empty));
        std::fs::remove_file(&path).expect("remove");
        assert!(matches!(
            role.reload(),
            Reload::Kept(TokenError::Unreadable(_))
        ));
        assert!(role.accepts(b"first") && role.accepts(b"second"));
        assert!(!role.accepts(b"") && !role.is_open());
        std::fs::write(&path, "second\n").expect("write");
        assert_eq!(role.reload(), Reload::Changed);
        assert!(!role.accepts(b"first") && role.accepts(b"second"));
    }

    #[test]
    fn the_role_label_comes_from_the_key() {
        assert_eq!(RoleTokens::open("http.intake_token_file").role(), "intake");
        assert_eq!(
            RoleTokens::open("http.metrics_token_file").role(),
            "metrics"
        );
    }

    #[test]
    fn an_open_role_or_an_environment_token_is_not_re_read() {
        assert_eq!(
            RoleTokens::open("http.query_token_file").reload(),
            Reload::Fixed
        );
        let role = RoleTokens::new(
            "http.query_token_file",
            Source::Env("ROLLBOARD_QUERY_TOKEN".into()),
            parse("t").expect("token"),
        );
        assert_eq!(role.reload(), Reload::Fixed);
        assert!(role.accepts(b"t"));
    }
}
