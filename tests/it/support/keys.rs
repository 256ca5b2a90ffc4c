//! The Redis keys the tests read and write, made by the crate's own key schema
//! ([`rollboard::domain::keys::Keys`]) and partition rule under the default settings
//! (`redis.key_prefix`, `ingest.stream`, `ingest.dead_letter_stream`), so that only
//! `key_layout` spells the layout out and every other test follows it.

use std::sync::LazyLock;

use rollboard::config::Settings;
use rollboard::domain::board::{Board, MAX_SHARDS};
use rollboard::domain::keys::{InstanceKeys, Keys};
use rollboard::domain::partition::{partition_key, MAX_PARTITIONS};

use crate::support::config::BOARDS;

/// The settings of a configuration that names only its boards: every default.
static DEFAULTS: LazyLock<Settings> =
    LazyLock::new(|| Settings::from_toml(BOARDS).expect("the default settings"));

/// The key schema under the default `redis.key_prefix`.
pub fn schema() -> Keys {
    Keys::new(prefix())
}

/// The keys of one instance of `board` (`scope` `None`: the unscoped instance), in its
/// widest window.
pub fn instance(board: &str, scope: Option<&str>) -> InstanceKeys {
    schema().instance(board, scope)
}

/// The keys of one instance of `board` in its narrower window `window` (its width as the
/// keys write it, e.g. `2h`, `1d`).
pub fn instance_in(board: &str, scope: Option<&str>, window: &str) -> InstanceKeys {
    schema().instance_in(board, scope, Some(window))
}

/// The base every key of `instance` starts with (`<prefix>:{<tag>}`, with `:w:<width>` in a
/// narrower window), for `SCAN` and `KEYS` patterns.
pub fn base(instance: &InstanceKeys) -> String {
    let meta = instance.meta();
    // Every instance's meta key is its base and `:meta` (keys.rs).
    let base = meta
        .strip_suffix(":meta")
        .expect("an instance's meta key ends in :meta");
    base.to_string()
}

/// A key under `instance`'s base that the schema does not name (`<base>:<rest>`): a key
/// of a kind the daemon does not know, or a `SCAN` pattern such as `tmp:*`.
pub fn under(instance: &InstanceKeys, rest: &str) -> String {
    format!("{}:{rest}", base(instance))
}

/// The start every key of a scoped instance of `board` shares (`<prefix>:{<board>:`):
/// the scoped half of [`Keys::board_patterns`] without its `*`.
pub fn scoped_prefix(board: &str) -> String {
    let [_, scoped, ..] = schema().board_patterns(board);
    scoped.trim_end_matches('*').to_string()
}

/// The start every board-level record of `board` shares (`<prefix>:board:<board>:`).
pub fn records_prefix(board: &str) -> String {
    let scopes = schema().scopes(board);
    scopes.trim_end_matches("scopes").to_string()
}

/// The default `redis.key_prefix`, for patterns across boards.
pub fn prefix() -> &'static str {
    DEFAULTS.redis.key_prefix.as_str()
}

/// The instance name of shard `index` of a sharded board (the scope its keys carry).
pub fn shard(index: usize) -> String {
    let board = Board {
        shards: MAX_SHARDS,
        ..crate::support::boards::board("sharded", 60_000, 1)
    };
    board.shard_names().swap_remove(index)
}

/// The default intake stream (`ingest.stream`).
pub fn intake_stream() -> &'static str {
    DEFAULTS.ingest.stream.as_str()
}

/// The default dead-letter stream (`ingest.dead_letter_stream`).
pub fn dead_letter_stream() -> &'static str {
    DEFAULTS.ingest.dead_letter_stream.as_str()
}

/// The stream key of partition `index` of the default intake stream, when it is split
/// into more than one partition.
pub fn partition_stream(index: usize) -> String {
    partition_key(intake_stream(), MAX_PARTITIONS, index)
}
