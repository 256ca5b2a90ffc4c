//! A sharded board through the daemon: events posted to `POST /v1/events` (validated and
//! routed to their shards by the consumer), then every answer of the HTTP API on the
//! sharded board equals its unsharded twin's, fed the same events: `top` pages, a
//! member's rank (and in every window), `around`, `ranks`. The deepest page of a sharded
//! board is a 400 where the twin answers; `?scope=` is refused on it.

use std::time::Duration;

use serde_json::Value;

use super::every_answer_matches_the_model::{NAMES, NOBODY};
use crate::support::boards::{redis_now, HOUR};
use crate::support::config::{board_table, server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::env::env_seed;
use crate::support::events::{letters, post_events, Fields};
use crate::support::http::{get, json, post_to};
use crate::support::proptests::SplitMix;
use crate::support::wait::{drained, wait_for};

/// Two boards of the same events, one spread over four shards. Windows wide beside the
/// events (at most three hours old): a roll during the test changes no ranking.
fn boards() -> String {
    let fans = "amount = \"coins\"\ntie_break = \"none\"\nallow_negative = true\n";
    let windows = r#"["6h", "24h"]"#;
    let sharded = board_table(
        "fans_sharded",
        "fan",
        windows,
        &format!("{fans}shards = 4\n"),
    );
    sharded + &board_table("fans_twin", "fan", windows, fans)
}

/// An answer without what may differ between two boards of the same events: the board's
/// name (also in an error's text) and `as_of` (the server's time of each board's last
/// write).
fn unnamed(mut answer: Value) -> Value {
    if let Some(fields) = answer.as_object_mut() {
        fields.remove("board");
        fields.remove("as_of");
        if let Some(Value::String(error)) = fields.get_mut("error") {
            *error = error.replace("fans_sharded", "fans_twin");
        }
    }
    answer
}

/// Status and JSON of GET `path` on both boards (`{b}` in `path` names the board).
async fn both(daemon: &Daemon, path: &str) -> [(u16, Value); 2] {
    let mut out = Vec::new();
    for board in ["fans_sharded", "fans_twin"] {
        let (status, _, body) = get(daemon, &path.replace("{b}", board)).await;
        out.push((status, unnamed(json(&body))));
    }
    [out[0].clone(), out[1].clone()]
}

/// As [`both`], POSTing `body`.
async fn both_posted(daemon: &Daemon, path: &str, body: &str) -> [(u16, Value); 2] {
    let mut out = Vec::new();
    for board in ["fans_sharded", "fans_twin"] {
        let (status, _, answer) = post_to(daemon, &path.replace("{b}", board), body).await;
        out.push((status, unnamed(json(&answer))));
    }
    [out[0].clone(), out[1].clone()]
}

/// Asserts that both boards answer `path` (and `body`, posted) alike. The two reads are
/// not at one instant: when an hour starts between them, their live ranges differ, so
/// they are read again until they agree (a wrong answer never does).
async fn assert_alike(daemon: &Daemon, path: &str, body: Option<&str>) {
    let last = std::cell::RefCell::new(None);
    let alike = wait_for(Duration::from_secs(5), || {
        let read = async {
            match body {
                Some(body) => both_posted(daemon, path, body).await,
                None => both(daemon, path).await,
            }
        };
        let last = &last;
        async move {
            let [a, b] = read.await;
            let same = a == b && (a.0 == 200 || a.0 == 404);
            last.replace(Some((a, b)));
            same
        }
    })
    .await;
    let (a, b) = last.into_inner().expect("read once");
    assert!(alike, "{path} {body:?}: sharded {a:?}, twin {b:?}");
}

#[tokio::test]
async fn a_sharded_board_answers_over_http_as_its_unsharded_twin() {
    let (redis, _dir, port, config) =
        server_and_config(|dir, redis, port| write_config(dir, redis, port, "shards", &boards()));
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let seed = env_seed("SHARDS_HTTP_SEED");
    println!("SHARDS_HTTP_SEED={seed}");
    let mut rng = SplitMix(seed);
    let now = redis_now(&store).await;
    let mut sent: Vec<Fields> = Vec::new();
    for batch in 0..3 {
        let mut events: Vec<Fields> = (0..30)
            .map(|i| {
                let fan = NAMES[(rng.next() % 8) as usize];
                // Small amounts, some refunds, never 0: equal totals across shards.
                let amount = [-2, -1, 1, 1, 2, 2, 3][(rng.next() % 7) as usize];
                let ts = now - (rng.next() % (3 * HOUR as u64)) as i64;
                vec![
                    ("id".to_string(), format!("h{batch}-{i}")),
                    ("ts".to_string(), ts.to_string()),
                    ("fan".to_string(), fan.to_string()),
                    ("coins".to_string(), amount.to_string()),
                ]
            })
            .collect();
        // Redeliveries of the last batch: counted once.
        events.extend(sent.iter().rev().take(5).cloned());
        assert_eq!(post_events(&daemon.base, &events).await, 202);
        sent.extend(events);
    }
    assert!(drained(&store).await, "the events were not applied");

    let (_, _, body) = get(&daemon, "/v1/boards/fans_twin/top?limit=100").await;
    let count = json(&body)["count"].as_u64().expect("a count");
    let letters = letters(&store).await;
    assert!(letters.is_empty(), "{letters:?}");
    assert!(count > 0, "{body}");
    let mut members: Vec<&str> = NAMES[..8].to_vec();
    members.push(NOBODY);
    for window in ["6h", "24h"] {
        assert_alike(
            &daemon,
            &format!("/v1/boards/{{b}}/top?window={window}&limit=100"),
            None,
        )
        .await;
        for offset in 0..=count {
            for limit in 1..=3 {
                let path =
                    format!("/v1/boards/{{b}}/top?window={window}&offset={offset}&limit={limit}");
                assert_alike(&daemon, &path, None).await;
            }
        }
        for m in &members {
            let member = format!("/v1/boards/{{b}}/members/{}", urlencoding(m));
            assert_alike(&daemon, &format!("{member}?window={window}"), None).await;
            for radius in 0..=2 {
                let path = format!("{member}/around?window={window}&radius={radius}");
                assert_alike(&daemon, &path, None).await;
            }
        }
        let body = format!(
            r#"{{"members":["{}","{}","{NOBODY}","{}","{}"],"window":"{window}"}}"#,
            members[0], members[3], members[5], members[0]
        );
        assert_alike(&daemon, "/v1/boards/{b}/ranks", Some(&body)).await;
    }
    for m in &members {
        let path = format!(
            "/v1/boards/{{b}}/members/{}?all_windows=true",
            urlencoding(m)
        );
        assert_alike(&daemon, &path, None).await;
    }

    // The deepest page of a sharded board; the twin's reaches further.
    let deepest = both(&daemon, "/v1/boards/{b}/top?offset=9000&limit=1000").await;
    assert_eq!((deepest[0].0, deepest[1].0), (200, 200), "{deepest:?}");
    let beyond = both(&daemon, "/v1/boards/{b}/top?offset=9001&limit=10").await;
    assert_eq!((beyond[0].0, beyond[1].0), (400, 200), "{beyond:?}");
    let (status, _, body) = get(&daemon, "/v1/boards/fans_sharded/top?scope=x").await;
    assert_eq!(status, 400, "{body}");
}

/// `member` as a path segment (the test names need only `é` escaped).
fn urlencoding(member: &str) -> String {
    member
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}
