//! Stream events as fields (tips, payments), appending them, and checking every instance
//! against the in-memory model of what was appended.

use std::collections::HashMap;
use std::time::Duration;

use rollboard::board::{Board, Mode};
use rollboard::store::{ApplyEvent, Store};

use crate::support::model::Instance;
use crate::support::*;

/// The fields of one stream entry, in order.
pub type Fields = Vec<(String, String)>;

/// XADDs `events` to `stream`, pipelined 500 at a time.
pub async fn xadd_all(client: &fred::prelude::Client, stream: &str, events: &[Fields]) {
    use fred::prelude::*;
    for chunk in events.chunks(500) {
        futures_util::future::try_join_all(
            chunk
                .iter()
                .map(|f| client.xadd::<String, _, _, _, _>(stream, false, None, "*", f.clone())),
        )
        .await
        .expect("xadd");
    }
}

/// Every instance's model after `events` (stream entry ID, fields), applied in order at
/// `now`.
pub fn models_of_entries(
    events: &[(String, Fields)],
    boards: &[Board],
    now: i64,
) -> std::collections::HashMap<(usize, Option<String>), crate::support::model::Instance> {
    let mut out: std::collections::HashMap<
        (usize, Option<String>),
        crate::support::model::Instance,
    > = std::collections::HashMap::new();
    for (source, fields) in events {
        let raw: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|(a, b)| (a.clone().into_bytes(), b.clone().into_bytes()))
            .collect();
        let event =
            rollboard::event::parse(&raw, source, boards, now, 300_000).expect("valid test event");
        for u in event.updates {
            let e = ApplyEvent {
                id: event.id.clone(),
                ts: event.ts,
                member: u.member,
                amount: u.amount,
            };
            out.entry((u.board, u.scope))
                .or_default()
                .apply(&boards[u.board], &e, now);
        }
    }
    out
}

/// Checks every instance against its model; resummarize instances once the job (every
/// second in the test config) has run since their last event.
pub async fn assert_state(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::support::model::Instance>,
    now: i64,
) {
    assert_state_or(store, boards, models, now, String::new).await;
}

/// [`assert_state`], with `context` (a daemon's log, say) in the message when a
/// resummarize instance never catches up.
pub async fn assert_state_or(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::support::model::Instance>,
    now: i64,
    context: impl Fn() -> String,
) {
    for ((b, scope), model) in models {
        let board = &boards[*b];
        if board.mode == Mode::Resummarize {
            let expected = model.ranking(board);
            let ranked = || async {
                let page = store
                    .top(board, scope.as_deref(), 0, 1000, now)
                    .await
                    .expect("top");
                page.entries
                    .iter()
                    .map(|e| (e.member.clone(), e.total, e.last_ts))
                    .collect::<Vec<_>>()
            };
            let caught_up = wait_for(Duration::from_secs(10), || async {
                ranked().await == expected
            })
            .await;
            if !caught_up {
                let got = ranked().await;
                let differ: Vec<_> = expected
                    .iter()
                    .filter(|e| !got.contains(e))
                    .take(5)
                    .collect();
                let (meta, _) = store.meta(board, scope.as_deref()).await.expect("meta");
                let sums =
                    live_sums(store, board, scope.as_deref(), meta.unwrap_or(i64::MIN)).await;
                let slices_differ: Vec<_> = expected
                    .iter()
                    .filter(|(m, total, _)| sums.get(m) != Some(total))
                    .take(5)
                    .map(|(m, total, _)| (m, total, sums.get(m)))
                    .collect();
                panic!(
                    "resummarize board {}{scope:?} never caught up: {} ranked, {} expected, \
                     expected but not ranked (first 5): {differ:?}; the live slices (above \
                     {meta:?}) differ from the model for (member, model, slices; first 5): \
                     {slices_differ:?}\n{}",
                    board.name,
                    got.len(),
                    expected.len(),
                    context()
                );
            }
        }
        crate::support::model::assert_matches(store, board, scope.as_deref(), model, now).await;
    }
}

/// Each member's total over the live slices (those registered above `watermark`).
async fn live_sums(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    watermark: i64,
) -> std::collections::HashMap<String, i64> {
    let k = store.instance(board, scope);
    let mut sums = std::collections::HashMap::new();
    for n in store
        .live_slices(board, scope, watermark)
        .await
        .expect("live slices")
    {
        use fred::interfaces::HashesInterface;
        let fields: std::collections::HashMap<String, i64> =
            store.client().hgetall(k.slice(n)).await.expect("slice");
        for (member, amount) in fields {
            *sums.entry(member).or_default() += amount;
        }
    }
    sums
}

/// A tip to a room; matches rooms_7d and fans_7d.
pub fn tip(i: usize, now: i64) -> Fields {
    vec![
        ("room".into(), format!("r{}", i % 7)),
        ("user".into(), format!("u{}", i % 23)),
        ("amount".into(), (1 + i % 9).to_string()),
        ("id".into(), format!("t{i}")),
        (
            "ts".into(),
            (now - (i as i64 * 997) % 3_000_000).to_string(),
        ),
    ]
}

/// A payment with cents, refunds included; matches tips_24h only.
pub fn payment(i: usize, now: i64) -> Fields {
    let cents = if i % 6 == 0 {
        -(i as i64 % 500) - 1
    } else {
        100 + i as i64 % 900
    };
    let value = format!(
        "{}{}.{:02}",
        if cents < 0 { "-" } else { "" },
        cents.abs() / 100,
        cents.abs() % 100
    );
    vec![
        ("user".into(), format!("u{}", i % 13)),
        ("value".into(), value),
        ("id".into(), format!("p{i}")),
        (
            "ts".into(),
            (now - (i as i64 * 1_013) % 3_000_000).to_string(),
        ),
    ]
}

/// Waits until the group has taken everything, then checks every instance against the
/// model of `events`.
/// The model of `events` as the stream holds them (entry IDs stand in for the ids of
/// events without one; every test event has its own `id`).
pub fn models(
    events: &[Fields],
    boards: &[Board],
    now: i64,
) -> HashMap<(usize, Option<String>), Instance> {
    let entries: Vec<(String, Fields)> = events
        .iter()
        .enumerate()
        .map(|(k, f)| (format!("{k}-0"), f.clone()))
        .collect();
    models_of_entries(&entries, boards, now)
}

/// A small deterministic generator (splitmix64), so that a failing run can be replayed
/// from the seed it prints.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
