//! `GET /v1/boards/{board}/changes`: the change feed of one window of a board instance as
//! Server-Sent Events (docs/api.md, "The change feed").
//!
//! One reader per feed, however many subscribers: the [`Hub`] starts a task blocking in
//! `XREAD` on a Redis connection of its own when a feed gets its first subscriber, hands
//! every entry it reads to a `broadcast` channel, and stops when the last subscriber
//! leaves. Each subscriber has a small task of its own: it sends what the client missed
//! (after `Last-Event-ID`, read with `XRANGE`), then what the broadcast brings, skipping
//! what it already sent, into a buffer of [`SUBSCRIBER_BUFFER`] events that the response
//! body drains. A subscriber that falls [`FEED_BUFFER`] entries behind the reader (a
//! burst) reads what it missed from the feed itself, as a resume does. A client whose
//! buffer stays full for [`SLOW_CLIENT_GRACE`] is disconnected (its connection closed,
//! see [`Closer`]); no other subscriber waits for it. At shutdown every stream ends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult, ErrorBody};
use super::params::{read_query, Name};
use super::AppState;
use crate::config::RedisSettings;
use crate::metrics::{Disconnect, Metrics};
use crate::store::{wait_feed, FeedEntry, FeedId, Reconnect, Store, StoreError, FEED_PAGE};

/// Entries a feed's reader keeps for subscribers that have not taken them yet; a
/// subscriber further behind reads what it missed from Redis.
pub const FEED_BUFFER: usize = 4096;
/// Events waiting to be written to one subscriber's connection.
pub const SUBSCRIBER_BUFFER: usize = 64;
/// How long a subscriber's buffer may stay full before the client is disconnected.
pub const SLOW_CLIENT_GRACE: Duration = Duration::from_secs(5);
/// How long one `XREAD` of a feed's reader blocks.
const READ_BLOCK: Duration = Duration::from_secs(5);
/// The longest pause between two attempts to read a feed while Redis fails.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);
/// `Retry-After` of the 503 over `http.max_subscribers`, in seconds.
const FULL_RETRY_AFTER: &str = "5";

/// Lets a handler close its request's connection at once (a slow change-feed client): the
/// connection loop puts one in every request's extensions and drops the connection when
/// it is cancelled.
#[derive(Clone, Debug, Default)]
pub struct Closer(pub CancellationToken);

/// The feeds being read, and the subscriber slots (`http.max_subscribers`).
pub struct Hub {
    /// Each feed being read, by stream key.
    feeds: Arc<Mutex<HashMap<String, Weak<Feed>>>>,
    /// One permit per open stream.
    slots: Arc<Semaphore>,
    /// For the readers' own connections.
    redis: RedisSettings,
    metrics: Arc<Metrics>,
    /// Fires at shutdown: every stream and reader ends.
    cancel: CancellationToken,
    /// The comment interval of idle streams.
    heartbeat: Duration,
}

/// One entry as the reader broadcasts it: rendered once for every subscriber.
struct Change {
    id: FeedId,
    /// `None` for an entry that is not a change (no `kind` or `member`).
    event: Option<Event>,
}

/// One feed being read: its reader stops when the last subscriber drops it.
struct Feed {
    key: String,
    sender: broadcast::Sender<Arc<Change>>,
    stop: CancellationToken,
    feeds: Arc<Mutex<HashMap<String, Weak<Feed>>>>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.cancel();
        // A poisoned lock only means another thread panicked while holding it: the map is
        // still a map.
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if feeds.get(&self.key).is_some_and(|f| f.strong_count() == 0) {
            feeds.remove(&self.key);
        }
    }
}

impl Hub {
    /// A hub serving at most `max_subscribers` streams until `cancel` fires.
    pub fn new(
        redis: RedisSettings,
        metrics: Arc<Metrics>,
        max_subscribers: usize,
        heartbeat: Duration,
        cancel: CancellationToken,
    ) -> Hub {
        Hub {
            feeds: Arc::default(),
            slots: Arc::new(Semaphore::new(max_subscribers)),
            redis,
            metrics,
            cancel,
            heartbeat,
        }
    }

    /// The feed `key` (of a board of `scale`), read from `start` (exclusive) if no reader
    /// runs yet, and a receiver of what its reader reads from now on.
    fn join(
        &self,
        key: &str,
        scale: u32,
        start: FeedId,
    ) -> (Arc<Feed>, broadcast::Receiver<Arc<Change>>) {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = feeds.get(key).and_then(Weak::upgrade) {
            let receiver = feed.sender.subscribe();
            return (feed, receiver);
        }
        let (sender, receiver) = broadcast::channel(FEED_BUFFER);
        let feed = Arc::new(Feed {
            key: key.to_string(),
            sender: sender.clone(),
            stop: self.cancel.child_token(),
            feeds: self.feeds.clone(),
        });
        feeds.insert(key.to_string(), Arc::downgrade(&feed));
        // The receiver exists before the reader starts: nothing it reads is missed.
        tokio::spawn(
            read_feed(
                self.redis.clone(),
                key.to_string(),
                scale,
                start,
                sender,
                feed.stop.clone(),
                self.metrics.clone(),
            )
            .instrument(tracing::info_span!("changes_feed", key = %key)),
        );
        (feed, receiver)
    }
}

/// The reader of one feed: waits for entries after `after` on a connection of its own and
/// broadcasts them, until `stop` fires. A Redis error is logged and counted and the read
/// retried after a pause (doubling up to [`MAX_RETRY_PAUSE`]); subscribers see no error,
/// only a pause (and the heartbeat goes on).
async fn read_feed(
    redis: RedisSettings,
    key: String,
    scale: u32,
    mut after: FeedId,
    sender: broadcast::Sender<Arc<Change>>,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    metrics.changes_feed_read(true);
    let mut pause = Duration::from_millis(100);
    let client = loop {
        match Store::dedicated_with(&redis, Reconnect::Forever).await {
            Ok(client) => break Some(client),
            Err(e) => {
                warn!(error = %e, "cannot create the change feed's redis client");
                tokio::select! {
                    _ = stop.cancelled() => break None,
                    _ = tokio::time::sleep(pause) => pause = (pause * 2).min(MAX_RETRY_PAUSE),
                }
            }
        }
    };
    if let Some(client) = &client {
        loop {
            // Cancel safety: a dropped read only loses its reply, and the connection is
            // closed right after.
            let read = tokio::select! {
                _ = stop.cancelled() => break,
                read = wait_feed(client, &key, after, READ_BLOCK) => read,
            };
            match read {
                Ok(entries) => {
                    pause = Duration::from_millis(100);
                    for entry in entries {
                        after = entry.id;
                        let event = render(&entry, scale);
                        if event.is_none() {
                            warn!(id = %entry.id, "change feed entry without kind or member: skipped");
                        }
                        let change = Change {
                            id: entry.id,
                            event,
                        };
                        // No receiver: the last subscriber just left, and `stop` follows.
                        let _ = sender.send(Arc::new(change));
                    }
                }
                Err(e) => {
                    metrics.redis_error(&e);
                    warn!(error = %e, "cannot read the change feed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(pause) => pause = (pause * 2).min(MAX_RETRY_PAUSE),
                    }
                }
            }
        }
    }
    if let Some(client) = client {
        let _ = fred::interfaces::ClientLike::quit(&client).await;
    }
    metrics.changes_feed_read(false);
    debug!("change feed reader stopped");
}

/// The query parameters of `changes`.
#[derive(Debug, serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ChangesQuery {
    /// The scope value: required on a scoped board, refused on another.
    #[param(inline)]
    scope: Option<Name>,
    /// The window whose feed is read: one of the board's `windows` as the configuration
    /// writes it (`24h`) or an equal duration (`1d`); the first configured when absent.
    window: Option<String>,
    /// A period board's period: `current` (the default), `previous` or its id; the feed
    /// of that period's instance.
    period: Option<String>,
}

/// `GET /v1/boards/{board}/changes`: the changes of a board's top N as Server-Sent Events.
#[utoipa::path(
    get,
    path = "/v1/boards/{board}/changes",
    tag = "boards",
    params(
        ("board" = String, Path, description = "The board's name"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume right after this entry ID (an `id:` of an earlier event)"),
        ChangesQuery,
    ),
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "A stream of `text/event-stream` events: `id:` the entry ID, `event:` the kind (`entered`, `left`, `passed`, or `reset` when entries after `Last-Event-ID` are no longer kept), `data:` the entry as JSON; a comment every `http.changes_heartbeat`", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad parameter (unknown, a missing or needless scope, a window the board does not rank) or `Last-Event-ID`", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
        (status = 404, description = "An unknown board, a board without a change feed (`changes_top`), or a period no longer kept", body = ErrorBody),
        (status = 503, description = "A Redis outage, or `http.max_subscribers` streams open; with `Retry-After`", body = ErrorBody),
    )
)]
pub(super) async fn changes(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    closer: Option<axum::Extension<Closer>>,
) -> ApiResult<Response> {
    let name = super::query::path(name)?;
    let q: ChangesQuery = read_query(query)?;
    let b = super::query::board(&state, &name)?;
    if b.changes.is_none() {
        return Err(ApiError::NotFound(format!(
            "board {} keeps no change feed (changes_top)",
            b.name
        )));
    }
    let scope = super::query::scope_of(b, q.scope.as_ref(), "?scope=")?;
    let view = super::query::view_of(b, q.window.as_deref())?;
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<FeedId>().ok())
                .ok_or_else(|| {
                    ApiError::BadRequest(
                        "Last-Event-ID must be an event id of this stream (such as \
                         1700000000000-0)"
                            .into(),
                    )
                })?,
        ),
    };
    let hub = &state.hub;
    let Ok(permit) = hub.slots.clone().try_acquire_owned() else {
        let mut response = ApiError::Unavailable(
            "too many change-feed streams open (http.max_subscribers); retry".into(),
        )
        .into_response();
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(FULL_RETRY_AFTER),
        );
        return Ok(response);
    };
    // A period board's feed is its period instance's: the current period's unless named.
    // Each window of a board keeps a feed of its own: the widest's without a suffix.
    let (_, selected) = super::query::period_of(&state, b, scope, q.period.as_deref())?;
    let key = state.store.keys().changes(
        &b.name,
        selected.instance(scope),
        view.window_suffix().as_deref(),
    );
    let feed_state = super::error::redis(&state, state.store.feed_state(&key)).await?;
    // Joined before the catch-up reads: whatever is added from now on comes through the
    // broadcast, whatever was added before through the catch-up (duplicates skipped by ID).
    let (feed, receiver) = hub.join(&key, b.scale, feed_state.last);
    let (start, reset) = match resume {
        Some(after) if feed_state.lost_after(after) => (feed_state.last, true),
        Some(after) => (after, false),
        None => (feed_state.last, false),
    };
    let (sender, events) = mpsc::channel(SUBSCRIBER_BUFFER);
    let subscriber = Subscriber {
        store: state.store.clone(),
        metrics: state.metrics.clone(),
        key,
        scale: b.scale,
        sent: start,
        sender,
        closer: closer.map(|c| c.0 .0),
        cancel: state.hub.cancel.clone(),
        _feed: feed,
        _permit: permit,
    };
    state.metrics.changes_subscribed();
    tokio::spawn(
        subscriber
            .run(receiver, reset.then_some(feed_state.first))
            .instrument(tracing::debug_span!("changes_subscriber")),
    );
    let mut events = events;
    let stream = futures_util::stream::poll_fn(move |cx| {
        events
            .poll_recv(cx)
            .map(|event| event.map(Ok::<Event, Infallible>))
    });
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(hub.heartbeat).text("heartbeat"))
        .into_response();
    // Proxies that buffer answers (nginx) would hold the events back.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// One open stream: what it has sent, and where its events go.
struct Subscriber {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    key: String,
    /// The board's `scale`, carried in every event's data.
    scale: u32,
    /// The ID of the last entry sent (or the start).
    sent: FeedId,
    sender: mpsc::Sender<Event>,
    /// Closes the client's connection (absent outside the connection loop).
    closer: Option<CancellationToken>,
    cancel: CancellationToken,
    /// Keeps the feed read while the stream is open.
    _feed: Arc<Feed>,
    /// The stream's slot of `http.max_subscribers`.
    _permit: OwnedSemaphorePermit,
}

impl Subscriber {
    /// Sends the reset (when `reset` holds the oldest entry kept), the entries after
    /// `sent` still kept, then each entry the reader broadcasts, until the client leaves,
    /// falls behind or the server stops.
    async fn run(
        mut self,
        mut receiver: broadcast::Receiver<Arc<Change>>,
        reset: Option<Option<FeedId>>,
    ) {
        let reason = match self.pump(&mut receiver, reset).await {
            Err(reason) => reason,
            Ok(never) => match never {},
        };
        if reason == Disconnect::Slow {
            debug!("change-feed client too slow: disconnected");
            if let Some(closer) = &self.closer {
                closer.cancel();
            }
        }
        self.metrics.changes_unsubscribed(reason);
    }

    async fn pump(
        &mut self,
        receiver: &mut broadcast::Receiver<Arc<Change>>,
        reset: Option<Option<FeedId>>,
    ) -> Result<Infallible, Disconnect> {
        if let Some(oldest) = reset {
            self.send_reset(oldest).await?;
        }
        self.catch_up().await?;
        loop {
            // Cancel safety: `recv` takes an entry only when it completes.
            let entry = tokio::select! {
                _ = self.cancel.cancelled() => return Err(Disconnect::Shutdown),
                _ = self.sender.closed() => return Err(Disconnect::Client),
                entry = receiver.recv() => entry,
            };
            match entry {
                Ok(change) if change.id <= self.sent => {}
                Ok(change) => {
                    self.sent = change.id;
                    self.send_event(change.event.clone()).await?
                }
                // The reader went on past entries this stream had not taken yet (a burst
                // while its client was busy): read them from the feed itself, as a resume
                // would.
                Err(broadcast::error::RecvError::Lagged(_)) => self.resume().await?,
                // The reader stopped: only at shutdown.
                Err(broadcast::error::RecvError::Closed) => return Err(Disconnect::Shutdown),
            }
        }
    }

    /// Sends what the feed still keeps after `sent`, or a reset when entries after it are
    /// gone.
    async fn resume(&mut self) -> Result<(), Disconnect> {
        let mut pause = Duration::from_millis(100);
        let state = loop {
            let read = tokio::select! {
                _ = self.cancel.cancelled() => return Err(Disconnect::Shutdown),
                _ = self.sender.closed() => return Err(Disconnect::Client),
                read = self.store.feed_state(&self.key) => read,
            };
            match read {
                Ok(state) => break state,
                Err(e) => self.retry_pause(&e, &mut pause).await?,
            }
        };
        if state.lost_after(self.sent) {
            self.sent = state.last;
            return self.send_reset(state.first).await;
        }
        self.catch_up().await
    }

    /// The `reset` event: entries after what the client had are no longer kept; the
    /// stream goes on after the newest (`sent`).
    async fn send_reset(&mut self, oldest: Option<FeedId>) -> Result<(), Disconnect> {
        let data = json!({
            "reason": "the entries after Last-Event-ID are no longer kept: read the board \
                       again; the stream goes on after the newest entry",
            "oldest": oldest.map(|id| id.to_string()),
        });
        let event = Event::default()
            .id(self.sent.to_string())
            .event("reset")
            .data(data.to_string());
        self.send(event).await
    }

    /// The entries after `sent` that the feed keeps, page by page; a Redis error is
    /// retried after a pause.
    async fn catch_up(&mut self) -> Result<(), Disconnect> {
        let mut pause = Duration::from_millis(100);
        loop {
            let read = tokio::select! {
                _ = self.cancel.cancelled() => return Err(Disconnect::Shutdown),
                _ = self.sender.closed() => return Err(Disconnect::Client),
                read = self.store.feed_after(&self.key, self.sent) => read,
            };
            let page = match read {
                Ok(page) => page,
                Err(e) => {
                    self.retry_pause(&e, &mut pause).await?;
                    continue;
                }
            };
            let full = page.len() as u64 >= FEED_PAGE;
            for entry in &page {
                self.send_entry(entry).await?;
            }
            if !full {
                return Ok(());
            }
        }
    }

    async fn retry_pause(&self, e: &StoreError, pause: &mut Duration) -> Result<(), Disconnect> {
        self.metrics.redis_error(e);
        warn!(error = %e, "cannot read the change feed; retrying");
        tokio::select! {
            _ = self.cancel.cancelled() => Err(Disconnect::Shutdown),
            _ = tokio::time::sleep(*pause) => {
                *pause = (*pause * 2).min(MAX_RETRY_PAUSE);
                Ok(())
            }
        }
    }

    async fn send_entry(&mut self, entry: &FeedEntry) -> Result<(), Disconnect> {
        self.sent = entry.id;
        let event = render(entry, self.scale);
        if event.is_none() {
            debug!(id = %entry.id, "change feed entry without kind or member: skipped");
        }
        self.send_event(event).await
    }

    /// Sends `event`; an entry that is not a change (`None`) is skipped.
    async fn send_event(&self, event: Option<Event>) -> Result<(), Disconnect> {
        match event {
            Some(event) => self.send(event).await,
            None => Ok(()),
        }
    }

    /// Hands `event` to the client's buffer, waiting at most [`SLOW_CLIENT_GRACE`] for room.
    async fn send(&self, event: Event) -> Result<(), Disconnect> {
        let sent = tokio::select! {
            _ = self.cancel.cancelled() => return Err(Disconnect::Shutdown),
            sent = tokio::time::timeout(SLOW_CLIENT_GRACE, self.sender.send(event)) => sent,
        };
        match sent {
            Ok(Ok(())) => {
                self.metrics.changes_sent();
                Ok(())
            }
            Ok(Err(_)) => Err(Disconnect::Client),
            Err(_) => Err(Disconnect::Slow),
        }
    }
}

/// The event of one feed entry: `id:` its ID, `event:` its kind, `data:` its fields as
/// JSON, `rank`, `total` and `ts` as numbers (when they are integers) and the board's
/// `scale`; `None` for an entry without `kind` or `member`.
pub(super) fn render(entry: &FeedEntry, scale: u32) -> Option<Event> {
    let kind = entry.get("kind")?;
    entry.get("member")?;
    let mut data = Map::new();
    for (name, value) in &entry.fields {
        let value = match name.as_str() {
            "rank" | "total" | "ts" => value
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(value.as_str())),
            _ => Value::from(value.as_str()),
        };
        data.insert(name.clone(), value);
    }
    data.insert("scale".into(), Value::from(scale));
    // An event name may not hold a line break.
    let kind: String = kind.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    Some(
        Event::default()
            .id(entry.id.to_string())
            .event(kind)
            .data(Value::Object(data).to_string()),
    )
}
