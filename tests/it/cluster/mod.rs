//! A real Redis Cluster: failover, resharding and slots moved mid-call.

mod failover_and_resharding;
mod slot_migration;
