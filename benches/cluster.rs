//! Capacity on Redis Cluster: a 3 + 3 cluster of `redis-server` processes started here (as
//! the test fixture of tests/it/support/cluster.rs does), the release daemon (`rollboard run`, built
//! by `cargo bench`) with the shipped boards (`rooms_7d`, unscoped; `fans_7d`, scoped by
//! room) and `redis.min_replicas_acked` at its default (1: every master has a replica).
//!
//! ```sh
//! cargo bench --bench cluster              # 100 000 events per run
//! cargo bench --bench cluster -- --quick   # 20 000 events per run, a few minutes
//! ```
//!
//! `cargo bench --bench rollboard -- table` runs the same rows at its end: both call
//! benches/support/cluster.rs.
//!
//! Each run (`LAYOUTS` there) is a fresh cluster: the events are pre-filled into the stream
//! partitions by the partition rule (CRC-32 of the id modulo the partition count), then the
//! daemons start and the run is timed until every partition's group has nothing pending and
//! nothing undelivered. The runs: the shipped boards with `ingest.partitions` 1 and 3 and 1
//! and 2 daemons; the same with `rooms_7d` split into `shards = 3` and `6`; and `rooms_7d`
//! alone (no `fans_7d`) with 1, 3 and 6 shards, which shows what the unscoped board itself
//! costs each master. Reported per run: events/s end to end, and on each master the Redis
//! time per event: INFO commandstats of the commands rollboard sends at top level (FCALL,
//! XREADGROUP, XACK, WAIT, SET of the confirmation key, and the ZADD and HMGET that register
//! a batch's scopes or shards; the commands run inside scripts are already in FCALL) and the
//! server's user + sys CPU; the masters serving `rooms_7d`'s instances (`*`), and the busiest
//! master's share of all masters' Redis CPU. Every process (six servers, the daemons, this
//! program) shares the machine's cores, so wall-clock rates are a floor; the per-event
//! Redis figures are what a projection can use. The run ends with a markdown table ready to
//! paste into docs/benchmarks.md.

mod support;

use std::process::ExitCode;

use support::cluster::{capacity, events, print_table};
use support::invoked_by_cargo_bench;

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("cluster bench: skipped (run it with `cargo bench --bench cluster`)");
        return ExitCode::SUCCESS;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cluster bench: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let command = format!(
        "cargo bench --bench cluster{}",
        if quick { " -- --quick" } else { "" }
    );
    match runtime.block_on(capacity(events(quick))) {
        Ok(rows) => {
            print_table(&rows, &command);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cluster bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
