//! Integration tests against a real redis-server (started per test by
//! [`support::redis::RedisServer`]), one folder per behaviour; fixtures live in `support/`.

mod apply;
mod cli;
mod clock;
mod cluster;
mod config;
mod dedup;
mod deploy;
mod faults;
mod feed;
mod http;
mod ingest;
mod key_layout;
mod lifecycle;
mod limits;
mod query;
mod roll;
mod serverless;
mod shards;
mod shards_ops;
mod support;
mod windows;
