//! The registry of a scoped board's scopes: a ZSet of scope values scored by the newest
//! slice each was applied to. An apply registers its scope first; a roll visits every
//! registered scope and unregisters one whose instance emptied.

use fred::prelude::*;

use super::{Store, StoreError};
use crate::domain::board::Board;

impl Store {
    /// Every registered scope of a scoped board.
    pub async fn scopes(&self, board: &Board) -> Result<Vec<String>, StoreError> {
        let key = self.keys.scopes(&board.name);
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self.scan("ZSCAN", &key, &cursor, 1000).await?;
            out.extend(page.into_iter().map(|(scope, _)| scope));
            if next == "0" {
                break;
            }
            cursor = next;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Removes a scope from the registry if its newest slice is at or below `watermark`
    /// (race-free: an apply registers its slice first, with a higher score).
    pub async fn unregister_scope(
        &self,
        board: &Board,
        scope: &str,
        watermark: i64,
    ) -> Result<bool, StoreError> {
        let key = self.keys.scopes(&board.name);
        let removed: i64 = self
            .client()
            .eval(
                "local s = redis.call('ZSCORE', KEYS[1], ARGV[1]) \
                 if s and tonumber(s) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end \
                 return 0",
                vec![key],
                vec![Value::from(scope), Value::from(watermark)],
            )
            .await?;
        Ok(removed == 1)
    }
}
