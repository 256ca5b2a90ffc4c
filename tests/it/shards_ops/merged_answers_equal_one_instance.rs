//! A sharded board answers exactly as one instance holding the same events: every page
//! of `top` (pages crossing shards, past the last entry), `rank` of every member and of
//! one held nowhere, `around` at the top and bottom edges and with radii past the board,
//! `ranks` with repeated and unknown members, and `all_windows` on a board with two
//! windows; for each tie-break, with ties between members of different shards (large
//! totals among them), before and after a roll lets go of some slices.

use rollboard::domain::board::{Board, TieBreak};
use rollboard::store::{ApplyEvent, Store};

use super::{apply_sharded, comparable, members_by_shard, now0, sharded, two_windows};
use crate::support::asserts::side_by_side;
use crate::support::boards::{apply_events, board, count_at, ev, roll_board, HOUR};
use crate::support::redis::RedisServer;

/// Events for the members of `by_shard`: ties between shards at every total (each total
/// given to members of different shards, at different times so that each tie-break
/// orders them), a large total tied across shards, members with events in two slices,
/// and one member brought to 0 (unranked) on a board that allows refunds.
fn events(by_shard: &[Vec<String>], now: i64, refunds: bool) -> Vec<ApplyEvent> {
    let mut out = Vec::new();
    let mut n = 0;
    let mut id = || {
        n += 1;
        format!("e{n}")
    };
    for (s, members) in by_shard.iter().enumerate() {
        for (j, m) in members.iter().enumerate() {
            // The totals 5, 7, 7, 12, large: equal between shards; times differ.
            let back = ((s * 7 + j * 3) % 5) as i64 * HOUR + (s as i64 + 1) * 1_000;
            let amount = match j {
                0 => 5,
                1 | 2 => 7,
                3 => 1_000_000_000_000_001,
                _ => 12,
            };
            if j == 2 {
                // 7 in two events, one in an older slice (gone after the roll below).
                out.push(ev(&id(), now - back, m, 3));
                out.push(ev(&id(), now - 4 * HOUR - 60_000, m, 4));
            } else {
                out.push(ev(&id(), now - back, m, amount));
            }
        }
    }
    if refunds {
        let m = &by_shard[0][0];
        out.push(ev(&id(), now - 60_000, m, -5));
    }
    out
}

/// How far [`assert_same_answers`] looks: the page sizes of `top` (at every offset up to
/// a few past the end), the radii of `around`, and whether every member held must be
/// ranked.
struct Sweep {
    limits: &'static [u64],
    radii: &'static [u64],
    all_ranked: bool,
}

/// A board of a few dozen members, some of them unranked after a roll.
const WIDE: Sweep = Sweep {
    limits: &[1, 3, 10, 25],
    radii: &[0, 1, 2, 5, 40],
    all_ranked: false,
};

/// A board of fewer than ten members, every one ranked.
const SMALL: Sweep = Sweep {
    limits: &[1, 2, 5],
    radii: &[0, 1, 2, 100],
    all_ranked: true,
};

/// Every query of `plain` (one instance) and `shard` (the same board over shards) at
/// `now` answers alike, for the `members` held and some held nowhere.
async fn assert_same_answers(
    store: &Store,
    plain: &Board,
    shard: &Board,
    members: &[String],
    now: i64,
    sweep: &Sweep,
) {
    let count = count_at(store, &plain.widest(), None, now).await;
    for &limit in sweep.limits {
        for offset in 0..count + 3 {
            let (a, b) = side_by_side((&plain.widest(), &shard.widest()), |v| {
                store.top(v, None, offset, limit, now)
            })
            .await;
            assert_eq!(
                comparable(&b),
                comparable(&a),
                "top offset {offset} limit {limit}"
            );
        }
    }
    let mut asked: Vec<&str> = members.iter().map(String::as_str).collect();
    asked.extend(["nobody", "ünïcödé-ø", ""]);
    for m in &asked {
        if m.is_empty() {
            continue;
        }
        let a = store
            .rank(&plain.widest(), None, m, now)
            .await
            .expect("rank");
        let b = store
            .rank(&shard.widest(), None, m, now)
            .await
            .expect("rank");
        assert_eq!(comparable(&b), comparable(&a), "rank {m}");
        for &radius in sweep.radii {
            let (a, b) = side_by_side((&plain.widest(), &shard.widest()), |v| {
                store.around(v, None, m, radius, now)
            })
            .await;
            if sweep.all_ranked && members.iter().any(|held| held == m) {
                assert!(a.is_ok() && b.is_ok(), "around {m} {radius}: ranked");
            }
            let (a, b) = match (a, b) {
                (Ok(a), Ok(b)) => (comparable(&a), comparable(&b)),
                (Err(a), Err(b)) => (comparable(&a), comparable(&b)),
                (a, b) => panic!("around {m} {radius}: {a:?} against {b:?}"),
            };
            assert_eq!(b, a, "around {m} radius {radius}");
        }
    }
    // Subsets: repeated members, unknown ones, members of one shard, of every shard.
    let first = members[0].as_str();
    let last = members[members.len() - 1].as_str();
    let subsets: Vec<Vec<&str>> = vec![
        vec![first],
        vec!["nobody"],
        vec![first, first, last, "nobody", first, "nobody"],
        asked[..asked.len() - 1].to_vec(),
        asked.iter().rev().skip(1).copied().collect(),
    ];
    for subset in subsets {
        let a = store
            .ranks(&plain.widest(), None, &subset, now)
            .await
            .expect("ranks");
        let b = store
            .ranks(&shard.widest(), None, &subset, now)
            .await
            .expect("ranks");
        assert_eq!(comparable(&b), comparable(&a), "ranks {subset:?}");
    }
}

/// One tie-break: the plain board and the sharded one take the same events, then are
/// compared before and after a roll (the `j == 2` members lose their older slice).
async fn same_as_one_instance(tie: TieBreak, refunds: bool) {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut plain = board("plain", HOUR, 6);
    plain.tie_break = tie;
    plain.allow_negative = refunds;
    let mut shard = sharded("shard", 4);
    shard.tie_break = tie;
    shard.allow_negative = refunds;
    let by_shard = members_by_shard(&shard, "m", 5);
    let now = now0();
    let evs = events(&by_shard, now, refunds);
    let a = apply_events(&store, &plain, &evs, now).await;
    let b = apply_sharded(&store, &shard, &evs, now).await;
    assert_eq!(a, b);
    let members: Vec<String> = by_shard.concat();
    let count = count_at(&store, &plain.widest(), None, now).await;
    assert!(count > 10, "{count}");
    assert_same_answers(&store, &plain, &shard, &members, now, &WIDE).await;

    let later = now + 2 * HOUR;
    roll_board(&store, &plain, later).await;
    let report = roll_board(&store, &shard, later).await;
    assert_eq!(report.instances_failed, 0);
    assert_same_answers(&store, &plain, &shard, &members, later, &WIDE).await;
}

#[tokio::test]
async fn ties_across_shards_rank_as_on_one_instance_with_earliest() {
    same_as_one_instance(TieBreak::Earliest, false).await;
}

#[tokio::test]
async fn ties_across_shards_rank_as_on_one_instance_with_latest_and_refunds() {
    same_as_one_instance(TieBreak::Latest, true).await;
}

#[tokio::test]
async fn ties_across_shards_rank_as_on_one_instance_with_no_tie_break() {
    same_as_one_instance(TieBreak::None, false).await;
}

/// `around` at the edges: the first member (nothing above), the last (nothing below), a
/// radius past the whole board, and a board whose every member is in one shard (the
/// others empty).
#[tokio::test]
async fn around_at_the_top_and_bottom_edges_and_with_empty_shards() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let plain = board("plain", HOUR, 6);
    let shard = sharded("shard", 8);
    let now = now0();
    // Three members all in shard #k: the other seven shards are empty.
    let by_shard = members_by_shard(&shard, "x", 3);
    let lone = &by_shard[5];
    let evs: Vec<ApplyEvent> = lone
        .iter()
        .enumerate()
        .map(|(i, m)| {
            ev(
                &format!("l{i}"),
                now - i as i64 * 1_000,
                m,
                10 * (i as i64 + 1),
            )
        })
        .collect();
    apply_events(&store, &plain, &evs, now).await;
    apply_sharded(&store, &shard, &evs, now).await;
    assert_same_answers(&store, &plain, &shard, lone, now, &SMALL).await;

    // Then one member per shard, all tied with the lone shard's top.
    let spread: Vec<String> = by_shard.iter().map(|s| s[0].clone()).collect();
    let evs: Vec<ApplyEvent> = spread
        .iter()
        .enumerate()
        .map(|(i, m)| ev(&format!("s{i}"), now - (i as i64 + 9) * 1_000, m, 30))
        .collect();
    apply_events(&store, &plain, &evs, now).await;
    apply_sharded(&store, &shard, &evs, now).await;
    let mut all = spread.clone();
    all.extend(lone.iter().cloned());
    assert_same_answers(&store, &plain, &shard, &all, now, &SMALL).await;
    let top = store
        .top(&shard.widest(), None, 0, 100, now)
        .await
        .expect("top");
    let first = &top.entries[0].member;
    let last = &top.entries[top.entries.len() - 1].member;
    let at_top = store
        .around(&shard.widest(), None, first, 2, now)
        .await
        .expect("around")
        .expect("ranked");
    assert_eq!(at_top.entries[0].rank, 1);
    assert_eq!(at_top.entries.len(), 3);
    let at_bottom = store
        .around(&shard.widest(), None, last, 2, now)
        .await
        .expect("around")
        .expect("ranked");
    assert_eq!(at_bottom.entries.len(), 3);
    assert_eq!(at_bottom.entries[2].member, *last);
    assert_eq!(at_bottom.entries[2].rank, top.envelope.count);
}

/// `all_windows` of a sharded board with two windows (2h, 6h): every member, held in
/// one window or both, and one held nowhere, as on one instance; after a roll that lets
/// go of the 2h window's older slices too.
#[tokio::test]
async fn all_windows_of_a_sharded_board_with_two_windows() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let plain = two_windows("plain");
    let mut shard = two_windows("shard");
    shard.shards = 3;
    let by_shard = members_by_shard(&shard, "w", 3);
    let now = now0();
    let mut evs = Vec::new();
    for (s, members) in by_shard.iter().enumerate() {
        for (j, m) in members.iter().enumerate() {
            let back = if j == 0 { 3 * HOUR } else { 0 };
            evs.push(ev(
                &format!("{s}.{j}"),
                now - back - s as i64,
                m,
                4 + j as i64 % 2,
            ));
        }
    }
    assert_eq!(
        apply_events(&store, &plain, &evs, now).await,
        apply_sharded(&store, &shard, &evs, now).await
    );
    for at in [now, now + HOUR] {
        if at != now {
            roll_board(&store, &plain, at).await;
            roll_board(&store, &shard, at).await;
        }
        let mut asked: Vec<String> = by_shard.concat();
        asked.push("nobody".into());
        for m in &asked {
            let a = store
                .rank_in_windows(&plain, None, m, at)
                .await
                .expect("all windows");
            let b = store
                .rank_in_windows(&shard, None, m, at)
                .await
                .expect("all windows");
            assert_eq!(comparable(&b), comparable(&a), "{m} at {at}");
            assert_eq!(b.windows.len(), 2);
        }
    }
}
