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
        let base = match scope {
            Some(scope) => format!("{}:{{{}:{}}}", self.prefix, board, scope),
            None => format!("{}:{{{}}}", self.prefix, board),
        };
        InstanceKeys { base }
    }

    /// Registry of the scope values of a scoped board (ZSet: scope -> newest slice seen).
    pub fn scopes(&self, board: &str) -> String {
        format!("{}:board:{}:scopes", self.prefix, board)
    }

    /// The board's own watermark (Hash: `expired_through`, `last_roll`), raised by every
    /// roll of the board before its instances. It holds for every instance, including
    /// those no roll visits any more (scopes that emptied and left the registry).
    pub fn window(&self, board: &str) -> String {
        format!("{}:board:{}:window", self.prefix, board)
    }

    /// The settings a board was created with (Hash: setting -> value), checked at start.
    pub fn settings(&self, board: &str) -> String {
        format!("{}:board:{}:settings", self.prefix, board)
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

/// The keys of one board instance, all under one hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceKeys {
    base: String,
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
    /// slice, as a linear hash table (layout in `apply.lua`).
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

    /// The fixed KEYS of `apply.lua`, in its order (the batch's slice keys and then their
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
    fn scoped_keys_are_pinned() {
        let keys = Keys::new("lb");
        let k = keys.instance("fans_7d", Some("room42"));
        assert_eq!(k.result(), "lb:{fans_7d:room42}:result");
        assert_eq!(k.slice(7), "lb:{fans_7d:room42}:slice:7");
        assert_eq!(keys.scopes("fans_7d"), "lb:board:fans_7d:scopes");
        assert_eq!(keys.settings("fans_7d"), "lb:board:fans_7d:settings");
        assert_eq!(keys.window("fans_7d"), "lb:board:fans_7d:window");
    }

    #[test]
    fn distinct_scopes_never_share_a_key() {
        let keys = Keys::new("rb");
        let a = keys.instance("f", Some("a"));
        let b = keys.instance("f", Some("a}:slice:5"));
        assert_ne!(a.slice(5), b.result());
        assert_ne!(a.result(), keys.instance("f", None).result());
    }
}
