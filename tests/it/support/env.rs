//! What the environment of a test run provides: run counts and seeds of the randomized
//! tests, and Debian's libfaketime for daemons with their own clock.

use std::path::PathBuf;

use rollboard::config::ScriptCalls;

/// The number in environment variable `name`, else `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seed in environment variable `name`, else the clock.
pub fn env_seed(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rollboard::domain::clock::local_ms() as u64)
}

/// How the run's stores call the scripts: `ROLLBOARD__REDIS__SCRIPTS` (`auto`, `functions`
/// or `eval`), the variable that also sets `redis.scripts` of every daemon and CLI the
/// tests start (they inherit the environment). Unset: `auto`, as a daemon by default.
pub fn script_calls() -> ScriptCalls {
    match std::env::var("ROLLBOARD__REDIS__SCRIPTS").as_deref() {
        Ok("eval") => ScriptCalls::Eval,
        Ok("functions") => ScriptCalls::Functions,
        _ => ScriptCalls::Auto,
    }
}

/// Debian's libfaketime, preloaded directly so that signals reach the daemon itself.
pub fn faketime_library() -> PathBuf {
    std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(Result::ok)
        .map(|d| d.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists())
        .expect("libfaketime (scripts/ensure-faketime installs it)")
}
