//! What a property test runs on: a current-thread runtime to drive async code from inside
//! proptest's closures, and a runner with a given number of cases.

use fred::prelude::*;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestRunner};
use rollboard::store::Store;

use crate::support::cluster::RedisCluster;
use crate::support::redis::RedisServer;

/// A current-thread runtime with I/O and time enabled.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A [`runtime`] and a fresh redis-server with a store on it (key prefix `rb`), started
/// on that runtime.
pub fn runtime_with_store() -> (tokio::runtime::Runtime, RedisServer, Store) {
    let rt = runtime();
    let (redis, store) = rt.block_on(RedisServer::start_with_store("rb"));
    (rt, redis, store)
}

/// A multi-thread runtime and a fresh redis-server with a store on it (key prefix `rb`),
/// connected on that runtime.
pub fn threaded_runtime_with_store() -> (tokio::runtime::Runtime, RedisServer, Store) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (redis, store) = rt.block_on(RedisServer::start_with_store("rb"));
    (rt, redis, store)
}

/// A proptest runner trying `cases` cases (the rest of the configuration is the default).
pub fn proptest_runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        ..Config::default()
    })
}

/// A small deterministic generator, so a failing seed can be replayed.
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number below `below`.
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// A small deterministic generator (splitmix64), so that a failing run can be replayed
/// from the seed it prints.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Runs `cases` cases of `strategy` against one redis-server, flushed before each case,
/// on a current-thread runtime; `check` runs one case and panics where the store and the
/// model differ.
pub fn run_cases<S: Strategy>(cases: u32, strategy: &S, check: impl AsyncFn(&Store, S::Value)) {
    run_cases_on(runtime(), "model equivalence", cases, strategy, check);
}

/// As [`run_cases`], on a multi-thread runtime; `what` names the property.
pub fn run_cases_threaded<S: Strategy>(
    what: &str,
    cases: u32,
    strategy: &S,
    check: impl AsyncFn(&Store, S::Value),
) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    run_cases_on(rt, what, cases, strategy, check);
}

fn run_cases_on<S: Strategy>(
    rt: tokio::runtime::Runtime,
    what: &str,
    cases: u32,
    strategy: &S,
    check: impl AsyncFn(&Store, S::Value),
) {
    let (_redis, store) = rt.block_on(RedisServer::start_with_store("rb"));
    proptest_runner(cases)
        .run(strategy, |value| {
            rt.block_on(async {
                let _: () = store.client().flushall(false).await.expect("flushall");
                check(&store, value).await;
            });
            Ok(())
        })
        .expect(what);
}

/// As [`run_cases_threaded`], on a Redis Cluster (3 masters, 3 replicas) emptied before each
/// case; `check` also gets the case's number (from 0), e.g. to give it a scope of its own.
pub fn run_cases_on_a_cluster<S: Strategy>(
    what: &str,
    cases: u32,
    strategy: &S,
    check: impl AsyncFn(&Store, usize, S::Value),
) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = RedisCluster::start();
    let store = rt.block_on(cluster.store());
    let case = std::sync::atomic::AtomicUsize::new(0);
    proptest_runner(cases)
        .run(strategy, |value| {
            cluster.flushall();
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            rt.block_on(check(&store, n, value));
            Ok(())
        })
        .expect(what);
}
