//! Whole-instance comparisons: a board's twin under another name, an instance's contents
//! without its key names, and the board shapes the fast and chained paths are tried on.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Dedup, View, Window};
use rollboard::domain::keys::glob_escape;
use rollboard::store::Store;

use crate::support::boards::{seen_logs, seen_table, variants};
use crate::support::redis::keyed;

/// The slice length and window (in slices) of the boards [`shaped`] builds.
const SLICE: i64 = 1_000;
const N: i64 = 4;

/// The same board under another name: its instance has other keys, the same settings.
pub fn twin(board: &Board) -> Board {
    let mut b = board.clone();
    b.name = format!("{}-exact", board.name);
    b
}

/// What an instance holds, its key names left out: every Hash, ZSet and List by suffix.
pub async fn contents(store: &Store, view: &View<'_>) -> BTreeMap<String, Vec<String>> {
    contents_of(store, view, None).await
}

/// [`contents`] of the instance of `scope` (`None`: the unscoped one).
pub async fn contents_of(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
) -> BTreeMap<String, Vec<String>> {
    let k = store.instance(view, scope);
    let c = store.client();
    let mut out = BTreeMap::new();
    let zset = |v: Vec<(String, f64)>| v.into_iter().map(|(m, s)| format!("{m}={s}")).collect();
    let hash =
        |v: BTreeMap<String, String>| v.into_iter().map(|(f, x)| format!("{f}={x}")).collect();
    let result: Vec<(String, f64)> = c
        .zrange(k.result(), 0, -1, None, false, None, true)
        .await
        .expect("result");
    out.insert("result".to_string(), zset(result));
    let slices: Vec<(String, f64)> = c
        .zrange(k.slices(), 0, -1, None, false, None, true)
        .await
        .expect("slices");
    for (n, _) in &slices {
        let n: i64 = n.parse().expect("slice number");
        let fields: BTreeMap<String, String> = c.hgetall(k.slice(n)).await.expect("slice");
        out.insert(format!("slice:{n}"), hash(fields));
    }
    out.insert("slices".to_string(), zset(slices));
    for (name, key) in [
        ("members", k.members()),
        ("totals", k.totals()),
        ("refs", k.refs()),
    ] {
        let fields: BTreeMap<String, String> = c.hgetall(key).await.expect("hash");
        out.insert(name.to_string(), hash(fields));
    }
    let mut entries: Vec<String> = seen_table(store, view, scope)
        .await
        .into_iter()
        .map(|e| format!("{e:?}"))
        .collect();
    entries.sort();
    out.insert("seen".to_string(), entries);
    for key in seen_logs(store, view, scope).await {
        let n = key.rsplit(':').next().expect("slice").to_string();
        let entries: Vec<Vec<u8>> = c.lrange(&key, 0, -1).await.expect("log");
        let mut entries: Vec<String> = entries.iter().map(|e| format!("{e:02x?}")).collect();
        entries.sort();
        out.insert(format!("seen log {n}"), entries);
    }
    out
}

/// Board shape `shape`: the four of [`variants`], then the same four remembering ids only
/// half a slice past their slice's end (short dedup windows: ids forgotten while the slice
/// is still live).
pub fn shaped(shape: usize) -> Board {
    let mut board = variants(SLICE, N)[shape % 4].clone();
    if shape >= 4 {
        board.dedup = Dedup::AfterSlice(SLICE / 2);
        board.name = format!("{}-short", board.name);
    }
    board
}

/// Two windows for a board of [`shaped`]'s slices: `2s` (2 slices) and `4s` (its whole
/// window of 4).
pub fn narrow_and_whole_windows() -> Vec<Window> {
    [2, 4]
        .iter()
        .map(|&n| Window {
            name: format!("{n}s"),
            ms: n * SLICE,
        })
        .collect()
}

/// Board shape `shape` ([`shaped`]) and its [`twin`], the control it is compared with.
pub fn shaped_and_twin(shape: usize) -> (Board, Board) {
    let board = shaped(shape);
    let control = twin(&board);
    (board, control)
}

/// `board` and `control` hold the same data, their key names aside; `what` says where.
pub async fn assert_same_contents(store: &Store, board: &Board, control: &Board, what: &str) {
    assert_eq!(
        contents(store, &board.widest()).await,
        contents(store, &control.widest()).await,
        "{what}"
    );
}

/// Adds `by` to the stored total of `member` in the ranking of `view`'s instance `scope`,
/// behind the scripts' back: drift for verify and rebuild to find.
pub async fn bump(store: &Store, view: &View<'_>, scope: Option<&str>, member: &str, by: f64) {
    let k = store.instance(view, scope);
    let ts: String = store
        .client()
        .hget(k.members(), member)
        .await
        .expect("HGET members");
    let time = ts.parse().expect("a time");
    let z = rollboard::domain::ranking::encode_member(view.board().tie_break, member, time);
    let _: f64 = store
        .client()
        .zincrby(k.result(), by, z)
        .await
        .expect("ZINCRBY");
}

/// Every key of the instance whose `meta` is `meta`, with its type and what it holds
/// (`HGETALL`, `LRANGE`, `ZRANGE ... WITHSCORES`; the type's name for another type), and
/// the instance's key prefix.
pub async fn stored_under(
    store: &Store,
    meta: &str,
) -> (String, Vec<(String, String, Vec<Value>)>) {
    let base = meta.strip_suffix(":meta").expect("meta").to_string();
    let keys: Vec<String> = keyed(store, "KEYS", vec![format!("{}:*", glob_escape(&base))]).await;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let kind: String = keyed(store, "TYPE", vec![key.clone()]).await;
        let all: Vec<Value> = match kind.as_str() {
            "hash" => keyed(store, "HGETALL", vec![key.clone()]).await,
            "list" => keyed(store, "LRANGE", vec![key.clone(), "0".into(), "-1".into()]).await,
            "zset" => {
                keyed(
                    store,
                    "ZRANGE",
                    vec![key.clone(), "0".into(), "-1".into(), "WITHSCORES".into()],
                )
                .await
            }
            other => vec![Value::from(other)],
        };
        out.push((key, kind, all));
    }
    (base, out)
}

/// What the instance `scope` of `board` holds, key by key, whatever its type and however
/// its events were cut in calls or raced: a digest table's buckets and the forget logs as
/// sets of entries; `meta`'s `chain` (and, with `chunk_free`, its `gen`) left out.
pub async fn held(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    chunk_free: bool,
) -> BTreeMap<String, Vec<String>> {
    let k = store.instance(&board.widest(), scope);
    let (base, stored) = stored_under(store, &k.meta()).await;
    let bytes = |v: &Value| v.as_bytes().unwrap_or_default().to_vec();
    let mut out = BTreeMap::new();
    for (key, kind, all) in stored {
        let mut held: Vec<String> = Vec::new();
        if kind == "hash" {
            for p in all.chunks(2) {
                let (f, v) = (
                    String::from_utf8_lossy(&bytes(&p[0])).into_owned(),
                    bytes(&p[1]),
                );
                if key == k.seen_table() && !f.starts_with('#') {
                    held.extend(v.chunks(20).map(|e| format!("{f}={e:02x?}")));
                } else if !(key == k.meta() && (f == "chain" || (chunk_free && f == "gen"))) {
                    held.push(format!("{f}={:?}", String::from_utf8_lossy(&v)));
                }
            }
        } else {
            let show = |v: &Value| match kind.as_str() {
                "list" => format!("{:02x?}", bytes(v)),
                _ => String::from_utf8_lossy(&bytes(v)).into_owned(),
            };
            held = all.iter().map(show).collect();
        }
        if kind != "zset" {
            held.sort();
        }
        out.insert(format!("{kind} {}", &key[base.len()..]), held);
    }
    out
}
