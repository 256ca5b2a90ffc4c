//! Reading the change feeds of boards with `changes_top` (one Stream per board instance,
//! [`crate::domain::keys::Keys::changes`]; the entry format is in docs/api.md, "The
//! change feed"): where a feed stands, its entries after an ID, and a blocking wait for
//! new ones on a connection of its own. The scripts that change a ranking write the
//! entries; nothing here writes.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use fred::prelude::*;
use fred::types::ClusterHash;
use fred::types::CustomCommand;

use super::{Store, StoreError};

/// A stream entry ID, `<ms>-<seq>`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FeedId {
    /// The milliseconds part.
    pub ms: u64,
    /// The sequence part.
    pub seq: u64,
}

impl FromStr for FeedId {
    type Err = ();

    /// `<ms>-<seq>` (both decimal), or `<ms>` meaning `<ms>-0`.
    fn from_str(text: &str) -> Result<FeedId, ()> {
        let (ms, seq) = text.split_once('-').unwrap_or((text, "0"));
        let digits =
            |t: &str| !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return Err(());
        }
        Ok(FeedId {
            ms: ms.parse().map_err(|_| ())?,
            seq: seq.parse().map_err(|_| ())?,
        })
    }
}

impl fmt::Display for FeedId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// One entry of a change feed, its fields as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedEntry {
    /// The entry's ID.
    pub id: FeedId,
    /// Its fields, in order.
    pub fields: Vec<(String, String)>,
}

impl FeedEntry {
    /// The value of `field`, if the entry has it.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(name, _)| name == field)
            .map(|(_, value)| value.as_str())
    }
}

/// Where a feed stands (`XINFO STREAM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeedState {
    /// The ID of the newest entry ever added (`0-0` for a feed never written).
    pub last: FeedId,
    /// The ID of the oldest entry kept, if any.
    pub first: Option<FeedId>,
    /// Whether entries were ever removed (trimmed or deleted): more added than kept.
    pub trimmed: bool,
    /// The newest ID deleted by `XDEL` (`0-0`: none).
    pub max_deleted: FeedId,
}

impl FeedState {
    /// Whether entries after `after` may have been removed before a reader saw them: the
    /// feed lost entries and `after` is older than the oldest kept (or than the newest
    /// deleted).
    pub fn lost_after(&self, after: FeedId) -> bool {
        if after < self.max_deleted {
            return true;
        }
        self.trimmed && self.first.is_none_or(|first| after < first) && after < self.last
    }
}

/// Entries one `XRANGE` or `XREAD` call returns at most.
pub const FEED_PAGE: u64 = 500;

/// How long past its block timeout a feed read waits for its reply before it counts as
/// lost.
const READ_REPLY_GRACE: Duration = Duration::from_secs(5);

impl Store {
    /// Where the feed `key` stands; a feed never written stands at `0-0`.
    pub async fn feed_state(&self, key: &str) -> Result<FeedState, StoreError> {
        let command = CustomCommand::new_static("XINFO", ClusterHash::FirstKey, false);
        let reply: Result<Value, _> = self
            .reader()
            .custom(command, vec!["STREAM".to_string(), key.to_string()])
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) if e.details().contains("no such key") => return Ok(FeedState::default()),
            Err(e) => return Err(e.into()),
        };
        let mut state = FeedState::default();
        let (mut added, mut length) = (0i64, 0i64);
        let pairs = match reply {
            Value::Map(map) => map
                .inner()
                .into_iter()
                .map(|(k, v)| (k.into_string().unwrap_or_default(), v))
                .collect::<Vec<_>>(),
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| match pair {
                    [k, v] => Some((k.as_string().unwrap_or_default(), v.clone())),
                    _ => None,
                })
                .collect(),
            _ => return Err(super::reply_err("xinfo stream: not a map")),
        };
        let id = |v: &Value| v.as_string().and_then(|s| s.parse::<FeedId>().ok());
        for (name, value) in pairs {
            match name.as_str() {
                "last-generated-id" => state.last = id(&value).unwrap_or_default(),
                "max-deleted-entry-id" => state.max_deleted = id(&value).unwrap_or_default(),
                "entries-added" => added = value.as_i64().unwrap_or(0),
                "length" => length = value.as_i64().unwrap_or(0),
                "first-entry" => {
                    state.first = match value {
                        Value::Array(entry) => entry.first().and_then(id),
                        _ => None,
                    }
                }
                _ => {}
            }
        }
        state.trimmed = added > length;
        Ok(state)
    }

    /// Up to [`FEED_PAGE`] entries of the feed `key` after `after`, oldest first.
    pub async fn feed_after(&self, key: &str, after: FeedId) -> Result<Vec<FeedEntry>, StoreError> {
        let reply: Value = self
            .reader()
            .xrange(key, format!("({after}"), "+", Some(FEED_PAGE))
            .await?;
        Ok(entries(reply))
    }
}

/// Waits up to `block` for entries of the feed `key` after `after` on `reader` (a
/// connection of its own: the wait holds it) and returns up to [`FEED_PAGE`] of them,
/// none when the wait ended empty.
pub async fn wait_feed(
    reader: &Client,
    key: &str,
    after: FeedId,
    block: Duration,
) -> Result<Vec<FeedEntry>, StoreError> {
    let options = Options {
        timeout: Some(block + READ_REPLY_GRACE),
        ..Options::default()
    };
    let reply: Value = reader
        .with_options(&options)
        .xread(
            Some(FEED_PAGE),
            Some(block.as_millis() as u64),
            key,
            after.to_string(),
        )
        .await?;
    // `[[key, [entries]]]` (RESP2) or `{key: [entries]}` (RESP3); nil when the wait ended.
    let streams = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(map) => map.inner().into_values().collect(),
        _ => Vec::new(),
    };
    Ok(streams.into_iter().flat_map(entries).collect())
}

/// The entries of an `XRANGE` reply (or of one stream of an `XREAD` reply); entries whose
/// shape is not an entry's are left out.
fn entries(reply: Value) -> Vec<FeedEntry> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(parts) = item else {
                return None;
            };
            let mut parts = parts.into_iter();
            let id = parts.next()?.as_string()?.parse().ok()?;
            let fields = match parts.next()? {
                Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|pair| match pair {
                        [k, v] => Some((k.as_string()?, v.as_string()?)),
                        _ => None,
                    })
                    .collect(),
                Value::Map(map) => map
                    .inner()
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.into_string()?, v.as_string()?)))
                    .collect(),
                _ => return None,
            };
            Some(FeedEntry { id, fields })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_ids_parse_order_and_print_as_redis_does() {
        let id: FeedId = "1700000000000-3".parse().expect("id");
        assert_eq!(
            id,
            FeedId {
                ms: 1_700_000_000_000,
                seq: 3
            }
        );
        assert_eq!(id.to_string(), "1700000000000-3");
        assert_eq!("5".parse::<FeedId>(), Ok(FeedId { ms: 5, seq: 0 }));
        assert!("5-2".parse::<FeedId>().expect("id") < "5-10".parse().expect("id"));
        assert!("9-0".parse::<FeedId>().expect("id") < "10-0".parse().expect("id"));
        for bad in [
            "",
            "-",
            "a-1",
            "1-",
            "1-2-3",
            " 1-2",
            "99999999999999999999999-0",
            "+",
        ] {
            assert!(bad.parse::<FeedId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_feed_lost_entries_only_before_its_oldest_kept_once_trimmed() {
        let id = |ms| FeedId { ms, seq: 0 };
        let kept = FeedState {
            last: id(20),
            first: Some(id(10)),
            trimmed: false,
            max_deleted: FeedId::default(),
        };
        assert!(!kept.lost_after(id(1)), "never trimmed: nothing lost");
        let trimmed = FeedState {
            trimmed: true,
            ..kept
        };
        assert!(trimmed.lost_after(id(9)));
        assert!(!trimmed.lost_after(id(10)));
        assert!(!trimmed.lost_after(id(25)));
        let emptied = FeedState {
            first: None,
            ..trimmed
        };
        assert!(emptied.lost_after(id(19)));
        assert!(!emptied.lost_after(id(20)));
        let deleted = FeedState {
            max_deleted: id(15),
            ..kept
        };
        assert!(deleted.lost_after(id(12)));
        assert!(!deleted.lost_after(id(15)));
    }
}
