//! One path from what a producer hands over to entries in the intake stream, shared by
//! `POST /v1/events` (a JSON body) and `rollboard send` (JSON lines): parse, validate
//! against the boards (all or nothing: nothing is appended while one event is invalid),
//! append with an `id` for every event, and wait for the replicas the settings ask for.

use serde_json::{json, Value};

use crate::config::IngestSettings;
use crate::domain::board::Board;
use crate::domain::event::{fields_from_json, validate, Field};
use crate::ingest::stream;
use crate::store::{Store, StoreError};

/// Most events one `POST /v1/events` may carry.
pub const MAX_EVENTS: usize = 10_000;

/// Why a body was not accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyError {
    /// The body as a whole is refused (not UTF-8, not JSON, too many events, not objects).
    Malformed(String),
    /// Some events are invalid: `{index, reason, detail}` for each.
    Invalid(Vec<Value>),
}

/// Parses a `POST /v1/events` body (one JSON object or an array of them) into the fields of
/// each event, validated against `boards`: every event valid, or the reason for each invalid
/// one, or why the body as a whole is refused. Pure: nothing is appended.
pub fn parse_body(body: &[u8], boards: &[Board]) -> Result<Vec<Vec<Field>>, BodyError> {
    let text =
        std::str::from_utf8(body).map_err(|_| BodyError::Malformed("body is not UTF-8".into()))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let not_json = |e: serde_json::Error| BodyError::Malformed(format!("body is not JSON: {e}"));
    // Each element is parsed on its own, so a repeated key is reported with its index.
    let items: Vec<Result<Value, String>> = if text.trim_start().starts_with('[') {
        let raw: Vec<&serde_json::value::RawValue> =
            serde_json::from_str(text).map_err(not_json)?;
        if raw.len() > MAX_EVENTS {
            return Err(BodyError::Malformed(format!(
                "at most {MAX_EVENTS} events per request, got {}",
                raw.len()
            )));
        }
        raw.iter().map(|r| event_value(r.get())).collect()
    } else {
        // Syntax first, so a body that is not JSON at all is told apart from a bad event.
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(not_json)?;
        match event_value(text) {
            Ok(object @ Value::Object(_)) => vec![Ok(object)],
            Ok(_) => {
                return Err(BodyError::Malformed(
                    "body must be one JSON object or an array of them".into(),
                ))
            }
            Err(e) => vec![Err(e)],
        }
    };
    let mut accepted = Vec::with_capacity(items.len());
    let mut invalid = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let checked = item
            .and_then(|item| fields_from_json(&item))
            .map_err(|detail| json!({ "index": index, "reason": "fields", "detail": detail }))
            .and_then(|fields| match validate(&fields, boards) {
                Ok(_) => Ok(fields),
                Err(r) => {
                    Err(json!({ "index": index, "reason": r.reason.as_str(), "detail": r.detail }))
                }
            });
        match checked {
            Ok(fields) => accepted.push(fields),
            Err(e) => invalid.push(e),
        }
    }
    if !invalid.is_empty() {
        return Err(BodyError::Invalid(invalid));
    }
    Ok(accepted)
}

/// The number of events in a body [`parse_body`] parsed (an array's length, else one).
pub fn events_in(body: &[u8]) -> u64 {
    let text = std::str::from_utf8(body).unwrap_or("");
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    serde_json::from_str::<Vec<serde::de::IgnoredAny>>(text).map_or(1, |v| v.len() as u64)
}

/// Parses and validates one line (`number` counts from 1); `Ok(None)` for a blank line.
pub fn parse_line(
    bytes: &[u8],
    number: u64,
    boards: &[Board],
) -> Result<Option<Vec<Field>>, String> {
    let bytes = match number {
        1 => bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes),
        _ => bytes,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "line {number}: not UTF-8 (invalid byte at column {})",
            e.valid_up_to() + 1
        )
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    event_value(text)
        .and_then(|v| fields_from_json(&v))
        .and_then(|fields| {
            validate(&fields, boards)
                .map(|_| Some(fields))
                .map_err(|r| r.to_string())
        })
        .map_err(|why| format!("line {number}: {why}"))
}

/// Parses one event's JSON text: like `serde_json::from_str`, except that an object with a
/// repeated key is refused (instead of the last value silently winning).
pub fn event_value(text: &str) -> Result<serde_json::Value, String> {
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str::<StrictObject>(text).map(|o| o.0)
    } else {
        serde_json::from_str(text)
    };
    parsed.map_err(|e| {
        if e.is_data() {
            e.to_string()
        } else {
            format!("not JSON: {e}")
        }
    })
}

/// A JSON object whose keys are all different.
struct StrictObject(serde_json::Value);

impl<'de> serde::Deserialize<'de> for StrictObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = StrictObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StrictObject, A::Error> {
                let mut object = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if object.contains_key(&key) {
                        let shown: String = key.chars().take(64).collect();
                        return Err(serde::de::Error::custom(format_args!(
                            "field {shown:?} appears more than once"
                        )));
                    }
                    let value = map.next_value::<serde_json::Value>()?;
                    object.insert(key, value);
                }
                Ok(StrictObject(serde_json::Value::Object(object)))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Appends `events` (each given an `id` when it has none, so that a repeat of this append
/// is a duplicate) and waits until the replicas the settings ask for hold them.
pub async fn append(
    store: &Store,
    settings: &IngestSettings,
    events: &[Vec<Field>],
) -> Result<(), StoreError> {
    let written = stream::append(store.client(), settings, events)
        .await
        .map_err(StoreError::from)?;
    store.confirm_writes(&written).await
}
