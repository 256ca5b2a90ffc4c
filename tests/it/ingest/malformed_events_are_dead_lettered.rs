//! Every kind of malformed event is dead-lettered with its reason.

use std::collections::HashMap;

use fred::prelude::*;

use crate::support::asserts::assert_metrics;
use crate::support::boards::{now_ms, test_boards};
use crate::support::config::write_config;
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::events::{xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::wait::drained;

#[tokio::test]
async fn every_malformed_kind_is_dead_lettered_with_its_reason() {
    let (redis, store, dir, _, port) = redis_and_config("a").await;
    // A board whose scope field is no other board's member, so that `scope` is reachable.
    let extra = "[[boards]]\nname = \"channel_fans\"\nmember = \"fan\"\nscope = \"channel\"\namount = \"coins\"\nwindow = \"1d\"\nslice = \"1h\"\n";
    let config = write_config(dir.path(), &redis, port, "a", extra);
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let ts = now.to_string();
    let f = |pairs: &[(&str, &str)]| -> Fields {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let long = "x".repeat(300);
    let old = (now - 40 * 86_400_000).to_string();
    let future = (now + 3_600_000).to_string();
    let cases: Vec<(&str, Fields)> = vec![
        ("no_board", f(&[("room", "r1"), ("user", "u")])),
        (
            "member",
            f(&[("room", "r1"), ("user", &long), ("amount", "1")]),
        ),
        (
            "scope",
            f(&[("fan", "f1"), ("channel", "bad\u{7}"), ("coins", "1")]),
        ),
        ("id", f(&[("room", "r1"), ("amount", "1"), ("id", "")])),
        (
            "amount",
            f(&[("room", "r1"), ("amount", "1e3"), ("reason", "tip")]),
        ),
        (
            "ts",
            f(&[("room", "r1"), ("amount", "1"), ("ts", "yesterday")]),
        ),
        (
            "future",
            f(&[("room", "r1"), ("amount", "1"), ("ts", &future)]),
        ),
        ("late", f(&[("room", "r1"), ("amount", "1"), ("ts", &old)])),
        (
            "overflow",
            f(&[
                ("room", "big"),
                ("amount", "9007199254740991"),
                ("ts", &ts),
                ("id", "o1"),
            ]),
        ),
        (
            "overflow",
            f(&[("room", "big"), ("amount", "1"), ("ts", &ts), ("id", "o2")]),
        ),
    ];
    let fields: Vec<Fields> = cases.iter().map(|(_, f)| f.clone()).collect();
    xadd_all(store.client(), intake_stream(), &fields).await;
    assert!(drained(&store).await);
    let entries: Vec<(String, HashMap<String, String>)> = store
        .client()
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange");
    let reasons: Vec<&str> = entries.iter().map(|(_, e)| e["reason"].as_str()).collect();
    // The first overflow event fits (it is exactly the limit); the second does not.
    let mut expected: Vec<&str> = cases.iter().map(|(r, _)| *r).collect();
    expected.remove(
        expected
            .iter()
            .position(|r| *r == "overflow")
            .expect("overflow case"),
    );
    assert_eq!(reasons, expected);
    for (_, e) in &entries {
        assert!(!e["detail"].is_empty());
        assert!(e["source_id"].contains('-'));
    }
    let amount = &entries[4].1;
    assert_eq!(
        (amount["orig.reason"].as_str(), amount["amount"].as_str()),
        ("tip", "1e3"),
        "original fields kept flat"
    );
    assert!(
        entries[8].1["detail"].contains("rooms_7d"),
        "overflow names the board"
    );
    assert_eq!(
        store
            .rank(&test_boards()[0].widest(), None, "big", now)
            .await
            .expect("rank")
            .total,
        Some(9_007_199_254_740_991)
    );
    assert_metrics(
        &daemon,
        &[
            "rollboard_events_dead_lettered_total{reason=late} 1",
            "rollboard_events_dead_lettered_total 9",
            "rollboard_events_skipped_total{board=rooms_7d,reason=late} 1",
        ],
    )
    .await;
}
