//! Calendar-period boards against a real Redis: each period ranks exactly its own events,
//! closed periods take late events until their grace has passed and then dead-letter them,
//! archives beyond `keep_periods` are deleted by the roll, and the queries name periods
//! over HTTP and on the command line.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::TimeZone;
use proptest::prelude::*;
use rollboard::config::Settings;
use rollboard::domain::board::{period_instance, Board, PeriodSelector};
use rollboard::ingest::consumer::process_batch;
use rollboard::metrics::Metrics;
use rollboard::store::Store;

use crate::support::boards::{entry, ev, ingest_settings, redis_now, roll_all};
use crate::support::cli::run_rollboard;
use crate::support::config::write_config;
use crate::support::daemon::Daemon;
use crate::support::events::letters;
use crate::support::http::post_to;
use crate::support::keys::{base, instance, intake_stream, prefix, schema};
use crate::support::proptests::run_cases_on_a_cluster;
use crate::support::redis::{free_port, RedisServer};

const MINUTE: i64 = 60_000;
const HOUR: i64 = 3_600_000;
const DAY: i64 = 86_400_000;

/// Three period boards over one event shape: Berlin days (10m grace), New York weeks
/// from Sunday (1h grace) and Berlin months (no grace).
const PERIOD_BOARDS: &str = concat!(
    "\n[[boards]]\nname = \"berlin_day\"\nmember = \"user\"\nperiod = \"day\"\ntime_zone = \"Europe/Berlin\"\nperiod_grace = \"10m\"\nkeep_periods = 2\n\n",
    "[[boards]]\nname = \"ny_week\"\nmember = \"user\"\nperiod = \"week\"\ntime_zone = \"America/New_York\"\nweek_start = \"sunday\"\nperiod_grace = \"1h\"\n\n",
    "[[boards]]\nname = \"berlin_month\"\nmember = \"user\"\nperiod = \"month\"\ntime_zone = \"Europe/Berlin\"\nperiod_grace = \"0s\"\n",
);

fn period_boards() -> Vec<Board> {
    Settings::from_toml(PERIOD_BOARDS).expect("valid").boards
}

/// Epoch ms of a local time in `zone`.
fn local(zone: chrono_tz::Tz, text: &str) -> i64 {
    let t = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M").expect("time");
    zone.from_local_datetime(&t)
        .earliest()
        .expect("exists")
        .timestamp_millis()
}

/// Instants where periods turn awkwardly: DST changes in both zones, month ends, a leap day.
fn anchors() -> Vec<i64> {
    let berlin = chrono_tz::Europe::Berlin;
    let ny = chrono_tz::America::New_York;
    vec![
        local(berlin, "2026-03-29 00:00"),
        local(berlin, "2026-10-25 00:00"),
        local(ny, "2026-03-08 00:00"),
        local(ny, "2026-11-01 00:00"),
        local(berlin, "2026-04-30 23:00"),
        local(ny, "2026-12-31 23:00"),
        local(berlin, "2028-02-29 00:00"),
        local(ny, "2028-02-28 23:30"),
    ]
}

/// The model of one board: per period id, the ids applied and each member's total and
/// latest time.
#[derive(Default)]
struct Model {
    seen: HashMap<String, HashSet<String>>,
    totals: HashMap<String, BTreeMap<String, (i64, i64)>>,
}

impl Model {
    /// Applies one event judged at `now`; whether it was late.
    fn apply(&mut self, board: &Board, e: &Tip, now: i64) -> bool {
        let c = board.period.expect("a period board");
        let span = c.span_at(e.ts);
        if span.end_ms + c.grace_ms <= now {
            return true;
        }
        if self
            .seen
            .entry(span.id.clone())
            .or_default()
            .insert(e.id.clone())
        {
            let row = self
                .totals
                .entry(span.id)
                .or_default()
                .entry(e.member.clone())
                .or_insert((0, i64::MIN));
            row.0 += e.amount;
            row.1 = row.1.max(e.ts);
        }
        false
    }

    /// The expected ranking of one period: total descending, earliest latest-time first,
    /// then member name descending.
    fn ranking(&self, id: &str) -> Vec<(String, i64, i64)> {
        let mut rows: Vec<(String, i64, i64)> = self
            .totals
            .get(id)
            .map(|m| m.iter().map(|(k, (t, ts))| (k.clone(), *t, *ts)).collect())
            .unwrap_or_default();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then(b.0.cmp(&a.0)));
        rows
    }
}

#[derive(Debug, Clone)]
struct Tip {
    id: String,
    ts: i64,
    member: String,
    amount: i64,
}

/// A batch: tips, delivered at a time after each of them.
type Batch = (Vec<Tip>, i64);

/// Batches around one anchor each: tips days before it, just before it and just after it,
/// delivered at once, within the boards' graces or after them; one tip in five is a
/// redelivery of an earlier one.
fn batches() -> impl Strategy<Value = Vec<Batch>> {
    let anchor_count = anchors().len();
    let offset = prop_oneof![-3 * DAY..-1, -30 * MINUTE..-1, 0..10 * MINUTE];
    let tip = (offset, 0..4usize, 1..50i64, 0..5u8);
    let delay = prop_oneof![0..15 * MINUTE, 0..2 * HOUR, 2 * HOUR..2 * DAY];
    let batch = (0..anchor_count, proptest::collection::vec(tip, 1..6), delay);
    proptest::collection::vec(batch, 1..10).prop_map(|raw| {
        let anchors = anchors();
        let mut sent: Vec<Tip> = Vec::new();
        let mut out = Vec::new();
        for (a, tips, delay) in raw {
            let mut batch = Vec::new();
            for (offset, m, amount, redeliver) in tips {
                let tip = match sent.get(m * 7 % sent.len().max(1)) {
                    Some(old) if redeliver == 0 => old.clone(),
                    _ => Tip {
                        id: format!("t{}", sent.len()),
                        ts: anchors[a] + offset,
                        member: format!("u{m}"),
                        amount,
                    },
                };
                sent.push(tip.clone());
                batch.push(tip);
            }
            let newest = batch.iter().map(|t| t.ts).max().unwrap_or_default();
            out.push((batch, newest.max(anchors[a] + delay)));
        }
        out
    })
}

/// Dead letters of `rb:events:dead` with `reason`: their `id` fields.
async fn dead_ids(store: &Store, reason: &str) -> Vec<String> {
    letters(store)
        .await
        .into_iter()
        .filter(|(_, f)| f.get("reason").map(String::as_str) == Some(reason))
        .map(|(_, f)| f.get("id").cloned().unwrap_or_default())
        .collect()
}

/// The ranking of one period instance as (member, total, last_ts).
async fn stored(store: &Store, board: &Board, id: &str, now: i64) -> Vec<(String, i64, i64)> {
    let instance = period_instance(None, id);
    store
        .top(&board.widest(), Some(&instance), 0, 1000, now)
        .await
        .expect("top")
        .entries
        .into_iter()
        .map(|e| (e.member, e.total, e.last_ts.expect("earliest keeps time")))
        .collect()
}

/// Feeds `batches` through the consumer's batch stages into an emptied `store` and checks
/// every period of every board, and the dead letters, against the model.
async fn check_against_model(store: &Store, case: usize, batches: Vec<Batch>) {
    let boards = period_boards();
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let mut models: Vec<Model> = boards.iter().map(|_| Model::default()).collect();
    let mut late_everywhere = Vec::new();
    let mut entry_no = 0;
    let mut last_now = 0;
    for (tips, now) in &batches {
        let mut entries = Vec::new();
        for tip in tips {
            entry_no += 1;
            let ts = tip.ts.to_string();
            let amount = tip.amount.to_string();
            entries.push(entry(
                &format!("{}-{entry_no}", 1_000 + entry_no),
                &[
                    ("id", tip.id.as_str()),
                    ("ts", ts.as_str()),
                    ("user", tip.member.as_str()),
                    ("amount", amount.as_str()),
                ],
            ));
            let late: Vec<bool> = boards
                .iter()
                .zip(models.iter_mut())
                .map(|(b, m)| m.apply(b, tip, *now))
                .collect();
            if late.iter().all(|l| *l) {
                late_everywhere.push(tip.id.clone());
            }
        }
        process_batch(
            store,
            &boards,
            &settings,
            &metrics,
            intake_stream(),
            &entries,
            *now,
        )
        .await
        .expect("batch");
        last_now = last_now.max(*now);
    }
    for (b, model) in boards.iter().zip(&models) {
        let c = b.period.expect("period");
        let mut ids: Vec<String> = model.totals.keys().cloned().collect();
        for selector in [PeriodSelector::Current, PeriodSelector::Previous] {
            ids.push(c.select(&selector, last_now).expect("span").id);
        }
        for id in ids {
            assert_eq!(
                stored(store, b, &id, last_now).await,
                model.ranking(&id),
                "case {case}: board {} period {id}",
                b.name
            );
        }
    }
    let mut dead = dead_ids(store, "late").await;
    dead.sort();
    late_everywhere.sort();
    assert_eq!(dead, late_everywhere, "case {case}: late dead letters");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random tips around DST changes in Berlin and New York, month ends and a leap day,
    /// delivered in time, within the grace and after it, some redelivered: every period
    /// (current, previous, each by id) ranks what the model says, and exactly the tips
    /// late for every board are dead-lettered `late`.
    #[test]
    fn periods_rank_exactly_their_own_tips_and_late_ones_are_dead_lettered(batches in batches()) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CASE: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static REDIS: RedisServer = RedisServer::start();
        }
        let case = CASE.fetch_add(1, Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        REDIS.with(|redis| {
            rt.block_on(async {
                let store = redis.store("rb").await;
                redis.cli(&["FLUSHALL"]);
                check_against_model(&store, case, batches).await
            })
        });
    }
}

/// The same on a Redis Cluster (3 masters, 3 replicas): each period is an instance of its
/// own, in a slot of its own, so the periods of one board spread over the masters.
#[test]
fn on_a_cluster_periods_rank_exactly_their_own_tips() {
    run_cases_on_a_cluster(
        "periods on a cluster equal the model",
        8,
        &batches(),
        async |store, case, batches| check_against_model(store, case, batches).await,
    );
}

/// The grace, exactly: a closed day takes a tip until `end + grace` and refuses it from
/// then on; the roll keeps `keep_periods` archives and deletes older ones (every key of
/// their instances), newest first in `archived_periods`.
#[tokio::test]
async fn the_grace_ends_exactly_and_the_roll_keeps_only_keep_periods_archives() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let boards = period_boards();
    let day = &boards[0];
    let c = day.period.expect("period");
    let first = c.span_at(local(chrono_tz::Europe::Berlin, "2026-10-24 12:00"));
    let tip = |id: &str, ts: i64| ev(id, ts, "u1", 5);
    let late_at = first.end_ms + c.grace_ms;
    let out = store
        .apply(day, None, &[tip("a", first.start_ms)], late_at - 1)
        .await
        .expect("apply");
    assert_eq!(out, [rollboard::store::Outcome::Applied]);
    let out = store
        .apply(day, None, &[tip("b", first.end_ms - 1)], late_at)
        .await
        .expect("apply");
    assert_eq!(out, [rollboard::store::Outcome::Late]);
    // Four more days (the 25th is 25 hours long in Berlin).
    let mut span = first.clone();
    for i in 0..4 {
        span = c.span_at(span.end_ms);
        store
            .apply(
                day,
                None,
                &[tip(&format!("d{i}"), span.start_ms)],
                span.start_ms,
            )
            .await
            .expect("apply");
    }
    assert_eq!(span.id, "2026-10-28");
    let now = span.start_ms + HOUR;
    let state = store.period_state(day, &c, now).await.expect("state");
    assert_eq!(state.current.id, "2026-10-28");
    assert_eq!(state.archived, ["2026-10-27", "2026-10-26"]);
    let reports = roll_all(&store, &boards, now, 100).await;
    assert_eq!(reports[0].periods_removed, 2, "{reports:?}");
    let keys = redis.cli(&[
        "KEYS",
        &format!("{}:{{berlin_day:@2026-10-2[45]}}*", prefix()),
    ]);
    assert!(keys.trim().is_empty(), "deleted archives left keys: {keys}");
    let kept = redis.cli(&[
        "KEYS",
        &instance("berlin_day", Some("@2026-10-26")).result(),
    ]);
    assert!(!kept.trim().is_empty());
    let registry = redis.cli(&["ZRANGE", &schema().periods("berlin_day"), "0", "-1"]);
    assert_eq!(
        registry.split_whitespace().collect::<Vec<_>>(),
        ["2026-10-26", "2026-10-27", "2026-10-28"]
    );
    // A tip of a deleted period stays late and writes nothing.
    let out = store
        .apply(day, None, &[tip("again", first.start_ms)], now)
        .await
        .expect("apply");
    assert_eq!(out, [rollboard::store::Outcome::Late]);
    assert!(redis
        .cli(&[
            "KEYS",
            &format!("{}*", base(&instance("berlin_day", Some("@2026-10-24"))))
        ])
        .trim()
        .is_empty());
    // Verify reads each period instance.
    for instance in rollboard::roll::instances(&store, day)
        .await
        .expect("instances")
    {
        let v = rollboard::roll::verify(&store, &day.widest(), instance.as_deref(), 100)
            .await
            .expect("verify");
        assert!(v.differences.is_empty(), "{v:?}");
    }
}

/// Config refusals name the key: an unknown zone, period or week start exits 64.
#[test]
fn bad_period_settings_exit_64_naming_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.toml");
    for (extra, key) in [
        (
            "period = \"day\"\ntime_zone = \"Europe/Atlantis\"\n",
            "boards[0].time_zone",
        ),
        ("period = \"fortnight\"\n", "boards[0].period"),
        (
            "period = \"week\"\nweek_start = \"someday\"\n",
            "boards[0].week_start",
        ),
        ("period = \"day\"\nwindow = \"7d\"\n", "boards[0].window"),
    ] {
        std::fs::write(
            &path,
            format!("[[boards]]\nname = \"p\"\nmember = \"m\"\n{extra}"),
        )
        .expect("write");
        let out = run_rollboard(&path, &["top", "p"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{extra}: {err}");
        assert!(err.contains(key), "{extra}: {err}");
    }
}

/// Tips of today and yesterday (UTC days, the current clock) in a scoped period board.
async fn seed_days(store: &Store, board: &Board, now: i64) -> (String, String) {
    let c = board.period.expect("period");
    let today = c.span_at(now);
    let yesterday = c.period.previous(c.zone, &today);
    // Yesterday's tips as they arrived yesterday (its grace may be over by now).
    let early = [
        ev("y1", yesterday.start_ms + 1, "alice", 7),
        ev("y2", yesterday.start_ms + 2, "bob", 9),
    ];
    store
        .apply(board, Some("room1"), &early, yesterday.start_ms + 3)
        .await
        .expect("apply");
    store
        .apply(
            board,
            Some("room1"),
            &[ev("t1", today.start_ms + 1, "alice", 3)],
            now,
        )
        .await
        .expect("apply");
    (today.id, yesterday.id)
}

const DAILY: &str = "[[boards]]\nname = \"daily\"\nmember = \"user\"\nscope = \"room\"\nperiod = \"day\"\nperiod_grace = \"1h\"\n";

/// The `DAILY` board, Redis's time, and today's and yesterday's ids after [`seed_days`]
/// (past 2 minutes before midnight UTC, it waits out the turn of the day first).
async fn seeded_daily(store: &Store) -> (Board, i64, String, String) {
    let board = Settings::from_toml(DAILY).expect("valid").boards.remove(0);
    let now = redis_now(store).await;
    // Near midnight UTC the test's "today" could turn while it runs.
    if board.period.expect("period").span_at(now).end_ms - now < 2 * MINUTE {
        tokio::time::sleep(std::time::Duration::from_millis(150_000)).await;
    }
    let now = redis_now(store).await;
    let (today, yesterday) = seed_days(store, &board, now).await;
    (board, now, today, yesterday)
}

/// A server, its config with the `DAILY` board (the API on `port`), and the board seeded
/// by [`seeded_daily`].
struct Daily {
    redis: RedisServer,
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    store: Store,
    board: Board,
    now: i64,
    today: String,
    yesterday: String,
}

async fn daily(port: u16) -> Daily {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &redis, port, "p", DAILY);
    let store = redis.store("rb").await;
    let (board, now, today, yesterday) = seeded_daily(&store).await;
    Daily {
        redis,
        _dir: dir,
        config,
        store,
        board,
        now,
        today,
        yesterday,
    }
}

/// `period=` over HTTP: current by default, previous, an id; a bad id or a period on a
/// rolling board is a 400, a closed period beyond `keep_periods` a 404; `GET
/// /v1/boards/{board}` says where the board stands.
#[tokio::test]
async fn http_answers_periods_and_the_board_state() {
    let port = free_port();
    let rig = daily(port).await;
    let (config, board, now) = (rig.config.clone(), rig.board.clone(), rig.now);
    let (today, yesterday) = (rig.today.clone(), rig.yesterday.clone());
    let daemon = Daemon::start(&config, port).await;

    let (status, body) = daemon.get("/v1/boards/daily/top?scope=room1").await;
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["period"], today.as_str());
    assert_eq!(page["scope"], "room1");
    assert_eq!(page["entries"][0]["member"], "alice");
    assert_eq!(page["entries"][0]["total"], 3);
    let (status, body) = daemon
        .get("/v1/boards/daily/top?scope=room1&period=previous")
        .await;
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["period"], yesterday.as_str());
    assert_eq!(page["count"], 2);
    assert_eq!(page["entries"][0]["member"], "bob");
    let (status, body) = daemon
        .get(&format!(
            "/v1/boards/daily/members/alice?scope=room1&period={yesterday}"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    let rank: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (rank["rank"].as_u64(), rank["total"].as_i64()),
        (Some(2), Some(7))
    );
    let (status, body) = daemon.get("/v1/boards/daily/members/bob?scope=room1").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains(&today) && !body.contains('@'), "{body}");
    for bad in ["yesterday", "2026-W48", "2026-1-01"] {
        let (status, body) = daemon
            .get(&format!("/v1/boards/daily/top?scope=room1&period={bad}"))
            .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    // The shape of a day's id that names no day: no such period, a 404.
    for missing in ["2026-13-01", "2026-02-30"] {
        let (status, body) = daemon
            .get(&format!(
                "/v1/boards/daily/top?scope=room1&period={missing}"
            ))
            .await;
        assert_eq!(status, 404, "{missing}: {body}");
        assert!(body.contains("no day has this id"), "{body}");
    }
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top?period=current").await;
    assert_eq!(status, 400);
    // A list of members re-ranked reads the period too, current unless named.
    let ranks = |body: &'static str| post_to(&daemon, "/v1/boards/daily/ranks", body);
    let (status, _, body) = ranks(r#"{"scope":"room1","members":["bob","alice"]}"#).await;
    assert_eq!(status, 200, "{body}");
    let subset: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (&subset["period"], &subset["window"], &subset["count"]),
        (
            &serde_json::json!(today),
            &serde_json::json!("day"),
            &serde_json::json!(1)
        )
    );
    assert_eq!(subset["entries"][0]["member"], "alice");
    assert_eq!(subset["entries"][1]["rank"], serde_json::Value::Null);
    let (status, _, body) =
        ranks(r#"{"scope":"room1","members":["alice","bob"],"period":"previous","window":"day"}"#)
            .await;
    assert_eq!(status, 200, "{body}");
    let subset: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(subset["period"], yesterday.as_str());
    let order: Vec<(&str, u64)> = subset["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["member"].as_str().unwrap_or(""),
                e["subset_rank"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(order, [("bob", 1), ("alice", 2)]);
    for bad in [
        r#"{"scope":"room1","members":["bob"],"period":"2026-1-01"}"#,
        r#"{"scope":"room1","members":["bob"],"window":"1d"}"#,
    ] {
        assert_eq!(ranks(bad).await.0, 400, "{bad}");
    }
    let missing = r#"{"scope":"room1","members":["bob"],"period":"2026-13-01"}"#;
    assert_eq!(ranks(missing).await.0, 404, "{missing}");
    // The oldest of the 12 closed days kept answers; the day before it is gone, a 404.
    let c = board.period.expect("period");
    let mut oldest = c.span_at(now);
    for _ in 0..12 {
        oldest = c.period.previous(c.zone, &oldest);
    }
    let gone = c.period.previous(c.zone, &oldest);
    let top = |id: &str| format!("/v1/boards/daily/top?scope=room1&period={id}");
    let (status, body) = daemon.get(&top(&oldest.id)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("\"period\":\"{}\"", oldest.id)),
        "{body}"
    );
    let (status, body) = daemon.get(&top(&gone.id)).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains(&gone.id) && body.contains("no longer kept"),
        "{body}"
    );

    let (status, body) = daemon.get("/v1/boards/daily").await;
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).expect("json");
    let span = board.period.expect("period").span_at(now);
    assert_eq!(state["period"], "day");
    assert_eq!(state["period_id"], today.as_str());
    assert_eq!(state["period_start"], span.start_ms);
    assert_eq!(state["next_reset"], span.end_ms);
    assert_eq!(state["archived_periods"], serde_json::json!([yesterday]));
    assert_eq!(state["window_ms"], serde_json::Value::Null);
    assert_eq!(state["dense_rank"], false);
    // The list describes the board as its own route does, less where the period stands.
    let (status, body) = daemon.get("/v1/boards").await;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("json");
    let mut listed = list["boards"]
        .as_array()
        .and_then(|boards| boards.iter().find(|b| b["name"] == "daily"))
        .cloned()
        .expect("daily listed");
    let mut own = state.clone();
    for field in [
        "period_id",
        "period_start",
        "next_reset",
        "archived_periods",
    ] {
        own.as_object_mut().expect("object").remove(field);
        listed.as_object_mut().expect("object").remove(field);
    }
    assert_eq!(listed, own);
    let (status, body) = daemon.get("/v1/boards/rooms_7d").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("period_id"), "{body}");
    let (status, _) = daemon.get("/v1/boards/nope").await;
    assert_eq!(status, 404);
    daemon.kill().await;
}

/// `--period` on the command line, in the shapes of HTTP; a bad one is a usage error.
#[tokio::test]
async fn cli_takes_period() {
    let rig = daily(1).await;
    let config = rig.config.clone();
    let (today, yesterday) = (rig.today.clone(), rig.yesterday.clone());
    let json = |args: &[&str]| {
        let out = run_rollboard(&config, args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default(),
        )
    };
    let (code, page) = json(&["top", "daily", "--scope", "room1", "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (page["period"].as_str(), page["count"].as_u64()),
        (Some(today.as_str()), Some(1))
    );
    let (code, page) = json(&[
        "top", "daily", "--scope", "room1", "--period", &yesterday, "--json",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(page["entries"][0]["member"], "bob");
    let (code, rank) = json(&[
        "rank", "daily", "bob", "--scope", "room1", "--period", "previous", "--json",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (rank["rank"].as_u64(), rank["scope"].as_str()),
        (Some(1), Some("room1"))
    );
    let (code, subset) = json(&[
        "rank", "daily", "alice", "bob", "--scope", "room1", "--period", "previous", "--json",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (subset["period"].as_str(), subset["window"].as_str()),
        (Some(yesterday.as_str()), Some("day"))
    );
    assert_eq!(subset["entries"][0]["member"], "bob");
    let (code, rank) = json(&["rank", "daily", "bob", "--scope", "room1", "--json"]);
    assert_eq!(code, Some(3));
    assert_eq!(rank["period"], today.as_str());
    let (code, page) = json(&[
        "around", "daily", "alice", "--scope", "room1", "--period", "previous", "--json",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(2));
    let out = run_rollboard(&config, &["top", "daily", "--scope", "room1"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("period {today}")));
    for args in [
        &["top", "daily", "--scope", "room1", "--period", "last-week"][..],
        &["top", "rooms_7d", "--period", "current"][..],
    ] {
        assert_eq!(
            run_rollboard(&config, args).status.code(),
            Some(2),
            "{args:?}"
        );
    }
}

/// `verify` names the rebuild of a damaged period by its scope and period id, and that
/// command repairs it.
#[tokio::test]
async fn verify_names_the_rebuild_of_a_damaged_period_and_it_repairs_it() {
    let rig = daily(1).await;
    let (redis, store, board) = (&rig.redis, &rig.store, &rig.board);
    let (config, yesterday) = (rig.config.clone(), rig.yesterday.clone());
    let instance = rollboard::domain::board::period_instance(Some("room1"), &yesterday);
    let result = store.instance(&board.widest(), Some(&instance)).result();
    redis.cli(&["DEL", &result]);
    let out = run_rollboard(&config, &["verify", "--board", "daily"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let repair = format!("rollboard rebuild daily --scope room1 --period {yesterday}");
    assert!(text.contains(&repair), "{text}");
    let out = run_rollboard(
        &config,
        &[
            "rebuild", "daily", "--scope", "room1", "--period", &yesterday,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("rebuilt 1 instance(s) of daily: 1 repaired"),
        "{text}"
    );
    let out = run_rollboard(&config, &["verify", "--board", "daily"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("0 differing"), "{text}");
    let page: serde_json::Value = serde_json::from_slice(
        &run_rollboard(
            &config,
            &[
                "top", "daily", "--scope", "room1", "--period", &yesterday, "--json",
            ],
        )
        .stdout,
    )
    .expect("json");
    assert_eq!(page["entries"][0]["member"], "bob");
    assert_eq!(page["entries"][0]["total"], 9);
    assert_eq!(
        run_rollboard(
            &config,
            &["rebuild", "daily", "--scope", "room1", "--period", "x"]
        )
        .status
        .code(),
        Some(2)
    );
}
