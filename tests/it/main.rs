//! Integration tests against a real redis-server (started per test by [`util::RedisServer`]).

mod attack;
mod attack9;
mod bounded;
mod cli;
mod daemon;
mod engine;
mod holes;
mod http_edges;
mod intake;
mod model;
mod prometheus;
mod proxy;
mod roll;
mod security;
mod seen;
mod util;
