//! `GET /v1/boards/{board}`: one board's settings and, for a calendar-period board, where
//! it stands: the current period, its start, when it resets, and the archives kept.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use serde_json::{json, Value};

use super::error::{redis, ApiError, ApiResult};
use super::params::params;
use super::AppState;
use crate::domain::board::Board;
use crate::edges::periods::describe;

/// `GET /v1/boards/{board}`: the board as `GET /v1/boards` lists it; a period board adds
/// `period_id`, `period_start` and `next_reset` (epoch ms, at Redis's clock) and
/// `archived_periods` (ids, newest first).
pub(super) async fn board(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<Value>> {
    let Path(name) = name.map_err(|_| {
        ApiError::BadRequest("invalid path: a segment is not UTF-8 once percent-decoded".into())
    })?;
    params(query, &[])?;
    let b = state.settings.board(&name).ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown board {}",
            crate::domain::event::shown(name.as_bytes())
        ))
    })?;
    let mut answer = description(b);
    if let (Some(calendar), Value::Object(fields)) = (&b.period, &mut answer) {
        let now = state.clock.now();
        let at = redis(&state, state.store.period_state(b, calendar, now)).await?;
        fields.insert("period_id".into(), at.current.id.into());
        fields.insert("period_start".into(), at.current.start_ms.into());
        fields.insert("next_reset".into(), at.current.end_ms.into());
        fields.insert("archived_periods".into(), at.archived.into());
    }
    Ok(Json(answer))
}

/// How `GET /v1/boards` lists a board, and `GET /v1/boards/{board}` opens: its settings,
/// and for a period board its calendar (see [`describe`]).
pub(super) fn description(b: &Board) -> Value {
    describe(
        b,
        json!({
            "name": b.name, "member": b.member, "scope": b.scope, "amount": b.amount,
            "scale": b.scale, "window_ms": b.window_ms, "slice_ms": b.slice_ms,
            "mode": b.mode.as_str(), "tie_break": b.tie_break.as_str(),
            "allow_negative": b.allow_negative, "dense_rank": b.dense_rank,
        }),
    )
}
