//! The permissions rollboard's Lua library needs (`FCALL`, `FUNCTION LOAD`, `FUNCTION
//! LIST`): a user without one is refused at start, naming it.

use std::time::Duration;

use crate::support::acl::{acl_server, acl_url, PASSWORD};
use crate::support::cli::rollboard;
use crate::support::config::write_config_url;
use crate::support::redis::free_port;

/// For each of the three library permissions taken from the shipped ACL user: `rollboard
/// run` exits by itself with 64, naming the command, and so does a CLI query.
#[tokio::test]
async fn a_user_without_a_library_permission_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    for (rule, named) in [
        ("+function|load", "FUNCTION LOAD"),
        ("+function|list", "FUNCTION LIST"),
        ("+fcall", "FCALL"),
    ] {
        let redis = acl_server(dir.path(), &[rule]);
        let http_port = free_port();
        let config = write_config_url(dir.path(), &acl_url(&redis), http_port, "nolib", "");
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
            .arg("--config")
            .arg(&config)
            .arg("run")
            .env_remove("ROLLBOARD_CONFIG")
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .unwrap_or_else(|_| panic!("{rule}: the daemon kept retrying"))
            .expect("run rollboard");
        let shown = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(64), "{rule}: {shown}");
        assert!(shown.contains(named), "{rule}: {shown}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        let out = rollboard(Some(&config), &["top", "rooms_7d"], &[]);
        let shown = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(64), "{rule}: {shown}");
        assert!(shown.contains(named), "{rule}: {shown}");
    }
}
