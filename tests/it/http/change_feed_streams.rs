//! `GET /v1/boards/{board}/changes` as subscribers meet it: a new stream starts after the
//! newest entry, `Last-Event-ID` resumes with nothing lost or repeated (or a `reset` when
//! the entries after it are gone), the heartbeat, one reader per feed whatever the
//! subscribers, a slow client disconnected while a fast one keeps receiving, the cap on
//! subscribers, the reader's token, SIGTERM, the metrics. Entries are written straight
//! into the feed, as the scripts that change a ranking write them.

use std::time::{Duration, Instant};

use fred::prelude::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::boards::redis_now;
use crate::support::config::{append_config, config_for_url, write_config, write_file};
use crate::support::daemon::{addr, assert_exited_within, Daemon};
use crate::support::http::{answer_parts, json, post_tip};
use crate::support::keys::schema;
use crate::support::redis::{free_port, keyed, RedisServer};
use crate::support::sse::{entered, feed_boards, feed_daemon, open_stream, xadd_change, Sse};
use crate::support::wait::wait_for;

const ROOMS: &str = "/v1/boards/rooms_7d/changes";
const WAIT: Duration = Duration::from_secs(10);

/// The change feed of the unscoped `rooms_7d`.
fn rooms_feed() -> String {
    schema().changes("rooms_7d", None, None)
}

#[tokio::test]
async fn a_stream_starts_after_the_newest_entry_and_resumes_after_last_event_id() {
    let (_redis, store, _dir, daemon) = feed_daemon("changes_heartbeat = \"1s\"\n").await;
    for i in 0..3 {
        entered(&store, &rooms_feed(), &format!("old{i}"), i + 1, 100).await;
    }
    let mut stream = Sse::open(&daemon, ROOMS, None).await;
    let ts = redis_now(&store).await.to_string();
    let passed = xadd_change(
        &store,
        &rooms_feed(),
        &[
            ("kind", "passed"),
            ("member", "r7"),
            ("rank", "2"),
            ("total", "1500"),
            ("cause", "tip"),
            ("ts", &ts),
            ("passed", "r2"),
        ],
    )
    .await;
    let first = stream.next_event(WAIT).await.expect("an event");
    assert_eq!(first.id.as_deref(), Some(passed.as_str()), "{first:?}");
    assert_eq!(first.event.as_deref(), Some("passed"));
    let ts: i64 = ts.parse().expect("ts");
    assert_eq!(
        json(&first.data),
        json!({"kind": "passed", "member": "r7", "rank": 2, "total": 1500, "cause": "tip",
               "ts": ts, "passed": "r2", "scale": 0})
    );
    drop(stream);

    // Written while nobody listens: a resume gets them, in order, then what comes next.
    let mut missed = Vec::new();
    for i in 0..3 {
        missed.push(entered(&store, &rooms_feed(), &format!("m{i}"), 3, i).await);
    }
    let mut stream = Sse::open(&daemon, ROOMS, Some(&passed)).await;
    let later = entered(&store, &rooms_feed(), "later", 1, 9).await;
    missed.push(later);
    let mut got = Vec::new();
    while got.len() < missed.len() {
        let event = stream.next_event(WAIT).await.expect("a resumed event");
        got.push(event.id.expect("an id"));
    }
    assert_eq!(got, missed, "nothing lost or repeated");
    let after = entered(&store, &rooms_feed(), "after", 1, 10).await;
    let next = stream.next_event(WAIT).await.expect("the next event");
    assert_eq!(next.id, Some(after), "no duplicate of what the resume sent");
}

#[tokio::test]
async fn a_resume_past_what_the_feed_keeps_gets_a_reset_and_goes_on_after_the_newest() {
    let (_redis, store, _dir, daemon) = feed_daemon("").await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(entered(&store, &rooms_feed(), &format!("u{i}"), 1, i).await);
    }
    // Trimmed to the newest 3, as `changes_max_len` does.
    let trimmed: i64 = keyed(&store, "XTRIM", vec![&rooms_feed(), "MAXLEN", "3"]).await;
    assert_eq!(trimmed, 7);

    // ids[7] is still kept: an exact resume.
    let mut kept = Sse::open(&daemon, ROOMS, Some(&ids[7])).await;
    for id in &ids[8..] {
        assert_eq!(
            kept.next_event(WAIT).await.and_then(|e| e.id).as_ref(),
            Some(id)
        );
    }
    let mut lost = Sse::open(&daemon, ROOMS, Some(&ids[2])).await;
    let reset = lost.next_event(WAIT).await.expect("a reset");
    assert_eq!(reset.event.as_deref(), Some("reset"), "{reset:?}");
    assert_eq!(reset.id.as_deref(), Some(ids[9].as_str()), "{reset:?}");
    assert_eq!(json(&reset.data)["oldest"], json!(ids[7]), "{reset:?}");
    let new = entered(&store, &rooms_feed(), "new", 1, 99).await;
    assert_eq!(lost.next_event(WAIT).await.and_then(|e| e.id), Some(new));
}

#[tokio::test]
async fn a_stream_of_a_scoped_board_reads_its_instance_and_mistakes_are_refused() {
    let (_redis, store, _dir, daemon) = feed_daemon("").await;
    let mut r1 = Sse::open(
        &daemon,
        "/v1/boards/fans_7d/changes?scope=r1&window=7d",
        None,
    )
    .await;
    let mut r2 = Sse::open(&daemon, "/v1/boards/fans_7d/changes?scope=r2", None).await;
    let feed = schema().changes("fans_7d", Some("r1"), None);
    let id = entered(&store, &feed, "u1", 1, 5).await;
    let event = r1.next_event(WAIT).await.expect("r1's event");
    assert_eq!(event.id, Some(id));
    let feed = schema().changes("fans_7d", Some("r2"), None);
    let other = entered(&store, &feed, "u2", 1, 5).await;
    let event = r2.next_event(WAIT).await.expect("r2's event");
    assert_eq!(event.id, Some(other), "r2 sees only its own instance");

    for (path, last_id, want) in [
        ("/v1/boards/nope/changes", None, 404),
        ("/v1/boards/tips_24h/changes", None, 404),
        ("/v1/boards/fans_7d/changes", None, 400),
        ("/v1/boards/rooms_7d/changes?scope=r1", None, 400),
        ("/v1/boards/rooms_7d/changes?window=24h", None, 400),
        ("/v1/boards/rooms_7d/changes?limit=3", None, 400),
        ("/v1/boards/rooms_7d/changes", Some("yesterday"), 400),
    ] {
        let answer = open_stream(&daemon, path, last_id, None).await;
        let (status, _, body) = answer_parts(answer).await;
        assert_eq!(status, want, "{path} {last_id:?}: {body}");
        assert!(json(&body)["error"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn an_idle_stream_gets_a_heartbeat_comment_and_outlives_the_request_timeout() {
    let (_redis, store, _dir, daemon) =
        feed_daemon("changes_heartbeat = \"1s\"\nrequest_timeout = \"1s\"\n").await;
    let mut stream = Sse::open(&daemon, ROOMS, None).await;
    let started = Instant::now();
    for _ in 0..3 {
        let block = stream.next_block(WAIT).await.expect("a heartbeat");
        assert_eq!(block.comment.as_deref(), Some("heartbeat"), "{block:?}");
    }
    assert!(started.elapsed() >= Duration::from_secs(2));
    // Past `http.request_timeout`, which bounds a request up to its answer's head only.
    let id = entered(&store, &rooms_feed(), "r1", 1, 5).await;
    assert_eq!(stream.next_event(WAIT).await.and_then(|e| e.id), Some(id));
}

#[tokio::test]
async fn subscribers_of_one_feed_share_one_reader_and_the_metrics_follow_them() {
    let (_redis, store, _dir, daemon) = feed_daemon("").await;
    let gauge = "rollboard_changes_subscribers";
    let feeds = "rollboard_changes_feeds_read";
    let sent = "rollboard_changes_events_sent_total";
    let disconnects = "rollboard_changes_disconnects_total";
    assert_eq!(daemon.metric(gauge, &[]).await, 0.0);
    let mut streams = Vec::new();
    for _ in 0..5 {
        streams.push(Sse::open(&daemon, ROOMS, None).await);
    }
    let mut scoped = Sse::open(&daemon, "/v1/boards/fans_7d/changes?scope=r1", None).await;
    assert_eq!(daemon.metric(gauge, &[]).await, 6.0);
    assert_eq!(daemon.metric(feeds, &[]).await, 2.0, "one reader per feed");
    let id = entered(&store, &rooms_feed(), "r1", 1, 5).await;
    for stream in &mut streams {
        assert_eq!(
            stream.next_event(WAIT).await.and_then(|e| e.id).as_ref(),
            Some(&id)
        );
    }
    assert_eq!(daemon.metric(sent, &[]).await, 5.0);
    drop(streams);
    assert!(
        daemon
            .metric_becomes(disconnects, &[("reason", "client")], 5.0, WAIT)
            .await
    );
    assert_eq!(daemon.metric(gauge, &[]).await, 1.0);
    assert!(
        daemon.metric_becomes(feeds, &[], 1.0, WAIT).await,
        "the reader stopped"
    );
    let feed = schema().changes("fans_7d", Some("r1"), None);
    let id = entered(&store, &feed, "u1", 1, 5).await;
    assert_eq!(scoped.next_event(WAIT).await.and_then(|e| e.id), Some(id));
    drop(scoped);
    assert!(daemon.metric_becomes(feeds, &[], 0.0, WAIT).await);
    assert!(daemon.metric_becomes(gauge, &[], 0.0, WAIT).await);
    assert_eq!(daemon.metric(sent, &[]).await, 6.0);
    for reason in ["slow", "shutdown"] {
        assert_eq!(daemon.metric(disconnects, &[("reason", reason)]).await, 0.0);
    }
}

#[tokio::test]
async fn a_client_too_slow_is_disconnected_while_a_fast_one_keeps_receiving() {
    let (_redis, store, _dir, daemon) = feed_daemon("").await;
    // A client that reads the head and then nothing, through a small receive buffer.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut slow = socket
        .connect(addr(&daemon).parse().expect("address"))
        .await
        .expect("connect");
    let request = format!("GET {ROOMS} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n");
    slow.write_all(request.as_bytes()).await.expect("request");
    let mut head = [0u8; 256];
    let n = slow.read(&mut head).await.expect("head");
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    let mut fast = Sse::open(&daemon, ROOMS, None).await;
    assert!(
        daemon
            .metric_becomes("rollboard_changes_subscribers", &[], 2.0, WAIT)
            .await
    );

    // Far more than the slow client's buffers hold, in one script call.
    let padding = "x".repeat(200);
    let flood = "for i = 1, tonumber(ARGV[1]) do redis.call('XADD', KEYS[1], '*', 'kind', \
                 'entered', 'member', ARGV[2] .. i, 'rank', '1', 'total', i, 'cause', 'tip', \
                 'ts', '0') end return 0";
    let _: i64 = store
        .client()
        .eval(flood, vec![&rooms_feed()], vec!["20000", padding.as_str()])
        .await
        .expect("flood");
    let last = entered(&store, &rooms_feed(), "last", 1, 1).await;
    let mut received = 0;
    let reached = loop {
        match fast.next_event(WAIT).await {
            Some(event) if event.id.as_deref() == Some(last.as_str()) => break true,
            Some(_) => received += 1,
            None => break false,
        }
    };
    assert!(
        reached,
        "the fast client got {received} events, not the last"
    );
    assert_eq!(received, 20_000, "the fast client lost nothing");
    assert!(
        daemon
            .metric_becomes(
                "rollboard_changes_disconnects_total",
                &[("reason", "slow")],
                1.0,
                Duration::from_secs(30)
            )
            .await
    );
    // The slow client's connection is closed: what it still reads ends.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(WAIT, slow.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the slow connection is still open");
    let after = entered(&store, &rooms_feed(), "after", 1, 1).await;
    assert_eq!(fast.next_event(WAIT).await.and_then(|e| e.id), Some(after));
}

#[tokio::test]
async fn subscribers_beyond_the_cap_answer_503_with_retry_after() {
    let (_redis, _store, _dir, daemon) = feed_daemon("max_subscribers = 2\n").await;
    let first = Sse::open(&daemon, ROOMS, None).await;
    let _second = Sse::open(&daemon, "/v1/boards/fans_7d/changes?scope=a", None).await;
    let (status, retry, body) = answer_parts(open_stream(&daemon, ROOMS, None, None).await).await;
    assert_eq!(status, 503, "{body}");
    assert!(retry.is_some(), "Retry-After");
    assert!(body.contains("http.max_subscribers"), "{body}");
    drop(first);
    assert!(
        daemon
            .metric_becomes("rollboard_changes_subscribers", &[], 1.0, WAIT)
            .await
    );
    Sse::open(&daemon, ROOMS, None).await;
}

#[tokio::test]
async fn a_stream_needs_the_readers_token_when_one_is_set() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let token = write_file(dir.path(), "reader.token", "feed-reader-token-81f2");
    let extra = format!("query_token_file = \"{}\"\n", token.display());
    let config = write_config(dir.path(), &redis, port, "feed", &extra);
    feed_boards(&config);
    let daemon = Daemon::start(&config, port).await;
    for token in [None, Some("wrong")] {
        let answer = open_stream(&daemon, ROOMS, None, token).await;
        assert_eq!(answer.status().as_u16(), 401, "{token:?}");
    }
    let store = redis.store("rb").await;
    let mut stream = Sse::open_with(&daemon, ROOMS, None, Some("feed-reader-token-81f2")).await;
    let id = entered(&store, &rooms_feed(), "r1", 1, 5).await;
    assert_eq!(stream.next_event(WAIT).await.and_then(|e| e.id), Some(id));
}

#[tokio::test]
async fn sigterm_ends_every_stream_and_the_daemon_exits_promptly() {
    let (_redis, store, _dir, daemon) = feed_daemon("").await;
    let mut streams = Vec::new();
    for path in [ROOMS, ROOMS, "/v1/boards/fans_7d/changes?scope=r1"] {
        streams.push(Sse::open(&daemon, path, None).await);
    }
    let id = entered(&store, &rooms_feed(), "r1", 1, 5).await;
    assert_eq!(
        streams[0].next_event(WAIT).await.and_then(|e| e.id),
        Some(id)
    );
    let started = Instant::now();
    daemon.send_term();
    for stream in &mut streams {
        assert!(
            stream.ends_within(WAIT).await,
            "a stream outlived the shutdown"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the streams ended at once, not after the drain: {:?}",
        started.elapsed()
    );
    let status = daemon.wait_exit().await;
    assert_exited_within(status, started, Duration::from_secs(15));
}

#[tokio::test]
async fn a_stream_rides_out_a_lost_redis_connection_and_loses_nothing() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = crate::support::proxy::Proxy::start(redis.port).await;
    let (_dir, port, config) = config_for_url(&proxy.url(), "feed", "changes_heartbeat = \"1s\"\n");
    feed_boards(&config);
    let daemon = Daemon::start(&config, port).await;
    let mut stream = Sse::open(&daemon, ROOMS, None).await;
    let first = entered(&store, &rooms_feed(), "r1", 1, 5).await;
    assert_eq!(
        stream.next_event(WAIT).await.and_then(|e| e.id),
        Some(first)
    );

    // The feed reader's connection is cut right after each of its next three reads reaches
    // Redis (the key names only its reads): each time it reconnects and reads again.
    proxy.cut_after(rooms_feed().as_bytes(), 3);
    let mut written = vec![entered(&store, &rooms_feed(), "r2", 1, 6).await];
    let cut = wait_for(WAIT, || async { proxy.cuts() >= 1 }).await;
    assert!(cut, "the reader's connection was not cut");
    written.push(entered(&store, &rooms_feed(), "r3", 1, 7).await);
    let cut = wait_for(Duration::from_secs(20), || async { proxy.cuts() >= 3 }).await;
    assert!(cut, "only {} cuts", proxy.cuts());
    written.push(entered(&store, &rooms_feed(), "r4", 1, 8).await);
    let mut got = Vec::new();
    while got.len() < written.len() {
        let event = stream.next_event(Duration::from_secs(20)).await;
        got.push(event.and_then(|e| e.id).expect("an event after the cuts"));
    }
    assert_eq!(got, written, "in order, none lost or repeated");
    assert!(
        daemon
            .metric("rollboard_changes_subscribers", &[])
            .await
            .eq(&1.0),
        "the stream stayed open"
    );
}

/// A period board keeps a feed per period: the stream follows the current period's (or the
/// one `period=` names), written by the daemon's own applies; a period not kept is a 404.
#[tokio::test]
async fn a_period_boards_stream_follows_its_current_period() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "period", "");
    append_config(
        &config,
        "\n[[boards]]\nname = \"tips_day\"\nmember = \"user\"\nperiod = \"day\"\nchanges_top = 5\n",
    );
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;

    let mut today = Sse::open(&daemon, "/v1/boards/tips_day/changes", None).await;
    let now = redis_now(&store).await;
    let (status, _, body) = post_tip(&daemon, "d1", now, "r1", "ann", "7").await;
    assert_eq!(status, 202, "{body}");
    let event = today.next_event(WAIT).await.expect("ann entered");
    assert_eq!(event.event.as_deref(), Some("entered"), "{event:?}");
    let data = json(&event.data);
    assert_eq!(
        (
            &data["member"],
            &data["rank"],
            &data["total"],
            &data["cause"]
        ),
        (&json!("ann"), &json!(1), &json!(7), &json!("tip")),
        "{data}"
    );

    for (path, want) in [
        ("/v1/boards/tips_day/changes?period=1999-01-01", 404),
        ("/v1/boards/tips_day/changes?period=someday", 400),
    ] {
        let (status, _, body) = answer_parts(open_stream(&daemon, path, None, None).await).await;
        assert_eq!(status, want, "{path}: {body}");
    }
}
