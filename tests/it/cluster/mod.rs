//! A real Redis Cluster: failover, resharding and slots moved mid-call.

mod failover_and_resharding;
mod library_on_every_master;
mod slot_migration;
