//! Windows of 2^31 slices or more (the digest table's slice tags) and `ingest.max_future`:
//! the configuration refuses a window the slice tags cannot serve, and the largest window
//! recognises redeliveries at both of its ends.

use rollboard::metrics::Metrics;
use rollboard::store::Outcome;

use crate::support::boards::{apply_events, entry, ingest_settings, roll_all, total_at, Consumer};
use crate::support::events::letters;
use crate::support::keys::intake_stream;
use crate::support::redis::RedisServer;

/// Settings of one board `name` over `window` in 1 ms slices, below the TOML `ingest` (may be empty).
fn one_board(
    ingest: &str,
    name: &str,
    window: &str,
) -> Result<rollboard::config::Settings, rollboard::config::ConfigError> {
    rollboard::config::Settings::from_toml(&format!(
        "{ingest}\n[[boards]]\nname = \"{name}\"\nmember = \"user\"\nwindow = \"{window}\"\nslice = \"1ms\"\n"
    ))
}

/// A board whose window (with `ingest.max_future`) spans more slices than the digest
/// table's slice tags serve is refused with the setting named. The tags are slice numbers
/// mod 2^32, counted while less than 2^31 above the forget point (`counts` in fold.lua /
/// fold.lua): with more slices the newest slices' ids would look forgotten and a
/// redelivered event would count twice.
#[test]
fn a_window_the_slice_tags_cannot_serve_is_refused_by_the_configuration() {
    use rollboard::config::MAX_SLICES_REACHED;
    let config = |window: &str, max_future: &str| {
        one_board(
            &format!("[ingest]\nmax_future = \"{max_future}\"\n"),
            "fine",
            window,
        )
    };
    for (window, max_future) in [
        ("35d", "5m"),
        ("2147483647ms", "0s"),
        (
            format!("{}ms", MAX_SLICES_REACHED - 300_000 + 1).as_str(),
            "5m",
        ),
    ] {
        let error = config(window, max_future)
            .map(|_| ())
            .expect_err(window)
            .to_string();
        assert!(
            error.contains("boards[0].slice") && error.contains("too narrow"),
            "{window}: {error}"
        );
    }
    let largest = format!("{}ms", MAX_SLICES_REACHED - 300_000);
    let board = config(&largest, "5m").expect("the largest window").boards[0].clone();
    assert_eq!(
        board.widest().slices_in_window(),
        MAX_SLICES_REACHED - 300_000
    );
}

/// The largest window the slice tags serve: 2^31 - 4 slices (`slice = "1ms"`, no event
/// ahead of the clock allowed). A redelivery
/// of a tip in the newest slice and of one in the oldest live slice are both recognised,
/// and after the roll that ends the oldest slice its id is forgotten with it (a copy is late,
/// never counted).
#[tokio::test]
async fn the_largest_window_recognises_redeliveries_at_both_ends() {
    use rollboard::store::Outcome;
    let settings = one_board("[ingest]\nmax_future = \"0s\"\n", "edge", "2147483644ms")
        .expect("the configuration accepts the board");
    let board = settings.boards[0].clone();
    let n = board.widest().slices_in_window();
    assert_eq!(n, rollboard::config::MAX_SLICES_REACHED);
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let now = 1_763_700_000_000;
    let newest = crate::support::boards::ev("newest", now, "u1", 5);
    let oldest = crate::support::boards::ev("oldest", now - n + 1, "u2", 7);
    let batch = [newest.clone(), oldest.clone()];
    let first = apply_events(&store, &board, &batch, now).await;
    assert_eq!(first, [Outcome::Applied, Outcome::Applied]);
    for _ in 0..2 {
        let again = apply_events(&store, &board, &batch, now).await;
        assert_eq!(again, [Outcome::Duplicate, Outcome::Duplicate]);
        // One at a time too (the event-by-event path when a call holds a duplicate and a new one).
        let fresh = crate::support::boards::ev("fresh", now, "u1", 1);
        let mixed = apply_events(&store, &board, &[oldest.clone(), fresh], now).await;
        assert_eq!(mixed[0], Outcome::Duplicate);
    }
    assert_eq!(total_at(&store, &board.widest(), "u1", now).await, Some(6));
    assert_eq!(total_at(&store, &board.widest(), "u2", now).await, Some(7));
    // One millisecond later the oldest slice has left the window.
    let later = now + 1;
    roll_all(&store, std::slice::from_ref(&board), later, 100).await;
    assert_eq!(total_at(&store, &board.widest(), "u2", later).await, None);
    let copy = apply_events(&store, &board, std::slice::from_ref(&oldest), later).await;
    assert_eq!(copy, [Outcome::Late]);
    let copy = apply_events(&store, &board, std::slice::from_ref(&newest), later).await;
    assert_eq!(copy, [Outcome::Duplicate]);
    assert_eq!(
        total_at(&store, &board.widest(), "u1", later).await,
        Some(6)
    );
}

/// The largest window the default `max_future` (5 minutes) leaves room for, with a tip as
/// far ahead of the clock as it allows: its slice is `max_future / slice` above
/// `slice_of(now)`, and its redelivery is still recognised.
#[tokio::test]
async fn a_tip_max_future_ahead_in_the_largest_window_counts_once() {
    use rollboard::store::Outcome;
    let settings =
        one_board("", "edge", "2147183644ms").expect("the configuration accepts the board");
    let board = settings.boards[0].clone();
    assert_eq!(
        board.widest().slices_in_window() + 300_000,
        rollboard::config::MAX_SLICES_REACHED
    );
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let now = 1_763_700_000_000;
    // As far ahead as the default max_future of 5 minutes allows.
    let ahead = crate::support::boards::ev("ahead", now + 300_000, "u1", 5);
    let first = apply_events(&store, &board, std::slice::from_ref(&ahead), now).await;
    assert_eq!(first, [Outcome::Applied]);
    let again = apply_events(&store, &board, std::slice::from_ref(&ahead), now).await;
    assert_eq!(
        total_at(&store, &board.widest(), "u1", now).await,
        Some(5),
        "one tip of 5; the redelivery was {again:?}"
    );
}

/// The bound at its edge where `ingest.max_future` is not a multiple of the slice: with
/// `slice = 7ms` and `max_future = 300s` (42857 slices and 1 ms), the largest accepted
/// window has `MAX_SLICES_REACHED - 42857` slices, and a tip exactly `max_future` ahead of
/// a clock in the last millisecond of its slice lands 42858 slices above it, one more than
/// the configuration counted. Through `process_batch` (which judges `future`) its
/// redelivery is still recognised, and so is one of a tip in the oldest live slice; with
/// `dedup_window = "1h"` too (for the newest; the oldest is past the hour, so its ids may
/// be forgotten and it is refused as late).
#[tokio::test]
async fn the_largest_window_with_a_max_future_not_a_multiple_of_the_slice_counts_once() {
    use rollboard::config::{Settings, MAX_SLICES_REACHED};
    for dedup in ["window", "1h"] {
        let n = MAX_SLICES_REACHED - 42_857;
        let text = |slices: i64| {
            format!(
                "[ingest]\nmax_future = \"300s\"\ndedup_window = \"{dedup}\"\n[[boards]]\nname = \"edge\"\nmember = \"user\"\nwindow = \"{}ms\"\nslice = \"7ms\"\n",
                slices * 7
            )
        };
        let error = Settings::from_toml(&text(n + 1))
            .map(|_| ())
            .expect_err("one slice more is refused")
            .to_string();
        assert!(error.contains("too narrow"), "{error}");
        let settings = Settings::from_toml(&text(n)).expect("the largest window");
        let boards = settings.boards.clone();
        let board = boards[0].clone();
        assert_eq!(board.widest().slices_in_window(), n);
        let mut ingest_settings = ingest_settings(intake_stream(), 1);
        ingest_settings.max_future_ms = settings.ingest.max_future_ms;
        assert_eq!(ingest_settings.max_future_ms, 300_000);

        let (_redis, store) = RedisServer::start_with_store("rb").await;
        let metrics = Metrics::new(&boards);
        // The last millisecond of a slice.
        let now = 1_763_700_000_000i64 / 7 * 7 + 6;
        let ahead = now + 300_000;
        assert_eq!(board.slice_of(ahead), board.slice_of(now) + 42_858);
        let oldest = (board.slice_of(now) - n + 1) * 7;
        let batch = [
            entry(
                &format!("{now}-0"),
                &[
                    ("user", "u1"),
                    ("amount", "5"),
                    ("ts", &ahead.to_string()),
                    ("id", "ahead"),
                ],
            ),
            entry(
                &format!("{now}-1"),
                &[
                    ("user", "u2"),
                    ("amount", "7"),
                    ("ts", &oldest.to_string()),
                    ("id", "oldest"),
                ],
            ),
        ];
        for delivery in 0..3 {
            Consumer::new(&store, &boards, &ingest_settings, &metrics)
                .process(intake_stream(), &batch, now)
                .await
                .expect("batch");
            // With "1h" the oldest slice is past the hour: its ids may be forgotten, so its
            // tip is refused as late at every delivery, never counted.
            let refused = if dedup == "window" { 0 } else { delivery + 1 };
            assert_eq!(
                letters(&store).await.len(),
                refused,
                "{dedup}: dead-lettered"
            );
            assert_eq!(
                total_at(&store, &board.widest(), "u1", now).await,
                Some(5),
                "{dedup} delivery {delivery}: the tip max_future ahead counts once"
            );
            assert_eq!(
                total_at(&store, &board.widest(), "u2", now).await,
                (dedup == "window").then_some(7),
                "{dedup} delivery {delivery}: the tip in the oldest slice counts at most once"
            );
        }
        // The same through the store, for the outcome.
        let again = apply_events(
            &store,
            &board,
            &[crate::support::boards::ev("ahead", ahead, "u1", 5)],
            now,
        )
        .await;
        assert_eq!(again, [Outcome::Duplicate], "{dedup}");
    }
}
