//! The lease under which one replica runs each tick of a scheduled job (`lease.lua`), and
//! the removal of a consumer from its group at a clean exit (`forget_consumer.lua`).

use std::time::Duration;

use fred::prelude::*;

use super::{as_i64, redirected, reply_err, Store, StoreError};

/// How long the record of the latest tick started is kept: far longer than replicas'
/// clocks and cron fires can differ, so a slower replica's fire of a tick already run
/// finds it.
pub const TICK_RECORD: Duration = Duration::from_secs(600);

/// A lease held by this process for one tick of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job (`roll`, `resummarize`).
    pub job: &'static str,
    /// What the lease key holds while this process has it: `<token>@<tick>`.
    pub value: String,
}

impl Store {
    /// Calls `lease.lua` with `op` for `job`, outside the bound on writing script calls:
    /// a renewal must not wait behind the job's own calls.
    async fn lease_call(&self, job: &str, args: Vec<Value>) -> Result<i64, StoreError> {
        let keys = vec![self.keys.lease(job), self.keys.lease_tick(job)];
        let script = &self.scripts.lease;
        let call = redirected(|| self.fcall(self.client(), script, keys.clone(), args.clone()));
        let v = self.timed(script, call).await?;
        as_i64(&v).ok_or_else(|| reply_err("lease: not a number"))
    }

    /// Takes the lease of `job` for the tick at `tick` (epoch ms of the cron fire, on this
    /// host's clock) as `token` (unique to this process) for `ttl`; `None` when another
    /// replica holds the lease or this tick (or a later one) was already started. A lease
    /// already held under `token` is taken back: the caller must run one tick of `job` at
    /// a time, so such a lease is left from a call whose reply was lost.
    pub async fn acquire_lease(
        &self,
        job: &'static str,
        token: &str,
        tick: i64,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let value = format!("{token}@{tick}");
        let taken = self
            .lease_call(
                job,
                vec![
                    "acquire".into(),
                    value.as_str().into(),
                    (ttl.as_millis() as i64).into(),
                    tick.into(),
                    ((TICK_RECORD + ttl).as_millis() as i64).into(),
                    token.into(),
                ],
            )
            .await?;
        Ok((taken == 1).then_some(Lease { job, value }))
    }

    /// Resets the lease's time to live to `ttl`; `false` when it is not this holder's any
    /// more (it expired, and maybe another replica took it).
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let renewed = self
            .lease_call(
                lease.job,
                vec![
                    "renew".into(),
                    lease.value.as_str().into(),
                    (ttl.as_millis() as i64).into(),
                ],
            )
            .await?;
        Ok(renewed == 1)
    }

    /// Deletes the lease if it is still this holder's (compare and delete); `false` when it
    /// was not.
    pub async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        let released = self
            .lease_call(
                lease.job,
                vec!["release".into(), lease.value.as_str().into()],
            )
            .await?;
        Ok(released == 1)
    }

    /// Removes `consumer` from `group` on `stream` when it holds no pending entry (one
    /// atomic step: `XGROUP DELCONSUMER` would drop pending entries beyond any claim).
    /// `Ok(true)`: it is not in the group any more; `Ok(false)`: it holds pending entries,
    /// or the group does not exist.
    pub async fn forget_consumer(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<bool, StoreError> {
        let script = &self.scripts.forget_consumer;
        let keys = vec![stream.to_string()];
        let args: Vec<Value> = vec![group.into(), consumer.into()];
        let call = redirected(|| self.fcall(self.client(), script, keys.clone(), args.clone()));
        let v = self.timed(script, call).await?;
        match as_i64(&v) {
            Some(n) => Ok(n == 1),
            None => Err(reply_err("forget_consumer: not a number")),
        }
    }
}
