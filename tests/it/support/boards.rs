//! Boards, events and what a board instance holds: board and event builders, key snapshots,
//! the digest table's entries and logs, rolling every instance, totals and Redis's clock.

use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::{Board, Dedup, Mode, TieBreak, View};
use rollboard::domain::ranking::MemberRank;
use rollboard::roll::{self, Job};
use rollboard::store::{ApplyEvent, Outcome, StageTargets, Staged, Store};
use tokio_util::sync::CancellationToken;

use crate::support::config::BOARDS;
use crate::support::keys::{dead_letter_stream, instance, under};
use crate::support::model::Instance;
use crate::support::redis::{keyed, RedisServer};

/// An event for `Store::apply`.
pub fn ev(id: &str, ts: i64, member: &str, amount: i64) -> ApplyEvent {
    ApplyEvent {
        id: id.into(),
        ts,
        member: member.into(),
        amount,
    }
}

/// A board with small slices for tests: `slice` ms wide, `n` slices per window.
pub fn board(name: &str, slice: i64, n: i64) -> Board {
    Board {
        name: name.into(),
        member: "user".into(),
        scope: None,
        amount: "amount".into(),
        scale: 0,
        window_ms: slice * n,
        windows: Vec::new(),
        slice_ms: slice,
        mode: Mode::Incremental,
        tie_break: TieBreak::Earliest,
        allow_negative: false,
        dedup: Dedup::Window,
        dense_rank: false,
        changes: None,
        period: None,
        shards: 1,
    }
}

/// `board` scoped by the field `room`.
pub fn scoped(mut board: Board) -> Board {
    board.scope = Some("room".into());
    board
}

/// Boards "a" and "b", `slice` ms wide with four slices per window.
pub fn boards_a_b(slice: i64) -> (Board, Board) {
    (board("a", slice, 4), board("b", slice, 4))
}

/// Boards "a" and "b" as [`boards_a_b`], the list of both, and the daemon's metrics for it.
pub fn boards_a_b_metered(slice: i64) -> (Board, Board, Vec<Board>, rollboard::metrics::Metrics) {
    let (a, b) = boards_a_b(slice);
    let boards = vec![a.clone(), b.clone()];
    let metrics = rollboard::metrics::Metrics::new(&boards);
    (a, b, boards, metrics)
}

/// The four shapes of board a script can run for (incremental or resummarize, with or
/// without refunds, each tie-break), `slice` ms wide, `n` slices per window.
pub fn variants(slice: i64, n: i64) -> Vec<Board> {
    let inc = board("inc", slice, n);
    let mut inc_neg = board("incneg", slice, n);
    inc_neg.allow_negative = true;
    inc_neg.tie_break = TieBreak::Latest;
    let mut res = board("res", slice, n);
    res.mode = Mode::Resummarize;
    let mut res_neg = board("resneg", slice, n);
    res_neg.mode = Mode::Resummarize;
    res_neg.allow_negative = true;
    res_neg.tie_break = TieBreak::None;
    vec![inc, inc_neg, res, res_neg]
}

/// Every key under an unscoped board's hash tag with its content ([`dump`]), to prove a
/// call wrote nothing.
pub async fn snapshot(store: &Store, board: &Board) -> std::collections::BTreeMap<String, Vec<u8>> {
    let pattern = under(&instance(&board.name, None), "*");
    let mut out = std::collections::BTreeMap::new();
    for key in keys_matching(store, &pattern).await {
        let bytes = dump(store, &key).await;
        out.insert(key, bytes);
    }
    out
}

/// The keys matching `pattern` (`KEYS`).
pub async fn keys_matching(store: &Store, pattern: &str) -> Vec<String> {
    use fred::types::{ClusterHash, CustomCommand};
    store
        .client()
        .custom(
            CustomCommand::new_static("KEYS", ClusterHash::Random, false),
            vec![pattern],
        )
        .await
        .expect("keys")
}

/// What `key` holds, to compare by content: its `DUMP`, but for a Hash its fields and
/// values in byte order (the `DUMP` of a hashtable-encoded Hash lists its fields in the
/// table's order, which a read can change while the table is being rehashed, and Valkey
/// orders them its own way).
pub async fn dump(store: &Store, key: &str) -> Vec<u8> {
    let kind: String = keyed(store, "TYPE", vec![key]).await;
    let bytes = |v: &fred::types::Value| v.as_bytes().map(<[u8]>::to_vec).unwrap_or_default();
    if kind == "hash" {
        let flat: Vec<fred::types::Value> = keyed(store, "HGETALL", vec![key]).await;
        let fields: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = flat
            .chunks(2)
            .map(|pair| (bytes(&pair[0]), bytes(&pair[pair.len() - 1])))
            .collect();
        return format!("hash {fields:?}").into_bytes();
    }
    let dump: fred::types::Value = keyed(store, "DUMP", vec![key]).await;
    match dump {
        fred::types::Value::Null => Vec::new(),
        other => bytes(&other),
    }
}

/// The boards of [`BOARDS`], validated.
pub fn test_boards() -> Vec<Board> {
    rollboard::config::Settings::from_toml(BOARDS)
        .expect("test boards")
        .boards
}

/// One entry of an instance's digest table: the id's digest and its slice (mod 2^32).
pub type SeenEntry = ([u8; 16], u32);

/// Reads the digest table of an instance (the linear hash described in `digest.lua`) and
/// checks its invariants: the state fields, every bucket named by an address below
/// 2^L + p holding whole 20-byte entries whose digests all address that bucket, and `#n`
/// equal to the entries held. Returns every entry.
pub async fn seen_table(store: &Store, view: &View<'_>, scope: Option<&str>) -> Vec<SeenEntry> {
    use fred::prelude::*;
    let key = store.instance(view, scope).seen_table();
    let fields: std::collections::HashMap<String, Vec<u8>> =
        store.client().hgetall(&key).await.expect("hgetall");
    if fields.is_empty() {
        return Vec::new();
    }
    let number = |f: &str| -> u64 {
        let v = fields.get(f).unwrap_or_else(|| panic!("{key} has no {f}"));
        std::str::from_utf8(v).unwrap().parse().unwrap()
    };
    let (level, split, held) = (number("#L"), number("#p"), number("#n"));
    assert!(split < 1 << level, "{key}: #p {split} with #L {level}");
    let mut out = Vec::new();
    for (field, value) in &fields {
        if field.starts_with('#') {
            continue;
        }
        let a: u64 = field
            .parse()
            .unwrap_or_else(|_| panic!("{key}: field {field}"));
        assert!(a < (1 << level) + split, "{key}: bucket {a} past the table");
        assert!(!value.is_empty(), "{key}: empty bucket {a} kept");
        assert_eq!(
            value.len() % 20,
            0,
            "{key}: bucket {a} of {} bytes",
            value.len()
        );
        for entry in value.chunks(20) {
            let h = u64::from(u32::from_be_bytes(entry[..4].try_into().unwrap()));
            let mut addr = h % (1 << level);
            if addr < split {
                addr = h % (1 << (level + 1));
            }
            assert_eq!(addr, a, "{key}: an entry of bucket {a} addresses {addr}");
            out.push((
                entry[..16].try_into().unwrap(),
                u32::from_be_bytes(entry[16..].try_into().unwrap()),
            ));
        }
    }
    assert_eq!(out.len() as u64, held, "{key}: #n");
    out
}

/// Whether the instance remembers `id` as applied in slice `n`.
pub async fn remembers(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    id: &str,
    n: i64,
) -> bool {
    let digest = rollboard::store::id_digest(id);
    seen_table(store, &board.widest(), scope)
        .await
        .contains(&(digest, n.rem_euclid(1 << 32) as u32))
}

/// The instance's forget-log keys (`seen:<n>`) that exist.
pub async fn seen_logs(store: &Store, view: &View<'_>, scope: Option<&str>) -> Vec<String> {
    let table = store.instance(view, scope).seen_table();
    let pattern = format!("{}:*", table.trim_end_matches(":ids"));
    let mut keys = keys_matching(store, &pattern).await;
    keys.retain(|k| k != &table);
    keys.sort();
    keys
}

/// Runs both jobs once at `now` over `boards` (`schedule.chunk` = `chunk`): the reports,
/// failed instances included.
pub async fn run_jobs(
    store: &Store,
    boards: &[Board],
    now: i64,
    chunk: usize,
) -> Vec<rollboard::roll::Report> {
    rollboard::roll::run_once(
        store,
        boards,
        rollboard::roll::Job::All,
        None,
        now,
        chunk,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("roll")
}

/// [`run_jobs`], checking that every instance was rolled.
pub async fn roll_all(
    store: &Store,
    boards: &[Board],
    now: i64,
    chunk: usize,
) -> Vec<rollboard::roll::Report> {
    let reports = run_jobs(store, boards, now, chunk).await;
    for r in &reports {
        assert_eq!(r.instances_failed, 0, "{}: {:?}", r.board, r.first_error);
    }
    reports
}

/// One run of both jobs over `board` alone at `now` (chunk 10, as [`roll_all`]); its report.
pub async fn roll_board(store: &Store, board: &Board, now: i64) -> roll::Report {
    roll_all(store, std::slice::from_ref(board), now, 10)
        .await
        .remove(0)
}

/// [`roll_board`], `model` rolled too and the `scope` instance checked against it; resummed count.
pub async fn roll_and_match(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    model: &mut Instance,
    now: i64,
) -> u64 {
    let report = roll_board(store, board, now).await;
    model.roll(&board.widest(), now);
    crate::support::model::assert_matches(store, &board.widest(), scope, model, now).await;
    report.resummed
}

/// Ingest settings for `process_batch` called directly: `stream` in `partitions`
/// partitions, the default group and dead-letter stream.
pub fn ingest_settings(stream: &str, partitions: usize) -> rollboard::config::IngestSettings {
    rollboard::config::IngestSettings {
        stream: stream.into(),
        partitions,
        group: "rollboard".into(),
        consumer: "c1".into(),
        batch_size: 100,
        block: Duration::from_millis(100),
        read_piece: rollboard::config::ingest::READ_PIECE,
        claim_piece: rollboard::config::ingest::CLAIM_PIECE,
        claim_idle: Duration::from_secs(30),
        dead_letter_stream: dead_letter_stream().into(),
        dead_letter_max_len: 100_000,
        retain: Duration::from_secs(60),
        max_future_ms: 60_000,
    }
}

/// One stream entry `id` with `fields`.
pub fn entry(id: &str, fields: &[(&str, &str)]) -> rollboard::ingest::stream::Entry {
    rollboard::ingest::stream::Entry {
        id: id.into(),
        fields: Some(
            fields
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        ),
    }
}

/// What `rank` answers for `member` on the unscoped instance in the window `view` at `now`.
pub async fn rank_of(store: &Store, view: &View<'_>, member: &str, now: i64) -> MemberRank {
    store.rank(view, None, member, now).await.expect("rank")
}

/// The total of `member` on the unscoped instance in the window `view` at `now`.
pub async fn total_at(store: &Store, view: &View<'_>, member: &str, now: i64) -> Option<i64> {
    rank_of(store, view, member, now).await.total
}

/// The rank of `member` on the unscoped instance in the window `view` at `now`.
pub async fn rank_at(store: &Store, view: &View<'_>, member: &str, now: i64) -> Option<u64> {
    rank_of(store, view, member, now).await.rank
}

/// How many members the instance `scope` of `view` ranks at `now` (the count of a `top`).
pub async fn count_at(store: &Store, view: &View<'_>, scope: Option<&str>, now: i64) -> u64 {
    let page = store.top(view, scope, 0, 10, now).await.expect("top");
    page.envelope.count
}

/// Raises the watermark of `board`'s instance `scope` to where a roll at `now` puts it (the
/// slice of `now` less a window's slices), as a roll's first step: the watermark and the
/// slices that died.
pub async fn raise_for_roll_at(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    now: i64,
) -> (i64, Vec<i64>) {
    let target = board.slice_of(now) - board.widest().slices_in_window();
    store
        .raise_watermark(&board.widest(), scope, target, now)
        .await
        .expect("raise the watermark")
}

/// Redis's clock (`TIME`), in epoch ms: the time rollboard judges by.
pub async fn redis_now(store: &Store) -> i64 {
    store.time_ms().await.expect("TIME")
}

/// An hour in milliseconds.
pub const HOUR: i64 = 3_600_000;

/// A day in milliseconds.
pub const DAY: i64 = 24 * HOUR;

/// A fixed point in time (November 2025) the tests start their windows from.
pub const T0: i64 = 1_763_700_000_000;

/// The host's clock in milliseconds, as the CLI reads it.
pub fn now_ms() -> i64 {
    rollboard::domain::clock::local_ms()
}

/// One run of every job of `board` at `now` (chunk 3); its report.
pub async fn roll_once(store: &Store, board: &Board, now: i64) -> roll::Report {
    roll::run_once(
        store,
        std::slice::from_ref(board),
        Job::All,
        None,
        now,
        3,
        &CancellationToken::new(),
    )
    .await
    .expect("roll")
    .remove(0)
}

/// Sets `key` to the string `value` (a key of the wrong type breaks the scripts using it).
pub async fn set_string(store: &Store, key: &str, value: &str) {
    let _: () = store
        .client()
        .set(key, value, None, None, false)
        .await
        .expect("set");
}

/// A generated `amount` made positive unless `board` allows negative amounts.
pub fn amount_for(board: &Board, amount: i64) -> i64 {
    if amount < 0 && !board.allow_negative {
        -amount
    } else {
        amount
    }
}

/// A board of `Mode::Resummarize`.
pub fn resummarize(name: &str, slice: i64, n: i64) -> Board {
    let mut b = board(name, slice, n);
    b.mode = Mode::Resummarize;
    b
}

/// A fresh redis-server, a store on it (key prefix `rb`) and `boards` (a board, or a
/// board and its twin, …): a test's start-up in one call.
pub async fn with_fresh_store<B>(boards: B) -> (RedisServer, Store, B) {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    (redis, store, boards)
}

/// A fresh server, a store, a [`resummarize`] board and the start of the slice holding [`T0`].
pub async fn resummarize_at_t0(name: &str, slice: i64, n: i64) -> (RedisServer, Store, Board, i64) {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    (
        redis,
        store,
        resummarize(name, slice, n),
        T0 / slice * slice,
    )
}

/// Applies `events` to the store's unscoped instance and to the model at `now`; the
/// outcomes must agree.
pub async fn apply_model(
    store: &Store,
    b: &Board,
    model: &mut Instance,
    events: &[ApplyEvent],
    now: i64,
) {
    apply_scoped_model(store, b, None, model, events, now).await;
}

/// As [`apply_model`], for the instance of `scope`.
pub async fn apply_scoped_model(
    store: &Store,
    b: &Board,
    scope: Option<&str>,
    model: &mut Instance,
    events: &[ApplyEvent],
    now: i64,
) {
    let expected = model.apply_all(&b.widest(), events, now);
    assert_eq!(store.apply(b, scope, events, now).await.unwrap(), expected);
}

/// The targets of a resummarize run's ranking (as `roll::resummarize` stages them).
pub const RANKING: StageTargets = StageTargets {
    result: true,
    ranked: true,
    refs: false,
    totals: false,
    positive_only: true,
};

/// A staged row of `member` with `total`, from one slice.
pub fn row(member: &str, total: i64) -> Staged {
    Staged {
        member: member.into(),
        total,
        slices: 1,
        fallback_ts: None,
    }
}

/// Applies `events` to the unscoped instance of `b` at `now`; the outcomes.
pub async fn apply_events(
    store: &Store,
    b: &Board,
    events: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    store.apply(b, None, events, now).await.expect("apply")
}

/// Applies `events` to the instance of `b` for `scope` at `now`; the outcomes.
pub async fn apply_events_in(
    store: &Store,
    b: &Board,
    scope: &str,
    events: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    store
        .apply(b, Some(scope), events, now)
        .await
        .expect("apply")
}

/// A consumer called directly, as the daemon's loop calls `process_batch`.
pub struct Consumer<'a> {
    store: &'a Store,
    boards: &'a [Board],
    settings: &'a rollboard::config::IngestSettings,
    metrics: &'a rollboard::metrics::Metrics,
}

impl<'a> Consumer<'a> {
    /// A consumer of `boards` in `store` with `settings`, counting into `metrics`.
    pub fn new(
        store: &'a Store,
        boards: &'a [Board],
        settings: &'a rollboard::config::IngestSettings,
        metrics: &'a rollboard::metrics::Metrics,
    ) -> Self {
        Consumer {
            store,
            boards,
            settings,
            metrics,
        }
    }

    /// Processes one entry of `fields` (id `<now>-0`) read from `stream` at `now`; it must succeed.
    pub async fn process_one(&self, stream: &str, fields: &[(&str, &str)], now: i64) {
        let one = entry(&format!("{now}-0"), fields);
        self.process(stream, &[one], now).await.expect("batch");
    }

    /// Processes `batch`, read from `stream`, at `now`.
    pub async fn process(
        &self,
        stream: &str,
        batch: &[rollboard::ingest::stream::Entry],
        now: i64,
    ) -> Result<rollboard::ingest::consumer::Held, rollboard::store::StoreError> {
        let (store, boards, settings) = (self.store, self.boards, self.settings);
        rollboard::ingest::consumer::process_batch(
            store,
            boards,
            settings,
            self.metrics,
            stream,
            batch,
            now,
        )
        .await
    }
}

/// Whether `scope` is in board `name`'s scope registry.
pub async fn registered(store: &Store, name: &str, scope: &str) -> bool {
    let score: Option<f64> = store
        .client()
        .zscore(store.keys().scopes(name), scope)
        .await
        .expect("ZSCORE");
    score.is_some()
}
