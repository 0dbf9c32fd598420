//! The state directory: root's alone, checked when opened and then held open, so every file in
//! it is opened relative to that directory (`openat`, `O_NOFOLLOW`) and a path swapped after
//! the check (a symlink put in place of the directory or of a file) cannot redirect root's
//! reads and writes.
//!
//! The directory must be a real directory owned by root with mode 0700, and every file in it
//! a regular file of root's that others cannot write; anything else is refused rather than
//! used, because every container start on the host trusts what is in it.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;

use super::model::{Ledger, MAX_LEDGER_BYTES};
use super::{LedgerError, Result};

pub const LEDGER_FILE: &str = "ledger.json";
pub const LOCK_FILE: &str = "lock";
const TEMP_FILE: &str = "ledger.json.tmp";

/// How a file in the state directory is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Read and write, created if missing (the lock file).
    ReadWriteCreate,
    /// Appended to, created if missing (the event log).
    AppendCreate,
}

/// The state directory, checked once when opened and held open from then on.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    dir: Arc<File>,
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LedgerError + '_ {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses a file or directory that is a symlink, not ours, or open to others: a directory
/// must be 0700 (nobody else may even list the containers on the host), a file must not be
/// writable by others.
fn check_owned(path: &Path, meta: &std::fs::Metadata, want_dir: bool) -> Result<()> {
    let unsafe_because = |reason: String| {
        Err(LedgerError::Unsafe {
            path: path.to_path_buf(),
            is_dir: want_dir,
            reason,
        })
    };
    if meta.file_type().is_symlink() {
        return unsafe_because("is a symbolic link".into());
    }
    if want_dir && !meta.is_dir() {
        return unsafe_because("is not a directory".into());
    }
    if !want_dir && !meta.is_file() {
        return unsafe_because("is not a regular file".into());
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return unsafe_because(format!("is owned by uid {}, not {}", meta.uid(), euid));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return unsafe_because(format!("is writable by group or others (mode {mode:o})"));
    }
    if want_dir && mode & 0o077 != 0 {
        return unsafe_because(format!("is open to group or others (mode {mode:o})"));
    }
    Ok(())
}

pub(super) fn c_name(name: &str) -> CString {
    // Names are this module's constants and generated names: never a NUL.
    CString::new(name).expect("state file names hold no NUL")
}

impl StateDir {
    /// Opens the state directory, creating it (0700, parents 0755) if missing.
    pub fn open_or_create(path: &Path) -> Result<StateDir> {
        if !path.is_absolute() {
            return Err(LedgerError::Unsafe {
                path: path.to_path_buf(),
                is_dir: true,
                reason: "is not an absolute path".into(),
            });
        }
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
                }
                match std::fs::DirBuilder::new().mode(0o700).create(path) {
                    Ok(()) => {}
                    // Another hook created it first: fine, it is checked below like any other.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err(path)(e)),
                }
            }
            Err(e) => return Err(io_err(path)(e)),
        }
        StateDir::open_checked(path)
    }

    /// Opens an existing state directory without creating it (for read-only commands).
    pub fn open_existing(path: &Path) -> Result<Option<StateDir>> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => StateDir::open_checked(path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(path)(e)),
        }
    }

    /// Checks the path (for a message that names the problem), opens it without following a
    /// symlink, and checks what was opened: the same directory, still ours.
    fn open_checked(path: &Path) -> Result<StateDir> {
        let meta = std::fs::symlink_metadata(path).map_err(io_err(path))?;
        check_owned(path, &meta, true)?;
        let dir = crate::atomic_file::open_dir(path).map_err(io_err(path))?;
        let opened = dir.metadata().map_err(io_err(path))?;
        if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
            return Err(LedgerError::Unsafe {
                path: path.to_path_buf(),
                is_dir: true,
                reason: "was replaced while it was being opened".into(),
            });
        }
        check_owned(path, &opened, true)?;
        Ok(StateDir {
            path: path.to_path_buf(),
            dir: Arc::new(dir),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the markers of [`super::marks`] say for sure that the ledger names no entry
    /// of `container`, without reading it. False when they cannot say.
    pub fn surely_not_held(&self, container: &str) -> bool {
        super::marks::surely_not_held(&self.dir, container)
    }

    pub(super) fn dir_file(&self) -> &File {
        &self.dir
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.path.join(LEDGER_FILE)
    }

    /// Opens a file in the state directory relative to the directory held open, never
    /// following a symlink, and checks that it is a regular file of ours that others cannot
    /// write. `O_NONBLOCK` is there for a FIFO put in a file's place: opening one blocks until
    /// the other end opens, which would hang every container start; with it the open returns
    /// and the type check refuses the FIFO. On a regular file the flag changes nothing.
    pub fn open_file(&self, name: &str, access: Access) -> Result<File> {
        let path = self.path.join(name);
        let flags = OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | OFlag::O_NONBLOCK
            | match access {
                Access::Read => OFlag::O_RDONLY,
                Access::ReadWriteCreate => OFlag::O_RDWR | OFlag::O_CREAT,
                Access::AppendCreate => OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT,
            };
        let fd = openat(
            self.dir.as_fd(),
            c_name(name).as_c_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| match e {
            Errno::ELOOP => LedgerError::Unsafe {
                path: path.clone(),
                is_dir: false,
                reason: "is a symbolic link".into(),
            },
            e => io_err(&path)(e.into()),
        })?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(io_err(&path))?;
        check_owned(&path, &meta, false)?;
        Ok(file)
    }

    /// Renames one file of the state directory to another name in it.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let dir = self.dir.as_fd();
        renameat(dir, c_name(from).as_c_str(), dir, c_name(to).as_c_str())
            .map_err(|e| io_err(&self.path.join(from))(e.into()))
    }

    /// Replaces the small file `name` of the state directory with `bytes`, atomically (a
    /// record beside the ledger, written without the ledger lock: the temporary name is this
    /// process's own, so two writers never share one).
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let temp = format!(".{name}.{}.tmp", std::process::id());
        crate::atomic_file::replace_at(&self.dir, name.as_ref(), temp.as_ref(), bytes, 0o600, None)
            .map_err(io_err(&self.path.join(name)))
    }

    /// When the file `name` of the state directory was last modified, in milliseconds since
    /// the epoch: one `fstatat`, never following a symlink. `None` when it is not there (or
    /// not a regular file, or cannot be read).
    pub fn modified_unix_ms(&self, name: &str) -> Option<u64> {
        let stat = nix::sys::stat::fstatat(
            self.dir.as_fd(),
            c_name(name).as_c_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()?;
        if stat.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG {
            return None;
        }
        let seconds = u64::try_from(stat.st_mtime).ok()?;
        let millis = u64::try_from(stat.st_mtime_nsec).ok()? / 1_000_000;
        seconds.checked_mul(1000)?.checked_add(millis)
    }

    /// Removes the file `name` of the state directory; one that is not there is no error.
    pub fn remove_file(&self, name: &str) -> Result<()> {
        match nix::unistd::unlinkat(
            self.dir.as_fd(),
            c_name(name).as_c_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io_err(&self.path.join(name))(e.into())),
        }
    }

    /// Reads the ledger without locking: a consistent snapshot, thanks to atomic renames.
    pub fn read(&self) -> Result<Ledger> {
        let bytes = self.read_bytes()?;
        self.parse_bytes(&bytes)
    }

    /// The ledger file's bytes, `None` when there is none yet.
    pub(super) fn read_bytes(&self) -> Result<Option<Vec<u8>>> {
        let path = self.ledger_path();
        let file = match self.open_file(LEDGER_FILE, Access::Read) {
            Ok(f) => f,
            Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // Sized from the file's length (open_file has just checked it, so the inode is
        // cached): read_to_end on a `Take` would otherwise grow from 32 bytes, a read call per
        // doubling (fourteen for a ledger of 500 reservations).
        let hint = file.metadata().map_or(0, |m| m.len()).min(MAX_LEDGER_BYTES) as usize;
        let mut bytes = Vec::with_capacity(hint + 1);
        file.take(MAX_LEDGER_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err(&path))?;
        if bytes.len() as u64 > MAX_LEDGER_BYTES {
            return Err(LedgerError::Corrupt {
                path,
                reason: format!("it is larger than {MAX_LEDGER_BYTES} bytes"),
            });
        }
        if bytes.is_empty() {
            return Err(LedgerError::Corrupt {
                path,
                reason: "it is empty".into(),
            });
        }
        Ok(Some(bytes))
    }

    pub(super) fn parse_bytes(&self, bytes: &Option<Vec<u8>>) -> Result<Ledger> {
        match bytes {
            None => Ok(Ledger::default()),
            Some(bytes) => Ledger::parse(bytes, &self.ledger_path()),
        }
    }

    /// Takes the exclusive ledger lock, waiting at most `timeout`. Holders keep it for
    /// milliseconds; reaching the timeout means a holder is stuck, and saying so beats hanging
    /// a container start.
    pub(super) fn lock(&self, timeout: Duration) -> Result<File> {
        let lock = self.open_file(LOCK_FILE, Access::ReadWriteCreate)?;
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match lock.try_lock() {
                Ok(()) => {
                    super::tx::log_lock(started.elapsed());
                    return Ok(lock);
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let waited = started.elapsed();
                    if waited >= timeout {
                        return Err(LedgerError::LockTimeout {
                            path: self.path.join(LOCK_FILE),
                            waited,
                        });
                    }
                    std::thread::sleep(pause.min(timeout - waited));
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io_err(&self.path.join(LOCK_FILE))(e)),
            }
        }
    }

    /// Writes `ledger` atomically and returns the bytes written. Only call while holding the
    /// lock: the temporary name is fixed, and a leftover from a writer killed mid-write (or
    /// anything planted there) is unlinked, never followed.
    ///
    /// A ledger larger than [`MAX_LEDGER_BYTES`] is refused before anything is written: every
    /// reader refuses such a file as corrupt, so writing it would stop every container start
    /// on the host until `ledger repair`.
    ///
    /// While a hook of an older release may still read it, the ledger is written in the format
    /// that one reads (see [`super::compat`]).
    pub(super) fn write(&self, ledger: &Ledger) -> Result<Vec<u8>> {
        let mut older = super::compat::write_for_older_readers(ledger, &super::compat::ProcBinaries)
            .then(|| super::compat::for_older_readers(ledger))
            .flatten();
        // The oldest format that describes what is written (see FORMAT): a ledger read as
        // format 2 whose limits have all left is format 1 again.
        let format = older.as_ref().unwrap_or(ledger).format_needed();
        if older.as_ref().unwrap_or(ledger).schema != format {
            older.get_or_insert_with(|| ledger.clone()).schema = format;
        }
        let bytes = serde_json::to_vec(older.as_ref().unwrap_or(ledger)).expect("the ledger serializes");
        if bytes.len() as u64 > MAX_LEDGER_BYTES {
            return Err(LedgerError::TooLarge {
                path: self.ledger_path(),
                bytes: bytes.len() as u64,
            });
        }
        crate::atomic_file::replace_at(&self.dir, LEDGER_FILE.as_ref(), TEMP_FILE.as_ref(), &bytes, 0o600, None)
            .map_err(io_err(&self.ledger_path()))?;
        Ok(bytes)
    }

    /// Sets a ledger that cannot be read aside (renamed, never deleted) and starts an empty one
    /// whose generation is above the old file's (when it still shows one) and above the clock's
    /// milliseconds, so generations never go backwards for readers that compare them. Returns
    /// where the old file went.
    pub fn repair(&self) -> Result<Option<PathBuf>> {
        let _lock = self.lock(super::LOCK_TIMEOUT)?;
        let old = match self.open_file(LEDGER_FILE, Access::Read) {
            Ok(file) => {
                let mut bytes = Vec::new();
                let _ = file.take(MAX_LEDGER_BYTES).read_to_end(&mut bytes);
                Some(bytes)
            }
            Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
            // A symlink, FIFO or foreign file in the ledger's place is set aside unread.
            Err(LedgerError::Unsafe { .. }) => Some(Vec::new()),
            Err(e) => return Err(e),
        };
        let moved = match old {
            Some(_) => {
                let stamp = crate::clock::now_unix_ms() / 1000;
                let aside = format!("{LEDGER_FILE}.corrupt-{stamp}");
                self.rename(LEDGER_FILE, &aside)?;
                Some(self.path.join(aside))
            }
            None => None,
        };
        let salvaged = old.as_deref().and_then(Ledger::salvage_generation).unwrap_or(0);
        let fresh = Ledger {
            generation: salvaged.saturating_add(1).max(crate::clock::now_unix_ms()),
            ..Ledger::default()
        };
        self.write(&fresh)?;
        Ok(moved)
    }
}
