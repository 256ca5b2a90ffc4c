//! Faults between rollboard and Redis: cut connections, restarts, memory limits and outage classes.

mod cuts_restarts_and_maxmemory;
mod outage_classes;
