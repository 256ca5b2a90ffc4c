//! Applying events: exact totals readable with plain `ZREVRANGE`, ties to whoever got
//! there first, pages and neighbourhoods, refunds, scoped instances, and concurrent batches,
//! against a real Redis and the in-memory model.

use std::collections::HashMap;

use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak, MAX_TOTAL};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::boards::{
    amount_for, apply_events, apply_events_in, board, count_at, ev, rank_at, remembers, scoped,
    total_at, HOUR,
};
use crate::support::keys::instance;
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::run_cases;
use crate::support::redis::RedisServer;

const NOW: i64 = 1_763_700_000_000;

#[tokio::test]
async fn totals_are_exact_and_readable_with_plain_zrevrange() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, 168);
    let out = apply_events(
        &store,
        &b,
        &[
            ev("1", NOW, "room42", 1500),
            ev("2", NOW + 1, "room7", MAX_TOTAL - 1),
            ev("3", NOW + 2, "room7", 1),
        ],
        NOW,
    )
    .await;
    assert_eq!(out, vec![Outcome::Applied; 3]);
    let raw = redis.ranking(&instance("rooms", None).result());
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines.len(), 4, "{raw}");
    assert!(lines[0].ends_with(":room7"), "{raw}");
    assert_eq!(lines[1], "9007199254740991");
    assert!(lines[2].ends_with(":room42"), "{raw}");
    assert_eq!(lines[3], "1500");
    let r = store.rank(&b.widest(), None, "room7", NOW).await.unwrap();
    assert_eq!(r.total, Some(MAX_TOTAL));
    // One more unit would pass 2^53 - 1: refused, nothing changes, the id is not remembered.
    let out = apply_events(&store, &b, &[ev("4", NOW + 3, "room7", 1)], NOW).await;
    assert_eq!(out, vec![Outcome::Overflow]);
    assert_eq!(
        total_at(&store, &b.widest(), "room7", NOW).await,
        Some(MAX_TOTAL)
    );
    assert!(!remembers(&store, &b, None, "4", (NOW + 3) / HOUR).await);
    assert!(remembers(&store, &b, None, "3", (NOW + 2) / HOUR).await);
    assert_eq!(
        redis
            .cli(&["HGET", &instance("rooms", None).slice(NOW / HOUR), "room42"])
            .trim(),
        "1500"
    );
}

#[tokio::test]
async fn ties_go_to_whoever_got_there_first() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for (tie, expected) in [
        (TieBreak::Earliest, ["early", "late", "zz", "aa"]),
        (TieBreak::Latest, ["late", "early", "zz", "aa"]),
        (TieBreak::None, ["zz", "late", "early", "aa"]),
    ] {
        let mut b = board(&format!("t-{}", tie.as_str()), HOUR, 24);
        b.tie_break = tie;
        let events = [
            ev("1", NOW - 5_000, "early", 10),
            ev("2", NOW - 1_000, "late", 10),
            ev("3", NOW - 3_000, "zz", 4),
            ev("4", NOW - 3_000, "aa", 4),
        ];
        apply_events(&store, &b, &events, NOW).await;
        let page = store.top(&b.widest(), None, 0, 10, NOW).await.unwrap();
        let got: Vec<&str> = page.entries.iter().map(|e| e.member.as_str()).collect();
        if tie == TieBreak::None {
            // Equal totals fall back to name order, descending.
            assert_eq!(got, ["late", "early", "zz", "aa"], "{tie:?}");
        } else {
            assert_eq!(got, expected, "{tie:?}");
        }
        let comp: Vec<u64> = page.entries.iter().map(|e| e.competition_rank).collect();
        assert_eq!(comp, [1, 1, 3, 3]);
        let last: Vec<Option<i64>> = page.entries.iter().map(|e| e.last_ts).collect();
        if tie == TieBreak::None {
            assert_eq!(last, [None; 4]);
        } else {
            assert!(last.iter().all(Option::is_some));
        }
    }
}

#[tokio::test]
async fn a_later_tip_moves_the_tie_break_time() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, 24);
    let batch = [ev("1", NOW - 9_000, "a", 5), ev("2", NOW - 5_000, "b", 10)];
    apply_events(&store, &b, &batch, NOW).await;
    // a reaches 10 later than b did: b keeps first place.
    apply_events(&store, &b, &[ev("3", NOW - 1_000, "a", 5)], NOW).await;
    let page = store.top(&b.widest(), None, 0, 10, NOW).await.unwrap();
    assert_eq!(page.entries[0].member, "b");
    assert_eq!(page.entries[1].member, "a");
    assert_eq!(page.entries[1].last_ts, Some(NOW - 1_000));
    // An older event does not move the time back.
    apply_events(&store, &b, &[ev("4", NOW - 20_000, "a", 1)], NOW).await;
    assert_eq!(
        store
            .rank(&b.widest(), None, "a", NOW)
            .await
            .unwrap()
            .last_ts,
        Some(NOW - 1_000)
    );
}

#[tokio::test]
async fn pages_and_neighbourhoods() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, 24);
    let events: Vec<ApplyEvent> = (1..=25)
        .map(|i| ev(&i.to_string(), NOW - i, &format!("m{i:02}"), i))
        .collect();
    apply_events(&store, &b, &events, NOW).await;
    let page = store.top(&b.widest(), None, 10, 10, NOW).await.unwrap();
    assert_eq!(page.envelope.count, 25);
    assert_eq!(page.entries.len(), 10);
    assert_eq!(page.entries[0].rank, 11);
    assert_eq!(page.entries[0].member, "m15");
    assert_eq!(page.entries[0].competition_rank, 11);
    let tail = store.top(&b.widest(), None, 20, 10, NOW).await.unwrap();
    assert_eq!(tail.entries.len(), 5);
    let past = store.top(&b.widest(), None, 25, 10, NOW).await.unwrap();
    assert!(past.entries.is_empty());
    assert_eq!(past.envelope.count, 25);
    let around = store
        .around(&b.widest(), None, "m02", 3, NOW)
        .await
        .unwrap()
        .expect("on the board");
    let ranks: Vec<u64> = around.entries.iter().map(|e| e.rank).collect();
    assert_eq!(ranks, [21, 22, 23, 24, 25], "clipped at the end");
    let around = store
        .around(&b.widest(), None, "m25", 2, NOW)
        .await
        .unwrap()
        .expect("on the board");
    assert_eq!(
        around.entries.iter().map(|e| e.rank).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(store
        .around(&b.widest(), None, "nobody", 2, NOW)
        .await
        .unwrap()
        .is_err());
    assert_eq!(rank_at(&store, &b.widest(), "nobody", NOW).await, None);
    let (from, to) = (page.envelope.window_from, page.envelope.window_to);
    assert_eq!(from, (b.slice_of(NOW) - 23) * HOUR);
    assert_eq!(to - from, 24 * HOUR);
}

#[tokio::test]
async fn refunds_take_a_member_off_and_back_on_with_its_exact_total() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = board("tips", HOUR, 24);
    b.allow_negative = true;
    b.scale = 2;
    let batch = [ev("1", NOW - 10, "u", 500), ev("2", NOW - 9, "v", 100)];
    apply_events(&store, &b, &batch, NOW).await;
    apply_events(&store, &b, &[ev("3", NOW - 8, "u", -700)], NOW).await;
    let page = store.top(&b.widest(), None, 0, 10, NOW).await.unwrap();
    assert_eq!(page.envelope.count, 1);
    assert_eq!(page.entries[0].member, "v");
    assert_eq!(rank_at(&store, &b.widest(), "u", NOW).await, None);
    apply_events(&store, &b, &[ev("4", NOW - 7, "u", 250)], NOW).await;
    let r = store.rank(&b.widest(), None, "u", NOW).await.unwrap();
    assert_eq!(
        (r.rank, r.total, r.last_ts),
        (Some(2), Some(50), Some(NOW - 7)),
        "v (1.00) stays ahead of u (0.50)"
    );
}

#[tokio::test]
async fn scoped_instances_are_independent_and_registered() {
    let (redis, store) = RedisServer::start_with_store("lb").await;
    let b = scoped(board("fans", HOUR, 24));
    apply_events_in(&store, &b, "r1", &[ev("1", NOW, "alice", 5)], NOW).await;
    apply_events_in(&store, &b, "r2", &[ev("1", NOW, "alice", 7)], NOW).await;
    for (scope, total) in [("r1", 5), ("r2", 7)] {
        let rank = store
            .rank(&b.widest(), Some(scope), "alice", NOW)
            .await
            .unwrap();
        assert_eq!(rank.total, Some(total), "{scope}");
    }
    assert_eq!(count_at(&store, &b.widest(), Some("r3"), NOW).await, 0);
    assert_eq!(store.scopes(&b).await.unwrap(), ["r1", "r2"]);
    assert_eq!(
        redis.cli(&["ZSCORE", "lb:board:fans:scopes", "r1"]).trim(),
        (NOW / HOUR).to_string()
    );
    assert_eq!(
        redis
            .cli(&[
                "HGET",
                &format!("lb:{{fans:r2}}:slice:{}", NOW / HOUR),
                "alice"
            ])
            .trim(),
        "7"
    );
}

#[tokio::test]
async fn concurrent_overlapping_batches_end_in_the_model_state() {
    let redis = RedisServer::start();
    let b = {
        let mut b = board("rooms", HOUR, 24);
        b.allow_negative = true;
        b
    };
    let events: Vec<ApplyEvent> = (0..400)
        .map(|i| {
            let amount = if i % 7 == 0 { -3 } else { 1 + (i % 5) };
            ev(
                &format!("e{i}"),
                NOW - (i * 37_000) % (20 * HOUR),
                &format!("m{}", i % 13),
                amount,
            )
        })
        .collect();
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let store = redis.store("rb").await;
        let b = b.clone();
        // Each worker applies an overlapping half of the events, in its own batch sizes.
        let mine: Vec<ApplyEvent> = events.iter().skip(worker * 50).take(250).cloned().collect();
        tasks.push(tokio::spawn(async move {
            for chunk in mine.chunks(17 + worker * 5) {
                apply_events(&store, &b, chunk, NOW).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let mut model = Instance::default();
    for e in events.iter().take(400) {
        if (e.id[1..].parse::<usize>().unwrap()) < 400 {
            model.apply(&b.widest(), e, NOW);
        }
    }
    let store = redis.store("rb").await;
    assert_matches(&store, &b.widest(), None, &model, NOW).await;
}

#[derive(Debug, Clone)]
struct Case {
    boards: Vec<Board>,
    batches: Vec<(usize, Option<String>, Vec<ApplyEvent>, i64)>,
}

fn boards_for_model() -> Vec<Board> {
    let mut a = board("plain", 1_000, 4);
    a.tie_break = TieBreak::Earliest;
    let mut s = scoped(board("scoped", 1_000, 3));
    s.tie_break = TieBreak::Latest;
    s.allow_negative = true;
    let mut n = board("none", 500, 6);
    n.tie_break = TieBreak::None;
    n.mode = Mode::Incremental;
    vec![a, s, n]
}

fn case() -> impl Strategy<Value = Case> {
    let amount = prop_oneof![8 => 1i64..6, 2 => -4i64..0, 1 => Just(MAX_TOTAL / 2 + 1)];
    let event = (0u32..40, -7_000i64..600, 0usize..6, amount);
    let batch = (
        0usize..3,
        0usize..3,
        prop::collection::vec(event, 1..12),
        0i64..1_500,
    );
    prop::collection::vec(batch, 1..10).prop_map(|raw| {
        let boards = boards_for_model();
        let mut now = 1_000_000;
        let batches = raw
            .into_iter()
            .map(|(b, scope, events, advance)| {
                now += advance;
                let board = &boards[b];
                let events = events
                    .into_iter()
                    .map(|(id, offset, member, amount)| {
                        let amount = amount_for(board, amount);
                        ev(
                            &format!("id{id}"),
                            (now + offset).max(0),
                            ["a", "b", "c", "d", "e", "ab"][member],
                            amount,
                        )
                    })
                    .collect();
                let scope = board.scope.as_ref().map(|_| format!("r{scope}"));
                (b, scope, events, now)
            })
            .collect();
        Case { boards, batches }
    })
}

async fn run_case(store: &Store, case: &Case) {
    let mut model: HashMap<(usize, Option<String>), Instance> = HashMap::new();
    for (b, scope, events, now) in &case.batches {
        let board = &case.boards[*b];
        let inst = model.entry((*b, scope.clone())).or_default();
        let expected: Vec<Outcome> = events
            .iter()
            .map(|e| inst.apply(&board.widest(), e, *now))
            .collect();
        let got = store
            .apply(board, scope.as_deref(), events, *now)
            .await
            .expect("apply");
        assert_eq!(got, expected, "outcomes of {events:?} at {now}");
    }
    let now = case.batches.last().map_or(0, |b| b.3);
    for ((b, scope), inst) in &model {
        assert_matches(
            store,
            &case.boards[*b].widest(),
            scope.as_deref(),
            inst,
            now,
        )
        .await;
    }
}

#[test]
fn the_store_behaves_like_the_model() {
    run_cases(96, &case(), async |store, case| {
        run_case(store, &case).await;
    });
}
