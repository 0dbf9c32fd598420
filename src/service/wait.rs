//! Waking a queued admission when the ledger is replaced.

use std::os::fd::AsFd;
use std::time::Duration;

/// Wakes a waiter when the ledger is replaced (every commit renames a new file into place).
/// Without inotify (exhausted watches) it degrades to plain sleeping for the poll interval.
pub(super) struct LedgerWatcher {
    inotify: Option<nix::sys::inotify::Inotify>,
}

impl LedgerWatcher {
    pub(super) fn new(dir: &std::path::Path) -> LedgerWatcher {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .ok()
            .filter(|i| i.add_watch(dir, AddWatchFlags::IN_MOVED_TO).is_ok());
        LedgerWatcher { inotify }
    }

    /// Waits up to `timeout`; true when the ledger was replaced meanwhile.
    pub(super) fn wait(&mut self, timeout: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some(inotify) = &self.inotify else {
            std::thread::sleep(timeout);
            return false;
        };
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(n) if n > 0 => {
                let mut changed = false;
                while let Ok(events) = inotify.read_events() {
                    if events.is_empty() {
                        break;
                    }
                    changed |= events
                        .iter()
                        .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new(crate::ledger::LEDGER_FILE)));
                }
                changed
            }
            _ => false,
        }
    }
}
