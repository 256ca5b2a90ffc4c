//! Races between a resummarize run and the writers around it, cut at the exact points where
//! they can interleave: a `rollboard rebuild` swapping between a run's sum and its swap, and
//! another replica expiring a slice between two HSCAN pages of the run's sum (which makes
//! Redis hand the scan some fields twice). Each test fails if the ranking can end behind
//! the slices or count an amount twice.

use std::collections::{BTreeMap, BTreeSet};

use rollboard::domain::board::Board;
use rollboard::roll;
use rollboard::store::{ApplyEvent, Reconnect, Store, SwapCheck, EXPIRE_CALL_FIELDS};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{
    apply_model, ev, resummarize, resummarize_at_t0, roll_all, roll_board, row, DAY, HOUR, RANKING,
    T0,
};
use crate::support::model::{assert_matches, Instance};
use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;

/// A replica's resummarize run reads the sum record and sums the live slices; an event is
/// applied; the operator's `rebuild` swaps in a ranking that holds it; then the run swaps
/// its older sum. Rebuild's swap records the `gen` its sum was read at (it is gen-checked,
/// so that `gen` is current when it swaps), so the run's sum, read at an older `gen` above
/// the same watermark, is refused like any older run's: the ranking never goes back behind
/// the slices. Without that record nothing refused the run, and the ranking lacked the
/// event until the next run (which then summed again: the record the run left named its
/// older `gen`, never the current one, so the lag did not last the hour a skip allows).
#[tokio::test]
async fn a_sum_read_before_a_rebuild_is_not_swapped_over_the_rebuilt_ranking() {
    // Day-wide slices: the watermark stays put for the whole test, as it does within a slice.
    let (_redis, store, b, d0) = resummarize_at_t0("reb", DAY, 7).await;
    let mut model = Instance::default();
    apply_model(&store, &b, &mut model, &[ev("1", d0, "a", 5)], d0).await;
    assert_eq!(roll_board(&store, &b, d0).await.resummed, 1);

    // Replica A's run: b's event moved `gen`, so it reads the record and sums (a 5, b 3).
    apply_model(&store, &b, &mut model, &[ev("2", d0 + 1, "b", 3)], d0 + 1).await;
    let before = store.summed(&b.widest(), None).await.unwrap();
    assert_ne!(before.summed_gen.as_deref(), Some(before.gen.as_str()));
    let watermark = before.summed_through.expect("summed once");
    store
        .stage(
            &b.widest(),
            None,
            "replica-a",
            RANKING,
            &[row("a", 5), row("b", 3)],
        )
        .await
        .unwrap();

    // c's event, then the operator's rebuild: the ranking holds all three.
    apply_model(&store, &b, &mut model, &[ev("3", d0 + 2, "c", 4)], d0 + 2).await;
    roll::rebuild(&store, &b.widest(), None, 100).await.unwrap();
    assert_matches(&store, &b.widest(), None, &model, d0 + 3).await;

    // Replica A swaps last.
    let check = SwapCheck {
        watermark: Some(watermark),
        summed_at: Some((before.gen.as_str(), d0 + 3)),
        ..SwapCheck::default()
    };
    let swapped = store
        .swap(&b.widest(), None, "replica-a", RANKING, check)
        .await
        .unwrap();
    if !swapped {
        store.discard(&b.widest(), None, "replica-a").await.unwrap();
    }
    let right_after = roll::verify(&store, &b.widest(), None, 100).await.unwrap();

    // The next regular run, and the one after it (which may skip), end equal to the model.
    roll_board(&store, &b, d0 + 4).await;
    assert_matches(&store, &b.widest(), None, &model, d0 + 4).await;
    roll_board(&store, &b, d0 + 5).await;
    assert_matches(&store, &b.widest(), None, &model, d0 + 5).await;
    assert!(roll::verify(&store, &b.widest(), None, 100)
        .await
        .unwrap()
        .differences
        .is_empty());

    assert!(
        !swapped && right_after.differences.is_empty(),
        "a sum read before the rebuild was swapped over it (swapped: {swapped}); the ranking \
         lagged the slices by {:?}",
        right_after.differences
    );
}

/// Members in the slice that shrinks: more than `hash-max-listpack-entries` (128), so the
/// slice is a hashtable and HSCAN pages it over many cursors.
const MEMBERS: usize = 2000;
/// HSCAN COUNT of the scans under test (the `chunk` they are called with).
const CHUNK: usize = 10;

fn member(i: usize) -> String {
    format!("m{i:04}")
}

fn amount(i: usize) -> i64 {
    1 + (i % 7) as i64
}

/// A slice `n` of [`MEMBERS`] members and the plan to shrink it under a scan: the pages an
/// HSCAN with COUNT [`CHUNK`] returns from the unchanged slice, the number of pages a scan
/// has read when the other replica's expiry runs (so the scan's next HSCAN is the one to
/// hold), and the fields that expiry deletes: every field the scan has read except those of
/// its last three pages (the expiring replica follows the scan a few pages behind) and
/// every field it has not read, which leaves under a tenth of the table and so makes Redis
/// shrink it.
///
/// Where the scan is held matters. The slice's table has 2048 buckets, and the expiry
/// shrinks it to 256 (the next power of two when fewer than a tenth are used). Redis's
/// cursor counts with its bits reversed, so the eight buckets that the small table merges
/// into one are read one after another, and the three top bits (of eleven) of a cursor,
/// reversed, tell how many of its eight were already read: HSCAN, now reading the merged
/// bucket, hands their fields out again. A cursor at the first of its eight would repeat
/// nothing, so of the cursors that leave few enough fields, the hold is placed at the one
/// with the most of its eight read.
struct Shrink {
    n: i64,
    key: String,
    read_before_hold: usize,
    visited: BTreeSet<String>,
    cursor: String,
    expire: Vec<String>,
}

async fn big_slice(store: &Store, b: &Board, model: &mut Instance, n: i64) -> Shrink {
    let ts = n * b.slice_ms;
    let events: Vec<ApplyEvent> = (0..MEMBERS)
        .map(|i| ev(&format!("e{i}"), ts + i as i64, &member(i), amount(i)))
        .collect();
    for part in events.chunks(200) {
        apply_model(store, b, model, part, ts + MEMBERS as i64).await;
    }
    let key = store.instance(&b.widest(), None).slice(n);
    let mut pages: Vec<(String, Vec<String>)> = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, page) = store.scan("HSCAN", &key, &cursor, CHUNK).await.unwrap();
        pages.push((next.clone(), page.into_iter().map(|(f, _)| f).collect()));
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert!(
        pages.len() > 20,
        "a hashtable is paged: {} pages",
        pages.len()
    );
    let read_of_eight = |cursor: &str| {
        cursor
            .parse::<u64>()
            .map_or(0, |c| (c >> 10 & 1) | (c >> 9 & 1) << 1 | (c >> 8 & 1) << 2)
    };
    let mut visited = BTreeSet::new();
    let mut best: Option<(u64, Shrink)> = None;
    for (k, (next, page)) in pages.iter().enumerate() {
        visited.extend(page.iter().cloned());
        let kept: BTreeSet<&String> = pages[k.saturating_sub(2)..=k]
            .iter()
            .flat_map(|(_, p)| p)
            .collect();
        let read = read_of_eight(next);
        if MEMBERS - visited.len() + kept.len() <= 200
            && next != "0"
            && best.as_ref().is_none_or(|(r, _)| read > *r)
        {
            let expire = (0..MEMBERS)
                .map(member)
                .filter(|m| !kept.contains(m))
                .collect();
            let plan = Shrink {
                n,
                key: key.clone(),
                read_before_hold: k + 1,
                visited: visited.clone(),
                cursor: next.clone(),
                expire,
            };
            best = Some((read, plan));
        }
    }
    match best {
        Some((read, plan)) if read >= 4 => plan,
        other => panic!(
            "no cursor that leaves 200 fields or fewer has half its eight buckets read: {:?}",
            other.map(|(r, _)| r)
        ),
    }
}

impl Shrink {
    /// Another replica's roll at `now`, whose watermark reaches slice `n`, raises it and
    /// expires [`Shrink::expire`] (not the rest yet: it is still on its way). Then checks
    /// that an HSCAN resuming at the held scan's cursor is handed fields that scan has
    /// already read: the race this plan sets up is the one that makes Redis repeat fields.
    async fn expire_under_the_scan(&self, other: &Store, b: &Board, now: i64) {
        let target = b.slice_of(now) - b.widest().slices_in_window();
        assert!(target >= self.n);
        let (_, dead) = other
            .raise_watermark(&b.widest(), None, target, now)
            .await
            .unwrap();
        assert!(dead.contains(&self.n));
        let mut report = roll::Report::default();
        roll::InstanceRoll {
            store: other,
            view: &b.widest(),
            scope: None,
            now,
            chunk: EXPIRE_CALL_FIELDS,
            cancel: &CancellationToken::new(),
        }
        .expire_fields(self.n, &self.expire, EXPIRE_CALL_FIELDS, &mut report)
        .await
        .unwrap();
        assert_eq!(report.fields_expired, self.expire.len() as u64);
        let mut repeated = 0;
        let mut cursor = self.cursor.clone();
        loop {
            let (next, page) = other
                .scan("HSCAN", &self.key, &cursor, CHUNK)
                .await
                .unwrap();
            repeated += page
                .iter()
                .filter(|(f, _)| self.visited.contains(f))
                .count();
            if next == "0" {
                break;
            }
            cursor = next;
        }
        assert!(
            repeated > 0,
            "the shrink made Redis repeat no field to a scan at cursor {}",
            self.cursor
        );
    }
}

/// A store reaching `redis` through `proxy`, so that its HSCANs can be held.
async fn proxied(proxy: &Proxy) -> Store {
    Store::connect(&proxy.url(), "rb", 1, Reconnect::Never)
        .await
        .unwrap()
}

/// Fails the test unless `inflated` is empty, counting the members `ranked` above any
/// total they had and showing the first five.
fn assert_none_inflated<T: std::fmt::Debug>(inflated: &[T], ranked: &str) {
    assert!(
        inflated.is_empty(),
        "{} members {ranked} above any total they had, e.g. {:?}",
        inflated.len(),
        &inflated[..inflated.len().min(5)]
    );
}

/// A redis-server, a proxy before it, a store straight to it and one through the proxy.
async fn proxied_rig() -> (RedisServer, Proxy, Store, Store) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let direct = redis.store("rb").await;
    let through = proxied(&proxy).await;
    (redis, proxy, direct, through)
}

/// A resummarize run sums a slice that another replica, whose roll is a moment later and
/// whose watermark reaches that slice, expires while the run pages through it with HSCAN;
/// the expiry empties most of the slice, Redis shrinks the hashtable, and the HSCAN pages
/// after the shrink repeat fields the run has already read.
///
/// No member is ever ranked above a total it had: the summer counts each field of a slice
/// once whatever HSCAN repeats, and the run's swap is refused all the same, because the
/// watermark was raised above the one it summed above (its sum holds a slice that is no
/// longer live, read part way through its expiry). Once the other replica's run is done,
/// the ranking equals the model.
///
/// Only this race shrinks a slice under a sum: fields leave a slice only through the
/// expiry of a dead slice (`expire.lua`), and a slice is dead only at or below the
/// watermark, which is raised before any of its fields goes. A run's own expiry is over
/// before it sums, and it sums only above the watermark it raised, so what shrinks under it
/// is always a slice that another roller's raised watermark made dead. Slices above the
/// watermark only grow (an apply adds or changes fields), and a growing hashtable makes
/// HSCAN repeat nothing.
#[tokio::test]
async fn a_slice_expired_under_a_resummarize_sum_is_never_counted_twice() {
    let (_redis, proxy, direct, run_store) = proxied_rig().await;
    let b = resummarize("shrink", HOUR, 3);
    let boards = std::slice::from_ref(&b);
    let n = b.slice_of(T0);
    let mut model = Instance::default();
    let shrink = big_slice(&direct, &b, &mut model, n).await;
    let later = (n + 1) * HOUR;
    apply_model(&direct, &b, &mut model, &[ev("z", later, "z", 9)], later).await;

    // The run's clock is a millisecond before slice n leaves the window, the other
    // replica's at that moment.
    let (run_at, other_at) = ((n + 3) * HOUR - 1, (n + 3) * HOUR);
    let hold = proxy.hold_at(b"HSCAN", shrink.read_before_hold + 1);
    let interleave = async {
        hold.reached().await;
        shrink.expire_under_the_scan(&direct, &b, other_at).await;
        hold.release();
    };
    let (reports, ()) = tokio::join!(roll_all(&run_store, boards, run_at, CHUNK), interleave);
    assert_eq!(reports[0].resummed, 1);

    let amounts: BTreeMap<String, i64> = (0..MEMBERS).map(|i| (member(i), amount(i))).collect();
    let ranked = direct.result_entries(&b.widest(), None).await.unwrap();
    let inflated: Vec<&(String, i64)> = ranked
        .iter()
        .filter(|(m, t)| *t > amounts.get(m).copied().unwrap_or(9))
        .collect();
    assert_none_inflated(&inflated, "ranked");

    // Refused: nothing of the run's sum was swapped in.
    let record = direct.summed(&b.widest(), None).await.unwrap();
    assert_eq!(record.summed_through, None, "the run's sum was swapped in");
    assert!(ranked.is_empty(), "ranked: {} members", ranked.len());

    // The other replica's run finishes its expiry and sums above its watermark.
    roll_all(&direct, boards, other_at, CHUNK).await;
    model.roll(&b.widest(), other_at);
    assert_matches(&direct, &b.widest(), None, &model, other_at).await;
}

/// `verify` of a resummarize instance sums the live slices like a run does, and nothing
/// refuses its answer: while another replica expires a slice between two of its HSCAN
/// pages (so that Redis repeats fields, as above), each field still counts once, and no
/// total it reports as expected is above one the member had.
#[tokio::test]
async fn verify_counts_a_field_repeated_by_hscan_once() {
    let (_redis, proxy, direct, verify_store) = proxied_rig().await;
    let b = resummarize("shrinkv", HOUR, 3);
    let n = b.slice_of(T0);
    let mut model = Instance::default();
    let shrink = big_slice(&direct, &b, &mut model, n).await;

    let hold = proxy.hold_at(b"HSCAN", shrink.read_before_hold + 1);
    let interleave = async {
        hold.reached().await;
        shrink
            .expire_under_the_scan(&direct, &b, (n + 3) * HOUR)
            .await;
        hold.release();
    };
    let widest = b.widest();
    let (verified, ()) = tokio::join!(
        roll::verify(&verify_store, &widest, None, CHUNK),
        interleave
    );
    let verified = verified.unwrap();

    let amounts: BTreeMap<String, i64> = (0..MEMBERS).map(|i| (member(i), amount(i))).collect();
    let inflated: Vec<&roll::Drift> = verified
        .differences
        .iter()
        .filter(|d| d.expected > amounts.get(&d.member).copied())
        .collect();
    assert_none_inflated(&inflated, "expected");
    // The fields the scan read before the expiry were all counted.
    assert!(verified.differences.len() >= shrink.visited.len() - 100);
}
