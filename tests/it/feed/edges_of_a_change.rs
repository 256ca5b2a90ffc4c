//! The change feed at the edges of an apply, an expiry and a swap: a fold call that
//! answers `slow` and the exact path after it, a batch cut into many calls, a call whose
//! reply is lost, ties under each tie-break, refunds to exactly 0 and below, a total that
//! changes without a change of place, a `dense_rank` board, the stream's cap, a top of
//! 100 (four times the largest `changes_top` a configuration may set, built here directly)
//! with thousands of passes, a refused swap. Every step's entries are exactly
//! the change of the top (support/feed.rs `expected_changes`), and the stream replayed
//! from empty is the stored ranking's top.

use rollboard::domain::board::{Board, Changes, Mode, TieBreak};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::asserts::{assert_verified, ranked};
use crate::support::boards::{
    apply_events, board, ev, raise_for_roll_at, roll_board, row, with_fresh_store, RANKING, T0,
};
use crate::support::feed::{changes_after, expected_changes, replay, Change};
use crate::support::proxy::Proxy;
use crate::support::redis::{function_name, RedisServer};

const SLICE: i64 = 60_000;

fn with_feed(mut b: Board, top: u32) -> Board {
    b.changes = Some(Changes {
        top,
        max_len: 1_000_000,
    });
    b
}

fn now0() -> i64 {
    T0 / SLICE * SLICE + SLICE / 2
}

/// A reader of one instance's feed, next to the ranking it must follow.
struct Reader<'a> {
    store: &'a Store,
    b: Board,
    scope: Option<String>,
    top: usize,
    last: Option<String>,
    replayed: Vec<String>,
    shown: Vec<(String, i64)>,
}

impl<'a> Reader<'a> {
    fn new(store: &'a Store, b: &Board, scope: Option<&str>) -> Self {
        Reader {
            store,
            top: b.changes.expect("a feed").top as usize,
            b: b.clone(),
            scope: scope.map(str::to_string),
            last: None,
            replayed: Vec::new(),
            shown: Vec::new(),
        }
    }

    /// Applies the tips `rows` (ids `<prefix><i>`, all at `now`) to the reader's instance
    /// and reads their entries ([`Reader::step`]).
    async fn tip(&mut self, prefix: &str, now: i64, rows: &[(&str, i64)]) -> Vec<Change> {
        let events = tips(prefix, now, rows);
        let scope = self.scope.as_deref();
        self.store
            .apply(&self.b, scope, &events, now)
            .await
            .expect("apply");
        self.step("tip", now).await
    }

    /// The stored ranking's top N at `now` (member, total).
    async fn stored_top(&self, now: i64) -> Vec<(String, i64)> {
        ranked(self.store, &self.b, self.scope.as_deref(), now)
            .await
            .into_iter()
            .take(self.top)
            .map(|(m, t, _)| (m, t))
            .collect()
    }

    /// The entries written since the last step: exactly the change from the last top to
    /// the stored one for `cause`; replayed, they give it.
    async fn step(&mut self, cause: &str, now: i64) -> Vec<Change> {
        let key = self
            .store
            .instance(&self.b.widest(), self.scope.as_deref())
            .changes();
        let (changes, last) = changes_after(self.store, &key, self.last.as_deref()).await;
        self.last = last;
        let top = self.stored_top(now).await;
        assert_eq!(changes, expected_changes(&self.shown, &top, cause));
        replay(&mut self.replayed, &changes, self.top);
        let names: Vec<String> = top.iter().map(|(m, _)| m.clone()).collect();
        assert_eq!(self.replayed, names);
        self.shown = top;
        changes
    }
}

fn tips(prefix: &str, now: i64, rows: &[(&str, i64)]) -> Vec<ApplyEvent> {
    rows.iter()
        .enumerate()
        .map(|(i, &(m, a))| ev(&format!("{prefix}{i}"), now, m, a))
        .collect()
}

/// Part `part` of a hundred tips `<prefix><i>` to the members `m000` to `m099`, 25 a part,
/// tip `i` of `amount(i)`, all at `now`.
fn part_of_100(prefix: &str, part: i64, now: i64, amount: impl Fn(i64) -> i64) -> Vec<ApplyEvent> {
    (25 * part..25 * part + 25)
        .map(|i| ev(&format!("{prefix}{i}"), now, &format!("m{i:03}"), amount(i)))
        .collect()
}

#[tokio::test]
async fn a_fold_that_answers_slow_records_the_change_once_from_the_exact_path() {
    let (_redis, store, b) = with_fresh_store(with_feed(board("slow", SLICE, 4), 3)).await;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    let first = tips("a", now, &[("alice", 5), ("bob", 3), ("carol", 1)]);
    apply_events(&store, &b, &first, now).await;
    assert_eq!(r.step("tip", now).await.len(), 3);
    // One duplicate beside new events: fold.lua answers `slow`, then judges them event by event.
    let mut batch = vec![first[0].clone()];
    batch.extend(tips("b", now, &[("dave", 10), ("carol", 3), ("erin", 2)]));
    assert_eq!(
        apply_events(&store, &b, &batch, now).await,
        vec![
            Outcome::Duplicate,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Applied
        ]
    );
    let changes = r.step("tip", now).await;
    // bob left the top 3 for carol's 4, dave entered at 1: written once.
    assert_eq!(
        changes.iter().map(|c| c.kind.as_str()).collect::<Vec<_>>(),
        ["left", "entered"],
        "{changes:?}"
    );
    // The same batch again: every event a duplicate, nothing written.
    apply_events(&store, &b, &batch, now).await;
    assert!(r.step("tip", now).await.is_empty());
}

#[tokio::test]
async fn a_batch_cut_into_many_calls_writes_each_calls_change() {
    let (_redis, store, b) = with_fresh_store(with_feed(board("many", SLICE, 4), 5)).await;
    let now = now0();
    // 90 distinct members, rising amounts: four fold calls, each one pushing the top.
    let events: Vec<ApplyEvent> = (0..90)
        .map(|i| ev(&format!("e{i}"), now, &format!("m{i:02}"), i + 1))
        .collect();
    let chunks = rollboard::store::fold_chunks(&b, &events);
    assert_eq!(chunks.len(), 4);
    apply_events(&store, &b, &events, now).await;
    // The entries of every call, in order: each the change its chunk made.
    let key = store.instance(&b.widest(), None).changes();
    let (changes, _) = changes_after(&store, &key, None).await;
    let mut expected = Vec::new();
    let mut before: Vec<(String, i64)> = Vec::new();
    let mut applied: Vec<(String, i64)> = Vec::new();
    for chunk in &chunks {
        applied.extend(chunk.iter().map(|e| (e.member.clone(), e.amount)));
        let mut top = applied.clone();
        top.sort_by_key(|x| std::cmp::Reverse(x.1));
        top.truncate(5);
        expected.extend(expected_changes(&before, &top, "tip"));
        before = top;
    }
    assert_eq!(changes, expected);
    let mut replayed = Vec::new();
    replay(&mut replayed, &changes, 5);
    assert_eq!(replayed, ["m89", "m88", "m87", "m86", "m85"]);
}

/// The second fold call of a batch is cut after it reached Redis: the apply fails, and the
/// batch applied again writes the entries of the calls that had not run, never twice.
#[tokio::test]
async fn a_call_whose_reply_is_lost_is_not_recorded_twice() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let store = proxy.store().await;
    let b = with_feed(board("cut", SLICE, 4), 4);
    let now = now0();
    let warm = board("warm", SLICE, 4);
    apply_events(&store, &warm, &[ev("w", now, "m", 1)], now).await;
    let events: Vec<ApplyEvent> = (0..70)
        .map(|i| ev(&format!("e{i}"), now, &format!("m{i:02}"), i + 1))
        .collect();
    assert_eq!(rollboard::store::fold_chunks(&b, &events).len(), 3);
    proxy.cut_at(&function_name("fold"), 2, 1);
    let failed = store.apply(&b, None, &events, now).await;
    assert!(!proxy.armed(), "the cut never happened: {failed:?}");
    assert!(failed.is_err());
    apply_events(&store, &b, &events, now).await;
    apply_events(&store, &b, &events, now).await;
    let key = store.instance(&b.widest(), None).changes();
    let (changes, _) = changes_after(&store, &key, None).await;
    let mut replayed = Vec::new();
    replay(&mut replayed, &changes, 4);
    assert_eq!(replayed, ["m69", "m68", "m67", "m66"]);
    // Each member entered once at most: no call wrote its entries twice.
    let mut entered: Vec<&str> = changes
        .iter()
        .filter(|c| c.kind == "entered")
        .map(|c| c.member.as_str())
        .collect();
    let n = entered.len();
    entered.sort();
    entered.dedup();
    assert_eq!(entered.len(), n, "{changes:?}");
}

#[tokio::test]
async fn ties_are_recorded_in_the_order_queries_rank_them() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for tie in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None] {
        let mut b = with_feed(board(&format!("tie{tie:?}"), SLICE, 4), 3);
        b.tie_break = tie;
        let now = now0();
        let mut r = Reader::new(&store, &b, None);
        // Equal totals, equal times: the name decides.
        let same = tips(
            "a",
            now,
            &[("bob", 5), ("alice", 5), ("carol", 5), ("dave", 5)],
        );
        apply_events(&store, &b, &same, now).await;
        r.step("tip", now).await;
        // Equal totals, a later time for one of them.
        apply_events(&store, &b, &[ev("later", now + 10, "erin", 5)], now + 10).await;
        r.step("tip", now + 10).await;
        // A zero tip: the total stays, the time moves (under earliest and latest).
        apply_events(&store, &b, &[ev("zero", now + 20, "alice", 0)], now + 20).await;
        r.step("tip", now + 20).await;
        // One more for the last of the top: it passes both.
        let last = r.shown.last().expect("a top").0.clone();
        apply_events(&store, &b, &[ev("up", now + 30, &last, 1)], now + 30).await;
        let changes = r.step("tip", now + 30).await;
        assert_eq!(changes.len(), 2, "{tie:?}: {changes:?}");
    }
}

#[tokio::test]
async fn a_total_that_changes_without_a_change_of_place_records_nothing() {
    let (_redis, store, b) = with_fresh_store(with_feed(board("still", SLICE, 4), 3)).await;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    r.tip("a", now, &[("alice", 9), ("bob", 5)]).await;
    assert_eq!(
        r.tip("b", now, &[("alice", 3), ("bob", 1)]).await,
        Vec::new()
    );
    // A third member below them enters; a fourth below the top does nothing.
    let changes = r.tip("c", now, &[("carol", 1), ("dave", 1)]).await;
    assert_eq!(changes.len(), 1, "{changes:?}");
}

#[tokio::test]
async fn a_refund_to_zero_or_below_leaves_and_back_above_enters() {
    let (_redis, store, mut b) = with_fresh_store(with_feed(board("refund", SLICE, 4), 3)).await;
    b.allow_negative = true;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    r.tip("a", now, &[("alice", 9), ("bob", 5)]).await;
    // bob refunded to exactly 0: he leaves the ranked top.
    apply_events(&store, &b, &[ev("c", now, "bob", -5)], now).await;
    let changes = r.step("tip", now).await;
    assert_eq!(changes.len(), 1);
    assert_eq!(
        (changes[0].kind.as_str(), changes[0].rank, changes[0].total),
        ("left", 2, 5)
    );
    // Below 0, and back above it.
    apply_events(&store, &b, &[ev("d", now, "alice", -20)], now).await;
    assert_eq!(r.step("tip", now).await.len(), 1);
    apply_events(&store, &b, &[ev("e", now, "alice", 30)], now).await;
    let changes = r.step("tip", now).await;
    assert_eq!(
        (changes[0].kind.as_str(), changes[0].total),
        ("entered", 19)
    );
    apply_events(&store, &b, &[ev("f", now, "bob", 1)], now).await;
    r.step("tip", now).await;
    // The roll takes everything away: each member left, cause roll.
    let later = now + 5 * SLICE;
    roll_board(&store, &b, later).await;
    let changes = r.step("roll", later).await;
    assert_eq!(changes.len(), 2);
    assert!(changes.iter().all(|c| c.kind == "left"), "{changes:?}");
    assert!(r.replayed.is_empty());
}

#[tokio::test]
async fn a_dense_rank_board_keeps_its_feed_and_its_distinct_totals() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = with_feed(board(&format!("dense{mode:?}"), SLICE, 4), 3);
        b.dense_rank = true;
        b.mode = mode;
        let now = now0();
        let mut r = Reader::new(&store, &b, None);
        let cause = if mode == Mode::Incremental {
            "tip"
        } else {
            "roll"
        };
        let events = tips(
            "a",
            now - 2 * SLICE,
            &[("alice", 4), ("bob", 4), ("carol", 2)],
        );
        apply_events(&store, &b, &events, now).await;
        if mode == Mode::Resummarize {
            roll_board(&store, &b, now).await;
        }
        r.step(cause, now).await;
        let events = tips("b", now, &[("dave", 3), ("carol", 5)]);
        apply_events(&store, &b, &events, now).await;
        if mode == Mode::Resummarize {
            roll_board(&store, &b, now).await;
        }
        r.step(cause, now).await;
        assert_verified(&store, &b.widest(), None).await;
        // The first slice dies: alice and bob leave, dave enters.
        let later = now + 3 * SLICE;
        roll_board(&store, &b, later).await;
        r.step("roll", later).await;
        assert_verified(&store, &b.widest(), None).await;
        // A rebuild over a ranking that matches changes nothing.
        rollboard::roll::rebuild(&store, &b.widest(), None, 10)
            .await
            .expect("rebuild");
        r.step("roll", later).await;
    }
}

#[tokio::test]
async fn the_stream_holds_exactly_changes_max_len_entries() {
    let (_redis, store, mut b) = with_fresh_store(board("capped", SLICE, 4)).await;
    b.changes = Some(Changes { top: 2, max_len: 5 });
    let now = now0();
    let key = store.instance(&b.widest(), None).changes();
    // Two members overtaking each other 20 times: one `passed` entry each.
    let mut totals = [0i64; 2];
    for i in 0..20 {
        let (who, other) = (i % 2, 1 - i % 2);
        let amount = totals[other] - totals[who] + 1;
        totals[who] += amount;
        let member = ["alice", "bob"][who];
        let tip = ev(&format!("e{i}"), now, member, amount);
        apply_events(&store, &b, &[tip], now).await;
    }
    let (changes, _) = changes_after(&store, &key, None).await;
    // The first tip: alice entered; the second: bob entered ahead... each later tip one pass.
    assert_eq!(changes.len(), 5, "{changes:?}");
    assert!(changes.iter().all(|c| c.kind == "passed"));
    assert_eq!(changes.last().expect("one").member, "bob");
    assert_eq!(changes.last().expect("one").total, totals[1]);
}

/// A top of 100, and 25 members from its bottom jumping to its head in one call: 25 × 75
/// `passed` entries in that call, exact and replayable.
#[tokio::test]
async fn a_top_of_100_records_every_pass_of_a_call() {
    let (redis, store, b) = with_fresh_store(with_feed(board("hundred", SLICE, 4), 100)).await;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    for part in 0..4 {
        let events = part_of_100("a", part, now, |i| 1_000 + i);
        apply_events(&store, &b, &events, now).await;
        assert_eq!(r.step("tip", now).await.len(), 25);
    }
    let jump: Vec<ApplyEvent> = (0..25)
        .map(|i| ev(&format!("b{i}"), now, &format!("m{i:03}"), 10_000))
        .collect();
    assert_eq!(rollboard::store::fold_chunks(&b, &jump).len(), 1);
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    redis.cli(&["SLOWLOG", "RESET"]);
    apply_events(&store, &b, &jump, now).await;
    let us = longest_call(&redis, "_fold");
    eprintln!("a fold call recording 1875 passes held redis for {us} µs");
    let changes = r.step("tip", now).await;
    assert_eq!(changes.len(), 25 * 75);
}

/// A resummarize run whose swap is refused (an apply moved `gen` after it read it) writes
/// nothing; the next run writes the whole change.
#[tokio::test]
async fn a_refused_swap_records_nothing() {
    let (_redis, store, mut b) = with_fresh_store(with_feed(board("race", SLICE, 4), 3)).await;
    b.mode = Mode::Resummarize;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    let events = tips("a", now, &[("alice", 4), ("bob", 2)]);
    apply_events(&store, &b, &events, now).await;
    let (_, gen) = store.meta(&b.widest(), None).await.expect("meta");
    let token = "race1";
    store
        .stage(
            &b.widest(),
            None,
            token,
            RANKING,
            &[row("alice", 4), row("bob", 2)],
        )
        .await
        .expect("stage");
    apply_events(&store, &b, &[ev("c", now, "carol", 9)], now).await;
    let check = rollboard::store::SwapCheck {
        gen: Some(&gen),
        ..Default::default()
    };
    assert!(!store
        .swap(&b.widest(), None, token, RANKING, check)
        .await
        .expect("swap"));
    let key = store.instance(&b.widest(), None).changes();
    assert_eq!(changes_after(&store, &key, None).await.0, Vec::new());
    roll_board(&store, &b, now).await;
    assert_eq!(r.step("roll", now).await.len(), 3);
}

/// The longest a call of `function` ran per the slow log (µs), the log then reset.
fn longest_call(redis: &RedisServer, function: &str) -> u64 {
    let log = redis.cli(&["SLOWLOG", "GET", "1000"]);
    let lines: Vec<&str> = log.lines().collect();
    let mut longest = 0;
    // redis-cli prints each entry flat: id, time, duration, then the arguments.
    for i in 1..lines.len().saturating_sub(1) {
        if lines[i].eq_ignore_ascii_case("fcall") && lines[i + 1].ends_with(function) {
            if let Ok(us) = lines[i - 1].trim().parse::<u64>() {
                longest = longest.max(us);
            }
        }
    }
    redis.cli(&["SLOWLOG", "RESET"]);
    longest
}

/// A resummarize board with a top of 100 whose whole order turns over between two runs:
/// the swap records 4950 `passed` entries in one call, exact and replayable. Prints how
/// long the call held Redis (docs/design.md *Bounded calls*: about 2 ms at most).
#[tokio::test]
async fn a_swap_that_reverses_a_top_of_100_records_every_pass() {
    let (redis, store, mut b) = with_fresh_store(with_feed(board("reversed", SLICE, 4), 100)).await;
    b.mode = Mode::Resummarize;
    b.allow_negative = true;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    for part in 0..4 {
        let events = part_of_100("a", part, now, |i| 1_000 + i);
        apply_events(&store, &b, &events, now).await;
    }
    roll_board(&store, &b, now).await;
    assert_eq!(r.step("roll", now).await.len(), 100);
    for part in 0..4 {
        let events = part_of_100("b", part, now, |i| 200 - 2 * i);
        apply_events(&store, &b, &events, now).await;
    }
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    redis.cli(&["SLOWLOG", "RESET"]);
    roll_board(&store, &b, now).await;
    let us = longest_call(&redis, "_swap");
    eprintln!("a swap recording 4950 passes held redis for {us} µs");
    assert_eq!(r.step("roll", now).await.len(), 4950);
}

/// A roll that dies after expiring part of a dead slice, one member per call: each expiry
/// call writes exactly the change it made (cause `roll`), an apply between two of them
/// writes its own, and the next roll writes the rest.
#[tokio::test]
async fn a_roll_split_across_calls_records_each_calls_change() {
    let (_redis, store, b) = with_fresh_store(with_feed(board("pieces", SLICE, 4), 3)).await;
    let now = now0();
    let mut r = Reader::new(&store, &b, None);
    let old = now - 2 * SLICE;
    let events = tips(
        "a",
        old,
        &[
            ("alice", 9),
            ("bob", 8),
            ("carol", 7),
            ("dave", 6),
            ("erin", 5),
        ],
    );
    apply_events(&store, &b, &events, now).await;
    r.step("tip", now).await;
    r.tip("b", now, &[("dave", 1), ("bob", 1)]).await;
    let later = now + 2 * SLICE;
    let (_, dead) = raise_for_roll_at(&store, &b, None, later).await;
    assert_eq!(dead, vec![b.slice_of(old)]);
    for member in ["alice", "dave"] {
        store
            .expire_chunk(&b.widest(), None, dead[0], &[member.to_string()])
            .await
            .expect("expire");
        let changes = r.step("roll", later).await;
        assert!(!changes.is_empty(), "{member}");
    }
    // An apply between two expiry calls.
    apply_events(&store, &b, &[ev("c", later, "frank", 4)], later).await;
    r.step("tip", later).await;
    // The next roll expires the rest.
    roll_board(&store, &b, later).await;
    r.step("roll", later).await;
    // bob and dave tie at 1 with one time: descending names.
    assert_eq!(r.replayed, ["frank", "dave", "bob"]);
}
