//! What a property test runs on: a current-thread runtime to drive async code from inside
//! proptest's closures, and a runner with a given number of cases.

use proptest::test_runner::{Config, TestRunner};

/// A current-thread runtime with I/O and time enabled.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A proptest runner trying `cases` cases (the rest of the configuration is the default).
pub fn proptest_runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        ..Config::default()
    })
}
