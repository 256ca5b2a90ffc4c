//! rollboard's Lua library taken away while the daemon ingests (`FUNCTION FLUSH`,
//! `FUNCTION DELETE`), beside the library of an older release.

use std::time::Duration;

use rollboard::store::{Reconnect, Store};

use crate::support::asserts::assert_drained_into_model_at;
use crate::support::boards::now_ms;
use crate::support::config::config_for_url;
use crate::support::daemon::Daemon;
use crate::support::events::{tip, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

/// A library as an older release left it: its functions have this build's short names
/// under another version, and each answers an error, so a call of one would show.
const OLD_VERSION: &str = "0000000000aa";

fn old_library() -> String {
    let mut text = format!("#!lua name=rollboard_{OLD_VERSION}\n");
    for (file, _) in rollboard::store::lua::SCRIPTS {
        let short = file.trim_end_matches(".lua");
        text.push_str(&format!(
            "redis.register_function('rollboard_{OLD_VERSION}_{short}', \
             function() return redis.error_reply('OLD release called') end)\n"
        ));
    }
    text
}

/// The libraries the server holds, by name.
fn libraries(redis: &RedisServer) -> Vec<String> {
    let listed = redis.cli(&["FUNCTION", "LIST"]);
    let lines: Vec<&str> = listed.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "library_name")
        .map(|w| w[1].to_string())
        .collect()
}

/// Waves of events, the library flushed or deleted while each is being applied, with an
/// older release's library beside it: every board ends exactly in the model state, nothing
/// is dead-lettered, the older library is left as it was and never called, and `/readyz`
/// puts this build's library back when it is missing.
#[tokio::test]
async fn a_library_flushed_mid_ingest_loses_and_doubles_nothing() {
    let redis = RedisServer::start();
    redis.cli(&["FUNCTION", "LOAD", &old_library()]);
    let store = Store::connect(&redis.url(), "rb", 2, Reconnect::Forever)
        .await
        .expect("connect");
    let (_dir, port, config) = config_for_url(&redis.url(), "a", "");
    let daemon = Daemon::start(&config, port).await;
    assert!(daemon.readyz_becomes(200, Duration::from_secs(20)).await);
    let name = rollboard::store::lua::library().name.clone();
    let old = format!("rollboard_{OLD_VERSION}");
    let now = now_ms();
    let events: Vec<Fields> = (0..3000).map(|i| tip(i, now)).collect();
    let take_away = |wave: usize| {
        if wave % 2 == 0 {
            redis.cli(&["FUNCTION", "FLUSH"]);
            redis.cli(&["FUNCTION", "LOAD", &old_library()]);
        } else {
            redis.cli(&["FUNCTION", "DELETE", &name]);
        }
    };
    for (wave, part) in events.chunks(600).enumerate() {
        // Before the wave (its calls find no library) and while the daemon applies it.
        take_away(wave);
        xadd_all(store.client(), intake_stream(), part).await;
        take_away(wave + 1);
    }
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    assert_eq!(redis.cli(&["XLEN", dead_letter_stream()]).trim(), "0");
    // The daemon's own calls loaded it again.
    assert!(
        wait_for(Duration::from_secs(10), || async {
            libraries(&redis).contains(&name)
        })
        .await
    );

    // Readiness loads the library when it is missing, and leaves the old one alone.
    redis.cli(&["FUNCTION", "DELETE", &name]);
    assert!(!libraries(&redis).contains(&name));
    assert_eq!(daemon.get("/readyz").await.0, 200, "{}", daemon.logs());
    let mut held = libraries(&redis);
    held.sort();
    assert_eq!(held, [old.clone(), name.clone()]);
    assert!(!daemon.logs().contains("OLD release called"));
    assert!(daemon.terminate().await.success());
}
