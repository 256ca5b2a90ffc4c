//! A board with `windows = ["2h", "6h"]` as readers meet it: `window=` (and `--window`)
//! picks the window's own totals, the first listed by default, an unlisted window is a
//! 400 (exit 2) naming the board's windows; `all_windows=true` (`rank --all-windows`)
//! answers the member in every window, exact after a roll that drops an event from the
//! narrow window only; the board's description lists its windows; each window has its
//! own change stream.

use std::path::PathBuf;
use std::time::Duration;

use rollboard::store::Store;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::boards::{redis_now, DAY, HOUR};
use crate::support::cli::{assert_success, run_rollboard, stderr, stdout};
use crate::support::config::{append_config, server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::http::{answer_parts, get, json, post, post_tip, post_to};
use crate::support::keys::schema;
use crate::support::redis::RedisServer;
use crate::support::sse::{open_stream, Sse, SseEvent};
use crate::support::wait::drained;

const WAIT: Duration = Duration::from_secs(10);

/// Besides the test boards: `duo` ranks players' points over the last 2 and the last 6
/// hours (2 h listed first), with two decimals and a change feed; `duo_rooms` the same per
/// table. Their events match no other board.
const DUO_BOARDS: &str = concat!(
    "\n[[boards]]\nname = \"duo\"\nmember = \"player\"\namount = \"points\"\nscale = 2\n",
    "windows = [\"2h\", \"6h\"]\nslice = \"1h\"\nchanges_top = 10\n",
    "\n[[boards]]\nname = \"duo_rooms\"\nmember = \"player\"\nscope = \"table\"\n",
    "amount = \"points\"\nscale = 2\nwindows = [\"2h\", \"6h\"]\nslice = \"1h\"\n",
);

/// POSTs one event of the `duo` boards (table t1), asserting it is taken.
async fn post_points(daemon: &Daemon, id: &str, ts: i64, player: &str, points: &str) {
    let body = format!(
        r#"{{"id":"{id}","ts":{ts},"table":"t1","player":"{player}","points":"{points}"}}"#
    );
    let (status, _, answer) = post(daemon, &body).await;
    assert_eq!(status, 202, "{answer}");
}

/// A daemon with the `duo` boards and four events applied, all to table t1: in the current
/// hourly slice `n` bob 0.50 and ann 0.20 (in both windows), in slice `n - 3` ann 1.00 and
/// cara 5.00 (in the 6 h window only). So the 2 h window ranks bob 50, ann 20 and the 6 h
/// window cara 500, ann 120, bob 50. Both stay so when the clock enters the next slice
/// meanwhile (slice `n` is live in the 2 h window until slice `n + 2`).
struct Duo {
    redis: RedisServer,
    store: Store,
    _dir: TempDir,
    config: PathBuf,
    daemon: Daemon,
    /// The slice of the first tips (Redis's clock when they were sent).
    n: i64,
}

async fn duo() -> Duo {
    let (redis, dir, port, config) =
        server_and_config(|dir, redis, port| write_config(dir, redis, port, "duo", ""));
    append_config(&config, DUO_BOARDS);
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    let n = now.div_euclid(HOUR);
    let earlier = (n - 3) * HOUR + 1_000;
    for (id, ts, user, amount) in [
        ("d1", earlier, "ann", "1"),
        ("d2", now, "ann", "0.20"),
        ("d3", now, "bob", "0.50"),
        ("d4", earlier, "cara", "5"),
    ] {
        post_points(&daemon, id, ts, user, amount).await;
    }
    // And one tip of the test boards, to room r1 (a board with one window).
    let (status, _, body) = post_tip(&daemon, "r", now, "r1", "u1", "5").await;
    assert_eq!(status, 202, "{body}");
    assert!(drained(&store).await, "the events were not applied");
    Duo {
        redis,
        store,
        _dir: dir,
        config,
        daemon,
        n,
    }
}

/// GETs `path`, asserting `want`; the body as JSON.
async fn get_json(daemon: &Daemon, path: &str, want: u16) -> Value {
    let (status, _, body) = get(daemon, path).await;
    assert_eq!(status, want, "{path}: {body}");
    json(&body)
}

/// GETs every window's answer for `member` of `board` (`query`: what goes before
/// `all_windows=true` in the query, e.g. `scope=t1&`); it must be a 200.
async fn all_windows(daemon: &Daemon, board: &str, member: &str, query: &str) -> Value {
    let path = format!("/v1/boards/{board}/members/{member}?{query}all_windows=true");
    get_json(daemon, &path, 200).await
}

/// `(member, total)` of each entry of a page.
fn entries(page: &Value) -> Vec<(String, i64)> {
    page["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries: {page}"))
        .iter()
        .map(|e| {
            (
                e["member"].as_str().expect("member").to_string(),
                e["total"].as_i64().expect("total"),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, i64)]) -> Vec<(String, i64)> {
    list.iter().map(|(m, t)| (m.to_string(), *t)).collect()
}

/// `rollboard <args>` on `config`: exit status, standard output as JSON (null when it
/// is not JSON), standard error.
fn cli(config: &std::path::Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = run_rollboard(config, args);
    let answer = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    (out.status.code(), answer, stderr(&out))
}

#[tokio::test]
async fn window_picks_the_windows_own_totals_the_first_by_default() {
    let d = duo().await;
    let daemon = &d.daemon;
    let narrow = pairs(&[("bob", 50), ("ann", 20)]);
    let wide = pairs(&[("cara", 500), ("ann", 120), ("bob", 50)]);

    // top: the first listed window by default; a window by its name or an equal duration.
    for (path, window, want) in [
        ("/v1/boards/duo/top", "2h", &narrow),
        ("/v1/boards/duo/top?window=2h", "2h", &narrow),
        ("/v1/boards/duo/top?window=120m", "2h", &narrow),
        ("/v1/boards/duo/top?window=6h", "6h", &wide),
        ("/v1/boards/duo/top?window=360m", "6h", &wide),
        ("/v1/boards/duo_rooms/top?scope=t1&window=6h", "6h", &wide),
        ("/v1/boards/duo_rooms/top?scope=t1", "2h", &narrow),
    ] {
        let page = get_json(daemon, path, 200).await;
        assert_eq!(page["window"], window, "{path}: {page}");
        assert_eq!(&entries(&page), want, "{path}: {page}");
        assert_eq!(page["count"], want.len(), "{path}: {page}");
        let width =
            page["window_to"].as_i64().expect("to") - page["window_from"].as_i64().expect("from");
        let hours = if window == "2h" { 2 } else { 6 };
        assert_eq!(width, hours * HOUR, "{path}: {page}");
    }
    // A board with one window names it as its configuration writes it.
    let page = get_json(daemon, "/v1/boards/rooms_7d/top?window=7d", 200).await;
    assert_eq!(page["window"], "7d", "{page}");
    let page = get_json(daemon, "/v1/boards/tips_24h/top", 200).await;
    assert_eq!(page["window"], "24h", "{page}");

    // One member, and the entries around it, in each window.
    let ann = get_json(daemon, "/v1/boards/duo/members/ann", 200).await;
    assert_eq!(
        (
            &ann["window"],
            &ann["rank"],
            &ann["total"],
            &ann["count"],
            &ann["scale"]
        ),
        (&json!("2h"), &json!(2), &json!(20), &json!(2), &json!(2)),
        "{ann}"
    );
    let ann = get_json(daemon, "/v1/boards/duo/members/ann?window=6h", 200).await;
    assert_eq!(
        (&ann["window"], &ann["rank"], &ann["total"], &ann["count"]),
        (&json!("6h"), &json!(2), &json!(120), &json!(3)),
        "{ann}"
    );
    let cara = get_json(daemon, "/v1/boards/duo/members/cara", 404).await;
    assert_eq!(cara["window"], "2h", "{cara}");
    assert_eq!(cara["rank"], Value::Null, "{cara}");
    let around = get_json(
        daemon,
        "/v1/boards/duo/members/bob/around?window=6h&radius=1",
        200,
    )
    .await;
    assert_eq!(around["window"], "6h", "{around}");
    assert_eq!(entries(&around), pairs(&[("ann", 120), ("bob", 50)]));
    get_json(daemon, "/v1/boards/duo/members/cara/around", 404).await;

    // A list of members re-ranked, in the window the body names.
    let ranks = |body: &'static str| async move {
        let (status, _, answer) = post_to(daemon, "/v1/boards/duo/ranks", body).await;
        (status, json(&answer))
    };
    let (status, subset) = ranks(r#"{"members":["ann","cara"],"window":"6h"}"#).await;
    assert_eq!(status, 200, "{subset}");
    assert_eq!(subset["window"], "6h", "{subset}");
    let ranked: Vec<(Value, Value, Value)> = subset["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["member"].clone(), e["rank"].clone(), e["total"].clone()))
        .collect();
    assert_eq!(
        ranked,
        vec![
            (json!("cara"), json!(1), json!(500)),
            (json!("ann"), json!(2), json!(120))
        ]
    );
    let (status, subset) = ranks(r#"{"members":["ann","cara"]}"#).await;
    assert_eq!(status, 200, "{subset}");
    assert_eq!(subset["window"], "2h", "{subset}");
    assert_eq!(subset["entries"][0]["total"], 20, "{subset}");
    assert_eq!(subset["entries"][1]["rank"], Value::Null, "{subset}");

    // A window the board does not rank: a 400 naming the board's windows, on every route.
    for path in [
        "/v1/boards/duo/top?window=12h",
        "/v1/boards/duo/top?window=1h",
        "/v1/boards/duo/top?window=two%20hours",
        "/v1/boards/duo/top?window=",
        "/v1/boards/duo/members/ann?window=1d",
        "/v1/boards/duo/members/ann/around?window=3h",
        "/v1/boards/duo_rooms/top?scope=t1&window=12h",
    ] {
        let error = get_json(daemon, path, 400).await;
        let text = error["error"].as_str().expect("error");
        assert!(text.contains("2h, 6h"), "{path}: {text}");
    }
    let error = get_json(daemon, "/v1/boards/rooms_7d/top?window=6h", 400).await;
    assert!(
        error["error"]
            .as_str()
            .expect("error")
            .contains("one window, 7d"),
        "{error}"
    );
    let (status, error) = ranks(r#"{"members":["ann"],"window":"3h"}"#).await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"].as_str().expect("error").contains("2h, 6h"),
        "{error}"
    );

    // The board's description lists its windows as written, in order; window_ms is the
    // first's, the one queries read by default.
    let board = get_json(daemon, "/v1/boards/duo", 200).await;
    assert_eq!(
        board["windows"],
        json!([{"name": "2h", "ms": 2 * HOUR}, {"name": "6h", "ms": 6 * HOUR}]),
        "{board}"
    );
    assert_eq!(board["window_ms"], 2 * HOUR, "{board}");
    assert_eq!(board["slice_ms"], HOUR, "{board}");
    let listed = get_json(daemon, "/v1/boards", 200).await;
    let rooms = listed["boards"]
        .as_array()
        .expect("boards")
        .iter()
        .find(|b| b["name"] == "rooms_7d")
        .expect("rooms_7d listed")
        .clone();
    assert_eq!(
        rooms["windows"],
        json!([{"name": "7d", "ms": 7 * DAY}]),
        "{rooms}"
    );
    assert_eq!(rooms["window_ms"], 7 * DAY, "{rooms}");

    // The command line: --window, the same answers, the same refusals (exit 2).
    let config = &d.config;
    let (code, page, err) = cli(config, &["top", "duo", "--window", "6h", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(page["window"], "6h", "{page}");
    assert_eq!(entries(&page), wide);
    let (code, page, err) = cli(config, &["top", "duo", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        (page["window"].as_str(), entries(&page)),
        (Some("2h"), narrow)
    );
    let (code, rank, err) = cli(
        config,
        &["rank", "duo", "ann", "--window", "360m", "--json"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        (&rank["window"], &rank["total"]),
        (&json!("6h"), &json!(120)),
        "{rank}"
    );
    let (code, rank, _) = cli(config, &["rank", "duo", "cara", "--json"]);
    assert_eq!(code, Some(3));
    assert_eq!(
        (&rank["window"], &rank["rank"]),
        (&json!("2h"), &Value::Null),
        "{rank}"
    );
    let (code, page, err) = cli(
        config,
        &[
            "around", "duo", "bob", "--window", "6h", "--radius", "1", "--json",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(entries(&page), pairs(&[("ann", 120), ("bob", 50)]));
    let (code, subset, err) = cli(
        config,
        &["rank", "duo", "ann", "cara", "--window", "6h", "--json"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(subset["window"], "6h", "{subset}");
    assert_eq!(subset["entries"][0]["member"], "cara", "{subset}");
    for args in [
        &["top", "duo", "--window", "12h"][..],
        &["rank", "duo", "ann", "--window", "1h"],
        &["rank", "duo", "ann", "bob", "--window", "1h"],
        &["around", "duo", "ann", "--window", "7d"],
    ] {
        let (code, _, err) = cli(config, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("2h, 6h") && err.contains("--window"),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn all_windows_answers_the_member_in_every_window_exactly_after_a_roll() {
    let d = duo().await;
    let daemon = &d.daemon;
    let n = d.n;
    let window = |name: &str, rank: Value, total: Value, count: u64, pct: Value| {
        json!({"window": name, "rank": rank, "competition_rank": rank, "total": total,
               "count": count, "percentile": pct})
    };
    // The fields compared: all of them but the live range, checked apart.
    let strip = |answer: &Value| -> Value {
        let mut answer = answer.clone();
        for w in answer["windows"].as_array_mut().expect("windows") {
            let w = w.as_object_mut().expect("window");
            w.remove("window_from");
            w.remove("window_to");
        }
        answer
    };
    let expect = |member: &str, scope: Value, windows: Vec<Value>| {
        json!({"board": if scope.is_null() { "duo" } else { "duo_rooms" }, "scope": scope,
               "scale": 2, "member": member, "windows": windows})
    };

    // ann's windows, the same in the unscoped board and in table t1 of the scoped one.
    let ann_windows = vec![
        window("2h", json!(2), json!(20), 2, json!(0)),
        window("6h", json!(2), json!(120), 3, json!(33.33)),
    ];
    let ann = all_windows(daemon, "duo", "ann", "").await;
    let want = expect("ann", Value::Null, ann_windows.clone());
    assert_eq!(strip(&ann), want, "{ann}");
    let cara = all_windows(daemon, "duo", "cara", "").await;
    assert_eq!(
        strip(&cara),
        expect(
            "cara",
            Value::Null,
            vec![
                window("2h", Value::Null, Value::Null, 2, Value::Null),
                window("6h", json!(1), json!(500), 3, json!(66.66)),
            ]
        ),
        "{cara}"
    );
    // A scoped board reads the scope's instance in each window.
    let scoped = all_windows(daemon, "duo_rooms", "ann", "scope=t1&").await;
    let want = expect("ann", json!("t1"), ann_windows);
    assert_eq!(strip(&scoped), want, "{scoped}");
    // A board with one window answers a list of one; a member ranked nowhere is no 404.
    let one = all_windows(daemon, "rooms_7d", "r1", "").await;
    let windows = one["windows"].as_array().expect("windows");
    assert_eq!(windows.len(), 1, "{one}");
    assert_eq!(
        (&windows[0]["window"], &windows[0]["rank"]),
        (&json!("7d"), &json!(1))
    );
    let nobody = all_windows(daemon, "duo", "nobody", "").await;
    assert!(
        nobody["windows"]
            .as_array()
            .expect("windows")
            .iter()
            .all(|w| w["rank"].is_null() && w["total"].is_null()),
        "{nobody}"
    );
    // Beside a window= of the board, every window all the same; beside one it does not
    // rank, or not a boolean, refused.
    let every = all_windows(daemon, "duo", "ann", "").await;
    let beside = get_json(
        daemon,
        "/v1/boards/duo/members/ann?all_windows=true&window=2h",
        200,
    )
    .await;
    assert_eq!(beside, every);
    for path in [
        "/v1/boards/duo/members/ann?all_windows=true&window=5h",
        "/v1/boards/duo/members/ann?all_windows=yes",
    ] {
        get_json(daemon, path, 400).await;
    }
    // The command line answers the same object.
    let config = &d.config;
    let (code, answer, err) = cli(config, &["rank", "duo", "ann", "--all-windows", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(strip(&answer), strip(&ann));
    let (code, _, _) = cli(
        config,
        &["rank", "duo", "nobody", "--all-windows", "--json"],
    );
    assert_eq!(code, Some(3), "ranked in no window");
    for args in [
        &["rank", "duo", "ann", "--all-windows", "--window", "2h"][..],
        &["rank", "duo", "ann", "bob", "--all-windows"],
    ] {
        let (code, _, err) = cli(config, args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }

    // Two hours on, slice n leaves the 2 h window: ann's 0.20 and bob drop from it; the
    // 6 h window keeps everything (its watermark n - 4 is below slice n - 3).
    let at = ((n + 2) * HOUR).to_string();
    let out = run_rollboard(config, &["roll", "--at", &at, "--force"]);
    assert_success(&out, "roll");
    // The roll is the command line's, another process: the daemon's answers show it
    // within http.max_staleness.
    let narrow = json!({"window": "2h", "rank": null, "competition_rank": null, "total": null,
        "count": 0, "percentile": null, "window_from": (n + 1) * HOUR, "window_to": (n + 3) * HOUR});
    let wide = json!({"window": "6h", "rank": 2, "competition_rank": 2, "total": 120,
        "count": 3, "percentile": 33.33, "window_from": (n - 3) * HOUR, "window_to": (n + 3) * HOUR});
    let want = json!({"board": "duo", "scope": null, "scale": 2, "member": "ann",
               "windows": [narrow, wide]});
    let (status, body) = daemon
        .get_once("/v1/boards/duo/members/ann?all_windows=true", |_, b| {
            serde_json::from_str::<Value>(b).ok().as_ref() == Some(&want)
        })
        .await;
    assert_eq!(status, 200, "{body}");
    let ann = json(&body);
    assert_eq!(ann, want);
    let (status, body) = daemon
        .get_once(
            "/v1/boards/duo_rooms/members/ann?scope=t1&all_windows=true",
            |_, b| serde_json::from_str::<Value>(b).is_ok_and(|v| v["windows"] == ann["windows"]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let scoped = json(&body);
    assert_eq!(scoped["windows"], ann["windows"], "{scoped}");
    let (code, answer, err) = cli(config, &["rank", "duo", "ann", "--all-windows", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(answer, ann);
    let (status, body) = daemon
        .get_once("/v1/boards/duo/top", |_, b| {
            serde_json::from_str::<Value>(b).is_ok_and(|v| v["count"] == 0)
        })
        .await;
    assert_eq!(status, 200, "{body}");
    let page = json(&body);
    assert_eq!(
        (page["window"].as_str(), page["count"].as_u64()),
        (Some("2h"), Some(0))
    );
    // Each window's live range, as its own member answer gives it.
    for (i, name) in ["2h", "6h"].iter().enumerate() {
        let path = format!("/v1/boards/duo/members/cara?window={name}");
        let w = &ann["windows"][i];
        let (_, body) = daemon
            .get_once(&path, |_, b| {
                serde_json::from_str::<Value>(b).is_ok_and(|v| v["window_from"] == w["window_from"])
            })
            .await;
        let one = json(&body);
        assert_eq!(
            (&w["window_from"], &w["window_to"]),
            (&one["window_from"], &one["window_to"]),
            "{name}: {ann} vs {one}"
        );
    }
}

#[tokio::test]
async fn each_window_streams_its_own_changes() {
    let d = duo().await;
    let daemon = &d.daemon;
    let mut narrow = Sse::open(daemon, "/v1/boards/duo/changes", None).await;
    let mut wide = Sse::open(daemon, "/v1/boards/duo/changes?window=6h", None).await;
    let mut by_duration = Sse::open(daemon, "/v1/boards/duo/changes?window=120m", None).await;
    let now = redis_now(&d.store).await;
    let n = now.div_euclid(HOUR);
    // dan enters the 6 h window only; then eve tops both.
    post_points(daemon, "d5", (n - 3) * HOUR + 2_000, "dan", "0.10").await;
    assert!(drained(&d.store).await, "dan was not applied");
    post_points(daemon, "d6", now, "eve", "9").await;
    assert!(drained(&d.store).await, "eve was not applied");

    let entered = |event: Option<SseEvent>| -> (String, i64, i64) {
        let event = event.expect("an event");
        assert_eq!(event.event.as_deref(), Some("entered"), "{event:?}");
        let data = json(&event.data);
        assert_eq!(data["scale"], 2, "{data}");
        (
            data["member"].as_str().expect("member").to_string(),
            data["rank"].as_i64().expect("rank"),
            data["total"].as_i64().expect("total"),
        )
    };
    assert_eq!(entered(wide.next_event(WAIT).await), ("dan".into(), 4, 10));
    assert_eq!(entered(wide.next_event(WAIT).await), ("eve".into(), 1, 900));
    for stream in [&mut narrow, &mut by_duration] {
        assert_eq!(
            entered(stream.next_event(WAIT).await),
            ("eve".into(), 1, 900)
        );
    }
    // The streams are the windows' own: the widest's key has no suffix, dan is only in it.
    let wide_feed = d
        .redis
        .cli(&["XRANGE", &schema().changes("duo", None, None), "-", "+"]);
    let narrow_feed = d.redis.cli(&[
        "XRANGE",
        &schema().changes("duo", None, Some("2h")),
        "-",
        "+",
    ]);
    assert!(
        wide_feed.contains("dan") && wide_feed.contains("eve"),
        "{wide_feed}"
    );
    assert!(
        !narrow_feed.contains("dan") && narrow_feed.contains("eve"),
        "{narrow_feed}"
    );

    for path in [
        "/v1/boards/duo/changes?window=12h",
        "/v1/boards/duo/changes?window=1h",
    ] {
        let (status, _, body) = answer_parts(open_stream(daemon, path, None, None).await).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            json(&body)["error"]
                .as_str()
                .expect("error")
                .contains("2h, 6h"),
            "{body}"
        );
    }
}
