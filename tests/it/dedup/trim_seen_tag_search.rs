//! The tag search of `trim_seen.lua`: it drops only the entries of the slice it trims,
//! whatever the digests hold, and agrees with an entry-by-entry decode.

use fred::prelude::*;

use crate::support::boards::now_ms;
use crate::support::redis::{fcall, RedisServer};

/// One 20-byte digest-table entry: the digest, then the slice tag, big-endian.
fn entry(digest: [u8; 16], tag: u32) -> Vec<u8> {
    let mut e = digest.to_vec();
    e.extend_from_slice(&tag.to_be_bytes());
    e
}

/// Runs `trim_seen.lua` on a table of one bucket (`#L` 0: every log entry addresses
/// bucket "0"), forgetting slice `n` with `log` entries taken.
async fn trim(
    client: &Client,
    table: &str,
    log: &str,
    n: u32,
    take: usize,
) -> Result<Vec<i64>, fred::error::Error> {
    fcall(
        client,
        "trim_seen",
        vec!["t:legacy".to_string(), table.to_string(), log.to_string()],
        vec![
            now_ms().to_string(),
            "128".to_string(),
            n.to_string(),
            take.to_string(),
        ],
    )
    .await
}

async fn seed_table(client: &Client, table: &str, log: &str, bucket: &[u8], held: usize) {
    let _: () = client.del(table).await.expect("del");
    let _: () = client.del(log).await.expect("del");
    let _: () = client
        .hset(
            table,
            vec![
                ("#L", b"0".to_vec()),
                ("#p", b"0".to_vec()),
                ("#n", held.to_string().into_bytes()),
            ],
        )
        .await
        .expect("hset state");
    if !bucket.is_empty() {
        let _: () = client
            .hset(table, ("0", bucket.to_vec()))
            .await
            .expect("hset");
    }
    let _: () = client
        .rpush(log, vec![vec![0u8, 0, 0, 7], vec![1u8, 2, 3, 4]])
        .await
        .expect("rpush log");
}

#[tokio::test]
async fn trim_seen_drops_only_aligned_tags_whatever_the_digests_hold() {
    let (_redis, store) = RedisServer::start_with_store("t").await;
    let client = store.client();
    let tag: u32 = 0x0A0B_0C0D;
    let tb = tag.to_be_bytes();
    let other: u32 = 0x0A0B_0C0E;
    // Digests holding the tag at every unaligned offset, and tags of other slices that
    // together with the next digest spell it out.
    let mut entries: Vec<(Vec<u8>, bool)> = Vec::new();
    for off in 0..=12 {
        let mut d = [0x55u8; 16];
        d[off..off + 4].copy_from_slice(&tb);
        entries.push((entry(d, other), false));
        if off % 3 == 0 {
            entries.push((entry([off as u8; 16], tag), true));
        }
    }
    // The tag straddling a digest's end and its own tag: digest ends 0A 0B, tag 0C 0D ..
    let mut d = [0x11u8; 16];
    d[14] = tb[0];
    d[15] = tb[1];
    entries.push((entry(d, u32::from_be_bytes([tb[2], tb[3], 0, 0])), false));
    // An other slice's tag 0A 0B 0C followed by a digest starting 0D.
    let mut d = [0x22u8; 16];
    d[0] = tb[3];
    entries.push((
        entry([0x33; 16], u32::from_be_bytes([0x99, tb[0], tb[1], tb[2]])),
        false,
    ));
    entries.push((entry(d, other), false));
    // Two of the slice's in a row, and the slice's last.
    entries.push((entry([0x44; 16], tag), true));
    entries.push((entry(tb.repeat(4).try_into().expect("16 bytes"), tag), true));
    entries.push((entry([0x66; 16], other), false));
    entries.push((entry([0x77; 16], tag), true));
    let bucket: Vec<u8> = entries.iter().flat_map(|(e, _)| e.clone()).collect();
    let kept: Vec<u8> = entries
        .iter()
        .filter(|(_, dropped)| !dropped)
        .flat_map(|(e, _)| e.clone())
        .collect();
    let dropped = entries.iter().filter(|(_, d)| *d).count();
    let held = entries.len() + 5;
    seed_table(client, "t:seen:ids", "t:seen:9", &bucket, held).await;
    let got = trim(client, "t:seen:ids", "t:seen:9", tag, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 2, dropped as i64]);
    let after: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(after.len(), kept.len(), "bucket length");
    assert_eq!(after, kept, "the other slices' entries kept in order");
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, (held - dropped).to_string());
    let log_len: i64 = client.llen("t:seen:9").await.expect("llen");
    assert_eq!(log_len, 0);
    // A repeat finds nothing more.
    let _: () = client
        .rpush("t:seen:9", vec![vec![0u8, 0, 0, 1]])
        .await
        .expect("rpush");
    let got = trim(client, "t:seen:ids", "t:seen:9", tag, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 1, 0]);
    let again: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(again, kept);
}

#[tokio::test]
async fn trim_seen_deletes_a_bucket_of_only_the_slice_and_leaves_an_empty_one_alone() {
    let (_redis, store) = RedisServer::start_with_store("t").await;
    let client = store.client();
    let tag: u32 = 0xFFFF_FFFF;
    // Slice numbers wrap at 2^32: n = 2^32 + tag forgets the same tag.
    let n_wrapped = (1u64 << 32) + tag as u64;
    let bucket: Vec<u8> = (0..17u8).flat_map(|i| entry([i; 16], tag)).collect();
    seed_table(client, "t:seen:ids", "t:seen:1", &bucket, 17).await;
    let got: Vec<i64> = fcall(
        client,
        "trim_seen",
        vec!["t:legacy", "t:seen:ids", "t:seen:1"],
        vec![
            now_ms().to_string(),
            "128".into(),
            n_wrapped.to_string(),
            "128".into(),
        ],
    )
    .await
    .expect("trim");
    assert_eq!(got, vec![0, 2, 17]);
    let exists: bool = client.hexists("t:seen:ids", "0").await.expect("hexists");
    assert!(
        !exists,
        "a bucket emptied is deleted, not left as an empty string"
    );
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "0");

    // No bucket at the address: nothing is written but the log taken.
    seed_table(client, "t:seen:ids", "t:seen:1", &[], 3).await;
    let got = trim(client, "t:seen:ids", "t:seen:1", 5, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 2, 0]);
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "3");
    let fields: Vec<String> = client.hkeys("t:seen:ids").await.expect("hkeys");
    assert_eq!(fields.len(), 3, "{fields:?}");

    // A bucket whose only bytes equal to the tag are in digests.
    let tb = 5u32.to_be_bytes();
    let bucket: Vec<u8> = entry(
        [
            tb[0], tb[1], tb[2], tb[3], 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 5,
        ],
        0,
    );
    seed_table(client, "t:seen:ids", "t:seen:1", &bucket, 1).await;
    let got = trim(client, "t:seen:ids", "t:seen:1", 5, 1)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 1, 0]);
    let after: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(after, bucket);
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "1");
}

#[tokio::test]
async fn trim_seen_agrees_with_an_entry_by_entry_decode_on_random_buckets() {
    let (_redis, store) = RedisServer::start_with_store("t").await;
    let client = store.client();
    let tag: u32 = 0x0A0B_0A0B;
    let bytes = [0x0Au8, 0x0B, 0x0A, 0x0B, 0x00];
    let tags = [tag, 0x0B0A_0B0A, 0x0A0B_0A0A, 0x000A_0B0A, 0x0B0A_0B00];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |below: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    for round in 0..300 {
        let len = next(24) as usize;
        let mut bucket = Vec::new();
        let mut kept = Vec::new();
        let mut dropped = 0usize;
        for _ in 0..len {
            let mut d = [0u8; 16];
            for b in d.iter_mut() {
                *b = bytes[next(bytes.len() as u64) as usize];
            }
            let t = tags[next(tags.len() as u64) as usize];
            let e = entry(d, t);
            bucket.extend_from_slice(&e);
            if t == tag {
                dropped += 1;
            } else {
                kept.extend_from_slice(&e);
            }
        }
        let held = len + 3;
        seed_table(client, "t:seen:ids", "t:seen:2", &bucket, held).await;
        let got = trim(client, "t:seen:ids", "t:seen:2", tag, 128)
            .await
            .expect("trim");
        assert_eq!(got, vec![0, 2, dropped as i64], "round {round}");
        let after: Option<Vec<u8>> = client.hget("t:seen:ids", "0").await.expect("hget");
        if kept.is_empty() {
            assert_eq!(after, None, "round {round}: an emptied bucket is deleted");
        } else {
            assert_eq!(after, Some(kept), "round {round}");
        }
        let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
        assert_eq!(n, (held - dropped).to_string(), "round {round}");
    }
}
