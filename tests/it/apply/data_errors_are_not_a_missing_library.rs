//! Only Redis's own answer that a function is not found makes rollboard load its library
//! again and resend the call; an error that merely mentions those words (in a member name
//! from an event) is the error it is.

use crate::support::boards::{apply_events, board, ev, now_ms};
use crate::support::redis::{fcall_calls, script_loads, RedisServer};

/// A corrupt `members` value for a member named "Function not found": the apply fails as
/// bad data after one call, and the library is not loaded again.
#[tokio::test]
async fn a_member_named_function_not_found_is_not_a_missing_library() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    // Every apply a `fold.lua` call (the worker would judge the first itself).
    let store = store.with_transactions(false);
    let board = board("named", 3_600_000, 24);
    let now = now_ms();
    // The library is loaded by a first apply.
    apply_events(&store, &board, &[ev("w", now, "m", 1)], now).await;
    let member = "Function not found";
    let members = store.instance(&board.widest(), None).members();
    redis.cli(&["HSET", &members, member, "not-a-time"]);
    let (calls, loads) = (fcall_calls(&redis), script_loads(&redis));
    let error = store
        .apply(&board, None, &[ev("e1", now - 10, member, 5)], now)
        .await
        .expect_err("a corrupt members value");
    let text = error.to_string();
    assert!(text.contains("ROLLBOARD corrupt"), "{text}");
    assert_eq!(error.kind(), "data", "{text}");
    assert_eq!(fcall_calls(&redis) - calls, 1, "the call was sent again");
    assert_eq!(
        script_loads(&redis) - loads,
        0,
        "the library was loaded again"
    );
}
