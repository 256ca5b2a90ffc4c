//! Small instances judged in the worker and written with `MULTI`/`EXEC` under `WATCH`
//! (`redis.transactions`): the same outcomes and the same data as `fold.lua` gives them,
//! on every board shape judged there, over fresh, repeated, late, redelivered and partly
//! duplicate shares; several stores writing the same instances at once (their `EXEC`s
//! aborted and tried again) counting every event once; a user the server refuses `WATCH`
//! and a store with transactions off, every instance then judged by the scripts.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, TieBreak};
use rollboard::store::{ApplyEvent, Outcome, Reconnect, Store, StoreError};

use crate::support::boards::{ev, scoped, with_fresh_store};
use crate::support::instances::{held, shaped, stored_under, twin};
use crate::support::proxy::Proxy;
use crate::support::redis::{command_calls, RedisServer};

const NOW: i64 = 1_000_000;

type Shares = Vec<(String, Vec<ApplyEvent>)>;
type Results = Vec<Result<Vec<Outcome>, StoreError>>;

async fn applied(store: &Store, board: &Board, shares: &Shares, now: i64) -> Results {
    let borrowed: Vec<(Option<&str>, &[ApplyEvent])> = shares
        .iter()
        .map(|(s, e)| (Some(s.as_str()), e.as_slice()))
        .collect();
    store.apply_shares(board, &borrowed, now).await
}

/// The outcomes, or the first word of the error.
fn outcomes(results: &Results) -> Vec<Result<Vec<Outcome>, String>> {
    results
        .iter()
        .map(|r| match r {
            Ok(o) => Ok(o.clone()),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// What the instance of `scope` holds, key by key (by the name after the instance's own
/// part); with `order_free`, what does not depend on the order its events were applied in:
/// its digest table and forget logs left out.
async fn contents(
    store: &Store,
    board: &Board,
    scope: impl Into<Option<&str>>,
    order_free: bool,
) -> BTreeMap<String, Vec<String>> {
    let k = store.instance(&board.widest(), scope.into());
    let (base, stored) = stored_under(store, &k.meta()).await;
    let mut out = BTreeMap::new();
    for (key, kind, all) in stored {
        let name = key[base.len()..].to_string();
        if order_free && (name.contains(":seen") || name == ":meta") {
            continue;
        }
        let mut held: Vec<String> = match kind.as_str() {
            "hash" => all
                .chunks(2)
                .map(|p| format!("{:?}={:?}", p[0], p[1]))
                .collect(),
            "list" => all.iter().map(|v| format!("{v:?}")).collect(),
            "zset" => all
                .iter()
                .map(|v| v.as_string().unwrap_or_default())
                .collect(),
            _ => vec![kind.clone()],
        };
        if kind == "hash" {
            // A chain of `fold.lua` calls leaves a token of its own in `meta`.
            held.retain(|f| !f.starts_with("String(\"chain\")="));
            held.sort();
        }
        out.insert(name, held);
    }
    out
}

/// Scopes `s0`... with events of `ann` and `bob` (ids `round`-unique) at `ts`.
fn shares(scopes: usize, round: &str, ts: i64) -> Shares {
    (0..scopes)
        .map(|i| {
            let scope = format!("s{i}");
            let events = vec![
                ev(&format!("{scope}-{round}-a"), ts, "ann", 3 + i as i64),
                ev(&format!("{scope}-{round}-b"), ts - 7, "bob", 2),
                ev(&format!("{scope}-{round}-c"), ts - 3, "ann", 1),
            ];
            (scope, events)
        })
        .collect()
}

/// The boards judged in the worker: incremental and resummarize, each tie-break, a
/// dedup window shorter than the window.
fn judged_boards() -> Vec<Board> {
    let mut boards = Vec::new();
    for shape in [0, 2, 4, 6] {
        for tie in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None] {
            let mut board = scoped(shaped(shape));
            board.tie_break = tie;
            board.name = format!("{}-{tie:?}", board.name);
            boards.push(board);
        }
    }
    boards
}

/// Every judged shape over rounds of fresh, repeated, older, late, redelivered and partly
/// duplicate shares: the store judging in the worker gives the outcomes and the data a
/// store with transactions off (every instance to `fold.lua`) gives a twin board; and it
/// did judge in the worker (`EXEC`s ran).
#[tokio::test]
async fn judged_instances_agree_with_fold_on_every_judged_shape() {
    let (redis, store, ()) = with_fresh_store(()).await;
    let scripts = redis.store("rb").await.with_transactions(false);
    for board in judged_boards() {
        let control = twin(&board);
        let slice = board.slice_ms;
        let mut partly = shares(4, "r1", NOW);
        for (_, events) in &mut partly {
            events.push(ev(&format!("{}-new", events[0].id), NOW, "cy", 5));
        }
        let rounds: Vec<(&str, Shares, i64)> = vec![
            ("fresh", shares(4, "r1", NOW), NOW),
            ("again, later", shares(4, "r2", NOW + slice), NOW + slice),
            ("older times", shares(4, "r3", NOW - slice / 2), NOW + slice),
            ("redelivered", shares(4, "r2", NOW + slice), NOW + slice),
            ("partly duplicate", partly, NOW + slice),
            ("late", shares(4, "r4", NOW - 100 * slice), NOW + slice),
        ];
        for (what, round, now) in rounds {
            let judged = applied(&store, &board, &round, now).await;
            let by_scripts = applied(&scripts, &control, &round, now).await;
            assert_eq!(
                outcomes(&judged),
                outcomes(&by_scripts),
                "{}: {what}",
                board.name
            );
            for (scope, _) in &round {
                assert_eq!(
                    contents(&store, &board, scope.as_str(), false).await,
                    contents(&store, &control, scope.as_str(), false).await,
                    "{}: {what}: {scope}",
                    board.name
                );
            }
        }
    }
    assert!(
        command_calls(&redis, "exec") > 0,
        "nothing was judged in the worker"
    );
}

/// `n` events of round `round` over 60 members and the three slices up to `ts`, ids
/// unique to the round.
fn spread(round: &str, n: usize, ts: i64, slice: i64) -> Vec<ApplyEvent> {
    (0..n)
        .map(|i| {
            let member = format!("m{}", (i * 7 + i / 3) % 60);
            let at = ts - (i % 3) as i64 * slice - (i as i64 % 11);
            ev(&format!("{round}-{i}"), at, &member, 1 + (i % 5) as i64)
        })
        .collect()
}

/// The unscoped instances of `board` and `control` hold the same data, whatever calls
/// their events were cut in ([`held`]: a judged chunk holds several `fold.lua` calls'
/// events, so `meta`'s `gen`, bumped once a call or chunk, is left out, and a bucket's or a
/// forget log's entries are compared as sets).
async fn same_data(store: &Store, board: &Board, control: &Board, what: &str) {
    let (judged, by_scripts) = (
        held(store, board, None, true).await,
        held(store, control, None, true).await,
    );
    for (key, held) in &judged {
        assert_eq!(Some(held), by_scripts.get(key), "{what}: {key}");
    }
    assert_eq!(judged.len(), by_scripts.len(), "{what}");
}

/// A connection cut right after a judged chunk's `EXEC` reached Redis (its reply lost):
/// the apply fails, and applying the same events again (the consumer's retry) finds the
/// chunk's events remembered, `Duplicate`, and applies the rest: the instance holds what
/// applying every event once by the scripts leaves on a twin board. On a pack of small
/// instances the same.
#[tokio::test]
async fn a_connection_cut_after_exec_loses_and_doubles_nothing() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let store = Store::connect(&proxy.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect through the proxy")
        .with_script_calls(crate::support::env::script_calls());
    let scripts = redis.store("rb").await.with_transactions(false);
    let board = Board {
        scope: None,
        ..shaped(0)
    };
    let control = twin(&board);
    let slice = board.slice_ms;
    let first = spread("r0", 250, NOW, slice);
    store
        .apply(&board, None, &first, NOW)
        .await
        .expect("applied");
    scripts
        .apply(&control, None, &first, NOW)
        .await
        .expect("applied");
    let second = spread("r1", 250, NOW + 1, slice);
    proxy.cut_after(b"$4\r\nEXEC\r\n", 1);
    let cut = store.apply(&board, None, &second, NOW + 1).await;
    assert!(cut.is_err(), "the cut apply answered {cut:?}");
    assert_eq!(proxy.cuts(), 1);
    let again = store
        .apply(&board, None, &second, NOW + 1)
        .await
        .expect("applied again");
    let remembered = again.iter().filter(|&&o| o == Outcome::Duplicate).count();
    assert!(
        remembered > 0 && remembered < second.len(),
        "{remembered} of {} events were applied before the cut",
        second.len()
    );
    assert!(again
        .iter()
        .all(|&o| o == Outcome::Duplicate || o == Outcome::Applied));
    let by_scripts = scripts
        .apply(&control, None, &second, NOW + 1)
        .await
        .expect("applied");
    assert!(by_scripts.iter().all(|&o| o == Outcome::Applied));
    same_data(&store, &board, &control, "after the cut").await;

    // A pack of small instances.
    let scoped_board = scoped(shaped(2));
    let scoped_control = twin(&scoped_board);
    // The instances' first writes are the scripts' (no digest table yet).
    let before = shares(5, "p0", NOW);
    applied(&store, &scoped_board, &before, NOW).await;
    applied(&scripts, &scoped_control, &before, NOW).await;
    let batch = shares(5, "p1", NOW);
    applied(&scripts, &scoped_control, &batch, NOW).await;
    proxy.cut_after(b"$4\r\nEXEC\r\n", 1);
    let cut = applied(&store, &scoped_board, &batch, NOW).await;
    assert!(cut.iter().any(Result::is_err), "{cut:?}");
    let again = applied(&store, &scoped_board, &batch, NOW).await;
    assert!(
        again.iter().any(|r| r
            .as_ref()
            .is_ok_and(|r| r.iter().all(|&o| o == Outcome::Duplicate))),
        "the cut EXEC applied nothing: {again:?}"
    );
    for (r, (scope, _)) in again.iter().zip(&batch) {
        let r = r.as_ref().expect("applied again");
        assert!(
            r.iter().all(|&o| o == Outcome::Duplicate) || r.iter().all(|&o| o == Outcome::Applied),
            "{scope}: {r:?}"
        );
        assert_eq!(
            contents(&store, &scoped_board, scope.as_str(), true).await,
            contents(&store, &scoped_control, scope.as_str(), true).await,
            "{scope}"
        );
    }
}

/// A large instance (an unscoped board's), judged a chunk at a time as its digest table
/// grows past one bucket and splits, level after level: every judged shape gives the
/// outcomes and the data (its digest table's buckets byte for byte) that `fold.lua` gives
/// a twin board, over fresh, later, redelivered, partly duplicate and late rounds, with
/// ids forgotten on the way on the boards of short dedup windows.
#[tokio::test]
async fn large_instances_agree_with_fold_as_their_digest_tables_split() {
    let (redis, store, ()) = with_fresh_store(()).await;
    let metrics = std::sync::Arc::new(rollboard::metrics::Metrics::new(&[]));
    let store = store.with_metrics(metrics.clone());
    let scripts = redis.store("rb").await.with_transactions(false);
    let mut deepest = 0;
    for board in judged_boards() {
        let board = rollboard::domain::board::Board {
            scope: None,
            ..board
        };
        let control = twin(&board);
        let slice = board.slice_ms;
        let mut rounds: Vec<(String, Vec<ApplyEvent>, i64)> = Vec::new();
        for r in 0..8 {
            let now = NOW + r * slice / 2;
            rounds.push((
                format!("fresh {r}"),
                spread(&format!("r{r}"), 250, now, slice),
                now,
            ));
        }
        let now = NOW + 4 * slice;
        let mut partly = spread("r7", 40, NOW + 7 * slice / 2, slice);
        partly.extend(spread("p", 40, now, slice));
        rounds.push((
            "redelivered".into(),
            spread("r6", 250, NOW + 3 * slice, slice),
            now,
        ));
        rounds.push(("partly duplicate".into(), partly, now));
        rounds.push((
            "late".into(),
            spread("l", 30, NOW - 100 * slice, slice),
            now,
        ));
        rounds.push(("after".into(), spread("a", 250, now, slice), now));
        for (what, events, now) in rounds {
            let judged = store.apply(&board, None, &events, now).await;
            let by_scripts = scripts.apply(&control, None, &events, now).await;
            assert_eq!(
                judged.as_ref().map_err(ToString::to_string),
                by_scripts.as_ref().map_err(ToString::to_string),
                "{}: {what}",
                board.name
            );
            same_data(&store, &board, &control, &format!("{}: {what}", board.name)).await;
        }
        let k = store.instance(&board.widest(), None);
        let level: Option<i64> = store.client().hget(k.seen_table(), "#L").await.expect("#L");
        deepest = deepest.max(level.unwrap_or(0));
    }
    assert!(deepest >= 4, "the digest tables stayed at level {deepest}");
    // Per board, what goes to the scripts: the first chunk of the redelivered round (the
    // scripts then take the rest of its events too), and two of
    // the partly duplicate round (the scripts judge the duplicates of their first call one
    // by one, the worker tries the rest and meets duplicates again). Every chunk of the
    // other rounds is judged here.
    let rendered = metrics.render();
    let judged = |by: &str| -> u64 {
        let line = format!("rollboard_judged_instances_total{{by=\"{by}\"}} ");
        rendered
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .expect("the judged counter")
            .parse()
            .expect("a count")
    };
    let boards = judged_boards().len() as u64;
    assert_eq!(judged("script"), 3 * boards, "{rendered}");
    assert!(judged("worker") >= 9 * boards, "{rendered}");
    assert!(
        command_calls(&redis, "exec") > 0,
        "nothing was judged in the worker"
    );
}

/// Three stores apply events to the same instances at once, rounds over: two judging in
/// the worker (each `EXEC` aborted whenever another wrote a key it watched, then read and
/// judged again) and one with transactions off. Every event counts once: each instance
/// holds what one store applying every event alone leaves on a twin board.
#[tokio::test]
async fn stores_writing_the_same_instances_at_once_count_every_event_once() {
    let (redis, control_store, ()) = with_fresh_store(()).await;
    let connect = || async {
        Store::connect(&redis.url(), "rb", 2, Reconnect::Never)
            .await
            .expect("connect")
            .with_script_calls(crate::support::env::script_calls())
    };
    let stores = [
        connect().await,
        connect().await,
        connect().await.with_transactions(false),
    ];
    for shape in [0, 2] {
        let board = scoped(shaped(shape));
        let control = twin(&board);
        for round in 0..12 {
            let batches: Vec<Shares> = (0..stores.len())
                .map(|s| shares(6, &format!("{round}-{s}"), NOW + round * 10 + s as i64))
                .collect();
            let results = futures_util::future::join_all(
                stores
                    .iter()
                    .zip(&batches)
                    .map(|(store, batch)| applied(store, &board, batch, NOW + 200)),
            )
            .await;
            for (s, result) in results.iter().enumerate() {
                for r in result {
                    assert_eq!(
                        r.as_ref().expect("applied"),
                        &vec![Outcome::Applied; 3],
                        "store {s}, round {round}"
                    );
                }
            }
            for batch in &batches {
                applied(&control_store, &control, batch, NOW + 200).await;
            }
        }
        for i in 0..6 {
            let scope = format!("s{i}");
            assert_eq!(
                contents(&control_store, &board, scope.as_str(), true).await,
                contents(&control_store, &control, scope.as_str(), true).await,
                "{}: {scope}",
                board.name
            );
        }
    }
}

/// `INFO commandstats`' `rejected_calls` of `command`.
fn rejected(redis: &RedisServer, command: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("rejected_calls="))
                .map(|n| n.trim().parse().expect("rejected_calls"))
        })
        .unwrap_or(0)
}

/// A user the server refuses `WATCH`: the first pack's `WATCH`es are refused (`NOPERM`;
/// one per transaction it was cut in), and from then on every instance goes to
/// `fold.lua`, with the outcomes and data it gives; `WATCH` is not sent again. A store
/// with transactions off never sends it.
#[tokio::test]
async fn without_watch_every_instance_is_judged_by_the_scripts() {
    let redis = RedisServer::start();
    redis.cli(&[
        "ACL", "SETUSER", "nowatch", "on", ">pw", "~*", "&*", "+@all", "-watch",
    ]);
    let url = format!("redis://nowatch:pw@127.0.0.1:{}", redis.port);
    let store = Store::connect(&url, "rb", 2, Reconnect::Never)
        .await
        .expect("connect");
    let control_store = redis.store("rb").await.with_transactions(false);
    let board = scoped(shaped(0));
    let control = twin(&board);
    let mut refusals = Vec::new();
    for (round, now) in [("r1", NOW), ("r2", NOW + 10)] {
        let batch = shares(5, round, now);
        let judged = applied(&store, &board, &batch, now).await;
        let by_scripts = applied(&control_store, &control, &batch, now).await;
        assert_eq!(outcomes(&judged), outcomes(&by_scripts), "{round}");
        for r in &judged {
            assert_eq!(r.as_ref().expect(round), &vec![Outcome::Applied; 3]);
        }
        for (scope, _) in &batch {
            assert_eq!(
                contents(&store, &board, scope.as_str(), false).await,
                contents(&store, &control, scope.as_str(), false).await,
                "{round}: {scope}"
            );
        }
        refusals.push(rejected(&redis, "watch"));
    }
    // Five instances of five watched keys each: two transactions at once, the second
    // sent before or after the first was refused.
    assert!(
        (1..=2).contains(&refusals[0]) && refusals[1] == refusals[0],
        "WATCH refused for the first pack only: {refusals:?}"
    );
    assert_eq!(command_calls(&redis, "watch"), 0);
    assert_eq!(command_calls(&redis, "exec"), 0);
}
