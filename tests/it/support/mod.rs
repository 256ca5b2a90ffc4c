//! Fixtures shared by every test: a real redis-server (and cluster, and ACL/TLS server),
//! the daemon and CLI as child processes, configuration files, events, waits and
//! assertions against the in-memory model, and a fault-injecting proxy.

mod acl;
mod answers;
mod asserts;
mod boards;
mod cli;
mod cluster;
mod config;
mod daemon;
mod env;
mod events;
pub mod feed;
mod http;
mod instances;
pub mod model;
mod proptests;
pub mod proxy;
mod redis;
mod sse;
mod wait;

pub use acl::*;
pub use answers::*;
pub use asserts::*;
pub use boards::*;
pub use cli::*;
pub use cluster::*;
pub use config::*;
pub use daemon::*;
pub use env::*;
pub use events::*;
pub use http::*;
pub use instances::*;
pub use proptests::*;
pub use redis::*;
pub use sse::*;
pub use wait::*;
