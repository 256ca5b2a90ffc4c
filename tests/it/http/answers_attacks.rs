//! Attacks on the answers kept for `http.max_staleness` and on their HTTP caching (docs/api.md,
//! *Answers kept, and HTTP caching*; docs/design.md, *Answers kept*): each either breaks the
//! contract (the test fails until it is fixed) or held, and then its test keeps it held.
//!
//! Broke:
//! * an answer Redis was slow to send is kept `http.max_staleness` from when it arrived,
//!   not from when Redis read it: a read that begins well past `http.max_staleness` after
//!   another process's write is answered the state before it;
//! * an answer given from what is kept claims the whole `http.max_staleness` of freshness
//!   again (`max-age`, no `Age`), so a cache in front may show it twice as old.
//!
//! Held: the daemon's own writes show at once on every board kind while many readers race
//! them (no read that began after an apply returned joins an older read); the held gauges
//! drop once what was kept expired (they stayed at the last miss's count until the gauges
//! were counted at each scrape); a connection cut after an apply reached Redis still counts
//! as the daemon's write; an outage during a fill answers every waiter 503 in one read's
//! time and keeps nothing; a filler whose client went away leaves its waiters an answer;
//! tiny `http.cache_bytes` and answers larger than it; `If-None-Match` edges, `HEAD` and
//! 404s; the reader's token before anything kept; a board changed between two runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollboard::store::ApplyEvent;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::answers::{
    answer_sources, append_tip, apply_now, ask, clear_of_the_hour, held_gauges, kept_daemon,
    server_holding, tip_applied, totals_of, Answered, Api, ALL_JOBS, ROOMS_BOARD,
};
use crate::support::boards::{apply_events, ev, redis_now, total_at};
use crate::support::cli::{assert_exit, run_rollboard, text};
use crate::support::config::{board_of, edit_config, write_file};
use crate::support::daemon::Daemon;
use crate::support::http::json;
use crate::support::keys::intake_stream;
use crate::support::proxy::Proxy;
use crate::support::redis::{fcall_calls, function_name, RedisServer};
use crate::support::wait::{drained, wait_for};

// ---------------------------------------------------------------------------------------
// Fixtures of this module: raw HTTP exchanges and the API's connections (the rest are
// support's: the API served in this process, daemons with boards of their own, requests and
// their answers, metrics).
// ---------------------------------------------------------------------------------------

/// A plain HTTP/1.1 exchange on a new connection (closed by the request): the status, the
/// head's header lines (lower-cased names) and the body.
async fn raw(addr: &str, request: &[u8]) -> (u16, Vec<(String, Vec<u8>)>, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect to the API");
    stream.write_all(request).await.expect("send the request");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("the API answers within 10 s")
        .expect("read the answer");
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", text(&out)));
    let head = &out[..end];
    let body = out[end + 4..].to_vec();
    let mut lines = head.split(|&b| b == b'\n');
    let status_line = text(lines.next().expect("a status line"));
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {status_line:?}"));
    let headers = lines
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = text(&line[..colon]).to_ascii_lowercase();
            Some((name, line[colon + 1..].trim_ascii().to_vec()))
        })
        .collect();
    (status, headers, body)
}

/// The value of header `name` among `headers`, as text.
fn raw_header(headers: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| text(v))
}

/// The strong entity tag rollboard gives `body` (the first 96 bits of its BLAKE3 digest):
/// what a client would send back had it been given one. Computed here on purpose: the API
/// gives a 404 no `ETag`, so no answer names that body's own; the test checks it against a
/// 200's `ETag` first.
fn tag_of(body: &[u8]) -> String {
    let digest = blake3::hash(body);
    let hex: String = digest.as_bytes()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

/// The server side of the established connections to 127.0.0.1:`port`, and how many of
/// them still hold request bytes not read (`/proc/net/tcp`'s `rx_queue`).
fn connections_unread(port: u16) -> (usize, usize) {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!("0100007F:{port:04X}");
    let mut open = 0;
    let mut unread = 0;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 5 || fields[1] != local || fields[3] != "01" {
            continue;
        }
        open += 1;
        let rx = fields[4].split(':').nth(1).unwrap_or("0");
        if u64::from_str_radix(rx, 16).unwrap_or(0) > 0 {
            unread += 1;
        }
    }
    (open, unread)
}

// ---------------------------------------------------------------------------------------
// Broke: how old an answer kept may be. Held: the gauges of what is kept.
// ---------------------------------------------------------------------------------------

/// Reads that begin this much past `http.max_staleness` after a write must show it (the
/// test's own scheduling on a loaded machine).
const BEGIN_MARGIN: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_redis_sent_slowly_is_not_kept_past_max_staleness_of_what_redis_read() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = Proxy::start(redis.port).await;
    let max_staleness = Duration::from_secs(1);
    let api = Api::start(&proxy.url(), &store, "max_staleness = \"1s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    let top = api.url("/v1/boards/rooms/top");
    // The API's connections answer (another query: nothing of `top` is kept).
    let warm = ask(client.get(api.url("/v1/boards/rooms/members/r1"))).await;
    assert_eq!(warm.status, 200, "{}", warm.text());

    // A slow network: the query reaches Redis 2 s after it is sent, its reply 2 s later.
    proxy.latency(Duration::from_secs(2));
    let ran = fcall_calls(&redis);
    let slow = tokio::spawn({
        let (client, top) = (client.clone(), top.clone());
        async move { ask(client.get(&top)).await }
    });
    let read = wait_for(Duration::from_secs(10), || async {
        fcall_calls(&redis) > ran
    })
    .await;
    assert!(read, "the query never reached Redis");
    // Redis has read the board for it; another process writes before the reply arrives.
    apply_now(&store, &b, &[("s2", "r1", 4)]).await;
    let written = Instant::now();
    let first = slow.await.expect("the slow read");
    proxy.latency(Duration::ZERO);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(
        totals_of(&first.json(), "r1"),
        [Some(5)],
        "Redis read the board before the write"
    );
    eprintln!(
        "the slow read arrived {:?} after the write",
        written.elapsed()
    );

    // Every read that begins later than http.max_staleness after the write shows it.
    loop {
        let began = Instant::now();
        let answer = ask(client.get(&top)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        if totals_of(&answer.json(), "r1") == [Some(9)] {
            break;
        }
        let late = began - written;
        assert!(
            late <= max_staleness + BEGIN_MARGIN,
            "a read that began {late:?} after another process's write (http.max_staleness \
             {max_staleness:?}) was answered the board before it, kept since a reply that \
             took 2 s to arrive: {}",
            answer.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_given_from_what_is_kept_does_not_claim_fresh_max_staleness_again() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let api = Api::start(&redis.url(), &store, "max_staleness = \"3s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    let top = api.url("/v1/boards/rooms/top");
    let asked = Instant::now();
    let first = ask(client.get(&top)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let aged = wait_for(Duration::from_secs(5), || async {
        asked.elapsed() >= Duration::from_millis(1500)
    })
    .await;
    assert!(aged);
    let [hits, ..] = answer_sources(&client, &api.base).await;
    let again = ask(client.get(&top)).await;
    let age_now = asked.elapsed();
    assert_eq!(
        (again.status, again.etag(), again.text()),
        (200, first.etag(), first.text())
    );
    assert_eq!(
        answer_sources(&client, &api.base).await[0],
        hits + 1.0,
        "given from what is kept"
    );
    let cache_control = again
        .header("cache-control")
        .unwrap_or_default()
        .to_string();
    let max_age: u64 = cache_control
        .split(',')
        .find_map(|d| d.trim().strip_prefix("max-age="))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let age: u64 = again
        .header("age")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // Whole seconds: an answer at least 1.5 s old has at most 1.5 s of freshness left of 3.
    let left = max_age.saturating_sub(age);
    assert!(
        left <= 2,
        "an answer kept {age_now:?} (http.max_staleness 3s) was given with Cache-Control \
         {cache_control:?} and Age {:?}: a cache in front may give it {left} s more, {:?} \
         after Redis read it",
        again.header("age"),
        age_now + Duration::from_secs(left)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_gauges_drop_once_what_was_kept_has_expired() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let api = Api::start(&redis.url(), &store, "max_staleness = \"1s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    // 70 answers kept (404s of members not on the board).
    for i in 0..70 {
        let answer = ask(client.get(api.url(&format!("/v1/boards/rooms/members/m{i}")))).await;
        assert_eq!(answer.status, 404, "{}", answer.text());
    }
    let counted = held_gauges(&client, &api.base).await;
    assert!(counted.0 > 0.0, "70 answers kept, held {counted:?}");
    let read = Instant::now();
    // Nothing but /metrics is asked for: after http.max_staleness nothing is kept.
    let last = Mutex::new(counted);
    let dropped = wait_for(Duration::from_secs(6), || async {
        let now = held_gauges(&client, &api.base).await;
        *last.lock().expect("lock") = now;
        now == (0.0, 0.0)
    })
    .await;
    let last = *last.lock().expect("lock");
    assert!(
        dropped,
        "{:?} after the last answer was read (http.max_staleness 1s), \
         rollboard_http_answers_held and _held_bytes still say {last:?}",
        read.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// Held: read-your-own-writes on every board kind, under many readers.
// ---------------------------------------------------------------------------------------

/// Every kind of board the daemon keeps answers of: unscoped, scoped, sharded, two
/// windows, a calendar day, and a scoped resummarize board.
const KINDS: &str = "\
[[boards]]\nname = \"rooms\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n\
[[boards]]\nname = \"scoped\"\nmember = \"user\"\nscope = \"room\"\nwindow = \"7d\"\nslice = \"1h\"\n\
[[boards]]\nname = \"sharded\"\nmember = \"user\"\nwindow = \"7d\"\nslice = \"1h\"\nshards = 3\n\
[[boards]]\nname = \"duo\"\nmember = \"user\"\nwindows = [\"1h\", \"1d\"]\nslice = \"1h\"\n\
[[boards]]\nname = \"daily\"\nmember = \"user\"\nperiod = \"day\"\n\
[[boards]]\nname = \"fans\"\nmember = \"user\"\nscope = \"room\"\nwindow = \"7d\"\nslice = \"1h\"\n\
mode = \"resummarize\"\n";

/// One query of the race, and the member whose total it follows.
#[derive(Debug, Clone)]
struct Query {
    /// `GET <path>`, or `POST <path>` of `body`.
    path: String,
    body: Option<Value>,
    member: &'static str,
    /// The member's total before the first of the test's tips.
    base: i64,
    /// A resummarize board: its ranking changes when the daemon's run swaps one in.
    resummarized: bool,
}

impl Query {
    fn get(path: &str, member: &'static str, base: i64) -> Query {
        Query {
            path: path.to_string(),
            body: None,
            member,
            base,
            resummarized: path.starts_with("fans/"),
        }
    }

    fn post(path: &str, body: Value, member: &'static str, base: i64) -> Query {
        Query {
            body: Some(body),
            ..Query::get(path, member, base)
        }
    }

    fn request(&self, client: &reqwest::Client, base: &str) -> reqwest::RequestBuilder {
        let url = format!("{base}/v1/boards/{}", self.path);
        match &self.body {
            None => client.get(url),
            Some(body) => client.post(url).json(body),
        }
    }

    /// Its totals as `answer` gives them; all of them must be one number.
    fn total(&self, answer: &Answered) -> i64 {
        assert_eq!(answer.status, 200, "{}: {}", self.path, answer.text());
        let totals = totals_of(&answer.json(), self.member);
        assert!(
            !totals.is_empty() && totals.iter().all(|t| t.is_some() && *t == totals[0]),
            "{}: {} totals {totals:?}: {}",
            self.path,
            self.member,
            answer.text()
        );
        totals[0].unwrap_or_default() - self.base
    }
}

/// The seeds' total of room r1 on `rooms` (u2 to u6 tip 10, 20, ... 50 there).
const SEEDED_R1: i64 = 150;

fn kinds_queries() -> Vec<Query> {
    let r = SEEDED_R1;
    vec![
        Query::get("rooms/top", "r1", r),
        Query::get("rooms/members/r1", "r1", r),
        Query::get("rooms/members/r1/around?radius=1", "r1", r),
        Query::get("rooms/members/r1?all_windows=true", "r1", r),
        Query::post("rooms/ranks", json!({"members": ["r1", "r2"]}), "r1", r),
        Query::get("scoped/top?scope=r1", "u1", 0),
        Query::get("scoped/members/u1?scope=r1", "u1", 0),
        Query::get("scoped/members/u1/around?scope=r1&radius=1", "u1", 0),
        Query::post(
            "scoped/ranks",
            json!({"members": ["u1", "u3"], "scope": "r1"}),
            "u1",
            0,
        ),
        Query::get("sharded/top", "u1", 0),
        Query::get("sharded/top?offset=4&limit=3", "u1", 0),
        Query::get("sharded/members/u1", "u1", 0),
        Query::get("sharded/members/u1/around?radius=2", "u1", 0),
        Query::post(
            "sharded/ranks",
            json!({"members": ["u4", "u1", "u2"]}),
            "u1",
            0,
        ),
        Query::get("duo/top?window=1h", "u1", 0),
        Query::get("duo/top?window=1d", "u1", 0),
        Query::get("duo/members/u1?window=1d", "u1", 0),
        Query::get("duo/members/u1?all_windows=true", "u1", 0),
        Query::get("duo/members/u1/around?window=1h&radius=1", "u1", 0),
        Query::post(
            "duo/ranks",
            json!({"members": ["u1"], "window": "1h"}),
            "u1",
            0,
        ),
        Query::get("daily/top", "u1", 0),
        Query::get("daily/members/u1", "u1", 0),
        Query::get("daily/members/u1?all_windows=true", "u1", 0),
        Query::get("daily/members/u1/around?radius=1", "u1", 0),
        Query::post("daily/ranks", json!({"members": ["u1", "u5"]}), "u1", 0),
        Query::get("fans/top?scope=r1", "u1", 0),
        Query::get("fans/members/u1?scope=r1", "u1", 0),
        Query::get("fans/members/u1/around?scope=r1&radius=1", "u1", 0),
        Query::get("fans/members/u1?scope=r1&all_windows=true", "u1", 0),
        Query::post(
            "fans/ranks",
            json!({"members": ["u1"], "scope": "r1"}),
            "u1",
            0,
        ),
    ]
}

/// One read of the background readers: which query, when it began, the total it showed.
type Seen = (usize, Instant, i64);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_show_at_once_on_every_board_kind_while_many_readers_race_them() {
    let (redis, store) = server_holding(&["roll"]).await;
    let (_dir, config, _, daemon) =
        kept_daemon(&redis.url(), "max_staleness = \"60s\"", Some(KINDS), &[]).await;
    clear_of_the_hour(&store, 30_000).await;
    let fans = board_of(&config, "fans");
    let fans_total = || async {
        let now = redis_now(&store).await;
        store
            .rank(&fans.widest(), Some("r1"), "u1", now)
            .await
            .expect("rank")
            .total
    };
    for (i, user) in ["u2", "u3", "u4", "u5", "u6"].into_iter().enumerate() {
        append_tip(&store, &format!("seed{i}"), "r1", user, 10 * (i as i64 + 1)).await;
    }
    append_tip(&store, "seed-r2", "r2", "u7", 1).await;
    tip_applied(&store, &daemon, "tip1", "r1", "u1", 1).await;
    let swapped = wait_for(Duration::from_secs(10), || async {
        fans_total().await == Some(1)
    })
    .await;
    assert!(swapped, "fans never resummarized; log:\n{}", daemon.logs());

    let queries = Arc::new(kinds_queries());
    let client = reqwest::Client::new();
    // The daemon's own writes, and when each had returned: the k-th tip's apply (its
    // group's pending back to 0), and for fans its run's swap (seen in Redis).
    let mut applied = vec![Instant::now()];
    let mut swaps = vec![Instant::now()];
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..12)
        .map(|r| {
            let (queries, client, stop) = (queries.clone(), client.clone(), stop.clone());
            let base = daemon.base.clone();
            tokio::spawn(async move {
                let mut seen: Vec<Seen> = Vec::new();
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let q = i % queries.len();
                    let began = Instant::now();
                    let answer = ask(queries[q].request(&client, &base)).await;
                    seen.push((q, began, queries[q].total(&answer)));
                    i += 7;
                }
                seen
            })
        })
        .collect();

    let rounds = 5;
    for k in 2..=rounds {
        tip_applied(&store, &daemon, &format!("tip{k}"), "r1", "u1", 1).await;
        applied.push(Instant::now());
        // Every query but the resummarize board's, at once, begun after the apply returned.
        let incremental: Vec<&Query> = queries.iter().filter(|q| !q.resummarized).collect();
        let answers = futures_util::future::join_all(
            incremental
                .iter()
                .map(|q| ask(q.request(&client, &daemon.base))),
        )
        .await;
        for (q, answer) in incremental.iter().zip(&answers) {
            assert_eq!(
                q.total(answer),
                k as i64,
                "{} right after the daemon applied tip {k}: {}",
                q.path,
                answer.text()
            );
        }
        // The resummarize board: once the daemon's run swapped the new ranking in.
        let swapped = wait_for(Duration::from_secs(10), || async {
            fans_total().await == Some(k as i64)
        })
        .await;
        assert!(swapped, "fans never resummarized tip {k}");
        swaps.push(Instant::now());
        for q in queries.iter().filter(|q| q.resummarized) {
            let shown = wait_for(Duration::from_secs(2), || async {
                q.total(&ask(q.request(&client, &daemon.base)).await) == k as i64
            })
            .await;
            assert!(
                shown,
                "{}: the daemon's resummarize run swapped tip {k} in, and an answer kept \
                 from before it is still given",
                q.path
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut checked = 0;
    for reader in readers {
        for (q, began, total) in reader.await.expect("a reader") {
            let query = &queries[q];
            let writes = if query.resummarized { &swaps } else { &applied };
            // The daemon's writes that had returned when the read began.
            let before = writes.iter().filter(|w| **w < began).count() as i64;
            assert!(
                total >= before && total <= rounds as i64,
                "{}: a read that began after the daemon's write {before} returned showed \
                 {total}",
                query.path
            );
            checked += 1;
        }
    }
    eprintln!("{checked} reads raced the daemon's writes, none older than a write before it");
    assert!(checked > 200, "only {checked} racing reads");
    let [hits, misses, waits] = answer_sources(&client, &daemon.base).await;
    eprintln!("answers: {hits} hits, {misses} misses, {waits} waits");
    assert!(
        hits > misses,
        "the racing reads were mostly answered from what is kept: {hits} hits, {misses} misses"
    );
    assert!(daemon.terminate().await.success());
}

// ---------------------------------------------------------------------------------------
// Held: a cut connection, an outage during a fill, a filler gone away.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_whose_connection_was_cut_after_it_reached_redis_shows_at_once() {
    let (redis, store) = server_holding(ALL_JOBS).await;
    let proxy = Proxy::start(redis.port).await;
    // Every apply a `fold` call, the one the cut and the hold meet (the worker would judge
    // the tips itself).
    let (_dir, config, _, daemon) = kept_daemon(
        &proxy.url(),
        "max_staleness = \"60s\"",
        Some(ROOMS_BOARD),
        &[("ROLLBOARD__REDIS__TRANSACTIONS", "false".to_string())],
    )
    .await;
    let b = board_of(&config, "rooms");
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    let client = reqwest::Client::new();
    let top = format!("{}/v1/boards/rooms/top", daemon.base);
    for _ in 0..2 {
        let kept = ask(client.get(&top)).await;
        assert_eq!(totals_of(&kept.json(), "r1"), [Some(5)], "{}", kept.text());
    }
    let [hits, ..] = answer_sources(&client, &daemon.base).await;
    assert!(hits >= 1.0, "the answer is kept");

    // The next apply call reaches Redis and its connection is cut before the reply; the
    // consumer's retry of the batch is held at the proxy, unanswered.
    let fold = function_name("fold");
    proxy.cut_at(&fold, 1, 1);
    let retry = proxy.hold_at(&fold, 2);
    append_tip(&store, "t2", "r1", "u2", 4).await;
    let cut = wait_for(Duration::from_secs(10), || async { proxy.cuts() == 1 }).await;
    assert!(cut, "the apply call was never cut; log:\n{}", daemon.logs());
    let landed = wait_for(Duration::from_secs(5), || async {
        total_at(&store, &b.widest(), "r1", redis_now(&store).await).await == Some(9)
    })
    .await;
    assert!(landed, "the cut apply call never ran in Redis");
    let pending =
        rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
            .await
            .expect("XINFO GROUPS");
    assert!(
        matches!(pending, Some((n, _)) if n >= 1),
        "the batch is not acknowledged yet: {pending:?}"
    );
    let answer = ask(client.get(&top)).await;
    assert_eq!(
        totals_of(&answer.json(), "r1"),
        [Some(9)],
        "the daemon's apply reached Redis (its reply lost): a read after it shows it: {}",
        answer.text()
    );
    retry.release();
    assert!(drained(&store).await, "the batch was never acknowledged");
    let answer = ask(client.get(&top)).await;
    assert_eq!(
        totals_of(&answer.json(), "r1"),
        [Some(9)],
        "applied once: {}",
        answer.text()
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_during_a_fill_answers_every_waiter_503_in_one_reads_time_and_keeps_nothing() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = Proxy::start(redis.port).await;
    let api = Api::start(&proxy.url(), &store, "max_staleness = \"1s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    let top = api.url("/v1/boards/rooms/top");
    let kept = ask(client.get(&top)).await;
    let read = Instant::now();
    assert_eq!(totals_of(&kept.json(), "r1"), [Some(5)], "{}", kept.text());

    // Redis out of reach (the network drops everything); another process writes meanwhile.
    proxy.blackhole(true);
    apply_now(&store, &b, &[("s2", "r1", 4)]).await;
    // Once the answer kept is http.max_staleness old, 16 requests at once fill it again.
    let expired = wait_for(Duration::from_secs(5), || async {
        read.elapsed() > Duration::from_millis(1200)
    })
    .await;
    assert!(expired);
    let before = answer_sources(&client, &api.base).await;
    let started = Instant::now();
    let crowd = futures_util::future::join_all((0..16).map(|_| ask(client.get(&top)))).await;
    let took = started.elapsed();
    for answer in &crowd {
        assert_eq!(answer.status, 503, "{}", answer.text());
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert!(answer.text().contains("redis"), "{}", answer.text());
    }
    assert!(
        took < Duration::from_secs(8),
        "16 requests during an outage took {took:?} (one read's timeout is 5 s)"
    );
    let after = answer_sources(&client, &api.base).await;
    assert_eq!(
        [
            after[0] - before[0],
            after[1] - before[1],
            after[2] - before[2]
        ],
        [0.0, 1.0, 15.0],
        "one read of Redis, 15 waiters given its failure"
    );

    proxy.blackhole(false);
    let last = Mutex::new(None);
    let back = wait_for(Duration::from_secs(10), || async {
        let answer = ask(client.get(&top)).await;
        let ok = answer.status == 200;
        *last.lock().expect("lock") = Some(answer);
        ok
    })
    .await;
    let answer = last.lock().expect("lock").take().expect("an answer");
    assert!(back, "the API never answered again: {}", answer.text());
    assert_eq!(
        totals_of(&answer.json(), "r1"),
        [Some(9)],
        "the first answer after the outage is read anew: {}",
        answer.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filler_whose_client_went_away_leaves_its_waiters_an_answer() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = Proxy::start(redis.port).await;
    let api = Api::start(&proxy.url(), &store, "max_staleness = \"60s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    let warm = ask(client.get(api.url("/v1/boards/rooms/members/r1"))).await;
    assert_eq!(warm.status, 200, "{}", warm.text());
    let addr = format!("127.0.0.1:{}", api.port);

    // The filler's read of Redis is held at the proxy.
    let query = function_name("query");
    let first = proxy.hold_at(&query, 1);
    let mut filler = TcpStream::connect(&addr).await.expect("connect");
    filler
        .write_all(b"GET /v1/boards/rooms/top HTTP/1.1\r\nHost: api\r\n\r\n")
        .await
        .expect("send");
    tokio::time::timeout(Duration::from_secs(5), first.reached())
        .await
        .expect("the filler's read reached the proxy");
    let refill = proxy.hold_at(&query, 1);
    // Eight waiters, their requests read by the API.
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let mut w = TcpStream::connect(&addr).await.expect("connect");
        w.write_all(b"GET /v1/boards/rooms/top HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        waiters.push(w);
    }
    let read_in = wait_for(Duration::from_secs(5), || async {
        let (open, unread) = connections_unread(api.port);
        open >= 9 && unread == 0
    })
    .await;
    assert!(
        read_in,
        "the API never read the waiters' requests: {:?}",
        connections_unread(api.port)
    );
    let healthz = ask(client.get(api.url("/healthz"))).await;
    assert_eq!(healthz.status, 200);

    // The filler's client goes away; its read, held, then answers nobody.
    drop(filler);
    first.release();
    tokio::time::timeout(Duration::from_secs(10), refill.reached())
        .await
        .expect("a waiter read Redis itself once the filler was gone");
    refill.release();
    let answers = futures_util::future::join_all(waiters.into_iter().map(|mut w| async move {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), w.read_to_end(&mut out))
            .await
            .expect("a waiter is answered within 10 s")
            .expect("read");
        out
    }))
    .await;
    for out in answers {
        let answer = text(&out);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).expect("a body");
        assert_eq!(totals_of(&json(body), "r1"), [Some(5)], "{body}");
    }
    let [_, miss, wait] = answer_sources(&client, &api.base).await;
    eprintln!("after the filler went away: {miss} misses, {wait} waits");
    assert_eq!(miss, 2.0, "the warm-up and one waiter read Redis");
}

// ---------------------------------------------------------------------------------------
// Held: memory.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_cache_bytes_and_answers_larger_than_it_stay_bounded_and_correct() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let mut seeded = false;
    for bound in [1u64, 100, 50_000] {
        let api = Api::start(
            &redis.url(),
            &store,
            &format!("max_staleness = \"60s\"\ncache_bytes = {bound}"),
            ROOMS_BOARD,
        )
        .await;
        if !seeded {
            let b = api.board("rooms");
            let now = api.clock.now();
            let seed: Vec<ApplyEvent> = (0..1000)
                .map(|i| ev(&format!("s{i}"), now, &format!("r{i}"), 1 + i))
                .collect();
            for chunk in seed.chunks(250) {
                apply_events(&store, &b, chunk, now).await;
            }
            seeded = true;
        }
        let client = reqwest::Client::new();
        let board = api.url("/v1/boards/rooms");
        let mut paths = vec!["/top?limit=1000".to_string(); 4];
        for i in 0..60 {
            paths.push(format!("/top?offset={i}&limit={}", 1 + i % 7));
            paths.push(format!("/members/r{}", i * 16));
            paths.push(format!("/members/nobody{i}"));
            paths.push(format!("/members/r{}/around?radius={}", i * 16, i % 5));
        }
        let mut biggest = 0;
        for chunk in paths.chunks(8) {
            let answers = futures_util::future::join_all(
                chunk.iter().map(|p| ask(client.get(format!("{board}{p}")))),
            )
            .await;
            for (path, answer) in chunk.iter().zip(answers) {
                biggest = biggest.max(answer.body.len());
                if path.starts_with("/members/nobody") {
                    assert_eq!(answer.status, 404, "{bound}: {path}: {}", answer.text());
                    continue;
                }
                assert_eq!(answer.status, 200, "{bound}: {path}: {}", answer.text());
                let body = answer.json();
                assert_eq!(body["count"], 1000, "{bound}: {path}");
                if path == "/top?limit=1000" {
                    let entries = body["entries"].as_array().expect("entries");
                    assert_eq!(entries.len(), 1000, "{bound}: {path}");
                    assert_eq!(
                        (&entries[0]["member"], &entries[999]["total"]),
                        (&json!("r999"), &json!(1)),
                        "{bound}"
                    );
                } else if let Some(m) = path
                    .strip_prefix("/members/r")
                    .and_then(|rest| rest.split(['/', '?']).next())
                {
                    let n: i64 = m.parse().expect("a member number");
                    let totals = if path.contains("around") {
                        totals_of(&body, &format!("r{n}"))
                    } else {
                        vec![body["total"].as_i64()]
                    };
                    assert_eq!(totals, [Some(n + 1)], "{bound}: {path}");
                }
            }
        }
        assert!(
            biggest as u64 > bound,
            "an answer of {biggest} bytes, larger than http.cache_bytes {bound}"
        );
        let (entries, bytes) = held_gauges(&client, &api.base).await;
        eprintln!("cache_bytes {bound}: held {entries} answers, {bytes} bytes");
        assert!(
            bytes <= bound as f64,
            "rollboard_http_answers_held_bytes {bytes} over http.cache_bytes {bound}"
        );
        assert_eq!(ask(client.get(api.url("/healthz"))).await.status, 200);
    }
}

// ---------------------------------------------------------------------------------------
// Held: HTTP edges, tokens, a board changed between runs.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_match_edges_head_and_404s_never_give_a_304_for_another_body() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let api = Api::sharing(&redis.url(), &store, "max_staleness = \"60s\"", ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5), ("s2", "r2", 3)]).await;
    let client = reqwest::Client::new();
    let top = api.url("/v1/boards/rooms/top");
    let first = ask(client.get(&top)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let tag = first.etag().expect("an ETag").to_string();
    // The digest `tag_of` computes is the API's (so the 404's own, below, is the tag that
    // body would have been given).
    assert_eq!(
        tag_of(&first.body),
        tag,
        "an ETag other than the body's digest"
    );
    let cache_control = first
        .header("cache-control")
        .expect("Cache-Control")
        .to_string();
    let with = |value: &[u8]| {
        let value = reqwest::header::HeaderValue::from_bytes(value).expect("a header value");
        client.get(&top).header("if-none-match", value)
    };
    let assert_304 = |answer: &Answered, what: &str| {
        assert_eq!(answer.status, 304, "{what}: {}", answer.text());
        assert!(answer.body.is_empty(), "{what}: a 304 with a body");
        assert_eq!(answer.etag(), Some(tag.as_str()), "{what}: the 304's ETag");
        assert_eq!(
            answer.header("cache-control"),
            Some(cache_control.as_str()),
            "{what}: the 304's Cache-Control"
        );
    };
    let assert_body = |answer: &Answered, what: &str| {
        assert_eq!(
            (answer.status, answer.text()),
            (200, first.text()),
            "{what}"
        );
        assert_eq!(answer.etag(), Some(tag.as_str()), "{what}");
    };

    // Many tags, the right one last, in a 40 KB header.
    let mut many: Vec<u8> = Vec::new();
    for i in 0..1500 {
        many.extend_from_slice(format!("\"{i:024x}\", ").as_bytes());
    }
    let mut named = many.clone();
    named.extend_from_slice(tag.as_bytes());
    assert_304(&ask(with(&named)).await, "1500 tags, then the answer's");
    many.truncate(many.len() - 2);
    assert_body(&ask(with(&many)).await, "1500 other tags");
    // The tag repeated in several headers, weak, or unquoted.
    let two = ask(client
        .get(&top)
        .header("if-none-match", "\"nope\"")
        .header("if-none-match", format!("W/{tag}")))
    .await;
    assert_304(&two, "a second If-None-Match header, weak");
    assert_body(
        &ask(with(tag.trim_matches('"').as_bytes())).await,
        "the tag unquoted",
    );
    assert_body(
        &ask(with(&tag.as_bytes()[..tag.len() - 2])).await,
        "a prefix of the tag",
    );
    // Garbage: bytes that are not ASCII, separators, a lone W/.
    for garbage in [
        &b"\xff\xfe\x80\"\xc3\xa9\""[..],
        b",,,, ,",
        b"W/",
        b"\"",
        b"\"\"",
    ] {
        assert_body(
            &ask(with(garbage)).await,
            &format!("If-None-Match: {:?}", text(garbage)),
        );
    }
    assert_304(&ask(with(b"*")).await, "*");
    assert_304(&ask(with(b"\"x\", *")).await, "a list with *");

    // HEAD: the GET's head, no body; 304 when revalidated.
    let head = ask(client.head(&top)).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "a HEAD with a body");
    assert_eq!(head.etag(), Some(tag.as_str()));
    let head = ask(client.head(&top).header("if-none-match", &tag)).await;
    assert_eq!(head.status, 304);

    // A member not on the board: its 404 is an answer, never a 304, whatever is named
    // (its own digest, `*`, the top's tag), and it carries no ETag.
    let nobody = api.url("/v1/boards/rooms/members/nobody");
    let missing = ask(client.get(&nobody)).await;
    assert_eq!(missing.status, 404, "{}", missing.text());
    assert_eq!(missing.etag(), None, "a 404 with an ETag");
    for named in [tag_of(&missing.body), "*".to_string(), tag.clone()] {
        let again = ask(client.get(&nobody).header("if-none-match", &named)).await;
        assert_eq!(
            (again.status, again.text()),
            (404, missing.text()),
            "members/nobody with If-None-Match {named}"
        );
        let around = ask(client
            .get(format!("{nobody}/around"))
            .header("if-none-match", &named))
        .await;
        assert_eq!(around.status, 404, "around, If-None-Match {named}");
    }
    // A raw request: the 304's head has no body and no Content-Type, but its tag.
    let addr = format!("127.0.0.1:{}", api.port);
    let request = format!(
        "GET /v1/boards/rooms/top HTTP/1.1\r\nHost: api\r\nIf-None-Match: {tag}\r\n\
         Connection: close\r\n\r\n"
    );
    let (status, headers, body) = raw(&addr, request.as_bytes()).await;
    assert_eq!(status, 304);
    assert!(body.is_empty(), "{:?}", text(&body));
    assert_eq!(raw_header(&headers, "etag"), Some(tag.clone()));
    assert_eq!(raw_header(&headers, "content-type"), None);

    // The board changes (a write of this process): the old tag names another body now,
    // and is answered it.
    apply_now(&store, &b, &[("s3", "r2", 9)]).await;
    let changed = ask(client.get(&top).header("if-none-match", &tag)).await;
    assert_eq!(changed.status, 200, "{}", changed.text());
    assert_eq!(
        totals_of(&changed.json(), "r2"),
        [Some(12)],
        "{}",
        changed.text()
    );
    assert_ne!(changed.etag(), Some(tag.as_str()));
    assert_eq!(ask(client.get(api.url("/healthz"))).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_kept_is_given_or_revalidated_without_the_readers_token() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let token = "reader-token-attacks-51e0";
    let file = write_file(dir.path(), "reader.token", token);
    let http = format!(
        "max_staleness = \"60s\"\nquery_token_file = \"{}\"",
        file.display()
    );
    let api = Api::start(&redis.url(), &store, &http, ROOMS_BOARD).await;
    let b = api.board("rooms");
    apply_now(&store, &b, &[("s1", "r1", 5)]).await;
    let client = reqwest::Client::new();
    for path in [
        "/top",
        "/members/r1",
        "/members/nobody",
        "/members/r1/around",
    ] {
        let url = api.url(&format!("/v1/boards/rooms{path}"));
        let kept = ask(client.get(&url).bearer_auth(token)).await;
        assert!(matches!(kept.status, 200 | 404), "{path}: {}", kept.text());
        assert_eq!(
            kept.header("cache-control"),
            Some("private, max-age=60"),
            "{path}"
        );
        let again = ask(client.get(&url).bearer_auth(token)).await;
        assert_eq!(again.body, kept.body, "{path}: kept");
        let named = kept.etag().map_or_else(|| "*".to_string(), str::to_string);
        for (who, request) in [
            ("no token", client.get(&url)),
            (
                "another token",
                client.get(&url).bearer_auth("not-the-token"),
            ),
            (
                "a token's prefix",
                client.get(&url).bearer_auth(&token[..10]),
            ),
            (
                "another scheme",
                client
                    .get(&url)
                    .header("authorization", format!("Basic {token}")),
            ),
        ] {
            for revalidating in [false, true] {
                let request = request
                    .try_clone()
                    .expect("a request without a streamed body");
                let request = if revalidating {
                    request.header("if-none-match", &named)
                } else {
                    request
                };
                let refused = ask(request).await;
                assert_eq!(
                    refused.status,
                    401,
                    "{path}, {who}, revalidating {revalidating}: {}",
                    refused.text()
                );
                assert_eq!(refused.etag(), None, "{path}, {who}: an ETag given");
                assert!(
                    !refused.text().contains("r1") && refused.json()["error"].is_string(),
                    "{path}, {who}: {}",
                    refused.text()
                );
            }
        }
        if let Some(tag) = kept.etag() {
            let revalidated = ask(client
                .get(&url)
                .bearer_auth(token)
                .header("if-none-match", tag))
            .await;
            assert_eq!(revalidated.status, 304, "{path} with the token");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_changed_between_two_runs_answers_from_its_new_settings() {
    let (redis, store) = server_holding(ALL_JOBS).await;
    let (_dir, config, port, daemon) = kept_daemon(
        &redis.url(),
        "max_staleness = \"60s\"",
        Some(ROOMS_BOARD),
        &[],
    )
    .await;
    tip_applied(&store, &daemon, "t1", "r1", "u1", 5).await;
    let client = reqwest::Client::new();
    let top = format!("{}/v1/boards/rooms/top", daemon.base);
    let old = ask(client.get(&top)).await;
    assert_eq!(old.json()["window"], "7d", "{}", old.text());
    let old_tag = old.etag().expect("an ETag").to_string();
    assert!(daemon.terminate().await.success());

    let out = run_rollboard(&config, &["drop-board", "--force", "rooms"]);
    assert_exit(&out, 0, "rollboard drop-board");
    edit_config(
        &config,
        "window = \"7d\"\nslice = \"6h\"",
        "window = \"1d\"\nslice = \"1h\"",
    );
    let daemon = Daemon::start(&config, port).await;
    tip_applied(&store, &daemon, "t2", "r1", "u1", 2).await;
    let new = ask(client.get(&top).header("if-none-match", &old_tag)).await;
    assert_eq!(new.status, 200, "{}", new.text());
    let body = new.json();
    assert_eq!(
        (&body["window"], totals_of(&body, "r1")),
        (&json!("1d"), vec![Some(2)]),
        "{}",
        new.text()
    );
    assert_ne!(new.etag(), Some(old_tag.as_str()));
    let rank = ask(client.get(format!("{}/v1/boards/rooms/members/r1", daemon.base))).await;
    assert_eq!(rank.json()["total"], 2, "{}", rank.text());
    assert!(daemon.terminate().await.success());
}
