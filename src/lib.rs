//! rollboard keeps exact rolling-window leaderboards in Redis.
//!
//! Events (a flat map of string fields, as in a Redis Stream entry) are folded into
//! per-time-slice Hash buckets and a ZSet ranking per board instance; scheduled jobs keep
//! the window rolling; queries read one consistent snapshot per answer.
//!
//! # Layout
//!
//! * [`config`]: raw serde settings read by the `config` crate, validated into [`config::Settings`].
//! * [`board`]: board definitions and the pure window/slice arithmetic.
//! * [`keys`]: the Redis key schema, hash-tagged per board instance.
//! * [`event`]: parsing and validating one event; every rejection reason is a variant.
//! * [`store`]: every Redis operation on leaderboard data (apply, expire, query), over
//!   `store/lua/*.lua`.
//! * [`stream`]: the stream side: partition rule and keys, append, read, ack, claim,
//!   dead-letter; the consumer ([`ingest`]) and the intake (`send`, `POST /v1/events`) call it.
//! * [`query`]: read-side types (entries, pages, ranks) and their decoding.
//! * [`clock`]: the one clock: Redis's `TIME`, as seen from this process.
//! * [`roll`]: the expiry and resummarize jobs, rebuild and verify.
//! * [`ingest`]: the Redis Stream consumer: read, group, apply, ack, reclaim, dead-letter.
//! * [`dead_letters`]: the dead-letter stream read back: list letters, replay them to the
//!   instances that refused them.
//! * [`metrics`]: the Prometheus registry and one method per notable happening.
//! * [`http`]: the axum router: query API, event intake, metrics and health.
//! * [`tokens`]: the HTTP roles' bearer tokens, re-read from their files without a restart.
//! * [`roles`]: the parts of the daemon one process runs (intake, query, consume, jobs).
//! * [`daemon`]: `rollboard run`: wires consumer, scheduler and HTTP under one shutdown token.
//! * [`shutdown`]: signal handling (graceful first signal, forced second).
//! * [`cli`]: the command-line subcommands.
#![forbid(unsafe_code)]

pub mod board;
pub mod cli;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod dead_letters;
pub mod event;
pub mod http;
pub mod ingest;
pub mod keys;
pub mod metrics;
pub mod query;
pub mod roles;
pub mod roll;
pub mod shutdown;
pub mod store;
pub mod stream;
pub mod tokens;
