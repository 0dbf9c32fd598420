//! Waking a queued admission when the ledger is replaced, or when the engine removes the
//! bundle of a container whose create waits.
//!
//! Inotify instances are few and shared: `fs.inotify.max_user_instances` (128 by default on
//! Debian) counts every instance of every process of the user, and our waiters run as root,
//! beside containerd's CRI plugin, kubelet's plugins and our own DRA driver. One instance per
//! waiter let about 128 waiters make those fail with EMFILE. So at most [`WAKE_SLOTS`] waiters
//! of a state directory hold one; the others look at the ledger's `stat` every
//! [`STAT_POLL`], which takes no lock and no file descriptor beyond the call.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ledger::{Access, StateDir, LEDGER_FILE};

/// The file in the state directory whose bytes are the wake slots: a waiter holds a slot as an
/// open file description lock (`F_OFD_SETLK`) on one byte, so the kernel frees it when the
/// waiter exits, crashed or not, and another waiter takes it at its next try. A file of its
/// own rather than a range of the ledger's lock file: where `flock` is emulated by whole-file
/// record locks (NFS), a slot would block the ledger's lock.
pub const WAKE_FILE: &str = "wake";

/// How many waiters of one state directory hold an inotify instance at once: a few, so that a
/// queue of any length leaves the host's other root processes their instances.
pub const WAKE_SLOTS: u8 = 4;

/// How often a waiter without a slot looks at the ledger's identity: the most it adds to the
/// time from a release to its attempt. 300 waiters cost 6000 `stat` calls a second, a few
/// per cent of one core.
pub const STAT_POLL: Duration = Duration::from_millis(50);

/// How often a waiter without a slot tries again for one (freed by a waiter admitted, gone or
/// crashed). Seldom: each try opens the wake file and tries every slot.
const SLOT_RETRY: Duration = Duration::from_secs(1);

/// Wakes a waiter when the ledger is replaced (every commit renames a new file into place), and
/// a wait at create (the runtime wrapper) when its bundle's `config.json` goes: an engine that
/// gives up on a start (containerd's CRI plugin when kubelet's deadline passes) deletes the
/// task's bundle and leaves the waiting process alone, and that removal is what lets the
/// waiter give its place in the queue up at once rather than at its next check.
/// With a wake slot it waits on inotify; without one (all taken, or inotify itself refused) on
/// the ledger's `stat`, every [`STAT_POLL`].
pub(super) struct LedgerWatcher {
    dir: StateDir,
    bundle: Option<PathBuf>,
    inotify: Option<Watch>,
    /// The ledger's identity when last looked at without inotify.
    seen: Option<Identity>,
    /// When a waiter without a slot tries again for one.
    next_slot_try: Instant,
}

/// An inotify instance on the state directory (and the bundle), and the slot that allows it.
struct Watch {
    inotify: nix::sys::inotify::Inotify,
    state_dir: nix::sys::inotify::WatchDescriptor,
    /// Held open for the lock on its slot's byte; closing it frees the slot.
    _slot: File,
}

/// What tells one ledger file from the next: every commit renames a new file into place (a new
/// inode, a new change time). An inode number reused within one clock tick at the same size
/// would hide a change; the waiter then learns of it at its poll, as without any watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
    size: u64,
}

fn identity(path: &Path) -> Option<Identity> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(Identity {
        dev: m.dev(),
        ino: m.ino(),
        ctime: (m.ctime(), m.ctime_nsec()),
        size: m.size(),
    })
}

impl LedgerWatcher {
    pub(super) fn new(dir: &StateDir, bundle: Option<&Path>) -> LedgerWatcher {
        let mut watcher = LedgerWatcher {
            dir: dir.clone(),
            bundle: bundle.map(Path::to_path_buf),
            inotify: None,
            seen: identity(&dir.ledger_path()),
            next_slot_try: Instant::now(),
        };
        watcher.try_for_slot();
        watcher
    }

    /// Whether this waiter holds a wake slot (an inotify instance).
    #[cfg(test)]
    pub(super) fn has_slot(&self) -> bool {
        self.inotify.is_some()
    }

    /// Takes a free wake slot and its inotify instance, if there is one.
    fn try_for_slot(&mut self) {
        self.next_slot_try = Instant::now() + SLOT_RETRY;
        self.inotify = take_slot(&self.dir).and_then(|slot| watch(self.dir.path(), self.bundle.as_deref(), slot));
    }

    /// Waits up to `timeout`; true when the ledger was replaced meanwhile. An event in the
    /// bundle (or, without a slot, its `config.json` gone) ends the wait early with false: the
    /// caller checks the bundle itself.
    pub(super) fn wait(&mut self, timeout: Duration) -> bool {
        if self.inotify.is_none() && Instant::now() >= self.next_slot_try {
            self.try_for_slot();
            // A change between the last look and the new watch is one the watch cannot see.
            if self.inotify.is_some() && identity(&self.dir.ledger_path()) != self.seen {
                return true;
            }
        }
        match &self.inotify {
            Some(watch) => watch.wait(timeout),
            None => self.wait_on_stat(timeout),
        }
    }

    fn wait_on_stat(&mut self, timeout: Duration) -> bool {
        let ledger = self.dir.ledger_path();
        let end = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            std::thread::sleep(STAT_POLL.min(end - now));
            let now_seen = identity(&ledger);
            if now_seen != self.seen {
                self.seen = now_seen;
                return true;
            }
            if self.bundle.as_ref().is_some_and(|b| !b.join("config.json").exists()) {
                return false;
            }
        }
    }
}

/// Locks the first free byte of the wake file, starting at one chosen by our pid so that
/// waiters do not all try the same byte first. None when every slot is taken or the file
/// cannot be opened (then the waiter watches the ledger's `stat`, as with every slot taken).
fn take_slot(dir: &StateDir) -> Option<File> {
    use nix::fcntl::{fcntl, FcntlArg};
    use nix::libc;
    let file = dir.open_file(WAKE_FILE, Access::ReadWriteCreate).ok()?;
    let first = std::process::id() % u32::from(WAKE_SLOTS);
    (0..u32::from(WAKE_SLOTS))
        .any(|i| {
            // SAFETY: flock is plain old data; zeroed is a valid value for every field.
            let mut lock: libc::flock = unsafe { std::mem::zeroed() };
            lock.l_type = libc::F_WRLCK as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            lock.l_start = libc::off_t::from((first + i) % u32::from(WAKE_SLOTS));
            lock.l_len = 1;
            fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&lock)).is_ok()
        })
        .then_some(file)
}

/// An inotify instance watching the state directory (and `bundle`, best effort) under `slot`.
fn watch(dir: &Path, bundle: Option<&Path>, slot: File) -> Option<Watch> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
    let state_dir = inotify.add_watch(dir, AddWatchFlags::IN_MOVED_TO).ok()?;
    if let Some(bundle) = bundle {
        // Best effort: without it the check every CONTAINER_CHECK still sees the removal.
        let gone = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        let _ = inotify.add_watch(bundle, gone | AddWatchFlags::IN_ONLYDIR);
    }
    Some(Watch {
        inotify,
        state_dir,
        _slot: slot,
    })
}

impl Watch {
    fn wait(&self, timeout: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(n) if n > 0 => {
                let mut changed = false;
                while let Ok(events) = self.inotify.read_events() {
                    if events.is_empty() {
                        break;
                    }
                    changed |= events.iter().any(|e| {
                        e.wd == self.state_dir && e.name.as_deref() == Some(std::ffi::OsStr::new(LEDGER_FILE))
                    });
                }
                changed
            }
            _ => false,
        }
    }
}
