//! The change feed as a reader sees it (docs/design.md, *The change feed*): its entries read
//! back, the entries one change of the top must write, their replay over a top, and the
//! generated tips a feed is tested with.

use std::collections::HashMap;

use fred::prelude::*;
use rollboard::domain::board::Board;
use rollboard::store::{ApplyEvent, Store};

use crate::support::boards::ev;

/// A generated tip: its member's number, its amount and how many slices before now it is.
pub type Tip = (usize, i64, i64);

/// The events of `tips` to `board` at `now`, their ids `e<n>` counted on from
/// `next_id`: tip `(m, amount, back)` is `amount` for member `m<m>`, `back` slices before
/// `now`; an amount the board cannot take (0 or below, without refunds) is `1 - amount`.
pub fn tip_events(board: &Board, tips: &[Tip], next_id: &mut usize, now: i64) -> Vec<ApplyEvent> {
    let mut events = Vec::new();
    for &(m, amount, back) in tips {
        *next_id += 1;
        let amount = if board.allow_negative || amount > 0 {
            amount
        } else {
            1 - amount
        };
        let (id, member) = (format!("e{next_id}"), format!("m{m}"));
        events.push(ev(&id, now - back * board.slice_ms, &member, amount));
    }
    events
}

/// One entry of a change stream, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `entered`, `left` or `passed`.
    pub kind: String,
    /// The member that moved.
    pub member: String,
    /// Its new rank (`left`: its last).
    pub rank: usize,
    /// Its total (`left`: its last).
    pub total: i64,
    /// `passed` only: the member it passed.
    pub passed: Option<String>,
    /// `tip` or `roll`.
    pub cause: String,
}

/// The entries of stream `key` after entry `after` (`None`: all), and the last entry's ID
/// (`after` when there are none).
pub async fn changes_after(
    store: &Store,
    key: &str,
    after: Option<&str>,
) -> (Vec<Change>, Option<String>) {
    let start = after.map_or("-".to_string(), |id| format!("({id}"));
    let entries: Vec<(String, HashMap<String, String>)> = store
        .client()
        .xrange(key, start, "+", None)
        .await
        .expect("xrange");
    let last = entries
        .last()
        .map(|(id, _)| id.clone())
        .or(after.map(str::to_string));
    let changes = entries
        .into_iter()
        .map(|(id, f)| {
            assert!(f["ts"].parse::<i64>().is_ok(), "{id}: {f:?}");
            Change {
                kind: f["kind"].clone(),
                member: f["member"].clone(),
                rank: f["rank"].parse().expect("rank"),
                total: f["total"].parse().expect("total"),
                passed: f.get("passed").cloned(),
                cause: f["cause"].clone(),
            }
        })
        .collect();
    (changes, last)
}

/// The entries one script call must write when its top goes from `before` to `after`
/// (member, total; best first), for `cause`: every `left` first, then `entered` and
/// `passed` in the order of the new ranks, one `passed` per member passed, in their old order.
pub fn expected_changes(
    before: &[(String, i64)],
    after: &[(String, i64)],
    cause: &str,
) -> Vec<Change> {
    let was: HashMap<&str, usize> = before
        .iter()
        .enumerate()
        .map(|(i, (m, _))| (m.as_str(), i + 1))
        .collect();
    let is: HashMap<&str, usize> = after
        .iter()
        .enumerate()
        .map(|(i, (m, _))| (m.as_str(), i + 1))
        .collect();
    let change = |kind: &str, member: &str, rank: usize, total: i64, passed: Option<&str>| Change {
        kind: kind.into(),
        member: member.into(),
        rank,
        total,
        passed: passed.map(str::to_string),
        cause: cause.into(),
    };
    if before
        .iter()
        .map(|(m, _)| m)
        .eq(after.iter().map(|(m, _)| m))
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, (m, total)) in before.iter().enumerate() {
        if !is.contains_key(m.as_str()) {
            out.push(change("left", m, i + 1, *total, None));
        }
    }
    for (i, (m, total)) in after.iter().enumerate() {
        match was.get(m.as_str()) {
            None => out.push(change("entered", m, i + 1, *total, None)),
            Some(&old) => {
                for (x, _) in &before[..old - 1] {
                    if is.get(x.as_str()).is_some_and(|&r| r > i + 1) {
                        out.push(change("passed", m, i + 1, *total, Some(x)));
                    }
                }
            }
        }
    }
    out
}

/// Replays `changes` over `top` as a reader of the feed does, refusing an entry that does
/// not fit the top it finds: `left` of a member not in it, `entered` of one already in it
/// or beyond `n`, `passed` of or by a member not in it.
pub fn replay(top: &mut Vec<String>, changes: &[Change], n: usize) {
    for c in changes {
        let at = top.iter().position(|m| *m == c.member);
        match c.kind.as_str() {
            "left" => {
                top.remove(at.unwrap_or_else(|| panic!("{c:?} left a top without it: {top:?}")));
            }
            "entered" => {
                assert!(
                    at.is_none() && c.rank >= 1 && c.rank <= n,
                    "{c:?} over {top:?}"
                );
                top.insert((c.rank - 1).min(top.len()), c.member.clone());
            }
            "passed" => {
                let passed = c.passed.as_deref().expect("passed names a member");
                assert!(top.iter().any(|m| m == passed), "{c:?} over {top:?}");
                top.remove(at.unwrap_or_else(|| panic!("{c:?} moved a member not in {top:?}")));
                top.insert((c.rank - 1).min(top.len()), c.member.clone());
            }
            other => panic!("unknown kind {other}"),
        }
        assert!(top.len() <= n, "{top:?} holds more than {n}");
    }
}
