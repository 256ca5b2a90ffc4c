//! Fixtures shared by every test: a real redis-server (and cluster, and ACL/TLS server),
//! the daemon and CLI as child processes, configuration files, events, waits and
//! assertions against the in-memory model, and a fault-injecting proxy.

pub mod acl;
pub mod answers;
pub mod asserts;
pub mod boards;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod env;
pub mod events;
pub mod feed;
pub mod http;
pub mod instances;
pub mod keys;
pub mod model;
pub mod proptests;
pub mod proxy;
pub mod redis;
pub mod requests;
pub mod sse;
pub mod wait;
