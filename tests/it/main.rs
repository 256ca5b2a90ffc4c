//! Integration tests against a real redis-server (started per test by [`util::RedisServer`]).

mod attack;
mod attack10;
mod attack9;
mod attack_http;
mod attack_key;
mod bounded;
mod chain;
mod cli;
mod cluster;
mod daemon;
mod engine;
mod faults;
mod fold;
mod holes;
mod http_edges;
mod intake;
mod layout;
mod model;
mod partitions;
mod prometheus;
mod proxy;
mod redirect;
mod roll;
mod security;
mod seen;
mod util;
