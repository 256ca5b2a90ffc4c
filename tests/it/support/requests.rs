//! Every request a test's `redis-server` ran, with its number of arguments, read from the
//! server's slow log with a threshold of 0 µs (so that it logs every command). Redis 7.0
//! keeps a command's first 31 arguments and, when it had more, a last one `... (N more
//! arguments)`: its count is 31 + N. The commands a script runs are logged too, as those of
//! a client at `?:0`: they are no request of a client, and are kept apart.

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::{ClusterHash, CustomCommand};
use rollboard::store::Store;

use crate::support::redis::RedisServer;

/// Entries the slow log keeps before it drops the oldest: more than any phase of a test
/// sends (checked by [`Requests::take`]).
const KEPT: usize = 1_000_000;

/// The address the slow log gives for the commands a script runs.
const SCRIPT_CLIENT: &str = "?:0";

/// One command as the slow log recorded it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Its number of arguments, its name included.
    pub argc: usize,
    /// Its first arguments as logged (each cut at 128 bytes by Redis).
    pub words: Vec<String>,
}

impl Request {
    /// The command's name and its first arguments, shortened, for a message.
    pub fn shown(&self) -> String {
        let words: Vec<String> = self
            .words
            .iter()
            .take(4)
            .map(|w| {
                let flat = w.split_whitespace().collect::<Vec<_>>().join(" ");
                flat.chars().take(40).collect()
            })
            .collect();
        format!("{} ({} arguments)", words.join(" "), self.argc)
    }
}

/// What the server ran since the last [`Requests::take`].
#[derive(Debug, Default)]
pub struct Ran {
    /// The clients' requests.
    pub requests: Vec<Request>,
    /// The commands scripts ran.
    pub in_scripts: Vec<Request>,
}

impl Ran {
    /// The request of the most arguments.
    pub fn largest(&self) -> Option<&Request> {
        self.requests.iter().max_by_key(|r| r.argc)
    }

    /// The most arguments of any request of each command (a function call by its
    /// function, a script by `EVAL`), largest first.
    pub fn largest_by_command(&self) -> Vec<(String, usize)> {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for r in &self.requests {
            let name = match r.words.first().map(String::as_str) {
                Some("FCALL") => r.words.get(1).cloned().unwrap_or_default(),
                Some(name) => name.to_string(),
                None => String::new(),
            };
            let most = by.entry(name).or_default();
            *most = (*most).max(r.argc);
        }
        let mut out: Vec<(String, usize)> = by.into_iter().collect();
        out.sort_by_key(|(_, argc)| std::cmp::Reverse(*argc));
        out
    }

    /// The command of the most arguments run inside a script.
    pub fn largest_in_scripts(&self) -> Option<&Request> {
        self.in_scripts.iter().max_by_key(|r| r.argc)
    }
}

/// The slow log of one server, logging every command.
pub struct Requests {
    store: Store,
}

impl Requests {
    /// Turns the slow log of `redis` on for every command, emptied.
    pub async fn record(redis: &RedisServer) -> Requests {
        let store = redis.store("rb").await;
        for (name, value) in [
            ("slowlog-max-len", KEPT.to_string()),
            ("slowlog-log-slower-than", "0".to_string()),
        ] {
            let _: Value = store
                .client()
                .custom(config(), vec!["SET".to_string(), name.into(), value])
                .await
                .expect("CONFIG SET");
        }
        let requests = Requests { store };
        requests.take().await;
        requests
    }

    /// Every command logged since the last take, oldest first, and the log emptied (one
    /// transaction: nothing is lost in between).
    pub async fn take(&self) -> Ran {
        // A log of tens of thousands of commands takes a while to send and to read.
        let tx = self.store.client().multi().with_options(&Options {
            timeout: Some(std::time::Duration::from_secs(300)),
            ..Options::default()
        });
        let _: () = tx
            .custom(slowlog(), vec!["GET", "-1"])
            .await
            .expect("queue SLOWLOG GET");
        let _: () = tx
            .custom(slowlog(), vec!["RESET"])
            .await
            .expect("queue SLOWLOG RESET");
        let (entries, _): (Value, Value) = tx.exec(true).await.expect("SLOWLOG");
        let Value::Array(entries) = entries else {
            panic!("SLOWLOG GET: {entries:?}");
        };
        assert!(entries.len() < KEPT, "the slow log dropped entries");
        let mut ran = Ran::default();
        for entry in entries.into_iter().rev() {
            let Value::Array(parts) = entry else {
                panic!("a slow log entry: {entry:?}");
            };
            let words: Vec<String> = match parts.get(3) {
                Some(Value::Array(words)) => words.iter().map(text).collect(),
                other => panic!("a slow log entry's arguments: {other:?}"),
            };
            let client = parts.get(4).map(text).unwrap_or_default();
            let request = Request {
                argc: argc(&words),
                words,
            };
            if client == SCRIPT_CLIENT {
                ran.in_scripts.push(request);
            } else {
                ran.requests.push(request);
            }
        }
        ran
    }
}

/// The number of arguments of a command the slow log logged as `words`.
pub fn argc(words: &[String]) -> usize {
    let more = words.last().and_then(|w| {
        w.strip_prefix("... (")?
            .strip_suffix(" more arguments)")?
            .parse::<usize>()
            .ok()
    });
    match more {
        Some(more) => words.len() - 1 + more,
        None => words.len(),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.to_string(),
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Integer(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn config() -> CustomCommand {
    CustomCommand::new_static("CONFIG", ClusterHash::Random, false)
}

fn slowlog() -> CustomCommand {
    CustomCommand::new_static("SLOWLOG", ClusterHash::Random, false)
}
