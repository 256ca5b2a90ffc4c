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
//! * [`store`]: the only module that speaks Redis (apply, expire, query), over `lua/*.lua`.
//! * [`query`]: read-side types (entries, pages, ranks) and their decoding.
//! * [`roll`]: the expiry and resummarize jobs, rebuild and verify.
//! * [`cli`]: the command-line subcommands.
#![forbid(unsafe_code)]

pub mod board;
pub mod cli;
pub mod config;
pub mod event;
pub mod keys;
pub mod query;
pub mod roll;
pub mod store;
