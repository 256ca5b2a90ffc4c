//! Faults between rollboard and Redis: cut connections, restarts, memory limits and outage classes.

mod cuts_restarts_and_maxmemory;
mod daemon_rides_out_redis_faults;
mod library_flushed_during_ingest;
mod outage_classes;
