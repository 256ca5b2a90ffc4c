//! Count, percentile, dense rank and a subset re-ranked: every answer against the model
//! re-ranked (random tips, refunds to exactly 0, ties that appear and vanish, rolls and
//! rebuilds), and the `POST .../ranks` route and `rank m1 m2 ...` as a client sees them.

use std::time::Duration;

use proptest::prelude::*;
use rollboard::domain::board::Board;
use rollboard::domain::ranking::Percentile;
use rollboard::store::{ApplyEvent, Store};

use crate::support::boards::{ev, redis_now, roll_all, roll_board, variants};
use crate::support::cli::run_rollboard;
use crate::support::config::{write_config, write_file};
use crate::support::daemon::Daemon;
use crate::support::events::xadd_all;
use crate::support::keys::intake_stream;
use crate::support::model::{competition_ranks, Instance, Row};
use crate::support::proptests::{
    run_cases_on_a_cluster, run_cases_threaded, threaded_runtime_with_store,
};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

const SLICE: i64 = 1_000;
const N: i64 = 4;
const START: i64 = 1_000_000_000;
const MEMBERS: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Dense ranks of an ordered list of totals ("1, 1, 2").
fn dense_ranks(totals: &[i64]) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::with_capacity(totals.len());
    for (i, t) in totals.iter().enumerate() {
        let d = match i {
            0 => 1,
            _ if totals[i - 1] == *t => out[i - 1],
            _ => out[i - 1] + 1,
        };
        out.push(d);
    }
    out
}

/// Every answer of the store for `board` (in `scope`) equals the model's ranking re-ranked.
async fn assert_answers(
    store: &Store,
    (board, scope): (&Board, Option<&str>),
    model: &Instance,
    now: i64,
    asked: &[&str],
) {
    let expected: Vec<Row> = model.ranking(board);
    let count = expected.len() as u64;
    let totals: Vec<i64> = expected.iter().map(|r| r.1).collect();
    let competition = competition_ranks(&totals);
    let dense = dense_ranks(&totals);
    let page = store
        .top(&board.widest(), scope, 0, 1000, now)
        .await
        .expect("top");
    assert_eq!(page.envelope.count, count, "{}: count", board.name);
    assert_eq!(page.entries.len(), expected.len());
    for (i, e) in page.entries.iter().enumerate() {
        assert_eq!(
            (&e.member, e.total),
            (&expected[i].0, expected[i].1),
            "{}",
            board.name
        );
        assert_eq!(e.competition_rank, competition[i]);
        assert_eq!(
            e.dense_rank,
            Some(dense[i]),
            "{}: dense rank of {}",
            board.name,
            e.member
        );
        assert_eq!(Some(e.percentile), Percentile::of(i as u64 + 1, count));
    }
    // A page that starts inside a run of ties reads its first dense rank from Redis.
    for offset in 1..expected.len() as u64 {
        let p = store
            .top(&board.widest(), scope, offset, 2, now)
            .await
            .expect("top");
        assert_eq!(p.entries[0].dense_rank, Some(dense[offset as usize]));
    }
    for member in MEMBERS {
        let r = store
            .rank(&board.widest(), scope, member, now)
            .await
            .expect("rank");
        assert_eq!(r.envelope.count, count);
        match expected.iter().position(|row| row.0 == member) {
            Some(i) => {
                assert_eq!(r.rank, Some(i as u64 + 1));
                assert_eq!(r.dense_rank, Some(Some(dense[i])), "{member}");
                assert_eq!(r.percentile, Percentile::of(i as u64 + 1, count));
            }
            None => {
                assert_eq!(r.rank, None);
                assert_eq!(r.dense_rank, Some(None));
                assert_eq!(r.percentile, None);
            }
        }
    }
    let subset = store
        .ranks(&board.widest(), scope, asked, now)
        .await
        .expect("ranks");
    assert_eq!(subset.envelope.count, count);
    let mut want: Vec<(usize, &str)> = Vec::new();
    let mut missing: Vec<&str> = Vec::new();
    for m in asked {
        if want.iter().any(|(_, w)| w == m) || missing.contains(m) {
            continue;
        }
        match expected.iter().position(|row| row.0 == *m) {
            Some(i) => want.push((i, m)),
            None => missing.push(m),
        }
    }
    want.sort();
    let got: Vec<&str> = subset.entries.iter().map(|e| e.member.as_str()).collect();
    let order: Vec<&str> = want
        .iter()
        .map(|(_, m)| *m)
        .chain(missing.iter().copied())
        .collect();
    assert_eq!(got, order, "{}: subset order", board.name);
    for (k, e) in subset.entries.iter().enumerate() {
        match want.get(k) {
            Some(&(i, _)) => {
                assert_eq!(e.rank, Some(i as u64 + 1));
                assert_eq!(e.subset_rank, Some(k as u64 + 1));
                assert_eq!(e.competition_rank, Some(competition[i]));
                assert_eq!(e.dense_rank, Some(Some(dense[i])));
                assert_eq!(e.total, Some(totals[i]));
                assert_eq!(e.percentile, Percentile::of(i as u64 + 1, count));
            }
            None => {
                assert_eq!((e.rank, e.subset_rank, e.total), (None, None, None));
                assert_eq!(e.dense_rank, Some(None));
            }
        }
    }
    let verified = rollboard::roll::verify(store, &board.widest(), scope, 100).await;
    let drift = verified.expect("verify").dense_drift;
    assert!(drift.is_empty(), "{}: {drift:?}", board.name);
}

/// One step: events at offsets before `now` (member index, amount), then time moves on.
type Step = (Vec<(usize, i64, i64)>, i64, bool);

fn steps() -> impl Strategy<Value = (usize, Vec<Step>)> {
    (0usize..4).prop_flat_map(|shape| {
        let amounts = if shape % 2 == 1 { -3i64..=3 } else { 1i64..=3 };
        let event = (0usize..MEMBERS.len(), amounts, 0i64..2_500);
        let step = (
            prop::collection::vec(event, 0..8),
            0i64..1_500,
            any::<bool>(),
        );
        (Just(shape), prop::collection::vec(step, 1..10))
    })
}

/// Runs one case of [`steps`] on a dense-rank variant of the boards, in `scope`.
async fn run_case(store: &Store, scope: Option<&str>, (shape, steps): (usize, Vec<Step>)) {
    let mut board = variants(SLICE, N)[shape].clone();
    board.dense_rank = true;
    if scope.is_some() {
        board.scope = Some("room".into());
    }
    let mut model = Instance::default();
    let mut now = START;
    let mut id = 0;
    for (k, (events, advance, rebuild)) in steps.iter().enumerate() {
        let batch: Vec<ApplyEvent> = events
            .iter()
            .map(|&(m, amount, back)| {
                id += 1;
                ev(&format!("e{id}"), now - back, MEMBERS[m], amount)
            })
            .collect();
        for e in &batch {
            model.apply(&board.widest(), e, now);
        }
        store
            .apply(&board, scope, &batch, now)
            .await
            .expect("apply");
        now += advance;
        roll_all(store, std::slice::from_ref(&board), now, 2).await;
        model.roll(&board.widest(), now);
        if *rebuild {
            rollboard::roll::rebuild(store, &board.widest(), scope, 2)
                .await
                .expect("rebuild");
        }
        let asked: Vec<&str> = MEMBERS
            .iter()
            .copied()
            .skip(k % 3)
            .chain(["a", "zz"])
            .collect();
        assert_answers(store, (&board, scope), &model, now, &asked).await;
    }
}

#[test]
fn counts_percentiles_dense_and_subset_ranks_equal_the_model_reranked() {
    run_cases_threaded(
        "answers equal the model re-ranked",
        24,
        &steps(),
        async |store, case| run_case(store, None, case).await,
    );
}

/// The same on a Redis Cluster, each case in a scope of its own (a slot of its own): the
/// distinct totals live beside their instance, and every answer is still one snapshot.
#[test]
fn on_a_cluster_counts_percentiles_dense_and_subset_ranks_equal_the_model() {
    run_cases_on_a_cluster(
        "answers on a cluster equal the model re-ranked",
        8,
        &steps(),
        async |store, n, case| run_case(store, Some(&format!("room{n}")), case).await,
    );
}

/// A board without dense rank keeps no distinct totals and answers none.
#[test]
fn boards_without_dense_rank_keep_no_distinct_totals() {
    let (rt, _redis, store) = threaded_runtime_with_store();
    rt.block_on(async {
        for board in variants(SLICE, N) {
            let events = [ev("1", START, "a", 2), ev("2", START, "b", 2)];
            store
                .apply(&board, None, &events, START)
                .await
                .expect("apply");
            roll_board(&store, &board, START + 10).await;
            let page = store
                .top(&board.widest(), None, 0, 10, START + 10)
                .await
                .expect("top");
            assert!(page.entries.iter().all(|e| e.dense_rank.is_none()));
            let json = serde_json::to_value(&page).expect("json");
            assert!(json["entries"][0].get("dense_rank").is_none(), "{json}");
            assert_eq!(json["entries"][0]["percentile"], serde_json::json!(50));
            let dense = store.instance(&board.widest(), None).dense();
            let exists: i64 = fred::prelude::KeysInterface::exists(store.client(), dense)
                .await
                .expect("exists");
            assert_eq!(exists, 0, "{}", board.name);
        }
    });
}

const DENSE_BOARD: &str = "\n[[boards]]\nname = \"dense_7d\"\nmember = \"player\"\nwindow = \"7d\"\nslice = \"1h\"\ndense_rank = true\n";

async fn post(
    daemon: &Daemon,
    board: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/boards/{board}/ranks", daemon.base))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

#[tokio::test]
async fn the_ranks_route_answers_a_subset_and_refuses_bad_requests() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let tokens = write_file(dir.path(), "query_tokens", "s3cret\n");
    let port = free_port();
    let extra = format!("query_token_file = \"{}\"\n{DENSE_BOARD}", tokens.display());
    let config = write_config(dir.path(), &redis, port, "a", &extra);
    let daemon = Daemon::start(&config, port).await;
    let store = redis.store("rb").await;
    let now = redis_now(&store).await;
    let fields = |id: &str, p: &str, amount: &str| {
        vec![
            ("id".to_string(), id.to_string()),
            ("player".to_string(), p.to_string()),
            ("amount".to_string(), amount.to_string()),
            ("ts".to_string(), (now - 1000).to_string()),
        ]
    };
    let events = vec![
        fields("1", "p1", "5"),
        fields("2", "p2", "5"),
        fields("3", "p3", "2"),
    ];
    xadd_all(store.client(), intake_stream(), &events).await;
    let token = Some("s3cret");
    let body = r#"{"members": ["p3", "ghost", "p2", "p1"]}"#;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            post(&daemon, "dense_7d", body, token).await.1["count"] == 3
        })
        .await,
        "events applied"
    );
    let (status, answer) = post(&daemon, "dense_7d", body, token).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["board"], "dense_7d");
    assert_eq!(answer["window"], "7d");
    assert_eq!(answer["scope"], serde_json::Value::Null);
    let e = &answer["entries"];
    let members: Vec<&str> = (0..4)
        .map(|i| e[i]["member"].as_str().unwrap_or(""))
        .collect();
    // Equal totals and times: by member, descending bytes, as on the board.
    assert_eq!(members, ["p2", "p1", "p3", "ghost"], "{answer}");
    assert_eq!(e[0]["subset_rank"], 1);
    assert_eq!(e[1]["competition_rank"], 1);
    assert_eq!(e[1]["dense_rank"], 1);
    assert_eq!(e[2]["dense_rank"], 2);
    assert_eq!(e[2]["competition_rank"], 3);
    assert_eq!(e[0]["percentile"].to_string(), "66.66");
    assert_eq!(e[2]["percentile"], 0);
    assert_eq!(e[3]["rank"], serde_json::Value::Null);
    assert_eq!(e[3]["subset_rank"], serde_json::Value::Null);
    assert_eq!(e[3]["dense_rank"], serde_json::Value::Null);
    assert!(e[3].get("dense_rank").is_some());
    // The window may be named, if it is the board's.
    let (status, _) = post(
        &daemon,
        "dense_7d",
        r#"{"members":["p1"],"window":"7d"}"#,
        token,
    )
    .await;
    assert_eq!(status, 200);
    let many: Vec<String> = (0..1001).map(|i| format!("\"m{i}\"")).collect();
    let too_many = format!("{{\"members\": [{}]}}", many.join(","));
    for (body, needle) in [
        (r#"{"members": []}"#, "1 to 1000"),
        (too_many.as_str(), "1 to 1000"),
        (r#"{"members": ["p1"], "window": "24h"}"#, "window"),
        (r#"{"members": ["p1"], "scope": "x"}"#, "not scoped"),
        (r#"{"members": ["p1"], "limit": 3}"#, "members"),
        (r#"{"members": "p1"}"#, "members"),
        ("not json", "JSON"),
        (r#"{"members": ["a\u0001"]}"#, "members[0]"),
    ] {
        let (status, answer) = post(&daemon, "dense_7d", body, token).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap_or("").contains(needle),
            "{body}: {answer}"
        );
    }
    let (status, answer) = post(&daemon, "fans_7d", r#"{"members":["u"]}"#, token).await;
    assert_eq!(status, 400, "{answer}");
    let (status, _) = post(&daemon, "nope", r#"{"members":["u"]}"#, token).await;
    assert_eq!(status, 404);
    let (status, answer) = post(&daemon, "dense_7d", body, None).await;
    assert_eq!(status, 401, "{answer}");
    let (status, _) = post(&daemon, "dense_7d", body, Some("wrong")).await;
    assert_eq!(status, 401);
    let metrics = reqwest::get(format!("{}/metrics", daemon.base))
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    assert!(
        metrics.contains("route=\"/v1/boards/{board}/ranks\""),
        "{metrics}"
    );

    // The command line: several members re-ranked, one member as before.
    let out = run_rollboard(
        &config,
        &["rank", "dense_7d", "p3", "p1", "ghost", "--json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(answer["entries"][0]["member"], "p1");
    assert_eq!(answer["entries"][1]["subset_rank"], 2);
    assert_eq!(answer["entries"][2]["rank"], serde_json::Value::Null);
    let out = run_rollboard(&config, &["rank", "dense_7d", "p3", "p1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DENSE") && text.contains("p3"), "{text}");
    let out = run_rollboard(&config, &["rank", "dense_7d", "p3", "--json"]);
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(answer["rank"], 3);
    assert_eq!(answer["dense_rank"], 2);
    assert_eq!(answer["percentile"], 0);
    assert_eq!(answer["count"], 3);
    let out = run_rollboard(&config, &["rank", "dense_7d", "nobody", "ghost", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let out = run_rollboard(&config, &["rank", "dense_7d", "p1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("percentile 33.33") && text.contains("dense rank 1"),
        "{text}"
    );
}
