//! Attacks on the instances judged in the worker (`src/store/apply/judge.rs`): for every
//! input, a store judging in the worker gives the outcomes (or the same error) and leaves
//! the data that a store with transactions off (every instance to `fold.lua`) gives a twin
//! board. Digest table counts, marks and states out of range, keys of another type, a
//! settings pin of another definition, totals at 2^53 - 1, tie-break times outside the
//! exact integers, names that need escaping, repeated ids, amounts of 0, late and live
//! events mixed, one scope twice in a batch, two stores judging one large instance.

use fred::prelude::*;
use rollboard::domain::board::{Board, TieBreak};
use rollboard::domain::keys::InstanceKeys;
use rollboard::store::{ApplyEvent, Outcome, Reconnect, Store};

use crate::support::boards::{ev, scoped, with_fresh_store};
use crate::support::instances::{held, shaped, twin};
use crate::support::redis::{command_calls, keyed, RedisServer};

const NOW: i64 = 1_000_000;
const LIMIT: i64 = 9_007_199_254_740_991;

type Shares = Vec<(Option<String>, Vec<ApplyEvent>)>;
type Outs = Vec<Result<Vec<Outcome>, String>>;
/// A key of an instance to overwrite, named, from the instance's keys and a slice number.
type KeyCase<'a> = (&'a str, fn(&InstanceKeys, i64) -> String);
/// A digest table edit, named: fields and the bytes written to each.
type TableCase<'a> = (&'a str, Vec<(&'a str, Vec<u8>)>);
/// A step of events, named: (id, ms after NOW, member, amount) each.
type Step<'a> = (&'a str, &'a [(&'a str, i64, &'a str, i64)]);

/// A server, a store judging in the worker and one with transactions off.
struct Two {
    redis: RedisServer,
    store: Store,
    scripts: Store,
}

async fn two() -> Two {
    let (redis, store, ()) = with_fresh_store(()).await;
    let scripts = redis.store("rb").await.with_transactions(false);
    Two {
        redis,
        store,
        scripts,
    }
}

impl Two {
    /// `shares` applied by `store`: the outcomes, or the error with `board`'s name as `as`.
    async fn apply(store: &Store, board: &Board, shares: &Shares, now: i64, as_: &str) -> Outs {
        let mut borrowed: Vec<(Option<&str>, &[ApplyEvent])> = Vec::new();
        for (scope, events) in shares {
            borrowed.push((scope.as_deref(), events));
        }
        let results = store.apply_shares(board, &borrowed, now).await;
        let text = |e: rollboard::store::StoreError| e.to_string().replace(&board.name, as_);
        results.into_iter().map(|r| r.map_err(text)).collect()
    }

    /// `shares` applied at `now` to `board` in the worker and to its twin by the scripts:
    /// the same outcomes or errors, and the same data in every instance they name.
    async fn agree(&self, board: &Board, shares: &Shares, now: i64, what: &str) -> Outs {
        let control = twin(board);
        let judged = Self::apply(&self.store, board, shares, now, &board.name).await;
        let by_scripts = Self::apply(&self.scripts, &control, shares, now, &board.name).await;
        assert_eq!(judged, by_scripts, "{}: {what}: outcomes", board.name);
        for (scope, _) in shares {
            assert_eq!(
                held(&self.store, board, scope.as_deref(), false).await,
                held(&self.store, &control, scope.as_deref(), false).await,
                "{}: {what}: {scope:?}",
                board.name
            );
        }
        judged
    }

    /// Runs each of `commands` on the instance `scope` of `board` and of its twin.
    async fn on_both<F>(&self, board: &Board, scope: Option<&str>, commands: F)
    where
        F: Fn(&InstanceKeys) -> Vec<(&'static str, Vec<Value>)>,
    {
        for b in [board.clone(), twin(board)] {
            for (cmd, args) in commands(&self.store.instance(&b.widest(), scope)) {
                let _: Value = keyed(&self.store, cmd, args).await;
            }
        }
    }
}

fn named(name: impl Into<String>, board: Board) -> Board {
    Board {
        name: name.into(),
        ..board
    }
}

fn unscoped(shape: usize, name: &str) -> Board {
    named(name, shaped(shape))
}

fn one(events: Vec<ApplyEvent>) -> Shares {
    vec![(None, events)]
}

/// Shares of `scopes`, each with [`fresh`] events of round `round`.
fn each(scopes: &[&str], round: &str, n: usize) -> Shares {
    scopes
        .iter()
        .map(|s| (Some(s.to_string()), fresh(&format!("{s}-{round}"), n, NOW)))
        .collect()
}

/// `n` events with ids `round-i` over `ann`, `bob` and `cy`, at `ts` and just before.
fn fresh(round: &str, n: usize, ts: i64) -> Vec<ApplyEvent> {
    let mut events = Vec::new();
    for i in 0..n {
        let id = format!("{round}-{i}");
        events.push(ev(
            &id,
            ts - i as i64,
            ["ann", "bob", "cy"][i % 3],
            1 + i as i64,
        ));
    }
    events
}

/// `HSET` of the digest table with `fields`.
fn table_set<'a>(
    fields: &'a [(&'a str, Vec<u8>)],
) -> impl Fn(&InstanceKeys) -> Vec<(&'static str, Vec<Value>)> + 'a {
    move |k| {
        let mut args: Vec<Value> = vec![k.seen_table().into()];
        for (f, v) in fields {
            args.extend([Value::from(*f), Value::Bytes(v.clone().into())]);
        }
        vec![("HSET", args)]
    }
}

/// A bucket 0 without a state, of 20 entries of slice 0 (long forgettable): the first
/// write states the table with `#n` counting its own entry only (as `fold.lua` does for
/// any bucket it finds without a state); the next 17 inserts split bucket 0 and drop the
/// 20, taking `#n` below 0 in `fold.lua` (-2). The worker must agree, or leave the table
/// to the script.
#[tokio::test]
async fn a_count_below_the_forgotten_entries_a_split_drops() {
    let t = two().await;
    let board = unscoped(0, "under");
    let bucket: Vec<u8> = (0..20u8)
        .flat_map(|i| [[i + 1; 16].as_slice(), &[0; 4]].concat())
        .collect();
    t.on_both(&board, None, table_set(&[("0", bucket)])).await;
    t.agree(&board, &one(fresh("first", 1, NOW)), NOW, "first write")
        .await;
    t.agree(&board, &one(fresh("u", 17, NOW)), NOW, "17 inserts")
        .await;
}

/// A digest table with `#c` but no state (`table_state` in digest.lua then takes it as not
/// marked) beside a legacy `seen` ZSet holding an event's raw id: `fold.lua` looks the
/// ZSet up and the id is a duplicate; the worker must agree, or leave it to the script.
#[tokio::test]
async fn a_mark_without_a_state_does_not_hide_the_legacy_ids() {
    let t = two().await;
    let board = unscoped(0, "legacy");
    t.on_both(&board, None, |k| {
        let forget_at = Value::from(NOW + 10_000_000);
        vec![
            ("HSET", vec![k.seen_table().into(), "#c".into(), "1".into()]),
            ("ZADD", vec![k.seen().into(), forget_at, "old-0".into()]),
        ]
    })
    .await;
    let events = one(fresh("old", 2, NOW));
    t.agree(&board, &events, NOW, "an id the legacy ZSet holds")
        .await;
}

/// Two shares of one scope in one batch (`apply_shares` takes them): every event of both
/// counts once, as `fold.lua` judges the second share after the first one's writes.
#[tokio::test]
async fn two_shares_of_one_scope_in_one_batch_both_count() {
    let t = two().await;
    let board = scoped(shaped(0));
    t.agree(&board, &each(&["s0", "s1"], "seed", 2), NOW, "seed")
        .await;
    let twice = vec![
        (Some("s0".to_string()), fresh("a", 3, NOW)),
        (Some("s0".to_string()), fresh("b", 3, NOW)),
    ];
    t.agree(&board, &twice, NOW, "one scope twice").await;
}

/// Events before the epoch, live at a `now` just after it, on an earliest-first board:
/// its tie-break prefix, 2^53 - 1 - t, is past 2^53, where `fold.lua` rounds it.
#[tokio::test]
async fn tie_break_times_before_the_epoch() {
    let t = two().await;
    let board = unscoped(0, "epoch");
    assert_eq!(board.tie_break, TieBreak::Earliest);
    t.agree(&board, &one(vec![ev("seed", -1, "zed", 1)]), 500, "seed")
        .await;
    let events = vec![ev("x", -2, "ann", 3), ev("y", -4, "bob", 2)];
    t.agree(&board, &one(events), 500, "before the epoch").await;
}

/// Events timed past 2^53 ms on a latest-first board: `fold.lua` receives the time as a
/// double, rounded, and writes that in `members` and the ranking's prefix.
#[tokio::test]
async fn tie_break_times_past_2_53() {
    let t = two().await;
    let mut board = unscoped(0, "future");
    board.tie_break = TieBreak::Latest;
    t.agree(&board, &one(fresh("seed", 1, NOW)), NOW, "seed")
        .await;
    let events = vec![ev("x", LIMIT + 2, "ann", 3), ev("y", LIMIT + 4, "bob", 2)];
    t.agree(&board, &one(events), NOW, "past 2^53").await;
}

/// A key of another type in each key of an instance judged in the worker (in a pack
/// beside a sound instance, then alone), and a settings pin of another definition: the
/// same errors or outcomes, and the same data, as `fold.lua` gives.
#[tokio::test]
async fn keys_of_another_type_and_other_settings_fail_as_the_scripts_fail() {
    let t = two().await;
    let n = NOW / 1_000;
    let cases: [KeyCase; 9] = [
        ("meta", |k, _| k.meta()),
        ("members", |k, _| k.members()),
        ("slices", |k, _| k.slices()),
        ("table", |k, _| k.seen_table()),
        ("result", |k, _| k.result()),
        ("totals", |k, _| k.totals()),
        ("refs", |k, _| k.refs()),
        ("slice", |k, n| k.slice(n)),
        ("log", |k, n| k.seen_log(n)),
    ];
    for shape in [0, 2] {
        for (i, (what, key)) in cases.iter().enumerate() {
            let board = named(format!("wt{shape}-{i}"), scoped(shaped(shape)));
            t.agree(&board, &each(&["s0", "s1"], "seed", 2), NOW, "seed")
                .await;
            t.on_both(&board, Some("s0"), |k| {
                vec![
                    ("DEL", vec![key(k, n).into()]),
                    ("SET", vec![key(k, n).into(), "x".into()]),
                ]
            })
            .await;
            t.agree(&board, &each(&["s0", "s1"], what, 3), NOW, what)
                .await;
            t.agree(&board, &each(&["s0"], "alone", 2), NOW, what).await;
        }
        let board = named(format!("pin{shape}"), scoped(shaped(shape)));
        t.agree(&board, &each(&["s0", "s1"], "seed", 2), NOW, "seed")
            .await;
        t.on_both(&board, Some("s0"), |k| {
            vec![(
                "HSET",
                vec![k.meta().into(), "settings".into(), "mode=other".into()],
            )]
        })
        .await;
        t.agree(&board, &each(&["s0", "s1"], "pinned", 3), NOW, "settings")
            .await;
    }
}

/// Digest table states out of range or not whole, and counts far from the entries held:
/// 20 inserts (past one bucket), then 5, give what `fold.lua` gives.
#[tokio::test]
async fn corrupt_digest_table_states_agree_with_the_scripts() {
    let t = two().await;
    let cases: Vec<TableCase> = vec![
        ("level41", vec![("#L", b"41".to_vec())]),
        ("split-past", vec![("#p", b"1".to_vec())]),
        ("negative-n", vec![("#n", b"-1".to_vec())]),
        ("n-1000", vec![("#n", b"1000".to_vec())]),
        ("n-17", vec![("#n", b"17".to_vec())]),
        ("n-form", vec![("#n", b"+1".to_vec())]),
        ("bucket0-21", vec![("0", vec![7u8; 21])]),
        ("unclean", vec![("#c", b"0".to_vec())]),
        (
            "bucket3-7",
            vec![
                ("#L", b"2".to_vec()),
                ("#p", b"1".to_vec()),
                ("3", vec![7u8; 7]),
            ],
        ),
    ];
    for (name, fields) in cases {
        let board = unscoped(0, name);
        t.agree(&board, &one(fresh("seed", 1, NOW)), NOW, "seed")
            .await;
        t.on_both(&board, None, table_set(&fields)).await;
        t.agree(&board, &one(fresh(name, 20, NOW)), NOW, name).await;
        t.agree(&board, &one(fresh("after", 5, NOW)), NOW, "after")
            .await;
    }
}

/// Totals and slice fields driven to 2^53 - 1 exactly, then one past it, on incremental
/// and resummarize boards; amounts of 0 at the edge.
#[tokio::test]
async fn totals_at_the_edge_of_exact_integers() {
    let t = two().await;
    for shape in [0, 2] {
        let board = unscoped(shape, &format!("edge{shape}"));
        let steps: [Step; 5] = [
            ("seed", &[("s", 0, "ann", LIMIT - 10), ("t", 0, "bob", 1)]),
            ("to the edge", &[("a", 0, "ann", 7), ("b", 0, "ann", 3)]),
            ("zero", &[("z", 1, "ann", 0), ("z2", 0, "bob", 0)]),
            ("one past", &[("c", 0, "bob", 2), ("d", 0, "ann", 1)]),
            ("other slice", &[("e", -1_000, "ann", 1)]),
        ];
        for (what, step) in steps {
            let events = step
                .iter()
                .map(|&(id, dt, m, a)| ev(id, NOW + dt, m, a))
                .collect();
            t.agree(&board, &one(events), NOW, what).await;
        }
    }
}

/// Members whose names need escaping or look like the scripts' own encodings, amounts
/// of 0, an id repeated in a batch, events late and live mixed, equal times (ties), on
/// each judged shape and tie-break, over rounds at later times, then redelivered.
#[tokio::test]
async fn names_zeros_repeats_ties_and_late_events_agree() {
    let t = two().await;
    let names = "a:b|{x}|*?[||ü ñ|0000000000000005:ann|line\nbreak|%d%s|05";
    let names: Vec<&str> = names.split('|').collect();
    for shape in [0, 2, 4] {
        for tie in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None] {
            let mut board = named(
                format!("n{shape}-{tie:?}").to_lowercase(),
                scoped(shaped(shape)),
            );
            board.tie_break = tie;
            for (r, now) in [NOW, NOW + 700, NOW + 1_500, NOW + 2_600]
                .iter()
                .enumerate()
            {
                let mut events = Vec::new();
                for (i, m) in names.iter().enumerate() {
                    let id = format!("{r}-{i}");
                    events.push(ev(&id, now - 3 * (i as i64 % 2), m, i as i64 % 3));
                }
                events.push(ev(&format!("{r}-0"), *now, "bob", 9));
                events.push(ev(&format!("{r}-late"), now - 10_000, "cy", 4));
                events.push(ev(&format!("{r}-tie"), *now, "a:b", 1));
                let shares: Shares = vec![
                    (Some("r1".into()), events.clone()),
                    (Some("r2".into()), events),
                ];
                t.agree(&board, &shares, *now, &format!("round {r}")).await;
                let again = shares[..1].to_vec();
                t.agree(&board, &again, *now, "redelivered").await;
            }
        }
    }
    assert!(command_calls(&t.redis, "exec") > 0, "nothing judged here");
}

/// `n` events of round `round` over 60 members and the three slices up to `NOW`.
fn spread(round: &str, n: usize) -> Vec<ApplyEvent> {
    let mut events = Vec::new();
    for i in 0..n {
        let (id, member) = (format!("{round}-{i}"), format!("m{}", (i * 7 + i / 3) % 60));
        let at = NOW - (i % 3) as i64 * 1_000 - (i as i64 % 11);
        events.push(ev(&id, at, &member, 1 + (i % 5) as i64));
    }
    events
}

/// Two stores judging one large instance at once, their chunks racing (an `EXEC` aborted
/// when the other wrote first, then judged again): every event counts once, the data
/// (the digest table's buckets as sets) what the scripts leave applying them in turn.
#[tokio::test]
async fn two_stores_judging_one_large_instance_count_every_event_once() {
    let t = two().await;
    let other = Store::connect(&t.redis.url(), "rb", 2, Reconnect::Never)
        .await
        .expect("connect");
    let board = unscoped(0, "race");
    let control = twin(&board);
    let seed = spread("seed", 40);
    t.store.apply(&board, None, &seed, NOW).await.expect("seed");
    t.scripts
        .apply(&control, None, &seed, NOW)
        .await
        .expect("seed");
    for r in 0..4 {
        let (a, b) = (spread(&format!("a{r}"), 200), spread(&format!("b{r}"), 200));
        let (ra, rb) = futures_util::join!(
            t.store.apply(&board, None, &a, NOW),
            other.apply(&board, None, &b, NOW)
        );
        for r in [ra, rb] {
            assert_eq!(r.expect("applied"), vec![Outcome::Applied; 200]);
        }
        for events in [a, b] {
            t.scripts
                .apply(&control, None, &events, NOW)
                .await
                .expect("applied");
        }
        assert_eq!(
            held(&t.store, &board, None, true).await,
            held(&t.store, &control, None, true).await,
            "round {r}"
        );
    }
    assert!(command_calls(&t.redis, "exec") > 0, "nothing judged here");
}
