//! rollboard keeps exact rolling-window leaderboards in Redis.
//!
//! Events (a flat map of string fields, as in a Redis Stream entry) are folded into
//! per-time-slice Hash buckets and a ZSet ranking per board instance; scheduled jobs keep
//! the window rolling; queries read one consistent snapshot per answer.
//!
//! # Layout
//!
//! Each folder is one role; a module imports only from the floors below it, never up and
//! never in a circle:
//!
//! * [`domain`] (ground floor, no I/O): boards and the window arithmetic, events and their
//!   validation, the key schema, the partition rule, ranking types, roles, the clock, and
//!   how many arguments one Redis request may hold.
//! * [`config`]: one file per section of the configuration, raw serde structs validated
//!   into [`config::Settings`]; the bearer tokens re-read from their files.
//! * [`metrics`]: the Prometheus registry; one method per notable happening, taking plain
//!   numbers and labels.
//! * [`store`]: every Redis operation on leaderboard data, over the Lua scripts in
//!   `store/lua/`.
//! * [`ingest`]: the intake streams: stream I/O, the consumer loop and its batch stages,
//!   the intake shared by `POST /v1/events` and `rollboard send`, the dead letters.
//! * [`roll`]: the scheduled jobs (expiry, resummarize) and rebuild/verify.
//! * [`edges`]: what the outside world talks to: the daemon's wiring, the HTTP API, the
//!   command line, signal handling.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod domain;
pub mod edges;
pub mod ingest;
pub mod metrics;
pub mod roll;
pub mod store;
