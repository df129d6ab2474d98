//! SIGTERM and SIGINT.
//!
//! The handlers are installed when [`Signals::install`] runs, before the listeners accept
//! anything, so a signal that arrives early is never the default (fatal) action.

use std::time::Duration;

/// How long, after the grace period, in-flight requests may still take before their
/// connections are closed. Requests are bounded by their deadline anyway (at most 30s, 5s in
/// the manifests' webhook configurations).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must be called inside the tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for the next SIGTERM or SIGINT and names it.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}
