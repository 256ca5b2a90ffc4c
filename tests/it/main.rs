//! Integration tests against a real redis-server (started per test by [`util::RedisServer`]).

mod engine;
mod model;
mod roll;
mod util;
