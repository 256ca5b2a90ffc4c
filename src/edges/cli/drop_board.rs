//! `rollboard drop-board`: every key of one board (all its instances and records) listed,
//! then deleted; nothing of another board.

use std::io::Write;

use super::connect::connect_unchecked;
use super::{Usage, EXIT_CONFIG};
use crate::config::Settings;

/// `drop-board`: lists the board's keys, then (unless `dry_run`) deletes them. A board still
/// in the configuration is refused (exit 64) without `force`: a daemon running with it
/// would write its keys again. The stored settings are not checked, so that a board whose
/// settings changed can be dropped to start afresh.
pub(super) async fn drop_board(
    settings: &Settings,
    name: &str,
    dry_run: bool,
    force: bool,
) -> anyhow::Result<u8> {
    if !crate::domain::board::is_board_name(name) {
        return Err(Usage(format!(
            "board name {name:?}: must match [a-z0-9_-]{{1,64}}"
        ))
        .into());
    }
    if settings.board(name).is_some() && !force {
        eprintln!(
            "error: board {name} is still in the configuration: remove it from [[boards]] and \
             restart the daemons first (they would write it again), or give --force"
        );
        return Ok(EXIT_CONFIG);
    }
    let store = connect_unchecked(settings).await?;
    let found = match store.board_keys(name).await {
        Ok(found) => found,
        Err(e) => return Err(crate::store::scan_denied(&e).map_or_else(|| e.into(), Into::into)),
    };
    let mut out = std::io::stdout().lock();
    for line in found.report(dry_run) {
        writeln!(out, "{line}")?;
    }
    if dry_run {
        writeln!(
            out,
            "board {name}: would delete {}; nothing was deleted",
            found.summary()
        )?;
        return Ok(0);
    }
    let deleted = store.drop_board_keys(&found).await?;
    writeln!(
        out,
        "board {name}: deleted {deleted} of {}",
        found.summary()
    )?;
    Ok(0)
}
