//! What the environment of a test run provides: run counts and seeds of the randomized
//! tests, Debian's libfaketime for daemons with their own clock, and which server
//! `redis-server` on `PATH` is (and the tests it cannot take).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

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

/// The `redis-server` on `PATH`, as its `--version` line names it
/// (`Redis server v=7.0.15 sha=...`, `Valkey server v=8.0.1 sha=...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `Redis` or `Valkey`.
    pub project: String,
    /// Major, minor and patch version.
    pub version: (u32, u32, u32),
}

/// The server every fixture starts, read once per test process.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let out = Command::new("redis-server")
            .arg("--version")
            .output()
            .expect("redis-server is installed (scripts/ensure-redis)");
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        let project = line.split_whitespace().next().unwrap_or_default();
        let number = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or_else(|| panic!("no version in {line:?}"));
        let part = |k: usize| {
            number
                .split('.')
                .nth(k)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no version in {line:?}"))
        };
        Server {
            project: project.to_string(),
            version: (part(0), part(1), part(2)),
        }
    })
}

/// Says that `test` skips its body on this server, and why, in a line starting `SKIPPED`
/// (counted by `scripts/test`). Written to the standard error stream itself: the harness
/// captures `eprintln!` of a test that passes, and a skip must show in the log.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let Server { project, version } = server();
    let (major, minor, patch) = version;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test} on {project} {major}.{minor}.{patch}: {why}"
    );
}
