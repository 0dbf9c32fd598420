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

/// How long a plugin waits for its first view unless told otherwise (`--startup-timeout`):
/// the first view opens NVML, and `nvmlInit` on a cold multi-GPU host without persistence
/// mode can take tens of seconds; each restart opens it again, so an allowance cut to the
/// steady state's [`stale_after`] would turn a slow driver into a crash loop.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a plugin ended without a first view.
#[derive(Debug, thiserror::Error)]
pub enum FirstViewError {
    #[error("no first view within {}s: reading the inventory, the config or the ledger has not returned (a driver slow to start needs a longer --startup-timeout)", .allowance.as_secs())]
    TimedOut { allowance: Duration },
    #[error("the view thread ended before its first view")]
    ViewThreadEnded,
}

/// Waits for the view thread's first answer (`started`), at most `allowance`
/// (`--startup-timeout`): an NVML call that never returns at start ends the plugin with its
/// reason instead of leaving it unregistered and silent (the watchdog starts with the first
/// view). Past [`stale_after`] the poll interval, where a view in steady state would count
/// as hung, `program` logs once that it is still waiting, so an operator sees why nothing is
/// registered yet; nothing is offered until the view comes.
pub fn first_view<T>(
    started: &Receiver<T>,
    poll_interval: Duration,
    allowance: Duration,
    program: &str,
) -> Result<T, FirstViewError> {
    let ended = |e| match e {
        RecvTimeoutError::Timeout => FirstViewError::TimedOut { allowance },
        RecvTimeoutError::Disconnected => FirstViewError::ViewThreadEnded,
    };
    let patience = stale_after(poll_interval).min(allowance);
    match started.recv_timeout(patience) {
        Err(RecvTimeoutError::Timeout) if patience < allowance => {
            eprintln!(
                "{program}: no first view after {}s (reading the inventory, the config or the ledger has not returned; NVML's start can take this long on a cold host): still waiting, for at most --startup-timeout {}s, with nothing offered until it comes",
                patience.as_secs(),
                allowance.as_secs()
            );
            started.recv_timeout(allowance - patience).map_err(ended)
        }
        answer => answer.map_err(ended),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn a_first_view_slower_than_ten_poll_intervals_is_waited_for() {
        let (tx, rx) = channel();
        let poll = Duration::from_millis(10);
        let late = stale_after(poll) + Duration::from_millis(300);
        std::thread::spawn(move || {
            std::thread::sleep(late);
            let _ = tx.send(7);
        });
        let started = Instant::now();
        let view = first_view(&rx, poll, Duration::from_secs(30), "test").unwrap();
        assert_eq!(view, 7);
        assert!(started.elapsed() >= late);
    }

    #[test]
    fn no_first_view_within_the_allowance_names_the_flag_to_raise() {
        let (_tx, rx) = channel::<()>();
        let allowance = Duration::from_millis(300);
        let started = Instant::now();
        let err = first_view(&rx, Duration::from_millis(10), allowance, "test").unwrap_err();
        assert!(started.elapsed() >= allowance);
        assert!(matches!(err, FirstViewError::TimedOut { allowance: a } if a == allowance));
        assert!(err.to_string().contains("--startup-timeout"), "{err}");
    }

    #[test]
    fn a_view_thread_that_ends_is_not_waited_for() {
        let (tx, rx) = channel::<()>();
        drop(tx);
        let started = Instant::now();
        let err = first_view(&rx, Duration::from_millis(10), Duration::from_secs(30), "test").unwrap_err();
        assert!(matches!(err, FirstViewError::ViewThreadEnded));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
