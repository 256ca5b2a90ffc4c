//! Where a sharded board's events go, through the ingest path itself: each member's
//! events land in its shard (`Board::shard_of`, CRC-32 of the member's bytes mod K),
//! under the keys `rb:{<board>:#i}:...`, never under the board's own hash tag; members of
//! every shape (unicode, the longest name, characters of the key schema, names whose
//! hashes sit at the edges) are found by queries where ingest put them; a redelivered
//! event counts once. An event id is remembered per shard, as per scope on a scoped board:
//! an id reused for a member of the same shard is a duplicate, for a member of another
//! shard it counts there too.

use fred::prelude::*;
use rollboard::domain::board::Board;
use rollboard::store::Store;

use super::{apply_sharded, members_by_shard, now0, shard_index, sharded};
use crate::support::asserts::assert_verified;
use crate::support::boards::{
    apply_events, board, entry, ev, ingest_settings, keys_matching, registered, remembers,
    total_at, Consumer, HOUR,
};
use crate::support::keys::{instance, intake_stream, prefix, under};
use crate::support::redis::RedisServer;

/// One stream entry of `member` at `ts` with `amount` and the event id `id`.
fn tip(n: usize, id: &str, ts: i64, member: &str, amount: i64) -> rollboard::ingest::stream::Entry {
    entry(
        &format!("{ts}-{n}"),
        &[
            ("id", id),
            ("ts", &ts.to_string()),
            ("user", member),
            ("amount", &amount.to_string()),
        ],
    )
}

/// Processes `batch` as the daemon's consumer does, for the one board `b`.
async fn ingest(store: &Store, b: &Board, batch: &[rollboard::ingest::stream::Entry], now: i64) {
    let boards = vec![b.clone()];
    let metrics = rollboard::metrics::Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let held = Consumer::new(store, &boards, &settings, &metrics)
        .process(intake_stream(), batch, now)
        .await
        .expect("batch");
    assert_eq!(held.entries, 0, "{:?}", held.error);
}

/// The members recorded in the instance `scope` of `b`.
async fn members_in(store: &Store, b: &Board, scope: Option<&str>) -> Vec<String> {
    let mut m: Vec<String> = store
        .client()
        .hkeys(store.instance(&b.widest(), scope).members())
        .await
        .expect("HKEYS");
    m.sort();
    m
}

#[test]
fn the_shard_of_a_member_is_crc32_of_its_bytes_mod_k() {
    // CRC-32/IEEE of "123456789" is 0xCBF43926 = 3421780262; of "" it is 0.
    let mut b = sharded("b", 4);
    assert_eq!(b.shard_of("123456789").as_deref(), Some("#2"));
    assert_eq!(b.shard_of("").as_deref(), Some("#0"));
    b.shards = 64;
    assert_eq!(b.shard_of("123456789").as_deref(), Some("#38"));
    b.shards = 7;
    assert_eq!(
        b.shard_of("123456789").as_deref(),
        Some(format!("#{}", 3_421_780_262u64 % 7).as_str())
    );
    assert_eq!(b.shard_names(), ["#0", "#1", "#2", "#3", "#4", "#5", "#6"]);
    // The same name in another normal form is another member, maybe in another shard.
    b.shards = 64;
    let (nfc, nfd) = ("é", "e\u{301}");
    assert_ne!(b.shard_of(nfc), b.shard_of(nfd));
}

#[tokio::test]
async fn every_event_of_a_member_lands_in_its_shard_and_queries_find_it_there() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = sharded("tips", 4);
    let now = now0();
    let longest = "ж".repeat(128); // 256 bytes, the longest member name
    let mut members: Vec<String> = vec![
        longest.clone(),
        "ünïcödé ☃ 🎉".into(),
        "#0".into(),
        "{tips}".into(),
        "a:b}c{".into(),
        "123456789".into(),
        " ".into(),
        "*?[x]".into(),
    ];
    members.extend(members_by_shard(&b, "m", 2).concat());
    // Each member in three batches, at three times.
    let mut n = 0;
    for round in 0..3i64 {
        let batch: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                n += 1;
                tip(
                    n,
                    &format!("r{round}.{i}"),
                    now - round * HOUR,
                    m,
                    i as i64 + 1,
                )
            })
            .collect();
        ingest(&store, &b, &batch, now).await;
    }
    for (s, shard) in b.shard_names().iter().enumerate() {
        let mut want: Vec<String> = members
            .iter()
            .filter(|m| shard_index(&b, m) == s)
            .cloned()
            .collect();
        want.sort();
        assert_eq!(members_in(&store, &b, Some(shard)).await, want, "{shard}");
        let keys = keys_matching(&store, &under(&instance("tips", Some(shard)), "*")).await;
        assert!(
            keys.iter()
                .any(|k| *k == instance("tips", Some(shard)).result()),
            "{shard}: {keys:?}"
        );
        assert!(registered(&store, "tips", shard).await, "{shard}");
    }
    assert_eq!(
        keys_matching(&store, &under(&instance("tips", None), "*")).await,
        Vec::<String>::new()
    );
    // Every key of the board is a shard's or a board-level record.
    for key in keys_matching(&store, &format!("{}:*tips*", prefix())).await {
        let read = store.keys().board_key("tips", &key);
        assert!(
            matches!(
                &read,
                Some(rollboard::domain::keys::BoardKey::Instance { scope: Some(s), .. })
                    if b.shard_names().contains(s)
            ) || matches!(read, Some(rollboard::domain::keys::BoardKey::Record(_))),
            "{key}: {read:?}"
        );
    }
    for (i, m) in members.iter().enumerate() {
        let r = store.rank(&b.widest(), None, m, now).await.expect("rank");
        assert_eq!(r.total, Some(3 * (i as i64 + 1)), "{m}");
        let subset = store
            .ranks(&b.widest(), None, &[m.as_str(), "nobody"], now)
            .await
            .expect("ranks");
        assert_eq!(subset.entries[0].total, Some(3 * (i as i64 + 1)), "{m}");
    }
    let top = store
        .top(&b.widest(), None, 0, 100, now)
        .await
        .expect("top");
    assert_eq!(top.envelope.count, members.len() as u64);
    assert_eq!(top.entries[0].member, members[members.len() - 1]);
}

#[tokio::test]
async fn a_redelivered_event_counts_once() {
    use rollboard::store::Outcome::*;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = sharded("tips", 4);
    let now = now0();
    let members = members_by_shard(&b, "u", 1).concat();
    let batch: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(i, m)| tip(i, &format!("id{i}"), now, m, 5))
        .collect();
    ingest(&store, &b, &batch, now).await;
    // The same entries again (a redelivery after a crash before the XACK), and again in
    // one batch with the new ones, and once more through the store.
    ingest(&store, &b, &batch, now).await;
    let mut again = batch.clone();
    again.push(tip(99, "new", now, &members[0], 1));
    ingest(&store, &b, &again, now).await;
    let evs: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(i, m)| ev(&format!("id{i}"), now, m, 5))
        .collect();
    assert_eq!(
        apply_sharded(&store, &b, &evs, now).await,
        vec![Duplicate; members.len()]
    );
    for (i, m) in members.iter().enumerate() {
        let want = if i == 0 { 6 } else { 5 };
        assert_eq!(
            total_at(&store, &b.widest(), m, now).await,
            Some(want),
            "{m}"
        );
    }
    for shard in b.shard_names() {
        assert_verified(&store, &b.widest(), Some(&shard)).await;
    }
}

/// An id is remembered by the shard that applied it (as a scoped board remembers it per
/// scope): reused for another member of the same shard it is a duplicate and dropped;
/// reused for a member of another shard it is that shard's first sight of it, and counts.
#[tokio::test]
async fn an_id_reused_for_a_member_of_another_shard_counts_in_each_shard_per_shard_dedup() {
    use rollboard::store::Outcome::*;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = sharded("tips", 2);
    let by_shard = members_by_shard(&b, "u", 2);
    let (a0, a1, other) = (&by_shard[0][0], &by_shard[0][1], &by_shard[1][0]);
    let now = now0();
    ingest(&store, &b, &[tip(0, "same", now, a0, 5)], now).await;
    ingest(&store, &b, &[tip(1, "same", now, a1, 7)], now).await;
    ingest(&store, &b, &[tip(2, "same", now, other, 11)], now).await;
    assert_eq!(total_at(&store, &b.widest(), a0, now).await, Some(5));
    assert_eq!(
        total_at(&store, &b.widest(), a1, now).await,
        None,
        "same shard: a duplicate"
    );
    assert_eq!(
        total_at(&store, &b.widest(), other, now).await,
        Some(11),
        "another shard: counted there"
    );
    assert!(remembers(&store, &b, Some("#0"), "same", b.slice_of(now)).await);
    assert!(remembers(&store, &b, Some("#1"), "same", b.slice_of(now)).await);
    // Each shard now knows it: a fourth use is a duplicate wherever it goes.
    let evs = [ev("same", now, a1, 1), ev("same", now, &by_shard[1][1], 1)];
    assert_eq!(
        apply_sharded(&store, &b, &evs, now).await,
        [Duplicate, Duplicate]
    );
    // On the board of one instance, the second use of the id is a duplicate too.
    let plain = board("plain", HOUR, 6);
    let evs = [ev("same", now, a0, 5), ev("same", now, other, 11)];
    assert_eq!(
        apply_events(&store, &plain, &evs, now).await,
        [Applied, Duplicate]
    );
}
