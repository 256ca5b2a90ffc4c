//! The serverless user end to end: a daemon and the command line as a user denied
//! `FUNCTION`, `FCALL`, `FCALL_RO`, `WAIT`, `CONFIG` and `CLIENT LIST` choose `EVALSHA` and
//! then ingest (the stream, the HTTP intake, `rollboard send`; redeliveries of every kind;
//! malformed events dead-lettered), roll, verify, rebuild, answer every query, write every
//! change feed and replay corrected dead letters, all equal to the model at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::domain::board::Board;
use rollboard::ingest::stream::group_info;
use rollboard::store::{ApplyEvent, Store};
use serde_json::Value;

use super::answers::{cli_answers_match, http_answers_match, top_matches, Ranking};
use super::{boards_in_zone, serverless_store, serverless_user, start_daemon};
use super::{zone_clear_of_midnight, Followed};
use crate::shards::{Ranked, Windows};
use crate::support::boards::{board, redis_now, DAY, HOUR};
use crate::support::cli::{rollboard, send, stderr, stdout};
use crate::support::daemon::Daemon;
use crate::support::events::{letters, post_events, xadd_all, Fields};
use crate::support::feed::{replay, Change};
use crate::support::http::json;
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::model::Instance;
use crate::support::redis::{command_calls, RedisServer};
use crate::support::sse::SseEvent;
use crate::support::wait::{drained, wait_for};

/// How far ahead of the clock the dated-ahead points are (within `ingest.max_future`, 5
/// min): they stay in `duo`'s 4 s window for the whole test.
const AHEAD: i64 = 240_000;

/// How long after the start the tip of the hour's oldest slice is still live.
const EXPIRES_AFTER: i64 = 12_000;

/// The change feeds followed: a name and the route.
const FEEDS: [(&str, &str); 4] = [
    ("fans r1", "/v1/boards/fans/changes?scope=r1"),
    ("fans r2", "/v1/boards/fans/changes?scope=r2"),
    ("duo 4s", "/v1/boards/duo/changes?window=4s"),
    ("duo 1h", "/v1/boards/duo/changes?window=1h"),
];

/// One event as a producer sends it.
#[derive(Debug, Clone)]
enum Event {
    /// `amount` from `user` in `room` (boards `fans`, `rooms`, `today`).
    Tip {
        id: String,
        ts: i64,
        room: &'static str,
        user: &'static str,
        amount: i64,
    },
    /// `points` of `player` (board `duo`).
    Points {
        id: String,
        ts: i64,
        player: &'static str,
        points: i64,
    },
}

/// A tip of `amount` from `user` in `room` at `ts`, under the id `id`.
fn tip(id: &str, ts: i64, room: &'static str, user: &'static str, amount: i64) -> Event {
    Event::Tip {
        id: id.into(),
        ts,
        room,
        user,
        amount,
    }
}

/// `points` of `player` at `ts`, under the id `id`.
fn points(id: &str, ts: i64, player: &'static str, points: i64) -> Event {
    Event::Points {
        id: id.into(),
        ts,
        player,
        points,
    }
}

impl Event {
    /// Its fields, as a stream entry holds them.
    fn fields(&self) -> Fields {
        let pairs: Vec<(&str, String)> = match self {
            Event::Tip {
                id,
                ts,
                room,
                user,
                amount,
            } => vec![
                ("id", id.clone()),
                ("ts", ts.to_string()),
                ("room", room.to_string()),
                ("user", user.to_string()),
                ("amount", amount.to_string()),
            ],
            Event::Points {
                id,
                ts,
                player,
                points,
            } => vec![
                ("id", id.clone()),
                ("ts", ts.to_string()),
                ("player", player.to_string()),
                ("points", points.to_string()),
            ],
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Its JSON object, one line as `rollboard send` reads it.
    fn json_line(&self) -> String {
        let object: serde_json::Map<String, Value> = self
            .fields()
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        format!("{}\n", Value::Object(object))
    }
}

/// The model of every board: one instance per room of `fans`, one ranking of `rooms` (as
/// one unsharded instance), one instance per window of `duo`, and the day of `today` (an
/// instance of a window wider than the test, never rolled).
struct Models {
    fans_board: Board,
    duo_board: Board,
    rooms_board: Board,
    /// A rolling board standing in for `today` within one day: it ranks alike.
    day: Board,
    fans: BTreeMap<String, Instance>,
    rooms: Instance,
    today: Instance,
    duo: Windows,
}

impl Models {
    fn new(boards: &[Board]) -> Models {
        let named = |name: &str| {
            boards
                .iter()
                .find(|b| b.name == name)
                .unwrap_or_else(|| panic!("board {name}"))
                .clone()
        };
        let duo_board = named("duo");
        Models {
            fans_board: named("fans"),
            duo: Windows::new(&duo_board),
            duo_board,
            rooms_board: named("rooms"),
            day: board("today", DAY, 2),
            fans: BTreeMap::new(),
            rooms: Instance::default(),
            today: Instance::default(),
        }
    }

    /// Applies `event` as the daemon must at `now`.
    fn apply(&mut self, event: &Event, now: i64) {
        match event {
            Event::Tip {
                id,
                ts,
                room,
                user,
                amount,
            } => {
                let e = |member: &str| ApplyEvent {
                    id: id.clone(),
                    ts: *ts,
                    member: member.into(),
                    amount: *amount,
                };
                self.fans.entry(room.to_string()).or_default().apply(
                    &self.fans_board.widest(),
                    &e(user),
                    now,
                );
                self.rooms.apply(&self.rooms_board.widest(), &e(room), now);
                self.today.apply(&self.day.widest(), &e(user), now);
            }
            Event::Points {
                id,
                ts,
                player,
                points,
            } => {
                let e = ApplyEvent {
                    id: id.clone(),
                    ts: *ts,
                    member: player.to_string(),
                    amount: *points,
                };
                self.duo.apply(&e, now);
            }
        }
    }

    /// Applies each of `events` at `now`.
    fn apply_all(&mut self, events: &[Event], now: i64) {
        for e in events {
            self.apply(e, now);
        }
    }

    /// Rolls every rolling board at `now`.
    fn roll(&mut self, now: i64) {
        for fans in self.fans.values_mut() {
            fans.roll(&self.fans_board.widest(), now);
        }
        self.rooms.roll(&self.rooms_board.widest(), now);
        self.duo.roll_all(now);
    }

    /// Every ranking a query can read, as the model ranks it.
    fn rankings(&self) -> Vec<Ranking> {
        let mut out: Vec<Ranking> = self
            .fans
            .iter()
            .map(|(room, model)| Ranking {
                board: "fans",
                scope: Some(room.clone()),
                window: None,
                ranked: Ranked::of(model, &self.fans_board),
            })
            .collect();
        for (window, ms) in [("4s", 4_000), ("1h", HOUR)] {
            out.push(Ranking {
                board: "duo",
                scope: None,
                window: Some(window),
                ranked: Ranked::of(self.duo.window(ms), &self.duo_board),
            });
        }
        out.push(Ranking {
            board: "rooms",
            scope: None,
            window: None,
            ranked: Ranked::of(&self.rooms, &self.rooms_board),
        });
        out.push(Ranking {
            board: "today",
            scope: None,
            window: None,
            ranked: Ranked::of(&self.today, &self.day),
        });
        out
    }
}

/// Waits until every `top` answers as the model ranks (the resummarize job and the
/// rolls run every second); panics with the last difference.
async fn tops_converge(daemon: &Daemon, rankings: &[Ranking], when: &str) {
    let last = std::cell::RefCell::new(String::new());
    let converged = wait_for(Duration::from_secs(30), || async {
        for ranking in rankings {
            if let Err(e) = top_matches(daemon, ranking).await {
                *last.borrow_mut() = e;
                return false;
            }
        }
        true
    })
    .await;
    assert!(
        converged,
        "{when}: {}\nlog:\n{}",
        last.borrow(),
        tail(&daemon.logs())
    );
}

/// The last 40 lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Asserts that the daemon's log says `auto` chose `EVALSHA` (every store of it that
/// chose), holds no denied permission anywhere else, and no warning or error but the
/// malformed events dead-lettered.
fn assert_evalsha_and_nothing_denied(log: &str, who: &str) {
    let chose: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("redis.scripts = auto"))
        .collect();
    assert!(
        !chose.is_empty(),
        "{who}: the choice of redis.scripts is not logged:\n{log}"
    );
    for line in chose {
        assert!(
            line.contains("the user may not load or call functions")
                && line.contains("called with EVALSHA"),
            "{who}: {line}"
        );
    }
    assert_nothing_denied(log, who);
    let troubled: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| !l.contains("event dead-lettered"))
        .collect();
    assert!(troubled.is_empty(), "{who}: {troubled:#?}");
}

/// Asserts that no line of `log` but the choice of `redis.scripts` (which says what the
/// user may not run) speaks of a denied permission.
fn assert_nothing_denied(log: &str, who: &str) {
    let denied: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains("redis.scripts = auto"))
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            ["noperm", "permission", "denied"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    assert!(denied.is_empty(), "{who} logged a denial: {denied:#?}");
}

/// The group's pending entries on the intake stream.
async fn pending(store: &Store) -> i64 {
    match group_info(store.client(), intake_stream(), "rollboard").await {
        Ok(Some((pending, _))) => pending,
        _ => 0,
    }
}

/// Appends each event's fields to the intake stream.
async fn append(store: &Store, events: &[Event]) {
    let fields: Vec<Fields> = events.iter().map(Event::fields).collect();
    xadd_all(store.client(), intake_stream(), &fields).await;
}

/// Appends each event's fields to the intake stream in one transaction, so that a read
/// blocked on the stream is served all of them at once.
async fn append_at_once(store: &Store, events: &[Event]) {
    let tx = store.client().multi();
    for event in events {
        let _: () = tx
            .xadd(intake_stream(), false, None, "*", event.fields())
            .await
            .expect("xadd in the transaction");
    }
    let _: fred::types::Value = tx.exec(true).await.expect("exec");
}

/// Waits until the group has taken and acked everything.
async fn assert_drained(store: &Store, daemon: &Daemon, when: &str) {
    assert!(
        drained(store).await,
        "{when}: never drained; log:\n{}",
        tail(&daemon.logs())
    );
}

/// The events of one try at killing a consumer holding a batch (`k` numbers the try):
/// copies (same ids, same fields) of events already counted (a tip and points of the
/// stream, some dated ahead, a tip of the intake), and new tips and points.
fn held_batch(k: usize, now: i64, counted: &[Event]) -> Vec<Event> {
    let mut out: Vec<Event> = [0, 6, 9, 11].map(|i| counted[i].clone()).into();
    out.extend([
        tip(&format!("k{k}a"), now - 700, "r3", "ivy", 2),
        tip(&format!("k{k}b"), now - 600, "r1", "joe", 1),
        points(&format!("k{k}c"), now - 30_000, "p4", 3),
    ]);
    out
}

/// A change of a feed as its SSE event carries it.
fn change_of(event: &SseEvent) -> Change {
    let data = json(&event.data);
    let text = |f: &str| data[f].as_str().unwrap_or_default().to_string();
    Change {
        kind: text("kind"),
        member: text("member"),
        rank: data["rank"].as_u64().expect("rank") as usize,
        total: data["total"].as_i64().expect("total"),
        passed: data["passed"].as_str().map(str::to_string),
        cause: text("cause"),
    }
}

/// A letter of the dead-letter stream with `field` set to `value` (the operator's
/// correction), as the fields to append.
fn corrected(
    letter: &std::collections::HashMap<String, String>,
    field: &str,
    value: &str,
) -> Fields {
    let mut fields: Fields = letter.clone().into_iter().collect();
    fields.sort();
    for (name, v) in &mut fields {
        if name == field {
            *v = value.into();
        }
    }
    fields
}

/// `rollboard dead-letters replay` with `config`, which exits 1 (a letter is still
/// refused); its report.
fn replay_letters(config: &Path) -> String {
    let out = rollboard(Some(config), &["dead-letters", "replay"], &[]);
    let report = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert_nothing_denied(&stderr(&out), "dead-letters replay");
    report
}

/// Runs `rollboard <args>` with `config`, which must exit 0 and say nothing of a denied
/// permission; its standard output.
fn run_ok(config: &Path, args: &[&str]) -> String {
    let out = rollboard(Some(config), args, &[]);
    assert!(
        out.status.success(),
        "rollboard {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_nothing_denied(&stderr(&out), &format!("rollboard {args:?}"));
    stdout(&out)
}

/// Every `cmdstat_<command>` of the server with rejected calls, with their count.
fn rejected_commands(redis: &RedisServer) -> Vec<(String, u64)> {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let rejected = stats
                .split(',')
                .find_map(|s| s.strip_prefix("rejected_calls="))?
                .parse::<u64>()
                .ok()?;
            (rejected > 0).then(|| (name.to_string(), rejected))
        })
        .collect()
}

/// What the test holds from one phase to the next.
struct Run {
    redis: RedisServer,
    /// The serverless user's URL.
    url: String,
    /// A store connected as the serverless user.
    store: Store,
    dir: tempfile::TempDir,
    /// Redis's clock at the start.
    t0: i64,
    /// The zone of `today`'s days.
    zone: &'static str,
    models: Models,
    /// The followed change feeds, as [`FEEDS`] lists them.
    feeds: Vec<Followed>,
    /// The tasks following them on the current daemon.
    following: Vec<tokio::task::JoinHandle<()>>,
}

impl Run {
    /// A redis-server with the serverless user, and the models of the boards.
    async fn start() -> Run {
        let redis = RedisServer::start();
        let url = serverless_user(&redis);
        let store = serverless_store(&url).await;
        let t0 = redis_now(&store).await;
        let zone = zone_clear_of_midnight(t0);
        Run {
            models: Models::new(&boards_in_zone(zone)),
            dir: tempfile::tempdir().expect("dir"),
            feeds: FEEDS.iter().map(|_| Followed::default()).collect(),
            following: Vec::new(),
            redis,
            url,
            store,
            t0,
            zone,
        }
    }

    /// A daemon as consumer `consumer`, every feed followed on it; its configuration.
    async fn daemon(&mut self, consumer: &str) -> (Daemon, PathBuf) {
        let (daemon, config) = start_daemon(self.dir.path(), &self.url, consumer, self.zone).await;
        daemon.wait_log("redis.scripts = auto").await;
        for (feed, (_, path)) in self.feeds.iter().zip(FEEDS) {
            self.following.push(feed.follow(&daemon, path).await);
        }
        (daemon, config)
    }

    /// Redis's clock.
    async fn now(&self) -> i64 {
        redis_now(&self.store).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serverless_user_counts_every_path_exactly() {
    let started = Instant::now();
    let mut run = Run::start().await;
    let (a, config_a) = run.daemon("a").await;
    assert_evalsha_and_nothing_denied(&a.logs(), "daemon a");
    let counted = ingest_every_way(&mut run, &a, &config_a).await;
    let log_a = kill_holding_a_batch(&mut run, a, &counted).await;
    let (b, config_b) = run.daemon("b").await;
    assert_drained(&run.store, &b, "after the claim").await;
    replay_corrected_letters(&mut run, &config_b).await;

    // Rolls: the tip of the hour's oldest slice and the points of now leave their
    // windows; verify and rebuild, as the serverless user, find and change nothing.
    let t0 = run.t0;
    let past = wait_for(Duration::from_secs(30), || async {
        run.now().await > t0 + EXPIRES_AFTER + 2_000
    })
    .await;
    assert!(past, "Redis's clock stands still");
    let now = run.now().await;
    run.models.roll(now);
    let rankings = run.models.rankings();
    tops_converge(&b, &rankings, "after the rolls").await;
    roll_verify_and_rebuild(&config_b);
    tops_converge(&b, &rankings, "after the rebuilds").await;

    assert_every_answer(&b, &config_b, &rankings).await;
    assert_exact_totals(&rankings);
    for (feed, (name, path)) in run.feeds.iter().zip(FEEDS) {
        assert_feed_replays_to(feed, name, path, &rankings).await;
    }
    let narrow = run.feeds[2].events();
    assert!(
        narrow
            .iter()
            .map(change_of)
            .any(|c| c.kind == "left" && c.cause == "roll"),
        "duo 4s: no member left by a roll: {narrow:?}"
    );
    let log_b = b.log.clone();
    assert!(b.terminate().await.success(), "daemon b's exit");
    assert_what_the_server_ran(&run.redis);
    assert_evalsha_and_nothing_denied(&log_a, "daemon a");
    let log_b = std::fs::read_to_string(log_b).expect("daemon b's log");
    assert_evalsha_and_nothing_denied(&log_b, "daemon b");
    eprintln!(
        "serverless: {:.1} s on {}",
        started.elapsed().as_secs_f32(),
        server_version(&run.redis)
    );
}

/// `field` of `event` set to `value`: the event made malformed.
fn with(event: Event, field: &str, value: &str) -> Fields {
    let mut fields = event.fields();
    for (name, v) in &mut fields {
        if name == field {
            *v = value.into();
        }
    }
    fields
}

/// Ingest by every way in, as the daemon `a` (configuration `config`) takes it: tips and
/// points on the stream (some malformed), on the HTTP intake and by `rollboard send`, then
/// every one of them again under its own id, by the same way. The events counted.
async fn ingest_every_way(run: &mut Run, a: &Daemon, config: &Path) -> Vec<Event> {
    let (store, t0) = (&run.store, run.t0);
    // Four tips of r1 tied at 10 once the corrected letter is replayed (ann earliest;
    // dan, cy and bob at one time, by name); a tip of the hour's oldest slice that a roll
    // soon drops; points now (live in the 4 s window for a few seconds), 30 s ago (the
    // hour only) and ahead of the clock (both windows, tied: the later first).
    let streamed = vec![
        tip("t1", t0 - 3_000, "r1", "ann", 10),
        tip("t2", t0 - 2_000, "r1", "bob", 10),
        tip("t3", t0 - 2_000, "r1", "cy", 10),
        tip("t4", t0 - 2_500, "r1", "dan", 4),
        tip("t5", t0 - HOUR + EXPIRES_AFTER, "r2", "eve", 50),
        tip("t6", t0 - 1_000, "r2", "ann", 3),
        points("d1", t0, "p1", 5),
        points("d2", t0, "p2", 3),
        points("d3", t0 - 30_000, "p3", 7),
        points("d4", t0 + AHEAD, "f1", 2),
        points("d5", t0 + AHEAD + 500, "f2", 2),
    ];
    // An amount that is no number, points with a fraction the board does not take, an
    // event of no board.
    let malformed = [
        with(tip("bad-1", t0 - 2_000, "r1", "dan", 3), "amount", "x"),
        with(points("bad-2", t0 - 30_000, "p9", 2), "points", "1.5"),
        vec![
            ("id".into(), "bad-3".into()),
            ("color".into(), "red".into()),
        ],
    ];
    append(store, &streamed).await;
    xadd_all(store.client(), intake_stream(), &malformed).await;
    run.models.apply_all(&streamed, run.now().await);
    let posted = vec![
        tip("h1", t0 - 900, "r2", "gus", 6),
        tip("h2", t0 - 900, "r2", "fay", 6),
        points("h3", t0 - 40_000, "p3", 1),
    ];
    let bodies: Vec<Fields> = posted.iter().map(Event::fields).collect();
    assert_eq!(post_events(&a.base, &bodies).await, 202);
    run.models.apply_all(&posted, run.now().await);
    let sent = vec![
        tip("s1", t0 - 2_200, "r1", "dan", 3),
        tip("s2", t0 - 800, "r3", "hal", 5),
    ];
    let lines: String = sent.iter().map(Event::json_line).collect();
    let out = send(config, None, lines.as_bytes());
    assert!(out.status.success(), "send: {}", stderr(&out));
    run.models.apply_all(&sent, run.now().await);

    append(store, &streamed).await;
    assert_eq!(post_events(&a.base, &bodies).await, 202);
    let out = send(config, None, lines.as_bytes());
    assert!(out.status.success(), "send again: {}", stderr(&out));
    assert_drained(store, a, "after the redeliveries").await;
    streamed.into_iter().chain(posted).collect()
}

/// The daemon `a` killed holding a batch (new events, and copies of `counted` ones): frozen
/// while its blocked read is served, so that the batch is pending on it. Its log; every
/// feed it served has ended.
async fn kill_holding_a_batch(run: &mut Run, a: Daemon, counted: &[Event]) -> String {
    let mut tries = 0;
    loop {
        a.freeze(true);
        let now = run.now().await;
        let batch = held_batch(tries, now, counted);
        append_at_once(&run.store, &batch).await;
        run.models.apply_all(&batch, now);
        let held = wait_for(Duration::from_millis(500), || async {
            pending(&run.store).await > 0
        })
        .await;
        if held {
            break;
        }
        a.freeze(false);
        assert_drained(&run.store, &a, "a try at a held batch").await;
        tries += 1;
        assert!(tries < 20, "the frozen daemon never held a batch");
    }
    let log = a.logs();
    a.kill().await;
    for task in run.following.drain(..) {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("a feed of the killed daemon ends")
            .expect("follower");
    }
    log
}

/// The two malformed amounts corrected by the operator (a fixed copy in, the bad letter
/// out) and replayed as the serverless user, once; the event of no board stays.
async fn replay_corrected_letters(run: &mut Run, config: &Path) {
    let (store, t0) = (&run.store, run.t0);
    let dead = letters(store).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, l)| l["reason"].as_str()).collect();
    assert_eq!(reasons, ["amount", "amount", "no_board"], "{dead:?}");
    let mut fixed_letters = Vec::new();
    for ((id, letter), (field, value)) in dead.iter().zip([("amount", "3"), ("points", "2")]) {
        let fixed = corrected(letter, field, value);
        let _: String = store
            .client()
            .xadd(dead_letter_stream(), false, None, "*", fixed.clone())
            .await
            .expect("xadd the fix");
        let _: i64 = store
            .client()
            .xdel(dead_letter_stream(), id.as_str())
            .await
            .expect("xdel");
        fixed_letters.push(fixed);
    }
    let report = replay_letters(config);
    assert!(
        report.contains("replayed 2, already counted 0, still refused 1"),
        "{report}"
    );
    let fixed = [
        tip("bad-1", t0 - 2_000, "r1", "dan", 3),
        points("bad-2", t0 - 30_000, "p9", 2),
    ];
    let now = run.now().await;
    run.models.apply_all(&fixed, now);
    // A fixed letter back, as a crash between its apply and its delete leaves it.
    let _: String = store
        .client()
        .xadd(
            dead_letter_stream(),
            false,
            None,
            "*",
            fixed_letters[0].clone(),
        )
        .await
        .expect("xadd the fix again");
    let report = replay_letters(config);
    assert!(
        report.contains("replayed 0, already counted 1, still refused 1"),
        "{report}"
    );
    let left = letters(store).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1["reason"], "no_board");
    let listed = run_ok(config, &["dead-letters", "list", "--json"]);
    let listed: Vec<Value> = listed.lines().map(json).collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["reason"], "no_board", "{listed:?}");
}

/// `roll` (the jobs once more, by hand), `verify`, `rebuild` of every board and `verify
/// --strict` as the serverless user: no instance differs.
fn roll_verify_and_rebuild(config: &Path) {
    let clean = "0 differing (0 member(s)), 0 failing";
    run_ok(config, &["roll"]);
    let verified = run_ok(config, &["verify"]);
    assert!(verified.contains(clean), "{verified}");
    for name in ["fans", "duo", "rooms", "today"] {
        let rebuilt = run_ok(config, &["rebuild", name]);
        assert!(
            rebuilt.contains(&format!("instance(s) of {name}: 0 repaired")),
            "{rebuilt}"
        );
    }
    let verified = run_ok(config, &["verify", "--strict"]);
    assert!(verified.contains(clean), "{verified}");
}

/// Every query of every ranking over HTTP, `duo`'s members in every window, and every
/// command of one ranking of each board and window (the command line answers as HTTP does;
/// each run is a process of its own); the boards' descriptions, the probes and the
/// metrics.
async fn assert_every_answer(daemon: &Daemon, config: &Path, rankings: &[Ranking]) {
    for path in ["/v1/boards", "/v1/boards/today", "/readyz", "/metrics"] {
        daemon.get_answering(path, 200).await;
    }
    for ranking in rankings {
        if let Err(e) = http_answers_match(daemon, ranking).await {
            panic!("{}: {e}", ranking.label());
        }
    }
    assert_duo_in_every_window(daemon, rankings).await;
    for ranking in rankings.iter().filter(|r| r.scope.as_deref() != Some("r2")) {
        if let Err(e) = cli_answers_match(config, ranking) {
            panic!("{}: {e}", ranking.label());
        }
    }
}

/// The server ran the scripts by `EVALSHA` only, no `WAIT` or `ROLE`, and refused nothing:
/// `auto` asked for the user's permissions without sending what they deny.
fn assert_what_the_server_ran(redis: &RedisServer) {
    for command in ["fcall", "fcall_ro", "function|load", "wait", "role"] {
        assert_eq!(command_calls(redis, command), 0, "{command} was run");
    }
    assert!(command_calls(redis, "evalsha") > 0, "no EVALSHA was run");
    let rejected = rejected_commands(redis);
    assert!(
        rejected.is_empty(),
        "refused commands: {rejected:?}; ACL LOG:\n{}",
        redis.cli(&["ACL", "LOG"])
    );
}

/// The server's name and version, as `INFO server` gives them.
fn server_version(redis: &RedisServer) -> String {
    let info = redis.cli(&["INFO", "server"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    match (field("valkey_version:"), field("redis_version:")) {
        (Some(v), _) => format!("valkey {v}"),
        (None, Some(v)) => format!("redis {v}"),
        _ => "an unknown server".into(),
    }
}

/// `duo`'s members answered in every window at once, as each window's model ranks them.
async fn assert_duo_in_every_window(daemon: &Daemon, rankings: &[Ranking]) {
    let windows: Vec<&Ranking> = rankings.iter().filter(|r| r.board == "duo").collect();
    let mut members: Vec<String> = windows.iter().flat_map(|r| r.members()).collect();
    members.sort();
    members.dedup();
    for member in members {
        let path = format!("/v1/boards/duo/members/{member}?all_windows=true");
        let (status, _, body) = crate::support::http::get(daemon, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let answer = json(&body);
        for (got, ranking) in answer["windows"]
            .as_array()
            .expect("windows")
            .iter()
            .zip(&windows)
        {
            assert_eq!(got["window"], ranking.window.expect("a window"), "{body}");
            let at = ranking.ranked.position(&member);
            let want = at.map(|i| ranking.ranked.entry(i));
            assert_eq!(
                got["rank"].as_u64(),
                want.as_ref().map(|e| e.rank),
                "{path}: {body}"
            );
            assert_eq!(
                got["total"].as_i64(),
                want.as_ref().map(|e| e.total),
                "{path}: {body}"
            );
        }
    }
}

/// The totals the events make, redeliveries counted once: spelled out, beside the model.
fn assert_exact_totals(rankings: &[Ranking]) {
    let rows = |board: &str, scope: Option<&str>, window: Option<&str>| -> Vec<(String, i64)> {
        let ranking = rankings
            .iter()
            .find(|r| r.board == board && r.scope.as_deref() == scope && r.window == window)
            .unwrap_or_else(|| panic!("{board} {scope:?} {window:?}"));
        ranking
            .ranked
            .rows
            .iter()
            .map(|(m, t, _)| (m.clone(), *t))
            .collect()
    };
    let owned = |list: &[(&str, i64)]| -> Vec<(String, i64)> {
        list.iter().map(|(m, t)| (m.to_string(), *t)).collect()
    };
    // Four at 10: ann the earliest, then dan, cy and bob at one time, by name.
    let r1 = rows("fans", Some("r1"), None);
    assert_eq!(
        r1[..4],
        owned(&[("ann", 10), ("dan", 10), ("cy", 10), ("bob", 10)])[..],
        "{r1:?}"
    );
    // eve's 50 left with the hour's oldest slice; gus and fay tied at one time, by name.
    assert_eq!(
        rows("fans", Some("r2"), None),
        owned(&[("gus", 6), ("fay", 6), ("ann", 3)])
    );
    // The points ahead of the clock, tied: the later first.
    assert_eq!(
        rows("duo", None, Some("4s")),
        owned(&[("f2", 2), ("f1", 2)])
    );
    let wide = rows("duo", None, Some("1h"));
    for counted in owned(&[("p3", 8), ("p1", 5), ("p2", 3), ("p9", 2), ("f1", 2)]) {
        assert!(wide.contains(&counted), "{counted:?} in {wide:?}");
    }
    // eve's 50 still counts in the day.
    let day = rows("today", None, None);
    assert!(day.contains(&("eve".to_string(), 50)), "{day:?}");
}

/// Waits until the feed `name`, replayed from empty, is the top of its ranking; checks
/// that no event came twice and none is a reset.
async fn assert_feed_replays_to(feed: &Followed, name: &str, path: &str, rankings: &[Ranking]) {
    let ranking = rankings
        .iter()
        .find(|r| {
            let query = path.split_once('?').map_or("", |(_, q)| q);
            path.contains(&format!("/{}/", r.board))
                && r.scope
                    .as_ref()
                    .is_none_or(|s| query.contains(&format!("scope={s}")))
                && r.window
                    .is_none_or(|w| query.contains(&format!("window={w}")))
        })
        .unwrap_or_else(|| panic!("a ranking for {path}"));
    let want: Vec<String> = ranking.members().into_iter().take(3).collect();
    let top = std::cell::RefCell::new(Vec::new());
    let replayed = wait_for(Duration::from_secs(10), || async {
        let changes: Vec<Change> = feed.events().iter().map(change_of).collect();
        let mut replayed = Vec::new();
        replay(&mut replayed, &changes, 3);
        let done = replayed == want;
        *top.borrow_mut() = replayed;
        done
    })
    .await;
    let top = top.into_inner();
    let events = feed.events();
    assert!(
        replayed,
        "{name}: the feed replays to {top:?}, the top is {want:?}; events: {events:#?}"
    );
    let mut ids: Vec<&str> = events.iter().filter_map(|e| e.id.as_deref()).collect();
    assert!(events.iter().all(|e| e.event.as_deref() != Some("reset")));
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "{name}: an event came twice");
}
