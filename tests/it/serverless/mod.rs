//! rollboard as the user of a serverless managed Redis. Such a service (ElastiCache
//! Serverless, and others like it) runs Lua by `EVAL` and `EVALSHA` but refuses `FUNCTION`
//! (no `FUNCTION LOAD`, no `FUNCTION LIST`), `FCALL` and `FCALL_RO`; it replicates by
//! itself and refuses `WAIT`; it refuses `CONFIG` and `CLIENT LIST`. Here a real
//! redis-server plays it: an ACL user granted every command but those (`+@all -function
//! -fcall -fcall_ro -wait -config -client|list`, every key and channel), and the daemon and
//! the command line run as that user with `redis.min_replicas_acked = 0` and
//! `redis.scripts` left at its default, `auto`.
//!
//! The test proves that with `auto` the daemon finds functions refused and calls its
//! scripts by `EVALSHA`, and that then every path counts exactly: ingest from the stream,
//! the HTTP intake and `rollboard send`, with redeliveries (the same ids appended again, a
//! consumer killed holding a batch whose entries another claims), rolls that drop expired
//! slices, `verify`, `rebuild`, every query (top, member, around, ranks, each window, a
//! sharded board, a period board) over HTTP and the command line, the change feed, and
//! dead-letter replay; that the server ran no `FCALL`, `WAIT` or `ROLE`; and that nothing
//! in the daemon's log says a permission was denied.

mod answers;
mod every_path_counts_exactly;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollboard::store::{Reconnect, Store};

use crate::support::daemon::Daemon;
use crate::support::redis::{free_port, RedisServer};
use crate::support::sse::{Sse, SseEvent};

/// The serverless user's name.
const USER: &str = "serverless";

/// The serverless user's password.
const PASSWORD: &str = "serverless-pw-4Tq";

/// What a serverless service refuses, as ACL rules on top of `+@all`.
const REFUSED: [&str; 6] = [
    "-function",
    "-fcall",
    "-fcall_ro",
    "-wait",
    "-config",
    "-client|list",
];

/// Commands as the serverless user may send them, each with whether the service allows
/// it: what [`REFUSED`] must make of the user.
const DRY_RUNS: [(&[&str], bool); 9] = [
    (&["FUNCTION", "LIST"], false),
    (&["FCALL", "f", "1", "k"], false),
    (&["FCALL_RO", "f", "1", "k"], false),
    (&["WAIT", "0", "0"], false),
    (&["CONFIG", "GET", "maxmemory"], false),
    (&["CLIENT", "LIST"], false),
    (
        &[
            "EVALSHA",
            "0123456789012345678901234567890123456789",
            "1",
            "k",
        ],
        true,
    ),
    (&["SCRIPT", "LOAD", "return 1"], true),
    (&["CLIENT", "ID"], true),
];

/// Creates the serverless user on `redis`: every command but [`REFUSED`], on every key and
/// channel (checked by `ACL DRYRUN`). Its URL.
fn serverless_user(redis: &RedisServer) -> String {
    let password = format!(">{PASSWORD}");
    let mut acl = vec!["ACL", "SETUSER", USER, "reset", "on", &password];
    acl.extend(["~*", "&*", "+@all"]);
    acl.extend(REFUSED);
    assert_eq!(redis.cli(&acl).trim(), "OK", "ACL SETUSER");
    for (command, allowed) in DRY_RUNS {
        let mut dry = vec!["ACL", "DRYRUN", USER];
        dry.extend(command);
        let answer = redis.cli(&dry);
        assert_eq!(answer.trim() == "OK", allowed, "{command:?}: {answer}");
    }
    format!("redis://{USER}:{PASSWORD}@127.0.0.1:{}", redis.port)
}

/// A store connected as the serverless user, calling scripts as a daemon does by default
/// (`auto`), whatever the run's `ROLLBOARD_REDIS__SCRIPTS`.
async fn serverless_store(url: &str) -> Store {
    Store::connect(url, "rb", 1, Reconnect::Never)
        .await
        .expect("connect as the serverless user")
        .with_script_calls(rollboard::config::ScriptCalls::Auto)
}

/// The boards, all of 1 s slices so that a roll drops a slice within the test:
/// * `fans`: each room's fans over the last hour, resummarized, ties to the earlier, a
///   change feed of each room's top 3;
/// * `duo`: players' points over the last 4 s and the last hour, ties to the later, a
///   change feed of each window's top 3;
/// * `rooms`: the rooms over the last hour, spread over 4 shards;
/// * `today`: the fans of the current day in `zone`.
fn boards(zone: &str) -> String {
    format!(
        r#"
[[boards]]
name = "fans"
member = "user"
scope = "room"
window = "1h"
slice = "1s"
mode = "resummarize"
changes_top = 3

[[boards]]
name = "duo"
member = "player"
amount = "points"
windows = ["4s", "1h"]
slice = "1s"
tie_break = "latest"
changes_top = 3

[[boards]]
name = "rooms"
member = "room"
window = "1h"
slice = "1s"
shards = 4

[[boards]]
name = "today"
member = "user"
period = "day"
time_zone = "{zone}"
"#
    )
}

/// A zone in which the current day began over 2 hours ago and ends in over 2 hours (so
/// that every tip of the test, up to an hour old, falls in the current day): UTC, else
/// UTC-12.
fn zone_clear_of_midnight(now: i64) -> &'static str {
    let hour = now.div_euclid(3_600_000).rem_euclid(24);
    if (2..22).contains(&hour) {
        "UTC"
    } else {
        "Etc/GMT+12"
    }
}

/// A daemon's (and the command line's) configuration for the Redis at `url` as consumer
/// `consumer`, its API on `http_port`: no replica confirmation, scripts called as `auto`
/// decides, jobs every second, answers never kept (another process's writes show at once).
fn write_config(dir: &Path, url: &str, http_port: u16, consumer: &str, zone: &str) -> PathBuf {
    let text = format!(
        "[redis]\nurl = \"{url}\"\nmin_replicas_acked = 0\n\
         [ingest]\nconsumer = \"{consumer}\"\nblock = \"100ms\"\nclaim_idle = \"1s\"\nbatch_size = 20\n\
         [schedule]\nroll = \"* * * * * *\"\nresummarize = \"* * * * * *\"\nlease = \"5s\"\n\
         [http]\nlisten = \"127.0.0.1:{http_port}\"\nmax_staleness = \"0s\"\n{}",
        boards(zone)
    );
    let path = dir.join(format!("rollboard-{consumer}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// The boards of [`boards`] in `zone`, as the daemon reads them.
fn boards_in_zone(zone: &str) -> Vec<rollboard::domain::board::Board> {
    crate::support::config::boards_in(&boards(zone))
}

/// A daemon started as consumer `consumer` with its own configuration in `dir`; the
/// configuration's path.
async fn start_daemon(dir: &Path, url: &str, consumer: &str, zone: &str) -> (Daemon, PathBuf) {
    let port = free_port();
    let config = write_config(dir, url, port, consumer, zone);
    (Daemon::start(&config, port).await, config)
}

/// A change feed followed over SSE: every event received, in order, by one connection
/// after another.
#[derive(Clone, Default)]
struct Followed {
    events: Arc<Mutex<Vec<SseEvent>>>,
}

impl Followed {
    /// Opens `path` on `daemon`, resuming after the last event received (after `0-0`,
    /// the start, when none was), and collects its events until the stream ends.
    async fn follow(&self, daemon: &Daemon, path: &str) -> tokio::task::JoinHandle<()> {
        let last = self.last_id().unwrap_or_else(|| "0-0".into());
        let mut stream = Sse::open(daemon, path, Some(&last)).await;
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(event) = stream.next_event(Duration::from_secs(300)).await {
                events.lock().expect("events").push(event);
            }
        })
    }

    /// The ID of the last event received.
    fn last_id(&self) -> Option<String> {
        let events = self.events.lock().expect("events");
        events.iter().rev().find_map(|e| e.id.clone())
    }

    /// Every event received so far.
    fn events(&self) -> Vec<SseEvent> {
        self.events.lock().expect("events").clone()
    }
}
