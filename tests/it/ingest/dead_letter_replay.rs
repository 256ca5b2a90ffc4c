//! `rollboard dead-letters list|replay`: a letter refused by one board instance
//! (`overflow`, `apply_failed`) is replayed to that instance only, with the event's own key
//! and time, so the instances that counted it never count it again; a replay repeated, or
//! run again after a crash, changes nothing; the selection flags take only what they name;
//! a letter that is still invalid stays.

use std::collections::HashMap;

use fred::prelude::*;
use rollboard::config::IngestSettings;
use rollboard::domain::board::{Board, Dedup, MAX_TOTAL};
use rollboard::domain::event::Reason;
use rollboard::ingest::dead_letters::{Counts, Replayer, Selection};
use rollboard::metrics::Metrics;
use rollboard::store::Store;

use crate::support::boards::{
    apply_events, apply_events_in, board, boards_a_b, boards_a_b_metered, entry, ev,
    ingest_settings, remembers, roll_all, scoped, set_string, test_boards, total_at, Consumer,
};
use crate::support::cli::{assert_contains, rollboard, stderr, stdout};
use crate::support::daemon::redis_and_config;
use crate::support::events::xadd_all;
use crate::support::keys::{dead_letter_stream, intake_stream, partition_stream};
use crate::support::redis::RedisServer;

type Letter = (String, HashMap<String, String>);

async fn letters(store: &Store) -> Vec<Letter> {
    store
        .client()
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange")
}

/// The operator's correction of a letter: a copy with `amount` set in, the letter `id` out.
async fn correct_amount(store: &Store, id: &str, letter: HashMap<String, String>, amount: &str) {
    let mut fixed: Vec<(String, String)> = letter.into_iter().collect();
    for (name, value) in &mut fixed {
        if name == "amount" {
            *value = amount.into();
        }
    }
    let _: String = store
        .client()
        .xadd(dead_letter_stream(), false, None, "*", fixed)
        .await
        .expect("xadd");
    let _: i64 = store
        .client()
        .xdel(dead_letter_stream(), id)
        .await
        .expect("xdel");
}

/// Replays what `selection` takes at `now`; the tally.
async fn replay(
    store: &Store,
    boards: &[Board],
    settings: &IngestSettings,
    selection: &Selection,
    now: i64,
) -> Counts {
    let mut counts = Counts::default();
    Replayer::new(store, boards, settings, now)
        .run(selection, &mut counts, |_, _| {})
        .await
        .expect("replay");
    counts
}

fn counts(replayed: u64, duplicates: u64, refused: u64) -> Counts {
    Counts {
        replayed,
        duplicates,
        refused,
        relettered: 0,
    }
}

/// The total and tie-break time of `member` on an instance.
async fn standing(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    member: &str,
    now: i64,
) -> (Option<i64>, Option<i64>) {
    let rank = store
        .rank(&board.widest(), scope, member, now)
        .await
        .expect("rank");
    (rank.total, rank.last_ts)
}

/// An event without `id` or `ts`, read from a partition, refused (`overflow`) by a scoped
/// instance sitting near 2^53-1 and counted by an unscoped board that has since forgotten
/// its key. After a refund makes room, the replay counts it once on the refusing instance,
/// under the consumer's own key and at its original time, and not again on the other
/// board; a second replay finds nothing; the letter put back (a crash between apply and
/// delete) is found already counted.
#[tokio::test]
async fn an_overflow_letter_counts_once_on_the_refusing_instance_and_never_again_elsewhere() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut fans = scoped(board("fans", SLICE, 4));
    fans.allow_negative = true;
    // users forgets keys 100 ms after their slice ends: only replaying to the refusing
    // instance keeps the replay from counting there again.
    let mut users = board("users", SLICE, 4);
    users.dedup = Dedup::AfterSlice(100);
    let boards = vec![fans.clone(), users.clone()];
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 2);
    let stream = partition_stream(1);
    // Quotes and a backslash: the scope is read back from the letter's detail.
    let scope = "r \"1\" \\";
    let t0: i64 = 1_000_500;
    apply_events_in(
        &store,
        &fans,
        scope,
        &[ev("big", t0 - 100, "u1", MAX_TOTAL - 10)],
        t0,
    )
    .await;
    let tip = entry(
        &format!("{t0}-0"),
        &[("user", "u1"), ("room", scope), ("amount", "100")],
    );
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(&stream, std::slice::from_ref(&tip), t0)
        .await
        .expect("batch");
    let dead = letters(&store).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1["reason"], "overflow");
    assert_eq!(total_at(&store, &users.widest(), "u1", t0).await, Some(100));

    // Room on the refusing instance: a refund.
    apply_events_in(
        &store,
        &fans,
        scope,
        &[ev("refund", t0 - 50, "u1", -1000)],
        t0,
    )
    .await;
    let t1 = t0 + SLICE;
    roll_all(&store, &boards, t1, 100).await;
    let key = format!("{stream}/{t0}-0");
    assert!(!remembers(&store, &users, None, &key, t0 / SLICE).await);
    let everything = Selection::default();
    assert_eq!(
        replay(&store, &boards, &settings, &everything, t1).await,
        counts(1, 0, 0)
    );
    let once = (Some(MAX_TOTAL - 10 - 1000 + 100), Some(t0));
    assert_eq!(standing(&store, &fans, Some(scope), "u1", t1).await, once);
    assert_eq!(total_at(&store, &users.widest(), "u1", t1).await, Some(100));
    assert!(letters(&store).await.is_empty());
    // Under the consumer's key for an event without id on a partition.
    assert!(remembers(&store, &fans, Some(scope), &key, t0 / SLICE).await);

    // Again: nothing left to replay.
    assert_eq!(
        replay(&store, &boards, &settings, &everything, t1).await,
        counts(0, 0, 0)
    );
    // The letter back, as a crash before its XDEL leaves it: already counted, deleted.
    let fields: Vec<(String, String)> = dead[0].1.clone().into_iter().collect();
    let _: String = store
        .client()
        .xadd(dead_letter_stream(), false, None, "*", fields)
        .await
        .expect("xadd");
    assert_eq!(
        replay(&store, &boards, &settings, &everything, t1).await,
        counts(0, 1, 0)
    );
    assert!(letters(&store).await.is_empty());
    assert_eq!(standing(&store, &fans, Some(scope), "u1", t1).await, once);
    assert_eq!(total_at(&store, &users.widest(), "u1", t1).await, Some(100));
}

/// An `apply_failed` letter (its board's result key of the wrong type) stays, unchanged and
/// not copied, while the board is still broken; once repaired, the replay counts the
/// event there once and not again on the board that counted it at first.
#[tokio::test]
async fn an_apply_failed_letter_stays_until_its_board_is_repaired_and_then_counts_there_once() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (a, b, boards, metrics) = boards_a_b_metered(SLICE);
    let settings = ingest_settings(intake_stream(), 1);
    let t0: i64 = 1_000_500;
    let broken = store.instance(&b.widest(), None).result();
    set_string(&store, &broken, "x").await;
    let tip = [("user", "u1"), ("amount", "5"), ("id", "tip-1")];
    Consumer::new(&store, &boards, &settings, &metrics)
        .process_one(intake_stream(), &tip, t0)
        .await;
    let dead = letters(&store).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1["reason"], "apply_failed");

    let only = Selection {
        reason: Some(Reason::ApplyFailed),
        ..Selection::default()
    };
    assert_eq!(
        replay(&store, &boards, &settings, &only, t0).await,
        counts(0, 0, 1)
    );
    assert_eq!(letters(&store).await, dead, "left as it was, not copied");

    let _: () = store.client().del(broken.as_str()).await.expect("repair");
    let t1 = t0 + SLICE;
    assert_eq!(
        replay(&store, &boards, &settings, &only, t1).await,
        counts(1, 0, 0)
    );
    assert_eq!(total_at(&store, &a.widest(), "u1", t1).await, Some(5));
    assert_eq!(total_at(&store, &b.widest(), "u1", t1).await, Some(5));
    assert!(letters(&store).await.is_empty());
}

/// A corrected `amount` letter that one instance now refuses (`overflow`) is counted by the
/// others and replaced by an `overflow` letter naming that instance, as the consumer would
/// have written; that letter, replayed once there is room, counts there and nowhere else.
#[tokio::test]
async fn a_revalidated_letter_refused_by_one_instance_leaves_a_letter_for_that_instance_only() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (a, mut b) = boards_a_b(SLICE);
    b.allow_negative = true;
    let boards = vec![a.clone(), b.clone()];
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let t0: i64 = 1_000_500;
    apply_events(&store, &b, &[ev("big", t0 - 100, "u1", MAX_TOTAL - 10)], t0).await;
    let bad = [("user", "u1"), ("amount", "1x"), ("id", "tip-9")];
    Consumer::new(&store, &boards, &settings, &metrics)
        .process_one(intake_stream(), &bad, t0)
        .await;
    let (bad_id, letter) = letters(&store).await.remove(0);
    assert_eq!(letter["reason"], "amount");
    correct_amount(&store, &bad_id, letter, "100").await;

    let everything = Selection::default();
    let mut first = counts(1, 0, 0);
    first.relettered = 1;
    assert_eq!(
        replay(&store, &boards, &settings, &everything, t0).await,
        first
    );
    assert_eq!(total_at(&store, &a.widest(), "u1", t0).await, Some(100));
    assert_eq!(
        total_at(&store, &b.widest(), "u1", t0).await,
        Some(MAX_TOTAL - 10)
    );
    let left = letters(&store).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1["reason"], "overflow");
    assert!(left[0].1["detail"].starts_with("board b: "), "{left:?}");
    assert_eq!(left[0].1["id"], "tip-9");

    apply_events(&store, &b, &[ev("refund", t0 - 50, "u1", -1000)], t0).await;
    assert_eq!(
        replay(&store, &boards, &settings, &everything, t0).await,
        counts(1, 0, 0)
    );
    assert_eq!(total_at(&store, &a.widest(), "u1", t0).await, Some(100));
    assert_eq!(
        total_at(&store, &b.widest(), "u1", t0).await,
        Some(MAX_TOTAL - 10 - 1000 + 100)
    );
    assert!(letters(&store).await.is_empty());
}

/// Letters refused as a whole (`late`, `member`, `amount`, `no_board`): `--board` takes
/// those whose event matches the board, `--reason` those of the reason; a letter still
/// invalid (or still late) is reported and stays; a letter the operator corrected (a
/// fixed copy appended, the bad one deleted) is applied to every board it matches.
#[tokio::test]
async fn letters_refused_as_a_whole_are_selected_by_board_and_reason_and_stay_while_invalid() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let boards = test_boards();
    let rooms = boards[0].clone();
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let now = rollboard::domain::clock::local_ms();
    let old = (now - 8 * 86_400_000).to_string();
    let at = |seq: u32| format!("{now}-{seq}");
    let batch = [
        entry(
            &at(0),
            &[
                ("room", "r1"),
                ("amount", "5"),
                ("ts", &old),
                ("id", "late-1"),
            ],
        ),
        entry(&at(1), &[("room", ""), ("amount", "5"), ("id", "member-1")]),
        entry(
            &at(2),
            &[("room", "r3"), ("amount", "x"), ("id", "amount-1")],
        ),
        entry(&at(3), &[("user", "u5"), ("amount", "1")]),
    ];
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(intake_stream(), &batch, now)
        .await
        .expect("batch");
    let dead = letters(&store).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, l)| l["reason"].as_str()).collect();
    assert_eq!(reasons, ["late", "member", "amount", "no_board"]);

    let by_board = |name: &str| Selection {
        board: Some(name.into()),
        ..Selection::default()
    };
    let by_reason = |reason| Selection {
        reason: Some(reason),
        ..Selection::default()
    };
    // No letter's event carries fans_7d's user, amount and room fields.
    assert_eq!(
        replay(&store, &boards, &settings, &by_board("fans_7d"), now).await,
        counts(0, 0, 0)
    );
    assert_eq!(
        replay(&store, &boards, &settings, &by_reason(Reason::Late), now).await,
        counts(0, 0, 1)
    );
    assert_eq!(letters(&store).await.len(), 4);

    // The operator corrects the amount letter: a fixed copy in, the bad one out.
    let (bad_id, bad) = &dead[2];
    correct_amount(&store, bad_id, bad.clone(), "7").await;

    // rooms_7d: the late, member and corrected letters; no_board matches nothing.
    assert_eq!(
        replay(&store, &boards, &settings, &by_board("rooms_7d"), now).await,
        counts(1, 0, 2)
    );
    assert_eq!(total_at(&store, &rooms.widest(), "r3", now).await, Some(7));
    let left: Vec<String> = letters(&store)
        .await
        .into_iter()
        .map(|(_, l)| l["reason"].clone())
        .collect();
    assert_eq!(left, ["late", "member", "no_board"]);
    assert_eq!(
        replay(&store, &boards, &settings, &Selection::default(), now).await,
        counts(0, 0, 3)
    );
    assert_eq!(letters(&store).await.len(), 3);
}

/// The binary: `list --json` names the refusing board, `--reason` and `--limit` narrow it;
/// `replay` exits 1 while a letter is still refused (a late one) after replaying the
/// overflow letter to its board only, `--dry-run` writes nothing, and a second run
/// replays nothing.
#[tokio::test]
async fn the_dead_letters_command_lists_and_replays_an_overflow_to_its_board_only() {
    let (_redis, store, _dir, config, _) = redis_and_config("a").await;
    let boards = test_boards();
    let (rooms, tips) = (boards[0].clone(), boards[2].clone());
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let now = rollboard::domain::clock::local_ms();
    // u1 on tips_24h (scale 2, refunds allowed) 50 minor units below the limit.
    apply_events(
        &store,
        &tips,
        &[ev("big", now - 1000, "u1", MAX_TOTAL - 50)],
        now,
    )
    .await;
    let old = (now - 8 * 86_400_000).to_string();
    let batch = [
        entry(
            &format!("{now}-0"),
            &[
                ("user", "u1"),
                ("room", "r1"),
                ("amount", "3"),
                ("value", "1.00"),
            ],
        ),
        entry(
            &format!("{now}-1"),
            &[("room", "r9"), ("amount", "5"), ("ts", &old)],
        ),
    ];
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(intake_stream(), &batch, now)
        .await
        .expect("batch");
    assert_eq!(total_at(&store, &rooms.widest(), "r1", now).await, Some(3));
    apply_events(&store, &tips, &[ev("refund", now - 500, "u1", -1000)], now).await;

    let run = |args: &[&str]| rollboard(Some(&config), args, &[]);
    let out = run(&["dead-letters", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(listed.len(), 2, "{}", stdout(&out));
    assert_eq!(listed[0]["reason"], "overflow");
    assert_eq!(listed[0]["board"], "tips_24h");
    assert_eq!(listed[0]["fields"]["value"], "1.00");
    assert_eq!(listed[1]["reason"], "late");
    assert_eq!(listed[1]["board"], serde_json::Value::Null);
    let out = run(&["dead-letters", "list", "--reason", "late"]);
    assert!(stdout(&out).contains("late"), "{}", stdout(&out));
    assert!(!stdout(&out).contains("overflow"), "{}", stdout(&out));
    let out = run(&["dead-letters", "list", "--limit", "1"]);
    assert!(stderr(&out).contains("--limit"), "{}", stderr(&out));
    let out = run(&["dead-letters", "list", "--board", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let out = run(&["dead-letters", "replay", "--dry-run"]);
    assert!(stdout(&out).contains("would replay 2"), "{}", stdout(&out));
    assert_eq!(letters(&store).await.len(), 2, "a dry run writes nothing");

    let out = run(&["dead-letters", "replay"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_contains(
        &stdout(&out),
        "replayed 1, already counted 0, still refused 1",
    );
    assert_eq!(
        total_at(&store, &tips.widest(), "u1", now).await,
        Some(MAX_TOTAL - 50 - 1000 + 100)
    );
    assert_eq!(total_at(&store, &rooms.widest(), "r1", now).await, Some(3));
    let left = letters(&store).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].1["reason"], "late");

    let out = run(&["dead-letters", "replay", "--reason", "overflow"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("replayed 0"), "{}", stdout(&out));
    assert_eq!(total_at(&store, &rooms.widest(), "r1", now).await, Some(3));
}

/// A stream of several pages: every letter is seen once, in order, and `--id` takes just
/// the entries named.
#[tokio::test]
async fn replay_reads_every_page_once_and_takes_given_entries_only() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let boards = test_boards();
    let settings = ingest_settings(intake_stream(), 1);
    let now = rollboard::domain::clock::local_ms();
    let junk: Vec<Vec<(String, String)>> = (0..250)
        .map(|i| {
            [
                ("user", format!("u{i}")),
                ("amount", "1".into()),
                ("reason", "no_board".into()),
                ("detail", "the event matches no board".into()),
                ("source_id", format!("{now}-{i}")),
                ("source_stream", intake_stream().into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        })
        .collect();
    xadd_all(store.client(), dead_letter_stream(), &junk).await;
    let ids: Vec<String> = letters(&store)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let mut seen = Vec::new();
    let mut tally = Counts::default();
    Replayer::new(&store, &boards, &settings, now)
        .run(&Selection::default(), &mut tally, |letter, _| {
            seen.push(letter.entry_id.clone())
        })
        .await
        .expect("replay");
    assert_eq!(seen, ids);
    assert_eq!(tally, counts(0, 0, 250));

    let picked = Selection {
        ids: vec![ids[200].clone(), ids[3].clone(), "1-0".into()],
        ..Selection::default()
    };
    let mut seen = Vec::new();
    Replayer::new(&store, &boards, &settings, now)
        .run(&picked, &mut Counts::default(), |letter, _| {
            seen.push(letter.entry_id.clone())
        })
        .await
        .expect("replay");
    assert_eq!(seen, [ids[3].clone(), ids[200].clone()]);
}
