//! Assertions shared by many tests: every instance equals the model, a drained daemon's
//! state, and `verify` finding nothing.

use std::time::Duration;

use rollboard::domain::board::{Board, Mode, View};
use rollboard::roll;
use rollboard::store::Store;

use crate::support::boards::{now_ms, test_boards};
use crate::support::daemon::Daemon;
use crate::support::events::{models, Fields};
use crate::support::keys::{instance, under};
use crate::support::redis::RedisServer;
use crate::support::wait::{drained, wait_for};

/// Waits until the group has taken everything, then checks every instance against the
/// model of `events` (with the daemon's log when a resummarize instance lags).
pub async fn assert_drained_into_model(store: &Store, events: &[Fields], daemon: &Daemon) {
    assert_drained_into_model_at(store, events, daemon, now_ms()).await;
}

/// As [`assert_drained_into_model`], with the model and the instances read at `now`.
pub async fn assert_drained_into_model_at(
    store: &Store,
    events: &[Fields],
    daemon: &Daemon,
    now: i64,
) {
    assert!(
        drained(store).await,
        "stream never drained; log:\n{}",
        daemon.logs()
    );
    let boards = test_boards();
    let model = models(events, &boards, now);
    assert_state_or(store, &boards, &model, now, || daemon.logs()).await;
}

/// `verify` finds nothing wrong with the instance.
pub async fn assert_verified(store: &Store, view: &View<'_>, scope: Option<&str>) {
    let v = roll::verify(store, view, scope, 100).await.expect("verify");
    assert!(
        v.differences.is_empty(),
        "verify {}{scope:?}: {:?}",
        view.board().name,
        v.differences
    );
}

/// Checks every instance against its model; resummarize instances once the job (every
/// second in the test config) has run since their last event.
pub async fn assert_state(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::support::model::Instance>,
    now: i64,
) {
    assert_state_or(store, boards, models, now, String::new).await;
}

/// [`assert_state`], with `context` (a daemon's log, say) in the message when a
/// resummarize instance never catches up.
pub async fn assert_state_or(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::support::model::Instance>,
    now: i64,
    context: impl Fn() -> String,
) {
    for ((b, scope), model) in models {
        let board = &boards[*b];
        if board.mode == Mode::Resummarize {
            let expected = model.ranking(board);
            let ranked = || ranked(store, board, scope.as_deref(), now);
            let caught_up = wait_for(Duration::from_secs(10), || async {
                ranked().await == expected
            })
            .await;
            if !caught_up {
                let got = ranked().await;
                let differ: Vec<_> = expected
                    .iter()
                    .filter(|e| !got.contains(e))
                    .take(5)
                    .collect();
                let (meta, _) = store
                    .meta(&board.widest(), scope.as_deref())
                    .await
                    .expect("meta");
                let sums =
                    live_sums(store, board, scope.as_deref(), meta.unwrap_or(i64::MIN)).await;
                let slices_differ: Vec<_> = expected
                    .iter()
                    .filter(|(m, total, _)| sums.get(m) != Some(total))
                    .take(5)
                    .map(|(m, total, _)| (m, total, sums.get(m)))
                    .collect();
                panic!(
                    "resummarize board {}{scope:?} never caught up: {} ranked, {} expected, \
                     expected but not ranked (first 5): {differ:?}; the live slices (above \
                     {meta:?}) differ from the model for (member, model, slices; first 5): \
                     {slices_differ:?}\n{}",
                    board.name,
                    got.len(),
                    expected.len(),
                    context()
                );
            }
        }
        crate::support::model::assert_matches(store, &board.widest(), scope.as_deref(), model, now)
            .await;
    }
}

/// Each member's total over the live slices (those registered above `watermark`).
async fn live_sums(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    watermark: i64,
) -> std::collections::HashMap<String, i64> {
    let k = store.instance(&board.widest(), scope);
    let mut sums = std::collections::HashMap::new();
    for n in store
        .live_slices(&board.widest(), scope, watermark)
        .await
        .expect("live slices")
    {
        use fred::interfaces::HashesInterface;
        let fields: std::collections::HashMap<String, i64> =
            store.client().hgetall(k.slice(n)).await.expect("slice");
        for (member, amount) in fields {
            *sums.entry(member).or_default() += amount;
        }
    }
    sums
}

/// What `verify` finds wrong with one instance (100 members a call).
pub async fn verify_differences(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
) -> Vec<rollboard::roll::Drift> {
    roll::verify(store, &board.widest(), scope, 100)
        .await
        .expect("verify")
        .differences
}

/// Each `name{label=value,...} reading`: the daemon's metric `name` with those labels
/// reads `reading`.
pub async fn assert_metrics(daemon: &Daemon, expected: &[&str]) {
    for line in expected {
        let (series, want) = line.rsplit_once(' ').expect("a series and a reading");
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let labels: Vec<(&str, &str)> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| l.split_once('=').expect("label=value"))
            .collect();
        let want: f64 = want.parse().expect("a reading");
        assert_eq!(daemon.metric(name, &labels).await, want, "{line}");
    }
}

/// The first 1000 of an instance's ranking at `now`: member, total, tie-break time.
pub async fn ranked(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    now: i64,
) -> Vec<(String, i64, Option<i64>)> {
    let page = store
        .top(&board.widest(), scope, 0, 1000, now)
        .await
        .expect("top");
    page.entries
        .iter()
        .map(|e| (e.member.clone(), e.total, e.last_ts))
        .collect()
}

/// The answers of `query` on each of two views, `a` and `b`: a board's window beside its
/// twin's (`query` one of the store's reads, e.g. `|v| store.top(v, None, 0, 10, now)`).
pub async fn side_by_side<'a, T, Fut>(
    (a, b): (&'a View<'a>, &'a View<'a>),
    query: impl Fn(&'a View<'a>) -> Fut,
) -> (T, T)
where
    Fut: std::future::Future<Output = Result<T, rollboard::store::StoreError>>,
{
    let first = query(a).await.expect("the first view's answer");
    let second = query(b).await.expect("the second view's answer");
    (first, second)
}

/// The total of `member` in the instance `scope` of `view` at `now`.
pub async fn total_in(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    member: &str,
    now: i64,
) -> Option<i64> {
    store
        .rank(view, scope, member, now)
        .await
        .expect("rank")
        .total
}

/// Asserts that no scratch key (`tmp:…`) of `board`'s unscoped instance is left on `redis`.
pub fn assert_no_scratch(redis: &RedisServer, board: &str) {
    let left = redis.cli(&["KEYS", &under(&instance(board, None), "tmp:*")]);
    assert_eq!(left.trim(), "", "scratch keys of {board} left behind");
}
