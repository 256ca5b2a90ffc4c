//! The commands' Redis connection: one connection that never reconnects, refused (exit 64)
//! when the Redis user lacks a permission or a board's settings differ from its data.

use crate::config::Settings;
use crate::ingest::stream;
use crate::store::{Conflicts, Denied, Reconnect, Refused, Store, StoreError};

/// Connects, and refuses to go on when the Redis user lacks a permission or a board's
/// settings differ from those its data in Redis was built with.
pub(super) async fn connect(settings: &Settings) -> anyhow::Result<Store> {
    let store = connect_unchecked(settings).await?;
    check_settings(settings, &store).await?;
    Ok(store)
}

/// As [`connect`], without the board settings check (nothing is written).
pub(super) async fn connect_unchecked(settings: &Settings) -> anyhow::Result<Store> {
    let url = settings.redis.redacted_url();
    let store = match Store::connect_with(&settings.redis, 1, Reconnect::Never).await {
        Ok(store) => store,
        Err(e) => {
            // Wrong credentials or certificates are settings to fix (exit 64), not an outage.
            let refused = match &e {
                StoreError::Redis(e) => Refused::from_error(e),
                StoreError::Reply(_) => None,
            };
            let error = match refused {
                Some(refused) => anyhow::Error::new(refused),
                None => anyhow::Error::new(e),
            };
            return Err(error.context(format!("cannot connect to {url}")));
        }
    };
    match stream::check_permissions(&store, &settings.boards, &settings.ingest).await {
        Ok(denied) if denied.is_empty() => {}
        Ok(denied) => return Err(Denied(denied).into()),
        Err(e) => return Err(Denied::from_error(&e).map_or_else(|| e.into(), Into::into)),
    }
    Ok(store)
}

/// Refuses to go on when a board's pinned settings differ from its data in Redis (and
/// records them for a board seen for the first time).
pub(super) async fn check_settings(settings: &Settings, store: &Store) -> anyhow::Result<()> {
    let conflicts = store.check_settings(&settings.boards).await?;
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts).into());
    }
    Ok(())
}
