//! The process itself: which build is running, and (on Linux) its CPU, memory, file
//! descriptors and start time.

use prometheus::{IntGaugeVec, Opts, Registry};

use super::register;

/// The commit the binary was built from (`build.rs`), or `unknown`.
pub const COMMIT: &str = match option_env!("ROLLBOARD_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// Registers `rollboard_build_info` (set to 1) and the process collector.
pub(super) fn register_families(registry: &Registry) {
    let build_info = register(
        registry,
        IntGaugeVec::new(
            Opts::new(
                "rollboard_build_info",
                "1, labelled with the version and the commit (`unknown` when built \
                 without git) of the running binary.",
            ),
            &["version", "commit"],
        )
        .expect("valid metric"),
    );
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION"), COMMIT])
        .set(1);
    #[cfg(target_os = "linux")]
    {
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        // process_start_time_seconds, ...: read from /proc at each scrape.
        let process = prometheus::process_collector::ProcessCollector::for_self();
        registry
            .register(Box::new(process))
            .expect("process metric names are unique");
    }
}
