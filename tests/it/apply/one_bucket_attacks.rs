//! Attacks on the one-bucket fast path of `fold.lua` (a digest table of level 0, no split,
//! judged without locating each digest) and on `write_table` writing `#L`/`#p` only when
//! a split changes them: the first split at 16 + 1 and 15 + 2, forgotten entries in
//! bucket 0, corrupt or hand-written state, packed calls, several windows, and the trim.

use std::collections::HashMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Dedup, Window};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::boards::{
    board, ev, roll_once, scoped, seen_table, total_at, with_fresh_store,
};
use crate::support::instances::{contents_of, twin};

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

fn events(prefix: &str, n: usize, ts: i64) -> Vec<ApplyEvent> {
    (0..n)
        .map(|i| {
            ev(
                &format!("{prefix}-{i}"),
                ts,
                if i % 2 == 0 { "ann" } else { "bob" },
                1 + i as i64,
            )
        })
        .collect()
}

async fn state(store: &Store, b: &Board, scope: Option<&str>) -> HashMap<String, String> {
    let key = store.instance(&b.widest(), scope).seen_table();
    let fields: HashMap<String, Vec<u8>> = store.client().hgetall(&key).await.expect("hgetall");
    fields
        .into_iter()
        .filter(|(f, _)| f.starts_with('#'))
        .map(|(f, v)| (f, String::from_utf8(v).unwrap()))
        .collect()
}

async fn apply(
    store: &Store,
    b: &Board,
    scope: Option<&str>,
    e: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    store.apply(b, scope, e, now).await.expect("apply")
}

fn sum(e: &[ApplyEvent], member: &str) -> i64 {
    e.iter()
        .filter(|e| e.member == member)
        .map(|e| e.amount)
        .sum()
}

/// A board `name` and `n` events on it, the first `held` of them applied (each applied).
async fn seeded(store: &Store, name: &str, n: usize, held: usize) -> (Board, Vec<ApplyEvent>) {
    let b = board(name, SLICE, 4);
    let all = events(name, n, NOW);
    assert_eq!(
        apply(store, &b, None, &all[..held], NOW).await,
        vec![Outcome::Applied; held],
        "{name}"
    );
    (b, all)
}

/// Events `range` of share `i` of a pack: ids `s<i>-<k>`, over three slices, `ann` and
/// `bob` in turn.
fn share_events(i: usize, range: std::ops::Range<usize>) -> Vec<ApplyEvent> {
    range
        .map(|k| {
            ev(
                &format!("s{i}-{k}"),
                NOW - (k as i64 % 3) * SLICE,
                if k % 2 == 0 { "ann" } else { "bob" },
                1 + k as i64,
            )
        })
        .collect()
}

/// The totals of `ann` and `bob` on `b` are their amounts in `e`, summed.
async fn assert_totals(store: &Store, b: &Board, e: &[ApplyEvent]) {
    for member in ["ann", "bob"] {
        assert_eq!(
            total_at(store, &b.widest(), member, NOW).await,
            Some(sum(e, member)),
            "{} {member}",
            b.name
        );
    }
}

/// 16 events (a full bucket 0, no split), then 1 more (the first split), then all 17 again:
/// the table goes from level 0 to level 1 with every entry in the bucket it addresses, and
/// the redelivery is all duplicates; the same with 15 + 2 in one call.
#[tokio::test]
async fn the_first_split_after_a_full_bucket_keeps_every_entry_and_every_duplicate() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for (first, second) in [(16usize, 1usize), (15, 2), (14, 2), (1, 16)] {
        let b = board(&format!("split{first}x{second}"), SLICE, 4);
        let all = events(&b.name, first + second, NOW);
        assert_eq!(
            apply(&store, &b, None, &all[..first], NOW).await,
            vec![Outcome::Applied; first]
        );
        let st = state(&store, &b, None).await;
        assert_eq!(st.get("#L").map(String::as_str), Some("0"), "{}", b.name);
        assert_eq!(st.get("#p").map(String::as_str), Some("0"), "{}", b.name);
        assert_eq!(st.get("#n"), Some(&first.to_string()), "{}", b.name);
        assert_eq!(seen_table(&store, &b.widest(), None).await.len(), first);
        assert_eq!(
            apply(&store, &b, None, &all[first..], NOW).await,
            vec![Outcome::Applied; second]
        );
        let st = state(&store, &b, None).await;
        let total = first + second;
        let level = if total > 16 { "1" } else { "0" };
        assert_eq!(st.get("#L").map(String::as_str), Some(level), "{}", b.name);
        assert_eq!(st.get("#p").map(String::as_str), Some("0"), "{}", b.name);
        assert_eq!(st.get("#n"), Some(&total.to_string()), "{}", b.name);
        // seen_table checks each entry addresses its bucket and #n.
        let mut held: Vec<[u8; 16]> = seen_table(&store, &b.widest(), None)
            .await
            .into_iter()
            .map(|e| e.0)
            .collect();
        held.sort();
        let mut want: Vec<[u8; 16]> = all
            .iter()
            .map(|e| rollboard::store::id_digest(&e.id))
            .collect();
        want.sort();
        assert_eq!(held, want, "{}", b.name);
        assert_eq!(
            apply(&store, &b, None, &all, NOW).await,
            vec![Outcome::Duplicate; total]
        );
        // Each half alone again: duplicates too.
        assert_eq!(
            apply(&store, &b, None, &all[..first], NOW).await,
            vec![Outcome::Duplicate; first]
        );
        assert_eq!(
            apply(&store, &b, None, &all[first..], NOW).await,
            vec![Outcome::Duplicate; second]
        );
        assert_totals(&store, &b, &all).await;
    }
}

/// 15 held, then a call of 2 of which one is already held (mixed: judged one by one), then a
/// call of a held id and 16 new ones.
#[tokio::test]
async fn duplicates_inside_bucket_zero_across_calls_are_judged_one_by_one() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let (b, all) = seeded(&store, "mixed", 40, 15).await;
    let mixed = vec![all[3].clone(), all[15].clone()];
    assert_eq!(
        apply(&store, &b, None, &mixed, NOW).await,
        vec![Outcome::Duplicate, Outcome::Applied]
    );
    assert_eq!(
        state(&store, &b, None).await.get("#n").map(String::as_str),
        Some("16")
    );
    let mut next = vec![all[0].clone()];
    next.extend_from_slice(&all[16..32]);
    let got = apply(&store, &b, None, &next, NOW).await;
    assert_eq!(got[0], Outcome::Duplicate);
    assert_eq!(&got[1..], &vec![Outcome::Applied; 16][..]);
    assert_eq!(seen_table(&store, &b.widest(), None).await.len(), 32);
    let st = state(&store, &b, None).await;
    assert_eq!(st.get("#L").map(String::as_str), Some("1"));
    assert_eq!(st.get("#p").map(String::as_str), Some("0"));
    assert_eq!(
        total_at(&store, &b.widest(), "ann", NOW).await,
        Some(sum(&all[..32], "ann"))
    );
    assert_eq!(
        apply(&store, &b, None, &all[..32], NOW).await,
        vec![Outcome::Duplicate; 32]
    );
}

/// Fields written by hand to a digest table, each a field and its value.
type HandWritten = Vec<(&'static str, Vec<u8>)>;

/// A table whose state is partly missing or corrupt, or whose bucket 0 is not whole
/// entries: the call fails as a data error and writes nothing.
#[tokio::test]
async fn a_corrupt_state_or_bucket_zero_fails_the_call_and_writes_nothing() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let cases: Vec<(&str, HandWritten)> = vec![
        ("nop", vec![("#L", b"0".to_vec()), ("#n", b"3".to_vec())]),
        ("non", vec![("#L", b"0".to_vec()), ("#p", b"0".to_vec())]),
        (
            "nfrac",
            vec![
                ("#L", b"0".to_vec()),
                ("#p", b"0".to_vec()),
                ("#n", b"1.5".to_vec()),
            ],
        ),
        (
            "ntext",
            vec![
                ("#L", b"0".to_vec()),
                ("#p", b"0".to_vec()),
                ("#n", b"x".to_vec()),
            ],
        ),
        (
            "b21",
            vec![
                ("#L", b"0".to_vec()),
                ("#p", b"0".to_vec()),
                ("#n", b"1".to_vec()),
                ("0", vec![7u8; 21]),
            ],
        ),
        ("b19nostate", vec![("0", vec![7u8; 19])]),
    ];
    for (name, fields) in cases {
        let b = board(name, SLICE, 4);
        let key = store.instance(&b.widest(), None).seen_table();
        for (f, v) in &fields {
            let _: () = store
                .client()
                .hset(&key, (*f, v.clone()))
                .await
                .expect("hset");
        }
        let before: HashMap<String, Vec<u8>> = store.client().hgetall(&key).await.unwrap();
        for n in [1usize, 2] {
            let r = store.apply(&b, None, &events(name, n, NOW), NOW).await;
            let e = r.expect_err(name);
            assert!(!e.is_outage(), "{name}: {e}");
            assert!(e.to_string().contains("corrupt"), "{name}: {e}");
        }
        let after: HashMap<String, Vec<u8>> = store.client().hgetall(&key).await.unwrap();
        assert_eq!(before, after, "{name}");
        assert_eq!(
            total_at(&store, &b.widest(), "ann", NOW).await,
            None,
            "{name}"
        );
    }
}

/// A bucket 0 written by hand with no state: its entry is a duplicate; the first write
/// then writes the full state.
#[tokio::test]
async fn a_hand_written_bucket_zero_is_read_by_the_fast_path() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let b = board("hand", SLICE, 4);
    let key = store.instance(&b.widest(), None).seen_table();
    let mut entry = rollboard::store::id_digest("hand-0").to_vec();
    entry.extend_from_slice(&(b.slice_of(NOW) as u32).to_be_bytes());
    let _: () = store.client().hset(&key, ("0", entry)).await.unwrap();
    assert_eq!(
        apply(&store, &b, None, &events("hand", 1, NOW), NOW).await,
        vec![Outcome::Duplicate]
    );
    // Stated table, hand bucket with one entry and #n 1: a new event is remembered.
    let _: () = store
        .client()
        .hset(&key, [("#L", "0"), ("#p", "0"), ("#n", "1")])
        .await
        .unwrap();
    let e = events("hand", 3, NOW);
    assert_eq!(
        apply(&store, &b, None, &e, NOW).await,
        vec![Outcome::Duplicate, Outcome::Applied, Outcome::Applied]
    );
    assert_eq!(seen_table(&store, &b.widest(), None).await.len(), 3);
    assert_eq!(
        total_at(&store, &b.widest(), "ann", NOW).await,
        Some(e[2].amount)
    );
}

/// Ids remembered in a slice whose ids may then be forgotten (a short dedup window), sent
/// again in a later slice while still in bucket 0: applied again; the next split drops them.
#[tokio::test]
async fn entries_that_may_be_forgotten_in_bucket_zero_do_not_count_and_are_dropped_at_the_split() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let mut b = board("short", SLICE, 4);
    b.dedup = Dedup::AfterSlice(SLICE / 2);
    let old = events("short", 8, NOW);
    assert_eq!(
        apply(&store, &b, None, &old, NOW).await,
        vec![Outcome::Applied; 8]
    );
    let later = NOW + 2 * SLICE;
    assert!(b.forgettable_through(later) >= b.slice_of(NOW));
    let again: Vec<ApplyEvent> = old
        .iter()
        .map(|e| ev(&e.id, later, &e.member, e.amount))
        .collect();
    // 8 held + 8 = 16: the one-bucket path, the held entries no longer count.
    assert_eq!(
        apply(&store, &b, None, &again, later).await,
        vec![Outcome::Applied; 8]
    );
    assert_eq!(
        state(&store, &b, None).await.get("#n").map(String::as_str),
        Some("16")
    );
    assert_eq!(
        apply(&store, &b, None, &again, later).await,
        vec![Outcome::Duplicate; 8]
    );
    // One more: the split drops the 8 forgettable entries.
    let one = vec![ev("short-new", later, "ann", 100)];
    assert_eq!(
        apply(&store, &b, None, &one, later).await,
        vec![Outcome::Applied]
    );
    let st = state(&store, &b, None).await;
    assert_eq!(st.get("#L").map(String::as_str), Some("1"));
    assert_eq!(st.get("#p").map(String::as_str), Some("0"));
    assert_eq!(st.get("#n").map(String::as_str), Some("9"));
    let held = seen_table(&store, &b.widest(), None).await;
    assert!(
        held.iter().all(|e| e.1 == b.slice_of(later) as u32),
        "{held:?}"
    );
    assert_eq!(
        total_at(&store, &b.widest(), "ann", later).await,
        Some(2 * sum(&old, "ann") + 100)
    );
    assert_eq!(
        apply(&store, &b, None, &again, later).await,
        vec![Outcome::Duplicate; 8]
    );
}

/// Packed calls of small instances, some crossing 16, on a scoped board with two windows,
/// against the same shares each applied alone on a twin; then rolls trim forgotten ids
/// from tables grown past one bucket, both boards alike.
#[tokio::test]
async fn packed_small_instances_across_the_first_split_agree_with_calls_of_their_own() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for windows in [false, true] {
        let mut b = scoped(board(&format!("pk{windows}"), SLICE, 4));
        if windows {
            b.windows = vec![
                Window {
                    name: "4s".into(),
                    ms: 4 * SLICE,
                },
                Window {
                    name: "2s".into(),
                    ms: 2 * SLICE,
                },
            ];
        }
        let control = twin(&b);
        let sizes = [
            (16usize, 1usize),
            (15, 2),
            (8, 8),
            (3, 20),
            (0, 17),
            (16, 0),
        ];
        for round in 0..2 {
            let shares: Vec<(String, Vec<ApplyEvent>)> = sizes
                .iter()
                .enumerate()
                .map(|(i, (a, c))| {
                    let n = if round == 0 { *a } else { *c };
                    let start = if round == 0 { 0 } else { *a };
                    (format!("s{i}"), share_events(i, start..start + n))
                })
                .filter(|(_, e)| !e.is_empty())
                .collect();
            let borrowed: Vec<(Option<&str>, &[ApplyEvent])> = shares
                .iter()
                .map(|(s, e)| (Some(s.as_str()), e.as_slice()))
                .collect();
            let packed = store.apply_shares(&b, &borrowed, NOW).await;
            for ((scope, e), r) in shares.iter().zip(packed) {
                let r = r.expect("packed");
                let alone = apply(&store, &control, Some(scope), e, NOW).await;
                assert_eq!(r, alone, "{scope} round {round}");
                assert_eq!(r, vec![Outcome::Applied; e.len()], "{scope} round {round}");
            }
        }
        // Redelivered whole: all duplicates.
        for (i, (a, c)) in sizes.iter().enumerate() {
            let scope = format!("s{i}");
            let e = share_events(i, 0..a + c);
            assert_eq!(
                apply(&store, &b, Some(&scope), &e, NOW).await,
                vec![Outcome::Duplicate; e.len()],
                "{scope}"
            );
            let mut held: Vec<_> = seen_table(&store, &b.widest(), Some(&scope)).await;
            let mut twin_held: Vec<_> = seen_table(&store, &control.widest(), Some(&scope)).await;
            held.sort();
            twin_held.sort();
            assert_eq!(held.len(), a + c, "{scope}");
            assert_eq!(held, twin_held, "{scope}");
            assert_eq!(
                state(&store, &b, Some(&scope)).await,
                state(&store, &control, Some(&scope)).await,
                "{scope}"
            );
            for v in b.views() {
                let cv = control
                    .views()
                    .into_iter()
                    .find(|w| w.window_ms() == v.window_ms())
                    .unwrap();
                assert_eq!(
                    contents_of(&store, &v, Some(&scope)).await,
                    contents_of(&store, &cv, Some(&scope)).await,
                    "{scope}"
                );
            }
        }
        // Rolls forget the oldest slices' ids: both tables alike, and the ids of the slices
        // left still duplicates.
        for step in 1..=6 {
            let now = NOW + step * SLICE;
            roll_once(&store, &b, now).await;
            roll_once(&store, &control, now).await;
            for (i, (a, c)) in sizes.iter().enumerate() {
                let scope = format!("s{i}");
                let mut held = seen_table(&store, &b.widest(), Some(&scope)).await;
                let mut twin_held = seen_table(&store, &control.widest(), Some(&scope)).await;
                held.sort();
                twin_held.sort();
                assert_eq!(held, twin_held, "{scope} at {now}");
                let through = b.forgettable_through(now);
                let want = (0..a + c)
                    .filter(|k| b.slice_of(NOW - (*k as i64 % 3) * SLICE) > through)
                    .count();
                assert_eq!(held.len(), want, "{scope} at {now}");
            }
        }
    }
}

/// A state whose numbers parse but are not written as Redis writes integers (`0.0`,
/// `0x0`, ` 1`): the table still judges duplicates and splits; `#n` is rewritten each
/// write, `#L` when a split changes it, and `#p`, which the first split leaves at 0, is
/// left as it was stored (before 2c7984b every write rewrote all three).
#[tokio::test]
async fn a_state_of_numbers_in_another_form_is_kept_until_a_split_changes_it() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let b = board("form", SLICE, 4);
    let key = store.instance(&b.widest(), None).seen_table();
    let all = events("form", 17, NOW);
    assert_eq!(
        apply(&store, &b, None, &all[..1], NOW).await,
        vec![Outcome::Applied]
    );
    let _: () = store
        .client()
        .hset(&key, [("#L", "0.0"), ("#p", "0x0"), ("#n", " 1")])
        .await
        .unwrap();
    assert_eq!(
        apply(&store, &b, None, &all[..2], NOW).await,
        vec![Outcome::Duplicate, Outcome::Applied]
    );
    let st = state(&store, &b, None).await;
    assert_eq!(st.get("#n").map(String::as_str), Some("2"));
    assert_eq!(st.get("#L").map(String::as_str), Some("0.0"));
    assert_eq!(st.get("#p").map(String::as_str), Some("0x0"));
    assert_eq!(
        apply(&store, &b, None, &all[2..], NOW).await,
        vec![Outcome::Applied; 15]
    );
    let st = state(&store, &b, None).await;
    assert_eq!(st.get("#n").map(String::as_str), Some("17"));
    assert_eq!(st.get("#L").map(String::as_str), Some("1"));
    assert_eq!(st.get("#p").map(String::as_str), Some("0x0"));
    assert_eq!(
        apply(&store, &b, None, &all, NOW).await,
        vec![Outcome::Duplicate; 17]
    );
    assert_totals(&store, &b, &all).await;
}

/// The first split made by `fold.lua` (a mixed call, each event judged on its own) on a stated table
/// of 16: `#L` written, every entry in its bucket, the redelivery all duplicates.
#[tokio::test]
async fn the_first_split_by_a_call_judged_one_by_one_writes_the_new_level() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let (b, all) = seeded(&store, "slowsplit", 18, 16).await;
    let mixed = vec![all[5].clone(), all[16].clone(), all[17].clone()];
    assert_eq!(
        apply(&store, &b, None, &mixed, NOW).await,
        vec![Outcome::Duplicate, Outcome::Applied, Outcome::Applied]
    );
    let st = state(&store, &b, None).await;
    assert_eq!(st.get("#L").map(String::as_str), Some("1"));
    assert_eq!(st.get("#p").map(String::as_str), Some("0"));
    assert_eq!(st.get("#n").map(String::as_str), Some("18"));
    assert_eq!(seen_table(&store, &b.widest(), None).await.len(), 18);
    assert_eq!(
        apply(&store, &b, None, &all, NOW).await,
        vec![Outcome::Duplicate; 18]
    );
    assert_totals(&store, &b, &all).await;
}
