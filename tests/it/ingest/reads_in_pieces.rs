//! A batch is read in several XREADGROUP calls of `read_piece` entries and claimed in
//! XAUTOCLAIM calls of `claim_piece`: every entry comes once, in stream order, whether new,
//! re-read from the own pending list or claimed, and the consumer applies each exactly once.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use rollboard::config::IngestSettings;
use rollboard::ingest::consumer::Ingest;
use rollboard::ingest::stream::{self, ensure_group, group_info};
use rollboard::metrics::Metrics;
use rollboard::store::{Reconnect, Store};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{board, ingest_settings, now_ms, redis_now, total_at};
use crate::support::events::read_unacked;
use crate::support::keys::intake_stream;
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

/// Batches of 10 read in pieces of 3, claims in pieces of 4.
fn settings() -> IngestSettings {
    IngestSettings {
        batch_size: 10,
        read_piece: 3,
        claim_piece: 4,
        ..ingest_settings(intake_stream(), 1)
    }
}

/// Appends `n` events (`e<i>`, user `u<i mod 5>`, amount i + 1); their entry IDs in order.
async fn append(store: &Store, from: usize, n: usize, now: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for i in from..from + n {
        let id: String = store
            .client()
            .xadd(
                intake_stream(),
                false,
                None,
                "*",
                vec![
                    ("user", format!("u{}", i % 5)),
                    ("amount", (i + 1).to_string()),
                    ("id", format!("e{i}")),
                    ("ts", now.to_string()),
                ],
            )
            .await
            .expect("xadd");
        ids.push(id);
    }
    ids
}

fn ids(entries: &[stream::Entry]) -> Vec<String> {
    entries.iter().map(|e| e.id.clone()).collect()
}

#[tokio::test]
async fn new_pending_and_claimed_entries_come_once_each_in_stream_order() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let settings = settings();
    let appended = append(&store, 0, 23, now_ms()).await;
    ensure_group(store.client(), intake_stream(), &settings.group)
        .await
        .expect("group");
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .expect("reader");

    // New entries: batches of 10 (pieces 3 + 3 + 3 + 1), the last one short.
    let mut read = Vec::new();
    for expected in [10, 10, 3, 0] {
        let batch = stream::read(&reader, &settings, intake_stream(), ">", Some(50))
            .await
            .expect("read");
        assert_eq!(batch.len(), expected);
        read.extend(ids(&batch));
    }
    assert_eq!(read, appended);

    // The same entries re-read from the own pending list, each batch after the last.
    let (mut reread, mut from) = (Vec::new(), "0".to_string());
    for expected in [10, 10, 3, 0] {
        let batch = stream::read(&reader, &settings, intake_stream(), &from, None)
            .await
            .expect("pending read");
        assert_eq!(batch.len(), expected);
        if let Some(last) = batch.last() {
            from = last.id.clone();
        }
        reread.extend(ids(&batch));
    }
    assert_eq!(reread, appended);

    // Claimed by another consumer, at most `claim_piece` a call, until the cursor ends.
    let other = IngestSettings {
        consumer: "c2".into(),
        claim_idle: Duration::ZERO,
        ..settings.clone()
    };
    let (mut claimed, mut start) = (Vec::new(), "0-0".to_string());
    loop {
        let (next, entries) = stream::claim(store.client(), &other, intake_stream(), &start, 10)
            .await
            .expect("claim");
        assert!(entries.len() <= 4, "{} claimed in one call", entries.len());
        claimed.extend(ids(&entries));
        if next == "0-0" {
            break;
        }
        start = next;
    }
    assert_eq!(claimed, appended);
}

#[tokio::test]
async fn a_consumer_reading_in_pieces_applies_every_entry_once() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let store = Arc::new(store);
    let board = board("b", 3_600_000, 24);
    let boards = Arc::new(vec![board.clone()]);
    let settings = IngestSettings {
        claim_idle: Duration::from_millis(200),
        ..settings()
    };
    let now = redis_now(&store).await;
    ensure_group(store.client(), intake_stream(), &settings.group)
        .await
        .expect("group");
    // 37 entries pending for this consumer (as after a crash), 41 for one that is gone,
    // then 29 new ones.
    let mut n = 0;
    for (consumer, count) in [("c1", 37), ("gone", 41)] {
        append(&store, n, count, now).await;
        n += count;
        read_unacked(&store, settings.group.as_str(), consumer, 1000).await;
    }
    append(&store, n, 29, now).await;
    n += 29;
    tokio::time::sleep(settings.claim_idle).await;

    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .expect("reader");
    let metrics = Arc::new(Metrics::new(&boards));
    let ingest = Ingest::new(store.clone(), reader, settings.clone(), boards, metrics);
    let cancel = CancellationToken::new();
    let running = tokio::spawn(ingest.run(cancel.clone()));
    let drained = wait_for(Duration::from_secs(30), || async {
        matches!(
            group_info(store.client(), intake_stream(), &settings.group).await,
            Ok(Some((0, Some(0))))
        )
    })
    .await;
    cancel.cancel();
    running.await.expect("consumer task");
    assert!(drained, "the group still has entries pending or unread");
    for user in 0..5 {
        let expected: i64 = (0..n).filter(|i| i % 5 == user).map(|i| i as i64 + 1).sum();
        assert_eq!(
            total_at(&store, &board.widest(), &format!("u{user}"), now).await,
            Some(expected),
            "u{user}"
        );
    }
}
