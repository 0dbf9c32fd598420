//! The file watch both plugins' view threads wait on: a view is recomputed as soon as the
//! ledger is replaced or the config file changes, and at the latest after the poll interval.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::ledger::LEDGER_FILE;

/// A directory inotify cannot watch.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {path} for changes: {source}")]
pub struct WatchError {
    pub path: PathBuf,
    pub source: nix::Error,
}

/// inotify on the state directory (the ledger is replaced by a rename) and on the config
/// file's directory (editors and tests replace or rewrite it).
pub struct FileWatch {
    inotify: Inotify,
    config_name: Option<OsString>,
}

impl FileWatch {
    pub fn new(state_dir: &Path, config: &Path) -> Result<FileWatch, WatchError> {
        let watch_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WatchError { path, source }
        };
        // The same events on both: when the config sits in the state directory, the second
        // watch replaces the first.
        let events = AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE;
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(watch_err(state_dir))?;
        inotify.add_watch(state_dir, events).map_err(watch_err(state_dir))?;
        // A config in a directory that does not exist (defaults apply) has nothing to watch.
        let config_dir = config.parent().filter(|d| d.is_dir());
        if let Some(dir) = config_dir {
            inotify.add_watch(dir, events).map_err(watch_err(dir))?;
        }
        Ok(FileWatch {
            inotify,
            config_name: config_dir.and(config.file_name().map(OsString::from)),
        })
    }

    /// Waits up to `timeout` for the ledger or the config file to change.
    pub fn wait(&mut self, timeout: Duration) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(0) => return,
                Ok(_) => {}
                // A signal: look again. Any other failure: the poll interval alone paces us.
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => {
                    std::thread::sleep(left);
                    return;
                }
            }
            let Ok(events) = self.inotify.read_events() else { return };
            let ledger = std::ffi::OsStr::new(LEDGER_FILE);
            if events
                .iter()
                .any(|e| e.name.as_deref() == Some(ledger) || e.name.as_deref() == self.config_name.as_deref())
            {
                return;
            }
        }
    }
}
