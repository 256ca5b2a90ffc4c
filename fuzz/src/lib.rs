//! The contracts the fuzz targets check, one function per target, each taking the raw input.
//!
//! Every input either parses or is refused with a reason; a panic, an empty reason or a
//! result that breaks an invariant of the parsed value is a finding (the checks panic, which
//! the fuzzer records as a crash).

use std::sync::OnceLock;

use rollboard::domain::board::Board;
use rollboard::config::{ConfigError, Settings};
use rollboard::domain::event::{check_name, parse, validate, Field, Reason, MAX_ID_BYTES};
use rollboard::ingest::intake::{parse_body, BodyError, MAX_EVENTS};

/// The clock the event target judges `future` against (2026-01-01T00:00:00Z).
pub const NOW_MS: i64 = 1_767_225_600_000;
/// The `ingest.max_future` the event target uses (5 minutes, as shipped).
pub const MAX_FUTURE_MS: i64 = 300_000;
/// Largest event time accepted (2^53 - 1).
const MAX_TS: i64 = (1 << 53) - 1;

/// The boards of the shipped `config/rollboard.toml` (plain, scoped, scaled with refunds).
pub fn boards() -> &'static [Board] {
    static BOARDS: OnceLock<Vec<Board>> = OnceLock::new();
    BOARDS.get_or_init(
        || match Settings::from_toml(include_str!("../../config/rollboard.toml")) {
            Ok(settings) => settings.boards,
            Err(e) => panic!("the shipped config does not load: {e}"),
        },
    )
}

/// Splits the event target's input: the first line is the stream entry ID, each further line
/// is one field, `name=value` (a line without `=` is a name with an empty value). An empty
/// first line stands for `0-1`: Redis never gives an empty entry ID (an empty one would become
/// an empty idempotency key for an event without `id`).
pub fn split_event(data: &[u8]) -> (String, Vec<Field>) {
    let mut lines = data.split(|&b| b == b'\n');
    let entry_id = match lines.next().unwrap_or_default() {
        b"" => "0-1".to_string(),
        line => String::from_utf8_lossy(line).into_owned(),
    };
    let fields = lines
        .map(|line| match line.iter().position(|&b| b == b'=') {
            Some(at) => (line[..at].to_vec(), line[at + 1..].to_vec()),
            None => (line.to_vec(), Vec::new()),
        })
        .collect();
    (entry_id, fields)
}

/// Event parsing and validation: an event with valid updates, or a rejection with a reason
/// of the event itself (never `late`, `overflow` or `apply_failed`, judged later) and a detail.
pub fn check_event(data: &[u8]) {
    let (entry_id, fields) = split_event(data);
    let boards = boards();
    match parse(&fields, &entry_id, boards, NOW_MS, MAX_FUTURE_MS) {
        Ok(event) => {
            assert!(!event.updates.is_empty(), "an event with no update");
            assert!(!event.id.is_empty() && event.id.len() <= MAX_ID_BYTES.max(entry_id.len()));
            assert!((0..=MAX_TS).contains(&event.ts), "ts {} accepted", event.ts);
            assert!(
                event.ts <= NOW_MS + MAX_FUTURE_MS,
                "future ts {} accepted",
                event.ts
            );
            for update in &event.updates {
                let board = &boards[update.board];
                assert!(update.amount != 0, "a zero amount accepted");
                assert!(
                    board.allow_negative || update.amount > 0,
                    "a negative amount accepted on {}",
                    board.name
                );
                assert_eq!(
                    check_name(update.member.as_bytes()),
                    Ok(update.member.as_str())
                );
                assert_eq!(board.scope.is_some(), update.scope.is_some());
                if let Some(scope) = &update.scope {
                    assert_eq!(check_name(scope.as_bytes()), Ok(scope.as_str()));
                }
            }
        }
        Err(rejection) => {
            assert!(
                !matches!(
                    rejection.reason,
                    Reason::Late | Reason::Overflow | Reason::ApplyFailed
                ),
                "parse judged {}",
                rejection.reason
            );
            assert!(
                !rejection.detail.trim().is_empty(),
                "{:?} without a detail",
                rejection.reason
            );
        }
    }
}

/// The config loader: settings whose boards each hold whole slices, or an error naming the
/// key and the reason (or why the text cannot be read). Input that is not UTF-8 is what the file
/// loader refuses before parsing; it is read lossily so the bytes still reach the parser.
pub fn check_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Settings::from_toml(&text) {
        Ok(settings) => {
            for board in &settings.boards {
                assert!(board.slice_ms > 0 && board.window_ms >= board.slice_ms);
                assert!(
                    board.window_ms % board.slice_ms == 0,
                    "window not whole slices"
                );
            }
        }
        Err(ConfigError::Read(why)) => assert!(!why.trim().is_empty(), "a read error without text"),
        Err(ConfigError::Invalid { key, reason, .. }) => {
            assert!(!key.is_empty(), "an invalid value without its key");
            assert!(
                !reason.trim().is_empty(),
                "`{key}` refused without a reason"
            );
        }
    }
}

/// The `POST /v1/events` body: events that each validate, or a message, or a reason and
/// detail for every invalid event.
pub fn check_intake(data: &[u8]) {
    let boards = boards();
    match parse_body(data, boards) {
        Ok(events) => {
            assert!(
                !events.is_empty() || data.contains(&b'['),
                "no event from {data:?}"
            );
            assert!(events.len() <= MAX_EVENTS);
            for fields in &events {
                assert!(
                    validate(fields, boards).is_ok(),
                    "an accepted event does not validate"
                );
            }
        }
        Err(BodyError::Malformed(message)) => assert!(!message.trim().is_empty()),
        Err(BodyError::Invalid(invalid)) => {
            assert!(!invalid.is_empty(), "an invalid-events answer listing none");
            for item in &invalid {
                assert!(item["index"].is_u64(), "no index: {item}");
                let reason = item["reason"].as_str().unwrap_or_default();
                let detail = item["detail"].as_str().unwrap_or_default();
                assert!(!reason.is_empty() && !detail.trim().is_empty(), "{item}");
            }
        }
    }
}
