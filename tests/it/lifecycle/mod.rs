//! The daemon process: start-up, kill and restart, SIGTERM drains, roles and leases.

mod kill_restart_and_sigterm;
mod roles_and_leases;
mod startup_and_shutdown;
