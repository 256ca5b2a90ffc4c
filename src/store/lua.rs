//! The Lua scripts, as Redis receives them (`src/store/lua/*.lua`).
//!
//! A Redis script cannot call another's functions, so what several scripts share is
//! written once, in a piece of its own, and put in front of each script that needs it,
//! after the `#!lua` line: `common.lua` (exact integers, error replies, variadic calls) in
//! front of seven of them, and for some of those `digest.lua` (the digest table),
//! `legacy_seen.lua` (the legacy `seen` ZSet), `members.lua` (the `members` map and each
//! member's state), `gate.lua` (the checks of an instance's `meta`) and `write_back.lua`
//! (the last writes of an apply). Each piece's header names the scripts it goes with,
//! as [`PIECES`] does. Everything that loads, calls or names a script by its SHA1 takes its
//! text from here.

/// `#!lua`, then the named pieces (`judging`: all six), then the script `$name`, all from
/// `lua/` beside this file.
macro_rules! composed {
    // A script that judges events (apply.lua, fold.lua): every piece.
    ($name:literal, judging) => {
        composed!(
            $name,
            "common.lua",
            "digest.lua",
            "legacy_seen.lua",
            "members.lua",
            "gate.lua",
            "write_back.lua"
        )
    };
    ($name:literal $(, $piece:literal)*) => {
        concat!(
            "#!lua\n",
            $(include_str!(concat!("lua/", $piece)),)*
            include_str!(concat!("lua/", $name))
        )
    };
}

/// Folds a chunk of events one by one (see the script's header).
pub const APPLY: &str = composed!("apply.lua", judging);
/// Folds a chunk of events pre-aggregated per (member, slice): the fast path.
pub const FOLD: &str = composed!("fold.lua", judging);
/// Expires one chunk of a dead slice.
pub const EXPIRE: &str = composed!("expire.lua", "common.lua", "members.lua");
/// Writes one chunk of a recomputed instance into scratch keys.
pub const STAGE: &str = composed!("stage.lua", "common.lua", "members.lua");
/// Raises an instance's expiry watermark and lists the slices to expire.
pub const WATERMARK: &str = composed!("watermark.lua", "common.lua");
/// Removes an emptied slice from the registry.
pub const DROP_SLICE: &str = include_str!("lua/drop_slice.lua");
/// Forgets one chunk of idempotency keys whose time has passed.
pub const TRIM_SEEN: &str = composed!(
    "trim_seen.lua",
    "common.lua",
    "digest.lua",
    "legacy_seen.lua"
);
/// Reads one consistent snapshot of an instance's ranking.
pub const QUERY: &str = include_str!("lua/query.lua");
/// Replaces live keys by their scratch copies.
pub const SWAP: &str = include_str!("lua/swap.lua");
/// Deletes what is left of an instance that holds no slice.
pub const CLEANUP: &str = include_str!("lua/cleanup.lua");
/// Raises a board's own watermark.
pub const FLOOR: &str = composed!("floor.lua", "common.lua");
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

/// The shared pieces by the name of their file, in the order they are put in front of a
/// script (each uses only those before it), with the scripts that take each.
pub const PIECES: [(&str, &str, &[&str]); 6] = [
    (
        "common.lua",
        include_str!("lua/common.lua"),
        &[
            "apply.lua",
            "fold.lua",
            "expire.lua",
            "stage.lua",
            "trim_seen.lua",
            "watermark.lua",
            "floor.lua",
        ],
    ),
    (
        "digest.lua",
        include_str!("lua/digest.lua"),
        &["apply.lua", "fold.lua", "trim_seen.lua"],
    ),
    (
        "legacy_seen.lua",
        include_str!("lua/legacy_seen.lua"),
        &["apply.lua", "fold.lua", "trim_seen.lua"],
    ),
    (
        "members.lua",
        include_str!("lua/members.lua"),
        &["apply.lua", "fold.lua", "expire.lua", "stage.lua"],
    ),
    (
        "gate.lua",
        include_str!("lua/gate.lua"),
        &["apply.lua", "fold.lua"],
    ),
    (
        "write_back.lua",
        include_str!("lua/write_back.lua"),
        &["apply.lua", "fold.lua"],
    ),
];

#[cfg(test)]
mod tests {
    use super::{ALL, PIECES};

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
            let composed = PIECES[0].2.contains(&name);
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

    /// Each piece is in front of exactly the scripts its header names (`-- Used by:` up to
    /// the first line ending in a full stop), in the order of [`PIECES`], and before the
    /// script's own text.
    #[test]
    fn each_piece_is_in_front_of_the_scripts_its_header_names() {
        for (piece, text, users) in PIECES {
            let mut lines = text.lines().skip_while(|l| !l.starts_with("-- Used by:"));
            let mut header = Vec::new();
            for line in lines.by_ref() {
                header.push(
                    line.trim_start_matches("-- Used by:")
                        .trim_start_matches("--"),
                );
                if line.ends_with('.') {
                    break;
                }
            }
            let mut named: Vec<String> = header
                .join(" ")
                .split([',', ' '])
                .map(|w| w.trim_end_matches('.'))
                .filter(|w| w.ends_with(".lua"))
                .map(str::to_string)
                .collect();
            named.sort();
            let mut listed: Vec<String> = users.iter().map(|u| u.to_string()).collect();
            listed.sort();
            assert_eq!(named, listed, "{piece}: header and PIECES disagree");
            for (name, source) in ALL {
                assert_eq!(
                    source.contains(text),
                    users.contains(&name),
                    "{name} and {piece}"
                );
            }
        }
        for (name, source) in ALL.iter().filter(|(n, _)| PIECES[0].2.contains(n)) {
            let mut at = 0;
            for (piece, text, users) in PIECES {
                if users.contains(name) {
                    let found = source[at..].find(text).map(|i| i + at);
                    assert!(found.is_some(), "{name}: {piece} out of order");
                    at = found.unwrap_or(at) + text.len();
                }
            }
            assert!(
                source[at..].starts_with(&format!("-- {name}:")),
                "{name}: its own text after the pieces"
            );
        }
    }
}
