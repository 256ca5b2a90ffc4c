//! Attacks on packed fold calls (several instances of a scoped board in one `fold.lua`
//! call, as `Store::apply_shares` sends them): keys of the wrong type and corrupt or
//! foreign settings in the first, middle or last instance of a pack, packs mixing `slow`,
//! duplicate, late and fresh instances, legacy `seen` ZSets, redelivered batches, odd
//! scope names, several windows with dense ranks and change feeds, refunds to zero,
//! period boards, a library gone from the server, and packed calls malformed by hand.
//! Each compares the packed instances with the same shares applied each by a call of its
//! own (`Store::apply`) on a twin board: the same outcomes or error codes, and the same
//! data, key by key.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Changes, MAX_TOTAL};
use rollboard::domain::keys::glob_escape;
use rollboard::store::{fold_call, ApplyEvent, Outcome, Store, StoreError};

use crate::support::boards::{ev, keys_matching, scoped, set_string, with_fresh_store};
use crate::support::instances::{narrow_and_whole_windows, shaped, twin};
use crate::support::redis::{command_calls_at, fcall, fcall_calls, keyed};

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

/// One share of a batch: its scope and its events.
type Shares = Vec<(String, Vec<ApplyEvent>)>;
/// One result per share.
type Results = Vec<Result<Vec<Outcome>, StoreError>>;

/// `shares` applied to `board` at once, as the consumer does (packed where they can be).
async fn packed(store: &Store, board: &Board, shares: &Shares, now: i64) -> Results {
    let borrowed: Vec<(Option<&str>, &[ApplyEvent])> = shares
        .iter()
        .map(|(s, e)| (Some(s.as_str()), e.as_slice()))
        .collect();
    store.apply_shares(board, &borrowed, now).await
}

/// `shares` applied to `board` one by one, each by a call of its own.
async fn alone(store: &Store, board: &Board, shares: &Shares, now: i64) -> Results {
    let mut out = Vec::new();
    for (scope, events) in shares {
        out.push(store.apply(board, Some(scope), events, now).await);
    }
    out
}

/// The code of an error (its reply's first word), or `reply` for an answer of a shape the
/// scripts never give.
fn code(e: &StoreError) -> String {
    match e {
        StoreError::Redis(e) => e
            .details()
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string(),
        StoreError::Reply(_) => "reply".to_string(),
    }
}

/// Both give the same outcomes, or fail with the same code and the same kind.
fn assert_same_results(packed: &Results, alone: &Results, what: &str) {
    assert_eq!(packed.len(), alone.len(), "{what}");
    for (i, (p, a)) in packed.iter().zip(alone).enumerate() {
        match (p, a) {
            (Ok(p), Ok(a)) => assert_eq!(p, a, "{what}: share {i}"),
            (Err(p), Err(a)) => {
                assert_eq!(code(p), code(a), "{what}: share {i}: packed {p}, alone {a}");
                assert_eq!(
                    p.kind(),
                    a.kind(),
                    "{what}: share {i}: packed {p}, alone {a}"
                );
            }
            _ => panic!("{what}: share {i}: packed {p:?}, alone {a:?}"),
        }
    }
}

/// A value as text, recursively, bytes shown exactly.
fn flat(v: &Value) -> String {
    match v {
        Value::Array(parts) => {
            format!("[{}]", parts.iter().map(flat).collect::<Vec<_>>().join(","))
        }
        Value::Bytes(b) => format!("{:02x?}", b.as_ref()),
        Value::String(s) => format!("{:02x?}", s.as_bytes()),
        other => format!("{other:?}"),
    }
}

/// What `key` holds, whatever its type: a Hash's fields sorted, a ZSet's members with
/// their scores, a List's entries, a Stream's entries without their ids (which are times).
async fn held(store: &Store, key: &str) -> String {
    let kind: String = keyed(store, "TYPE", vec![key]).await;
    let text = match kind.as_str() {
        "string" => flat(&keyed(store, "GET", vec![key]).await),
        "hash" => {
            let pairs: Vec<Value> = keyed(store, "HGETALL", vec![key]).await;
            let fields: BTreeMap<String, String> = pairs
                .chunks(2)
                .map(|p| (flat(&p[0]), flat(&p[1])))
                .collect();
            format!("{fields:?}")
        }
        "zset" => flat(&keyed(store, "ZRANGE", vec![key, "0", "-1", "WITHSCORES"]).await),
        "list" => flat(&keyed(store, "LRANGE", vec![key, "0", "-1"]).await),
        "stream" => {
            let entries: Vec<Value> = keyed(store, "XRANGE", vec![key, "-", "+"]).await;
            let bodies: Vec<String> = entries
                .iter()
                .map(|e| match e {
                    Value::Array(parts) if parts.len() == 2 => flat(&parts[1]),
                    other => flat(other),
                })
                .collect();
            bodies.join(";")
        }
        other => other.to_string(),
    };
    format!("{kind} {text}")
}

/// Every key of `board`'s instance `scope` (every window, its change streams), by its name
/// after the instance's own part, with what it holds.
async fn raw_contents(store: &Store, board: &Board, scope: &str) -> BTreeMap<String, String> {
    let k = store.instance(&board.widest(), Some(scope));
    let meta = k.meta();
    let base = meta.strip_suffix(":meta").expect("meta").to_string();
    let changes = k.changes();
    let mut out = BTreeMap::new();
    for key in keys_matching(store, &format!("{}:*", glob_escape(&base))).await {
        let value = held(store, &key).await;
        out.insert(key[base.len()..].to_string(), value);
    }
    for key in keys_matching(store, &format!("{}*", glob_escape(&changes))).await {
        let value = held(store, &key).await;
        out.insert(format!("changes{}", &key[changes.len()..]), value);
    }
    out
}

/// Every instance of `shares` holds the same on `board` as on `control`.
async fn assert_same_data(
    store: &Store,
    board: &Board,
    control: &Board,
    shares: &Shares,
    what: &str,
) {
    for (scope, _) in shares {
        let a = raw_contents(store, board, scope).await;
        let b = raw_contents(store, control, scope).await;
        assert_eq!(a, b, "{what}: scope {scope:?}");
    }
}

/// `shares` applied packed to `board` and alone to its twin `control` at `now`: the same
/// results and data; the packed results.
async fn agree(
    store: &Store,
    board: &Board,
    control: &Board,
    shares: &Shares,
    now: i64,
    what: &str,
) -> Results {
    let p = packed(store, board, shares, now).await;
    let a = alone(store, control, shares, now).await;
    assert_same_results(&p, &a, what);
    assert_same_data(store, board, control, shares, what).await;
    p
}

/// Scopes `prefix0`... each with events of two members at `NOW` (ids unique to the scope
/// and `round`).
fn fresh_shares(prefix: &str, scopes: usize, round: &str) -> Shares {
    (0..scopes)
        .map(|i| {
            let scope = format!("{prefix}{i}");
            let events = vec![
                ev(&format!("{scope}-{round}-a"), NOW, "ann", 3 + i as i64),
                ev(&format!("{scope}-{round}-b"), NOW - 10, "bob", 2),
            ];
            (scope, events)
        })
        .collect()
}

/// The kinds of key a fold call reads or writes, each as the key of instance `scope`
/// of `board` holding a slice of `NOW`.
fn key_of(store: &Store, board: &Board, scope: &str, kind: &str) -> String {
    let k = store.instance(&board.widest(), Some(scope));
    let n = board.slice_of(NOW);
    match kind {
        "meta" => k.meta(),
        "seen:ids" => k.seen_table(),
        "slice" => k.slice(n),
        "forget log" => k.seen_log(n),
        "totals" => k.totals(),
        "refs" => k.refs(),
        "slices" => k.slices(),
        "members" => k.members(),
        "result" => k.result(),
        "legacy seen" => k.seen(),
        other => panic!("no key kind {other}"),
    }
}

const KINDS: [&str; 10] = [
    "meta",
    "seen:ids",
    "slice",
    "forget log",
    "totals",
    "refs",
    "slices",
    "members",
    "result",
    "legacy seen",
];

/// A key of the wrong type in the first, a middle or the last instance of a pack, on an
/// instance that holds data already (a second batch) and on a fresh one: that instance
/// fails as by a call of its own (`WRONGTYPE`, a data error), with the same data left, and
/// every other instance of the pack is applied as by its own call.
#[tokio::test]
async fn a_key_of_the_wrong_type_anywhere_in_a_pack_fails_its_instance_alone() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    // Refunds (refs) and resummarize (totals).
    for shape in [1, 2] {
        let board = scoped(shaped(shape));
        let control = twin(&board);
        for kind in KINDS {
            for at in [0, 2, 4] {
                for populated in [false, true] {
                    let prefix = format!("{}-{}-{at}-{populated}-", shape, kind.replace(' ', "_"));
                    let what = format!("{} {kind} at {at}, populated {populated}", board.name);
                    if populated {
                        let first = fresh_shares(&prefix, 5, "first");
                        agree(&store, &board, &control, &first, NOW, &what).await;
                    }
                    let bad = format!("{prefix}{at}");
                    for b in [&board, &control] {
                        set_string(&store, &key_of(&store, b, &bad, kind), "not yours").await;
                    }
                    let shares = fresh_shares(&prefix, 5, "second");
                    let results = agree(&store, &board, &control, &shares, NOW, &what).await;
                    // The keys every fold call reads fail it; a key a board never reads
                    // (totals of an incremental board, refs of one without refunds,
                    // the result of a resummarize one, the legacy `seen` key once the
                    // digest table says there is none) may break nothing, as by the
                    // call of its own.
                    let read_by_all = ["meta", "seen:ids", "slice", "forget log", "slices"];
                    let must_fail =
                        read_by_all.contains(&kind) || (kind == "legacy seen" && !populated);
                    for (i, r) in results.iter().enumerate() {
                        if i == at && (must_fail || r.is_err()) {
                            let e = r.as_ref().expect_err(&what);
                            assert_eq!(code(e), "WRONGTYPE", "{what}: {e}");
                            assert!(!e.is_outage(), "{what}: {e}");
                        } else {
                            assert_eq!(
                                r.as_ref().expect(&what),
                                &vec![Outcome::Applied; 2],
                                "{what}: share {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// An instance whose `meta` pins the settings of another board definition, or holds a
/// counter that is not one, in a pack: it fails with `ROLLBOARD` (a data error) as by its
/// own call, writing nothing, and the others are applied.
#[tokio::test]
async fn an_instance_of_other_settings_or_a_corrupt_meta_in_a_pack_fails_alone() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let control = twin(&board);
    let cases: [(&str, &str, &[u8]); 4] = [
        ("other", "settings", b"r|l|1"),
        ("gen", "gen", b"seven"),
        ("roll", "last_roll", b"1.5"),
        ("expired", "expired_through", b"x"),
    ];
    for (name, field, value) in cases {
        for at in [0, 1, 2] {
            let prefix = format!("{name}-{at}-");
            let what = format!("meta {field} = {value:?} at {at}");
            let bad = format!("{prefix}{at}");
            for b in [&board, &control] {
                let meta = store.instance(&b.widest(), Some(&bad)).meta();
                let _: () = keyed(
                    &store,
                    "HSET",
                    vec![
                        Value::from(meta),
                        Value::from(field),
                        Value::Bytes(value.to_vec().into()),
                    ],
                )
                .await;
            }
            let shares = fresh_shares(&prefix, 3, "one");
            let results = agree(&store, &board, &control, &shares, NOW, &what).await;
            for (i, r) in results.iter().enumerate() {
                if i == at {
                    let e = r.as_ref().expect_err(&what);
                    assert_eq!(code(e), "ROLLBOARD", "{what}: {e}");
                    assert!(!e.is_outage(), "{what}: {e}");
                } else {
                    assert_eq!(
                        r.as_ref().expect(&what),
                        &vec![Outcome::Applied; 2],
                        "{what}"
                    );
                }
            }
        }
    }
}

/// A member's stored state that does not parse (its `members` entry, a byte string that
/// is not UTF-8 among them) in the middle of a pack: a `ROLLBOARD corrupt` data error for
/// that instance, as by its own call.
#[tokio::test]
async fn a_corrupt_member_in_a_pack_is_a_data_error_of_its_instance() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let control = twin(&board);
    let first = fresh_shares("m", 3, "first");
    agree(&store, &board, &control, &first, NOW, "first").await;
    for (round, value) in [("text", b"garbage".as_slice()), ("empty", b"")] {
        for b in [&board, &control] {
            let members = store.instance(&b.widest(), Some("m1")).members();
            let _: () = keyed(
                &store,
                "HSET",
                vec![
                    Value::from(members),
                    Value::from("ann"),
                    Value::Bytes(value.to_vec().into()),
                ],
            )
            .await;
        }
        let shares = fresh_shares("m", 3, round);
        let results = agree(&store, &board, &control, &shares, NOW, round).await;
        let e = results[1].as_ref().expect_err(round);
        assert_eq!(code(e), "ROLLBOARD", "{round}: {e}");
        assert!(!e.is_outage(), "{round}: {e}");
        for i in [0, 2] {
            assert_eq!(
                results[i].as_ref().expect(round),
                &vec![Outcome::Applied; 2]
            );
        }
    }
}

/// The shares of one batch mixing in one pack every way an instance can end: fresh,
/// `slow` with a total near 2^53 - 1 (overflow), every event a duplicate, some duplicates,
/// every event late, late and fresh, a legacy `seen` ZSet holding one of the ids, a refund
/// to exactly 0, the same id in two instances.
fn mixed_shares(board: &Board, round: usize) -> (Shares, Shares) {
    let r = |s: &str| format!("{s}-{round}");
    let neg = board.allow_negative;
    let before: Shares = vec![
        (r("big"), vec![ev(&r("big0"), NOW, "ann", MAX_TOTAL - 3)]),
        (
            r("dup"),
            vec![ev(&r("dup0"), NOW, "ann", 4), ev(&r("dup1"), NOW, "bob", 5)],
        ),
        (r("some"), vec![ev(&r("some0"), NOW, "ann", 4)]),
        (r("zero"), vec![ev(&r("zero0"), NOW, "ann", 5)]),
    ];
    let late = NOW - 10 * SLICE;
    let mut batch: Shares = vec![
        (
            r("fresh"),
            vec![
                ev(&r("f0"), NOW, "ann", 2),
                ev(&r("f1"), NOW - SLICE, "cat", 1),
            ],
        ),
        (
            r("big"),
            vec![ev(&r("big1"), NOW, "ann", 5), ev(&r("big2"), NOW, "bob", 1)],
        ),
        before[1].clone(),
        (
            r("some"),
            vec![
                ev(&r("some0"), NOW, "ann", 4),
                ev(&r("some1"), NOW, "ann", 6),
            ],
        ),
        (r("late"), vec![ev(&r("l0"), late, "ann", 7)]),
        (
            r("mixed"),
            vec![ev(&r("m0"), late, "ann", 7), ev(&r("m1"), NOW, "bob", 3)],
        ),
        (
            r("legacy"),
            vec![ev(&r("old"), NOW, "ann", 7), ev(&r("new"), NOW, "ann", 8)],
        ),
        (r("shared-a"), vec![ev("same-id", NOW, "ann", 1)]),
        (r("shared-b"), vec![ev("same-id", NOW, "ann", 1)]),
    ];
    if neg {
        batch.push((r("zero"), vec![ev(&r("zero1"), NOW, "ann", -5)]));
    }
    (before, batch)
}

/// Board shapes with each combination that adds keys to a call: several windows, dense
/// ranks, a change feed.
fn rich_boards() -> Vec<Board> {
    let mut out = Vec::new();
    for shape in 0..8 {
        for extra in 0..4 {
            let mut b = scoped(shaped(shape));
            if extra & 1 == 1 {
                b.windows = narrow_and_whole_windows();
                b.dense_rank = true;
            }
            if extra & 2 == 2 {
                b.changes = Some(Changes {
                    top: 3,
                    max_len: 50,
                });
            }
            b.name = format!("{}-x{extra}", b.name);
            out.push(b);
        }
    }
    out
}

/// Every way an instance can end, in one pack, on every board shape (several windows,
/// dense ranks and change feeds among them): the same outcomes and data as calls of their
/// own, over two batches; and the outcomes expected.
#[tokio::test]
async fn a_pack_mixing_slow_duplicate_late_legacy_and_fresh_instances_agrees() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let boards = rich_boards();
    assert!(boards.len() >= 16, "{} boards", boards.len());
    for board in &boards {
        let control = twin(board);
        for round in 0..2 {
            let (before, batch) = mixed_shares(board, round);
            let what = format!("{} round {round}", board.name);
            let first = agree(&store, board, &control, &before, NOW, &what).await;
            for r in &first {
                assert!(
                    r.as_ref()
                        .expect(&what)
                        .iter()
                        .all(|o| *o == Outcome::Applied),
                    "{what}"
                );
            }
            // The legacy instance holds the raw id `old` in its legacy ZSet.
            for b in [board, &control] {
                let k = store.instance(&b.widest(), Some(&format!("legacy-{round}")));
                let forget = b.forget_at(b.slice_of(NOW));
                let zadd = vec![
                    Value::from(k.seen()),
                    forget.into(),
                    format!("old-{round}").into(),
                ];
                let _: i64 = keyed(&store, "ZADD", zadd).await;
            }
            let results = agree(&store, board, &control, &batch, NOW + 1, &what).await;
            let outcomes: Vec<Vec<Outcome>> = results
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("{what}: {e}")))
                .collect();
            use Outcome::*;
            assert_eq!(outcomes[0], [Applied, Applied], "{what} fresh");
            assert_eq!(outcomes[1], [Overflow, Applied], "{what} big");
            assert_eq!(outcomes[2], [Duplicate, Duplicate], "{what} dup");
            assert_eq!(outcomes[3], [Duplicate, Applied], "{what} some");
            assert_eq!(outcomes[4], [Late], "{what} late");
            assert_eq!(outcomes[5], [Late, Applied], "{what} mixed");
            assert_eq!(outcomes[6], [Duplicate, Applied], "{what} legacy");
            assert_eq!(outcomes[7], [Applied], "{what} shared-a");
            assert_eq!(outcomes[8], [Applied], "{what} shared-b");
            if board.allow_negative {
                assert_eq!(outcomes[9], [Applied], "{what} zero");
            }
        }
    }
}

/// The same batch delivered again after a crash (every instance's events all
/// duplicates), then again with new instances beside the old (a redelivery after a crash
/// part-way): every old event a duplicate, every new one applied, as by calls of their own.
#[tokio::test]
async fn a_redelivered_batch_is_all_duplicates_in_packs() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    for shape in 0..8 {
        let board = scoped(shaped(shape));
        let control = twin(&board);
        let batch = fresh_shares("r", 8, "one");
        let what = board.name.clone();
        agree(&store, &board, &control, &batch, NOW, &what).await;
        let again = agree(&store, &board, &control, &batch, NOW + 5, &what).await;
        for r in &again {
            assert_eq!(
                r.as_ref().expect(&what),
                &vec![Outcome::Duplicate; 2],
                "{what}"
            );
        }
        let mut partly: Shares = batch[..4].to_vec();
        partly.extend(fresh_shares("n", 4, "one"));
        let results = agree(&store, &board, &control, &partly, NOW + 5, &what).await;
        for (i, r) in results.iter().enumerate() {
            let expected = if i < 4 {
                Outcome::Duplicate
            } else {
                Outcome::Applied
            };
            assert_eq!(r.as_ref().expect(&what), &vec![expected; 2], "{what} {i}");
        }
    }
}

/// Scope names with the characters that mean something to Redis keys, to the packed
/// call's layout or to a glob: each instance applied as by its own call, into its own
/// keys only.
#[tokio::test]
async fn odd_scope_names_in_one_pack_agree() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let control = twin(&board);
    let scopes = [
        "many", "}", "{", "a}b", "{x}", "x{", " ", "ü中", "a:b:c", "*?[]\\", "seen:ids", "\n", "1",
        "-1",
    ];
    let shares: Shares = scopes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let events = vec![
                ev(&format!("odd{i}"), NOW, "ann", 1 + i as i64),
                ev(&format!("odd{i}b"), NOW, "many", 2),
            ];
            (s.to_string(), events)
        })
        .collect();
    for round in 0..2 {
        let results = agree(&store, &board, &control, &shares, NOW, "odd scopes").await;
        let expected = if round == 0 {
            Outcome::Applied
        } else {
            Outcome::Duplicate
        };
        for (scope, r) in scopes.iter().zip(&results) {
            assert_eq!(r.as_ref().expect(scope), &vec![expected; 2], "{scope:?}");
        }
    }
    for (i, scope) in scopes.iter().enumerate() {
        let k = store.instance(&board.widest(), Some(scope));
        let score: Option<f64> = store
            .client()
            .zscore(k.result(), format!("{:016}:ann", MAX_TOTAL - NOW))
            .await
            .expect("zscore");
        assert_eq!(score, Some((1 + i) as f64), "{scope:?}");
    }
}

/// A period board's instances are applied one by one (never packed): one fold call per
/// scope at least, and the same outcomes and data as calls of their own.
#[tokio::test]
async fn period_boards_are_not_packed() {
    let (redis, store, ()) = with_fresh_store(()).await;
    let toml = "\n[[boards]]\nname = \"daily\"\nmember = \"user\"\nscope = \"room\"\nperiod = \"day\"\ntime_zone = \"UTC\"\nperiod_grace = \"10m\"\n";
    let board = rollboard::config::Settings::from_toml(toml)
        .expect("a period board")
        .boards
        .remove(0);
    let control = twin(&board);
    let now = 1_800_000_000_000;
    let shares: Shares = (0..6)
        .map(|i| {
            let events = vec![ev(&format!("p{i}"), now - 1_000, "ann", 1 + i as i64)];
            (format!("room{i}"), events)
        })
        .collect();
    let calls = fcall_calls(&redis);
    let p = packed(&store, &board, &shares, now).await;
    let sent = fcall_calls(&redis) - calls;
    assert!(sent >= 6, "{sent} script calls for 6 period instances");
    let a = alone(&store, &control, &shares, now).await;
    assert_same_results(&p, &a, "period");
    for r in &p {
        assert_eq!(r.as_ref().expect("period"), &vec![Outcome::Applied]);
    }
}

/// A server that lost rollboard's library (a restart, `FUNCTION FLUSH`) between two
/// batches: the packed call loads it and runs, every instance applied once.
#[tokio::test]
async fn a_packed_call_after_the_library_is_gone_loads_it() {
    let (redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let control = twin(&board);
    let first = fresh_shares("f", 6, "one");
    agree(&store, &board, &control, &first, NOW, "before").await;
    redis.cli(&["FUNCTION", "FLUSH"]);
    redis.cli(&["SCRIPT", "FLUSH"]);
    let next = fresh_shares("f", 6, "two");
    let results = agree(&store, &board, &control, &next, NOW, "after").await;
    for r in &results {
        assert_eq!(r.as_ref().expect("after"), &vec![Outcome::Applied; 2]);
    }
}

/// Every key of the server with what it holds.
async fn everything(store: &Store) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for key in keys_matching(store, "*").await {
        let value = held(store, &key).await;
        out.insert(key, value);
    }
    out
}

/// The packed call of `calls` (each with its packed tail: [`with_packed_tail`]) as
/// `Store::apply_shares` lays it out, with the KEYS and ARGV counts given.
fn packed_by_hand(
    calls: &[rollboard::store::FoldCall],
    counts: &[(i64, i64)],
) -> (Vec<String>, Vec<Value>) {
    let mut keys = Vec::new();
    let mut args = vec![Value::from("many"), Value::from(counts.len() as i64)];
    for &(k, a) in counts {
        args.extend([Value::from(k), Value::from(a)]);
    }
    for call in calls {
        keys.extend(call.keys.iter().cloned());
        args.extend(call.args.iter().cloned());
    }
    (keys, args)
}

/// The calls of instances `a` and `b` of `board` (one event each), as
/// `Store::apply_shares` would pack them, and the KEYS and ARGV counts of one.
fn two_calls(store: &Store, board: &Board) -> ([rollboard::store::FoldCall; 2], i64, i64) {
    let fingerprint = board.widest().fingerprint();
    let call = |scope: &str, id: &str| {
        let k = store.instance(&board.widest(), Some(scope));
        fold_call(board, &k, &fingerprint, &[ev(id, NOW, "ann", 5)], NOW)
    };
    let mut calls = [call("a", "x1"), call("b", "x2")];
    for c in &mut calls {
        with_packed_tail(c, board);
    }
    let (nk, na) = (calls[0].keys.len() as i64, calls[0].args.len() as i64);
    (calls, nk, na)
}

/// Appends what a packed instance of a board with one window sends after its members (a
/// call of its own sends nothing there): the two chain tokens (''), V (0), the dense flag.
fn with_packed_tail(call: &mut rollboard::store::FoldCall, board: &Board) {
    let dense = if board.dense_rank { "1" } else { "0" };
    call.args.extend([
        Value::from(""),
        Value::from(""),
        Value::from(0),
        Value::from(dense),
    ]);
}

/// Boards whose calls differ in their keys' tail: with and without refunds, with and
/// without dense ranks.
fn malformed_boards() -> Vec<Board> {
    let mut out = Vec::new();
    for shape in [0, 1] {
        for dense in [false, true] {
            let mut board = scoped(shaped(shape));
            board.dense_rank = dense;
            board.name = format!("{}-d{dense}", board.name);
            out.push(board);
        }
    }
    out
}

/// Sends each of `cases` (what, KEYS, ARGV) on a server holding nothing, and lists those
/// that were not refused as a whole (`ROLLBOARD packed ...`) or wrote something.
async fn not_refused(store: &Store, cases: Vec<(String, Vec<String>, Vec<Value>)>) -> Vec<String> {
    let mut broken = Vec::new();
    for (what, keys, args) in cases {
        let _: () = store.client().flushall(false).await.expect("flushall");
        let reply: Result<Value, _> = fcall(store.client(), "fold", keys, args).await;
        let written = everything(store).await;
        let refused = match &reply {
            Err(e) => e.details().starts_with("ROLLBOARD packed"),
            Ok(_) => false,
        };
        if !written.is_empty() || !refused {
            let written: Vec<&String> = written.keys().collect();
            broken.push(format!(
                "{what}: refused {refused}, wrote {written:?}, reply {reply:?}"
            ));
        }
    }
    broken
}

/// Packed calls whose header is malformed by hand: a missing, zero, negative, fractional
/// or non-numeric instance count, too few ARGV for the counts, negative counts, counts that
/// do not add up to the KEYS and ARGV sent. Each is refused as a whole, writing nothing.
#[tokio::test]
async fn packed_calls_with_a_malformed_header_are_refused_and_write_nothing() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let mut cases = Vec::new();
    for board in malformed_boards() {
        let (calls, nk, na) = two_calls(&store, &board);
        for counts in [
            vec![(nk, na), (nk, na + 1)],
            vec![(nk + 1, na), (nk, na)],
            vec![(nk, na)],
            vec![(-1, na), (2 * nk + 1, na)],
            vec![(nk, -1), (nk, 2 * na + 1)],
        ] {
            let (keys, args) = packed_by_hand(&calls, &counts);
            cases.push((format!("{}: counts {counts:?}", board.name), keys, args));
        }
        let (keys, mut args) = packed_by_hand(&calls, &[(nk, na), (nk, na)]);
        for p in ["0", "-2", "1.5", "two", "", "3"] {
            args[1] = Value::from(p);
            cases.push((
                format!("{}: P {p:?}", board.name),
                keys.clone(),
                args.clone(),
            ));
        }
        cases.push((
            format!("{}: no P", board.name),
            keys.clone(),
            vec![Value::from("many")],
        ));
        cases.push((
            format!("{}: P only", board.name),
            keys.clone(),
            args[..2].to_vec(),
        ));
    }
    let broken = not_refused(&store, cases).await;
    assert!(
        broken.is_empty(),
        "{} not refused whole:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Packed calls whose counts add up to the KEYS and ARGV sent but cut the instances in
/// the wrong places (a key or an argument moved from one instance to the next, an
/// instance of no KEYS and no ARGV): wrong counts, refused as a whole, writing nothing,
/// rather than run as instances of other keys and arguments than their own.
#[tokio::test]
async fn packed_calls_cutting_instances_in_the_wrong_places_are_refused() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let mut cases = Vec::new();
    for board in malformed_boards() {
        let (calls, nk, na) = two_calls(&store, &board);
        for counts in [
            vec![(nk, na), (nk, na), (0, 0)],
            vec![(nk + 1, na), (nk - 1, na)],
            vec![(nk - 1, na), (nk + 1, na)],
            vec![(nk, na + 1), (nk, na - 1)],
            vec![(nk, na - 1), (nk, na + 1)],
            vec![(2 * nk, 2 * na), (0, 0)],
            vec![(0, 0), (2 * nk, 2 * na)],
        ] {
            let (keys, args) = packed_by_hand(&calls, &counts);
            cases.push((format!("{}: counts {counts:?}", board.name), keys, args));
        }
    }
    let broken = not_refused(&store, cases).await;
    assert!(
        broken.is_empty(),
        "{} not refused whole:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// A well-formed packed call by hand, one instance's own ARGV malformed (its numbers
/// cut short): that instance answers `{ -1, error }`, having written nothing, and the
/// other is applied.
#[tokio::test]
async fn a_packed_call_with_one_malformed_instance_fails_that_one_alone() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let fingerprint = board.widest().fingerprint();
    let call = |scope: &str, id: &str| {
        let k = store.instance(&board.widest(), Some(scope));
        fold_call(&board, &k, &fingerprint, &[ev(id, NOW, "ann", 5)], NOW)
    };
    let mut calls = [call("a", "x1"), call("b", "x2")];
    for c in &mut calls {
        with_packed_tail(c, &board);
    }
    // ARGV[15], the numbers, of the first instance: an empty MessagePack array.
    calls[0].args[14] = Value::Bytes(vec![0x90].into());
    let counts: Vec<(i64, i64)> = calls
        .iter()
        .map(|c| (c.keys.len() as i64, c.args.len() as i64))
        .collect();
    let (keys, args) = packed_by_hand(&calls, &counts);
    let reply: Vec<Value> = fcall(store.client(), "fold", keys, args)
        .await
        .expect("a packed reply");
    assert_eq!(reply.len(), 2, "{reply:?}");
    match &reply[0] {
        Value::Array(parts) => {
            assert_eq!(parts[0].as_i64(), Some(-1), "{reply:?}");
            let message = parts[1].as_str().map(|s| s.to_string()).unwrap_or_default();
            assert!(message.starts_with("ROLLBOARD the numbers"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    match &reply[1] {
        Value::Array(parts) => assert_eq!(parts[0].as_i64(), Some(0), "{reply:?}"),
        other => panic!("{other:?}"),
    }
    let a = store.instance(&board.widest(), Some("a"));
    let b = store.instance(&board.widest(), Some("b"));
    let written_a: i64 = store
        .client()
        .exists(vec![a.meta(), a.result(), a.seen_table()])
        .await
        .expect("exists");
    assert_eq!(written_a, 0, "the malformed instance wrote");
    let score: Option<f64> = store
        .client()
        .zscore(b.result(), format!("{:016}:ann", MAX_TOTAL - NOW))
        .await
        .expect("zscore");
    assert_eq!(score, Some(5.0));
}

/// The same scope twice in one batch's shares (two shares of one instance), the same id
/// in both: it counts once, the second share's event a duplicate.
#[tokio::test]
async fn one_scope_twice_in_the_shares_counts_each_id_once() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let shares: Shares = vec![
        ("twice".into(), vec![ev("t1", NOW, "ann", 5)]),
        ("other".into(), vec![ev("t2", NOW, "ann", 1)]),
        (
            "twice".into(),
            vec![ev("t1", NOW, "ann", 5), ev("t3", NOW, "ann", 2)],
        ),
    ];
    let results = packed(&store, &board, &shares, NOW).await;
    let outcomes: Vec<Vec<Outcome>> = results.into_iter().map(|r| r.expect("applied")).collect();
    let counted = outcomes[0][0] == Outcome::Applied;
    let k = store.instance(&board.widest(), Some("twice"));
    let score: Option<f64> = store
        .client()
        .zscore(k.result(), format!("{:016}:ann", MAX_TOTAL - NOW))
        .await
        .expect("zscore");
    assert_eq!(score, Some(7.0), "{outcomes:?}");
    let t1: Vec<Outcome> = vec![outcomes[0][0], outcomes[2][0]];
    assert!(
        t1 == [Outcome::Applied, Outcome::Duplicate]
            || t1 == [Outcome::Duplicate, Outcome::Applied],
        "{outcomes:?} ({counted})"
    );
    assert_eq!(outcomes[2][1], Outcome::Applied);
}

/// A stored value that is not UTF-8 quoted in an instance's error (its `meta` pinning
/// settings of bytes that are not text, its `members` entry such bytes): that instance's
/// error in a pack is still the data error it is (`ROLLBOARD ...`, not an outage), its
/// text kept; the other instances are applied.
#[tokio::test]
async fn an_error_quoting_bytes_that_are_not_utf8_stays_a_data_error_in_a_pack() {
    let (_redis, store, ()) = with_fresh_store(()).await;
    let board = scoped(shaped(0));
    let first = fresh_shares("u", 3, "first");
    for r in packed(&store, &board, &first, NOW).await {
        assert_eq!(r.expect("first"), vec![Outcome::Applied; 2]);
    }
    let k = store.instance(&board.widest(), Some("u1"));
    for (what, key, field) in [
        ("members", k.members(), "ann"),
        ("settings", k.meta(), "settings"),
    ] {
        let value = Value::Bytes(b"\xff\xfe|e|0".to_vec().into());
        let _: () = keyed(
            &store,
            "HSET",
            vec![Value::from(key), Value::from(field), value],
        )
        .await;
        let shares = fresh_shares("u", 3, what);
        let results = packed(&store, &board, &shares, NOW).await;
        for i in [0, 2] {
            assert_eq!(
                results[i].as_ref().expect(what),
                &vec![Outcome::Applied; 2],
                "{what}"
            );
        }
        let e = results[1].as_ref().expect_err(what);
        assert_eq!(code(e), "ROLLBOARD", "{what}: {e}");
        assert!(!e.is_outage(), "{what}: {e}");
        let _: () = keyed(
            &store,
            "HDEL",
            vec![Value::from(k.members()), Value::from("ann")],
        )
        .await;
    }
}

/// Scopes of `board` whose instances share a cluster slot: `groups` groups of `each`,
/// each group's in one slot (the slot of its keys' hash tag).
fn scopes_sharing_slots(board: &Board, groups: usize, each: usize) -> Vec<Vec<String>> {
    use fred::types::cluster::ClusterRouting;
    let mut by_slot: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    let mut out = Vec::new();
    for i in 0.. {
        let scope = format!("s{i}");
        let slot = ClusterRouting::hash_key(format!("{{{}:{scope}}}", board.name).as_bytes());
        let group = by_slot.entry(slot).or_default();
        group.push(scope);
        if group.len() == each {
            out.push(group.clone());
            if out.len() == groups {
                return out;
            }
        }
    }
    unreachable!()
}

/// On a real cluster packs hold the instances of one slot: instances sharing a slot (one
/// of them with a key of the wrong type, one answering `slow`, one all duplicates) and
/// instances alone in theirs, in one batch: the same outcomes and data as calls of their
/// own.
#[tokio::test]
async fn packs_on_a_cluster_agree_with_calls_of_their_own() {
    use crate::support::cluster::RedisCluster;
    use crate::support::instances::contents_of;
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let board = scoped(shaped(0));
    let control = twin(&board);
    // The twin's scopes are the same names, so they share slots on its board too only
    // by chance: it is applied alone anyway.
    let groups = scopes_sharing_slots(&board, 3, 3);
    let mut scopes: Vec<String> = groups.concat();
    scopes.extend((0..4).map(|i| format!("lone{i}")));
    let shares = |round: &str| -> Shares {
        scopes
            .iter()
            .map(|s| {
                let events = vec![
                    ev(&format!("{s}-{round}-a"), NOW, "ann", 2),
                    ev(&format!("{s}-{round}-b"), NOW, "bob", 3),
                ];
                (s.clone(), events)
            })
            .collect()
    };
    let first = shares("one");
    let fcalls = || -> u64 {
        let masters = cluster.masters();
        masters
            .iter()
            .map(|&port| command_calls_at(port, "fcall") + command_calls_at(port, "evalsha"))
            .sum()
    };
    // The library loaded first (a call to a master without it is sent twice).
    let warm: Shares = vec![("warm".into(), vec![ev("warm", NOW, "ann", 1)])];
    for r in packed(&store, &board, &warm, NOW).await {
        assert_eq!(r.expect("warm"), vec![Outcome::Applied]);
    }
    let before = fcalls();
    let p = packed(&store, &board, &first, NOW).await;
    // One call a slot: a pack for each group of three, one call for each lone scope.
    let sent = fcalls() - before;
    assert!(
        sent <= 7,
        "{sent} script calls for 3 slots of 3 instances and 4 more"
    );
    let a = alone(&store, &control, &first, NOW).await;
    assert_same_results(&p, &a, "first");
    // In the first group: a wrong type, a total near 2^53 - 1, a redelivery.
    let (bad, big, dup) = (&groups[0][0], &groups[0][1], &groups[0][2]);
    for b in [&board, &control] {
        set_string(&store, &key_of(&store, b, bad, "slices"), "not yours").await;
        let k = store.instance(&b.widest(), Some(big));
        let _: () = store
            .client()
            .hset(k.slice(b.slice_of(NOW)), ("ann", MAX_TOTAL - 1))
            .await
            .expect("hset");
    }
    let mut second = shares("two");
    for (s, events) in second.iter_mut() {
        if s == dup {
            *events = first.iter().find(|(f, _)| f == s).expect("dup").1.clone();
        }
    }
    let p = packed(&store, &board, &second, NOW).await;
    let a = alone(&store, &control, &second, NOW).await;
    assert_same_results(&p, &a, "second");
    for ((s, _), r) in second.iter().zip(&p) {
        if s == bad {
            assert_eq!(code(r.as_ref().expect_err(s)), "WRONGTYPE");
        } else if s == dup {
            assert_eq!(r.as_ref().expect(s), &vec![Outcome::Duplicate; 2]);
        } else if s == big {
            // The slice field of ann past 2^53 - 1 with 2 more: the fold answers `slow`,
            // and the event-by-event call judges ann's event an overflow.
            assert_eq!(
                r.as_ref().expect(s),
                &vec![Outcome::Overflow, Outcome::Applied]
            );
        } else {
            assert_eq!(r.as_ref().expect(s), &vec![Outcome::Applied; 2], "{s}");
        }
    }
    for s in scopes.iter().filter(|s| *s != bad) {
        assert_eq!(
            contents_of(&store, &board.widest(), Some(s)).await,
            contents_of(&store, &control.widest(), Some(s)).await,
            "{s}"
        );
    }
}
