//! The Lua scripts, as Redis receives them: one library of functions (`src/store/lua/*.lua`).
//!
//! What several scripts share is written once, in a piece of its own: `common.lua` (exact
//! integers, error replies, variadic calls), `digest.lua` (the digest table),
//! `legacy_seen.lua` (the legacy `seen` ZSet), `members.lua` (the `members` map and each
//! member's state), `changes.lua` (the change feed of a board's top), `gate.lua` (the checks of an
//! instance's `meta`) and `write_back.lua`
//! (the last writes of an apply). Each piece's header names the scripts that use it, as
//! [`PIECES`] does. The pieces sit once at the top of the [`Library`], and each script is a
//! function of it; everything that loads, calls or names a script takes it from here.

/// Every script by the name of its file, as written (its header, then its body over `KEYS`
/// and `ARGV`).
pub const SCRIPTS: [(&str, &str); 12] = [
    ("cleanup.lua", include_str!("lua/cleanup.lua")),
    ("drop_slice.lua", include_str!("lua/drop_slice.lua")),
    ("expire.lua", include_str!("lua/expire.lua")),
    ("floor.lua", include_str!("lua/floor.lua")),
    ("fold.lua", include_str!("lua/fold.lua")),
    (
        "forget_consumer.lua",
        include_str!("lua/forget_consumer.lua"),
    ),
    ("lease.lua", include_str!("lua/lease.lua")),
    ("query.lua", include_str!("lua/query.lua")),
    ("stage.lua", include_str!("lua/stage.lua")),
    ("swap.lua", include_str!("lua/swap.lua")),
    ("trim_seen.lua", include_str!("lua/trim_seen.lua")),
    ("watermark.lua", include_str!("lua/watermark.lua")),
];

/// The scripts that only read: their functions carry the `no-writes` flag, so Redis runs
/// them when it is out of memory too (and would on a replica, by `FCALL_RO`).
pub const READ_ONLY: [&str; 1] = ["query.lua"];

/// Stands for the library's version in [`template`], replaced by [`Library::version`].
const VERSION: &str = "@VERSION@";

/// The library's text before its version is known: the pieces once, at the top, then one
/// `redis.register_function` per script whose callback is the script's text.
fn template() -> String {
    let mut text = format!("#!lua name=rollboard_{VERSION}\n");
    for (_, piece, _) in PIECES {
        text.push_str(piece);
        text.push('\n');
    }
    for (file, script) in SCRIPTS {
        let flags = if READ_ONLY.contains(&file) {
            "{'no-writes'}"
        } else {
            "{}"
        };
        text.push_str(&format!(
            "redis.register_function{{function_name = '{}', flags = {flags},\n\
             callback = function(KEYS, ARGV)\n{script}\nend}}\n",
            function_name(VERSION, file)
        ));
    }
    text
}

/// `rollboard_<version>_<script>`: function names are one namespace across a server's
/// libraries, so each version's are its own.
fn function_name(version: &str, file: &str) -> String {
    format!("rollboard_{version}_{}", file.trim_end_matches(".lua"))
}

/// rollboard's Lua library, as `FUNCTION LOAD` takes it.
///
/// Redis keeps a loaded library's functions, and everything its top level defined, until
/// the library is replaced: calling one runs the script's own body and nothing else. (A
/// script sent by `EVALSHA` runs its whole text on every call, and so makes every one of
/// the pieces' functions anew each time.) The name carries a digest of the text, so
/// daemons of two versions, during a rolling upgrade, each call their own.
#[derive(Debug)]
pub struct Library {
    /// The digest of the text the name carries (12 hex digits).
    pub version: String,
    /// The library's name, `rollboard_<version>`.
    pub name: String,
    /// The text `FUNCTION LOAD` takes.
    pub text: String,
}

impl Library {
    /// The function that runs `file` (e.g. `fold.lua`).
    pub fn function(&self, file: &str) -> String {
        function_name(&self.version, file)
    }
}

/// The library of this build, made once.
pub fn library() -> &'static Library {
    static LIBRARY: std::sync::LazyLock<Library> = std::sync::LazyLock::new(|| {
        let template = template();
        let digest = blake3::hash(template.as_bytes()).to_hex();
        let version = digest[..12].to_string();
        Library {
            name: format!("rollboard_{version}"),
            text: template.replace(VERSION, &version),
            version,
        }
    });
    &LIBRARY
}

/// One script as `SCRIPT LOAD` takes it, for a server that refuses functions
/// (`redis.scripts = "eval"`): the same script and the pieces it uses, in one text.
#[derive(Debug)]
pub struct EvalScript {
    /// The script's file, e.g. `fold.lua`.
    pub file: &'static str,
    /// The text: a `#!lua` line with the flags of its function, the pieces the script
    /// uses (in the order of [`PIECES`]), then the script's body as a local function that
    /// is called and its answer returned.
    pub text: String,
    /// The SHA1 digest of the text, by which `EVALSHA` calls it. A release that changes a
    /// script's text (or a piece it uses) calls it by another digest, so two releases
    /// side by side each run their own.
    pub sha: String,
}

/// The text of `file` for `SCRIPT LOAD`. Its body runs as a function of its own, as in the
/// library: the pieces' locals and the script's do not share one Lua function's limits.
/// Each `EVALSHA` runs the whole text, so it defines the pieces it uses anew each time.
fn eval_text(file: &str, script: &str) -> String {
    let flags = if READ_ONLY.contains(&file) {
        " flags=no-writes"
    } else {
        ""
    };
    let mut text = format!("#!lua{flags}\n");
    for (_, piece, users) in PIECES {
        if users.contains(&file) {
            text.push_str(piece);
            text.push('\n');
        }
    }
    text.push_str("local function script()\n");
    text.push_str(script);
    text.push_str("\nend\nreturn script()\n");
    text
}

/// Every script of this build as `SCRIPT LOAD` takes it, in the order of [`SCRIPTS`],
/// made once.
pub fn eval_scripts() -> &'static [EvalScript] {
    static SCRIPTS_TO_EVAL: std::sync::LazyLock<Vec<EvalScript>> = std::sync::LazyLock::new(|| {
        SCRIPTS
            .iter()
            .map(|(file, script)| {
                let text = eval_text(file, script);
                EvalScript {
                    file,
                    sha: fred::util::sha1_hash(&text),
                    text,
                }
            })
            .collect()
    });
    &SCRIPTS_TO_EVAL
}

/// The shared pieces by the name of their file, in the order they are put in front of a
/// script (each uses only those before it), with the scripts that take each.
pub const PIECES: [(&str, &str, &[&str]); 7] = [
    (
        "common.lua",
        include_str!("lua/common.lua"),
        &[
            "fold.lua",
            "expire.lua",
            "stage.lua",
            "trim_seen.lua",
            "watermark.lua",
            "floor.lua",
            "query.lua",
        ],
    ),
    (
        "changes.lua",
        include_str!("lua/changes.lua"),
        &["fold.lua", "expire.lua", "swap.lua"],
    ),
    (
        "digest.lua",
        include_str!("lua/digest.lua"),
        &["fold.lua", "trim_seen.lua"],
    ),
    (
        "legacy_seen.lua",
        include_str!("lua/legacy_seen.lua"),
        &["fold.lua", "trim_seen.lua"],
    ),
    (
        "members.lua",
        include_str!("lua/members.lua"),
        &["fold.lua", "expire.lua", "stage.lua"],
    ),
    ("gate.lua", include_str!("lua/gate.lua"), &["fold.lua"]),
    (
        "write_back.lua",
        include_str!("lua/write_back.lua"),
        &["fold.lua"],
    ),
];

#[cfg(test)]
mod tests {
    use super::{eval_scripts, library, PIECES, READ_ONLY, SCRIPTS};

    /// The names a piece defines at its top level: its functions and its constants.
    fn defined(piece: &str) -> Vec<&str> {
        piece
            .lines()
            .filter_map(|l| l.strip_prefix("local "))
            .flat_map(|l| {
                let l = l.strip_prefix("function ").unwrap_or(l);
                let names = l.split(['=', '(']).next().unwrap_or_default();
                names.split(',').map(str::trim)
            })
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// Whether `text` uses `name` as a whole word.
    fn uses(text: &str, name: &str) -> bool {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        text.match_indices(name)
            .any(|(i, _)| !text[..i].ends_with(word) && !text[i + name.len()..].starts_with(word))
    }

    /// Each piece's header (`-- Used by:` up to the first line ending in a full stop) names
    /// exactly the scripts of [`PIECES`], and those are the scripts that use a name the
    /// piece defines, themselves or through a piece they use.
    #[test]
    fn each_piece_serves_the_scripts_its_header_names() {
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
            let names = defined(text);
            assert!(!names.is_empty(), "{piece} defines nothing");
            for (file, script) in SCRIPTS {
                let through = PIECES.iter().any(|(other, other_text, other_users)| {
                    other != &piece
                        && other_users.contains(&file)
                        && names.iter().any(|n| uses(other_text, n))
                });
                let direct = names.iter().any(|n| uses(script, n));
                assert_eq!(
                    direct || through,
                    users.contains(&file),
                    "{file} and {piece}"
                );
            }
        }
    }

    /// One `#!lua` line naming the library, the pieces once, then one function per script,
    /// flagged `no-writes` when the script only reads.
    #[test]
    fn the_library_registers_one_function_per_script() {
        let library = library();
        assert_eq!(library.version.len(), 12);
        assert!(library
            .text
            .starts_with(&format!("#!lua name={}\n", library.name)));
        assert_eq!(library.text.matches("#!").count(), 1);
        for (_, piece, _) in PIECES {
            assert_eq!(library.text.matches(piece).count(), 1);
        }
        for (file, _) in SCRIPTS {
            let function = library.function(file);
            let registration = format!("function_name = '{function}', flags = ");
            let at = library.text.find(&registration).expect(file);
            let flags = &library.text[at + registration.len()..][..13];
            assert_eq!(
                flags.starts_with("{'no-writes'}"),
                READ_ONLY.contains(&file),
                "{file}"
            );
        }
    }

    /// Each script's text for `EVALSHA` holds the pieces it uses and no other, once, before
    /// its body, under the flags of its function; its digest is its text's.
    #[test]
    fn each_script_to_eval_holds_its_pieces_and_its_flags() {
        assert_eq!(eval_scripts().len(), SCRIPTS.len());
        for (script, (file, body)) in eval_scripts().iter().zip(SCRIPTS) {
            assert_eq!(script.file, file);
            let first = script.text.lines().next().unwrap_or_default();
            let flags = if READ_ONLY.contains(&file) {
                "#!lua flags=no-writes"
            } else {
                "#!lua"
            };
            assert_eq!(first, flags, "{file}");
            for (piece, text, users) in PIECES {
                let count = script.text.matches(text).count();
                assert_eq!(count, usize::from(users.contains(&file)), "{file}: {piece}");
            }
            assert!(script.text.contains(body), "{file}");
            assert_eq!(script.sha, fred::util::sha1_hash(&script.text));
            assert_eq!(script.sha.len(), 40);
        }
    }
}
