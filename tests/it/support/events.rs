//! Stream events as fields (tips, payments), appending them, and checking every instance
//! against the in-memory model of what was appended.

use std::collections::HashMap;

use fred::prelude::*;
use rollboard::domain::board::Board;
use rollboard::store::{ApplyEvent, Store};

use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::model::Instance;

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
        let event = rollboard::domain::event::parse(&raw, source, boards, now, 300_000)
            .expect("valid test event");
        for u in event.updates {
            let e = ApplyEvent {
                id: event.id.clone(),
                ts: event.ts,
                member: u.member,
                amount: u.amount,
            };
            out.entry((u.board, u.scope))
                .or_default()
                .apply(&boards[u.board].widest(), &e, now);
        }
    }
    out
}

/// `n` tips ([`tip`] 0 to n - 1) at the local time now.
pub fn tips_now(n: usize) -> Vec<Fields> {
    let now = crate::support::boards::now_ms();
    (0..n).map(|i| tip(i, now)).collect()
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

/// POSTs `events` to `/v1/events` as one JSON array; the status.
pub async fn post_events(base: &str, events: &[Fields]) -> u16 {
    post_fields(base, events).await.status().as_u16()
}

/// Posts `events` to `POST /v1/events` as one JSON array of objects; the answer.
pub async fn post_fields(base: &str, events: &[Fields]) -> reqwest::Response {
    let body: Vec<serde_json::Map<String, serde_json::Value>> = events
        .iter()
        .map(|f| {
            f.iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .collect();
    reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .json(&body)
        .send()
        .await
        .expect("post")
}

/// A tip spread over 97 rooms and ten minutes.
pub fn spread_tip(i: usize, now: i64) -> Fields {
    let values = [
        format!("room{}", i % 97),
        format!("u{}", i % 31),
        (1 + i % 7).to_string(),
        format!("s{i}"),
        (now - (i as i64 * 331) % 600_000).to_string(),
    ];
    let names = ["room", "user", "amount", "id", "ts"].map(String::from);
    names.into_iter().zip(values).collect()
}

/// A stream entry: its ID and fields.
pub type Letter = (String, HashMap<String, String>);

/// Every entry of the stream `key`, in order.
pub async fn stream_entries(store: &Store, key: &str) -> Vec<Letter> {
    store
        .client()
        .xrange(key, "-", "+", None)
        .await
        .expect("xrange")
}

/// The dead letters in `rb:events:dead`, in order.
pub async fn letters(store: &Store) -> Vec<Letter> {
    stream_entries(store, dead_letter_stream()).await
}

/// JSON lines of `n` tips to rooms r0..r2, each 1..=3.
pub fn tips(prefix: &str, n: usize) -> String {
    let now = rollboard::domain::clock::local_ms();
    (0..n)
        .map(|i| {
            format!(
                "{{\"room\":\"r{}\",\"user\":\"u{}\",\"amount\":{},\"id\":\"{prefix}{i}\",\"ts\":{}}}\n",
                i % 3,
                i % 5,
                1 + i % 3,
                now - 1_000 - i as i64
            )
        })
        .collect()
}

/// What `n` [`tips`] add up to.
pub fn tips_total(n: usize) -> i64 {
    (0..n).map(|i| 1 + (i % 3) as i64).sum()
}

/// Event `i` of a mixed feed: a [`payment`] where `i % 4 == payment_at`, else a [`tip`].
pub fn tip_or_payment(i: usize, now: i64, payment_at: usize) -> Fields {
    if i % 4 == payment_at {
        payment(i, now)
    } else {
        tip(i, now)
    }
}

/// Appends one entry of `fields` to the stream `key`; its ID.
pub async fn xadd_one(store: &Store, key: &str, fields: Vec<(&str, &str)>) -> String {
    store
        .client()
        .xadd(key, false, None, "*", fields)
        .await
        .expect("xadd")
}

/// `n` events `{prefix}0`, `{prefix}1`, …: event `i` for member `m{i % 7}` of amount
/// `i + 1`, at `latest - (i % slices) * slice` (spread over the `slices` slices up to
/// `latest`'s).
pub fn cycled_events(
    prefix: &str,
    n: i64,
    latest: i64,
    slice: i64,
    slices: i64,
) -> Vec<rollboard::store::ApplyEvent> {
    (0..n)
        .map(|i| {
            let (id, member) = (format!("{prefix}{i}"), format!("m{}", i % 7));
            crate::support::boards::ev(&id, latest - (i % slices) * slice, &member, i + 1)
        })
        .collect()
}

/// `n` events `e0`, `e1`, …: event `i` at `latest - i * step` ms, for member `m{i % members}`,
/// of amount `i + 1`.
pub fn stepped_events(
    n: i64,
    latest: i64,
    step: i64,
    members: i64,
) -> Vec<rollboard::store::ApplyEvent> {
    (0..n)
        .map(|i| {
            crate::support::boards::ev(
                &format!("e{i}"),
                latest - i * step,
                &format!("m{}", i % members),
                i + 1,
            )
        })
        .collect()
}

/// Reads up to `count` new entries of the intake stream as `consumer` of `group` and
/// leaves them unacked, pending as a consumer that died before its acks leaves them.
pub async fn read_unacked(store: &Store, group: &str, consumer: &str, count: u64) {
    let _: fred::types::Value = store
        .client()
        .xreadgroup(
            group,
            consumer,
            Some(count),
            None,
            false,
            intake_stream(),
            ">",
        )
        .await
        .expect("read without acking");
}

/// The length of the stream `key` (0 when it does not exist).
pub async fn stream_len(store: &Store, key: &str) -> i64 {
    store.client().xlen(key).await.expect("xlen")
}

/// Whether `key` exists: 1, or 0.
pub async fn existing(store: &Store, key: &str) -> i64 {
    store.client().exists(key).await.expect("exists")
}
