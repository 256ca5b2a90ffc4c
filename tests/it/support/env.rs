//! What the environment of a test run provides: run counts and seeds of the randomized
//! tests, and Debian's libfaketime for daemons with their own clock.

use std::path::PathBuf;

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

/// Debian's libfaketime, preloaded directly so that signals reach the daemon itself.
pub fn faketime_library() -> PathBuf {
    std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(Result::ok)
        .map(|d| d.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists())
        .expect("libfaketime (scripts/ensure-faketime installs it)")
}
