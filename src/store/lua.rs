//! The Lua scripts, as Redis receives them (`src/store/lua/*.lua`).
//!
//! `apply.lua`, `fold.lua`, `expire.lua` and `stage.lua` read and write the `members` map
//! alike, and with `trim_seen.lua`, `watermark.lua` and `floor.lua` share their helpers:
//! those are written once, in `common.lua`, and put in front of each of the seven here, after the `#!lua` line (a Redis script cannot call
//! another's functions). Everything that loads, calls or names a script by its SHA1 takes
//! its text from here.

/// `#!lua`, `common.lua`, then the script at `$path` (relative to this file).
macro_rules! with_common {
    ($path:literal) => {
        concat!(
            "#!lua\n",
            include_str!("lua/common.lua"),
            include_str!($path)
        )
    };
}

/// Folds a chunk of events one by one (see the script's header).
pub const APPLY: &str = with_common!("lua/apply.lua");
/// Folds a chunk of events pre-aggregated per (member, slice): the fast path.
pub const FOLD: &str = with_common!("lua/fold.lua");
/// Expires one chunk of a dead slice.
pub const EXPIRE: &str = with_common!("lua/expire.lua");
/// Writes one chunk of a recomputed instance into scratch keys.
pub const STAGE: &str = with_common!("lua/stage.lua");
/// Raises an instance's expiry watermark and lists the slices to expire.
pub const WATERMARK: &str = with_common!("lua/watermark.lua");
/// Removes an emptied slice from the registry.
pub const DROP_SLICE: &str = include_str!("lua/drop_slice.lua");
/// Forgets one chunk of idempotency keys whose time has passed.
pub const TRIM_SEEN: &str = with_common!("lua/trim_seen.lua");
/// Reads one consistent snapshot of an instance's ranking.
pub const QUERY: &str = include_str!("lua/query.lua");
/// Replaces live keys by their scratch copies.
pub const SWAP: &str = include_str!("lua/swap.lua");
/// Deletes what is left of an instance that holds no slice.
pub const CLEANUP: &str = include_str!("lua/cleanup.lua");
/// Raises a board's own watermark.
pub const FLOOR: &str = with_common!("lua/floor.lua");
/// Takes, renews or releases the lease of a scheduled job's tick.
pub const LEASE: &str = include_str!("lua/lease.lua");
/// Removes a consumer from its group when it holds nothing pending.
pub const FORGET_CONSUMER: &str = include_str!("lua/forget_consumer.lua");

/// Every script by the name of its file.
pub const ALL: [(&str, &str); 13] = [
    ("apply.lua", APPLY),
    ("cleanup.lua", CLEANUP),
    ("drop_slice.lua", DROP_SLICE),
    ("expire.lua", EXPIRE),
    ("floor.lua", FLOOR),
    ("fold.lua", FOLD),
    ("forget_consumer.lua", FORGET_CONSUMER),
    ("lease.lua", LEASE),
    ("query.lua", QUERY),
    ("stage.lua", STAGE),
    ("swap.lua", SWAP),
    ("trim_seen.lua", TRIM_SEEN),
    ("watermark.lua", WATERMARK),
];

#[cfg(test)]
mod tests {
    use super::ALL;

    /// Redis reads a script's flags from its first line only; a second `#!lua` line would be
    /// a syntax error, and a script without one would not be refused up front when Redis is
    /// out of memory.
    #[test]
    fn the_composed_scripts_open_with_one_shebang_line_then_common() {
        for (name, source) in ALL {
            let rest = source.strip_prefix("#!lua\n").unwrap_or(source);
            assert!(
                !rest.lines().any(|l| l.starts_with("#!")),
                "{name} has a second #! line"
            );
            let composed = [
                "apply.lua",
                "fold.lua",
                "expire.lua",
                "stage.lua",
                "trim_seen.lua",
                "watermark.lua",
                "floor.lua",
            ]
            .contains(&name);
            assert_eq!(
                rest.starts_with("-- common.lua"),
                composed,
                "{name}: common.lua in front of exactly the scripts that share it"
            );
            if composed {
                assert!(source.starts_with("#!lua\n"), "{name}");
            }
        }
    }
}
