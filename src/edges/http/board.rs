//! `GET /v1/boards/{board}`: one board's settings and, for a calendar-period board, where
//! it stands: the current period, its start, when it resets, and the archives kept.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{redis, ApiError, ApiResult, ErrorBody};
use super::params::none;
use super::AppState;
use crate::domain::board::Board;

/// A board as `GET /v1/boards` lists it and `GET /v1/boards/{board}` opens it: its
/// settings; a calendar-period board adds its calendar (and no window or slice), and
/// `GET /v1/boards/{board}` adds where a period board stands at Redis's clock.
// The fields are declared in the order of their names, the order the answer has always
// had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct BoardDescription {
    /// Whether totals may go below zero.
    allow_negative: bool,
    /// The event field holding the amount.
    amount: String,
    /// Period boards, `GET /v1/boards/{board}` only: the closed periods kept, newest
    /// first (a period without a tip has no archive).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    archived_periods: Option<Vec<String>>,
    /// The places at the top whose changes the board's change feed records
    /// (`GET /v1/boards/{board}/changes`); null for a board without a feed.
    #[schema(required = true)]
    changes_top: Option<u32>,
    /// Whether answers carry `dense_rank`.
    dense_rank: bool,
    /// Period boards only: the closed periods kept besides the current one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    keep_periods: Option<u32>,
    /// The event field naming the member.
    member: String,
    /// `incremental` or `resummarize`.
    #[schema(example = "incremental")]
    mode: String,
    /// The board's name.
    name: String,
    /// Period boards, `GET /v1/boards/{board}` only: when the current period ends, epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    next_reset: Option<i64>,
    /// Period boards only: `day`, `week` or `month`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "week", nullable = false)]
    period: Option<String>,
    /// Period boards only: how long a closed period still takes late events, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    period_grace_ms: Option<i64>,
    /// Period boards, `GET /v1/boards/{board}` only: the current period's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2026-W48", nullable = false)]
    period_id: Option<String>,
    /// Period boards, `GET /v1/boards/{board}` only: when the current period started,
    /// epoch ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    period_start: Option<i64>,
    /// Decimal places of the totals (total = amount x 10^scale).
    scale: u32,
    /// How many shards (cluster slots) the board's ranking is spread over; 1 for one.
    #[schema(example = 1)]
    shards: u32,
    /// The event field naming the scope, null for an unscoped board.
    #[schema(required = true)]
    scope: Option<String>,
    /// The width of a slice, in ms (null on a period board).
    #[schema(required = true)]
    slice_ms: Option<i64>,
    /// `earliest`, `latest` or `none`.
    #[schema(example = "earliest")]
    tie_break: String,
    /// Period boards only: the IANA time zone of the periods.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    time_zone: Option<String>,
    /// Period boards only: a weekly board's first day (`monday`, ...), null on others.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, nullable = true)]
    week_start: Option<Option<String>>,
    /// The first configured window (the one queries read by default), in ms (null on a
    /// period board).
    #[schema(required = true)]
    window_ms: Option<i64>,
    /// Every window the board ranks, in the configuration's order (the first is the
    /// default of `window=`); one for a board with one `window` (null on a period board).
    #[schema(required = true)]
    windows: Option<Vec<WindowDescription>>,
}

/// One window of a board, as `GET /v1/boards` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct WindowDescription {
    /// The window as the configuration writes it (`24h`): the name `window=` takes and
    /// answers carry.
    #[schema(example = "24h")]
    name: String,
    /// Its width, in ms.
    #[schema(example = 86400000)]
    ms: i64,
}

/// The answer of `GET /v1/boards`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct BoardList {
    /// Every configured board, in the order of the configuration.
    boards: Vec<BoardDescription>,
}

impl BoardList {
    /// Every board of `boards`, described.
    pub(super) fn of(boards: &[Board]) -> BoardList {
        BoardList {
            boards: boards.iter().map(description).collect(),
        }
    }
}

/// `GET /v1/boards/{board}`: the board as `GET /v1/boards` lists it; a period board adds
/// `period_id`, `period_start` and `next_reset` (epoch ms, at Redis's clock) and
/// `archived_periods` (ids, newest first).
#[utoipa::path(
    get,
    path = "/v1/boards/{board}",
    tag = "boards",
    params(("board" = String, Path, description = "The board's name")),
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "The board", body = BoardDescription),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board", body = ErrorBody),
        (status = 503, description = "A Redis outage (period boards); with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn board(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<BoardDescription>> {
    let Path(name) = name.map_err(|_| {
        ApiError::BadRequest("invalid path: a segment is not UTF-8 once percent-decoded".into())
    })?;
    none(query)?;
    let b = state.settings.board(&name).ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown board {}",
            crate::domain::event::shown(name.as_bytes())
        ))
    })?;
    let mut answer = description(b);
    if let Some(calendar) = &b.period {
        let now = state.clock.now();
        let at = redis(&state, state.store.period_state(b, calendar, now)).await?;
        answer.period_id = Some(at.current.id);
        answer.period_start = Some(at.current.start_ms);
        answer.next_reset = Some(at.current.end_ms);
        answer.archived_periods = Some(at.archived);
    }
    Ok(Json(answer))
}

/// How `GET /v1/boards` lists a board, and `GET /v1/boards/{board}` opens: its settings
/// and windows, and for a period board its calendar (`period`, `time_zone`, `week_start`
/// for weekly boards, `period_grace_ms` and `keep_periods`) and no window or slice
/// (`null`).
fn description(b: &Board) -> BoardDescription {
    let calendar = b.period.as_ref();
    let rolling = |ms: i64| calendar.is_none().then_some(ms);
    BoardDescription {
        allow_negative: b.allow_negative,
        amount: b.amount.clone(),
        archived_periods: None,
        changes_top: b.changes.map(|c| c.top),
        dense_rank: b.dense_rank,
        keep_periods: calendar.map(|c| c.keep),
        member: b.member.clone(),
        mode: b.mode.as_str().to_string(),
        name: b.name.clone(),
        next_reset: None,
        period: calendar.map(|c| c.period_name().to_string()),
        period_grace_ms: calendar.map(|c| c.grace_ms),
        period_id: None,
        period_start: None,
        scale: b.scale,
        shards: b.shards,
        scope: b.scope.clone(),
        slice_ms: rolling(b.slice_ms),
        tie_break: b.tie_break.as_str().to_string(),
        time_zone: calendar.map(|c| c.zone.name().to_string()),
        week_start: calendar.map(|c| c.week_start().map(str::to_string)),
        window_ms: b.view(None).and_then(|v| rolling(v.window_ms())),
        windows: calendar.is_none().then(|| {
            b.window_list()
                .into_iter()
                .map(|w| WindowDescription {
                    name: w.name,
                    ms: w.ms,
                })
                .collect()
        }),
    }
}
