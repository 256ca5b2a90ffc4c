//! The OpenAPI document a daemon serves: the routes' description ([`super::openapi::ApiDoc`],
//! generated from the handlers' typed parameters and bodies) made into one per configured
//! board, so that what depends on the board is in the schema too. Each board has its own
//! paths (`/v1/boards/rooms_7d/top`); on each, `scope` is required on a scoped board and
//! absent elsewhere, `window` is an enum of the board's windows, `period` is there only on
//! a calendar-period board (with the pattern of its ids), a sharded board's `offset` has
//! its own bound, `changes` is there only on a board with a feed, and the body of `ranks`
//! says the same; the events' body lists the configured member, scope and amount fields
//! with what each takes.

use serde_json::{json, Map, Value};
use utoipa::PartialSchema;

use super::params::Name;
use super::query::SHARDED_OFFSET;
use crate::domain::board::{Board, MAX_TOTAL};
use crate::domain::event::MAX_ID_BYTES;
use crate::domain::limits::MAX_EVENT_FIELDS;
use crate::ingest::intake::MAX_EVENTS;

/// The template of a board's routes, replaced by each board's name.
const BOARD: &str = "{board}";

/// `generic` (the routes' description, `{board}` in their paths) made into the document of
/// a daemon configured with `boards`.
pub(super) fn served(mut generic: Value, boards: &[Board]) -> Value {
    let paths = match generic.get_mut("paths").map(Value::take) {
        Some(Value::Object(paths)) => paths,
        _ => Map::new(),
    };
    let mut served = Map::new();
    for (path, item) in paths {
        if !path.contains(BOARD) {
            served.insert(path, item);
            continue;
        }
        for board in boards {
            if path.ends_with("/changes") && board.changes.is_none() {
                continue;
            }
            let mut item = item.clone();
            if let Some(operations) = item.as_object_mut() {
                for operation in operations.values_mut() {
                    for_board(operation, board);
                    // Unique among the document's operations, as OpenAPI wants.
                    if let Some(id) = operation.get("operationId").and_then(Value::as_str) {
                        operation["operationId"] = json!(format!("{id}_{}", board.name));
                    }
                }
            }
            served.insert(path.replace(BOARD, &board.name), item);
        }
    }
    if let Some(body) = generic.pointer_mut("/components/schemas/EventsBody") {
        *body = events_body(boards);
    }
    generic["paths"] = Value::Object(served);
    generic
}

/// One operation of a board's route, as `board` takes it.
fn for_board(operation: &mut Value, board: &Board) {
    if let Some(Value::Array(parameters)) = operation.get_mut("parameters") {
        parameters.retain_mut(|p| parameter(p, board));
    }
    let body = operation.pointer_mut("/requestBody/content/application~1json/schema");
    if let Some(schema) = body {
        if schema.get("$ref") == Some(&json!("#/components/schemas/RanksBody")) {
            *schema = ranks_body(board);
        }
    }
}

/// `parameter` as `board` takes it; false when the board takes no such parameter.
fn parameter(parameter: &mut Value, board: &Board) -> bool {
    let name = parameter["name"].as_str().unwrap_or_default().to_string();
    let place = parameter["in"].as_str().unwrap_or_default().to_string();
    match (place.as_str(), name.as_str()) {
        ("path", "board") => false,
        ("path", "member") => {
            parameter["schema"] = name_schema();
            true
        }
        ("query", "scope") => {
            if let Some(field) = &board.scope {
                parameter["required"] = json!(true);
                parameter["schema"] = name_schema();
                parameter["description"] = json!(format!(
                    "The scope value (the events' `{field}`): this board is scoped, so it is \
                     required."
                ));
            }
            board.scope.is_some()
        }
        ("query", "window") => {
            parameter["schema"] = json!({ "type": "string", "enum": window_names(board) });
            true
        }
        ("query", "period") => match &board.period {
            Some(calendar) => {
                parameter["schema"] = json!({
                    "type": "string",
                    "pattern": period_pattern(calendar.period.id_pattern()),
                });
                true
            }
            None => false,
        },
        ("query", "offset") if board.is_sharded() => {
            parameter["schema"]["maximum"] = json!(SHARDED_OFFSET);
            true
        }
        _ => true,
    }
}

/// The pattern of a period parameter: `current`, `previous` or an id of this shape.
fn period_pattern(id: &str) -> String {
    format!("^(current|previous|{id})$")
}

/// The names a board's `window` takes: its windows as the configuration writes them, or
/// on a calendar-period board its period's length.
fn window_names(board: &Board) -> Vec<String> {
    match &board.period {
        Some(calendar) => vec![calendar.period_name().to_string()],
        None => board.window_list().into_iter().map(|w| w.name).collect(),
    }
}

/// The schema of a member or scope value.
fn name_schema() -> Value {
    serde_json::to_value(Name::schema()).unwrap_or_default()
}

/// The body of `ranks` on `board`.
fn ranks_body(board: &Board) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "members".into(),
        json!({
            "type": "array",
            "items": name_schema(),
            "minItems": 1,
            "maxItems": super::query::MAX_RANKS_MEMBERS,
            "description": "The members; a member listed twice is answered once.",
        }),
    );
    let mut required = vec![json!("members")];
    match &board.scope {
        Some(_) => {
            properties.insert("scope".into(), name_schema());
            required.push(json!("scope"));
        }
        None => {
            properties.insert(
                "scope".into(),
                json!({ "type": "null", "description": "This board is not scoped." }),
            );
        }
    }
    let mut windows: Vec<Value> = window_names(board).into_iter().map(Value::from).collect();
    windows.push(Value::Null);
    properties.insert(
        "window".into(),
        json!({ "enum": windows, "description": "The window read; the first when absent." }),
    );
    properties.insert(
        "period".into(),
        match &board.period {
            Some(calendar) => json!({
                "type": ["string", "null"],
                "pattern": period_pattern(calendar.period.id_pattern()),
                "description": "The period read; the current one when absent.",
            }),
            None => json!({ "type": "null", "description": "This board has no period." }),
        },
    );
    json!({
        "type": "object",
        "description": "The body of `ranks` on this board.",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The body of `POST /v1/events` for `boards`: one event or an array of them, each event
/// with the fields of at least one board.
fn events_body(boards: &[Board]) -> Value {
    let mut properties = Map::new();
    let any_number = json!({ "type": "number" });
    let name = json!({ "anyOf": [name_schema(), any_number] });
    for board in boards {
        properties.insert(board.member.clone(), name.clone());
        if let Some(scope) = &board.scope {
            properties.insert(scope.clone(), name.clone());
        }
    }
    // An amount field is read by every board it is the amount of: what all of them take.
    for board in boards {
        let sharing: Vec<&Board> = boards.iter().filter(|b| b.amount == board.amount).collect();
        let scale = sharing.iter().map(|b| b.scale).min().unwrap_or(0);
        let negative = sharing.iter().all(|b| b.allow_negative);
        properties.insert(board.amount.clone(), amount_schema(scale, negative));
    }
    properties.insert(
        "id".into(),
        json!({
            "anyOf": [
                { "type": "string", "minLength": 1, "maxLength": MAX_ID_BYTES,
                  "x-max-bytes": MAX_ID_BYTES },
                any_number,
            ],
            "description": format!(
                "The idempotency key, 1 to {MAX_ID_BYTES} bytes of UTF-8; given one when absent."
            ),
        }),
    );
    properties.insert(
        "ts".into(),
        json!({
            "anyOf": [
                { "type": "string", "pattern": format!("^0*{}$", at_most(MAX_TOTAL as u64)) },
                { "type": "integer", "minimum": 0, "maximum": MAX_TOTAL },
            ],
            "description": "The event's time, epoch ms in decimal digits; the time it is \
                            read when absent.",
        }),
    );
    let matches: Vec<Value> = boards
        .iter()
        .map(|b| {
            let mut fields = vec![b.member.clone(), b.amount.clone()];
            fields.extend(b.scope.clone());
            fields.dedup();
            json!({ "required": fields, "description": format!("An event of board {}", b.name) })
        })
        .collect();
    let event = json!({
        "type": "object",
        "description": format!(
            "One event: its fields are strings or JSON numbers (taken exactly as written), at \
             most {MAX_EVENT_FIELDS}. It needs the fields of at least one board (its member, \
             amount and scope fields) and counts in every board whose fields it has. A \
             repeated key makes it invalid."
        ),
        "properties": properties,
        "additionalProperties": { "type": ["string", "number"] },
        "maxProperties": MAX_EVENT_FIELDS,
        "anyOf": matches,
    });
    json!({
        "description": format!(
            "One event, or an array of at most {MAX_EVENTS}: all valid, all appended (202); \
             any invalid, none appended (400). A byte-order mark is skipped."
        ),
        "oneOf": [
            event,
            { "type": "array", "items": event, "maxItems": MAX_EVENTS },
        ],
    })
}

/// What an amount field takes on boards of `scale` that do (or not) allow negative amounts:
/// decimal text with at most `scale` fraction digits, or a JSON integer, not zero; at most 2^53 - 1
/// minor units (below that at the very edge when `scale` is above 0).
fn amount_schema(scale: u32, negative: bool) -> Value {
    let sign = if negative { "-?" } else { "" };
    let units = 10u64.pow(scale);
    let max = MAX_TOTAL as u64;
    // The whole part up to `whole`; at `whole` itself the fraction up to `rest` (of `scale`
    // digits).
    let (whole, rest) = (max / units, max % units);
    let number = match scale {
        0 => at_most(whole),
        s => {
            let below = match whole {
                0 => String::new(),
                w => format!("{}(\\.[0-9]{{1,{s}}})?|", at_most(w - 1)),
            };
            let rest = format!("{rest:0width$}", width = s as usize);
            let fractions: Vec<String> = (1..=rest.len()).map(|l| not_above(&rest[..l])).collect();
            format!("({below}{whole}(\\.({}))?)", fractions.join("|"))
        }
    };
    let least = if negative { -(whole as i64) } else { 0 };
    json!({
        "anyOf": [
            {
                "type": "string",
                "pattern": format!("^(?!-?0*(\\.0*)?$){sign}0*{number}$"),
            },
            { "type": "integer", "minimum": least, "maximum": whole, "not": { "const": 0 } },
        ],
        "description": format!(
            "The amount, not zero: decimal digits with at most {scale} fraction digits{}, up \
             to 2^53 - 1 minor units.",
            if negative { ", a leading - for a refund" } else { "" }
        ),
    })
}

/// A pattern of the strings of as many decimal digits as `digits` (leading zeros counted)
/// that are not above it.
fn not_above(digits: &str) -> String {
    let d: Vec<u32> = digits.chars().filter_map(|c| c.to_digit(10)).collect();
    let mut ways = Vec::new();
    for i in 0..d.len() {
        if d[i] > 0 {
            let prefix: String = digits[..i].to_string();
            let rest = d.len() - i - 1;
            ways.push(format!("{prefix}[0-{}][0-9]{{{rest}}}", d[i] - 1));
        }
    }
    ways.push(digits.to_string());
    format!("({})", ways.join("|"))
}

/// A pattern of the decimal numbers from 0 to `n`, without leading zeros.
fn at_most(n: u64) -> String {
    let digits: Vec<u32> = n
        .to_string()
        .chars()
        .filter_map(|c| c.to_digit(10))
        .collect();
    let k = digits.len();
    let mut ways = Vec::new();
    if k > 1 {
        ways.push(format!("[0-9]{{1,{}}}", k - 1));
    }
    for i in 0..k {
        let prefix: String = digits[..i].iter().map(|d| d.to_string()).collect();
        let low = u32::from(i == 0 && k > 1);
        if digits[i] > low {
            let rest = k - i - 1;
            let class = format!("[{low}-{}]", digits[i] - 1);
            ways.push(match rest {
                0 => format!("{prefix}{class}"),
                r => format!("{prefix}{class}[0-9]{{{r}}}"),
            });
        }
    }
    ways.push(n.to_string());
    format!("({})", ways.join("|"))
}

#[cfg(test)]
mod tests {
    use super::{amount_schema, at_most};

    /// What the amount's schema takes is what `parse_amount` takes, near the edges too.
    #[test]
    fn the_amount_schema_is_the_amount_rule() {
        for (scale, negative) in [(0, false), (0, true), (2, true), (3, false)] {
            let schema = amount_schema(scale, negative);
            let check = jsonschema::draft202012::new(&schema).expect("schema");
            let mut texts = vec![
                "0".to_string(),
                "-0".into(),
                "0.0".into(),
                "1".into(),
                "-1".into(),
                "007".into(),
                "1.5".into(),
                "1.".into(),
                ".5".into(),
                "0.001".into(),
                "0.0001".into(),
                "9007199254740991".into(),
                "9007199254740992".into(),
                "90071992547409.91".into(),
                "90071992547409.92".into(),
                "90071992547409.9".into(),
                "90071992547409".into(),
                "90071992547410".into(),
                "9007199254740.991".into(),
                "9007199254740.992".into(),
                "-90071992547409".into(),
                "-90071992547409.91".into(),
                "1e3".into(),
                "+1".into(),
            ];
            texts.extend((0..200).map(|i| format!("{}.{}", i * 37, i % 1000)));
            for text in texts {
                let rule = crate::domain::event::parse_amount(text.as_bytes(), scale, negative);
                let valid = rule.is_ok() && rule != Ok(0);
                assert_eq!(
                    check.is_valid(&serde_json::json!(text)),
                    valid,
                    "{text} at scale {scale}, negative {negative}: {rule:?}"
                );
            }
        }
    }

    /// The pattern of 0..=n matches exactly the numbers up to n.
    #[test]
    fn at_most_is_exact() {
        for n in [
            0u64,
            7,
            9,
            10,
            19,
            99,
            100,
            305,
            1000,
            9_007_199_254_740_991,
        ] {
            let pattern = format!("^0*{}$", at_most(n));
            let schema = serde_json::json!({ "type": "string", "pattern": pattern });
            let re = jsonschema::draft202012::new(&schema).expect("pattern");
            let re = |text: &str| re.is_valid(&serde_json::json!(text));
            for m in [0u64, 1, 9, 10, 11, 99, 100, 101, 305, 306, 999, 1000, 1001] {
                assert_eq!(re(&m.to_string()), m <= n, "{m} against {n}: {pattern}");
            }
            assert!(re(&n.to_string()));
            assert!(!re(&(n + 1).to_string()), "{n}: {pattern}");
            assert!(re(&format!("00{n}")));
        }
    }
}
