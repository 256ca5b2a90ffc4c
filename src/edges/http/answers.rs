//! The query answers kept in memory, and HTTP's own caching of them (`ETag`,
//! `If-None-Match`, `Cache-Control`).
//!
//! An answer read from Redis is kept, keyed by the query as the handler understood it
//! (route, board, window, instance, parameters), by what this process wrote of the keys it
//! reads ([`crate::store::Generations`], taken before the read) and by the slice (or
//! calendar period) the clock is in, for `http.max_staleness`. While it is kept, the same
//! query is answered from it without a call to Redis; requests that find no answer while
//! one is being read wait for that read instead of sending their own. So:
//!
//! * an answer is at most `http.max_staleness` older than the Redis state it shows (counted
//!   from when its read began), and `as_of` names that state (the time its ranking last
//!   changed);
//! * a write by this process (its consumers, its roll jobs) is in every answer that begins
//!   after the write returned, at once; writes by other processes (other replicas, the
//!   command line) show within `http.max_staleness`;
//! * a new slice of time (which moves `window_from` and `window_to`) or a new calendar
//!   period is a new key.
//!
//! Every answer carries a strong `ETag`, a digest of its body's bytes: two answers share
//! one exactly when their bodies are equal, so `If-None-Match` naming it answers
//! `304 Not Modified`. `Cache-Control: max-age` is `http.max_staleness` in whole seconds
//! (`no-cache` below one second: a client revalidates every time), `private` when the reads
//! need a token; `Age` says how many whole seconds ago Redis was read, so a cache in front
//! keeps an answer no longer than what is left of it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use moka::future::Cache;
use moka::Expiry;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use crate::config::HttpSettings;
use crate::metrics::Metrics;

/// What a query answers, as kept: its status (200, or the 404 of a member not on the
/// board), its body and the body's `ETag`.
#[derive(Debug)]
pub(super) struct Answer {
    status: StatusCode,
    body: Bytes,
    etag: HeaderValue,
    /// When its read of Redis began: its age is counted from here, however long the reply
    /// took to arrive.
    read_at: Instant,
}

impl Answer {
    /// The answer `read` gave: its JSON, or a member not on the board (a 404 that is an
    /// answer of the state too). Other errors are not answers.
    fn of(read: ApiResult<Value>, read_at: Instant) -> ApiResult<Answer> {
        let (status, value) = match read {
            Ok(value) => (StatusCode::OK, value),
            Err(ApiError::NotOnBoard(value)) => (StatusCode::NOT_FOUND, value),
            Err(e) => return Err(e),
        };
        let body = serde_json::to_vec(&value)
            .map_err(|e| ApiError::Internal(format!("cannot write the answer: {e}")))?;
        Ok(Answer {
            status,
            etag: etag(&body),
            body: Bytes::from(body),
            read_at,
        })
    }

    /// The bytes it holds, for the cache's bound.
    fn weight(&self, key: &Key) -> u32 {
        let bytes = self.body.len() + key.query.len() + std::mem::size_of::<(Key, Answer)>();
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// Keeps an answer until it is `http.max_staleness` older than its read of Redis (not than
/// its arrival: a slow reply is kept the less).
struct SinceRead(Duration);

impl Expiry<Key, Arc<Answer>> for SinceRead {
    fn expire_after_create(
        &self,
        _key: &Key,
        answer: &Arc<Answer>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(self.0.saturating_sub(answer.read_at.elapsed()))
    }
}

/// A strong entity tag of `body`: the first 96 bits of its BLAKE3 digest, in hex.
fn etag(body: &[u8]) -> HeaderValue {
    let digest = blake3::hash(body);
    let hex: String = digest.as_bytes()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Hex digits and quotes only: always a valid header value.
    HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"\""))
}

/// What an answer is kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    /// The query as the handler understood it: route, board, window, instance, parameters.
    query: String,
    /// This process's write counters of the keys the query reads, before it read them.
    generation: u64,
    /// The start of the slice (or calendar period) the clock was in: what moves the
    /// answer's window by itself.
    clock: i64,
}

impl Key {
    /// The key of `query` read at `generation`, at a time in the slice starting at `clock`.
    pub(super) fn new(query: String, generation: u64, clock: i64) -> Key {
        Key {
            query,
            generation,
            clock,
        }
    }
}

/// The answers kept, and the `Cache-Control` given with them.
pub struct Answers {
    /// `None` when `http.max_staleness` or `http.cache_bytes` is zero.
    cache: Option<Cache<Key, Arc<Answer>>>,
    cache_control: HeaderValue,
    metrics: Arc<Metrics>,
}

impl Answers {
    /// The store of answers `http` asks for.
    pub fn new(http: &HttpSettings, metrics: Arc<Metrics>) -> Answers {
        let cache = (!http.max_staleness.is_zero() && http.cache_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(http.cache_bytes)
                .weigher(|key: &Key, answer: &Arc<Answer>| answer.weight(key))
                .expire_after(SinceRead(http.max_staleness))
                .build()
        });
        let seconds = http.max_staleness.as_secs();
        let scope = if http.tokens.query.is_open() {
            "public"
        } else {
            "private"
        };
        let cache_control = match seconds {
            0 => format!("{scope}, no-cache"),
            s => format!("{scope}, max-age={s}"),
        };
        metrics.answers_held(0, 0);
        Answers {
            cache,
            cache_control: HeaderValue::from_str(&cache_control)
                .unwrap_or(HeaderValue::from_static("no-cache")),
            metrics,
        }
    }

    /// The answer to the query `key`, from those kept or else from `read` (which is then
    /// kept), as the response to a request with `headers`: 304 when its `If-None-Match`
    /// names the answer's `ETag`.
    pub(super) async fn answer(
        &self,
        key: Key,
        headers: &HeaderMap,
        read: impl Future<Output = ApiResult<Value>> + Send,
    ) -> ApiResult<Response> {
        let answer = match &self.cache {
            None => Arc::new(Answer::of(read.await, Instant::now())?),
            Some(cache) => self.kept(cache, key, read).await?,
        };
        Ok(self.response(&answer, headers))
    }

    async fn kept(
        &self,
        cache: &Cache<Key, Arc<Answer>>,
        key: Key,
        read: impl Future<Output = ApiResult<Value>> + Send,
    ) -> ApiResult<Arc<Answer>> {
        if let Some(answer) = cache.get(&key).await {
            self.metrics.answer_kept("hit");
            return Ok(answer);
        }
        let ran = AtomicBool::new(false);
        let filled = cache
            .try_get_with(key, async {
                ran.store(true, Ordering::Relaxed);
                let read_at = Instant::now();
                Answer::of(read.await, read_at).map(Arc::new)
            })
            .await;
        let kind = if ran.load(Ordering::Relaxed) {
            "miss"
        } else {
            "wait"
        };
        self.metrics.answer_kept(kind);
        // A failed read is not kept: each waiter answers its error, the next request reads.
        filled.map_err(|e| ApiError::clone(&*e))
    }

    /// Sets the gauges of what is kept (`rollboard_http_answers_held`, `..._bytes`), once
    /// the cache's pending work (insertions, evictions, expiries it records lazily) is done:
    /// before each scrape.
    pub(super) async fn count_held(&self) {
        if let Some(cache) = &self.cache {
            cache.run_pending_tasks().await;
            self.metrics
                .answers_held(cache.weighted_size(), cache.entry_count());
        }
    }

    fn response(&self, answer: &Answer, headers: &HeaderMap) -> Response {
        let not_modified =
            answer.status == StatusCode::OK && names(headers, answer.etag.as_bytes());
        let (status, body) = if not_modified {
            (StatusCode::NOT_MODIFIED, Body::empty())
        } else {
            (answer.status, Body::from(answer.body.clone()))
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let h = response.headers_mut();
        if !not_modified {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if answer.status == StatusCode::OK {
            h.insert(header::ETAG, answer.etag.clone());
        }
        h.insert(header::CACHE_CONTROL, self.cache_control.clone());
        // How long ago Redis was read, in the whole seconds HTTP counts (RFC 9111 5.1): a
        // cache in front keeps the answer only for what is left of its max-age.
        let age = answer.read_at.elapsed().as_secs();
        if age > 0 {
            h.insert(header::AGE, HeaderValue::from(age));
        }
        response
    }
}

/// Whether an `If-None-Match` of `headers` names `etag` (or is `*`), by the weak
/// comparison HTTP asks for there: a `W/` prefix is ignored.
fn names(headers: &HeaderMap, etag: &[u8]) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|tag| tag.trim_ascii())
        .map(|tag| tag.strip_prefix(b"W/").unwrap_or(tag))
        .any(|tag| tag == b"*" || tag == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static(value));
        h
    }

    #[test]
    fn an_etag_is_the_digest_of_the_bytes() {
        let a = etag(br#"{"count":1}"#);
        assert_eq!(a, etag(br#"{"count":1}"#));
        assert_ne!(a, etag(br#"{"count":2}"#));
        let text = a.to_str().expect("ascii");
        assert_eq!(text.len(), 26, "{text}");
        assert!(text.starts_with('"') && text.ends_with('"'), "{text}");
    }

    #[test]
    fn if_none_match_names_a_tag_in_a_list_weakly_or_by_star() {
        let tag = b"\"abc\"";
        assert!(names(&headers("\"abc\""), tag));
        assert!(names(&headers("\"x\", W/\"abc\""), tag));
        assert!(names(&headers("*"), tag));
        assert!(!names(&headers("\"abcd\""), tag));
        assert!(!names(&headers("abc"), tag));
        assert!(!names(&HeaderMap::new(), tag));
    }

    #[test]
    fn a_member_not_on_the_board_is_an_answer_and_an_outage_is_not() {
        let kept = Answer::of(
            Err(ApiError::NotOnBoard(serde_json::json!({"rank": null}))),
            Instant::now(),
        )
        .expect("an answer");
        assert_eq!(kept.status, StatusCode::NOT_FOUND);
        assert_eq!(&kept.body[..], br#"{"rank":null}"#);
        assert!(Answer::of(Err(ApiError::Unavailable("down".into())), Instant::now()).is_err());
    }
}
