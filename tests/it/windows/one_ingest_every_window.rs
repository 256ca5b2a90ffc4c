//! A board with `windows = ["2h", "6h"]`: an event is applied once, deduplicated once and
//! counted in every window it falls in; each window rolls on its own.

use rollboard::domain::board::{Board, Window};
use rollboard::store::Outcome;

use crate::support::boards::{apply_events, board, ev, roll_board, total_at, HOUR};
use crate::support::keys::instance_in;
use crate::support::redis::RedisServer;

const NOW: i64 = 1_763_700_000_000;

/// A board of hourly slices ranking the last 2 and the last 6 hours (the 2 h window
/// listed first, so queries default to it).
pub fn two_windows(name: &str) -> Board {
    let mut b = board(name, HOUR, 6);
    b.windows = vec![
        Window {
            name: "2h".into(),
            ms: 2 * HOUR,
        },
        Window {
            name: "6h".into(),
            ms: 6 * HOUR,
        },
    ];
    b
}

#[tokio::test]
async fn an_event_counts_in_every_window_it_falls_in_and_once() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = two_windows("tips");
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    let out = apply_events(
        &store,
        &b,
        &[
            ev("old", now - 3 * HOUR, "ann", 100),
            ev("new", now, "ann", 7),
            ev("bob", now - HOUR, "bob", 50),
            ev("new", now, "ann", 7),
        ],
        now,
    )
    .await;
    assert_eq!(
        out,
        vec![
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Duplicate
        ]
    );
    let short = b.view(Some("2h")).unwrap();
    let wide = b.view(Some("6h")).unwrap();
    assert_eq!(total_at(&store, &short, "ann", now).await, Some(7));
    assert_eq!(total_at(&store, &wide, "ann", now).await, Some(107));
    assert_eq!(total_at(&store, &short, "bob", now).await, Some(50));
    let raw = redis.ranking(&instance_in("tips", None, "2h").result());
    assert!(raw.contains("bob") && raw.contains("ann"), "{raw}");
    // Two hours later, the 2h window forgets bob and the first `new`; the 6h window keeps all.
    let later = now + 2 * HOUR;
    roll_board(&store, &b, later).await;
    assert_eq!(total_at(&store, &short, "bob", later).await, None);
    assert_eq!(total_at(&store, &short, "ann", later).await, None);
    assert_eq!(total_at(&store, &wide, "ann", later).await, Some(107));
    // A copy of `new` is still a duplicate: the widest remembers it.
    let out = apply_events(&store, &b, &[ev("new", now, "ann", 7)], later).await;
    assert_eq!(out, vec![Outcome::Duplicate]);
}
