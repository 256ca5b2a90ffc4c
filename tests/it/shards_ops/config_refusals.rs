//! `shards` in the configuration: 1 to 64, more than one only on an unscoped rolling
//! board without a dense rank or a change feed; each refusal names `boards[i].shards`
//! and says why, from the library and from the command line (exit 64). `shards = 1` is
//! the plain board: the same keys, the same fingerprint and settings record as a board
//! that does not set it.

use rollboard::config::Settings;
use rollboard::store::Outcome;

use crate::support::boards::{apply_events, ev, keys_matching, redis_now};
use crate::support::cli::{assert_exit, rollboard, run_rollboard, stderr, stdout};
use crate::support::http::json;
use crate::support::keys::{instance, prefix, schema, under};
use crate::support::redis::RedisServer;

/// A board `r` (the second board of the file, so `boards[1]`) with `extra` lines, after a
/// plain board `first`.
fn config(extra: &str) -> String {
    format!(
        "[[boards]]\nname = \"first\"\nmember = \"user\"\nwindow = \"1h\"\nslice = \"1m\"\n\n\
         [[boards]]\nname = \"r\"\nmember = \"user\"\n{extra}\n"
    )
}

#[test]
fn every_refusal_of_shards_names_the_key_and_says_why() {
    let window = "window = \"6h\"\nslice = \"1h\"";
    let cases: [(String, &str); 8] = [
        (
            format!("{window}\nshards = 0"),
            "invalid configuration: `boards[1].shards` = \"0\": must be between 1 and 64",
        ),
        (
            format!("{window}\nshards = 65"),
            "invalid configuration: `boards[1].shards` = \"65\": must be between 1 and 64",
        ),
        (
            format!("{window}\nshards = -3"),
            "invalid configuration: `boards[1].shards` = \"-3\": must be between 1 and 64",
        ),
        (
            format!("{window}\nshards = 4\nscope = \"room\""),
            "invalid configuration: `boards[1].shards` = \"4\": a scoped board's instances are spread by scope already",
        ),
        (
            "period = \"week\"\nshards = 2".to_string(),
            "invalid configuration: `boards[1].shards` = \"2\": a period board cannot be sharded",
        ),
        (
            format!("{window}\nshards = 2\ndense_rank = true"),
            "invalid configuration: `boards[1].shards` = \"2\": a dense rank cannot be kept exact across shards",
        ),
        (
            format!("{window}\nshards = 64\nchanges_top = 10"),
            "invalid configuration: `boards[1].shards` = \"64\": a change feed follows one instance's top, not the shards'",
        ),
        (
            // With several windows: still refused for the same reason.
            "windows = [\"2h\", \"6h\"]\nslice = \"1h\"\nshards = 3\ndense_rank = true".to_string(),
            "invalid configuration: `boards[1].shards` = \"3\": a dense rank cannot be kept exact across shards",
        ),
    ];
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.toml");
    for (extra, want) in &cases {
        let text = config(extra);
        let err = match Settings::from_toml(&text) {
            Ok(_) => panic!("accepted: {extra}"),
            Err(e) => e.to_string(),
        };
        assert_eq!(err, *want, "{extra}");
        // The command line refuses it too, before it connects anywhere.
        std::fs::write(&path, &text).expect("write");
        let out = rollboard(Some(&path), &["top", "r"], &[]);
        assert_eq!(out.status.code(), Some(64), "{extra}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{extra}: {}", stderr(&out));
    }
}

#[test]
fn the_settings_shards_allows_are_accepted() {
    let cases = [
        ("window = \"6h\"\nslice = \"1h\"\nshards = 1\nscope = \"room\"", 1),
        ("period = \"week\"\nshards = 1", 1),
        ("window = \"6h\"\nslice = \"1h\"\nshards = 1\ndense_rank = true\nchanges_top = 5", 1),
        ("window = \"6h\"\nslice = \"1h\"\nshards = 64", 64),
        ("windows = [\"2h\", \"6h\"]\nslice = \"1h\"\nshards = 2\nmode = \"resummarize\"", 2),
        ("window = \"6h\"\nslice = \"1h\"\nshards = 2\ntie_break = \"none\"\nallow_negative = true", 2),
    ];
    for (extra, k) in cases {
        let settings =
            Settings::from_toml(&config(extra)).unwrap_or_else(|e| panic!("{extra}: {e}"));
        let b = settings.board("r").expect("r");
        assert_eq!(b.shards, k, "{extra}");
        assert_eq!(b.is_sharded(), k > 1, "{extra}");
        assert_eq!(b.shard_names().len(), if k > 1 { k as usize } else { 0 });
    }
}

/// `shards = 1` is the board without `shards`: one instance under the board's own hash
/// tag, the same fingerprint, no `shards` in the settings record; a board written
/// without `shards` opens with `shards = 1` and the other way round.
#[tokio::test]
async fn one_shard_is_the_plain_board() {
    let plain = Settings::from_toml(&config("window = \"6h\"\nslice = \"1h\""))
        .expect("plain")
        .board("r")
        .expect("r")
        .clone();
    let one = Settings::from_toml(&config("window = \"6h\"\nslice = \"1h\"\nshards = 1"))
        .expect("one")
        .board("r")
        .expect("r")
        .clone();
    assert_eq!(one, plain);
    assert_eq!(one.widest().fingerprint(), plain.widest().fingerprint());
    assert!(
        !one.widest().fingerprint().contains("shards"),
        "{}",
        one.widest().fingerprint()
    );
    assert_eq!(one.shard_of("ann"), None);
    assert!(!one.has_many_instances());

    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("c.toml");
    let with = |extra: &str| {
        format!(
            "[redis]\nurl = \"{}\"\n{}",
            redis.url(),
            config(&format!("window = \"6h\"\nslice = \"1h\"{extra}"))
        )
    };
    std::fs::write(&path, with("\nshards = 1")).expect("write");
    assert_exit(&run_rollboard(&path, &["verify"]), 0, "first run");
    let now = redis_now(&store).await;
    let out = apply_events(&store, &one, &[ev("1", now, "ann", 7)], now).await;
    assert_eq!(out, [Outcome::Applied]);
    let mut keys = keys_matching(&store, &format!("{}:{{r*", prefix())).await;
    keys.sort();
    assert!(
        !keys.is_empty()
            && keys
                .iter()
                .all(|k| k.starts_with(&under(&instance("r", None), ""))),
        "{keys:?}"
    );
    assert_eq!(
        redis
            .cli(&["HEXISTS", &schema().settings("r"), "shards"])
            .trim(),
        "0"
    );
    assert_eq!(redis.cli(&["ZCARD", &schema().scopes("r")]).trim(), "0");
    std::fs::write(&path, with("")).expect("write");
    let out = run_rollboard(&path, &["rank", "r", "ann", "--json"]);
    assert_exit(&out, 0, "without shards");
    assert_eq!(json(&stdout(&out))["total"], 7);
    std::fs::write(&path, with("\nshards = 1")).expect("write");
    assert_exit(&run_rollboard(&path, &["verify"]), 0, "shards = 1 again");
}
