//! Configuration files for the daemon and the CLI: the test boards and the settings around them.

use std::path::{Path, PathBuf};

use crate::support::redis::{free_port, RedisServer};

/// The board definitions the daemon tests run with (as in config/rollboard.toml, with
/// quick jobs and short timeouts).
pub const BOARDS: &str = r#"
[[boards]]
name = "rooms_7d"
member = "room"
window = "7d"
slice = "6h"

[[boards]]
name = "fans_7d"
member = "user"
scope = "room"
window = "7d"
slice = "1h"
mode = "resummarize"

[[boards]]
name = "tips_24h"
member = "user"
amount = "value"
scale = 2
window = "24h"
slice = "1h"
tie_break = "latest"
allow_negative = true
"#;

/// The board `name` of the configuration file at `path`, as the daemon reads it.
pub fn board_of(path: &Path, name: &str) -> rollboard::domain::board::Board {
    let text = std::fs::read_to_string(path).expect("read config");
    rollboard::config::Settings::from_toml(&text)
        .expect("valid config")
        .boards
        .into_iter()
        .find(|b| b.name == name)
        .expect("the board is configured")
}

/// A config file for a daemon talking to `redis` and listening on `http_port`.
pub fn write_config(
    dir: &Path,
    redis: &RedisServer,
    port: u16,
    consumer: &str,
    extra: &str,
) -> PathBuf {
    write_config_url(dir, &redis.url(), port, consumer, extra)
}

/// As [`write_config`], for a daemon reaching Redis at `url` (e.g. through a [`crate::support::proxy::Proxy`]).
pub fn write_config_url(
    dir: &Path,
    url: &str,
    http_port: u16,
    consumer: &str,
    extra: &str,
) -> PathBuf {
    let path = dir.join(format!("rollboard-{consumer}.toml"));
    let text = format!(
        "[redis]\nurl = \"{url}\"\n[ingest]\nconsumer = \"{consumer}\"\nblock = \"100ms\"\nclaim_idle = \"1s\"\nbatch_size = 200\n\
         [schedule]\nroll = \"*/2 * * * * *\"\nresummarize = \"* * * * * *\"\nlease = \"5s\"\n[http]\nlisten = \"127.0.0.1:{http_port}\"\n{extra}\n{BOARDS}"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// As [`write_config`], with `partitions` stream partitions.
pub fn partitioned_config(
    dir: &std::path::Path,
    redis: &RedisServer,
    port: u16,
    consumer: &str,
    partitions: usize,
) -> std::path::PathBuf {
    let path = write_config(dir, redis, port, consumer, "");
    let text = std::fs::read_to_string(&path).expect("read config");
    let text = text.replacen(
        "[ingest]\n",
        &format!("[ingest]\npartitions = {partitions}\n"),
        1,
    );
    let path = dir.join(format!("rollboard-{consumer}-{partitions}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// A temp dir, a free HTTP port and a configuration written there by [`write_config`].
pub fn config_for(
    redis: &RedisServer,
    consumer: &str,
    extra: &str,
) -> (tempfile::TempDir, u16, std::path::PathBuf) {
    config_for_url(&redis.url(), consumer, extra)
}

/// As [`config_for`], for the Redis at `url` (through [`write_config_url`]).
pub fn config_for_url(
    url: &str,
    consumer: &str,
    extra: &str,
) -> (tempfile::TempDir, u16, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config_url(dir.path(), url, port, consumer, extra);
    (dir, port, config)
}

/// A fresh redis-server, a temp dir, a free HTTP port, and the config `write` puts there.
pub fn server_and_config(
    write: impl FnOnce(&Path, &RedisServer, u16) -> PathBuf,
) -> (RedisServer, tempfile::TempDir, u16, PathBuf) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write(dir.path(), &redis, port);
    (redis, dir, port, config)
}

/// Writes `content` to the file `name` in `dir` (a token file, say); its path.
pub fn write_file(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write file");
    path
}

/// Rewrites the configuration at `path`, replacing the first `from` with `to`.
pub fn edit_config(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).expect("read config");
    assert!(text.contains(from), "{from} is in the config");
    std::fs::write(path, text.replacen(from, to, 1)).expect("write config");
}

/// Appends `text` (e.g. a `[[boards]]` table) to the configuration at `path`.
pub fn append_config(path: &Path, text: &str) {
    let mut config = std::fs::read_to_string(path).expect("read config");
    config.push_str(text);
    std::fs::write(path, config).expect("write config");
}

/// A plain board `solo` (a 6h window of hourly slices), for a configuration that wants one
/// beside the boards a test is about.
pub const SOLO_BOARD: &str =
    "[[boards]]\nname = \"solo\"\nmember = \"user\"\nwindow = \"6h\"\nslice = \"1h\"\n";

/// A `[[boards]]` table: board `name` ranking `member` in hourly slices over `window` (a
/// width such as `6h`, or a TOML list of widths such as `["2h", "6h"]`), then the `extra`
/// lines (`key = value`, each ending in a newline).
pub fn board_table(name: &str, member: &str, window: &str, extra: &str) -> String {
    let window = if window.starts_with('[') {
        format!("windows = {window}")
    } else {
        format!("window = \"{window}\"")
    };
    format!(
        "\n[[boards]]\nname = \"{name}\"\nmember = \"{member}\"\n{window}\nslice = \"1h\"\n{extra}"
    )
}

/// The boards of the configuration text `toml`, as the command line reads them.
pub fn boards_in(toml: &str) -> Vec<rollboard::domain::board::Board> {
    rollboard::config::Settings::from_toml(toml)
        .expect("valid boards")
        .boards
}
