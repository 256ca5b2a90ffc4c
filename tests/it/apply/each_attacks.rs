//! Attacks on `fold.lua` judging each event on its own (ARGV[1] 'each'), sent by hand as
//! `Store::apply_exact` sends it ([`apply_call`]): malformed layouts (raw id counts, the
//! window count, digest blobs, group indices) refused before any write; an id repeated in
//! one call whose first copy overflows, or that comes three times; refunds to exactly 0
//! across slices; keys of another type when every live event is a duplicate or some are
//! late; calls whose events are all late; a call large enough to split the digest table;
//! the legacy `seen` ZSet; overflows in a narrower window only. Every check is against
//! real Redis: statuses, stored values, and the whole keyspace where nothing may change.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak, MAX_TOTAL};
use rollboard::domain::ranking::decode_member;
use rollboard::store::{apply_call, ApplyEvent, Store};

use crate::support::boards::{
    apply_events, dump, ev, keys_matching, seen_table, set_string, with_fresh_store,
};
use crate::support::instances::{contents, narrow_and_whole_windows, shaped, twin};
use crate::support::model::Instance;
use crate::support::redis::fcall;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;
const LIMIT: i64 = MAX_TOTAL;

/// Where the ARGV of an 'each' call (as [`apply_call`] builds them, 'each' at 0) hold the
/// digest blob and the numbers; the member names follow from 16.
const BLOB: usize = 14;
const NUMBERS: usize = 15;
const NAMES: usize = 16;

/// One 'each' call of `events` to `board`'s unscoped instance at `now`, as
/// `Store::apply_exact` sends it: the statuses, or the error's text.
async fn each(
    store: &Store,
    board: &Board,
    events: &[ApplyEvent],
    now: i64,
    raw_ids: bool,
) -> Result<Vec<i64>, String> {
    let (keys, args) = call(store, board, events, now, raw_ids);
    send(store, keys, args).await
}

/// The KEYS and ARGV of [`each`].
fn call(
    store: &Store,
    board: &Board,
    events: &[ApplyEvent],
    now: i64,
    raw_ids: bool,
) -> (Vec<String>, Vec<Value>) {
    let k = store.instance(&board.widest(), None);
    apply_call(
        board,
        &k,
        &board.widest().fingerprint(),
        events,
        now,
        raw_ids,
    )
}

/// Sends one `fold.lua` call as it is.
async fn send(store: &Store, keys: Vec<String>, args: Vec<Value>) -> Result<Vec<i64>, String> {
    fcall::<Vec<i64>, _, _>(store.client(), "fold", keys, args)
        .await
        .map_err(|e| e.to_string())
}

/// [`each`], which must succeed.
async fn each_ok(store: &Store, board: &Board, events: &[ApplyEvent], now: i64) -> Vec<i64> {
    each(store, board, events, now, false)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", board.name))
}

/// Every key of the server and what it holds ([`dump`]): the whole keyspace, to prove
/// that a call wrote nothing anywhere.
async fn keyspace(store: &Store) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for key in keys_matching(store, "*").await {
        let bytes = dump(store, &key).await;
        out.insert(key, bytes);
    }
    out
}

/// The distinct members of `events`, in the order of their first event (as [`apply_call`]
/// numbers them).
fn members_of(events: &[ApplyEvent]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for e in events {
        if !out.contains(&e.member.as_str()) {
            out.push(&e.member);
        }
    }
    out
}

/// The numbers of an 'each' call of `events` as [`apply_call`] lays them out: a triple per
/// slice (number, forget-at, events), then five per event (member index, slice index,
/// amount, its absolute value, time).
fn numbers_of(board: &Board, events: &[ApplyEvent]) -> Vec<i64> {
    let mut slices: Vec<i64> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    let members = members_of(events);
    let mut groups = Vec::new();
    for e in events {
        let n = board.slice_of(e.ts);
        let s = slices.iter().position(|&x| x == n).unwrap_or_else(|| {
            slices.push(n);
            counts.push(0);
            slices.len() - 1
        });
        counts[s] += 1;
        let m = members.iter().position(|&m| m == e.member).expect("member");
        groups.extend([m as i64 + 1, s as i64 + 1, e.amount, e.amount.abs(), e.ts]);
    }
    let mut out = Vec::new();
    for (&n, &c) in slices.iter().zip(&counts) {
        out.extend([n, board.forget_at(n), c]);
    }
    out.extend(groups);
    out
}

/// `numbers` as one MessagePack array of int64s (what `cmsgpack.unpack` reads).
fn msgpack(numbers: &[i64]) -> Value {
    let mut out = vec![0xdc];
    out.extend(u16::try_from(numbers.len()).expect("short").to_be_bytes());
    for n in numbers {
        out.push(0xd3);
        out.extend(n.to_be_bytes());
    }
    Value::Bytes(out.into())
}

/// The exact total `board`'s unscoped instance holds for `member` (its score in `result`
/// on an incremental board, its field in `totals` otherwise), `None` for none.
async fn exact_total(store: &Store, board: &Board, member: &str) -> Option<i64> {
    let k = store.instance(&board.widest(), None);
    let c = store.client();
    match board.mode {
        Mode::Incremental => {
            let all: Vec<(String, f64)> = c
                .zrange(k.result(), 0, -1, None, false, None, true)
                .await
                .expect("result");
            all.into_iter()
                .find(|(z, _)| decode_member(board.tie_break, z).0 == member)
                .map(|(_, s)| s as i64)
        }
        Mode::Resummarize => {
            let v: Option<i64> = c.hget(k.totals(), member).await.expect("totals");
            v
        }
    }
}

/// Field `member` of slice `n`'s Hash (`None` for none).
async fn field(store: &Store, board: &Board, n: i64, member: &str) -> Option<i64> {
    let k = store.instance(&board.widest(), None);
    store
        .client()
        .hget(k.slice(n), member)
        .await
        .expect("slice field")
}

/// `meta` `gen` of the unscoped instance (`None`: never written).
async fn gen(store: &Store, board: &Board) -> Option<i64> {
    let meta = store.instance(&board.widest(), None).meta();
    store.client().hget(meta, "gen").await.expect("gen")
}

/// How many entries of the digest table hold `id`'s digest (whatever their slice).
async fn table_holds(store: &Store, board: &Board, id: &str) -> usize {
    let digest = rollboard::store::id_digest(id);
    seen_table(store, &board.widest(), None)
        .await
        .iter()
        .filter(|(d, _)| *d == digest)
        .count()
}

/// `board` ranking two windows of its four slices: `2s` and `4s`.
fn two_windows(board: Board) -> Board {
    let mut b = board;
    b.windows = narrow_and_whole_windows();
    b.window_ms = 4 * SLICE;
    b.name = format!("{}-w2", b.name);
    b
}

/// Idea 1: an 'each' call whose ARGV count is neither the plain layout's nor the plain
/// one and one raw id per event (an id short, an id over, the dense flag missing, the
/// window pair missing) is refused with an error reply, and the keyspace is left as it
/// was, on boards of one and two windows, with and without a legacy `seen` ZSet; the call
/// as built then runs.
#[tokio::test]
async fn an_each_call_whose_argv_count_is_off_is_refused_whole() {
    let (redis, store, ()) = with_fresh_store(()).await;
    for board in [shaped(0), shaped(3), two_windows(shaped(1))] {
        for legacy in [false, true] {
            let _: () = store.client().flushall(false).await.expect("flush");
            let seen = store.instance(&board.widest(), None).seen();
            if legacy {
                redis.cli(&["ZADD", &seen, "9999999999", "someone-else"]);
            }
            let prior = [ev("p", NOW - 1_500, "zed", 2)];
            assert_eq!(each(&store, &board, &prior, NOW, true).await, Ok(vec![0]));
            let events = [
                ev("a", NOW - 10, "ann", 5),
                ev("b", NOW - 1_200, "bob", 7),
                ev("c", NOW + 20, "ann", 1),
            ];
            let (keys, good) = call(&store, &board, &events, NOW, true);
            let plain = good.len() - events.len();
            let mut wrong: Vec<(&str, Vec<Value>)> = vec![
                ("one raw id short", good[..good.len() - 1].to_vec()),
                ("one raw id over", {
                    let mut a = good.clone();
                    a.push(Value::from("d"));
                    a
                }),
                ("the plain layout less its last", good[..plain - 1].to_vec()),
                ("the plain layout and one", good[..plain + 1].to_vec()),
            ];
            if board.has_several_windows() {
                // The narrower window's pair (slices per window, fingerprint) left out.
                let mut a = good[..plain - 2].to_vec();
                a.extend_from_slice(&good[plain..]);
                wrong.push(("the window pair left out", a));
            }
            for (what, args) in wrong {
                let before = keyspace(&store).await;
                let got = send(&store, keys.clone(), args).await;
                let Err(error) = got else {
                    panic!("{} ({what}): not refused: {got:?}", board.name);
                };
                assert!(
                    error.contains("ROLLBOARD"),
                    "{} ({what}): {error}",
                    board.name
                );
                assert_eq!(
                    keyspace(&store).await,
                    before,
                    "{} ({what}): a refused call wrote",
                    board.name
                );
            }
            assert_eq!(send(&store, keys, good).await, Ok(vec![0, 0, 0]));
            assert_eq!(exact_total(&store, &board, "ann").await, Some(6));
        }
    }
}

/// Idea 1, the window count: an 'each' call whose V (the narrower windows' count, which
/// places the raw ids) is -1 is a malformed layout, as the packed path (which refuses a
/// V below 0) holds it, and must be refused. Sent in place of V = 0 in a call of two
/// events, `tail + 4 + 2 * V` plus G then matches the ARGV count: V and the dense flag
/// are taken for the two events' raw ids. With a legacy `seen` ZSet remembering the first
/// event's raw id, that event is then applied a second time.
#[tokio::test]
async fn an_each_call_with_a_negative_window_count_is_refused() {
    let (redis, store, board) = with_fresh_store(shaped(0)).await;
    let seen = store.instance(&board.widest(), None).seen();
    let forget = board.forget_at(board.slice_of(NOW - 10)).to_string();
    // The first event was applied under the legacy layout: its raw id is remembered there.
    redis.cli(&["ZADD", &seen, &forget, "a"]);
    let events = [ev("a", NOW - 10, "ann", 5), ev("b", NOW - 20, "bob", 7)];
    let (keys, good) = call(&store, &board, &events, NOW, false);
    let m = members_of(&events).len();
    let v_at = NAMES + m + 2;
    assert_eq!(good[v_at], Value::from(0i64), "V where the layout puts it");
    let mut args = good.clone();
    args[v_at] = Value::from(-1i64);
    let before = keyspace(&store).await;
    let got = send(&store, keys, args).await;
    let after = keyspace(&store).await;
    assert!(
        got.is_err(),
        "V = -1 was accepted: statuses {got:?}, ann's total now {:?} (the legacy ZSet remembers \
         event a), the keyspace {}",
        exact_total(&store, &board, "ann").await,
        if after == before {
            "unchanged"
        } else {
            "written"
        }
    );
    assert_eq!(after, before, "a refused call wrote");
}

/// A call judging each event is never chained: one carrying a chain token (before or
/// after) is refused whole, so that its `not run` reply, `{3}`, can never be read as one
/// event's overflow.
#[tokio::test]
async fn an_each_call_with_a_chain_token_is_refused() {
    let (_redis, store, board) = with_fresh_store(shaped(0)).await;
    let events = [ev("a", NOW - 10, "ann", 5)];
    let (keys, good) = call(&store, &board, &events, NOW, false);
    let at = NAMES + members_of(&events).len();
    assert_eq!(
        good[at],
        Value::from(""),
        "the first chain token where the layout puts it"
    );
    let before = keyspace(&store).await;
    for slot in [at, at + 1] {
        let mut args = good.clone();
        args[slot] = Value::from("t");
        let got = send(&store, keys.clone(), args).await;
        let refused = got.as_ref().err().map(String::as_str).unwrap_or("");
        assert!(
            refused.contains("not chained"),
            "a chain token at {slot}: {got:?}"
        );
        assert_eq!(keyspace(&store).await, before, "a refused call wrote");
    }
    assert_eq!(
        each_ok(&store, &board, &events, NOW).await,
        vec![0],
        "the call as built"
    );
}

/// Each slice's count of events must be the number of events naming it: a call whose
/// counts add up but are cut in the wrong places (one event moved to the other slice's
/// count) is refused whole, instead of its live events being taken for late ones.
#[tokio::test]
async fn an_each_call_whose_slice_counts_miss_their_events_is_refused() {
    let (_redis, store, board) = with_fresh_store(shaped(0)).await;
    // Slice 1 is late at NOW (behind the watermark of a 4-slice window), slice 2 live.
    let late = NOW - 10 * SLICE;
    let events = [
        ev("a", late, "ann", 5),
        ev("b", NOW - 10, "bob", 7),
        ev("c", NOW - 20, "cy", 1),
    ];
    let (keys, good) = call(&store, &board, &events, NOW, false);
    let mut numbers = numbers_of(&board, &events);
    assert_eq!(
        (numbers[2], numbers[5]),
        (1, 2),
        "the counts as the call sends them"
    );
    (numbers[2], numbers[5]) = (2, 1);
    let mut args = good.clone();
    args[NUMBERS] = msgpack(&numbers);
    let before = keyspace(&store).await;
    let got = send(&store, keys, args).await;
    let refused = got.as_ref().err().map(String::as_str).unwrap_or("");
    assert!(refused.contains("does not count its events"), "{got:?}");
    assert_eq!(keyspace(&store).await, before, "a refused call wrote");
    assert_eq!(each_ok(&store, &board, &events, NOW).await, vec![2, 0, 0]);
}

/// Idea 2: a digest blob that is not 16 bytes an event (one byte short, one digest over,
/// empty) is refused, and nothing is written; so is a group naming a slice or a member
/// past the call's tables (or 0). The numbers rebuilt here as the call builds them run.
#[tokio::test]
async fn an_each_call_with_a_bad_blob_or_group_index_is_refused_whole() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for board in [shaped(1), two_windows(shaped(2))] {
        let prior = [ev("p", NOW - 1_500, "zed", 2)];
        assert_eq!(each_ok(&store, &board, &prior, NOW).await, [0]);
        let events = [
            ev("a", NOW - 10, "ann", 5),
            ev("b", NOW - 1_200, "bob", 7),
            ev("c", NOW + 20, "ann", 1),
        ];
        let (keys, good) = call(&store, &board, &events, NOW, false);
        let blob = good[BLOB].as_bytes().expect("blob").to_vec();
        assert_eq!(blob.len(), 16 * events.len());
        let numbers = numbers_of(&board, &events);
        let mut wrong: Vec<(String, Vec<Value>)> = Vec::new();
        for (what, b) in [
            ("one byte short", blob[..blob.len() - 1].to_vec()),
            (
                "one digest over",
                [blob.clone(), blob[..16].to_vec()].concat(),
            ),
            ("one byte over", [blob.clone(), vec![0]].concat()),
            ("empty", Vec::new()),
        ] {
            let mut args = good.clone();
            args[BLOB] = Value::Bytes(b.into());
            wrong.push((format!("blob {what}"), args));
        }
        // Groups begin after the three slices' triples (999, 998, 1000); group 2 (bob's)
        // is at 9 + 5.
        let group2 = 3 * 3 + 5;
        for (what, at, value) in [
            ("slice index 4 of 3", group2 + 1, 4),
            ("slice index 0", group2 + 1, 0),
            ("member index 3 of 2", group2, 3),
            ("member index 0", group2, 0),
        ] {
            let mut n = numbers.clone();
            n[at] = value;
            let mut args = good.clone();
            args[NUMBERS] = msgpack(&n);
            wrong.push((what.to_string(), args));
        }
        for (what, args) in wrong {
            let before = keyspace(&store).await;
            let got = send(&store, keys.clone(), args).await;
            assert!(got.is_err(), "{} ({what}): {got:?}", board.name);
            assert_eq!(
                keyspace(&store).await,
                before,
                "{} ({what}): a refused call wrote",
                board.name
            );
        }
        let mut args = good;
        args[NUMBERS] = msgpack(&numbers);
        assert_eq!(send(&store, keys, args).await, Ok(vec![0, 0, 0]));
        assert_eq!(exact_total(&store, &board, "ann").await, Some(6));
        assert_eq!(exact_total(&store, &board, "bob").await, Some(7));
    }
}

/// Idea 3: one id twice in a call, its first copy taking a total past 2^53 - 1 and its
/// second fitting: overflow then applied (the overflowed copy is not remembered), the
/// total holding the second amount once, the table the digest once; a later copy is a
/// duplicate, even one that would overflow. The same where the first copy passes 2^53 - 1
/// in its slice field only (the member's total would fit).
#[tokio::test]
async fn a_repeated_id_whose_first_copy_overflows_counts_its_second() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..4 {
        let board = shaped(shape);
        let base = [ev("base", NOW - 1_100, "ann", LIMIT - 5)];
        assert_eq!(each_ok(&store, &board, &base, NOW).await, [0]);
        let twice = [ev("x", NOW - 10, "ann", 10), ev("x", NOW - 20, "ann", 5)];
        assert_eq!(
            each_ok(&store, &board, &twice, NOW).await,
            [3, 0],
            "{}",
            board.name
        );
        assert_eq!(exact_total(&store, &board, "ann").await, Some(LIMIT));
        assert_eq!(field(&store, &board, 999, "ann").await, Some(5));
        assert_eq!(table_holds(&store, &board, "x").await, 1);
        let again = [
            ev("x", NOW - 30, "ann", 1),
            ev("y", NOW - 30, "ann", 1),
            ev("x", NOW - 30, "ann", -1),
        ];
        assert_eq!(
            each_ok(&store, &board, &again, NOW).await,
            [1, 3, 1],
            "{}",
            board.name
        );
        assert_eq!(exact_total(&store, &board, "ann").await, Some(LIMIT));
    }
    // A slice field past 2^53 - 1 while the total fits: a refund in another slice first.
    for shape in [1, 3] {
        let board = twin(&shaped(shape));
        let setup = [
            ev("up", NOW - 10, "bob", LIMIT - 2),
            ev("down", NOW - 1_100, "bob", -(LIMIT - 2)),
        ];
        assert_eq!(each_ok(&store, &board, &setup, NOW).await, [0, 0]);
        assert_eq!(exact_total(&store, &board, "bob").await, Some(0));
        let twice = [ev("z", NOW - 20, "bob", 5), ev("z", NOW - 1_200, "bob", 5)];
        assert_eq!(
            each_ok(&store, &board, &twice, NOW).await,
            [3, 0],
            "{}",
            board.name
        );
        assert_eq!(exact_total(&store, &board, "bob").await, Some(5));
        assert_eq!(field(&store, &board, 999, "bob").await, Some(LIMIT - 2));
        assert_eq!(
            field(&store, &board, 998, "bob").await,
            Some(-(LIMIT - 2) + 5)
        );
        assert_eq!(table_holds(&store, &board, "z").await, 1);
    }
}

/// Idea 4: one id three times in a call (later copies in another slice and for another
/// member): applied, duplicate, duplicate; the total counts it once, the other member is
/// left unknown, and only the first copy's slice log and table entry are written.
#[tokio::test]
async fn an_id_three_times_in_a_call_counts_once() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..8 {
        let board = shaped(shape);
        let events = [
            ev("d", NOW - 10, "ann", 4),
            ev("d", NOW + 700, "bob", 9),
            ev("d", NOW + 50, "ann", 4),
        ];
        assert_eq!(
            each_ok(&store, &board, &events, NOW).await,
            [0, 1, 1],
            "{}",
            board.name
        );
        let k = store.instance(&board.widest(), None);
        assert_eq!(exact_total(&store, &board, "ann").await, Some(4));
        assert_eq!(exact_total(&store, &board, "bob").await, None);
        let bob: Option<String> = store.client().hget(k.members(), "bob").await.expect("HGET");
        assert_eq!(
            bob, None,
            "{}: the duplicate's member was written",
            board.name
        );
        assert_eq!(field(&store, &board, 999, "ann").await, Some(4));
        assert_eq!(field(&store, &board, 1000, "ann").await, None);
        assert_eq!(table_holds(&store, &board, "d").await, 1);
        let log: i64 = store.client().llen(k.seen_log(999)).await.expect("LLEN");
        assert_eq!(log, 1);
        let other: i64 = store
            .client()
            .exists(k.seen_log(1000))
            .await
            .expect("EXISTS");
        assert_eq!(
            other, 0,
            "{}: a duplicate's slice log was written",
            board.name
        );
        assert_eq!(gen(&store, &board).await, Some(1));
    }
}

/// Idea 5: refunds bringing members' totals to exactly 0 (one over two slices, one within
/// one slice), events of one member in several slices of one call, and a later call
/// refunding the last positive total to 0: the exact totals, slice fields and slice counts
/// expected, the ranking empty, and the same data as the twin applied by `Store::apply`;
/// on both boards that allow refunds, with long and short dedup windows.
#[tokio::test]
async fn refunds_to_exactly_zero_across_slices_are_exact() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in [1, 3, 5, 7] {
        let board = shaped(shape);
        let control = twin(&board);
        assert!(board.allow_negative);
        let first = [
            ev("r1", NOW - 100, "ann", 7),
            ev("r2", NOW + 100, "ann", 3),
            ev("r3", NOW + 200, "ann", -10),
            ev("r4", NOW - 200, "bob", 4),
            ev("r5", NOW - 150, "bob", -4),
            ev("r6", NOW + 300, "cy", 5),
        ];
        let second = [ev("r7", NOW + 400, "cy", -5), ev("r8", NOW - 50, "ann", -3)];
        let mut model = Instance::default();
        for events in [&first[..], &second[..]] {
            let got = each_ok(&store, &board, events, NOW).await;
            assert!(got.iter().all(|&s| s == 0), "{}: {got:?}", board.name);
            let expected = model.apply_all(&board.widest(), events, NOW);
            assert_eq!(apply_events(&store, &control, events, NOW).await, expected);
        }
        let totals = model.totals();
        for (member, total) in [("ann", -3), ("bob", 0), ("cy", 0)] {
            assert_eq!(totals[member].0, total);
            assert_eq!(
                exact_total(&store, &board, member).await,
                Some(total),
                "{}: {member}",
                board.name
            );
        }
        assert_eq!(field(&store, &board, 999, "ann").await, Some(4));
        assert_eq!(field(&store, &board, 1000, "ann").await, Some(-7));
        assert_eq!(field(&store, &board, 999, "bob").await, Some(0));
        assert_eq!(field(&store, &board, 1000, "cy").await, Some(0));
        let refs: BTreeMap<String, String> = store
            .client()
            .hgetall(store.instance(&board.widest(), None).refs())
            .await
            .expect("refs");
        let want: BTreeMap<String, String> = [("ann", "2"), ("bob", "1"), ("cy", "1")]
            .iter()
            .map(|(m, n)| (m.to_string(), n.to_string()))
            .collect();
        assert_eq!(refs, want, "{}", board.name);
        if board.mode == Mode::Incremental {
            let page = store
                .top(&board.widest(), None, 0, 10, NOW)
                .await
                .expect("top");
            assert!(
                page.entries.is_empty(),
                "{}: {:?}",
                board.name,
                page.entries
            );
        }
        let members: BTreeMap<String, String> = store
            .client()
            .hgetall(store.instance(&board.widest(), None).members())
            .await
            .expect("members");
        let newest = |t: i64| match board.tie_break {
            TieBreak::None => String::new(),
            _ => t.to_string(),
        };
        assert_eq!(members["ann"], newest(NOW + 200), "{}", board.name);
        assert_eq!(members["bob"], newest(NOW - 150));
        assert_eq!(members["cy"], newest(NOW + 400));
        assert_eq!(
            contents(&store, &board.widest()).await,
            contents(&store, &control.widest()).await,
            "{}",
            board.name
        );
    }
}

/// A key of `board`'s unscoped instance to break, named, for the slices it names.
type Breaker = (
    &'static str,
    fn(&rollboard::domain::keys::InstanceKeys) -> String,
);

/// Idea 6: a key of the wrong type (a String where `members`, a forget log, `result`, a
/// slice Hash, the slice registry or the digest table was) when every live event of the
/// call is a duplicate, with or without late events beside them: the call errs or judges
/// the events, and in either case the keyspace is as it was. Events new to the instance
/// with such a key: an error and nothing written. Forget logs of late slices are not the
/// call's: a String there does not stop it.
#[tokio::test]
async fn keys_of_the_wrong_type_are_never_written_half_way() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let breakers: [Breaker; 6] = [
        ("members", |k| k.members()),
        ("forget log 999", |k| k.seen_log(999)),
        ("result", |k| k.result()),
        ("slice 999", |k| k.slice(999)),
        ("slice registry", |k| k.slices()),
        ("digest table", |k| k.seen_table()),
    ];
    let mut wrote = Vec::new();
    for shape in 0..4 {
        let board = shaped(shape);
        let k = store.instance(&board.widest(), None);
        for (what, key_of) in breakers {
            if what == "result" && board.mode == Mode::Resummarize {
                // Not a key of a resummarize board's calls.
                continue;
            }
            let live = [ev("l1", NOW - 10, "ann", 3), ev("l2", NOW - 20, "bob", 4)];
            let late = ev("old", NOW - 3_500, "cy", 5);
            let cases: [(&str, Vec<ApplyEvent>, bool); 3] = [
                ("every event a duplicate", live.to_vec(), false),
                (
                    "duplicates and late events",
                    vec![late.clone(), live[0].clone(), live[1].clone()],
                    false,
                ),
                ("new events", vec![ev("n1", NOW - 30, "dee", 1)], true),
            ];
            for (case, events, new) in cases {
                let _: () = store.client().flushall(false).await.expect("flush");
                assert_eq!(each_ok(&store, &board, &live, NOW).await, [0, 0]);
                set_string(&store, &key_of(&k), "not the right type").await;
                let before = keyspace(&store).await;
                let got = each(&store, &board, &events, NOW, false).await;
                let after = keyspace(&store).await;
                if after != before {
                    wrote.push(format!("{} {what} ({case}): {got:?} and wrote", board.name));
                }
                match got {
                    Err(_) => {}
                    Ok(statuses) => {
                        let expected: Vec<i64> = events
                            .iter()
                            .map(|e| if e.id == "old" { 2 } else { 1 })
                            .collect();
                        if new || statuses != expected {
                            wrote.push(format!("{} {what} ({case}): {statuses:?}", board.name));
                        }
                    }
                }
            }
        }
        // The forget log of a late slice is not read or written: the live event applies.
        let _: () = store.client().flushall(false).await.expect("flush");
        set_string(&store, &k.seen_log(996), "not a list").await;
        let events = [
            ev("old", NOW - 3_500, "cy", 5),
            ev("new", NOW - 10, "ann", 2),
        ];
        assert_eq!(each_ok(&store, &board, &events, NOW).await, [2, 0]);
        assert_eq!(exact_total(&store, &board, "ann").await, Some(2));
    }
    assert!(wrote.is_empty(), "half-way or wrong:\n{}", wrote.join("\n"));
}

/// Idea 7: a call whose events are all late (slices at or below the watermark, slices
/// whose ids may already be forgotten on a short dedup window, slices below a watermark a
/// roll raised) answers 2 for each and writes nothing: `gen` as it was, the keyspace as it
/// was, even with `members` of the wrong type (it is not read).
#[tokio::test]
async fn a_call_of_late_events_only_writes_nothing() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..8 {
        let board = shaped(shape);
        let k = store.instance(&board.widest(), None);
        assert_eq!(
            each_ok(&store, &board, &[ev("p", NOW - 10, "ann", 1)], NOW).await,
            [0]
        );
        let mut late = vec![
            ev("l1", NOW - 3_500, "ann", 5),
            ev("l2", NOW - 9_000, "bob", 5),
            ev("l1", NOW - 4_000, "ann", 5),
        ];
        if shape >= 4 {
            // Slice 998's ids may be forgotten from 999 500: late on a short dedup window.
            late.push(ev("l3", NOW - 1_500, "cy", 5));
        }
        let before = keyspace(&store).await;
        let got = each_ok(&store, &board, &late, NOW).await;
        assert_eq!(got, vec![2; late.len()], "{}", board.name);
        assert_eq!(keyspace(&store).await, before, "{}", board.name);
        assert_eq!(gen(&store, &board).await, Some(1));
        // A roll raised the watermark to 999: slice 999 is late, however new its ids.
        let _: i64 = store
            .client()
            .hset(k.meta(), ("expired_through", "999"))
            .await
            .expect("HSET");
        set_string(&store, &k.members(), "not a hash").await;
        let raised = [ev("w1", NOW - 10, "ann", 5), ev("w2", NOW - 900, "dee", 5)];
        let before = keyspace(&store).await;
        assert_eq!(each_ok(&store, &board, &raised, NOW).await, [2, 2]);
        assert_eq!(keyspace(&store).await, before, "{}", board.name);
    }
}

/// A call of 320 events, ids repeating, on a fresh instance: the digest table splits
/// within the call (16 entries a bucket), and each event is judged as the model judges it
/// in stream order; then the same events again are all duplicates or late, and the table
/// keeps its invariants (checked by `seen_table`) with one entry per applied id.
#[tokio::test]
async fn one_call_that_splits_the_digest_table_judges_as_stream_order() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..8 {
        let board = shaped(shape);
        let events: Vec<ApplyEvent> = (0..320i64)
            .map(|i| {
                let amount = 1 + i % 9;
                let amount = if board.allow_negative && i % 4 == 0 {
                    -amount
                } else {
                    amount
                };
                ev(
                    &format!("s{}", (i * 7) % 250),
                    NOW - 3_200 + (i * 37) % 4_000,
                    &format!("m{}", i % 13),
                    amount,
                )
            })
            .collect();
        let mut model = Instance::default();
        let expected: Vec<i64> = model
            .apply_all(&board.widest(), &events, NOW)
            .into_iter()
            .map(|o| match o {
                rollboard::store::Outcome::Applied => 0,
                rollboard::store::Outcome::Duplicate => 1,
                rollboard::store::Outcome::Late => 2,
                rollboard::store::Outcome::Overflow => 3,
            })
            .collect();
        assert_eq!(
            each_ok(&store, &board, &events, NOW).await,
            expected,
            "{}",
            board.name
        );
        let applied = expected.iter().filter(|&&s| s == 0).count();
        assert!(applied > 100, "{}: {applied}", board.name);
        let table: BTreeMap<String, Vec<u8>> = store
            .client()
            .hgetall(store.instance(&board.widest(), None).seen_table())
            .await
            .expect("table");
        let buckets = table.keys().filter(|f| !f.starts_with('#')).count();
        assert!(buckets > 4, "{}: {buckets} buckets", board.name);
        assert_eq!(
            seen_table(&store, &board.widest(), None).await.len(),
            applied,
            "{}",
            board.name
        );
        for (member, (total, _)) in model.totals() {
            assert_eq!(
                exact_total(&store, &board, &member).await,
                Some(total),
                "{}: {member}",
                board.name
            );
        }
        let again = each_ok(&store, &board, &events, NOW).await;
        for (i, s) in again.iter().enumerate() {
            let want = if expected[i] == 2 { 2 } else { 1 };
            assert_eq!(*s, want, "{}: event {i} again", board.name);
        }
    }
}

/// The legacy `seen` ZSet: without raw ids an 'each' call fails (`legacy-seen`) and writes
/// nothing; with them, an id it remembers past `now` is a duplicate (its later copy in
/// the call too), one it remembers only until `now` is applied, and an id remembered
/// nowhere applies once though it comes twice.
#[tokio::test]
async fn the_legacy_zset_is_honoured_event_by_event() {
    let (redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..4 {
        let board = shaped(shape);
        let seen = store.instance(&board.widest(), None).seen();
        redis.cli(&["ZADD", &seen, &(NOW + 1).to_string(), "held"]);
        redis.cli(&["ZADD", &seen, &NOW.to_string(), "expired"]);
        let events = [
            ev("held", NOW - 10, "ann", 5),
            ev("expired", NOW - 20, "ann", 7),
            ev("fresh", NOW - 30, "bob", 1),
            ev("held", NOW - 40, "bob", 2),
            ev("fresh", NOW - 50, "bob", 3),
        ];
        let before = keyspace(&store).await;
        let refused = each(&store, &board, &events, NOW, false).await;
        let error = refused.expect_err("without raw ids");
        assert!(error.contains("legacy-seen"), "{error}");
        assert_eq!(keyspace(&store).await, before);
        let got = each(&store, &board, &events, NOW, true).await;
        assert_eq!(got, Ok(vec![1, 0, 0, 1, 1]), "{}", board.name);
        assert_eq!(exact_total(&store, &board, "ann").await, Some(7));
        assert_eq!(exact_total(&store, &board, "bob").await, Some(1));
        assert_eq!(table_holds(&store, &board, "held").await, 0);
        let state: Option<String> = store
            .client()
            .hget(store.instance(&board.widest(), None).seen_table(), "#c")
            .await
            .expect("HGET");
        assert_eq!(
            state, None,
            "{}: marked clean with the ZSet there",
            board.name
        );
    }
}

/// On a board of two windows (with and without refunds): an id twice in one call whose
/// first copy passes 2^53 - 1 in the narrower window only (a refund in a slice only the
/// wider counts keeps the wider total low) is an overflow, its second copy (in a slice
/// only the wider window counts) applied; each window holds what it should, and `gen`
/// moves only where something counted.
#[tokio::test]
async fn an_overflow_in_the_narrower_window_only_is_judged_per_event() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = two_windows(shaped(1));
    let narrow = board.view(Some("2s")).expect("2s");
    let nk = store.instance(&narrow, None);
    // 2s counts slices 999 and 1000; 4s 997 to 1000.
    let setup = [
        ev("up", NOW - 10, "ann", LIMIT - 3),
        ev("down", NOW - 2_500, "ann", -(LIMIT - 3)),
    ];
    assert_eq!(each_ok(&store, &board, &setup, NOW).await, [0, 0]);
    let narrow_gen = || async {
        let v: Option<i64> = store.client().hget(nk.meta(), "gen").await.expect("gen");
        v
    };
    assert_eq!(narrow_gen().await, Some(1));
    let twice = [ev("q", NOW + 10, "ann", 5), ev("q", NOW - 2_400, "ann", 5)];
    assert_eq!(each_ok(&store, &board, &twice, NOW).await, [3, 0]);
    assert_eq!(exact_total(&store, &board, "ann").await, Some(5));
    let narrow_total: Vec<(String, f64)> = store
        .client()
        .zrange(nk.result(), 0, -1, None, false, None, true)
        .await
        .expect("result");
    assert_eq!(narrow_total.len(), 1);
    assert_eq!(narrow_total[0].1 as i64, LIMIT - 3);
    assert_eq!(
        narrow_gen().await,
        Some(1),
        "the narrower window was written"
    );
    assert_eq!(gen(&store, &board).await, Some(2));
    assert_eq!(
        field(&store, &board, 997, "ann").await,
        Some(-(LIMIT - 3) + 5)
    );
    assert_eq!(table_holds(&store, &board, "q").await, 1);
}

/// Totals running within one call: a member near 2^53 - 1 whose events in two slices
/// alternately fit and overflow, a refund making room for an event that overflowed
/// before it, the overflowed id coming again: each judged against the total as the events
/// before it in the call left it, as the model judges them; an overflowed event's time is
/// not the member's tie-break time, and it leaves no field, table entry or slice count.
#[tokio::test]
async fn totals_run_from_event_to_event_within_a_call() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..8 {
        let board = shaped(shape);
        let neg = board.allow_negative;
        let events = [
            ev("base", NOW - 100, "ann", LIMIT - 10),
            ev("e1", NOW - 50, "ann", 6),
            ev("e2", NOW + 900, "ann", 6),
            ev("e3", NOW + 100, "ann", if neg { -6 } else { 4 }),
            ev("e4", NOW + 200, "ann", if neg { 6 } else { 1 }),
            ev("e2", NOW + 300, "ann", 1),
        ];
        let mut model = Instance::default();
        let expected: Vec<i64> = model
            .apply_all(&board.widest(), &events, NOW)
            .into_iter()
            .map(|o| match o {
                rollboard::store::Outcome::Applied => 0,
                rollboard::store::Outcome::Duplicate => 1,
                rollboard::store::Outcome::Late => 2,
                rollboard::store::Outcome::Overflow => 3,
            })
            .collect();
        // The later copy of e2 fits on a board with refunds: its overflowed copy was not
        // remembered.
        let want = if neg {
            [0, 0, 3, 0, 0, 0]
        } else {
            [0, 0, 3, 0, 3, 3]
        };
        assert_eq!(expected, want, "the model, {}", board.name);
        assert_eq!(
            each_ok(&store, &board, &events, NOW).await,
            want,
            "{}",
            board.name
        );
        let total = model.totals()["ann"].0;
        assert_eq!(total, if neg { LIMIT - 3 } else { LIMIT });
        assert_eq!(exact_total(&store, &board, "ann").await, Some(total));
        assert_eq!(field(&store, &board, 999, "ann").await, Some(LIMIT - 4));
        let in_1000 = if neg { 1 } else { 4 };
        assert_eq!(field(&store, &board, 1000, "ann").await, Some(in_1000));
        let e2 = usize::from(neg);
        assert_eq!(
            table_holds(&store, &board, "e2").await,
            e2,
            "{}",
            board.name
        );
        let k = store.instance(&board.widest(), None);
        let members: Option<String> = store.client().hget(k.members(), "ann").await.expect("HGET");
        let newest = if neg { NOW + 300 } else { NOW + 100 };
        let expected_time = match board.tie_break {
            TieBreak::None => String::new(),
            _ => newest.to_string(),
        };
        assert_eq!(members, Some(expected_time), "{}", board.name);
        if neg {
            let refs: Option<String> = store.client().hget(k.refs(), "ann").await.expect("HGET");
            assert_eq!(refs.as_deref(), Some("2"), "{}", board.name);
        }
    }
}

/// The legacy `seen` ZSet's key of another type on an instance that has no `#c` yet: an
/// 'each' call without raw ids fails (`legacy-seen`), with them it fails on the key's
/// type; neither writes anything.
#[tokio::test]
async fn a_legacy_key_of_another_type_fails_the_call_whole() {
    let (_redis, store, board) = with_fresh_store(shaped(1)).await;
    let seen = store.instance(&board.widest(), None).seen();
    set_string(&store, &seen, "not a zset").await;
    let events = [ev("a", NOW - 10, "ann", 5), ev("b", NOW + 10, "bob", 1)];
    let before = keyspace(&store).await;
    let without = each(&store, &board, &events, NOW, false).await;
    assert!(
        without.as_ref().is_err_and(|e| e.contains("legacy-seen")),
        "{without:?}"
    );
    let with = each(&store, &board, &events, NOW, true).await;
    assert!(
        with.as_ref().is_err_and(|e| e.contains("WRONGTYPE")),
        "{with:?}"
    );
    assert_eq!(keyspace(&store).await, before);
}

/// A board of two windows with distinct totals and a change feed: a key of another type
/// in the narrower window (members, result, its slice Hash, its distinct totals, its
/// change stream) or the widest's change stream, when every live event of the call is a
/// duplicate and when the events are new: the call errs or judges the duplicates, and the
/// keyspace is as it was.
#[tokio::test]
async fn keys_of_the_wrong_type_in_any_window_are_never_written_half_way() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let mut board = two_windows(shaped(0));
    board.dense_rank = true;
    board.changes = Some(rollboard::domain::board::Changes {
        top: 3,
        max_len: 100,
    });
    let k = store.instance(&board.widest(), None);
    let nk = store.instance(&board.view(Some("2s")).expect("2s"), None);
    let breakers: Vec<(&str, String)> = vec![
        ("narrower members", nk.members()),
        ("narrower result", nk.result()),
        ("narrower slice 999", nk.slice(999)),
        ("narrower dense", nk.dense()),
        ("narrower changes", nk.changes()),
        ("widest changes", k.changes()),
        ("widest dense", k.dense()),
    ];
    let live = [ev("l1", NOW - 10, "ann", 3), ev("l2", NOW + 20, "bob", 4)];
    let mut wrote = Vec::new();
    for (what, key) in &breakers {
        for (case, events) in [
            ("every event a duplicate", live.to_vec()),
            ("new events", vec![ev("n1", NOW - 30, "dee", 1)]),
        ] {
            let _: () = store.client().flushall(false).await.expect("flush");
            assert_eq!(each_ok(&store, &board, &live, NOW).await, [0, 0]);
            set_string(&store, key, "not the right type").await;
            let before = keyspace(&store).await;
            let got = each(&store, &board, &events, NOW, false).await;
            if keyspace(&store).await != before {
                wrote.push(format!("{what} ({case}): {got:?} and wrote"));
            }
            match (case, got) {
                (_, Err(_)) => {}
                ("every event a duplicate", Ok(s)) if s == [1, 1] => {}
                (_, Ok(s)) => wrote.push(format!("{what} ({case}): {s:?}")),
            }
        }
    }
    assert!(wrote.is_empty(), "half-way or wrong:\n{}", wrote.join("\n"));
}
