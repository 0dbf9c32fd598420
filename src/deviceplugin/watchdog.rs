//! What both kubelet plugins (the device plugin and the DRA driver) do when their view of the
//! node stops being recomputed: one rule, so a hung NVML call takes GPU memory away from the
//! scheduler the same way whichever plugin a cluster runs.

use std::io;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long the view may go without being recomputed before it offers nothing: a refresh
/// that never returns (NVML stuck on a GPU that fell off the bus, a hung file system) must not
/// leave the scheduler with the last offer. A refresh takes milliseconds, so ten poll intervals
/// (at least 2 s) is far beyond a slow one.
pub fn stale_after(poll_interval: Duration) -> Duration {
    poll_interval.saturating_mul(10).max(Duration::from_secs(2))
}

/// A plugin's view of the node, as the watchdog needs it.
pub trait StaleView: Send + Sync + Sized + 'static {
    /// Whether the view already offers nothing, with its reason.
    fn is_failed(&self) -> bool;
    /// This view offering nothing, because of `reason`.
    fn failed_because(&self, reason: String) -> Self;
    /// Writes the view to the log.
    fn log(&self);
}

/// Watches the view thread's heartbeat (`beat`, set at each view it computes): when none came
/// for [`stale_after`] the poll interval, sends a view that offers nothing, which the view
/// thread's next view replaces. Ends when every receiver of `views` is gone.
pub fn start<V: StaleView>(
    views: Arc<watch::Sender<Arc<V>>>,
    beat: Arc<Mutex<Instant>>,
    poll_interval: Duration,
) -> io::Result<()> {
    let limit = stale_after(poll_interval);
    std::thread::Builder::new()
        .name("view-watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(poll_interval.min(limit));
            if views.is_closed() {
                return;
            }
            let since = beat.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
            if since < limit {
                continue;
            }
            views.send_if_modified(|current| {
                if current.is_failed() {
                    return false;
                }
                let stale = current.failed_because(format!(
                    "no new view for {}s: reading the inventory, the config or the ledger has not returned",
                    since.as_secs()
                ));
                stale.log();
                *current = Arc::new(stale);
                true
            });
        })
        .map(drop)
}

/// Waits for the view thread's first answer (`started`), at most [`stale_after`] the poll
/// interval: an NVML call that never returns at start ends the plugin with its reason instead
/// of leaving it unregistered and silent (the watchdog starts with the first view).
pub fn first_view<T>(started: &Receiver<T>, poll_interval: Duration) -> io::Result<T> {
    let limit = stale_after(poll_interval);
    started.recv_timeout(limit).map_err(|e| match e {
        RecvTimeoutError::Timeout => io::Error::other(format!(
            "no first view within {}s: reading the inventory, the config or the ledger has not returned",
            limit.as_secs()
        )),
        RecvTimeoutError::Disconnected => io::Error::other("the view thread ended before its first view"),
    })
}
