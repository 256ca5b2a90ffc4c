//! Removing a board: finding every key of exactly one board (each instance, scoped or not,
//! and the board-level records) and deleting them in bounded `UNLINK` batches, never a key
//! of a board whose name merely starts the same way (`tips` leaves `tips_v2` alone).
//!
//! Keys are found first through the registries: the scope registry names the instances,
//! the `windows` of the board's settings record names the narrower windows of a board with
//! several (each instance's keys in such a window carry `w:<width>:` after its hash tag),
//! each instance's `slices` registry names its slices and forget logs, the rest are fixed
//! names. A `SCAN` of each master then catches what no registry names: the instances whose
//! scope left the registry (their `meta` outlives their data), the keys of a window no
//! longer recorded, and the scratch keys of a recomputation that died. Its `MATCH` patterns close the hash tag ([`Keys::board_patterns`]),
//! and every key found either way is read back ([`Keys::board_key`]) before it is listed.

use std::collections::{BTreeMap, BTreeSet};

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand};

use super::{as_array, as_string, redirected, reply_err, Store, StoreError};
use crate::domain::board::{format_duration_ms, parse_duration_ms};
use crate::domain::keys::{BoardKey, KeyKind};
use crate::domain::limits::per_request;
use crate::store::Denied;

/// Most keys one `UNLINK` call deletes: each call frees its keys' values in the background,
/// but removing a key from the keyspace still costs Redis a little time per key.
pub const UNLINK_BATCH: usize = 100;

// `UNLINK`, then the keys.
const _: () = assert!(UNLINK_BATCH <= per_request(1, 1));

/// The `COUNT` of each `SCAN` call: keys Redis looks at per call, whatever `MATCH` keeps.
const SCAN_COUNT: i64 = 1000;

/// Every key of one board found in Redis, grouped by instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoardKeys {
    /// The board's name.
    pub board: String,
    /// The keys of each instance (`None`: the unscoped one), with their kinds.
    pub instances: BTreeMap<Option<String>, BTreeMap<String, KeyKind>>,
    /// The board-level records that exist (scope registry, watermark, settings).
    pub records: BTreeMap<String, KeyKind>,
    /// Keys under the board's hash tags that are not of this key schema: listed, never
    /// deleted.
    pub unrecognized: BTreeSet<String>,
    /// Keys that only the scan found (no registry names them).
    pub scanned_only: usize,
}

impl BoardKeys {
    /// How many keys would be deleted.
    pub fn len(&self) -> usize {
        self.records.len() + self.instances.values().map(BTreeMap::len).sum::<usize>()
    }

    /// Whether no key of the board exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys per kind (`result`, `slice:<n>`, ...), over every instance and the records.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        let kinds = self.instances.values().flat_map(BTreeMap::values);
        for kind in kinds.chain(self.records.values()) {
            *out.entry(kind.as_str()).or_default() += 1;
        }
        out
    }

    /// Every key to delete, instance keys first and the scope registry last: a run cut
    /// short leaves the registry naming the instances still to go.
    pub fn keys(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .instances
            .values()
            .flat_map(|k| k.keys().cloned())
            .collect();
        let mut records: Vec<(&String, &KeyKind)> = self.records.iter().collect();
        records.sort_by_key(|(_, kind)| **kind == KeyKind::Scopes);
        out.extend(records.into_iter().map(|(key, _)| key.clone()));
        out
    }

    /// What `drop-board` prints before its summary: each instance with its number of keys
    /// (with `list`, also each key and each record), then every key left alone.
    pub fn report(&self, list: bool) -> Vec<String> {
        let mut out = Vec::new();
        for (scope, keys) in &self.instances {
            let label = scope
                .as_ref()
                .map_or("(unscoped)".into(), |s| format!("scope {s:?}"));
            out.push(format!("instance {label}: {} key(s)", keys.len()));
            if list {
                out.extend(keys.keys().map(|k| format!("  {k}")));
            }
        }
        if list {
            out.extend(self.records.keys().map(|k| format!("record {k}")));
        }
        out.extend(
            self.unrecognized
                .iter()
                .map(|k| format!("left alone (not a key rollboard writes): {k:?}")),
        );
        out
    }

    /// One line: keys, instances and records, keys per kind.
    pub fn summary(&self) -> String {
        let counts: Vec<String> = self
            .counts()
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        format!(
            "{} key(s) of {} instance(s) and {} record(s) ({} found only by the key scan){}{}",
            self.len(),
            self.instances.len(),
            self.records.len(),
            self.scanned_only,
            if counts.is_empty() { "" } else { ": " },
            counts.join(", ")
        )
    }

    /// Files `key` under its instance or the records, as read back by the schema.
    fn add(&mut self, key: String, found: BoardKey) {
        match found {
            BoardKey::Record(kind) => {
                self.records.insert(key, kind);
            }
            BoardKey::Instance { scope, kind } => {
                self.instances.entry(scope).or_default().insert(key, kind);
            }
        }
    }

    fn contains(&self, key: &str) -> bool {
        self.records.contains_key(key) || self.instances.values().any(|k| k.contains_key(key))
    }
}

/// The permission a `NOPERM` answer to the key scan stands for: the shipped `rollboard`
/// user may not `SCAN` (that would show it every key name in the database).
pub fn scan_denied(e: &StoreError) -> Option<Denied> {
    match e {
        StoreError::Redis(e) if e.details().starts_with("NOPERM") => Some(Denied(vec![format!(
            "SCAN (drop-board lists a board's keys with it: run it as a Redis user that may \
             SCAN and UNLINK the board's keys): {}",
            e.details()
        )])),
        _ => None,
    }
}

/// The key suffixes of the narrower windows of a board whose settings record holds
/// `widths` as its `windows` (`7200000ms 86400000ms`, written by a board with several
/// windows; empty for a board with one): each width but the widest, as
/// [`format_duration_ms`] writes it (`2h`). A width that does not read as a duration is
/// skipped: the key scan finds what its keys hold.
fn narrower_windows(widths: &str) -> Vec<String> {
    let ms: Vec<i64> = widths
        .split_whitespace()
        .filter_map(parse_duration_ms)
        .collect();
    let widest = ms.iter().copied().max();
    let mut out: Vec<String> = ms
        .into_iter()
        .filter(|w| Some(*w) != widest)
        .map(format_duration_ms)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `keys` cut into `UNLINK` calls of at most [`UNLINK_BATCH`] keys, in their order; on a
/// cluster each call's keys share one slot (a multi-key command may not span slots).
fn unlink_batches(keys: Vec<String>, clustered: bool) -> Vec<Vec<String>> {
    if !clustered {
        return keys.chunks(UNLINK_BATCH).map(<[String]>::to_vec).collect();
    }
    // The keys of one instance come together and share a slot, so cutting where the slot
    // changes keeps the order (the scope registry still goes last) and costs no more calls.
    let mut batches: Vec<(u16, Vec<String>)> = Vec::new();
    for key in keys {
        let slot = ClusterRouting::hash_key(key.as_bytes());
        match batches.last_mut() {
            Some((s, batch)) if *s == slot && batch.len() < UNLINK_BATCH => batch.push(key),
            _ => batches.push((slot, vec![key])),
        }
    }
    batches.into_iter().map(|(_, batch)| batch).collect()
}

impl Store {
    /// Every key of board `board` (a name as in the configuration) that exists now; reads
    /// only. Keys written meanwhile (a daemon still applying events to the board) may be
    /// missed.
    pub async fn board_keys(&self, board: &str) -> Result<BoardKeys, StoreError> {
        let mut found = BoardKeys {
            board: board.to_string(),
            ..BoardKeys::default()
        };
        self.find_fixed_keys(board, &mut found).await?;
        let windows = self.recorded_windows(board).await?;
        for scope in &self.registered_instances(board).await? {
            for window in &windows {
                self.find_instance_keys(board, scope.as_deref(), window.as_deref(), &mut found)
                    .await?;
            }
        }
        self.find_scanned_keys(board, &mut found).await?;
        Ok(found)
    }

    /// The board's registries and fixed names that exist.
    async fn find_fixed_keys(&self, board: &str, found: &mut BoardKeys) -> Result<(), StoreError> {
        for (key, _) in self.keys.records(board) {
            if let Some(kind) = self.keys.board_key(board, &key) {
                let exists: i64 = self.client().exists(key.as_str()).await?;
                if exists > 0 {
                    found.add(key, kind);
                }
            }
        }
        Ok(())
    }

    /// The windows whose instance keys to look for: the widest (`None`, the keys of a
    /// board with one window), then each narrower window the board's settings record
    /// names (see [`narrower_windows`]).
    async fn recorded_windows(&self, board: &str) -> Result<Vec<Option<String>>, StoreError> {
        let widths: Option<String> = self
            .client()
            .hget(self.keys.settings(board), "windows")
            .await?;
        let mut windows = vec![None];
        windows.extend(
            narrower_windows(widths.as_deref().unwrap_or(""))
                .into_iter()
                .map(Some),
        );
        Ok(windows)
    }

    /// The unscoped instance and every scope in the board's registry, each once.
    async fn registered_instances(&self, board: &str) -> Result<Vec<Option<String>>, StoreError> {
        let mut instances: Vec<Option<String>> = vec![None];
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self
                .scan("ZSCAN", &self.keys.scopes(board), &cursor, 1000)
                .await?;
            instances.extend(page.into_iter().map(|(scope, _)| Some(scope)));
            if next == "0" {
                break;
            }
            cursor = next;
        }
        // ZSCAN may return an element more than once.
        instances.sort();
        instances.dedup();
        Ok(instances)
    }

    /// The keys of one instance in one window (`None`: the widest) that exist: its fixed
    /// keys and those of its registered slices.
    async fn find_instance_keys(
        &self,
        board: &str,
        scope: Option<&str>,
        window: Option<&str>,
        found: &mut BoardKeys,
    ) -> Result<(), StoreError> {
        let k = self.keys.instance_in(board, scope, window);
        let slices: Vec<String> = self
            .client()
            .zrange(k.slices(), 0, -1, None, false, None, false)
            .await?;
        let mut keys = k.apply_keys();
        keys.extend([k.ranked(), k.changes()]);
        for n in slices.iter().filter_map(|n| n.parse::<i64>().ok()) {
            keys.extend([k.slice(n), k.seen_log(n)]);
        }
        // Read back like the scanned names: only keys of this board are listed.
        let keys: Vec<(String, BoardKey)> = keys
            .into_iter()
            .filter_map(|key| self.keys.board_key(board, &key).map(|kind| (key, kind)))
            .collect();
        // One slot (the instance's hash tag), so one pipeline to one node.
        let exists: Vec<i64> = redirected(|| async {
            let pipeline = self.client().pipeline();
            for (key, _) in &keys {
                let _: () = pipeline.exists(key.as_str()).await?;
            }
            pipeline.all().await
        })
        .await?;
        for ((key, kind), n) in keys.into_iter().zip(exists) {
            if n > 0 {
                found.add(key, kind);
            }
        }
        Ok(())
    }

    /// The scan, for what no registry names.
    async fn find_scanned_keys(
        &self,
        board: &str,
        found: &mut BoardKeys,
    ) -> Result<(), StoreError> {
        for pattern in self.keys.board_patterns(board) {
            let (keys, not_text) = self.scan_keys(&pattern).await?;
            found.unrecognized.extend(not_text);
            for key in keys {
                if found.contains(&key) {
                    continue;
                }
                match self.keys.board_key(board, &key) {
                    Some(kind) => {
                        found.scanned_only += 1;
                        found.add(key, kind);
                    }
                    None => {
                        found.unrecognized.insert(key);
                    }
                }
            }
        }
        Ok(())
    }

    /// Deletes `found` (from [`Store::board_keys`]) with `UNLINK` calls of at most
    /// [`UNLINK_BATCH`] keys, each in one cluster slot; returns how many keys existed and
    /// were deleted.
    pub async fn drop_board_keys(&self, found: &BoardKeys) -> Result<u64, StoreError> {
        let client = self.client();
        let mut deleted = 0u64;
        for batch in unlink_batches(found.keys(), client.is_clustered()) {
            let n = redirected(|| client.unlink::<i64, _>(batch.clone())).await;
            self.wrote_keys(&batch);
            deleted += n?.max(0) as u64;
        }
        Ok(deleted)
    }

    /// Every key matching `pattern`, over every master of a cluster (each holds its own
    /// keyspace), or the one server; key names that are not UTF-8 (no key of this schema)
    /// come apart, shown lossily.
    async fn scan_keys(&self, pattern: &str) -> Result<(Vec<String>, Vec<String>), StoreError> {
        let client = self.client();
        let nodes = super::masters(client).await?;
        let (mut out, mut not_text) = (Vec::new(), Vec::new());
        for node in nodes {
            let mut cursor = "0".to_string();
            loop {
                let scan = CustomCommand::new_static("SCAN", ClusterHash::Random, false);
                let args = vec![
                    Value::from(cursor.as_str()),
                    "MATCH".into(),
                    Value::from(pattern),
                    "COUNT".into(),
                    Value::from(SCAN_COUNT),
                ];
                let reply: Value = match &node {
                    Some(server) => {
                        client
                            .with_cluster_node(server.clone())
                            .custom(scan, args)
                            .await?
                    }
                    None => client.custom(scan, args).await?,
                };
                let mut parts = as_array(reply)
                    .ok_or_else(|| reply_err("scan: not an array"))?
                    .into_iter();
                cursor = parts
                    .next()
                    .and_then(as_string)
                    .ok_or_else(|| reply_err("scan: no cursor"))?;
                for key in parts.next().and_then(as_array).unwrap_or_default() {
                    match key {
                        Value::Bytes(b) => match String::from_utf8(b.to_vec()) {
                            Ok(key) => out.push(key),
                            Err(_) => not_text.push(String::from_utf8_lossy(&b).into_owned()),
                        },
                        other => out.push(
                            as_string(other).ok_or_else(|| reply_err("scan: key is not text"))?,
                        ),
                    }
                }
                if cursor == "0" {
                    break;
                }
            }
        }
        out.sort();
        out.dedup();
        Ok((out, not_text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::keys::Keys;

    #[test]
    fn the_narrower_windows_are_read_from_the_recorded_widths() {
        assert_eq!(narrower_windows(""), Vec::<String>::new());
        assert_eq!(narrower_windows("21600000ms"), Vec::<String>::new());
        assert_eq!(
            narrower_windows("86400000ms 604800000ms 2592000000ms"),
            ["1d", "7d"]
        );
        assert_eq!(narrower_windows("21600000ms 7200000ms"), ["2h"]);
        assert_eq!(narrower_windows("7200000ms junk 21600000ms"), ["2h"]);
        // The suffixes are those the keys carry.
        let keys = Keys::new("rb");
        assert_eq!(
            keys.instance_in(
                "tips",
                None,
                Some(&narrower_windows("7200000ms 21600000ms")[0])
            )
            .result(),
            "rb:{tips}:w:2h:result"
        );
    }

    #[test]
    fn unlink_batches_are_bounded_and_on_a_cluster_each_holds_one_slot() {
        let keys = Keys::new("rb");
        let mut found = BoardKeys::default();
        for scope in [None, Some("a"), Some("b:c")] {
            let k = keys.instance("tips", scope);
            for n in 0..150 {
                found.add(
                    k.slice(n),
                    keys.board_key("tips", &k.slice(n)).expect("schema"),
                );
            }
            found.add(k.meta(), keys.board_key("tips", &k.meta()).expect("schema"));
        }
        for (key, kind) in keys.records("tips") {
            found.add(key, BoardKey::Record(kind));
        }
        let all = found.keys();
        assert_eq!(all.len(), 3 * 151 + 4);
        assert_eq!(all.last().map(String::as_str), Some("rb:board:tips:scopes"));
        for clustered in [false, true] {
            let batches = unlink_batches(all.clone(), clustered);
            assert!(batches
                .iter()
                .all(|b| !b.is_empty() && b.len() <= UNLINK_BATCH));
            let mut flat: Vec<String> = batches.concat();
            assert_eq!(flat.last(), all.last(), "the scope registry goes last");
            flat.sort();
            let mut sorted = all.clone();
            sorted.sort();
            assert_eq!(flat, sorted, "every key once");
            if clustered {
                for batch in &batches {
                    let slot = ClusterRouting::hash_key(batch[0].as_bytes());
                    assert!(batch
                        .iter()
                        .all(|k| ClusterRouting::hash_key(k.as_bytes()) == slot));
                }
            }
        }
    }
}
