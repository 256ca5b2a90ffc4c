//! The query routes (`/v1/boards...`): the boards, a board's top, one member's rank, the
//! entries around it and the ranks of a list of members, answered at Redis's clock, and
//! the checks of their path, query parameters and body.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::answers::Key;
use super::board::BoardList;
use super::error::{redis, ApiError, ApiResult, ErrorBody};
use super::params::{bounded, none, read_query, Flag, Name};
use super::AppState;
use crate::domain::board::{Board, View};
use crate::domain::ranking::{MemberRank, MemberWindows, Page, Subset};
use crate::edges::periods::{select, PeriodError, Selected};
use crate::store::SHARDED_DEPTH;

/// The configured board `name`, or a 404 naming it.
pub(super) fn board<'a>(state: &'a AppState, name: &str) -> ApiResult<&'a Board> {
    state.settings.board(name).ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown board {}",
            crate::domain::event::shown(name.as_bytes())
        ))
    })
}

/// The `scope` of a request to `board`: required on a scoped board, refused on another;
/// `given` names where it was missing from or given (`?scope=`, `"scope" in the body`).
pub(super) fn scope_of<'a>(
    board: &Board,
    scope: Option<&'a Name>,
    given: &str,
) -> ApiResult<Option<&'a str>> {
    match (&board.scope, scope) {
        (Some(field), None) => Err(ApiError::BadRequest(format!(
            "board {} is scoped by `{field}`: give {given}",
            board.name
        ))),
        (None, Some(_)) => Err(ApiError::BadRequest(format!(
            "board {} is not scoped: drop {given}",
            board.name
        ))),
        (_, scope) => Ok(scope.map(Name::as_str)),
    }
}

/// The board's window `window` names (`?window=` or a body's `"window"`): the first
/// configured when absent; a window the board does not rank is a 400 naming those it
/// does (see [`crate::edges::windows::view`]).
pub(super) fn view_of<'a>(board: &'a Board, window: Option<&str>) -> ApiResult<View<'a>> {
    crate::edges::windows::view(board, window, "window").map_err(ApiError::BadRequest)
}

/// Redis's clock now, and the period `?period=` names on a period board (see
/// [`crate::edges::periods::select`]).
pub(super) fn period_of(
    state: &AppState,
    board: &Board,
    scope: Option<&str>,
    period: Option<&str>,
) -> ApiResult<(i64, Selected)> {
    let now = state.clock.now();
    let selected = select(board, scope, period, now).map_err(period_error)?;
    Ok((now, selected))
}

/// A period that cannot be read: a usage error is a 400, a period no longer kept a 404.
fn period_error(e: PeriodError) -> ApiError {
    match e {
        PeriodError::Usage(why) => ApiError::BadRequest(why),
        PeriodError::NotKept(why) => ApiError::NotFound(why),
    }
}

/// What the answer to `what` (the route and its parameters, `\0` between them) on the
/// instance `instance` of `view` at `now` is kept under: see [`super::answers`]. This
/// process's write counters are read here, before the query reads Redis.
fn kept_as(state: &AppState, view: &View<'_>, instance: Option<&str>, now: i64, what: &str) -> Key {
    let generation = state.store.read_generation(view, instance);
    // What moves the answer by the clock alone: the slice (or period) `now` is in.
    let (clock, _) = view.live_range(now, None);
    let query = format!(
        "{}\0{}\0{:?}\0{what}",
        view.board().name,
        view.window_ms(),
        instance
    );
    Key::new(query, generation, clock)
}

/// The path parameters, or a JSON 400 when they cannot be decoded (e.g. invalid UTF-8).
pub(super) fn path<T>(extracted: Result<Path<T>, PathRejection>) -> ApiResult<T> {
    // The rejection's own text quotes the segment, which can be long: not echoed.
    extracted.map(|Path(value)| value).map_err(|_| {
        ApiError::BadRequest("invalid path: a segment is not UTF-8 once percent-decoded".into())
    })
}

/// What a calendar-period board's answers add.
// Described only: `Selected::relabel` adds it (and makes `window_from`/`window_to` the
// period's bounds).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct PeriodRead {
    /// Calendar-period boards only: the id of the period read (`2026-11-26`, `2026-W48`,
    /// `2026-11`); `window_from` and `window_to` are then its bounds.
    #[schema(example = "2026-W48", nullable = false)]
    period: Option<String>,
}

/// The answer of `top` and `around`: a page, and on a calendar-period board its period.
// Described only, as are the other answer types below: the handlers relabel the domain's
// answers as JSON (see `Selected::relabel`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct PageAnswer {
    #[serde(flatten)]
    page: Page,
    #[serde(flatten)]
    period: PeriodRead,
}

/// The answer of `members/{member}`: the member's rank, and on a calendar-period board
/// its period.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct RankAnswer {
    #[serde(flatten)]
    rank: MemberRank,
    #[serde(flatten)]
    period: PeriodRead,
}

/// The answer of `members/{member}`: the member's rank in one window, or with
/// `all_windows=true` in every window.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum MemberAnswer {
    /// The member's rank in the window read.
    One(Box<RankAnswer>),
    /// `all_windows=true`: the member in every window (rank fields null in a window
    /// where it is not ranked).
    AllWindows(MemberWindows),
}

/// The 404 of a member not on the board (`members/{member}` and `around`): its rank
/// answer, the rank fields null, with an `error` (the body `rollboard rank --json`
/// prints, exit 3).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct NotOnBoard {
    #[serde(flatten)]
    rank: MemberRank,
    #[serde(flatten)]
    period: PeriodRead,
    /// Names the member, the board, and the scope or period.
    error: String,
}

/// A 404 of `members/{member}` or `around`: an unknown board or a period no longer kept
/// (`ErrorBody`), or a member not on the board (`NotOnBoard`).
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum MemberNotFound {
    /// An unknown board or a period no longer kept.
    Missing(ErrorBody),
    /// The member is not on the board.
    NotOnBoard(Box<NotOnBoard>),
}

/// The answer of `POST .../ranks`: the subset, and on a calendar-period board its period
/// (the subset's `window` is then the period's length, `week`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct RanksAnswer {
    #[serde(flatten)]
    subset: Subset,
    #[serde(flatten)]
    period: PeriodRead,
}

bounded!(
    /// Entries in a page of `top`.
    Limit, 1, 1000, 10
);
bounded!(
    /// Entries skipped before a page of `top`: up to 2^53 - 1, a number every JSON client
    /// holds exactly; on a sharded board at most [`SHARDED_OFFSET`].
    Offset, 0, crate::domain::board::MAX_TOTAL as u64, 0
);
bounded!(
    /// Entries on each side of the member in `around`.
    Radius, 0, 100, 5
);

/// The largest `offset` of a sharded board's page: its page is merged from each shard's
/// first `offset + limit` entries, at most [`SHARDED_DEPTH`] for the largest `limit`.
pub(super) const SHARDED_OFFSET: u64 = SHARDED_DEPTH - Limit::MAX;

/// The query parameters of `top`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct TopQuery {
    /// Entries in the page.
    #[param(inline)]
    limit: Option<Limit>,
    /// Entries skipped before the page (a page past the end is empty); on a sharded board
    /// at most 9000, so that a page reaches at most rank 10000.
    #[param(inline)]
    offset: Option<Offset>,
    /// The scope value: required on a scoped board, refused on another.
    #[param(inline)]
    scope: Option<Name>,
    /// The window read: one of the board's `windows` as the configuration writes it
    /// (`24h`) or an equal duration (`1d`); the first configured when absent. On a
    /// calendar-period board, the period's length (`week`) or absent.
    window: Option<String>,
    /// Calendar-period boards only: `current` (default), `previous` or a period id
    /// (`2026-11-26`, `2026-W48`, `2026-11`).
    period: Option<String>,
}

/// The query parameters of `members/{member}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct MemberQuery {
    /// The scope value: required on a scoped board, refused on another.
    #[param(inline)]
    scope: Option<Name>,
    /// The window read: one of the board's `windows` as the configuration writes it
    /// (`24h`) or an equal duration (`1d`); the first configured when absent. With
    /// `all_windows=true` it is checked, and every window is answered.
    window: Option<String>,
    /// `true`: the member in every window of the board at once, in the configuration's
    /// order (`MemberWindows`), answered 200 whether or not it is ranked.
    #[param(inline)]
    all_windows: Option<Flag>,
    /// Calendar-period boards only: `current` (default), `previous` or a period id.
    period: Option<String>,
}

/// The query parameters of `around`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct AroundQuery {
    /// Entries on each side of the member.
    #[param(inline)]
    radius: Option<Radius>,
    /// The scope value: required on a scoped board, refused on another.
    #[param(inline)]
    scope: Option<Name>,
    /// The window read, as for `top`; the first configured when absent.
    window: Option<String>,
    /// Calendar-period boards only: `current` (default), `previous` or a period id.
    period: Option<String>,
}

/// The member of a route's path, or a 400 saying why it is not one.
fn member_of(member: String) -> ApiResult<Name> {
    Name::new(member).map_err(|why| ApiError::BadRequest(format!("member {why}")))
}

/// `GET /v1/boards`: every configured board and its settings.
#[utoipa::path(
    get,
    path = "/v1/boards",
    tag = "boards",
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "Every configured board", body = BoardList),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
    )
)]
pub(super) async fn boards(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<BoardList>> {
    none(query)?;
    Ok(Json(BoardList::of(&state.settings.boards)))
}

/// `GET /v1/boards/{board}/top`: one page of the ranking.
#[utoipa::path(
    get,
    path = "/v1/boards/{board}/top",
    tag = "boards",
    params(("board" = String, Path, description = "The board's name"), TopQuery, ("If-None-Match" = Option<String>, Header, description = "An `ETag` (or a list, or `*`) of an earlier answer: 304 when the answer's is among them")),
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "One page of the ranking, best first", body = PageAnswer, headers(("ETag" = String, description = "A digest of the body's bytes: equal exactly when the bodies are"), ("Cache-Control" = String, description = "`public, max-age=<http.max_staleness in seconds>` (`private` when reads need a token, `no-cache` below 1 s): an answer may be that old"))),
        (status = 304, description = "`If-None-Match` names the answer's `ETag`: the body would be the same; no body"),
        (status = 400, description = "A bad parameter (unknown, out of range, a missing or needless scope, a window the board does not rank, a bad period)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board, or a period no longer kept", body = ErrorBody),
        (status = 500, description = "Redis proved the data wrong", body = ErrorBody),
        (status = 503, description = "A Redis outage; with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn top(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let name = path(name)?;
    let q: TopQuery = read_query(query)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, q.scope.as_ref(), "?scope=")?;
    let view = view_of(b, q.window.as_deref())?;
    let limit = Limit::or_default(q.limit);
    let offset = Offset::or_default(q.offset);
    if b.is_sharded() && offset > SHARDED_OFFSET {
        return Err(ApiError::BadRequest(format!(
            "offset must be an integer from 0 to {SHARDED_OFFSET} on a sharded board: a page \
             of it reaches at most rank {SHARDED_DEPTH}"
        )));
    }
    let (now, period) = period_of(&state, b, scope, q.period.as_deref())?;
    let instance = period.instance(scope);
    let key = kept_as(
        &state,
        &view,
        instance,
        now,
        &format!("top\0{offset}\0{limit}"),
    );
    let read = async {
        let page = redis(&state, state.store.top(&view, instance, offset, limit, now)).await?;
        Ok(period.relabel(json!(page), scope))
    };
    state.answers.answer(key, &headers, read).await
}

/// `GET /v1/boards/{board}/members/{member}`: one member's rank (404 when not on the
/// board); with `all_windows=true`, its place in every window of the board at once.
#[utoipa::path(
    get,
    path = "/v1/boards/{board}/members/{member}",
    tag = "boards",
    params(
        ("board" = String, Path, description = "The board's name"),
        ("member" = String, Path, description = "The member"),
        MemberQuery,
        ("If-None-Match" = Option<String>, Header, description = "An `ETag` (or a list, or `*`) of an earlier answer: 304 when the answer's is among them"),
    ),
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "The member's rank in the window read; with `all_windows=true`, in every window of the board (`MemberWindows`)", body = MemberAnswer, headers(("ETag" = String, description = "A digest of the body's bytes: equal exactly when the bodies are"), ("Cache-Control" = String, description = "`public, max-age=<http.max_staleness in seconds>` (`private` when reads need a token, `no-cache` below 1 s): an answer may be that old"))),
        (status = 304, description = "`If-None-Match` names the answer's `ETag`: the body would be the same; no body"),
        (status = 400, description = "A bad parameter or member name (a window the board does not rank, `all_windows=true` with `window=`)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board or a period no longer kept (`{\"error\"}`), or the member is not on the board (its rank answer, rank fields null, with `error`)", body = MemberNotFound),
        (status = 500, description = "Redis proved the data wrong", body = ErrorBody),
        (status = 503, description = "A Redis outage; with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn rank(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let q: MemberQuery = read_query(query)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, q.scope.as_ref(), "?scope=")?;
    let every = q.all_windows.is_some_and(|f| f.0);
    let view = view_of(b, q.window.as_deref())?;
    let member = member_of(member)?;
    let member = member.as_str();
    let (now, period) = period_of(&state, b, scope, q.period.as_deref())?;
    let instance = period.instance(scope);
    if every {
        let key = kept_as(
            &state,
            &b.widest(),
            instance,
            now,
            &format!("windows\0{member}"),
        );
        let read = async {
            let mut answer = redis(
                &state,
                state.store.rank_in_windows(b, instance, member, now),
            )
            .await?;
            period.relabel_windows(&mut answer, scope);
            Ok(json!(answer))
        };
        return state.answers.answer(key, &headers, read).await;
    }
    let key = kept_as(&state, &view, instance, now, &format!("rank\0{member}"));
    let read = async {
        let rank = redis(&state, state.store.rank(&view, instance, member, now)).await?;
        if !rank.is_ranked() {
            return Err(ApiError::NotOnBoard(
                period.relabel(rank.not_on_board(), scope),
            ));
        }
        Ok(period.relabel(json!(rank), scope))
    };
    state.answers.answer(key, &headers, read).await
}

/// `GET /v1/boards/{board}/members/{member}/around`: the entries on each side of one
/// member (404 when not on the board).
#[utoipa::path(
    get,
    path = "/v1/boards/{board}/members/{member}/around",
    tag = "boards",
    params(
        ("board" = String, Path, description = "The board's name"),
        ("member" = String, Path, description = "The member"),
        AroundQuery,
        ("If-None-Match" = Option<String>, Header, description = "An `ETag` (or a list, or `*`) of an earlier answer: 304 when the answer's is among them"),
    ),
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "The entries around the member, the member among them", body = PageAnswer, headers(("ETag" = String, description = "A digest of the body's bytes: equal exactly when the bodies are"), ("Cache-Control" = String, description = "`public, max-age=<http.max_staleness in seconds>` (`private` when reads need a token, `no-cache` below 1 s): an answer may be that old"))),
        (status = 304, description = "`If-None-Match` names the answer's `ETag`: the body would be the same; no body"),
        (status = 400, description = "A bad parameter or member name (a window the board does not rank)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board or a period no longer kept (`{\"error\"}`), or the member is not on the board (its rank answer, rank fields null, with `error`)", body = MemberNotFound),
        (status = 500, description = "Redis proved the data wrong", body = ErrorBody),
        (status = 503, description = "A Redis outage; with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn around(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let q: AroundQuery = read_query(query)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, q.scope.as_ref(), "?scope=")?;
    let view = view_of(b, q.window.as_deref())?;
    let member = member_of(member)?;
    let member = member.as_str();
    let radius = Radius::or_default(q.radius);
    let (now, period) = period_of(&state, b, scope, q.period.as_deref())?;
    let instance = period.instance(scope);
    let key = kept_as(
        &state,
        &view,
        instance,
        now,
        &format!("around\0{radius}\0{member}"),
    );
    let read = async {
        match redis(
            &state,
            state.store.around(&view, instance, member, radius, now),
        )
        .await?
        {
            Ok(page) => Ok(period.relabel(json!(page), scope)),
            Err(missing) => Err(ApiError::NotOnBoard(
                period.relabel(missing.not_on_board(), scope),
            )),
        }
    };
    state.answers.answer(key, &headers, read).await
}

/// Most members one `POST .../ranks` asks for (as `rollboard rank` does).
pub use crate::domain::limits::MAX_RANKS_MEMBERS;

/// The body of `POST /v1/boards/{board}/ranks`.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RanksBody {
    /// The members, 1 to 1000 ([`MAX_RANKS_MEMBERS`]); a member listed twice is answered
    /// once.
    #[schema(min_items = 1, max_items = 1000, inline)]
    members: Vec<Name>,
    /// The scope, for a scoped board.
    #[serde(default)]
    #[schema(inline)]
    scope: Option<Name>,
    /// The window read: one of the board's `windows` as the configuration writes it
    /// (`24h`) or an equal duration (`1d`), the first configured when absent; on a
    /// calendar-period board, the period's length (`week`) or absent.
    #[serde(default)]
    window: Option<String>,
    /// On a calendar-period board, the period (`current`, `previous` or an id; current
    /// when absent).
    #[serde(default)]
    period: Option<String>,
}

/// `POST /v1/boards/{board}/ranks`: the ranks of a list of members on the board and among
/// themselves, from one snapshot.
#[utoipa::path(
    post,
    path = "/v1/boards/{board}/ranks",
    tag = "boards",
    params(("board" = String, Path, description = "The board's name")),
    security((), ("reader" = [])),
    request_body(content = RanksBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Each member's place on the board and among those listed: the ranked first, in the board's order, then the others as listed", body = RanksAnswer, headers(("ETag" = String, description = "A digest of the body's bytes: equal exactly when the bodies are"), ("Cache-Control" = String, description = "`public, max-age=<http.max_staleness in seconds>` (`private` when reads need a token, `no-cache` below 1 s): an answer may be that old"))),
        (status = 400, description = "A body that is not this object, 0 or over 1000 members, a bad member name, a window the board does not rank, a missing or needless scope, a bad period, a query parameter", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board, or a period no longer kept", body = ErrorBody),
        (status = 413, description = "The body is over 4 MiB", body = ErrorBody),
        (status = 500, description = "Redis proved the data wrong", body = ErrorBody),
        (status = 503, description = "A Redis outage; with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn ranks(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let name = path(name)?;
    none(query)?;
    let b = board(&state, &name)?;
    let body = body.map_err(ApiError::of_body)?;
    let body: RanksBody = ranks_body(&body)?;
    let scope = scope_of(b, body.scope.as_ref(), "\"scope\" in the body")?;
    let view = view_of(b, body.window.as_deref())?;
    if body.members.is_empty() || body.members.len() > MAX_RANKS_MEMBERS {
        return Err(ApiError::BadRequest(format!(
            "members must list 1 to {MAX_RANKS_MEMBERS} members, not {}",
            body.members.len()
        )));
    }
    let now = state.clock.now();
    let period = select(b, scope, body.period.as_deref(), now).map_err(period_error)?;
    let members: Vec<&str> = body.members.iter().map(Name::as_str).collect();
    let instance = period.instance(scope);
    let what = format!("ranks\0{}", members.join("\0"));
    let key = kept_as(&state, &view, instance, now, &what);
    let read = async {
        let subset = redis(&state, state.store.ranks(&view, instance, &members, now)).await?;
        Ok(period.relabel(json!(subset), scope))
    };
    // A POST is never answered 304: `If-None-Match` is a precondition of a GET.
    state.answers.answer(key, &HeaderMap::new(), read).await
}

/// The body of `ranks` read: a member or scope that is not a name is refused naming where
/// it is (`members[3] is empty`); anything else with where serde stopped, never quoting a
/// value of the body, which can be long.
fn ranks_body(body: &[u8]) -> ApiResult<RanksBody> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let read: RanksBody = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        let why = e.to_string();
        let why = why.split(" at line ").next().unwrap_or_default();
        if e.classify() == serde_json::error::Category::Data && Name::is_refusal(why) {
            return ApiError::BadRequest(format!("{path} {why}"));
        }
        not_ranks_body(&e)
    })?;
    reader.end().map_err(|e| not_ranks_body(&e))?;
    Ok(read)
}

/// The 400 of a body that is not the one of `ranks`, with where serde stopped.
fn not_ranks_body(e: &serde_json::Error) -> ApiError {
    let what = match e.classify() {
        serde_json::error::Category::Data => "is not",
        _ => "is not JSON, so not",
    };
    ApiError::BadRequest(format!(
        "the body {what} {{\"members\": [strings], \"scope\": string, \"window\": string, \
         \"period\": string}} (line {} column {})",
        e.line(),
        e.column()
    ))
}
