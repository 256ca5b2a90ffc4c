//! Every request the daemon and the command line send holds at most
//! [`MAX_REQUEST_ARGS`] arguments, counted by the server itself (its slow log, see
//! [`Requests`]) over a whole life of five boards that make requests as large as the
//! configuration allows: the largest batch (`ingest.batch_size = 10000`) of events with
//! ids, one scoped board of 2 100 scopes (more than one `ZADD` registers) with a change
//! feed and distinct totals, one of eight windows, one sharded over 64 instances, a scoped
//! calendar-period board, a resummarize board of two windows, and one entry of as many
//! fields as a request can append (its dead letter). The jobs run only when the command
//! line runs them, so that each phase holds its own requests. The phases: start-up (the permission probe, that letter), the intake and
//! the ingest, a `ranks` query of 1 000 members of the sharded board, `verify`,
//! `rebuild`, a roll, a roll three days ahead (every slice expired, the period archive
//! deleted), a dead-letter replay and `drop-board` of every board.

use fred::prelude::*;
use rollboard::domain::limits::MAX_REQUEST_ARGS;

use crate::support::boards::{redis_now, HOUR};
use crate::support::cli::{assert_exit, run_rollboard};
use crate::support::config::write_file;
use crate::support::daemon::Daemon;
use crate::support::events::post_fields;
use crate::support::keys::intake_stream;
use crate::support::redis::{free_port, RedisServer};
use crate::support::requests::{Ran, Requests};
use crate::support::wait::drained;

/// Events in the one batch of the ingest: `ingest.batch_size` at its largest.
const EVENTS: usize = 10_000;
/// Scopes of the scoped boards: more than one `ZADD` registers.
const ROOMS: usize = 2_100;
/// Members: as many as one `ranks` query asks for.
const USERS: usize = 1_000;
/// Fields of the entry added by hand: as many as one `XADD` of it can carry.
const WIDE: usize = (MAX_REQUEST_ARGS - 3) / 2 - 3;

const BOARDS: [&str; 5] = ["wide", "rooms", "sharded", "days", "resum"];

fn config_text(url: &str, port: u16) -> String {
    format!(
        r#"
[redis]
url = "{url}"
[ingest]
consumer = "a"
block = "100ms"
batch_size = {EVENTS}
[schedule]
roll = "0 0 0 1 1 *"
resummarize = "0 0 0 1 1 *"
lease = "5s"
[http]
listen = "127.0.0.1:{port}"

[[boards]]
name = "wide"
member = "user"
windows = ["1h", "2h", "3h", "6h", "12h", "1d", "2d", "7d"]
slice = "1h"
changes_top = 25
dense_rank = true

[[boards]]
name = "rooms"
member = "user"
scope = "room"
window = "1d"
slice = "1h"
changes_top = 25
dense_rank = true

[[boards]]
name = "sharded"
member = "user"
window = "1d"
slice = "1h"
shards = 64

[[boards]]
name = "days"
member = "user"
scope = "room"
period = "day"
time_zone = "UTC"
period_grace = "1m"
keep_periods = 0

[[boards]]
name = "resum"
member = "user"
windows = ["1d", "7d"]
slice = "1h"
mode = "resummarize"
"#
    )
}

/// The requests of more than [`MAX_REQUEST_ARGS`] arguments of each phase, named by the
/// phase and the command.
#[derive(Default)]
struct Over(Vec<String>);

impl Over {
    /// Notes the requests of `ran` over the cap; prints the largest request and the largest
    /// command run inside a script.
    fn check(&mut self, phase: &str, ran: &Ran) {
        let largest = ran.largest().map(|r| r.shown()).unwrap_or_default();
        let in_scripts = ran
            .largest_in_scripts()
            .map(|r| r.shown())
            .unwrap_or_default();
        println!(
            "{phase}: {} requests, the largest {largest}; inside scripts {in_scripts}",
            ran.requests.len()
        );
        let by: Vec<String> = ran
            .largest_by_command()
            .iter()
            .map(|(name, argc)| format!("{name} {argc}"))
            .collect();
        println!("  by command: {}", by.join(", "));
        self.0.extend(
            ran.requests
                .iter()
                .filter(|r| r.argc > MAX_REQUEST_ARGS)
                .map(|r| format!("{phase}: {}", r.shown())),
        );
    }

    /// Fails naming every request over the cap.
    fn assert_none(self) {
        assert!(
            self.0.is_empty(),
            "{} request(s) of more than {MAX_REQUEST_ARGS} arguments:\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// Runs `rollboard args`, which must exit with `code`.
fn cli(config: &std::path::Path, args: &[&str], code: i32) {
    assert_exit(&run_rollboard(config, args), code, &args.join(" "));
}

#[tokio::test]
async fn no_request_passes_the_argument_cap_from_start_up_to_drop_board() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_file(
        dir.path(),
        "rollboard.toml",
        &config_text(&redis.url(), port),
    );
    // An entry of as many fields as one XADD holds, matching no board: its dead letter
    // carries them all and four of its own. Added before the log starts: it is the test's
    // request, not rollboard's.
    let fields: Vec<(String, String)> = (0..WIDE).map(|i| (format!("f{i}"), "v".into())).collect();
    let _: String = store
        .client()
        .xadd(intake_stream(), false, None, "*", fields)
        .await
        .expect("XADD");
    let requests = Requests::record(&redis).await;
    let mut over = Over::default();

    let daemon = Daemon::start(&config, port).await;
    assert!(drained(&store).await, "the wide entry is read");
    over.check("start-up and a dead letter", &requests.take().await);

    // One append of the whole batch: the consumer's next read takes all of it.
    let now = redis_now(&store).await;
    let events: Vec<Vec<(String, String)>> = (0..EVENTS)
        .map(|i| {
            vec![
                ("id".into(), format!("e{i}")),
                ("user".into(), format!("u{}", i % USERS)),
                ("room".into(), format!("r{}", i % ROOMS)),
                ("amount".into(), "1".into()),
                ("ts".into(), (now - (i as i64 % 24) * HOUR).to_string()),
            ]
        })
        .collect();
    let answer = post_fields(&daemon.base, &events).await;
    assert_eq!(answer.status().as_u16(), 202, "{:?}", answer.text().await);
    assert!(drained(&store).await, "the batch is applied");
    over.check("intake and ingest", &requests.take().await);

    let members: Vec<String> = (0..USERS).map(|i| format!("u{i}")).collect();
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/boards/sharded/ranks", daemon.base))
        .json(&serde_json::json!({ "members": members }))
        .send()
        .await
        .expect("ranks");
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);
    over.check("ranks of 1 000 members", &requests.take().await);
    daemon.terminate().await;
    requests.take().await;

    cli(&config, &["verify"], 0);
    over.check("verify", &requests.take().await);
    for board in BOARDS {
        cli(&config, &["rebuild", board], 0);
    }
    over.check("rebuild", &requests.take().await);
    cli(&config, &["roll"], 0);
    over.check("roll", &requests.take().await);
    let ahead = (now + 72 * HOUR).to_string();
    cli(&config, &["roll", "--at", &ahead, "--force"], 0);
    over.check("roll three days ahead", &requests.take().await);
    cli(&config, &["dead-letters", "replay"], 1);
    over.check("dead-letter replay", &requests.take().await);
    for board in BOARDS {
        cli(&config, &["drop-board", board, "--force"], 0);
    }
    over.check("drop-board", &requests.take().await);
    over.assert_none();
}
