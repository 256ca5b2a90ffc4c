//! Durability before confirmation: replication is asynchronous, so a master killed right
//! after a write may take it with it. Before rollboard acks a batch (`XACK`) or confirms an
//! append, [`Store::confirm_writes`] waits until `redis.min_replicas_acked` replicas of
//! every master that holds one of the written keys have everything that master received.
//!
//! `WAIT` only counts the writes made on the connection it is sent on, and answers at once
//! on a connection that wrote nothing (after a reconnect, or for a redelivered batch whose
//! events were all duplicates and wrote nothing). So each master gets, on one connection,
//! a pipeline of a tiny write (a short-lived key in a slot that master serves) followed by
//! `WAIT`: a master replicates one ordered stream, so a replica that has the tiny write has
//! every earlier write of that master too. That pipeline is sent once, on a connection that
//! is up: resent after a reconnect it may reach another master (the replica that took over
//! from a dead one), which would confirm there writes the dead master took along.
//!
//! The writes being confirmed are sent once too ([`Store::once`], [`Store::fcall_once`]):
//! an apply call resent after a reconnect may land on the promoted replica after earlier
//! calls of the same batch died with the old master, and the confirmation there (which only
//! sees the new master's stream) would pass. A call cut short fails the batch instead, as
//! an outage; the batch stays unacked and is applied again as a whole, on the new master,
//! where the calls that had landed answer `Duplicate`.

use std::collections::BTreeMap;

use fred::clients::WithOptions;
use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::try_join_all;
use tracing::info;

use super::{reply_err, Function, Store, StoreError};
use crate::config::Durability;

/// How long the tiny write of a confirmation lives (it only has to outlast the `WAIT`).
const SYNC_KEY_TTL_MS: &str = "60000";

/// Prefix of the error a confirmation fails with: the one Redis itself uses when too few
/// replicas are connected (`min-replicas-to-write`), so it is treated as an outage.
pub const NOREPLICAS: &str = "NOREPLICAS";

/// The nodes that hold `keys`, each with one slot it serves that the keys fall in (one
/// entry, named `""`, on a single server).
async fn nodes_of<S: AsRef<str>>(
    client: &Client,
    keys: &[S],
) -> Result<BTreeMap<String, Option<u16>>, StoreError> {
    let mut nodes: BTreeMap<String, Option<u16>> = BTreeMap::new();
    if !client.is_clustered() {
        nodes.insert(String::new(), None);
        return Ok(nodes);
    }
    if client.cached_cluster_state().is_none() {
        client.wait_for_connect().await?;
    }
    let state = client
        .cached_cluster_state()
        .ok_or_else(|| reply_err("no cluster routing table after connecting"))?;
    for key in keys {
        let slot = ClusterRouting::hash_key(key.as_ref().as_bytes());
        let node = state
            .get_server(slot)
            .map(|s| s.to_string())
            .unwrap_or_default();
        nodes.entry(node).or_insert(Some(slot));
    }
    Ok(nodes)
}

/// A hash tag whose slot is `slot`: the smallest decimal number that hashes there.
fn tag_for_slot(slot: u16) -> String {
    (0u32..)
        .map(|n| n.to_string())
        .find(|tag| ClusterRouting::hash_key(tag.as_bytes()) == slot)
        .unwrap_or_default()
}

/// `e`, or where it is Redis refusing `command` for good (an ACL's `NOPERM`, a service that
/// does not offer it), that refusal with what to set: such a service replicates for you,
/// and `redis.min_replicas_acked = 0` sends neither `ROLE` nor `WAIT`.
fn refusal_named(e: StoreError, command: &str, by: &str) -> StoreError {
    let StoreError::Redis(error) = &e else {
        return e;
    };
    let details = error.details();
    if e.kind() != "other" || !details.to_ascii_uppercase().contains(command) {
        return e;
    }
    StoreError::Redis(fred::error::Error::new(
        error.kind().clone(),
        format!(
            "{details} ({command} is how {by}: on a service that refuses it and replicates \
             for you, set redis.min_replicas_acked = 0)"
        ),
    ))
}

/// Whether a `ROLE` reply is a master's with at least one replica.
fn master_with_replicas(reply: &Value) -> bool {
    match reply {
        Value::Array(parts) => {
            matches!(parts.get(2), Some(Value::Array(replicas)) if !replicas.is_empty())
        }
        _ => false,
    }
}

impl StoreError {
    /// Whether fewer replicas than required acknowledged a write.
    pub fn is_replica_ack_failure(&self) -> bool {
        matches!(self, StoreError::Redis(e) if e.details().starts_with(NOREPLICAS))
    }
}

/// Options of a command written at most once: never resent after a reconnect, never
/// redirected. A command issued while the client is reconnecting waits for the new
/// connection and is written there, once (`fail_fast` would fail it at once instead, also
/// on a client still making its first connection, which callers that wait for a restarted
/// Redis rely on); the confirmation adds `fail_fast` (see [`Store::confirm_writes`]).
fn send_once() -> Options {
    Options {
        max_attempts: Some(1),
        ..Options::default()
    }
}

impl Store {
    /// `client` with its commands sent at most once (see the module documentation): a
    /// command whose connection drops fails instead of being resent on a new one, which
    /// after a failover may lead to another master.
    pub(super) fn once(&self, client: &Client) -> WithOptions<Client> {
        client.with_options(&send_once())
    }

    /// `FCALL` (or `EVALSHA`) of `function` sent at most once (see [`Store::once`]); an
    /// answer that the script is not held (nothing ran: a promoted replica or a restarted
    /// server) loads the scripts and sends the call once more, at most once again.
    pub(super) async fn fcall_once(
        &self,
        function: &Function,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        let calling = self.calling_for_call().await?;
        let (command, name) = calling.command(function);
        let route = keys
            .first()
            .map(|k| ClusterHash::Custom(ClusterRouting::hash_key(k.as_bytes())))
            .unwrap_or(ClusterHash::Random);
        let mut call: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        call.push(Value::from(name));
        call.push(Value::from(keys.len() as i64));
        call.extend(keys.iter().map(|k| Value::from(k.as_str())));
        call.extend(args);
        let written = keys;
        let script_call = CustomCommand::new(command, route, false);
        let once = self.once(client);
        let out = super::calls::reloading(client, calling, function, || {
            once.custom(script_call.clone(), call.clone())
        })
        .await;
        self.wrote(function, &written);
        out
    }

    /// Sets how many replicas must acknowledge writes before [`Store::confirm_writes`]
    /// returns.
    pub fn with_durability(mut self, durability: Durability) -> Store {
        self.durability = durability;
        self
    }

    /// The replica count writes are confirmed with: the configured one, else decided once
    /// from the topology (1 when every master has a replica, else 0) and logged.
    pub async fn replicas_required(&self) -> Result<u32, StoreError> {
        if let Some(n) = self.durability.replicas {
            return Ok(n);
        }
        let n = self
            .replicas_auto
            .get_or_try_init(|| async {
                let client = self.client();
                // ROLE on every master lists its connected replicas. (CLUSTER SLOTS
                // leaves out replicas that have not yet received a byte of replication.)
                let role = CustomCommand::new_static("ROLE", ClusterHash::Random, false);
                let replies = super::on_every_master(client, role, Vec::new())
                    .await
                    .map_err(|e| refusal_named(e, "ROLE", "the replica count is decided"))?;
                let replicated = replies.iter().all(master_with_replicas);
                let n = u32::from(replicated);
                info!(
                    min_replicas_acked = n,
                    "redis.min_replicas_acked not set: {}",
                    if replicated {
                        "every master has a replica, so writes are confirmed once one holds them"
                    } else {
                        "no replicas, so writes are confirmed once the master has them"
                    }
                );
                Ok::<u32, StoreError>(n)
            })
            .await?;
        Ok(*n)
    }

    /// Returns once the required number of replicas of every master holding one of `keys`
    /// have every write that master received so far (see the module documentation);
    /// fails with a `NOREPLICAS` error, an outage, when fewer acknowledge in time.
    pub async fn confirm_writes<S: AsRef<str>>(&self, keys: &[S]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let wanted = self.replicas_required().await?;
        if wanted == 0 {
            return Ok(());
        }
        // One connection per node: the tiny write and the WAIT travel on the same one.
        let client = self.client();
        let nodes = nodes_of(client, keys).await?;
        try_join_all(
            nodes
                .into_iter()
                .map(|(node, slot)| self.confirm_node(client, node, slot, wanted)),
        )
        .await?;
        Ok(())
    }

    /// Waits until `wanted` replicas of `node` hold every write made on it so far: a tiny
    /// write to the slot `slot` (any slot of a single server: `None`), then `WAIT`.
    async fn confirm_node(
        &self,
        client: &Client,
        node: String,
        slot: Option<u16>,
        wanted: u32,
    ) -> Result<(), StoreError> {
        let timeout_ms = self.durability.timeout.as_millis().max(1) as i64;
        let (key, route) = match slot {
            Some(slot) => (
                self.keys.sync(Some(&tag_for_slot(slot))),
                ClusterHash::Custom(slot),
            ),
            None => (self.keys.sync(None), ClusterHash::FirstKey),
        };
        // Written once, on a connection that is up now, or not at all. The client would
        // otherwise hold the pipeline through a reconnect, or resend it after one (and
        // follow MOVED / ASK), and after a failover the new connection leads to the
        // replica that took over: it confirms there, once it has a replica of its own,
        // writes that died with the old master. A confirmation cut short fails instead
        // (an outage: the batch is applied again, on the new master, and confirmed there).
        let pipeline = client.pipeline();
        let sent = pipeline.with_options(&Options {
            fail_fast: true,
            ..send_once()
        });
        let _: () = sent
            .custom(
                CustomCommand::new_static("SET", ClusterHash::FirstKey, false),
                vec![key.as_str(), "1", "PX", SYNC_KEY_TTL_MS],
            )
            .await?;
        let _: () = sent
            .custom(
                CustomCommand::new("WAIT", route, false),
                vec![i64::from(wanted), timeout_ms],
            )
            .await?;
        let node_name = if node.is_empty() {
            "redis"
        } else {
            node.as_str()
        };
        let (_, acked): (Value, i64) = pipeline.all().await.map_err(|e| {
            // A MOVED or ASK for the tiny write (a slot moving) needs a second write,
            // which `max_attempts` refuses: retried later as an outage, with fresh routing.
            if e.kind() == &fred::error::ErrorKind::Unknown
                && e.details().starts_with("Too many failed write attempts")
            {
                StoreError::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::Unknown,
                    format!(
                        "{NOREPLICAS} the confirmation write to {node_name} was redirected \
                         before its WAIT ({e}); nothing was confirmed"
                    ),
                ))
            } else {
                refusal_named(StoreError::Redis(e), "WAIT", "writes are confirmed")
            }
        })?;
        if acked < i64::from(wanted) {
            return Err(StoreError::Redis(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                format!(
                    "{NOREPLICAS} {acked} of the {wanted} replica(s) required \
                     (redis.min_replicas_acked) acknowledged the writes to {} within \
                     {timeout_ms} ms; nothing was confirmed",
                    node_name
                ),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_gets_a_tag_of_its_own() {
        for slot in [0u16, 1, 5461, 10922, 16383] {
            let tag = tag_for_slot(slot);
            assert_eq!(ClusterRouting::hash_key(tag.as_bytes()), slot);
            assert_eq!(
                ClusterRouting::hash_key(format!("rb:sync:{{{tag}}}").as_bytes()),
                slot
            );
        }
    }

    #[test]
    fn a_refused_wait_names_the_setting_that_avoids_it() {
        let refused = |text: &'static str| {
            StoreError::Redis(fred::error::Error::new(
                fred::error::ErrorKind::Unknown,
                text,
            ))
        };
        let named = refusal_named(
            refused("NOPERM User sl has no permissions to run the 'wait' command"),
            "WAIT",
            "writes are confirmed",
        );
        assert!(
            named
                .to_string()
                .contains("set redis.min_replicas_acked = 0"),
            "{named}"
        );
        assert!(named.is_outage());
        // An outage, or another command's refusal, is left as it is.
        for other in [
            StoreError::Redis(fred::error::Error::new(
                fred::error::ErrorKind::IO,
                "connection reset (WAIT)",
            )),
            refused("LOADING Redis is loading the dataset in memory"),
            refused("ERR unknown command 'XADD'"),
        ] {
            let text = other.to_string();
            assert_eq!(refusal_named(other, "WAIT", "x").to_string(), text);
        }
    }

    #[test]
    fn role_replies_tell_whether_a_master_has_replicas() {
        let node = |p: i64| Value::Array(vec!["127.0.0.1".into(), p.into(), "id".into()]);
        let role = |replicas: Vec<Value>| {
            Value::Array(vec!["master".into(), 10.into(), Value::Array(replicas)])
        };
        assert!(master_with_replicas(&role(vec![node(1)])));
        assert!(!master_with_replicas(&role(vec![])));
    }
}
