//! The Redis key schema. Every key of one board instance shares one hash tag, so every
//! script touches one cluster slot.
//!
//! Instance keys look like `rb:{rooms_7d}:result` or `rb:{fans_7d:room42}:slice:490000`.
//! Board names never contain `:`, and no key suffix contains `}`, so two instances can
//! never produce the same key.

/// Key builder for one configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// A schema under `prefix` (e.g. `rb`).
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// The keys of one board instance (`scope` is `None` for an unscoped board).
    pub fn instance(&self, board: &str, scope: Option<&str>) -> InstanceKeys {
        self.instance_in(board, scope, None)
    }

    /// The keys of one board instance in one of its board's windows: `window` names a
    /// window narrower than the board's widest (its width as `format_duration_ms` writes
    /// it), whose keys carry it after the hash tag (`rb:{tips}:w:1d:result` for `24h`); `None` is
    /// the widest (the keys of a board with one window), which also holds the
    /// instance's idempotency keys.
    pub fn instance_in(
        &self,
        board: &str,
        scope: Option<&str>,
        window: Option<&str>,
    ) -> InstanceKeys {
        let tag = match scope {
            Some(scope) => format!("{{{board}:{scope}}}"),
            None => format!("{{{board}}}"),
        };
        let base = match window {
            Some(window) => format!("{}:{tag}:w:{window}", self.prefix),
            None => format!("{}:{tag}", self.prefix),
        };
        InstanceKeys {
            base,
            changes: self.changes(board, scope, window),
        }
    }

    /// The change feed of one board instance (Stream, see docs/api.md#the-change-feed):
    /// `rb:changes:{rooms}`, `rb:changes:{fans:room42}`, under the instance's hash tag so
    /// that the script changing the ranking can append to it. `window` names a window
    /// narrower than the board's widest (`rb:changes:{rooms}:12h`); `None` is the widest.
    pub fn changes(&self, board: &str, scope: Option<&str>, window: Option<&str>) -> String {
        let tag = match scope {
            Some(scope) => format!("{board}:{scope}"),
            None => board.to_string(),
        };
        match window {
            Some(window) => format!("{}:changes:{{{tag}}}:{window}", self.prefix),
            None => format!("{}:changes:{{{tag}}}", self.prefix),
        }
    }

    /// Registry of the scope values of a scoped board (ZSet: scope -> newest slice seen).
    pub fn scopes(&self, board: &str) -> String {
        format!("{}:board:{}:scopes", self.prefix, board)
    }

    /// Registry of the periods of a period board (ZSet: period id -> its start, epoch
    /// ms): the archives a query may name and the roll deletes beyond `keep_periods`.
    pub fn periods(&self, board: &str) -> String {
        format!("{}:board:{}:periods", self.prefix, board)
    }

    /// The board's own watermark (Hash: `expired_through`, `last_roll`), raised by every
    /// roll of the board before its instances. It holds for every instance, including
    /// those no roll visits any more (scopes that emptied and left the registry).
    pub fn window(&self, board: &str) -> String {
        format!("{}:board:{}:window", self.prefix, board)
    }

    /// The field of [`Keys::window`] holding the watermark of one window of the board:
    /// `expired_through` for the widest (a board with one window), `expired_through:12h`
    /// for a narrower one (`window` as in [`Keys::instance_in`]).
    pub fn floor_field(window: Option<&str>) -> String {
        match window {
            Some(window) => format!("expired_through:{window}"),
            None => "expired_through".to_string(),
        }
    }

    /// The settings a board was created with (Hash: setting -> value), checked at start.
    pub fn settings(&self, board: &str) -> String {
        format!("{}:board:{}:settings", self.prefix, board)
    }

    /// The board-level records of `board` (scope registry, watermark, settings, period
    /// registry), with their kinds: the keys of a board that are not under an instance's
    /// hash tag.
    pub fn records(&self, board: &str) -> [(String, KeyKind); 4] {
        [
            (self.window(board), KeyKind::Window),
            (self.settings(board), KeyKind::Settings),
            (self.periods(board), KeyKind::Periods),
            (self.scopes(board), KeyKind::Scopes),
        ]
    }

    /// `SCAN MATCH` patterns that cover every instance key of `board` and nothing of
    /// another board: the unscoped instance (`rb:{tips}:*`, the hash tag closed) and the
    /// scoped ones (`rb:{tips:*`; board names never contain `:`, so no other board's key
    /// starts that way), then the same for the change feeds ([`Keys::changes`]:
    /// `rb:changes:{tips}`, `rb:changes:{tips}:*`, `rb:changes:{tips:*`). Glob
    /// metacharacters of the prefix and the name are escaped. A key matched must still be
    /// read back with [`Keys::board_key`].
    pub fn board_patterns(&self, board: &str) -> [String; 5] {
        let (prefix, board) = (glob_escape(&self.prefix), glob_escape(board));
        [
            format!("{prefix}:{{{board}}}:*"),
            format!("{prefix}:{{{board}:*"),
            format!("{prefix}:changes:{{{board}}}"),
            format!("{prefix}:changes:{{{board}}}:*"),
            format!("{prefix}:changes:{{{board}:*"),
        ]
    }

    /// Reads `key` back as a key of exactly `board` (not of a board whose name merely
    /// starts the same way), or `None`: an instance key with a suffix of this schema, or
    /// one of the board-level records.
    pub fn board_key(&self, board: &str, key: &str) -> Option<BoardKey> {
        if let Some((_, kind)) = self.records(board).into_iter().find(|(k, _)| k == key) {
            return Some(BoardKey::Record(kind));
        }
        if let Some(found) = self.changes_key(board, key) {
            return Some(found);
        }
        let rest = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_prefix(board)?;
        let (scope, suffix) = if let Some(suffix) = rest.strip_prefix("}:") {
            (None, suffix)
        } else {
            // A scope value may hold `}` and `:`, but no suffix holds `}`: the instance's
            // base ends at the last `}`.
            let rest = rest.strip_prefix(':')?;
            let end = rest.rfind('}')?;
            let suffix = rest[end + 1..].strip_prefix(':')?;
            (Some(&rest[..end]), suffix)
        };
        if scope == Some("") || suffix.contains('}') {
            return None;
        }
        // A window's keys: `w:<width>:` before the kind.
        let suffix = match suffix.strip_prefix("w:") {
            Some(rest) => {
                let (window, kind) = rest.split_once(':')?;
                super::board::parse_duration_ms(window)?;
                kind
            }
            None => suffix,
        };
        Some(BoardKey::Instance {
            scope: scope.map(str::to_string),
            kind: KeyKind::of_suffix(suffix)?,
        })
    }

    /// Reads `key` back as a change feed of exactly `board` ([`Keys::changes`]), or `None`.
    fn changes_key(&self, board: &str, key: &str) -> Option<BoardKey> {
        let rest = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":changes:{")?
            .strip_prefix(board)?;
        let (scope, after) = if let Some(after) = rest.strip_prefix('}') {
            (None, after)
        } else {
            // A scope value may hold `}` and `:`, but a window never does: the tag ends at
            // the last `}`.
            let rest = rest.strip_prefix(':')?;
            let end = rest.rfind('}')?;
            (Some(&rest[..end]), &rest[end + 1..])
        };
        let window_ok = match after {
            "" => true,
            _ => after
                .strip_prefix(':')
                .is_some_and(|w| super::board::parse_duration_ms(w).is_some()),
        };
        if scope == Some("") || !window_ok {
            return None;
        }
        Some(BoardKey::Instance {
            scope: scope.map(str::to_string),
            kind: KeyKind::Changes,
        })
    }

    /// The lease of the scheduled job `job` (`roll`, `resummarize`): String
    /// `<token>@<tick>` while a replica runs a tick of it, with a time to live. Tagged by
    /// the job, in a slot of its own like the board-level records, shared only with
    /// [`Keys::lease_tick`].
    pub fn lease(&self, job: &str) -> String {
        format!("{}:job:{{{}}}:lease", self.prefix, job)
    }

    /// The latest tick (epoch ms) a replica started `job` for (String, with a time to
    /// live): a replica whose cron fires later for the same tick leaves it alone.
    pub fn lease_tick(&self, job: &str) -> String {
        format!("{}:job:{{{}}}:tick", self.prefix, job)
    }

    /// A short-lived key written only so that a `WAIT` after it has something to wait
    /// for; `tag` picks its slot on a cluster.
    pub fn sync(&self, tag: Option<&str>) -> String {
        match tag {
            Some(tag) => format!("{}:sync:{{{}}}", self.prefix, tag),
            None => format!("{}:sync", self.prefix),
        }
    }
}

/// `text` with the glob metacharacters of Redis's `MATCH` (`*`, `?`, `[`, `]`, `\`)
/// escaped, so that it matches only itself.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One key of a board, as read back by [`Keys::board_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoardKey {
    /// A board-level record ([`Keys::records`]).
    Record(KeyKind),
    /// A key of one instance.
    Instance {
        /// The instance's scope value; `None` for the unscoped instance.
        scope: Option<String>,
        /// What the key holds.
        kind: KeyKind,
    },
}

/// What a key of the schema holds, named as in [`InstanceKeys`] and [`Keys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyKind {
    /// [`InstanceKeys::result`].
    Result,
    /// [`InstanceKeys::members`].
    Members,
    /// [`InstanceKeys::ranked`].
    Ranked,
    /// [`InstanceKeys::slices`].
    Slices,
    /// [`InstanceKeys::meta`].
    Meta,
    /// [`InstanceKeys::seen`] (the layout before digests).
    Seen,
    /// [`InstanceKeys::seen_table`].
    SeenTable,
    /// [`InstanceKeys::seen_log`].
    SeenLog,
    /// [`InstanceKeys::refs`].
    Refs,
    /// [`InstanceKeys::totals`].
    Totals,
    /// [`InstanceKeys::dense`].
    Dense,
    /// [`InstanceKeys::slice`].
    Slice,
    /// [`InstanceKeys::scratch`], and the trash keys a swap renames live values to.
    Scratch,
    /// [`Keys::scopes`].
    Scopes,
    /// [`Keys::window`].
    Window,
    /// [`Keys::periods`].
    Periods,
    /// [`Keys::settings`].
    Settings,
    /// [`Keys::changes`]: an instance's change feed (any window).
    Changes,
}

impl KeyKind {
    /// A short name for reports (`slice`, `seen:ids`, `tmp`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Result => "result",
            KeyKind::Members => "members",
            KeyKind::Ranked => "ranked",
            KeyKind::Slices => "slices",
            KeyKind::Meta => "meta",
            KeyKind::Seen => "seen",
            KeyKind::SeenTable => "seen:ids",
            KeyKind::SeenLog => "seen:<n>",
            KeyKind::Refs => "refs",
            KeyKind::Totals => "totals",
            KeyKind::Dense => "dense",
            KeyKind::Slice => "slice:<n>",
            KeyKind::Scratch => "tmp",
            KeyKind::Scopes => "scopes",
            KeyKind::Window => "window",
            KeyKind::Periods => "periods",
            KeyKind::Settings => "settings",
            KeyKind::Changes => "changes",
        }
    }

    /// The kind of an instance key from what follows its base (`result`, `slice:7`, ...).
    fn of_suffix(suffix: &str) -> Option<KeyKind> {
        let number = |n: &str| n.parse::<i64>().is_ok();
        Some(match suffix {
            "result" => KeyKind::Result,
            "members" => KeyKind::Members,
            "ranked" => KeyKind::Ranked,
            "slices" => KeyKind::Slices,
            "meta" => KeyKind::Meta,
            "seen" => KeyKind::Seen,
            "seen:ids" => KeyKind::SeenTable,
            "refs" => KeyKind::Refs,
            "totals" => KeyKind::Totals,
            "dense" => KeyKind::Dense,
            _ => match suffix.split_once(':')? {
                ("slice", n) if number(n) => KeyKind::Slice,
                ("seen", n) if number(n) => KeyKind::SeenLog,
                ("tmp", rest) if rest.contains(':') => KeyKind::Scratch,
                _ => return None,
            },
        })
    }
}

/// The keys of one board instance, all under one hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceKeys {
    base: String,
    changes: String,
}

impl InstanceKeys {
    fn key(&self, suffix: &str) -> String {
        format!("{}:{}", self.base, suffix)
    }

    /// ZSet: ZSet member (tie-break prefix + member) -> exact total.
    pub fn result(&self) -> String {
        self.key("result")
    }

    /// Hash: member -> its current ZSet member string.
    pub fn members(&self) -> String {
        self.key("members")
    }

    /// Hash: member -> the ZSet member string as in the last resummarized result.
    pub fn ranked(&self) -> String {
        self.key("ranked")
    }

    /// ZSet: registry of the slice numbers that exist.
    pub fn slices(&self) -> String {
        self.key("slices")
    }

    /// Hash: `expired_through`, `layout`, `last_roll`, `gen`.
    pub fn meta(&self) -> String {
        self.key("meta")
    }

    /// ZSet: raw idempotency key -> epoch ms from which it may be forgotten. The layout
    /// before digests: still read while it exists, drained by the roll, never written.
    pub fn seen(&self) -> String {
        self.key("seen")
    }

    /// Hash: the digests of the idempotency keys remembered by the instance, each with its
    /// slice, as a linear hash table (layout in `digest.lua`).
    pub fn seen_table(&self) -> String {
        self.key("seen:ids")
    }

    /// List: the forget log of slice `n`, one 4-byte entry per digest the slice added to
    /// [`InstanceKeys::seen_table`] (the digest's bucket hash), drained by the roll when the
    /// slice's ids may be forgotten.
    pub fn seen_log(&self, n: i64) -> String {
        format!("{}:seen:{}", self.base, n)
    }

    /// Hash: member -> number of live slices holding it (`allow_negative` boards).
    pub fn refs(&self) -> String {
        self.key("refs")
    }

    /// Hash: member -> exact live total (resummarize boards, for the overflow check).
    pub fn totals(&self) -> String {
        self.key("totals")
    }

    /// ZSet of the distinct totals above 0 that ranked members hold, each scored by itself
    /// (member: the total in decimal), on `dense_rank` boards only: a member's dense rank
    /// is 1 + the number of its entries above the member's total.
    pub fn dense(&self) -> String {
        self.key("dense")
    }

    /// Stream: the change feed of the instance's top N (boards with `changes_top`),
    /// `<prefix>:changes:{<board>}` or `<prefix>:changes:{<board>:<scope>}`: under the
    /// instance's hash tag, so in its slot, but outside its base, where a reader of the
    /// feed finds it by the board's name alone.
    pub fn changes(&self) -> String {
        self.changes.clone()
    }

    /// The keys of the same instance in the narrower window `window` of its board, from
    /// the keys of its widest window (as [`Keys::instance_in`] makes them).
    pub fn in_window(&self, window: &str) -> InstanceKeys {
        InstanceKeys {
            base: format!("{}:w:{window}", self.base),
            changes: format!("{}:{window}", self.changes),
        }
    }

    /// The fixed KEYS of `fold.lua`, in its order (the batch's slice keys and then their
    /// forget logs follow them).
    pub fn apply_keys(&self) -> Vec<String> {
        vec![
            self.meta(),
            self.result(),
            self.members(),
            self.slices(),
            self.seen(),
            self.refs(),
            self.totals(),
            self.seen_table(),
        ]
    }

    /// Hash: member -> integer amount in slice `n` (process bucket).
    pub fn slice(&self, n: i64) -> String {
        format!("{}:slice:{}", self.base, n)
    }

    /// Scratch key of one resummarize or rebuild run, renamed over `result` at the end.
    pub fn scratch(&self, token: &str, what: &str) -> String {
        format!("{}:tmp:{}:{}", self.base, token, what)
    }
}

/// A token no other, in this process or another, is taken for: a v7 UUID (time, counter
/// and random bits) as 32 hex digits, so it holds no `:`. It names scratch keys and
/// chains of calls.
pub fn unique_token() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unscoped_keys_are_pinned() {
        let k = Keys::new("rb").instance("rooms_7d", None);
        assert_eq!(k.result(), "rb:{rooms_7d}:result");
        assert_eq!(k.members(), "rb:{rooms_7d}:members");
        assert_eq!(k.ranked(), "rb:{rooms_7d}:ranked");
        assert_eq!(k.slices(), "rb:{rooms_7d}:slices");
        assert_eq!(k.meta(), "rb:{rooms_7d}:meta");
        assert_eq!(k.seen(), "rb:{rooms_7d}:seen");
        assert_eq!(k.refs(), "rb:{rooms_7d}:refs");
        assert_eq!(k.totals(), "rb:{rooms_7d}:totals");
        assert_eq!(k.slice(490_000), "rb:{rooms_7d}:slice:490000");
        assert_eq!(k.seen_table(), "rb:{rooms_7d}:seen:ids");
        assert_eq!(k.seen_log(490_000), "rb:{rooms_7d}:seen:490000");
        assert_eq!(k.scratch("ab12", "result"), "rb:{rooms_7d}:tmp:ab12:result");
        assert_eq!(
            k.apply_keys(),
            [
                k.meta(),
                k.result(),
                k.members(),
                k.slices(),
                k.seen(),
                k.refs(),
                k.totals(),
                k.seen_table()
            ]
        );
    }

    #[test]
    fn lease_keys_are_pinned_and_never_a_boards() {
        let keys = Keys::new("rb");
        assert_eq!(keys.lease("roll"), "rb:job:{roll}:lease");
        assert_eq!(keys.lease_tick("roll"), "rb:job:{roll}:tick");
        // Neither is an instance key nor a board-level record of a board named `job` or
        // `roll`, so `drop-board` never touches them.
        for board in ["job", "roll"] {
            for key in [keys.lease("roll"), keys.lease_tick("roll")] {
                assert_eq!(keys.board_key(board, &key), None, "{board} {key}");
            }
        }
    }

    #[test]
    fn scoped_keys_are_pinned() {
        let keys = Keys::new("lb");
        let k = keys.instance("fans_7d", Some("room42"));
        assert_eq!(k.result(), "lb:{fans_7d:room42}:result");
        assert_eq!(k.slice(7), "lb:{fans_7d:room42}:slice:7");
        assert_eq!(keys.scopes("fans_7d"), "lb:board:fans_7d:scopes");
        assert_eq!(keys.settings("fans_7d"), "lb:board:fans_7d:settings");
        assert_eq!(keys.window("fans_7d"), "lb:board:fans_7d:window");
        assert_eq!(keys.periods("fans_7d"), "lb:board:fans_7d:periods");
    }

    #[test]
    fn period_instances_are_pinned_and_read_back() {
        use crate::domain::board::period_instance;
        let keys = Keys::new("rb");
        let month = keys.instance("tips_month", Some(&period_instance(None, "2026-11")));
        assert_eq!(month.result(), "rb:{tips_month:@2026-11}:result");
        let fans = keys.instance(
            "fans_week",
            Some(&period_instance(Some("room42"), "2026-W48")),
        );
        assert_eq!(fans.meta(), "rb:{fans_week:room42@2026-W48}:meta");
        assert_eq!(
            keys.board_key("tips_month", &month.slice(7)),
            Some(BoardKey::Instance {
                scope: Some("@2026-11".into()),
                kind: KeyKind::Slice
            })
        );
        assert_eq!(
            keys.board_key("tips_month", "rb:board:tips_month:periods"),
            Some(BoardKey::Record(KeyKind::Periods))
        );
    }

    #[test]
    fn distinct_scopes_never_share_a_key() {
        let keys = Keys::new("rb");
        let a = keys.instance("f", Some("a"));
        let b = keys.instance("f", Some("a}:slice:5"));
        assert_ne!(a.slice(5), b.result());
        assert_ne!(a.result(), keys.instance("f", None).result());
    }

    #[test]
    fn board_keys_read_back_only_for_their_own_board() {
        let keys = Keys::new("rb");
        let scoped = |scope: &str| Some(scope.to_string());
        let instance = |scope: Option<String>, kind| Some(BoardKey::Instance { scope, kind });
        let tips = keys.instance("tips", None);
        assert_eq!(
            keys.board_key("tips", &tips.result()),
            instance(None, KeyKind::Result)
        );
        assert_eq!(
            keys.board_key("tips", &tips.slice(-3)),
            instance(None, KeyKind::Slice)
        );
        assert_eq!(
            keys.board_key("tips", &tips.scratch("ab12", "result")),
            instance(None, KeyKind::Scratch)
        );
        assert_eq!(
            keys.board_key("tips", &tips.changes()),
            instance(None, KeyKind::Changes)
        );
        for scope in ["a", "a:b", "x*", "{c}", "d}e", "}:slice:5", "tips_v2}:meta"] {
            let k = keys.instance("tips", Some(scope));
            for (key, kind) in [
                (k.meta(), KeyKind::Meta),
                (k.seen_table(), KeyKind::SeenTable),
                (k.seen_log(7), KeyKind::SeenLog),
                (k.slice(7), KeyKind::Slice),
                (k.changes(), KeyKind::Changes),
                (
                    format!("{}:old", k.scratch("f0", "ranked")),
                    KeyKind::Scratch,
                ),
            ] {
                assert_eq!(keys.board_key("tips", &key), instance(scoped(scope), kind));
                assert_eq!(keys.board_key("tip", &key), None, "{key}");
                assert_eq!(keys.board_key("tips_v2", &key), None, "{key}");
            }
        }
        for other in ["tips_v2", "tips_24h", "tipsy"] {
            for key in [
                keys.instance(other, None).result(),
                keys.instance(other, Some("tips")).meta(),
                keys.instance(other, None).changes(),
                keys.instance(other, Some("tips")).changes(),
                keys.scopes(other),
            ] {
                assert_eq!(keys.board_key("tips", &key), None, "{key}");
            }
        }
        assert_eq!(
            keys.board_key("tips", "rb:board:tips:scopes"),
            Some(BoardKey::Record(KeyKind::Scopes))
        );
        for foreign in [
            "rb:{tips}:unknown",
            "rb:{tips}:slice:x",
            "rb:{tips:}:meta",
            "rb:{tips:a}meta",
            "rb:{tips}",
            "lb:{tips}:meta",
            "rb:board:tips:other",
            "rb:changes:{tips}x",
            "rb:changes:{tips:}",
            "rb:changes:{tips}:meta",
            "rb:changes:tips",
        ] {
            assert_eq!(keys.board_key("tips", foreign), None, "{foreign}");
        }
    }

    #[test]
    fn keys_of_a_narrower_window_are_pinned_and_read_back_only_for_their_own_board() {
        let keys = Keys::new("rb");
        let wide = keys.instance("tips", None);
        let day = keys.instance_in("tips", None, Some("24h"));
        assert_eq!(day, wide.in_window("24h"));
        assert_eq!(day.result(), "rb:{tips}:w:24h:result");
        assert_eq!(day.slice(7), "rb:{tips}:w:24h:slice:7");
        assert_eq!(day.meta(), "rb:{tips}:w:24h:meta");
        assert_eq!(day.changes(), "rb:changes:{tips}:24h");
        assert_eq!(
            keys.instance_in("fans", Some("a:b"), Some("7d")).dense(),
            "rb:{fans:a:b}:w:7d:dense"
        );
        for scope in [None, Some("a"), Some("a:b"), Some("d}e"), Some("x}:w:2h")] {
            let k = keys.instance_in("tips", scope, Some("2h"));
            let instance = |kind| {
                Some(BoardKey::Instance {
                    scope: scope.map(str::to_string),
                    kind,
                })
            };
            for (key, kind) in [
                (k.meta(), KeyKind::Meta),
                (k.result(), KeyKind::Result),
                (k.members(), KeyKind::Members),
                (k.slices(), KeyKind::Slices),
                (k.refs(), KeyKind::Refs),
                (k.totals(), KeyKind::Totals),
                (k.dense(), KeyKind::Dense),
                (k.ranked(), KeyKind::Ranked),
                (k.slice(-3), KeyKind::Slice),
                (k.changes(), KeyKind::Changes),
                (k.scratch("f0", "result"), KeyKind::Scratch),
                (
                    format!("{}:old", k.scratch("f0", "ranked")),
                    KeyKind::Scratch,
                ),
            ] {
                assert_eq!(keys.board_key("tips", &key), instance(kind), "{key}");
                for other in ["tip", "tips_v2", "w"] {
                    assert_eq!(keys.board_key(other, &key), None, "{other} {key}");
                }
            }
        }
        // A lookalike's narrower window is never a key of `tips`.
        for key in [
            keys.instance_in("tips_v2", None, Some("2h")).result(),
            keys.instance_in("tips_24h", Some("tips"), Some("2h"))
                .meta(),
            keys.instance_in("tipsy", None, Some("2h")).changes(),
        ] {
            assert_eq!(keys.board_key("tips", &key), None, "{key}");
        }
        for foreign in [
            "rb:{tips}:w:2h",
            "rb:{tips}:w:2h:",
            "rb:{tips}:w::result",
            "rb:{tips}:w:xx:result",
            "rb:{tips}:w:2h:unknown",
            "rb:{tips}:w:2h:slice:x",
            "rb:{tips:}:w:2h:meta",
            "rb:{tips}w:2h:meta",
        ] {
            assert_eq!(keys.board_key("tips", foreign), None, "{foreign}");
        }
        // The narrower windows' watermarks are fields of the board's one `window` record.
        assert_eq!(Keys::floor_field(None), "expired_through");
        assert_eq!(Keys::floor_field(Some("24h")), "expired_through:24h");
        assert_eq!(
            keys.board_key("tips", &keys.window("tips")),
            Some(BoardKey::Record(KeyKind::Window))
        );
    }

    #[test]
    fn board_patterns_close_the_hash_tag_and_escape_globs() {
        assert_eq!(
            Keys::new("rb").board_patterns("tips"),
            [
                "rb:{tips}:*",
                "rb:{tips:*",
                "rb:changes:{tips}",
                "rb:changes:{tips}:*",
                "rb:changes:{tips:*"
            ]
        );
        assert_eq!(
            Keys::new("a*[b]?\\").board_patterns("t")[..2],
            ["a\\*\\[b\\]\\?\\\\:{t}:*", "a\\*\\[b\\]\\?\\\\:{t:*"]
        );
    }

    #[test]
    fn change_feeds_are_pinned_and_read_back_only_for_their_own_board() {
        let keys = Keys::new("rb");
        assert_eq!(keys.changes("rooms", None, None), "rb:changes:{rooms}");
        assert_eq!(
            keys.changes("rooms", None, Some("24h")),
            "rb:changes:{rooms}:24h"
        );
        assert_eq!(
            keys.changes("fans", Some("room42"), None),
            "rb:changes:{fans:room42}"
        );
        assert_eq!(
            keys.changes("fans", Some("room42"), Some("7d")),
            "rb:changes:{fans:room42}:7d"
        );
        let instance = |scope: Option<&str>| {
            Some(BoardKey::Instance {
                scope: scope.map(str::to_string),
                kind: KeyKind::Changes,
            })
        };
        for scope in [None, Some("a"), Some("a:b"), Some("d}e"), Some("}:24h")] {
            for window in [None, Some("24h")] {
                let key = keys.changes("tips", scope, window);
                assert_eq!(keys.board_key("tips", &key), instance(scope), "{key}");
                for other in ["tip", "tips_v2", "changes"] {
                    assert_eq!(keys.board_key(other, &key), None, "{other} {key}");
                }
            }
        }
        for key in [
            keys.changes("tips_v2", None, None),
            keys.changes("tipsy", Some("x"), None),
            keys.changes("tips_v2", None, Some("1h")),
        ] {
            assert_eq!(keys.board_key("tips", &key), None, "{key}");
        }
        for foreign in [
            "rb:changes:{tips}:",
            "rb:changes:{tips}x",
            "rb:changes:{tips}:a:b",
            "rb:changes:{tips:}",
            "rb:changes:tips",
        ] {
            assert_eq!(keys.board_key("tips", foreign), None, "{foreign}");
        }
    }
}
