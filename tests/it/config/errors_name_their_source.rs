//! Configuration errors name where the value came from (file, environment, flag), and a
//! binary config file is not shown but its path is named once.

use std::path::Path;

use crate::support::cli::{
    assert_configs_refused_naming, assert_contains, rollboard, run_rollboard, stderr,
};
use crate::support::config::{edit_config, write_config_url};

#[test]
fn a_binary_config_is_not_shown_and_its_path_is_named_once() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("binary.toml");
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&path, &bytes).expect("write");
    let out = run_rollboard(&path, &["top", "x"]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("binary.toml").count(), 1, "{err}");
    assert!(err.len() < 300, "{err}");
    assert_configs_refused_naming(
        &path,
        &[
            (
                "[ingest]\nbatch_size = 99999999999999999999\n[[boards]]\nname = \"r\"\nmember = \"m\"\nwindow = \"10000000000d\"\nslice = \"1d\"\n",
                "batch_size",
            ),
            (
                "[[boards]]\nname = \"r\"\nmember = \"m\"\nwindow = \"10000000000d\"\nslice = \"1d\"\n",
                "boards[0].window",
            ),
        ],
    );
}

fn config_with(dir: &Path, extra: &str) -> std::path::PathBuf {
    write_config_url(dir, "redis://127.0.0.1:1", 1, "cfg", extra)
}

/// A configuration error names the environment variable that set the key, or the file.
#[test]
fn configuration_errors_name_where_the_value_came_from() {
    let dir = tempfile::tempdir().expect("dir");
    let config = config_with(dir.path(), "");
    let shown = config.display().to_string();
    let cases: [(&[(&str, &str)], &str); 4] = [
        (
            &[("ROLLBOARD__SCHEDULE__CHUNK", "0")],
            "(set by environment variable ROLLBOARD__SCHEDULE__CHUNK)",
        ),
        (
            &[("ROLLBOARD__SCHEDULE__CHUNK", "many")],
            "environment variable ROLLBOARD__SCHEDULE__CHUNK: invalid type",
        ),
        (
            &[("ROLLBOARD__HTTP__LISTN", "127.0.0.1:1")],
            "environment variable ROLLBOARD__HTTP__LISTN: unknown field `listn`",
        ),
        (
            &[("ROLLBOARD__HTTP__LISTEN", "nowhere")],
            "`http.listen` = \"nowhere\": not a socket address",
        ),
    ];
    for (env, expected) in cases {
        let out = rollboard(Some(&config), &["top", "rooms_7d"], env);
        assert_eq!(out.status.code(), Some(64), "{env:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{env:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains(&shown) || expected.contains(&shown),
            "{env:?}: blames the file: {}",
            stderr(&out)
        );
    }
    let out = rollboard(
        Some(&config),
        &["top", "rooms_7d"],
        &[("ROLLBOARD__HTTP__LISTEN", "nowhere")],
    );
    assert!(stderr(&out).contains("(set by environment variable ROLLBOARD__HTTP__LISTEN)"));
    // The same mistakes in the file name the file.
    let bad = config_with(dir.path(), "");
    for (from, to, expected) in [
        (
            "[schedule]\n",
            "[schedule]\nchunk = 0\n",
            "(set by file {})",
        ),
        ("chunk = 0", "chunk = \"many\"", "{}: invalid type"),
    ] {
        edit_config(&bad, from, to);
        let out = rollboard(Some(&bad), &["top", "rooms_7d"], &[]);
        assert_eq!(out.status.code(), Some(64), "{to}");
        let expected = expected.replace("{}", &bad.display().to_string());
        assert_contains(&stderr(&out), &expected);
    }
}
