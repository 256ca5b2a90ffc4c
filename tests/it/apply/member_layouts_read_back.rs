//! The `members` / `ranked` layout (each member's tie-break time, or the whole ZSet member
//! an older version wrote) at its edges: times at both ends of the accepted range, member
//! names made of digits, every tie-break and mode, and values that are neither layout.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak};
use rollboard::domain::ranking::encode_member;
use rollboard::roll;
use rollboard::store::{ApplyEvent, Store};

use crate::support::boards::{apply_events, board, ev, snapshot};
use crate::support::redis::RedisServer;

const SLICE: i64 = 1_000;
const N: i64 = 4;
const LIMIT: i64 = 9_007_199_254_740_991;

/// Every mode with every tie-break.
fn boards() -> Vec<Board> {
    let mut out = Vec::new();
    for (i, mode) in [Mode::Incremental, Mode::Resummarize]
        .into_iter()
        .enumerate()
    {
        for (j, tie) in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None]
            .into_iter()
            .enumerate()
        {
            let mut b = board(&format!("lay{i}{j}"), SLICE, N);
            b.mode = mode;
            b.tie_break = tie;
            out.push(b);
        }
    }
    out
}

/// Rewrites every `every`-th value of a `members` or `ranked` Hash as an older version
/// wrote it (the others stay in the current layout).
async fn write_old(store: &Store, board: &Board, key: &str, every: usize) -> usize {
    let c = store.client();
    let fields: BTreeMap<String, String> = c.hgetall(key).await.expect("hgetall");
    for (member, ts) in fields.iter().step_by(every) {
        if ts.contains(':') {
            continue;
        }
        let ts = if board.tie_break == TieBreak::None {
            0
        } else {
            ts.parse().expect("a tie-break time")
        };
        let old = encode_member(board.tie_break, member, ts);
        let _: i64 = c.hset(key, (member.as_str(), old)).await.expect("hset");
    }
    fields.len()
}

async fn write_old_all(store: &Store, board: &Board, every: usize) {
    let k = store.instance(&board.widest(), None);
    assert!(write_old(store, board, &k.members(), every).await > 0);
    if board.mode == Mode::Resummarize {
        assert!(write_old(store, board, &k.ranked(), every).await > 0);
    }
}

/// Member -> (total, newest time).
type Model = BTreeMap<String, (i64, i64)>;

fn fold_into(model: &mut Model, events: &[ApplyEvent]) {
    for e in events {
        let slot = model.entry(e.member.clone()).or_insert((0, e.ts));
        slot.0 += e.amount;
        slot.1 = slot.1.max(e.ts);
    }
}

/// The ranking, the rank and the neighbourhood of every member match the model exactly.
async fn check(store: &Store, b: &Board, now: i64, model: &Model, what: &str) {
    let tie = b.tie_break;
    let last = |ts: i64| (tie != TieBreak::None).then_some(ts);
    let mut expected: Vec<(String, i64, Option<i64>)> = model
        .iter()
        .map(|(m, (total, ts))| (m.clone(), *total, last(*ts)))
        .collect();
    expected.sort_by(|x, y| {
        let zx = encode_member(tie, &x.0, x.2.unwrap_or(0));
        let zy = encode_member(tie, &y.0, y.2.unwrap_or(0));
        (y.1, zy).cmp(&(x.1, zx))
    });
    let page = store
        .top(&b.widest(), None, 0, 100, now)
        .await
        .expect("top");
    let got: Vec<_> = page
        .entries
        .iter()
        .map(|e| (e.member.clone(), e.total, e.last_ts))
        .collect();
    assert_eq!(got, expected, "{} {what}: top", b.name);
    for (i, (m, total, ts)) in expected.iter().enumerate() {
        let r = store.rank(&b.widest(), None, m, now).await.expect("rank");
        assert_eq!(
            (r.rank, r.total, r.last_ts),
            (Some(i as u64 + 1), Some(*total), *ts),
            "{} {what}: rank of {m:?}",
            b.name
        );
        let around = store
            .around(&b.widest(), None, m, 1, now)
            .await
            .expect("around")
            .expect("on the board");
        let at = around
            .entries
            .iter()
            .find(|e| e.rank == i as u64 + 1)
            .expect("its own row");
        assert_eq!(
            (&at.member, at.total),
            (m, *total),
            "{} {what}: around {m:?}",
            b.name
        );
    }
}

/// Resummarize boards rank only what a run summed: a rebuild does that here.
async fn settle(store: &Store, b: &Board) {
    if b.mode == Mode::Resummarize {
        let r = roll::rebuild(store, &b.widest(), None, 7)
            .await
            .expect("rebuild");
        assert!(r.estimated.is_empty(), "{r:?}");
    }
}

/// Tie-break times of 0 and of 2^53 - 1 (the bounds `parse_ts` accepts) and member names
/// made of digits (one of them 16 digits, as long as a stored time) read back exactly on
/// every board shape: in the current layout, after rewriting every value in the older
/// layout, through verify and rebuild, and after further events move some times.
#[tokio::test]
async fn extreme_times_and_digit_names_read_back_in_both_layouts() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let names = [
        "x",
        "7",
        "1234567890123456",
        "9007199254740991",
        "0000000000000000",
        "00",
    ];
    for (end, base, now) in [("low", 0, 3_999), ("high", LIMIT - 3_991, LIMIT)] {
        for b in boards() {
            let mut b = b;
            b.name = format!("{}{end}", b.name);
            let mut model = Model::new();
            // Equal totals: the order among them is the tie-break's. "x" contributes at
            // `base` (0 on the low side), "7" at `now` (2^53 - 1 on the high side).
            let mut first: Vec<ApplyEvent> = names
                .iter()
                .enumerate()
                .map(|(i, m)| ev(&format!("p{i}"), base + i as i64 * 7, m, 5))
                .collect();
            first.push(ev("q", base, "x", 5));
            first.push(ev("q2", base + 5, "00", 5));
            // The newest time at the very top end of the range (LIMIT on the high side).
            first.push(ev("top", now, "7", 5));
            fold_into(&mut model, &first);
            apply_events(&store, &b, &first, now).await;
            settle(&store, &b).await;
            check(&store, &b, now, &model, &format!("{end}: written")).await;
            write_old_all(&store, &b, 1).await;
            check(&store, &b, now, &model, &format!("{end}: old layout")).await;
            let v = roll::verify(&store, &b.widest(), None, 7)
                .await
                .expect("verify");
            assert!(v.differences.is_empty(), "{} {end}: {v:?}", b.name);
            let r = roll::rebuild(&store, &b.widest(), None, 7)
                .await
                .expect("rebuild");
            assert!(r.estimated.is_empty(), "{} {end}: {r:?}", b.name);
            check(&store, &b, now, &model, &format!("{end}: rebuilt from old")).await;
            // Half the values old, half new.
            write_old_all(&store, &b, 2).await;
            check(&store, &b, now, &model, &format!("{end}: mixed layout")).await;
            // Later times for some (their tie-break time moves), earlier for others
            // (it stays), one batch through fold.lua and one event by event.
            let second = vec![
                ev("s1", now - 1, "1234567890123456", 3),
                ev("s2", base + 2, "9007199254740991", 3),
                ev("s3", now, "0000000000000000", 3),
            ];
            fold_into(&mut model, &second);
            apply_events(&store, &b, &second, now).await;
            let third = vec![
                ev("t1", now, "00", 3),
                ev("t1", now, "00", 3),
                ev("t2", base, "x", 3),
            ];
            fold_into(&mut model, &[third[0].clone(), third[2].clone()]);
            apply_events(&store, &b, &third, now).await;
            settle(&store, &b).await;
            check(
                &store,
                &b,
                now,
                &model,
                &format!("{end}: after more events"),
            )
            .await;
            let v = roll::verify(&store, &b.widest(), None, 7)
                .await
                .expect("verify");
            assert!(v.differences.is_empty(), "{} {end}: {v:?}", b.name);
        }
    }
}

/// A `members` value that is neither a tie-break time (at most 2^53 - 1) nor the ZSet
/// member an older version wrote for that very member is refused with a clear error by
/// both apply scripts, a rank or around query, and a rebuild; nothing is written and no
/// other member's total is taken for this one's.
#[tokio::test]
async fn corrupt_members_values_are_refused() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    const NOW: i64 = 1_000_000;
    let bad = [
        "abc".to_string(),
        String::new(),
        "-5".into(),
        "1.5".into(),
        " 12".into(),
        "12345678901234567".into(),
        "00000000000000001".into(),
        "9007199254740992".into(),
        "9999999999999999".into(),
        // An older version's layout, but of another member or out of range.
        encode_member(TieBreak::Latest, "other", NOW - 10),
        encode_member(TieBreak::Latest, "m:x", NOW - 10),
        "9999999999999999:m".into(),
        "0000000000000005:".into(),
        // A colon inside the 16-character prefix.
        "12:4567890123456:m".into(),
    ];
    for b in boards()
        .into_iter()
        .filter(|b| b.tie_break != TieBreak::None)
    {
        let k = store.instance(&b.widest(), None);
        let first = vec![
            ev("a1", NOW - 10, "m", 4),
            ev("a2", NOW - 20, "other", 9),
            ev("a3", NOW - 20, "m:x", 2),
        ];
        apply_events(&store, &b, &first, NOW).await;
        settle(&store, &b).await;
        let lookups = if b.mode == Mode::Resummarize {
            vec![k.members(), k.ranked()]
        } else {
            vec![k.members()]
        };
        for key in &lookups {
            let saved: String = store.client().hget(key, "m").await.expect("hget");
            for value in &bad {
                let _: i64 = store
                    .client()
                    .hset(key, ("m", value.as_str()))
                    .await
                    .expect("hset");
                let before = snapshot(&store, &b).await;
                let what = format!("{} {key} = {value:?}", b.name);
                if key == &k.members() {
                    let e = store
                        .apply(&b, None, &[ev("b1", NOW - 5, "m", 1)], NOW)
                        .await
                        .expect_err(&what);
                    assert!(e.to_string().contains("ROLLBOARD corrupt"), "{what}: {e}");
                    // A repeated id: event by event.
                    let twice = [ev("b2", NOW - 5, "m", 1), ev("b2", NOW - 5, "m", 1)];
                    let e = store.apply(&b, None, &twice, NOW).await.expect_err(&what);
                    assert!(e.to_string().contains("ROLLBOARD corrupt"), "{what}: {e}");
                    // Expiry of the slice holding it (called directly: a roll would
                    // first raise the watermark, which a failed call does not undo).
                    let e = store
                        .expire_chunk(&b.widest(), None, b.slice_of(NOW - 10), &["m".to_string()])
                        .await
                        .expect_err(&what);
                    assert!(e.to_string().contains("ROLLBOARD corrupt"), "{what}: {e}");
                    let e = roll::rebuild(&store, &b.widest(), None, 7)
                        .await
                        .expect_err(&what);
                    assert!(e.to_string().contains("corrupt"), "{what}: {e}");
                }
                let lookup = if b.mode == Mode::Resummarize {
                    k.ranked()
                } else {
                    k.members()
                };
                if key == &lookup {
                    let e = store
                        .rank(&b.widest(), None, "m", NOW)
                        .await
                        .expect_err(&what);
                    assert!(e.to_string().contains("ROLLBOARD corrupt"), "{what}: {e}");
                    let e = store
                        .around(&b.widest(), None, "m", 1, NOW)
                        .await
                        .expect_err(&what);
                    assert!(e.to_string().contains("ROLLBOARD corrupt"), "{what}: {e}");
                }
                assert_eq!(
                    snapshot(&store, &b).await,
                    before,
                    "{what}: a failed call wrote"
                );
            }
            let _: i64 = store
                .client()
                .hset(key, ("m", saved.as_str()))
                .await
                .expect("hset");
        }
        let r = store.rank(&b.widest(), None, "m", NOW).await.expect("rank");
        assert_eq!(r.total, Some(4), "{}", b.name);
    }
}

/// A rebuild that restores a lost `members` entry in the newest slice a time can be in
/// (the one holding 2^53 - 1) records a time the scripts accept: the member stays
/// readable and writable afterwards, on every tie-break.
#[tokio::test]
async fn a_lost_entry_restored_in_the_last_slice_stays_readable() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let now = LIMIT;
    for b in boards() {
        let k = store.instance(&b.widest(), None);
        let first = vec![ev("a1", now - 3, "m", 4), ev("a2", now - 2_500, "n", 4)];
        apply_events(&store, &b, &first, now).await;
        let _: i64 = store.client().hdel(k.members(), "m").await.expect("hdel");
        let r = roll::rebuild(&store, &b.widest(), None, 7)
            .await
            .expect("rebuild");
        assert_eq!(r.estimated, vec!["m".to_string()], "{}", b.name);
        let rank = store.rank(&b.widest(), None, "m", now).await.expect("rank");
        assert_eq!(rank.total, Some(4), "{}", b.name);
        store
            .apply(&b, None, &[ev("a3", now - 1, "m", 1)], now)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name));
        settle(&store, &b).await;
        let rank = store.rank(&b.widest(), None, "m", now).await.expect("rank");
        assert_eq!(rank.total, Some(5), "{}", b.name);
        let v = roll::verify(&store, &b.widest(), None, 7)
            .await
            .expect("verify");
        assert!(v.differences.is_empty(), "{}: {v:?}", b.name);
    }
}
