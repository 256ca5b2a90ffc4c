//! `redis.scripts`: on a server that refuses functions, `auto` calls the same scripts by
//! `EVALSHA` and every call writes what it writes by `FCALL`; a script the server lost
//! (`SCRIPT FLUSH`, a restart) is loaded again and the call sent once more; the start-up
//! check names what the chosen way needs. A refused `WAIT` names the setting that sends
//! none.

use rollboard::config::{Durability, ScriptCalls};
use rollboard::store::{Reconnect, Store, WAIT_DENIED};

use crate::support::acl::Server;
use crate::support::boards::{apply_events, ev, roll_board, snapshot, variants};
use crate::support::instances::contents;
use crate::support::redis::{command_calls_at, RedisServer};

/// A redis-server whose `FUNCTION`, `FCALL` and `FCALL_RO` are renamed away, as a service
/// that does not offer them answers: `ERR unknown command`.
fn server_without_functions() -> Server {
    let mut args = Vec::new();
    for command in ["FUNCTION", "FCALL", "FCALL_RO"] {
        args.extend([
            "--rename-command".to_string(),
            command.to_string(),
            String::new(),
        ]);
    }
    Server::start(&args, false)
}

async fn store_on(port: u16, scripts: ScriptCalls) -> Store {
    Store::connect(
        &format!("redis://127.0.0.1:{port}"),
        "rb",
        2,
        Reconnect::Never,
    )
    .await
    .expect("connect")
    .with_script_calls(scripts)
    // Every apply a script call (the worker would judge these events itself).
    .with_transactions(false)
}

/// The same events and rolls on a server without functions (`auto`) and on one with them
/// (`functions`): every key of every board variant holds the same content, the first
/// server ran EVALSHA and no FCALL. Its scripts flushed, the next apply loads them again
/// and counts its events once.
#[tokio::test]
async fn without_functions_auto_calls_by_evalsha_and_writes_the_same() {
    let bare = server_without_functions();
    let plain = RedisServer::start();
    let by_eval = store_on(bare.port, ScriptCalls::Auto).await;
    let by_function = store_on(plain.port, ScriptCalls::Functions).await;
    let now = 1_700_000_000_000;
    let boards = variants(60_000, 5);
    for board in &boards {
        for store in [&by_eval, &by_function] {
            let events = [
                ev("a", now - 130_000, "m1", 5),
                ev("b", now - 70_000, "m2", 5),
                ev("c", now - 10_000, "m3", 7),
                ev("a", now - 130_000, "m1", 5),
            ];
            apply_events(store, board, &events, now).await;
            roll_board(store, board, now + 200_000).await;
            apply_events(
                store,
                board,
                &[ev("d", now + 200_000, "m2", 3)],
                now + 200_000,
            )
            .await;
        }
        // Every key but `meta`, whose chain token is drawn afresh by each call.
        assert_eq!(
            contents(&by_eval, &board.widest()).await,
            contents(&by_function, &board.widest()).await,
            "{}",
            board.name
        );
    }
    assert!(
        command_calls_at(bare.port, "evalsha") > 0,
        "EVALSHA was called"
    );
    assert_eq!(command_calls_at(bare.port, "fcall"), 0);
    let loads = command_calls_at(bare.port, "script|load");
    assert!(loads > 0, "the scripts were loaded");

    // The server loses its scripts: the next call is answered NOSCRIPT, runs nothing, and
    // is sent again once they are loaded.
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &bare.port.to_string(), "SCRIPT", "FLUSH"])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
    let board = &boards[0];
    let later = now + 210_000;
    for store in [&by_eval, &by_function] {
        apply_events(store, board, &[ev("e", later, "m4", 11)], later).await;
    }
    assert!(
        command_calls_at(bare.port, "script|load") > loads,
        "loaded again"
    );
    assert_eq!(
        contents(&by_eval, &board.widest()).await,
        contents(&by_function, &board.widest()).await
    );
    let top = by_eval
        .top(&board.widest(), None, 0, 10, later)
        .await
        .expect("top");
    assert_eq!(top.entries[0].member, "m4");

    // Told to call functions there, a call fails, naming the command, and writes nothing.
    let forced = store_on(bare.port, ScriptCalls::Functions).await;
    let before = snapshot(&by_eval, board).await;
    let refused = forced
        .apply(board, None, &[ev("f", later, "m5", 1)], later)
        .await
        .expect_err("no FCALL on this server");
    assert!(refused.to_string().contains("unknown command"), "{refused}");
    assert_eq!(snapshot(&by_eval, board).await, before);
}

/// The start-up check names what the chosen way needs: by `EVALSHA` (told so), the script
/// commands the user lacks; by `auto`, for a user who may call neither functions nor
/// scripts, what functions need (as the shipped ACL grants).
#[tokio::test]
async fn the_start_up_check_asks_for_what_the_chosen_way_needs() {
    let redis = RedisServer::start();
    let board = &variants(60_000, 5)[0];
    for (rules, scripts, named, not_named) in [
        (
            "-script|load -fcall",
            ScriptCalls::Eval,
            "SCRIPT LOAD",
            "FCALL",
        ),
        (
            "-script|load -fcall",
            ScriptCalls::Auto,
            "FCALL",
            "SCRIPT LOAD",
        ),
        (
            "-function -fcall -fcall_ro",
            ScriptCalls::Auto,
            "",
            "FUNCTION",
        ),
    ] {
        let user = format!("u{}", rules.len() + named.len());
        let mut acl = vec![
            "ACL", "SETUSER", &user, "reset", "on", ">pw", "~*", "&*", "+@all",
        ];
        acl.extend(rules.split_whitespace());
        assert_eq!(redis.cli(&acl).trim(), "OK");
        let url = format!("redis://{user}:pw@127.0.0.1:{}", redis.port);
        let store = Store::connect(&url, "rb", 1, Reconnect::Never)
            .await
            .expect("connect")
            .with_script_calls(scripts);
        let denied = store
            .check_permissions(std::slice::from_ref(board), "rb:events", "rb:events:dead")
            .await
            .expect("the check runs");
        let text = denied.join(", ");
        if named.is_empty() {
            assert!(denied.is_empty(), "{rules} {scripts:?}: {text}");
        } else {
            assert!(text.contains(named), "{rules} {scripts:?}: {text}");
        }
        assert!(!text.contains(not_named), "{rules} {scripts:?}: {text}");
    }
}

/// A user denied `WAIT` (a serverless service refuses it, and replicates by itself): the
/// start-up check names it with the setting that needs none, and so does a confirmation
/// that meets the refusal; with `min_replicas_acked = 0` neither asks for it.
#[tokio::test]
async fn a_refused_wait_names_min_replicas_acked_0() {
    let redis = RedisServer::start();
    let board = &variants(60_000, 5)[0];
    let acl = [
        "ACL", "SETUSER", "nowait", "reset", "on", ">pw", "~*", "&*", "+@all", "-wait",
    ];
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let url = format!("redis://nowait:pw@127.0.0.1:{}", redis.port);
    let connect = |replicas: Option<u32>| {
        let url = url.clone();
        async move {
            Store::connect(&url, "rb", 1, Reconnect::Never)
                .await
                .expect("connect")
                .with_durability(Durability {
                    replicas,
                    timeout: std::time::Duration::from_millis(100),
                })
        }
    };
    let check = |store: Store| async move {
        store
            .check_permissions(std::slice::from_ref(board), "rb:events", "rb:events:dead")
            .await
            .expect("the check runs")
    };
    for replicas in [None, Some(1)] {
        let denied = check(connect(replicas).await).await;
        assert_eq!(denied, [WAIT_DENIED], "{replicas:?}");
        assert!(WAIT_DENIED.contains("redis.min_replicas_acked = 0"));
    }
    assert!(check(connect(Some(0)).await).await.is_empty());

    let refused = connect(Some(1))
        .await
        .confirm_writes(&["rb:{x}:meta"])
        .await
        .expect_err("WAIT is refused");
    let text = refused.to_string();
    assert!(text.contains("NOPERM"), "{text}");
    assert!(text.contains("set redis.min_replicas_acked = 0"), "{text}");
    connect(Some(0))
        .await
        .confirm_writes(&["rb:{x}:meta"])
        .await
        .expect("nothing to wait for");
}
