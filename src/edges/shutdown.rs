//! Signal handling: the first SIGTERM or SIGINT cancels the token (graceful drain); a
//! second one ends the process at once.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Exit status after a forced stop (128 + SIGINT).
pub const EXIT_FORCED: i32 = 130;

/// Waits for signals and drives `cancel`; spawn it once at start-up.
pub async fn watch(cancel: CancellationToken) {
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            error!(error = %e, "cannot install signal handlers");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!(signal = "SIGTERM", "shutting down: finishing the batch and chunk in flight"),
        _ = int.recv() => info!(signal = "SIGINT", "shutting down: finishing the batch and chunk in flight"),
    }
    cancel.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    warn!("second signal: stopping now");
    std::process::exit(EXIT_FORCED);
}
