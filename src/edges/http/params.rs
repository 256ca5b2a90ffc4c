//! The query string every route reads: percent-decoded, each parameter checked against
//! the ones the route takes.

use std::collections::HashMap;

use super::error::{ApiError, ApiResult};

/// The query parameters, percent-decoded; a value that is not UTF-8 once decoded is a 400,
/// never silently replaced, and so is a parameter the route does not take (not in
/// `allowed`): a misspelt `?limt=5` is named, never ignored.
pub(super) fn params(
    query: Option<String>,
    allowed: &[&str],
) -> ApiResult<HashMap<String, String>> {
    let mut params = HashMap::new();
    for pair in query.as_deref().unwrap_or("").split('&') {
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
        let value = decode(value).map_err(|_| {
            let shown: String = name.chars().take(32).collect();
            ApiError::BadRequest(format!(
                "query parameter {shown:?} is not UTF-8 once decoded"
            ))
        })?;
        if !allowed.contains(&name.as_str()) {
            return Err(unknown(&name, allowed));
        }
        params.insert(name, value);
    }
    Ok(params)
}

/// The 400 of a parameter the route does not take, naming those it takes.
fn unknown(name: &str, allowed: &[&str]) -> ApiError {
    let takes = match allowed {
        [] => "no query parameters".to_string(),
        names => format!("only {}", names.join(", ")),
    };
    ApiError::BadRequest(format!(
        "unknown query parameter {}: this route takes {takes}",
        crate::domain::event::shown(name.as_bytes())
    ))
}
