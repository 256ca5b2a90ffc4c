//! The query string and the values every route reads, each parameter defined once: a route's
//! parameters are a struct that both reads the query (`serde`) and describes it in the
//! OpenAPI document (`utoipa`'s `IntoParams`), with value types ([`Name`], [`bounded!`] numbers)
//! that carry their own checks and their own schema.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::error::{ApiError, ApiResult};
use crate::domain::event::{check_name, MAX_NAME_BYTES};

/// The query of a route whose parameters are `T`: every name checked against those `T`
/// declares (a misspelt `?limt=5` is named, never ignored), every name and value
/// percent-decoded and refused when that is not UTF-8 (never silently replaced), then each
/// value read by its type, an error naming the parameter.
pub(super) fn read_query<T: DeserializeOwned + IntoParams>(raw: Option<String>) -> ApiResult<T> {
    let declared: Vec<String> = T::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .map(|p| p.name)
        .collect();
    let declared: Vec<&str> = declared.iter().map(String::as_str).collect();
    let raw = raw.unwrap_or_default();
    checked(&raw, &declared)?;
    let pairs = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
    serde_path_to_error::deserialize(pairs).map_err(|e| {
        let name = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde's own words for a repeated name, a value of the wrong kind.
        ApiError::BadRequest(match inner.strip_prefix("duplicate field ") {
            Some(_) => format!("query parameter {name} is given twice"),
            None if inner.starts_with("must ") => format!("{name} {inner}"),
            None => format!("{name}: {inner}"),
        })
    })
}

/// Checks a query that takes no parameters: empty, or a 400 naming the first.
pub(super) fn none(raw: Option<String>) -> ApiResult<()> {
    checked(raw.as_deref().unwrap_or(""), &[])
}

/// Every name of `raw` is among `declared`, and every name and value is UTF-8 once
/// percent-decoded.
fn checked(raw: &str, declared: &[&str]) -> ApiResult<()> {
    for pair in raw.split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            let spaced = text.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8()
                .map(|v| v.into_owned())
        };
        let name = decode(name).map_err(|_| {
            ApiError::BadRequest("a query parameter name is not UTF-8 once decoded".into())
        })?;
        decode(value).map_err(|_| {
            let shown: String = name.chars().take(32).collect();
            ApiError::BadRequest(format!(
                "query parameter {shown:?} is not UTF-8 once decoded"
            ))
        })?;
        if !declared.contains(&name.as_str()) {
            return Err(unknown(&name, declared));
        }
    }
    Ok(())
}

/// The 400 of a parameter the route does not take, naming those it takes.
fn unknown(name: &str, declared: &[&str]) -> ApiError {
    let takes = match declared {
        [] => "no query parameters".to_string(),
        names => format!("only {}", names.join(", ")),
    };
    ApiError::BadRequest(format!(
        "unknown query parameter {}: this route takes {takes}",
        crate::domain::event::shown(name.as_bytes())
    ))
}

/// What a member or a scope value may be: 1 to 256 bytes of UTF-8 without a control
/// character ([`check_name`]). Its schema says so: `maxLength` counts characters, so it
/// is exact for ASCII; the byte limit is in the description and `x-max-bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Name(pub String);

/// The pattern of a [`Name`]: no control character (Unicode's `Cc`, what
/// `char::is_control` refuses).
pub(super) const NAME_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

impl Name {
    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `why`, an error of a body being read, is a name's refusal (what
    /// [`check_name`] answers), which names no value and can be shown as it is.
    pub(super) fn is_refusal(why: &str) -> bool {
        why.starts_with("is ") || why.starts_with("contains ")
    }

    /// `text` as a name, or why it is not one (`is empty`, `is 300 bytes long...`).
    pub(super) fn new(text: String) -> Result<Name, String> {
        check_name(text.as_bytes())?;
        Ok(Name(text))
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        Name::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl PartialSchema for Name {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_NAME_BYTES))
            .pattern(Some(NAME_PATTERN))
            .description(Some(format!(
                "1 to {MAX_NAME_BYTES} bytes of UTF-8, no control character"
            )))
            .extensions(Some(
                utoipa::openapi::extensions::ExtensionsBuilder::new()
                    .add("x-max-bytes", MAX_NAME_BYTES)
                    .build(),
            ))
            .into()
    }
}

impl ToSchema for Name {}

/// A whole number within a range, with a default: `bounded!(Limit, 1, 1000, 10)` makes
/// the type `Limit`, refused outside `1..=1000` with the range named, whose schema is the
/// same range and default; `Limit::or_default(given)` is the value given or the default.
macro_rules! bounded {
    ($(#[$doc:meta])* $name:ident, $min:expr, $max:expr, $default:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(super) struct $name(pub u64);

        impl $name {
            pub(super) const MIN: u64 = $min;
            pub(super) const MAX: u64 = $max;
            pub(super) const DEFAULT: u64 = $default;

            /// The value given, or the default.
            pub(super) fn or_default(given: Option<$name>) -> u64 {
                given.map_or(Self::DEFAULT, |n| n.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                $crate::edges::http::params::bounded_number(deserializer, Self::MIN, Self::MAX)
                    .map($name)
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                $crate::edges::http::params::bounded_schema(Self::MIN, Self::MAX, Self::DEFAULT)
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}
pub(super) use bounded;

/// A number from `min` to `max`, given as text; refused naming the range, never echoing
/// the value (it can be arbitrarily long).
pub(super) fn bounded_number<'de, D: Deserializer<'de>>(
    deserializer: D,
    min: u64,
    max: u64,
) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| serde::de::Error::custom(format!("must be an integer from {min} to {max}")))
}

/// The schema of a number from `min` to `max` with its default.
pub(super) fn bounded_schema(min: u64, max: u64, default: u64) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(min as f64))
        .maximum(Some(max as f64))
        .default(Some(default.into()))
        .into()
}

/// `true` or `false`, nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Flag, D::Error> {
        match String::deserialize(deserializer)?.as_str() {
            "true" => Ok(Flag(true)),
            "false" => Ok(Flag(false)),
            _ => Err(serde::de::Error::custom("must be true or false")),
        }
    }
}

impl PartialSchema for Flag {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Boolean)
            .default(Some(false.into()))
            .into()
    }
}

impl ToSchema for Flag {}

#[cfg(test)]
mod tests {
    use super::Name;
    use proptest::prelude::*;
    use utoipa::PartialSchema;

    proptest! {
        /// On ASCII (where JSON Schema's length in characters is the length in bytes) the
        /// schema of a name takes exactly what `check_name` takes.
        #[test]
        fn the_name_schema_is_the_name_rule(
            text in prop_oneof!["[ -~]{0,300}", "[\\x00-\\x7f]{0,12}"],
        ) {
            let schema = serde_json::to_value(Name::schema()).expect("schema");
            let check = jsonschema::draft202012::new(&schema).expect("valid schema");
            prop_assert_eq!(
                check.is_valid(&serde_json::json!(text)),
                Name::new(text.clone()).is_ok(),
                "{:?}", text
            );
        }

        /// Beyond ASCII the schema still refuses every control character the rule refuses.
        #[test]
        fn a_control_character_is_refused_by_both(
            before in "[a-z]{0,8}",
            control in prop::sample::select(vec!['\u{0}', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}']),
        ) {
            let text = format!("{before}{control}");
            let schema = serde_json::to_value(Name::schema()).expect("schema");
            let check = jsonschema::draft202012::new(&schema).expect("valid schema");
            prop_assert!(!check.is_valid(&serde_json::json!(text)));
            prop_assert!(Name::new(text).is_err());
        }
    }
}
