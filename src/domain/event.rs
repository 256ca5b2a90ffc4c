//! Parsing and validating one event (docs/design.md, *Events and boards*).
//!
//! Validation runs in two steps. [`validate`] checks everything that does not depend on
//! time or on stored state (used by `send` and `POST /v1/events` before appending);
//! [`Validated::resolve`] fills in the defaults from the stream entry ID and judges `future`.
//! `late` and `overflow` depend on each board instance and are judged when applying.

use std::fmt;

use crate::domain::board::{Board, MAX_TOTAL};
use crate::domain::limits::MAX_EVENT_FIELDS;

/// Longest member or scope value, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest idempotency key, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Why an event is dead-lettered, in order of precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The event matches no board.
    NoBoard,
    /// A member value is empty, too long, not UTF-8 or holds control characters.
    Member,
    /// A scope value is invalid, as for members.
    Scope,
    /// The idempotency key is empty, too long or not UTF-8.
    Id,
    /// An amount is malformed, zero, too precise, negative where not allowed or too large.
    Amount,
    /// The event time is not a non-negative integer of milliseconds below 2^53.
    Ts,
    /// The event time is too far ahead of the clock.
    Future,
    /// The event's slice has left the window of every board it matches.
    Late,
    /// Applying the event would take a total past 2^53 - 1.
    Overflow,
    /// A board instance's apply kept failing (a key of the wrong type, corrupt data, a
    /// script error) through every retry; the event went to its other boards.
    ApplyFailed,
}

impl Reason {
    /// Every reason, in precedence order (`apply_failed` is not a judgement of the event:
    /// it comes last).
    pub const ALL: [Reason; 10] = [
        Reason::NoBoard,
        Reason::Member,
        Reason::Scope,
        Reason::Id,
        Reason::Amount,
        Reason::Ts,
        Reason::Future,
        Reason::Late,
        Reason::Overflow,
        Reason::ApplyFailed,
    ];

    /// The label used in dead-letter entries and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoBoard => "no_board",
            Reason::Member => "member",
            Reason::Scope => "scope",
            Reason::Id => "id",
            Reason::Amount => "amount",
            Reason::Ts => "ts",
            Reason::Future => "future",
            Reason::Late => "late",
            Reason::Overflow => "overflow",
            Reason::ApplyFailed => "apply_failed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused event: the reason and a sentence for the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct Rejection {
    /// The machine-readable reason.
    pub reason: Reason,
    /// What exactly is wrong.
    pub detail: String,
}

impl Rejection {
    /// A rejection with a reason and detail.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Rejection {
            reason,
            detail: detail.into(),
        }
    }
}

/// One field of an event, as raw bytes (stream entries are binary-safe).
pub type Field = (Vec<u8>, Vec<u8>);

/// One board instance update carried by an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Index of the board in the settings.
    pub board: usize,
    /// The instance: the scope value on a scoped board, the shard ([`Board::shard_of`]) on a
    /// sharded one.
    pub scope: Option<String>,
    /// The ranked member.
    pub member: String,
    /// Amount in the board's minor units.
    pub amount: i64,
}

/// An event whose fields are valid, before time defaults are filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    /// Idempotency key from the `id` field, if present.
    pub id: Option<String>,
    /// Event time from the `ts` field, if present.
    pub ts: Option<i64>,
    /// The boards it updates.
    pub updates: Vec<Update>,
}

/// An event ready to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Idempotency key.
    pub id: String,
    /// Event time, epoch ms.
    pub ts: i64,
    /// The boards it updates.
    pub updates: Vec<Update>,
}

/// The value of the field `name`, if the event has it.
pub fn field<'a>(fields: &'a [Field], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(k, _)| k.as_slice() == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

/// Most characters of a client's value quoted in a rejection: the value itself can be as
/// long as the request body.
const SHOWN_CHARS: usize = 64;

/// `value` for a rejection message: Debug-quoted, cut at 64 characters.
pub fn shown(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let cut: String = text.chars().take(SHOWN_CHARS).collect();
    let more = if cut.len() < text.len() { "..." } else { "" };
    format!("{cut:?}{more}")
}

/// Checks a member or scope value: 1 to 256 bytes of UTF-8 without control characters.
pub fn check_name(value: &[u8]) -> Result<&str, String> {
    let text = std::str::from_utf8(value).map_err(|_| "is not valid UTF-8".to_string())?;
    if text.is_empty() {
        return Err("is empty".into());
    }
    if text.len() > MAX_NAME_BYTES {
        return Err(format!(
            "is {} bytes long, the limit is {MAX_NAME_BYTES}",
            text.len()
        ));
    }
    if text.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    Ok(text)
}

/// Parses an amount with at most `scale` fraction digits into minor units.
pub fn parse_amount(value: &[u8], scale: u32, allow_negative: bool) -> Result<i64, String> {
    let shown = shown(value);
    let (negative, body) = match value.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, value),
    };
    let (int_part, frac_part) = match body.iter().position(|&b| b == b'.') {
        Some(dot) => (&body[..dot], Some(&body[dot + 1..])),
        None => (body, None),
    };
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    if !digits(int_part) || frac_part.is_some_and(|f| !digits(f)) {
        return Err(format!("{shown} is not a decimal number"));
    }
    let frac = frac_part.unwrap_or_default();
    if frac.len() > scale as usize {
        return Err(format!(
            "{shown} has {} fraction digits, the board accepts {scale}",
            frac.len()
        ));
    }
    let too_large = || format!("{shown} is above the limit of 2^53-1 minor units");
    let mut units: i64 = 0;
    for &d in int_part.iter().chain(frac) {
        units = units
            .checked_mul(10)
            .and_then(|u| u.checked_add(i64::from(d - b'0')))
            .filter(|u| *u <= MAX_TOTAL)
            .ok_or_else(too_large)?;
    }
    for _ in frac.len()..scale as usize {
        units = units
            .checked_mul(10)
            .filter(|u| *u <= MAX_TOTAL)
            .ok_or_else(too_large)?;
    }
    if units == 0 {
        return Err(format!("{shown} is zero"));
    }
    if negative && !allow_negative {
        return Err(format!(
            "{shown} is negative and the board does not allow negative amounts"
        ));
    }
    Ok(if negative { -units } else { units })
}

/// Parses an event time: decimal digits of epoch milliseconds, at most 2^53 - 1.
pub fn parse_ts(value: &[u8]) -> Result<i64, String> {
    let shown = shown(value);
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "{shown} is not epoch milliseconds (decimal digits only)"
        ));
    }
    let mut ts: i64 = 0;
    for &d in value {
        ts = ts
            .checked_mul(10)
            .and_then(|t| t.checked_add(i64::from(d - b'0')))
            .filter(|t| *t <= MAX_TOTAL)
            .ok_or_else(|| format!("{shown} is beyond the supported time range"))?;
    }
    Ok(ts)
}

/// The boards whose member, amount and scope fields the event has, with their indexes.
fn matched_boards<'b>(
    fields: &[Field],
    boards: &'b [Board],
) -> Result<Vec<(usize, &'b Board)>, Rejection> {
    let matched: Vec<(usize, &Board)> = boards
        .iter()
        .enumerate()
        .filter(|(_, b)| {
            field(fields, &b.member).is_some()
                && field(fields, &b.amount).is_some()
                && b.scope
                    .as_deref()
                    .is_none_or(|s| field(fields, s).is_some())
        })
        .collect();
    if matched.is_empty() {
        return Err(Rejection::new(
            Reason::NoBoard,
            "the event matches no board (member, amount or scope field missing)",
        ));
    }
    Ok(matched)
}

/// The event's `id`, if it has one: 1 to [`MAX_ID_BYTES`] bytes of UTF-8.
fn id_of(fields: &[Field]) -> Result<Option<String>, Rejection> {
    Ok(match field(fields, "id") {
        None => None,
        Some(raw) => {
            let text = std::str::from_utf8(raw)
                .map_err(|_| Rejection::new(Reason::Id, "field `id` is not valid UTF-8"))?;
            if text.is_empty() || text.len() > MAX_ID_BYTES {
                return Err(Rejection::new(
                    Reason::Id,
                    format!(
                        "field `id` is {} bytes long, it must be 1 to {MAX_ID_BYTES}",
                        text.len()
                    ),
                ));
            }
            Some(text.to_string())
        }
    })
}

/// Validates the time-independent parts of an event against every board it matches.
pub fn validate(fields: &[Field], boards: &[Board]) -> Result<Validated, Rejection> {
    let matched = matched_boards(fields, boards)?;
    let name_of = |name: &str, reason: Reason| -> Result<String, Rejection> {
        let value = field(fields, name).unwrap_or_default();
        check_name(value)
            .map(str::to_string)
            .map_err(|why| Rejection::new(reason, format!("field `{name}` {why}")))
    };
    let mut members = Vec::with_capacity(matched.len());
    for (_, b) in &matched {
        members.push(name_of(&b.member, Reason::Member)?);
    }
    // The instance: a scoped board's by the scope field, a sharded board's by the member.
    let mut scopes = Vec::with_capacity(matched.len());
    for ((_, b), member) in matched.iter().zip(&members) {
        scopes.push(match &b.scope {
            Some(s) => Some(name_of(s, Reason::Scope)?),
            None => b.shard_of(member),
        });
    }
    let id = id_of(fields)?;
    let mut amounts = Vec::with_capacity(matched.len());
    for (_, b) in &matched {
        let raw = field(fields, &b.amount).unwrap_or_default();
        let amount = parse_amount(raw, b.scale, b.allow_negative).map_err(|why| {
            Rejection::new(
                Reason::Amount,
                format!("field `{}` for board {}: {why}", b.amount, b.name),
            )
        })?;
        amounts.push(amount);
    }
    let ts = match field(fields, "ts") {
        None => None,
        Some(raw) => Some(
            parse_ts(raw)
                .map_err(|why| Rejection::new(Reason::Ts, format!("field `ts`: {why}")))?,
        ),
    };
    let updates = matched
        .iter()
        .zip(members)
        .zip(scopes)
        .zip(amounts)
        .map(|((((board, _), member), scope), amount)| Update {
            board: *board,
            scope,
            member,
            amount,
        })
        .collect();
    Ok(Validated { id, ts, updates })
}

/// The millisecond time of a stream entry ID (`<ms>-<seq>`).
pub fn entry_time(entry_id: &str) -> Option<i64> {
    entry_id
        .split_once('-')
        .map_or(entry_id, |(ms, _)| ms)
        .parse()
        .ok()
}

impl Validated {
    /// Fills `id` and `ts` from the stream entry ID where absent and judges `future`.
    pub fn resolve(self, entry_id: &str, now: i64, max_future_ms: i64) -> Result<Event, Rejection> {
        let ts = match self.ts {
            Some(ts) => ts,
            None => entry_time(entry_id).ok_or_else(|| {
                Rejection::new(
                    Reason::Ts,
                    format!("no `ts` field and the entry ID {entry_id:?} holds no time"),
                )
            })?,
        };
        if ts > now.saturating_add(max_future_ms) {
            return Err(Rejection::new(
                Reason::Future,
                format!(
                    "ts {ts} is {} ms ahead of the clock, the limit is {max_future_ms} ms",
                    ts - now
                ),
            ));
        }
        Ok(Event {
            id: self.id.unwrap_or_else(|| entry_id.to_string()),
            ts,
            updates: self.updates,
        })
    }
}

/// Validates and resolves one stream entry in one step.
pub fn parse(
    fields: &[Field],
    entry_id: &str,
    boards: &[Board],
    now: i64,
    max_future_ms: i64,
) -> Result<Event, Rejection> {
    validate(fields, boards)?.resolve(entry_id, now, max_future_ms)
}

/// The idempotency key of an event without an `id` field, read at `entry_id` from
/// `stream`: the entry ID on `primary` (`ingest.stream`, unpartitioned), else the stream
/// and the entry ID (`<stream>/<entry ID>`). Entry IDs are unique within one stream only:
/// two partitions, or a partition and the bare stream it replaced, hand out the same IDs
/// in the same millisecond.
pub fn entry_key(stream: &str, primary: &str, entry_id: &str) -> String {
    if stream == primary {
        entry_id.to_string()
    } else {
        format!("{stream}/{entry_id}")
    }
}

/// As [`parse`], for an entry of `stream` (see [`entry_key`]).
pub fn parse_entry(
    fields: &[Field],
    stream: &str,
    primary: &str,
    entry_id: &str,
    boards: &[Board],
    now: i64,
    max_future_ms: i64,
) -> Result<Event, Rejection> {
    let validated = validate(fields, boards)?;
    let keyed = validated.id.is_none();
    let mut event = validated.resolve(entry_id, now, max_future_ms)?;
    if keyed {
        event.id = entry_key(stream, primary, entry_id);
    }
    Ok(event)
}

/// A fresh idempotency key for an event without an `id` field (`None` when it has one): a
/// UUIDv7, i.e. 48 bits of millisecond time and 74 random bits, so keys practically never
/// repeat, and they sort roughly by when they were given.
///
/// Intake gives it before appending, so that every attempt of one append (a client library
/// retries it after a lost reply) carries the same key and a repeat is a duplicate.
pub fn fresh_id(fields: &[Field]) -> Option<String> {
    field(fields, "id")
        .is_none()
        .then(|| uuid::Uuid::now_v7().to_string())
}

/// Converts one JSON object into event fields: strings as they are, numbers by their exact
/// value written plainly ([`plain_number`]: `12.50` is `12.5`, `7823.0` is `7823`, `1e3` is
/// `1000`, never rounded through a float), so that a number means what JSON Schema says it
/// does; booleans, nulls, arrays and objects are refused, and so is an object of more than
/// [`MAX_EVENT_FIELDS`] fields (its append, and its dead letter, would not fit one request).
pub fn fields_from_json(value: &serde_json::Value) -> Result<Vec<Field>, String> {
    let object = value.as_object().ok_or("an event must be a JSON object")?;
    if object.len() > MAX_EVENT_FIELDS {
        return Err(format!(
            "an event has at most {MAX_EVENT_FIELDS} fields, this one has {}",
            object.len()
        ));
    }
    object
        .iter()
        .map(|(name, v)| match v {
            serde_json::Value::String(s) => Ok((name.as_bytes().to_vec(), s.as_bytes().to_vec())),
            serde_json::Value::Number(n) => {
                let written = n.to_string();
                let value = plain_number(&written).unwrap_or(written);
                Ok((name.as_bytes().to_vec(), value.into_bytes()))
            }
            other => Err(format!(
                "field {} is {}, only strings and numbers are accepted",
                shown(name.as_bytes()),
                match other {
                    serde_json::Value::Null => "null",
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Array(_) => "an array",
                    _ => "an object",
                }
            )),
        })
        .collect()
}

/// A JSON number as written (`-12.50e3`) in its plain exact form (`-12500`): no exponent,
/// no leading zero before the point, no trailing zero after it, `0` for minus zero. `None`
/// when that form is longer than [`MAX_ID_BYTES`] (`1e300`): the number is then kept as
/// written (no amount or time is that long, and an id, member or scope may be what it
/// wrote).
pub fn plain_number(written: &str) -> Option<String> {
    let (negative, unsigned) = match written.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, written),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // The point sits after `point` of `digits`.
    let trimmed = digits.trim_start_matches('0');
    let point = (whole.len() as i64).checked_add(exponent)? - (digits.len() - trimmed.len()) as i64;
    let digits = trimmed.trim_end_matches('0');
    if digits.is_empty() {
        return Some("0".into());
    }
    let n = digits.len() as i64;
    let length = match point {
        p if p <= 0 => 2 - p + n,
        p if p >= n => p,
        _ => n + 1,
    } + i64::from(negative);
    if length > MAX_ID_BYTES as i64 {
        return None;
    }
    let mut out = String::with_capacity(length as usize);
    if negative {
        out.push('-');
    }
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(digits);
    } else if point >= n {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (point - n) as usize));
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::board::{Dedup, Mode, TieBreak};

    fn board(
        name: &str,
        member: &str,
        scope: Option<&str>,
        amount: &str,
        scale: u32,
        neg: bool,
    ) -> Board {
        Board {
            name: name.into(),
            member: member.into(),
            scope: scope.map(Into::into),
            amount: amount.into(),
            scale,
            window_ms: 7 * 86_400_000,
            windows: Vec::new(),
            slice_ms: 3_600_000,
            mode: Mode::Incremental,
            tie_break: TieBreak::Earliest,
            allow_negative: neg,
            dense_rank: false,
            changes: None,
            dedup: Dedup::Window,
            period: None,
            shards: 1,
        }
    }

    fn boards() -> Vec<Board> {
        vec![
            board("rooms", "room", None, "amount", 0, false),
            board("fans", "user", Some("room"), "amount", 0, false),
            board("cents", "user", None, "value", 2, true),
        ]
    }

    fn ev(pairs: &[(&str, &str)]) -> Vec<Field> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn reason(pairs: &[(&str, &str)]) -> Reason {
        match parse(&ev(pairs), "1000-0", &boards(), 10_000, 300_000) {
            Ok(e) => panic!("accepted {pairs:?}: {e:?}"),
            Err(r) => r.reason,
        }
    }

    #[test]
    fn amounts_follow_the_syntax() {
        assert_eq!(parse_amount(b"15", 0, false), Ok(15));
        assert_eq!(parse_amount(b"0015", 0, false), Ok(15));
        assert_eq!(parse_amount(b"12.5", 2, false), Ok(1250));
        assert_eq!(parse_amount(b"12.05", 2, false), Ok(1205));
        assert_eq!(parse_amount(b"-3.1", 2, true), Ok(-310));
        assert_eq!(parse_amount(b"9007199254740991", 0, false), Ok(MAX_TOTAL));
        assert_eq!(
            parse_amount(b"00000000000000000000000000001", 0, false),
            Ok(1)
        );
        for bad in [
            "", "+5", "12.", ".5", "1e3", " 5", "5 ", "0x10", "--1", "1.2.3", "٣",
        ] {
            assert!(parse_amount(bad.as_bytes(), 2, true).is_err(), "{bad:?}");
        }
        assert!(parse_amount(b"0", 0, false).unwrap_err().contains("zero"));
        assert!(parse_amount(b"-0.00", 2, true)
            .unwrap_err()
            .contains("zero"));
        assert!(parse_amount(b"1.5", 0, false)
            .unwrap_err()
            .contains("fraction"));
        assert!(parse_amount(b"1.123", 2, false)
            .unwrap_err()
            .contains("fraction"));
        assert!(parse_amount(b"-1", 0, false)
            .unwrap_err()
            .contains("negative"));
        assert!(parse_amount(b"9007199254740992", 0, false)
            .unwrap_err()
            .contains("2^53"));
        assert!(parse_amount(b"90071992547409.92", 2, false)
            .unwrap_err()
            .contains("2^53"));
    }

    #[test]
    fn ts_is_digits_only() {
        assert_eq!(parse_ts(b"1763700000123"), Ok(1_763_700_000_123));
        for bad in ["", "-1", "1.5", "1e12", " 1", "9007199254740992"] {
            assert!(parse_ts(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"room42").is_ok());
        assert!(check_name("名前".as_bytes()).is_ok());
        assert!(check_name(b"").is_err());
        assert!(check_name(&[b'x'; 257]).is_err());
        assert!(check_name(&[b'x'; 256]).is_ok());
        assert!(check_name(b"a\nb").is_err());
        assert!(check_name("a\u{85}b".as_bytes()).is_err());
        assert!(check_name(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn one_event_updates_every_board_it_matches() {
        let e = parse(
            &ev(&[("room", "r1"), ("user", "u1"), ("amount", "5")]),
            "1000-0",
            &boards(),
            10_000,
            0,
        )
        .unwrap();
        assert_eq!(e.id, "1000-0");
        assert_eq!(e.ts, 1000);
        assert_eq!(e.updates.len(), 2);
        assert_eq!(e.updates[1].scope.as_deref(), Some("r1"));
        assert_eq!(e.updates[1].member, "u1");
        let e = parse(
            &ev(&[("user", "u1"), ("value", "1.5"), ("id", "k"), ("ts", "900")]),
            "1000-0",
            &boards(),
            10_000,
            0,
        )
        .unwrap();
        assert_eq!((e.id.as_str(), e.ts), ("k", 900));
        assert_eq!(
            e.updates,
            vec![Update {
                board: 2,
                scope: None,
                member: "u1".into(),
                amount: 150
            }]
        );
    }

    #[test]
    fn every_reason_is_reachable() {
        assert_eq!(reason(&[("user", "u"), ("amount", "5")]), Reason::NoBoard);
        assert_eq!(reason(&[("room", ""), ("amount", "5")]), Reason::Member);
        assert_eq!(
            reason(&[("room", "r"), ("user", "a\tb"), ("amount", "5")]),
            Reason::Member
        );
        assert_eq!(
            reason(&[("room", &"r".repeat(257)), ("user", "u"), ("amount", "5")]),
            Reason::Member
        );
        assert_eq!(
            reason(&[("room", "r"), ("amount", "5"), ("id", "")]),
            Reason::Id
        );
        assert_eq!(
            reason(&[("room", "r"), ("amount", "5"), ("id", &"i".repeat(129))]),
            Reason::Id
        );
        assert_eq!(reason(&[("room", "r"), ("amount", "5.5")]), Reason::Amount);
        assert_eq!(
            reason(&[("room", "r"), ("amount", "5"), ("ts", "soon")]),
            Reason::Ts
        );
        assert_eq!(
            reason(&[("room", "r"), ("amount", "5"), ("ts", "310001")]),
            Reason::Future
        );
        assert!(parse(
            &ev(&[("room", "r"), ("amount", "5"), ("ts", "310000")]),
            "1-0",
            &boards(),
            10_000,
            300_000
        )
        .is_ok());
    }

    #[test]
    fn the_first_reason_wins() {
        // member beats scope, id, amount and ts.
        assert_eq!(
            reason(&[
                ("room", "r"),
                ("user", ""),
                ("amount", "x"),
                ("id", ""),
                ("ts", "x")
            ]),
            Reason::Member
        );
        // scope (room is also the rooms board's member, so make it valid there and invalid as scope: impossible)
        // id beats amount and ts.
        assert_eq!(
            reason(&[("room", "r"), ("amount", "x"), ("id", ""), ("ts", "x")]),
            Reason::Id
        );
        // amount beats ts and future.
        assert_eq!(
            reason(&[("room", "r"), ("amount", "0"), ("ts", "x")]),
            Reason::Amount
        );
        // ts beats future (future needs a valid ts).
        assert_eq!(
            reason(&[("room", "r"), ("amount", "1"), ("ts", "-5")]),
            Reason::Ts
        );
    }

    #[test]
    fn json_numbers_are_taken_by_their_exact_value() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"room":42,"amount":12.50,"ts":1763700000123.0}"#).unwrap();
        let f = fields_from_json(&v).unwrap();
        assert!(f.contains(&(b"amount".to_vec(), b"12.5".to_vec())));
        assert!(f.contains(&(b"room".to_vec(), b"42".to_vec())));
        assert!(f.contains(&(b"ts".to_vec(), b"1763700000123".to_vec())));
        for (written, plain) in [
            ("0", "0"),
            ("-0.0", "0"),
            ("1e3", "1000"),
            ("1E+3", "1000"),
            ("-12.50e3", "-12500"),
            ("0.0012", "0.0012"),
            ("12e-4", "0.0012"),
            ("100", "100"),
            ("9007199254740991", "9007199254740991"),
            ("0.10000000000000000001", "0.10000000000000000001"),
        ] {
            assert_eq!(plain_number(written).as_deref(), Some(plain), "{written}");
        }
        // Too long written plainly: kept as written.
        for long in ["1e300", "5.139025901379653e-279", "1e99999999999999999999"] {
            assert_eq!(plain_number(long), None, "{long}");
        }
        for bad in [
            r#"{"a":true}"#,
            r#"{"a":null}"#,
            r#"{"a":[1]}"#,
            r#"{"a":{}}"#,
            "[1]",
            "3",
        ] {
            let v: serde_json::Value = serde_json::from_str(bad).unwrap();
            assert!(fields_from_json(&v).is_err(), "{bad}");
        }
    }

    /// An event of more fields than one request can append (and dead-letter) is refused;
    /// one of exactly that many is taken.
    #[test]
    fn an_event_of_too_many_fields_is_refused() {
        let object = |n: usize| {
            let map: serde_json::Map<String, serde_json::Value> = (0..n)
                .map(|i| (format!("f{i}"), serde_json::Value::from("v")))
                .collect();
            serde_json::Value::Object(map)
        };
        assert_eq!(
            fields_from_json(&object(MAX_EVENT_FIELDS)).map(|f| f.len()),
            Ok(MAX_EVENT_FIELDS)
        );
        let e = fields_from_json(&object(MAX_EVENT_FIELDS + 1)).unwrap_err();
        assert_eq!(e, "an event has at most 1000 fields, this one has 1001");
    }

    #[test]
    fn a_scope_is_checked_like_a_member() {
        let bs = vec![board("fans", "user", Some("channel"), "amount", 0, false)];
        let r = parse(
            &ev(&[("user", "u"), ("channel", ""), ("amount", "1")]),
            "1-0",
            &bs,
            10,
            0,
        )
        .unwrap_err();
        assert_eq!(r.reason, Reason::Scope);
        let r = parse(
            &ev(&[("user", ""), ("channel", ""), ("amount", "1")]),
            "1-0",
            &bs,
            10,
            0,
        )
        .unwrap_err();
        assert_eq!(r.reason, Reason::Member);
    }

    #[test]
    fn only_events_without_an_id_get_a_fresh_valid_one() {
        assert_eq!(fresh_id(&ev(&[("room", "r"), ("id", "mine")])), None);
        let a = fresh_id(&ev(&[("room", "r")])).unwrap();
        let b = fresh_id(&ev(&[("room", "r")])).unwrap();
        assert_ne!(a, b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 7);
        let with_id = ev(&[("room", "r"), ("amount", "1"), ("id", &a)]);
        let v = validate(&with_id, &boards()).unwrap();
        assert_eq!(v.id.as_deref(), Some(a.as_str()));
    }
}
