//! Packed fold calls (several instances of a scoped board in one `fold.lua` call, as
//! `Store::apply_shares` sends a batch's small instances on one server) against each
//! instance applied by itself (`Store::apply`, one call of its own): for any sequence of
//! batches over many scopes — ids repeated within an instance, across instances and across
//! batches, late events, refunds, totals driven past 2^53 - 1 (slow calls inside a pack),
//! several windows — both give the same outcomes and leave every instance the same data,
//! down to the idempotency entries; and one instance's failure in a pack fails it alone.

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, MAX_TOTAL};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::boards::{ev, scoped, set_string, with_fresh_store};
use crate::support::cluster::LoneNode;
use crate::support::instances::{contents_of, narrow_and_whole_windows, shaped, twin};
use crate::support::proptests::run_cases_threaded;

const NOW: i64 = 1_000_000;
const SCOPES: usize = 12;

/// One batch: each event with its scope's index, and the time it is applied at.
type Batch = (Vec<(usize, ApplyEvent)>, i64);

fn batches() -> impl Strategy<Value = (usize, bool, Vec<Batch>)> {
    let amount = prop_oneof![20 => 1i64..9, 4 => -6i64..0, 1 => Just(MAX_TOTAL / 2 + 1)];
    // Ids from a small range repeat within and across instances and batches; most scopes
    // get an event or two a batch, a few many; slices from late to live.
    let scope = prop_oneof![3 => 0usize..3, 2 => 0usize..SCOPES];
    let event = (scope, 0u32..150, -6_000i64..900, 0usize..12, amount);
    let batch = (prop::collection::vec(event, 1..120), 0i64..2_500);
    (0usize..8, any::<bool>(), prop::collection::vec(batch, 1..4)).prop_map(
        |(shape, windows, raw)| {
            let negative = shaped(shape).allow_negative;
            let mut now = NOW;
            let batches = raw
                .into_iter()
                .map(|(events, advance)| {
                    now += advance;
                    let events = events
                        .into_iter()
                        .map(|(scope, id, offset, member, amount)| {
                            let amount = if negative { amount } else { amount.abs() };
                            let e = ev(
                                &format!("id{id}"),
                                now + offset,
                                &format!("m{member}"),
                                amount,
                            );
                            (scope, e)
                        })
                        .collect();
                    (events, now)
                })
                .collect();
            (shape, windows, batches)
        },
    )
}

/// Board shape `shape` ([`shaped`]), scoped, ranking a window of 2 slices besides its own
/// 4 when `windows`.
fn board_of(shape: usize, windows: bool) -> Board {
    let mut board = scoped(shaped(shape));
    if windows {
        board.windows = narrow_and_whole_windows();
        board.name = format!("{}-w2", board.name);
    }
    board
}

fn scope_name(i: usize) -> String {
    format!("room{i}")
}

/// The events of `batch` by scope, each scope's in stream order.
fn by_scope(batch: &[(usize, ApplyEvent)]) -> Vec<(String, Vec<ApplyEvent>, Vec<usize>)> {
    let mut out: Vec<(String, Vec<ApplyEvent>, Vec<usize>)> = Vec::new();
    for (i, (scope, e)) in batch.iter().enumerate() {
        let name = scope_name(*scope);
        match out.iter_mut().find(|(s, _, _)| *s == name) {
            Some((_, events, at)) => {
                events.push(e.clone());
                at.push(i);
            }
            None => out.push((name, vec![e.clone()], vec![i])),
        }
    }
    out
}

/// Applies `batch` to `board` as the consumer does, every scope's share in one
/// [`Store::apply_shares`]; the outcomes in the order of the batch.
async fn apply_packed(store: &Store, board: &Board, batch: &Batch) -> Vec<Outcome> {
    let (events, now) = batch;
    let shares = by_scope(events);
    let borrowed: Vec<(Option<&str>, &[ApplyEvent])> = shares
        .iter()
        .map(|(s, e, _)| (Some(s.as_str()), e.as_slice()))
        .collect();
    let results = store.apply_shares(board, &borrowed, *now).await;
    let mut out = vec![Outcome::Applied; events.len()];
    for ((_, _, at), result) in shares.iter().zip(results) {
        let outcomes = result.expect("apply_shares");
        assert_eq!(outcomes.len(), at.len(), "one outcome per event");
        for (&i, o) in at.iter().zip(outcomes) {
            out[i] = o;
        }
    }
    out
}

/// Applies `batch` to `board` one scope at a time, each by a call of its own.
async fn apply_alone(store: &Store, board: &Board, batch: &Batch) -> Vec<Outcome> {
    let (events, now) = batch;
    let mut out = vec![Outcome::Applied; events.len()];
    for (scope, of_scope, at) in by_scope(events) {
        let outcomes = store
            .apply(board, Some(&scope), &of_scope, *now)
            .await
            .expect("apply");
        for (&i, o) in at.iter().zip(outcomes) {
            out[i] = o;
        }
    }
    out
}

#[test]
fn packed_instances_agree_with_calls_of_their_own() {
    run_cases_threaded(
        "packed fold calls and calls of their own agree",
        40,
        &batches(),
        async |store, (shape, windows, batches)| {
            let board = board_of(shape, windows);
            let alone = twin(&board);
            for batch in &batches {
                let packed = apply_packed(store, &board, batch).await;
                let own = apply_alone(store, &alone, batch).await;
                if let Some(i) = (0..packed.len()).find(|&i| packed[i] != own[i]) {
                    panic!(
                        "{}: event {i} {:?} at {}: packed {:?}, alone {:?}",
                        board.name, batch.0[i], batch.1, packed[i], own[i]
                    );
                }
            }
            for scope in (0..SCOPES).map(scope_name) {
                for (view, twin_view) in board.views().into_iter().zip(alone.views()) {
                    let a = contents_of(store, &view, Some(&scope)).await;
                    let b = contents_of(store, &twin_view, Some(&scope)).await;
                    assert_eq!(a, b, "{} {scope} {:?}", board.name, view.window_name());
                }
            }
        },
    );
}

/// A pack in which one instance's key holds the wrong type: that instance fails with
/// Redis's `WRONGTYPE` (a data error, as by a call of its own), and the others of the pack
/// are applied.
#[tokio::test]
async fn one_instance_failing_in_a_pack_fails_alone() {
    let (_redis, store, board) = with_fresh_store(board_of(0, false)).await;
    let widest = board.widest();
    let bad = store.instance(&widest, Some("room1"));
    set_string(&store, &bad.members(), "not a hash").await;
    let events: Vec<ApplyEvent> = (0..3)
        .map(|i| ev(&format!("e{i}"), NOW, "ann", 5))
        .collect();
    let scopes = ["room0", "room1", "room2"];
    let shares: Vec<(Option<&str>, &[ApplyEvent])> = scopes
        .iter()
        .zip(&events)
        .map(|(s, e)| (Some(*s), std::slice::from_ref(e)))
        .collect();
    let results = store.apply_shares(&board, &shares, NOW).await;
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].as_ref().expect("room0"), &vec![Outcome::Applied]);
    assert_eq!(results[2].as_ref().expect("room2"), &vec![Outcome::Applied]);
    let failed = results[1].as_ref().expect_err("room1 holds a string");
    assert!(
        failed.to_string().contains("WRONGTYPE") && !failed.is_outage(),
        "{failed}"
    );
    for scope in ["room0", "room2"] {
        let k = store.instance(&widest, Some(scope));
        let score: Option<f64> = store
            .client()
            .zscore(k.result(), format!("{:016}:ann", MAX_TOTAL - NOW))
            .await
            .expect("zscore");
        assert_eq!(score, Some(5.0), "{scope}");
    }
    // Nothing of room1's was written but what its failing call had written before the
    // member read, which is none: its ranking is empty.
    let count: u64 = store.client().zcard(bad.result()).await.expect("zcard");
    assert_eq!(count, 0);
}

/// Where the server refuses a packed call of several slots (`CROSSSLOT`: nothing ran),
/// its instances are applied each by itself, and every batch after it in packs of one
/// slot: every event counts once, none is lost, no batch fails.
#[tokio::test]
async fn a_server_refusing_several_slots_a_call_gets_calls_of_one_slot() {
    let node = LoneNode::start();
    let store = Store::connect(
        &format!("redis://127.0.0.1:{}", node.port()),
        "rb",
        2,
        rollboard::store::Reconnect::Never,
    )
    .await
    .expect("connect");
    let board = board_of(0, false);
    let widest = board.widest();
    for round in 0..2 {
        let events: Vec<ApplyEvent> = (0..SCOPES)
            .map(|i| ev(&format!("r{round}e{i}"), NOW, "ann", 1 + i as i64))
            .collect();
        let names: Vec<String> = (0..SCOPES).map(scope_name).collect();
        let shares: Vec<(Option<&str>, &[ApplyEvent])> = names
            .iter()
            .zip(&events)
            .map(|(s, e)| (Some(s.as_str()), std::slice::from_ref(e)))
            .collect();
        let results = store.apply_shares(&board, &shares, NOW).await;
        for (scope, result) in names.iter().zip(results) {
            assert_eq!(result.expect(scope), vec![Outcome::Applied], "{scope}");
        }
    }
    // One packed call was refused, the first; none after it.
    let stats = node.cli(&["INFO", "commandstats"]);
    let fcall = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .expect("FCALL ran");
    assert!(fcall.contains("rejected_calls=1,"), "{fcall}");
    for (i, scope) in (0..SCOPES).map(scope_name).enumerate() {
        let k = store.instance(&widest, Some(&scope));
        let score: Option<f64> = store
            .client()
            .zscore(k.result(), format!("{:016}:ann", MAX_TOTAL - NOW))
            .await
            .expect("zscore");
        assert_eq!(score, Some(2.0 * (1 + i as i64) as f64), "{scope}");
    }
}
