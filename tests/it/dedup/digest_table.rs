//! Idempotency keys as digests (docs/design.md, *Exactly once*): the linear-hash digest table
//! keeps its invariants through thousands of ids and many splits, a batch split into
//! calls and replayed after a crash counts every event once, keys are forgotten with
//! their slices, the layout before digests is still honoured, and a broken digest table
//! fails a call before anything is written.

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Dedup};
use rollboard::roll::{self, Job, Report};
use rollboard::store::{ApplyEvent, Outcome, Store};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{
    apply_events, apply_events_in, board, ev, remembers, scoped, seen_logs, seen_table, set_string,
    snapshot,
};
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::{proptest_runner, runtime, runtime_with_store, Lcg};
use crate::support::redis::{keyed, RedisServer};

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

/// `len` events with ids drawn from `ids` distinct ones (so many repeat), members a..h,
/// in the `slices` newest slices before `NOW`.
fn events(rng: &mut Lcg, len: usize, ids: u64, slices: u64) -> Vec<ApplyEvent> {
    (0..len)
        .map(|_| {
            let id = format!("id-{}", rng.next(ids));
            let member = ["a", "b", "c", "d", "e", "f", "g", "h"][rng.next(8) as usize];
            let ts = NOW - rng.next(slices) as i64 * SLICE - rng.next(SLICE as u64) as i64;
            ev(&id, ts, member, 1 + rng.next(9) as i64)
        })
        .collect()
}

async fn roll_at(store: &Store, b: &Board, now: i64) -> Report {
    let mut reports = roll::run_once(
        store,
        std::slice::from_ref(b),
        Job::All,
        None,
        now,
        100,
        &CancellationToken::new(),
    )
    .await
    .expect("roll");
    let r = reports.remove(0);
    assert_eq!(r.instances_failed, 0, "{:?}", r.first_error);
    r
}

/// The digests the model remembers at `now`, with their slices, as the table holds them.
fn expected_entries(b: &Board, applied: &[(String, i64)], now: i64) -> Vec<([u8; 16], u32)> {
    let mut out: Vec<([u8; 16], u32)> = applied
        .iter()
        .filter(|(_, n)| b.forget_at(*n) > now)
        .map(|(id, n)| (rollboard::store::id_digest(id), *n as u32))
        .collect();
    out.sort();
    out
}

#[test]
fn the_digest_table_splits_through_thousands_of_ids_and_keeps_its_invariants() {
    let (rt, _redis, store) = runtime_with_store();
    proptest_runner(6)
        .run(
            &(any::<u64>(), 2_000usize..4_000, 1u64..3),
            |(seed, len, slices)| {
                rt.block_on(async {
                    let _: () = store.client().flushall(false).await.unwrap();
                    let b = board("dig", SLICE, 4);
                    let mut rng = Lcg(seed);
                    let mut model = Instance::default();
                    let mut applied = Vec::new();
                    let batch = events(&mut rng, len, len as u64 * 3 / 4, slices);
                    // In pieces of random length, each piece delivered twice.
                    let mut at = 0;
                    while at < batch.len() {
                        let end = (at + 1 + rng.next(300) as usize).min(batch.len());
                        for _ in 0..2 {
                            let part = &batch[at..end];
                            let want = model.apply_all(&b.widest(), part, NOW);
                            let got = apply_events(&store, &b, part, NOW).await;
                            assert_eq!(got, want, "seed {seed}");
                            for (e, o) in part.iter().zip(&got) {
                                if *o == Outcome::Applied {
                                    applied.push((e.id.clone(), b.slice_of(e.ts)));
                                }
                            }
                        }
                        at = end;
                    }
                    let mut held = seen_table(&store, &b.widest(), None).await;
                    held.sort();
                    assert_eq!(held, expected_entries(&b, &applied, NOW), "seed {seed}");
                    let state: Vec<String> = store
                        .client()
                        .hmget(
                            store.instance(&b.widest(), None).seen_table(),
                            vec!["#L", "#p"],
                        )
                        .await
                        .unwrap();
                    let buckets = (1u64 << state[0].parse::<u32>().unwrap())
                        + state[1].parse::<u64>().unwrap();
                    assert!(buckets >= held.len() as u64 / 16, "{buckets} buckets");
                    assert!(buckets > 64, "many splits: {buckets} buckets");
                    // Every log entry is the bucket hash of an entry of its slice.
                    let logs = seen_logs(&store, &b.widest(), None).await;
                    let mut logged = 0;
                    for key in &logs {
                        logged += store.client().llen::<u64, _>(key).await.unwrap();
                    }
                    assert_eq!(logged, held.len() as u64, "{logs:?}");
                    assert_matches(&store, &b.widest(), None, &model, NOW).await;
                });
                Ok(())
            },
        )
        .expect("digest table");
}

#[test]
fn a_batch_split_into_calls_and_replayed_after_a_crash_counts_every_event_once() {
    let (rt, _redis, store) = runtime_with_store();
    proptest_runner(24)
        .run(
            &(
                any::<u64>(),
                50usize..400,
                prop::collection::vec(0usize..400, 0..6),
                0usize..7,
            ),
            |(seed, len, cuts, crash_after)| {
                rt.block_on(async {
                    let _: () = store.client().flushall(false).await.unwrap();
                    let mut b = board("crash", SLICE, 4);
                    if seed % 2 == 1 {
                        b.dedup = Dedup::AfterSlice(SLICE / 2);
                    }
                    let mut rng = Lcg(seed);
                    let batch = events(&mut rng, len, len as u64 / 2, 3);
                    let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % len).collect();
                    cuts.extend([0, len]);
                    cuts.sort();
                    cuts.dedup();
                    let mut model = Instance::default();
                    // Some calls, then the crash, then the whole batch again.
                    for w in cuts.windows(2).take(crash_after) {
                        let part = &batch[w[0]..w[1]];
                        let want = model.apply_all(&b.widest(), part, NOW);
                        assert_eq!(apply_events(&store, &b, part, NOW).await, want);
                    }
                    let want = model.apply_all(&b.widest(), &batch, NOW);
                    assert_eq!(apply_events(&store, &b, &batch, NOW).await, want);
                    assert_matches(&store, &b.widest(), None, &model, NOW).await;
                    seen_table(&store, &b.widest(), None).await;
                });
                Ok(())
            },
        )
        .expect("replay");
}

#[tokio::test]
async fn digests_are_forgotten_with_their_slices_and_nothing_is_left_behind() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for dedup in [Dedup::Window, Dedup::AfterSlice(SLICE / 2)] {
        let _: () = store.client().flushall(false).await.unwrap();
        let mut b = board("fg", SLICE, 4);
        b.dedup = dedup;
        let mut rng = Lcg(7);
        let mut model = Instance::default();
        let mut applied = Vec::new();
        // Four slices of events, then rolls through the window, a redelivery after each.
        let batch = events(&mut rng, 600, 500, 4);
        for e in &batch {
            if model.apply(&b.widest(), e, NOW) == Outcome::Applied {
                applied.push((e.id.clone(), b.slice_of(e.ts)));
            }
        }
        apply_events(&store, &b, &batch, NOW).await;
        // The ids remembered: applied in a slice whose ids could not be forgotten yet.
        let mut remembered = applied
            .iter()
            .filter(|(_, n)| b.forget_at(*n) > NOW)
            .count();
        let mut forgotten = 0;
        for step in 0..6 {
            let now = NOW + step * SLICE + SLICE / 2;
            let report = roll_at(&store, &b, now).await;
            forgotten += report.ids_forgotten;
            model.roll(&b.widest(), now);
            let mut held = seen_table(&store, &b.widest(), None).await;
            held.sort();
            assert_eq!(held, expected_entries(&b, &applied, now), "{dedup:?} {now}");
            // A log exists exactly for the slices still remembered.
            let mut want_logs: Vec<String> = applied
                .iter()
                .filter(|(_, n)| b.forget_at(*n) > now)
                .map(|(_, n)| store.instance(&b.widest(), None).seen_log(*n))
                .collect();
            want_logs.sort();
            want_logs.dedup();
            assert_eq!(
                seen_logs(&store, &b.widest(), None).await,
                want_logs,
                "{dedup:?}"
            );
            let want = model.apply_all(&b.widest(), &batch, now);
            let got = apply_events(&store, &b, &batch, now).await;
            assert_eq!(got, want, "{dedup:?} redelivered at {now}");
            for (e, o) in batch.iter().zip(&got) {
                if *o == Outcome::Applied {
                    applied.push((e.id.clone(), b.slice_of(e.ts)));
                    if b.forget_at(b.slice_of(e.ts)) > now {
                        remembered += 1;
                    }
                }
            }
            assert_matches(&store, &b.widest(), None, &model, now).await;
        }
        // Past the window everything is forgotten, once each.
        let end = NOW + 10 * SLICE;
        forgotten += roll_at(&store, &b, end).await.ids_forgotten;
        assert_eq!(forgotten, remembered as u64, "{dedup:?}");
        assert_eq!(seen_table(&store, &b.widest(), None).await, vec![]);
        assert_eq!(
            seen_logs(&store, &b.widest(), None).await,
            Vec::<String>::new()
        );
    }
}

#[tokio::test]
async fn a_scope_that_empties_leaves_no_digest_table_behind() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = scoped(board("sc", SLICE, 4));
    apply_events_in(&store, &b, "r1", &[ev("x", NOW, "a", 5)], NOW).await;
    assert!(remembers(&store, &b, Some("r1"), "x", b.slice_of(NOW)).await);
    roll_at(&store, &b, NOW + 10 * SLICE).await;
    let table = store.instance(&b.widest(), Some("r1")).seen_table();
    assert_eq!(store.client().exists::<i64, _>(&table).await.unwrap(), 0);
    assert_eq!(
        seen_logs(&store, &b.widest(), Some("r1")).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn an_instance_still_holding_the_old_seen_zset_counts_nothing_twice() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("up", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let mut rng = Lcg(11);
    let old = events(&mut rng, 200, 150, 3);
    let mut model = Instance::default();
    for e in &old {
        model.apply(&b.widest(), e, NOW);
    }
    apply_events(&store, &b, &old, NOW).await;
    // Turn the instance into the layout before digests: the raw ids in one ZSet scored
    // by the time each may be forgotten, no digest table, no forget logs.
    let mut zadd: Vec<Value> = Vec::new();
    let mut first: std::collections::HashMap<&str, i64> = Default::default();
    for e in &old {
        first.entry(e.id.as_str()).or_insert(b.slice_of(e.ts));
    }
    for (id, n) in &first {
        zadd.push(b.forget_at(*n).into());
        zadd.push((*id).into());
    }
    let mut doomed = seen_logs(&store, &b.widest(), None).await;
    doomed.push(k.seen_table());
    let _: i64 = store.client().del(doomed).await.unwrap();
    let _: i64 = keyed(&store, "ZADD", [vec![Value::from(k.seen())], zadd].concat()).await;
    let before = snapshot(&store, &b).await;

    // Redelivered after the upgrade, mixed with new events: the old ids are duplicates.
    let mut again = old.clone();
    again.extend(
        events(&mut Lcg(12), 100, 1_000, 3)
            .into_iter()
            .map(|mut e| {
                e.id = format!("new-{}", e.id);
                e
            }),
    );
    let want = model.apply_all(&b.widest(), &again, NOW);
    assert!(want[..old.len()].iter().all(|o| *o == Outcome::Duplicate));
    assert_eq!(apply_events(&store, &b, &again, NOW).await, want);
    let new_ids = seen_count(&want);
    assert_matches(&store, &b.widest(), None, &model, NOW).await;
    assert_ne!(snapshot(&store, &b).await, before);
    // The old ZSet is only read; the new ids went to the digest table.
    let zcard: i64 = store.client().zcard(k.seen()).await.unwrap();
    assert_eq!(zcard, first.len() as i64);
    assert_eq!(seen_table(&store, &b.widest(), None).await.len(), new_ids);
    // A second store (another worker, which has not met the old ZSet yet) also counts
    // nothing twice.
    let other = redis.store("rb").await;
    let want = model.apply_all(&b.widest(), &again, NOW);
    assert_eq!(apply_events(&other, &b, &again, NOW).await, want);
    assert_matches(&store, &b.widest(), None, &model, NOW).await;

    // The roll drains the old ZSet when its ids are due, and it is gone.
    let end = NOW + 10 * SLICE;
    let report = roll_at(&store, &b, end).await;
    assert_eq!(report.ids_forgotten as usize, first.len() + new_ids);
    assert_eq!(store.client().exists::<i64, _>(k.seen()).await.unwrap(), 0);
    model.roll(&b.widest(), end);
    assert_matches(&store, &b.widest(), None, &model, end).await;
}

/// The digest table's `#c`: written by the first call that finds no legacy ZSet, after
/// which calls no longer look for one; a table without it (as the previous release wrote
/// it) still has the legacy ZSet looked up and honoured.
#[tokio::test]
async fn a_digest_table_marks_the_instance_free_of_the_old_seen_zset_once_it_found_none() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("mark", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let clean = |store: &Store| {
        let table = k.seen_table();
        let client = store.client().clone();
        async move {
            client
                .hget::<Option<String>, _, _>(table, "#c")
                .await
                .unwrap()
        }
    };
    let first = [ev("one", NOW - 10, "a", 5)];
    assert_eq!(
        apply_events(&store, &b, &first, NOW).await,
        [Outcome::Applied]
    );
    assert_eq!(clean(&store).await.as_deref(), Some("1"));

    // The mark taken away, as a table the previous release wrote; a legacy ZSet holding
    // the next event's raw id: that event is a duplicate.
    let _: i64 = store.client().hdel(k.seen_table(), "#c").await.unwrap();
    let next = ev("two", NOW - 10, "a", 7);
    let forget = b.forget_at(b.slice_of(next.ts));
    let zadd = vec![Value::from(k.seen()), forget.into(), "two".into()];
    let _: i64 = keyed(&store, "ZADD", zadd).await;
    assert_eq!(
        apply_events(&store, &b, &[next], NOW).await,
        [Outcome::Duplicate]
    );
    assert_eq!(
        clean(&store).await,
        None,
        "no mark while the legacy ZSet exists"
    );
    // Once the legacy ZSet is gone, the next call marks the table again and counts.
    let _: i64 = store.client().del(k.seen()).await.unwrap();
    let third = [ev("three", NOW - 10, "a", 11)];
    assert_eq!(
        apply_events(&store, &b, &third, NOW).await,
        [Outcome::Applied]
    );
    assert_eq!(clean(&store).await.as_deref(), Some("1"));
    let mut model = Instance::default();
    for e in [&first[0], &third[0]] {
        model.apply(&b.widest(), e, NOW);
    }
    assert_matches(&store, &b.widest(), None, &model, NOW).await;
}

/// A call whose events are all duplicates writes nothing, and still checks every key it
/// names: a forget log of the wrong type is a data error there too, as in an event-by-event call.
#[tokio::test]
async fn an_all_duplicate_call_with_a_forget_log_of_the_wrong_type_is_a_data_error() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("dupty", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let events = [ev("x1", NOW - 10, "m", 5), ev("x2", NOW - 10, "n", 2)];
    assert_eq!(
        apply_events(&store, &b, &events, NOW).await,
        [Outcome::Applied; 2]
    );
    set_string(&store, &k.seen_log(b.slice_of(NOW - 10)), "not-a-list").await;
    let got = store.apply(&b, None, &events, NOW).await;
    assert!(
        got.as_ref()
            .is_err_and(|e| e.to_string().contains("WRONGTYPE")),
        "a key of the wrong type is a data error; got {got:?}"
    );
}

fn seen_count(outcomes: &[Outcome]) -> usize {
    outcomes.iter().filter(|o| **o == Outcome::Applied).count()
}

#[tokio::test]
async fn a_broken_digest_table_fails_the_call_before_anything_is_written() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("br", SLICE, 4);
    let table = store.instance(&b.widest(), None).seen_table();
    let mut rng = Lcg(5);
    let mut model = Instance::default();
    let first = events(&mut rng, 400, 300, 2);
    for e in &first {
        model.apply(&b.widest(), e, NOW);
    }
    apply_events(&store, &b, &first, NOW).await;
    let second = events(&mut rng, 200, 600, 2);
    let bucket: String = {
        let fields: Vec<String> = store.client().hkeys(&table).await.unwrap();
        fields.into_iter().find(|f| !f.starts_with('#')).unwrap()
    };
    let original: Vec<u8> = store.client().hget(&table, &bucket).await.unwrap();
    let breaks: Vec<(&str, Vec<u8>, &str)> = vec![
        ("#p", b"99999".to_vec(), "corrupt"),
        ("#L", b"x".to_vec(), "corrupt"),
        ("#n", b"-3".to_vec(), "corrupt"),
    ];
    for (field, value, error) in breaks {
        let saved: Vec<u8> = store.client().hget(&table, field).await.unwrap();
        let _: () = store.client().hset(&table, (field, value)).await.unwrap();
        let before = snapshot(&store, &b).await;
        let e = store.apply(&b, None, &second, NOW).await.unwrap_err();
        assert!(e.to_string().contains(error), "{field}: {e}");
        assert_eq!(
            snapshot(&store, &b).await,
            before,
            "{field}: a failed call wrote"
        );
        let _: () = store.client().hset(&table, (field, saved)).await.unwrap();
    }
    // Every bucket a call may read: a bucket of a length that is no whole number of
    // entries fails any call that addresses it.
    let mut cut = original.clone();
    cut.pop();
    let _: () = store.client().hset(&table, (&bucket, cut)).await.unwrap();
    let mut failed = 0;
    let mut retry = Vec::new();
    for e in &second {
        let before = snapshot(&store, &b).await;
        match store.apply(&b, None, std::slice::from_ref(e), NOW).await {
            Err(err) => {
                assert!(err.to_string().contains("corrupt"), "{err}");
                assert_eq!(snapshot(&store, &b).await, before, "a failed call wrote");
                failed += 1;
                retry.push(e.clone());
            }
            Ok(got) => assert_eq!(got, vec![model.apply(&b.widest(), e, NOW)]),
        }
    }
    assert!(failed > 0);
    let _: () = store
        .client()
        .hset(&table, (&bucket, original))
        .await
        .unwrap();
    // Repaired, the failed calls are retried and count exactly what the model does.
    let want = model.apply_all(&b.widest(), &retry, NOW);
    assert_eq!(apply_events(&store, &b, &retry, NOW).await, want);
    assert_matches(&store, &b.widest(), None, &model, NOW).await;
    seen_table(&store, &b.widest(), None).await;
}

/// Forgetting a slice's digests finds its entries by their 4-byte tag: the same four bytes
/// inside a digest, or across a digest and the next tag, belong to other entries and stay.
#[test]
fn a_slice_tag_inside_a_digest_is_not_taken_for_an_entry_of_the_slice() {
    let rt = runtime();
    let redis = RedisServer::start();
    rt.block_on(async {
        let store = redis.store("rb").await;
        let b = board("tags", SLICE, 4);
        let k = store.instance(&b.widest(), None);
        let c = store.client();
        let n: i64 = 0x0102_0304;
        let tag = [1u8, 2, 3, 4];
        let entry = |digest: [u8; 16], tag: [u8; 4]| [&digest[..], &tag[..]].concat();
        let mut spurious_front = [0xaa; 16];
        spurious_front[..4].copy_from_slice(&tag);
        let mut straddling = [0xbb; 16];
        straddling[14..].copy_from_slice(&tag[..2]);
        let mut inside = [0xdd; 16];
        inside[5..9].copy_from_slice(&tag);
        let kept = [
            entry(spurious_front, [1, 2, 3, 5]),
            entry(straddling, [3, 4, 9, 9]),
            entry([0xcc; 16], [0, 0, 0, 7]),
        ];
        let dropped = [entry([0xee; 16], tag), entry(inside, tag)];
        let bucket = [
            kept[0].clone(),
            dropped[0].clone(),
            kept[1].clone(),
            dropped[1].clone(),
            kept[2].clone(),
        ]
        .concat();
        let _: () = c
            .hset(
                k.seen_table(),
                vec![
                    ("#L", Value::from("0")),
                    ("#p", Value::from("0")),
                    ("#n", Value::from("5")),
                    ("0", Value::Bytes(bucket.into())),
                ],
            )
            .await
            .expect("table");
        let _: () = c
            .rpush(k.seen_log(n), Value::Bytes(vec![0u8; 4].into()))
            .await
            .expect("log");
        let trimmed = store
            .trim_seen(&b.widest(), None, Some(n), NOW, 0)
            .await
            .expect("trim");
        assert_eq!((trimmed.taken, trimmed.digests), (1, 2));
        let left: Vec<u8> = c.hget(k.seen_table(), "0").await.expect("bucket");
        assert_eq!(left, kept.concat());
        let held: i64 = c.hget(k.seen_table(), "#n").await.expect("#n");
        assert_eq!(held, 3);
    });
}
