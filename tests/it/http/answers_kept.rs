//! Answers kept, and HTTP caching (docs/api.md, *Answers kept, and HTTP caching*), as
//! readers meet them. While many readers hammer every query route (some revalidating with
//! `If-None-Match`), applies, redeliveries, rolls and a rebuild run one after another, and
//! every answer must be one the board held, whole body and `as_of` included: exactly the
//! board's state after every write of a store sharing the API's write counters, and at
//! most `http.max_staleness` old after a write of another process (a property against the
//! in-memory model). Then, one at a time: `ETag`s name equal bodies and `If-None-Match`
//! answers 304 (never to a POST); `Cache-Control` follows `http.max_staleness` and the
//! reader's token; the answers' metrics count one miss, then hits, and waits for
//! concurrent first reads; the daemon's own ingest and rolls show at once, a member not on
//! the board is kept until its tip is applied, other processes' writes (a store, the
//! command line's `roll`, `rebuild` and `drop-board`) show within `http.max_staleness`;
//! sharded, several-window, period and scoped boards answer from what is kept and show
//! the daemon's writes at once; and what is kept weighs at most `http.cache_bytes`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, TieBreak};
use rollboard::domain::clock::Clock;
use rollboard::store::{ApplyEvent, Generations, Store};
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::answers::{
    answer_sources, apply_now, ask, clear_of_the_hour, held_gauges, kept_daemon, sample, scrape,
    server_holding, tip_applied, totals_of, Answered, Api, ALL_JOBS, ROOMS_BOARD,
};
use crate::support::boards::{
    amount_for, apply_events, apply_model, ev, redis_now, roll_board, HOUR,
};
use crate::support::cli::{assert_exit, run_rollboard, text};
use crate::support::config::{board_of, write_file};
use crate::support::daemon::Daemon;
use crate::support::env::env_count;
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::{proptest_runner, threaded_runtime_with_store, SplitMix};
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

const MINUTE: i64 = 60_000;
const QUARTER: i64 = 15 * MINUTE;

/// How much later than `http.max_staleness` a write of another process may show in the
/// focused tests (requests on a loaded two-core machine).
const SHOW_MARGIN: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------
// Fixtures of this module (the rest are support's: the API served in this process,
// requests and their answers, metrics, daemons whose jobs never tick).
// ---------------------------------------------------------------------------------------

/// A fresh server, a store on it (counting its writes apart from the daemon's: another
/// process's), and a daemon with the `[http]` lines `http` (boards may follow them) and
/// the environment `env`; with `quiet`, its jobs never tick.
async fn daemon_on(
    http: &str,
    quiet: bool,
    env: &[(&str, String)],
) -> (RedisServer, Store, TempDir, PathBuf, Daemon) {
    let (redis, store) = server_holding(if quiet { ALL_JOBS } else { &[] }).await;
    let (dir, config, _, daemon) = kept_daemon(&redis.url(), http, None, env).await;
    (redis, store, dir, config, daemon)
}

/// The top 10 of the unscoped `board` read from Redis now, bypassing any answer kept: the
/// body the API gives for it.
async fn direct_top(store: &Store, board: &Board) -> Vec<u8> {
    let now = redis_now(store).await;
    let page = store
        .top(&board.widest(), None, 0, 10, now)
        .await
        .expect("top");
    serde_json::to_vec(&json!(page)).expect("JSON")
}

/// Polls `url` until its answer satisfies `shown`, which must happen within `bound` of
/// `written` (the end of a write by another process).
async fn shows_within(
    client: &reqwest::Client,
    url: &str,
    written: Instant,
    bound: Duration,
    what: &str,
    shown: impl Fn(&Value) -> bool,
) {
    let last = std::cell::RefCell::new(String::new());
    let showed = wait_for(bound + Duration::from_secs(5), || async {
        let answer = ask(client.get(url)).await;
        *last.borrow_mut() = answer.text();
        answer.status == 200 && shown(&answer.json())
    })
    .await;
    let took = written.elapsed();
    assert!(showed, "{what} never showed: {}", last.borrow());
    assert!(
        took <= bound,
        "{what} showed {took:?} after the write, beyond http.max_staleness and a margin ({bound:?})"
    );
}

// ---------------------------------------------------------------------------------------
// The property: every answer is one the board held, while writes and many readers run.
// ---------------------------------------------------------------------------------------

/// The members that take events (the first `Case::members` of them), and one never seen.
const MEMBERS: [&str; 6] = ["m0", "m1", "m2", "m3", "m4", "m5"];
const NOBODY: &str = "nobody";

/// Concurrent readers; the odd ones revalidate with the last `ETag` they got.
const READERS: u64 = 8;

/// One query the readers send, to the board `kept`.
#[derive(Debug, Clone)]
enum Spec {
    Top { offset: u64, limit: u64 },
    Rank(&'static str),
    Around(&'static str, u64),
    Windows(&'static str),
    Ranks(Vec<&'static str>),
}

impl Spec {
    /// Every query of a case whose first `members` members take events.
    fn all(members: usize) -> Vec<Spec> {
        let mut out = vec![
            Spec::Top {
                offset: 0,
                limit: 10,
            },
            Spec::Top {
                offset: 1,
                limit: 2,
            },
        ];
        for m in MEMBERS[..members].iter().copied().chain([NOBODY]) {
            out.push(Spec::Rank(m));
            out.push(Spec::Around(m, 1));
        }
        out.push(Spec::Windows(MEMBERS[0]));
        out.push(Spec::Ranks(vec![
            MEMBERS[1], NOBODY, MEMBERS[0], MEMBERS[2],
        ]));
        out
    }

    fn path(&self) -> String {
        match self {
            Spec::Top { offset, limit } => format!("/top?offset={offset}&limit={limit}"),
            Spec::Rank(m) => format!("/members/{m}"),
            Spec::Around(m, radius) => format!("/members/{m}/around?radius={radius}"),
            Spec::Windows(m) => format!("/members/{m}?all_windows=true"),
            Spec::Ranks(members) => format!("/ranks {members:?}"),
        }
    }

    /// The request, with `If-None-Match: sent` when given (on the POST too: it must be
    /// ignored there).
    fn request(
        &self,
        client: &reqwest::Client,
        base: &str,
        sent: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let board = format!("{base}/v1/boards/kept");
        let request = match self {
            Spec::Ranks(members) => client
                .post(format!("{board}/ranks"))
                .json(&json!({ "members": members })),
            _ => client.get(format!("{board}{}", self.path())),
        };
        match sent {
            Some(tag) => request.header("if-none-match", tag),
            None => request,
        }
    }

    /// The status and body the API answers this query with, read from Redis at `now`
    /// through the store (no answer kept): as the handlers write them.
    async fn expected(&self, store: &Store, b: &Board, now: i64) -> (u16, Vec<u8>) {
        let (status, value) = match self {
            Spec::Top { offset, limit } => {
                let page = store.top(&b.widest(), None, *offset, *limit, now).await;
                (200, json!(page.expect("top")))
            }
            Spec::Rank(m) => {
                let rank = store.rank(&b.widest(), None, m, now).await.expect("rank");
                match rank.is_ranked() {
                    true => (200, json!(rank)),
                    false => (404, rank.not_on_board()),
                }
            }
            Spec::Around(m, radius) => match store.around(&b.widest(), None, m, *radius, now).await
            {
                Ok(Ok(page)) => (200, json!(page)),
                Ok(Err(missing)) => (404, missing.not_on_board()),
                Err(e) => panic!("around: {e}"),
            },
            Spec::Windows(m) => {
                let windows = store.rank_in_windows(b, None, m, now).await;
                (200, json!(windows.expect("all windows")))
            }
            Spec::Ranks(members) => {
                let subset = store.ranks(&b.widest(), None, members, now).await;
                (200, json!(subset.expect("ranks")))
            }
        };
        (status, serde_json::to_vec(&value).expect("JSON"))
    }
}

/// One write of a case.
#[derive(Debug, Clone)]
enum Op {
    /// New events: (member, amount, minutes before now); `echo`: the first sent again at
    /// the end of the batch.
    Tips(Vec<(usize, i64, i64)>, bool),
    /// A batch applied before (the `k`-th, modulo), again with its ids.
    Redeliver(usize),
    /// Time moves on this many quarter hours, and the board is rolled.
    Roll(i64),
    /// The ranking recomputed from the slices (`rollboard::roll::rebuild`).
    Rebuild,
}

#[derive(Debug, Clone)]
struct Case {
    negative: bool,
    tie: TieBreak,
    members: usize,
    ops: Vec<Op>,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    let tips = (
        prop::collection::vec((0usize..6, -9i64..=9, 0i64..300), 1..=4),
        any::<bool>(),
    )
        .prop_map(|(events, echo)| Op::Tips(events, echo));
    let op = prop_oneof![
        5 => tips,
        1 => (0usize..8).prop_map(Op::Redeliver),
        2 => (1i64..=6).prop_map(Op::Roll),
        1 => Just(Op::Rebuild),
    ];
    (
        any::<bool>(),
        prop_oneof![
            Just(TieBreak::Earliest),
            Just(TieBreak::Latest),
            Just(TieBreak::None)
        ],
        3usize..=6,
        prop::collection::vec(op, 6..=12),
        any::<u64>(),
    )
        .prop_map(|(negative, tie, members, ops, seed)| Case {
            negative,
            tie,
            members,
            ops,
            seed,
        })
}

/// Whose write counters the API reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Writer {
    /// The writing store's: its writes are this process's (contract 2, exact).
    Shared,
    /// Fresh ones: the writes are another process's (contract 3, within max_staleness).
    Foreign,
}

impl Writer {
    /// `http.max_staleness` of the API.
    fn max_staleness(self) -> Duration {
        match self {
            // Long: only the counters can make an answer new.
            Writer::Shared => Duration::from_secs(60),
            Writer::Foreign => Duration::from_millis(200),
        }
    }

    /// How much older than the request's start an answer's state may be: none with shared
    /// counters; `http.max_staleness` and a little margin (the time between a read of
    /// Redis and the answer being kept) with foreign writes.
    fn allowed(self) -> Duration {
        match self {
            Writer::Shared => Duration::ZERO,
            Writer::Foreign => self.max_staleness() + Duration::from_millis(250),
        }
    }
}

/// One state of the board: what the write that made it did, when it started and ended,
/// and the answer to every query in it.
struct State {
    start: Instant,
    end: Instant,
    /// A roll: Redis shows its steps (watermark first, then each slice expired) one by one.
    roll: bool,
    what: String,
    answers: Vec<(u16, Vec<u8>)>,
}

/// One read of a reader.
struct Read {
    spec: usize,
    start: Instant,
    end: Instant,
    sent: Option<String>,
    got: Answered,
}

/// The latest start of a read done so far, as nanoseconds after `origin`.
struct Progress {
    origin: Instant,
    latest_start: AtomicU64,
}

impl Progress {
    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Whether a read that started after `t` has been answered.
    fn read_after(&self, t: Instant) -> bool {
        self.latest_start.load(Ordering::SeqCst) > self.nanos(t)
    }
}

/// A reader: queries picked at random (from `seed`) until `stop`, revalidating with the
/// last `ETag` of each when `revalidate`; every read.
async fn reader(
    client: reqwest::Client,
    base: String,
    specs: Arc<Vec<Spec>>,
    seed: u64,
    revalidate: bool,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
) -> Vec<Read> {
    let mut random = SplitMix(seed);
    let mut last: HashMap<usize, String> = HashMap::new();
    let mut reads = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let spec = (random.next() % specs.len() as u64) as usize;
        let sent = last.get(&spec).filter(|_| revalidate).cloned();
        let start = Instant::now();
        let got = ask(specs[spec].request(&client, &base, sent.as_deref())).await;
        let end = Instant::now();
        progress
            .latest_start
            .fetch_max(progress.nanos(start), Ordering::SeqCst);
        if let (200, Some(tag)) = (got.status, got.etag()) {
            last.insert(spec, tag.to_string());
        }
        reads.push(Read {
            spec,
            start,
            end,
            sent,
            got,
        });
    }
    reads
}

/// The board's answers now, read through the store: the model is checked first (the
/// ranking, every rank), then every query's answer is read.
async fn observe(
    store: &Store,
    b: &Board,
    model: &Instance,
    specs: &[Spec],
    clock: &Clock,
) -> Vec<(u16, Vec<u8>)> {
    let now = clock.now();
    assert_matches(store, &b.widest(), None, model, now).await;
    let mut answers = Vec::with_capacity(specs.len());
    for spec in specs {
        answers.push(spec.expected(store, b, now).await);
    }
    answers
}

/// What a roll's steps have in common with the state it ends in: the `as_of` (its time,
/// written with the watermark, its first step) and the window, of the answer or of each
/// of its windows.
fn roll_stamp(body: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let stamp = |w: &Value| json!([w["as_of"], w["window_from"], w["window_to"]]);
    Some(match v["windows"].as_array() {
        Some(windows) => Value::Array(windows.iter().map(stamp).collect()),
        None => stamp(&v),
    })
}

/// What a case's reads showed, summed over the cases.
#[derive(Debug, Default)]
struct Seen {
    reads: usize,
    not_modified: usize,
    /// Answers of a state older than the newest one at the request's start (allowed only
    /// after a foreign write).
    older: usize,
    /// Answers of a roll's intermediate step.
    mid_roll: usize,
    hits: f64,
}

impl Seen {
    fn add(&mut self, other: Seen) {
        self.reads += other.reads;
        self.not_modified += other.not_modified;
        self.older += other.older;
        self.mid_roll += other.mid_roll;
        self.hits += other.hits;
    }
}

/// Checks every read against the states: its body (or, for a 304, the body its
/// `If-None-Match` named) is the answer of a state that was current at some time from
/// `allowed` before the read started to its end, or of a step of a roll running then.
/// Equal `ETag`s name equal bodies and the reverse.
fn check(reads: &[Read], states: &[State], specs: &[Spec], writer: Writer, seen: &mut Seen) {
    let allowed = writer.allowed();
    let origin = states[0].start;
    let ms = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e3;
    let mut bodies: HashMap<&str, &[u8]> = HashMap::new();
    let mut tags: HashMap<&[u8], &str> = HashMap::new();
    for read in reads.iter().filter(|r| r.got.status == 200) {
        let path = specs[read.spec].path();
        let tag = read
            .got
            .etag()
            .unwrap_or_else(|| panic!("{path}: a 200 without an ETag"));
        assert!(
            tag.len() > 2 && tag.starts_with('"') && tag.ends_with('"'),
            "{path}: ETag {tag} is not a strong entity tag"
        );
        let body = read.got.body.as_slice();
        if let Some(other) = bodies.insert(tag, body) {
            assert_eq!(
                text(other),
                text(body),
                "{path}: one ETag {tag}, two bodies"
            );
        }
        if let Some(other) = tags.insert(body, tag) {
            assert_eq!(other, tag, "{path}: one body, two ETags: {}", text(body));
        }
    }
    for read in reads {
        let spec = &specs[read.spec];
        let path = spec.path();
        let (status, body): (u16, &[u8]) = match read.got.status {
            200 | 404 => (read.got.status, &read.got.body),
            304 => {
                assert!(
                    !matches!(spec, Spec::Ranks(_)),
                    "{path}: a POST answered 304"
                );
                assert!(read.got.body.is_empty(), "{path}: a 304 with a body");
                let sent = read
                    .sent
                    .as_deref()
                    .unwrap_or_else(|| panic!("{path}: a 304 without If-None-Match"));
                assert_eq!(read.got.etag(), Some(sent), "{path}: the 304's ETag");
                let named = bodies
                    .get(sent)
                    .unwrap_or_else(|| panic!("{path}: a 304 for {sent}, which no answer had"));
                seen.not_modified += 1;
                (200, named)
            }
            other => panic!("{path}: answered {other}: {}", read.got.text()),
        };
        let lo = read.start.checked_sub(allowed).unwrap_or(origin);
        let hi = read.end;
        let answer = (status, body.to_vec());
        let current =
            |j: usize| states[j].start < hi && states.get(j + 1).is_none_or(|next| next.end >= lo);
        let held = (0..states.len()).any(|j| current(j) && states[j].answers[read.spec] == answer);
        let mid_roll = !held
            && (1..states.len()).any(|j| {
                let s = &states[j];
                s.roll
                    && s.start < hi
                    && s.end >= lo
                    && roll_stamp(body).is_some()
                    && roll_stamp(body) == roll_stamp(&s.answers[read.spec].1)
            });
        if !(held || mid_roll) {
            let mut states_text = String::new();
            for (j, s) in states.iter().enumerate() {
                let (st, b) = &s.answers[read.spec];
                states_text.push_str(&format!(
                    "\n  state {j} ({}, {:.1}..{:.1} ms{}): {st} {}",
                    s.what,
                    ms(s.start),
                    ms(s.end),
                    if current(j) { ", current then" } else { "" },
                    text(b)
                ));
            }
            panic!(
                "{writer:?} counters: {path} read {:.1}..{:.1} ms (states from {:.1} ms allowed) \
                 answered {} (If-None-Match {:?}) {status} {}, the answer of no state current \
                 then:{states_text}",
                ms(read.start),
                ms(read.end),
                ms(lo),
                read.got.status,
                read.sent,
                text(body),
            );
        }
        seen.reads += 1;
        seen.mid_roll += usize::from(mid_roll);
        let newest = states
            .iter()
            .rposition(|s| s.end <= read.start)
            .unwrap_or(0);
        let fresh =
            (newest..states.len()).any(|k| current(k) && states[k].answers[read.spec] == answer);
        if !mid_roll && !fresh {
            seen.older += 1;
        }
    }
}

/// The board of a case, as configured.
fn kept_board(case: &Case) -> String {
    format!(
        "[[boards]]\nname = \"kept\"\nmember = \"user\"\nwindow = \"4h\"\nslice = \"1h\"\n\
         tie_break = \"{}\"\nallow_negative = {}\n",
        case.tie.as_str(),
        case.negative
    )
}

/// Runs `case` against a fresh API reading `writer`'s counters: the writes one after
/// another, each followed by the board's answers read through the store (checked against
/// the model), while [`READERS`] readers query the API; then every read is checked.
async fn run_case(redis: &RedisServer, store: &Store, case: &Case, writer: Writer) -> Seen {
    let generations = match writer {
        Writer::Shared => store.generations().clone(),
        Writer::Foreign => Arc::new(Generations::new()),
    };
    let http = format!(
        "max_staleness = \"{}ms\"",
        writer.max_staleness().as_millis()
    );
    let api = Api::counting(&redis.url(), store, &http, &kept_board(case), generations).await;
    let b = api.board("kept");
    let specs = Arc::new(Spec::all(case.members));
    let mut model = Instance::default();
    // Time as the writes judge it: ahead of Redis's clock, so that from the first roll the
    // window is the stored watermark's, whatever slice the clock reaches meanwhile (the
    // API answers at Redis's clock).
    let mut now = api.clock.now() + 2 * HOUR;
    let origin = Instant::now();
    roll_board(store, &b, now).await;
    model.roll(&b.widest(), now);
    let answers = observe(store, &b, &model, &specs, &api.clock).await;
    let mut states = vec![State {
        start: origin,
        end: Instant::now(),
        roll: false,
        what: "first roll".into(),
        answers,
    }];

    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress {
        origin,
        latest_start: AtomicU64::new(0),
    });
    let client = reqwest::Client::new();
    let readers: Vec<_> = (0..READERS)
        .map(|r| {
            tokio::spawn(reader(
                client.clone(),
                api.base.clone(),
                specs.clone(),
                case.seed ^ r.wrapping_mul(0x9E37_79B9),
                r % 2 == 1,
                stop.clone(),
                progress.clone(),
            ))
        })
        .collect();

    let mut batches: Vec<Vec<ApplyEvent>> = Vec::new();
    for (i, op) in case.ops.iter().enumerate() {
        let batch = match op {
            Op::Tips(events, echo) => {
                let mut batch: Vec<ApplyEvent> = events
                    .iter()
                    .enumerate()
                    .map(|(k, &(m, amount, back))| {
                        let amount = amount_for(&b, if amount == 0 { 1 } else { amount });
                        let member = MEMBERS[m % case.members];
                        ev(&format!("e{i}-{k}"), now - back * MINUTE, member, amount)
                    })
                    .collect();
                if *echo {
                    batch.push(batch[0].clone());
                }
                Some(batch)
            }
            Op::Redeliver(k) if !batches.is_empty() => Some(batches[k % batches.len()].clone()),
            Op::Redeliver(_) => continue,
            _ => None,
        };
        let start = Instant::now();
        match (op, batch) {
            (_, Some(batch)) => {
                apply_model(store, &b, &mut model, &batch, now).await;
                batches.push(batch);
            }
            (Op::Roll(quarters), None) => {
                now += quarters * QUARTER;
                roll_board(store, &b, now).await;
                model.roll(&b.widest(), now);
            }
            (_, None) => {
                rollboard::roll::rebuild(store, &b.widest(), None, 10)
                    .await
                    .expect("rebuild");
            }
        }
        let end = Instant::now();
        let answers = observe(store, &b, &model, &specs, &api.clock).await;
        let top = answers[0].1.clone();
        states.push(State {
            start,
            end,
            roll: matches!(op, Op::Roll(_)),
            what: format!("{op:?}"),
            answers,
        });
        if writer == Writer::Foreign {
            // Contract 3 on its own: the write shows within max_staleness.
            let url = format!("{}/v1/boards/kept/top?offset=0&limit=10", api.base);
            let bound = writer.max_staleness() + SHOW_MARGIN;
            let shown = wait_for(bound, || async { ask(client.get(&url)).await.body == top }).await;
            assert!(
                shown && end.elapsed() <= bound,
                "{op:?} showed in top only {:?} after it ended",
                end.elapsed()
            );
        }
        // The readers see this state before the next write.
        let read = wait_for(Duration::from_secs(10), || async {
            progress.read_after(end)
        })
        .await;
        assert!(read, "no read began after {op:?}");
    }
    stop.store(true, Ordering::SeqCst);
    let mut reads = Vec::new();
    for r in readers {
        reads.extend(r.await.expect("a reader"));
    }
    let mut seen = Seen::default();
    check(&reads, &states, &specs, writer, &mut seen);
    seen.hits = answer_sources(&client, &api.base).await[0];
    seen
}

/// Runs `cases` cases of the property with `writer`'s counters, each on one server flushed
/// before it, on a multi-thread runtime (the readers' tasks beside the writes); what the
/// reads showed.
fn every_answer_is_one_the_board_held(writer: Writer, cases_n: u32) -> Seen {
    let (rt, redis, store) = threaded_runtime_with_store();
    let seen = std::sync::Mutex::new(Seen::default());
    proptest_runner(cases_n)
        .run(&cases(), |case| {
            let case_seen = rt.block_on(async {
                let _: () = store.client().flushall(false).await.expect("flushall");
                run_case(&redis, &store, &case, writer).await
            });
            seen.lock().expect("the tally").add(case_seen);
            Ok(())
        })
        .expect("every answer is one the board held");
    let seen = seen.into_inner().expect("the tally");
    eprintln!("{writer:?} counters: {seen:?}");
    assert!(seen.reads > 0 && seen.hits > 0.0, "{seen:?}");
    assert!(
        seen.not_modified > 0,
        "no revalidation answered 304: {seen:?}"
    );
    seen
}

#[test]
fn every_answer_is_one_the_board_held_and_own_writes_show_at_once() {
    let cases_n = env_count("ANSWERS_KEPT_CASES", 12) as u32;
    every_answer_is_one_the_board_held(Writer::Shared, cases_n);
}

#[test]
fn every_answer_is_one_the_board_held_within_max_staleness_of_foreign_writes() {
    let cases_n = env_count("ANSWERS_KEPT_FOREIGN_CASES", 6) as u32;
    let seen = every_answer_is_one_the_board_held(Writer::Foreign, cases_n);
    // Kept answers are given after a foreign write, for up to max_staleness.
    assert!(seen.older > 0, "no answer older than the board: {seen:?}");
}

// ---------------------------------------------------------------------------------------
// ETag, If-None-Match, Cache-Control.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_name_equal_bodies_and_if_none_match_answers_304() {
    let (_redis, store, _dir, _config, daemon) = daemon_on("", true, &[]).await;
    clear_of_the_hour(&store, 30_000).await;
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    tip_applied(&store, &daemon, "t2", "r2", "u2", 3).await;
    let client = reqwest::Client::new();
    let base = format!("{}/v1/boards/rooms_7d", daemon.base);
    let mut tagged = Vec::new();
    for path in [
        "/top",
        "/members/r1",
        "/members/r1/around?radius=0",
        "/members/r1?all_windows=true",
    ] {
        let url = format!("{base}{path}");
        let first = ask(client.get(&url)).await;
        assert_eq!(first.status, 200, "{path}: {}", first.text());
        assert_eq!(totals_of(&first.json(), "r1"), [Some(5)], "{path}");
        let tag = first
            .etag()
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{path}: no ETag"));
        assert!(
            tag.len() > 2 && tag.starts_with('"') && tag.ends_with('"'),
            "{path}: {tag} is not a strong entity tag"
        );
        assert_eq!(first.cache_control(), Some("public, max-age=1"), "{path}");
        let again = ask(client.get(&url)).await;
        assert_eq!(
            (again.status, again.etag(), again.text()),
            (200, first.etag(), first.text()),
            "{path} again, the board unchanged"
        );
        for named in [tag.clone(), format!("\"x\", W/{tag}")] {
            let revalidated = ask(client.get(&url).header("if-none-match", &named)).await;
            assert_eq!(
                revalidated.status,
                304,
                "{path} with If-None-Match: {named}: {}",
                revalidated.text()
            );
            assert!(revalidated.body.is_empty(), "{path}: a 304 with a body");
            assert_eq!(revalidated.etag(), Some(tag.as_str()), "{path}");
            assert_eq!(
                revalidated.cache_control(),
                Some("public, max-age=1"),
                "{path}: the 304's Cache-Control"
            );
        }
        let other = ask(client
            .get(&url)
            .header("if-none-match", "\"0123456789abcdef01234567\""))
        .await;
        assert_eq!(
            (other.status, other.text()),
            (200, first.text()),
            "{path}, another ETag"
        );
        tagged.push((path, tag, first.body));
    }
    let distinct: std::collections::HashSet<&String> = tagged.iter().map(|t| &t.1).collect();
    assert_eq!(distinct.len(), tagged.len(), "four bodies, four ETags");

    // A POST is never answered 304, whatever its If-None-Match names.
    let ranks = format!("{base}/ranks");
    let asked = json!({"members": ["r1", "r2", "nobody"]});
    let first = ask(client.post(&ranks).json(&asked)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let tag = first.etag().expect("the ranks answer's ETag").to_string();
    assert_eq!(
        ask(client.post(&ranks).json(&asked)).await.etag(),
        first.etag(),
        "ranks again"
    );
    for named in [tag.clone(), "*".to_string()] {
        let answer = ask(client
            .post(&ranks)
            .json(&asked)
            .header("if-none-match", &named))
        .await;
        assert_eq!(
            (answer.status, answer.etag(), answer.text()),
            (200, first.etag(), first.text()),
            "POST ranks with If-None-Match: {named}"
        );
    }

    // The board changes: the old ETag names a stale body, so the new one is given.
    tip_applied(&store, &daemon, "t3", "r1", "u3", 2).await;
    for (path, old, old_body) in &tagged {
        let url = format!("{base}{path}");
        let changed = ask(client.get(&url).header("if-none-match", old)).await;
        assert_eq!(changed.status, 200, "{path}: {}", changed.text());
        assert_eq!(totals_of(&changed.json(), "r1"), [Some(7)], "{path}");
        assert_ne!(&changed.body, old_body, "{path}");
        let new = changed.etag().expect("the new answer's ETag").to_string();
        assert_ne!(&new, old, "{path}: a new body, a new ETag");
        let revalidated = ask(client.get(&url).header("if-none-match", &new)).await;
        assert_eq!(revalidated.status, 304, "{path} with the new ETag");
    }
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_control_follows_max_staleness_and_the_readers_token() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let reader = "reader-token-kept-7f3a";
    let token_file = write_file(dir.path(), "reader.token", reader);
    let tokened = format!("query_token_file = \"{}\"", token_file.display());
    let client = reqwest::Client::new();
    let mut seeded = false;
    // `keeps`: whether answers are kept (and for long enough that the test counts hits).
    for (http, token, want, keeps) in [
        ("", None, "public, max-age=1", Some(true)),
        (
            "max_staleness = \"2500ms\"",
            None,
            "public, max-age=2",
            Some(true),
        ),
        ("max_staleness = \"200ms\"", None, "public, no-cache", None),
        (
            "max_staleness = \"0s\"",
            None,
            "public, no-cache",
            Some(false),
        ),
        ("cache_bytes = 0", None, "public, max-age=1", Some(false)),
        (
            tokened.as_str(),
            Some(reader),
            "private, max-age=1",
            Some(true),
        ),
    ] {
        let api = Api::sharing(&redis.url(), &store, http, ROOMS_BOARD).await;
        if !seeded {
            let now = api.clock.now();
            let b = api.board("rooms");
            let seed = [ev("s1", now, "r1", 5), ev("s2", now, "r2", 3)];
            apply_events(&store, &b, &seed, now).await;
            seeded = true;
        }
        let authorized = |request: reqwest::RequestBuilder| match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        };
        let board = format!("{}/v1/boards/rooms", api.base);
        for path in ["/top", "/members/r1", "/members/r1/around"] {
            let url = format!("{board}{path}");
            if token.is_some() {
                assert_eq!(ask(client.get(&url)).await.status, 401, "{http}: {path}");
            }
            let first = ask(authorized(client.get(&url))).await;
            assert_eq!(first.status, 200, "{http}: {path}: {}", first.text());
            assert_eq!(first.cache_control(), Some(want), "{http}: {path}");
            let tag = first.etag().expect("an ETag").to_string();
            let revalidated = ask(authorized(client.get(&url)).header("if-none-match", &tag)).await;
            assert_eq!(revalidated.status, 304, "{http}: {path}");
            assert_eq!(
                revalidated.cache_control(),
                Some(want),
                "{http}: {path}, the 304"
            );
        }
        let ranks = ask(authorized(
            client
                .post(format!("{board}/ranks"))
                .json(&json!({"members": ["r2", "r1"]})),
        ))
        .await;
        assert_eq!(ranks.status, 200, "{http}: ranks: {}", ranks.text());
        assert_eq!(ranks.cache_control(), Some(want), "{http}: ranks");
        // Seven answers given: four read from Redis, the three revalidations kept; or
        // none counted when nothing is kept.
        let [hit, miss, wait] = answer_sources(&client, &api.base).await;
        match keeps {
            Some(true) => assert_eq!((hit + wait, miss), (3.0, 4.0), "{http}"),
            Some(false) => {
                assert_eq!([hit, miss, wait], [0.0; 3], "{http}: nothing is kept");
                assert_eq!(held_gauges(&client, &api.base).await, (0.0, 0.0), "{http}");
            }
            None => assert_eq!(hit + miss + wait, 7.0, "{http}"),
        }
    }

    // The daemon, its reader's token from the environment.
    let token = "reader-token-from-env-2c9b";
    let env = [("ROLLBOARD_QUERY_TOKEN", token.to_string())];
    let (_redis, _store, _dir, _config, daemon) =
        daemon_on("max_staleness = \"5s\"", true, &env).await;
    let top = format!("{}/v1/boards/rooms_7d/top", daemon.base);
    assert_eq!(ask(client.get(&top)).await.status, 401);
    let answer = ask(client.get(&top).bearer_auth(token)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.cache_control(), Some("private, max-age=5"));
    assert!(daemon.terminate().await.success());
}

// ---------------------------------------------------------------------------------------
// The answers' metrics.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_reads_are_one_miss_then_hits_and_concurrent_first_reads_wait_for_one() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    clear_of_the_hour(&store, 30_000).await;
    let api = Api::sharing(&redis.url(), &store, "max_staleness = \"60s\"", ROOMS_BOARD).await;
    let client = reqwest::Client::new();
    let first = scrape(&client, &api.base).await;
    for source in ["hit", "miss", "wait"] {
        let series = sample(
            &first,
            "rollboard_http_answers_total",
            &[("source", source)],
        );
        assert_eq!(series, Some(0.0), "source={source} on the first scrape");
    }
    for gauge in [
        "rollboard_http_answers_held",
        "rollboard_http_answers_held_bytes",
    ] {
        assert_eq!(sample(&first, gauge, &[]), Some(0.0), "{gauge}");
    }

    let b = api.board("rooms");
    let now = api.clock.now();
    let seed = [ev("s1", now, "r1", 5), ev("s2", now, "r2", 3)];
    apply_events(&store, &b, &seed, now).await;
    let top = format!("{}/v1/boards/rooms/top", api.base);
    let mut bodies = Vec::new();
    for _ in 0..10 {
        let answer = ask(client.get(&top)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        bodies.push(answer.text());
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    assert_eq!(answer_sources(&client, &api.base).await, [9.0, 1.0, 0.0]);

    // 32 requests at once, on connections already open, for an answer not kept (a long
    // page, slow to read): one reads Redis, the others wait for it (or, arriving after,
    // find it kept).
    let now = api.clock.now();
    let crowd: Vec<ApplyEvent> = (0..500)
        .map(|i| ev(&format!("c{i}"), now, &format!("crowd{i}"), 1))
        .collect();
    apply_events(&store, &b, &crowd, now).await;
    let healthz = format!("{}/healthz", api.base);
    futures_util::future::join_all((0..32).map(|_| ask(client.get(&healthz)))).await;
    let cold = format!("{}/v1/boards/rooms/top?limit=1000", api.base);
    let answers = futures_util::future::join_all((0..32).map(|_| ask(client.get(&cold)))).await;
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.body == answers[0].body),
        "{answers:?}"
    );
    let [hit, miss, wait] = answer_sources(&client, &api.base).await;
    assert_eq!(miss, 2.0, "one read of Redis for 32 requests");
    assert_eq!(hit + wait, 9.0 + 31.0, "hits {hit}, waits {wait}");
    assert!(
        wait > 0.0,
        "none of 32 requests at once waited for the one read"
    );
    eprintln!(
        "32 concurrent first reads: 1 miss, {} hits, {wait} waits",
        hit - 9.0
    );

    // A write of this process: the next read reads Redis again, and shows it.
    apply_now(&store, &b, &[("s3", "r1", 4)]).await;
    let after = ask(client.get(&top)).await;
    assert_eq!(totals_of(&after.json(), "r1"), [Some(9)]);
    assert_eq!(answer_sources(&client, &api.base).await[1], 3.0, "a miss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_slice_of_time_is_a_new_answer() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let ticks =
        "[[boards]]\nname = \"ticks\"\nmember = \"user\"\nwindow = \"4s\"\nslice = \"1s\"\n";
    let api = Api::sharing(&redis.url(), &store, "max_staleness = \"60s\"", ticks).await;
    let b = api.board("ticks");
    apply_now(&store, &b, &[("s1", "u1", 5)]).await;
    let client = reqwest::Client::new();
    let top = format!("{}/v1/boards/ticks/top", api.base);
    // Early in a slice, so that two reads in a row fall in the same one.
    let early = wait_for(Duration::from_secs(3), || async {
        api.clock.now().rem_euclid(1_000) < 300
    })
    .await;
    assert!(early, "the clock never began a slice");
    let first = ask(client.get(&top)).await;
    let again = ask(client.get(&top)).await;
    assert_eq!(
        again.text(),
        first.text(),
        "the same slice, the answer kept"
    );
    let [hits, misses, _] = answer_sources(&client, &api.base).await;
    assert_eq!((hits, misses), (1.0, 1.0));
    let from = first.json()["window_from"].as_i64().expect("window_from");
    // The clock enters the next slice (4 s window: the live range starts 3 slices back).
    let next = from + 4_000;
    let entered = wait_for(Duration::from_secs(3), || async { api.clock.now() >= next }).await;
    assert!(entered, "the clock never reached {next}");
    let moved = ask(client.get(&top)).await;
    assert_eq!(moved.status, 200, "{}", moved.text());
    let moved_from = moved.json()["window_from"].as_i64().expect("window_from");
    assert!(
        moved_from > from,
        "a new slice, a new answer: window_from {moved_from}, was {from}"
    );
    assert_ne!(moved.etag(), first.etag());
    assert_eq!(
        answer_sources(&client, &api.base).await[1],
        2.0,
        "read again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_gauges_say_what_is_kept() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    clear_of_the_hour(&store, 30_000).await;
    let api = Api::sharing(&redis.url(), &store, "max_staleness = \"60s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    let board = format!("{}/v1/boards/rooms", api.base);
    let mut given = 0;
    for (n, path) in ["/top", "/members/r1", "/members/r1/around"]
        .into_iter()
        .enumerate()
    {
        let answer = ask(client.get(format!("{board}{path}"))).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        given += answer.body.len();
        // Kept for a minute: what is held is every answer given so far.
        let kept = n as f64 + 1.0;
        let now_held = std::cell::Cell::new((0.0, 0.0));
        let shown = wait_for(Duration::from_secs(5), || async {
            now_held.set(held_gauges(&client, &api.base).await);
            let (entries, bytes) = now_held.get();
            entries == kept && bytes > given as f64
        })
        .await;
        let (entries, bytes) = now_held.get();
        assert!(
            shown,
            "after {path}: rollboard_http_answers_held {entries} (want {kept}), \
             rollboard_http_answers_held_bytes {bytes} (want over the {given} bytes of the bodies)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answers_kept_weigh_at_most_cache_bytes() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let bound = 20_000.0;
    let api = Api::sharing(
        &redis.url(),
        &store,
        "max_staleness = \"60s\"\ncache_bytes = 20000",
        ROOMS_BOARD,
    )
    .await;
    let b = api.board("rooms");
    let now = api.clock.now();
    let seed: Vec<ApplyEvent> = (0..40)
        .map(|i| ev(&format!("s{i}"), now, &format!("r{i}"), 1 + i))
        .collect();
    apply_events(&store, &b, &seed, now).await;
    let client = reqwest::Client::new();
    let board = format!("{}/v1/boards/rooms", api.base);
    let mut given = 0usize;
    for i in 0..200 {
        // Ranked members and members not on the board (their 404s are kept too), and pages.
        for path in [
            format!("/members/r{i}"),
            format!("/top?limit={}", 1 + i % 40),
        ] {
            let answer = ask(client.get(format!("{board}{path}"))).await;
            assert!(
                matches!(answer.status, 200 | 404),
                "{path}: {}",
                answer.text()
            );
            given += answer.body.len();
        }
    }
    assert!(
        given as f64 > 10.0 * bound,
        "{given} bytes of answers given"
    );
    let held_now = std::cell::Cell::new((0.0, 0.0));
    let within = wait_for(Duration::from_secs(5), || async {
        held_now.set(held_gauges(&client, &api.base).await);
        held_now.get().1 <= bound
    })
    .await;
    let last = held_now.get();
    eprintln!("{given} bytes of answers given; held: {last:?}");
    assert!(
        within,
        "rollboard_http_answers_held_bytes {} over http.cache_bytes {bound} ({} answers held)",
        last.1, last.0
    );
    assert!(last.0 >= 1.0 && last.1 > 0.0, "{last:?}");
}

// ---------------------------------------------------------------------------------------
// The daemon's own writes, and other processes'.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_own_ingest_and_rolls_show_at_once_with_max_staleness_60s() {
    let (_redis, store, _dir, config, daemon) =
        daemon_on("max_staleness = \"60s\"", false, &[]).await;
    clear_of_the_hour(&store, 30_000).await;
    let b = board_of(&config, "rooms_7d");
    let client = reqwest::Client::new();
    let top = format!("{}/v1/boards/rooms_7d/top", daemon.base);
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    for _ in 0..2 {
        let kept = ask(client.get(&top)).await;
        assert_eq!(totals_of(&kept.json(), "r1"), [Some(5)], "{}", kept.text());
    }
    // A tip the daemon's consumer applied (and acknowledged) shows in the next answer.
    tip_applied(&store, &daemon, "t2", "r1", "u2", 4).await;
    let after = ask(client.get(&top)).await;
    assert_eq!(
        totals_of(&after.json(), "r1"),
        [Some(9)],
        "{}",
        after.text()
    );

    // A roll of the daemon's schedule (every 2 s) moves `as_of`: the next answer is the
    // board's as it rolled (or as it rolled again meanwhile).
    let kept = ask(client.get(&top)).await;
    let kept_as_of = kept.json()["as_of"].as_i64().expect("as_of");
    let rolled = wait_for(Duration::from_secs(10), || async {
        let direct: Value = serde_json::from_slice(&direct_top(&store, &b).await).expect("JSON");
        direct["as_of"].as_i64().is_some_and(|t| t > kept_as_of)
    })
    .await;
    assert!(rolled, "the daemon never rolled; log:\n{}", daemon.logs());
    let before = direct_top(&store, &b).await;
    let answer = ask(client.get(&top)).await;
    let after = direct_top(&store, &b).await;
    assert!(
        answer.body == before || answer.body == after,
        "the answer after a roll: {}\nthe board before it: {}\nand after: {}",
        answer.text(),
        text(&before),
        text(&after)
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_not_on_the_board_is_kept_until_the_daemon_applies_its_tip() {
    let (_redis, store, _dir, _config, daemon) =
        daemon_on("max_staleness = \"60s\"", true, &[]).await;
    clear_of_the_hour(&store, 30_000).await;
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    let client = reqwest::Client::new();
    let base = format!("{}/v1/boards/rooms_7d/members/newbie", daemon.base);
    for url in [base.clone(), format!("{base}/around")] {
        let first = ask(client.get(&url)).await;
        assert_eq!(first.status, 404, "{url}: {}", first.text());
        let body = first.json();
        assert!(
            body["rank"].is_null() && body["error"].is_string(),
            "{body}"
        );
        let [hits, ..] = answer_sources(&client, &daemon.base).await;
        let again = ask(client.get(&url)).await;
        assert_eq!((again.status, again.text()), (404, first.text()), "{url}");
        assert_eq!(
            answer_sources(&client, &daemon.base).await[0],
            hits + 1.0,
            "{url}: the 404 is kept"
        );
    }
    tip_applied(&store, &daemon, "t2", "newbie", "u2", 3).await;
    let ranked = ask(client.get(&base)).await;
    assert_eq!(ranked.status, 200, "{}", ranked.text());
    let body = ranked.json();
    assert_eq!(
        (body["rank"].as_u64(), body["total"].as_i64()),
        (Some(2), Some(3))
    );
    let around = ask(client.get(format!("{base}/around"))).await;
    assert_eq!(around.status, 200, "{}", around.text());
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_other_processes_show_within_max_staleness() {
    let (redis, store, _dir, config, daemon) =
        daemon_on("max_staleness = \"300ms\"", true, &[]).await;
    let b = board_of(&config, "rooms_7d");
    let bound = Duration::from_millis(300) + SHOW_MARGIN;
    let client = reqwest::Client::new();
    let top = format!("{}/v1/boards/rooms_7d/top", daemon.base);
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    let kept = ask(client.get(&top)).await;
    assert_eq!(totals_of(&kept.json(), "r1"), [Some(5)]);

    // Another process's store applies.
    apply_now(&store, &b, &[("foreign-1", "r1", 4)]).await;
    let written = Instant::now();
    shows_within(&client, &top, written, bound, "a store's apply", |a| {
        totals_of(a, "r1") == [Some(9)]
    })
    .await;

    // `rollboard roll`: the board's as_of moves to the roll's time.
    ask(client.get(&top)).await;
    let out = run_rollboard(&config, &["roll", "--board", "rooms_7d"]);
    assert_exit(&out, 0, "rollboard roll");
    let written = Instant::now();
    let rolled: Value = serde_json::from_slice(&direct_top(&store, &b).await).expect("JSON");
    assert_ne!(
        rolled["as_of"],
        kept.json()["as_of"],
        "the roll moved as_of"
    );
    shows_within(&client, &top, written, bound, "rollboard roll", |a| {
        a["as_of"] == rolled["as_of"]
    })
    .await;

    // The ranking lost (by hand), then `rollboard rebuild`.
    let result = store.instance(&b.widest(), None).result();
    assert_eq!(redis.cli(&["DEL", &result]).trim(), "1", "DEL {result}");
    let written = Instant::now();
    shows_within(&client, &top, written, bound, "the ranking lost", |a| {
        a["count"] == 0
    })
    .await;
    let out = run_rollboard(&config, &["rebuild", "rooms_7d"]);
    assert_exit(&out, 0, "rollboard rebuild");
    let written = Instant::now();
    shows_within(&client, &top, written, bound, "rollboard rebuild", |a| {
        totals_of(a, "r1") == [Some(9)]
    })
    .await;

    // `rollboard drop-board`: nothing left.
    let out = run_rollboard(&config, &["drop-board", "--force", "rooms_7d"]);
    assert_exit(&out, 0, "rollboard drop-board");
    let written = Instant::now();
    shows_within(&client, &top, written, bound, "rollboard drop-board", |a| {
        a["count"] == 0 && a["as_of"].is_null()
    })
    .await;
    assert!(daemon.terminate().await.success());
}

// ---------------------------------------------------------------------------------------
// Boards of every shape.
// ---------------------------------------------------------------------------------------

/// A sharded board, one ranking two windows, a daily one and a scoped one, all of users.
const SHAPES: &str = "\
[[boards]]\nname = \"sharded\"\nmember = \"user\"\nwindow = \"7d\"\nslice = \"1h\"\nshards = 3\n\
[[boards]]\nname = \"duo\"\nmember = \"user\"\nwindows = [\"1h\", \"1d\"]\nslice = \"1h\"\n\
[[boards]]\nname = \"daily\"\nmember = \"user\"\nperiod = \"day\"\n\
[[boards]]\nname = \"scoped\"\nmember = \"user\"\nscope = \"room\"\nwindow = \"7d\"\nslice = \"1h\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_several_window_period_and_scoped_boards_answer_from_what_is_kept_and_show_own_writes(
) {
    let http = format!("max_staleness = \"60s\"\n{SHAPES}");
    let (_redis, store, _dir, _config, daemon) = daemon_on(&http, true, &[]).await;
    clear_of_the_hour(&store, 30_000).await;
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    tip_applied(&store, &daemon, "t2", "r1", "u2", 3).await;
    let client = reqwest::Client::new();
    let ranks = |board: &str, body: Value| {
        let url = format!("{}/v1/boards/{board}/ranks", daemon.base);
        client.post(url).json(&body)
    };
    let get = |path: &str| client.get(format!("{}/v1/boards/{path}", daemon.base));
    let queries = || {
        vec![
            ("sharded top", get("sharded/top")),
            ("sharded rank", get("sharded/members/u1")),
            ("sharded around", get("sharded/members/u1/around?radius=1")),
            (
                "sharded ranks",
                ranks("sharded", json!({"members": ["u2", "u1"]})),
            ),
            ("duo top 1h", get("duo/top?window=1h")),
            ("duo top 1d", get("duo/top?window=1d")),
            ("duo rank 1d", get("duo/members/u1?window=1d")),
            ("duo all windows", get("duo/members/u1?all_windows=true")),
            ("daily top", get("daily/top")),
            ("daily rank", get("daily/members/u1")),
            (
                "daily all windows",
                get("daily/members/u1?all_windows=true"),
            ),
            ("scoped top", get("scoped/top?scope=r1")),
            ("scoped rank", get("scoped/members/u1?scope=r1")),
            (
                "scoped ranks",
                ranks("scoped", json!({"members": ["u1"], "scope": "r1"})),
            ),
        ]
    };
    let expect_u1 = |what: &str, answer: &Answered, total: i64| {
        assert_eq!(answer.status, 200, "{what}: {}", answer.text());
        let totals = totals_of(&answer.json(), "u1");
        assert!(
            !totals.is_empty() && totals.iter().all(|t| *t == Some(total)),
            "{what}: u1 should total {total}: {}",
            answer.text()
        );
    };
    let n = queries().len();
    for i in 0..n {
        let (what, request) = queries().swap_remove(i);
        let first = ask(request).await;
        expect_u1(what, &first, 5);
        let [hits, ..] = answer_sources(&client, &daemon.base).await;
        let (_, request) = queries().swap_remove(i);
        let again = ask(request).await;
        assert_eq!(again.text(), first.text(), "{what} again");
        assert_eq!(
            answer_sources(&client, &daemon.base).await[0],
            hits + 1.0,
            "{what}: answered from what is kept"
        );
    }
    tip_applied(&store, &daemon, "t3", "r1", "u1", 4).await;
    for (what, request) in queries() {
        expect_u1(what, &ask(request).await, 9);
    }
    assert!(daemon.terminate().await.success());
}
