//! Waking a queued admission when the ledger is replaced, or when the engine removes the
//! bundle of a container whose create waits.

use std::os::fd::AsFd;
use std::time::Duration;

/// Wakes a waiter when the ledger is replaced (every commit renames a new file into place), and
/// a wait at create (the runtime wrapper) when its bundle's `config.json` goes: an engine that
/// gives up on a start (containerd's CRI plugin when kubelet's deadline passes) deletes the
/// task's bundle and leaves the waiting process alone, and that removal is what lets the
/// waiter give its place in the queue up at once rather than at its next check.
/// Without inotify (exhausted watches) it degrades to plain sleeping for the poll interval.
pub(super) struct LedgerWatcher {
    /// The inotify instance and its watch on the state directory.
    inotify: Option<(nix::sys::inotify::Inotify, nix::sys::inotify::WatchDescriptor)>,
}

impl LedgerWatcher {
    pub(super) fn new(dir: &std::path::Path, bundle: Option<&std::path::Path>) -> LedgerWatcher {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .ok()
            .and_then(|i| i.add_watch(dir, AddWatchFlags::IN_MOVED_TO).ok().map(|wd| (i, wd)));
        if let (Some((inotify, _)), Some(bundle)) = (&inotify, bundle) {
            // Best effort: without it the check every CONTAINER_CHECK still sees the removal.
            let gone = AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF;
            let _ = inotify.add_watch(bundle, gone | AddWatchFlags::IN_ONLYDIR);
        }
        LedgerWatcher { inotify }
    }

    /// Waits up to `timeout`; true when the ledger was replaced meanwhile. An event in the
    /// bundle ends the wait early with false: the caller checks the bundle itself.
    pub(super) fn wait(&mut self, timeout: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some((inotify, state_dir)) = &self.inotify else {
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
                    changed |= events.iter().any(|e| {
                        e.wd == *state_dir
                            && e.name.as_deref() == Some(std::ffi::OsStr::new(crate::ledger::LEDGER_FILE))
                    });
                }
                changed
            }
            _ => false,
        }
    }
}
