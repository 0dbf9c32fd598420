//! The ledger: every live reservation and every waiting container, in one JSON file.
//!
//! One transaction = one exclusive lock on `<state>/lock`, one read of `<state>/ledger.json`,
//! and at most one atomic write (temporary file, fsync, rename, fsync of the directory). A
//! reader that does not lock (`vramgate status`, a waiter checking whether it is worth taking
//! the lock) always sees a whole ledger, old or new, never a torn one.
//!
//! The state directory is root's alone: it is created 0700, and a directory or file that is a
//! symlink, belongs to someone else, or is writable by others is refused rather than used,
//! because every container start on the host trusts what is in it.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::procfs::ProcessIdentity;

pub const SCHEMA_VERSION: u32 = 1;
pub const LEDGER_FILE: &str = "ledger.json";
pub const LOCK_FILE: &str = "lock";
const TEMP_FILE: &str = "ledger.json.tmp";
/// A ledger larger than this is refused as corrupt; 10,000 reservations take about 3 MiB.
pub const MAX_LEDGER_BYTES: u64 = 32 << 20;
/// Opt-in audit trail for tests and debugging: when set (an absolute path), every committed
/// ledger is appended to that file as one JSON line, while the lock is still held, so the
/// file holds every generation in order. Watching the state directory with inotify cannot
/// promise that: two commits can land between a watcher's wake-up and its read, and the
/// middle state is never seen. Only the runtime's hook entry (written by the admin) sets a
/// hook's environment, never a container.
pub const AUDIT_LOG_ENV: &str = "VRAMGATE_AUDIT_LOG";
/// How long a transaction waits for the lock before giving up. Holders keep it for
/// milliseconds; reaching this means a holder is stuck, and saying so beats hanging a start.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("state directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} {path} is unsafe: it {reason}; fix or remove it (it must be {})", unsafe_kind(.is_dir), unsafe_want(.is_dir))]
    Unsafe {
        path: PathBuf,
        is_dir: bool,
        reason: String,
    },
    #[error("ledger {path} is corrupt ({reason}); nothing was changed: inspect it, then run `vramgate ledger repair` to set it aside and start a new one")]
    Corrupt { path: PathBuf, reason: String },
    #[error("ledger {path} has schema version {found}, this vramgate reads {SCHEMA_VERSION}: upgrade vramgate, or run `vramgate ledger repair` to start a new ledger")]
    Schema { path: PathBuf, found: u32 },
    #[error("the ledger lock {path} has been held by another process for more than {}s; find it with `fuser -v {}`", timeout.as_secs(), path.display())]
    LockTimeout { path: PathBuf, timeout: Duration },
}

type Result<T> = std::result::Result<T, LedgerError>;

fn unsafe_kind(is_dir: &bool) -> &'static str {
    if *is_dir {
        "state directory"
    } else {
        "state file"
    }
}

fn unsafe_want(is_dir: &bool) -> &'static str {
    if *is_dir {
        "a real directory owned by root, mode 0700"
    } else {
        "a regular file owned by root that others cannot write"
    }
}

/// The bytes one container holds (or asks for) on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuShare {
    pub uuid: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    pub container_id: String,
    pub gpus: Vec<GpuShare>,
    /// The container's init process; when it is gone the reservation is reclaimed.
    pub init: ProcessIdentity,
    pub created_unix_ms: u64,
    /// How long the container waited in the queue before it was admitted.
    #[serde(default)]
    pub waited_ms: u64,
}

/// A container waiting for room, held by its hook process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ticket {
    pub ticket: u64,
    pub container_id: String,
    pub gpus: Vec<GpuShare>,
    /// The waiting hook process; when it is gone (killed at the runtime's hook timeout, say)
    /// the ticket is dropped so it never blocks the queue.
    pub waiter: ProcessIdentity,
    pub enqueued_unix_ms: u64,
    pub deadline_unix_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    pub schema: u32,
    /// Bumped by every write, so readers can tell whether anything changed.
    pub generation: u64,
    pub next_ticket: u64,
    pub reservations: Vec<Reservation>,
    /// Waiting containers in arrival order (ticket numbers only grow).
    pub queue: Vec<Ticket>,
    /// Outcomes so far, for metrics (see `counters.rs`); absent from ledgers written before
    /// they existed.
    #[serde(default)]
    pub counters: crate::counters::Counters,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            schema: SCHEMA_VERSION,
            generation: 0,
            next_ticket: 1,
            reservations: Vec::new(),
            queue: Vec::new(),
            counters: Default::default(),
        }
    }
}

/// Reservations whose liveness one transaction checks when the ledger holds more: reading
/// `/proc/<pid>/stat` costs about 10 us of system time each, which at 1,000 reservations
/// would be most of a container start's hook time.
pub const RECLAIM_WINDOW: usize = 64;

/// An unlocked read of the ledger: its bytes and what they parse to.
struct Peek {
    bytes: Option<Vec<u8>>,
    ledger: Ledger,
}

/// Which recorded processes a look at `/proc` found alive or gone. A process found gone
/// stays gone (its identity includes its start time), so verdicts taken outside the lock may
/// be applied inside it.
#[derive(Debug, Default)]
pub struct Liveness {
    dead: std::collections::HashSet<ProcessIdentity>,
    live: std::collections::HashSet<ProcessIdentity>,
}

/// What a reclaim pass removed.
#[derive(Debug, Default)]
pub struct Reclaimed {
    pub reservations: Vec<Reservation>,
    pub tickets: Vec<Ticket>,
}

impl Reclaimed {
    pub fn extend(&mut self, more: Reclaimed) {
        self.reservations.extend(more.reservations);
        self.tickets.extend(more.tickets);
    }
}

impl Ledger {
    /// Drops every reservation whose container init, and every ticket whose waiter, has exited.
    pub fn reclaim_dead(&mut self) -> Reclaimed {
        self.reclaim_with(|p| p.is_alive())
    }

    pub fn reclaim_with(&mut self, is_alive: impl Fn(&ProcessIdentity) -> bool) -> Reclaimed {
        let (live, dead): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| is_alive(&r.init));
        self.reservations = live;
        let (live_tickets, dead_tickets): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|t| is_alive(&t.waiter));
        self.queue = live_tickets;
        Reclaimed {
            reservations: dead,
            tickets: dead_tickets,
        }
    }

    /// The `/proc` half of the reclaim every transaction starts with (see
    /// [`StateDir::begin_reclaiming`]): the liveness of a window of at most [`RECLAIM_WINDOW`]
    /// reservations that moves on with each write (all of them in a ledger no larger than
    /// that). A transaction whose request does not fit checks the rest before it refuses or
    /// queues anyone (see `hook.rs`), so the window changes only how soon a dead entry leaves
    /// the file, never a decision.
    pub fn check_window(&self) -> Liveness {
        self.check_window_with(|p| p.is_alive())
    }

    pub fn check_window_with(&self, is_alive: impl Fn(&ProcessIdentity) -> bool) -> Liveness {
        let mut liveness = Liveness::default();
        let n = self.reservations.len();
        let start = if n <= RECLAIM_WINDOW {
            0
        } else {
            (self.generation as usize).wrapping_mul(RECLAIM_WINDOW) % n
        };
        for r in self.reservations.iter().cycle().skip(start).take(n.min(RECLAIM_WINDOW)) {
            if is_alive(&r.init) {
                liveness.live.insert(r.init);
            } else {
                liveness.dead.insert(r.init);
            }
        }
        liveness
    }

    /// The ledger half, under the lock: drops the reservations `liveness` found gone, checks
    /// every ticket (the queue is short), and returns whether every remaining reservation is
    /// known to be alive.
    pub fn reclaim_known(&mut self, liveness: &Liveness) -> (Reclaimed, bool) {
        let mut reclaimed = Reclaimed::default();
        let (dead, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| liveness.dead.contains(&r.init));
        self.reservations = live;
        reclaimed.reservations = dead;
        let (live, dead): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|t| t.waiter.is_alive());
        self.queue = live;
        reclaimed.tickets = dead;
        let complete = self.reservations.iter().all(|r| liveness.live.contains(&r.init));
        (reclaimed, complete)
    }

    pub fn reservation(&self, container_id: &str) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.container_id == container_id)
    }

    pub fn remove_reservation(&mut self, container_id: &str) -> Option<Reservation> {
        let at = self.reservations.iter().position(|r| r.container_id == container_id)?;
        Some(self.reservations.remove(at))
    }

    pub fn remove_ticket(&mut self, ticket: u64) -> Option<Ticket> {
        let at = self.queue.iter().position(|t| t.ticket == ticket)?;
        Some(self.queue.remove(at))
    }

    /// Sum of reserved bytes on one GPU. Saturating: a ledger edited by hand can hold sums past
    /// `u64::MAX`, and a wrapped sum would read as a nearly empty GPU.
    pub fn reserved_on(&self, uuid: &str) -> u64 {
        self.reservations
            .iter()
            .flat_map(|r| &r.gpus)
            .filter(|s| s.uuid == uuid)
            .fold(0u64, |sum, s| sum.saturating_add(s.bytes))
    }

    pub fn parse(bytes: &[u8], path: &Path) -> Result<Ledger> {
        let corrupt = |reason: String| LedgerError::Corrupt {
            path: path.to_path_buf(),
            reason: crate::one_line(&reason),
        };
        let ledger: Ledger = match serde_json::from_slice(bytes) {
            Ok(ledger) => ledger,
            Err(e) => {
                // Only on failure look for the version, so a newer schema is reported as such
                // and not as corruption, while the common path parses once.
                #[derive(Deserialize)]
                struct Version {
                    schema: u32,
                }
                return Err(match serde_json::from_slice::<Version>(bytes) {
                    Ok(v) if v.schema != SCHEMA_VERSION => LedgerError::Schema {
                        path: path.to_path_buf(),
                        found: v.schema,
                    },
                    _ => corrupt(e.to_string()),
                });
            }
        };
        if ledger.schema != SCHEMA_VERSION {
            return Err(LedgerError::Schema {
                path: path.to_path_buf(),
                found: ledger.schema,
            });
        }
        if let Some(r) = ledger.reservations.iter().find(|r| r.gpus.is_empty()) {
            return Err(corrupt(format!("reservation of {:?} names no GPU", r.container_id)));
        }
        // Counters at their limit could only come from a damaged or forged file; refusing it
        // here keeps every `+ 1` on them below overflow.
        if ledger.next_ticket == u64::MAX || ledger.generation == u64::MAX {
            return Err(corrupt(
                "a counter (next_ticket or generation) is at its maximum".into(),
            ));
        }
        if ledger.queue.iter().any(|t| t.ticket >= ledger.next_ticket) {
            return Err(corrupt("a ticket number is not below next_ticket".into()));
        }
        Ok(ledger)
    }
}

/// The state directory, checked once when opened.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LedgerError + '_ {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses a file or directory that is a symlink, not ours, or writable by others.
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
    if meta.mode() & 0o022 != 0 {
        return unsafe_because(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
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
            Ok(meta) => check_owned(path, &meta, true)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io_err(parent))?;
                }
                match std::fs::DirBuilder::new().mode(0o700).create(path) {
                    Ok(()) => {}
                    // Another hook created it first: fine, it is checked below like any other.
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err(path)(e)),
                }
                let meta = std::fs::symlink_metadata(path).map_err(io_err(path))?;
                check_owned(path, &meta, true)?;
            }
            Err(e) => return Err(io_err(path)(e)),
        }
        Ok(StateDir {
            path: path.to_path_buf(),
        })
    }

    /// Opens an existing state directory without creating it (for read-only commands).
    pub fn open_existing(path: &Path) -> Result<Option<StateDir>> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                check_owned(path, &meta, true)?;
                Ok(Some(StateDir {
                    path: path.to_path_buf(),
                }))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(path)(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn ledger_path(&self) -> PathBuf {
        self.path.join(LEDGER_FILE)
    }

    /// Opens a file in the state directory, never following a symlink, and checks that it is
    /// a regular file of ours that others cannot write. `O_NONBLOCK` is there for a FIFO put
    /// in a file's place: opening one blocks until the other end opens, which would hang every
    /// container start; with it the open returns and the type check refuses the FIFO. On a
    /// regular file the flag changes nothing.
    pub fn open_file(&self, name: &str, options: &mut OpenOptions) -> Result<File> {
        let path = self.path.join(name);
        let file = options
            .custom_flags(libc_flags::O_NOFOLLOW | libc_flags::O_CLOEXEC | libc_flags::O_NONBLOCK)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc_flags::ELOOP) {
                    LedgerError::Unsafe {
                        path: path.clone(),
                        is_dir: false,
                        reason: "is a symbolic link".into(),
                    }
                } else {
                    io_err(&path)(e)
                }
            })?;
        let meta = file.metadata().map_err(io_err(&path))?;
        check_owned(&path, &meta, false)?;
        Ok(file)
    }

    /// Reads the ledger without locking: a consistent snapshot, thanks to atomic renames.
    pub fn read(&self) -> Result<Ledger> {
        Ok(self.peek()?.ledger)
    }

    /// The ledger file's bytes, `None` when there is none yet.
    fn read_bytes(&self) -> Result<Option<Vec<u8>>> {
        let path = self.ledger_path();
        let file = match self.open_file(LEDGER_FILE, OpenOptions::new().read(true)) {
            Ok(f) => f,
            Err(LedgerError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        use std::io::Read;
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

    fn parse_bytes(&self, bytes: &Option<Vec<u8>>) -> Result<Ledger> {
        match bytes {
            None => Ok(Ledger::default()),
            Some(bytes) => Ledger::parse(bytes, &self.ledger_path()),
        }
    }

    /// Reads the ledger without the lock, keeping the bytes so that a transaction begun after
    /// it can tell whether the file changed in between (see [`StateDir::begin_after`]).
    fn peek(&self) -> Result<Peek> {
        let bytes = self.read_bytes()?;
        let ledger = self.parse_bytes(&bytes)?;
        Ok(Peek { bytes, ledger })
    }

    /// Starts a transaction: takes the lock (waiting at most `LOCK_TIMEOUT`) and reads the ledger.
    pub fn begin(&self) -> Result<Transaction> {
        self.begin_after(None)
    }

    /// Starts a transaction and runs the routine reclaim (see [`Ledger::check_window`])
    /// with its `/proc` reads done before the lock is taken, on an unlocked copy of the
    /// ledger: the lock then only applies the verdicts (a process found gone stays gone), and
    /// other container starts wait that much less for it. Returns what was reclaimed and
    /// whether every remaining reservation is known to be alive.
    pub fn begin_reclaiming(&self) -> Result<(Transaction, Reclaimed, bool)> {
        let peek = self.peek()?;
        let liveness = peek.ledger.check_window();
        let mut tx = self.begin_after(Some(peek))?;
        let (reclaimed, checked_all) = tx.ledger.reclaim_known(&liveness);
        Ok((tx, reclaimed, checked_all))
    }

    /// Starts a transaction after an unlocked [`StateDir::peek`]: under the lock the file is
    /// read again, and when its bytes are the same the peeked parse is used as it is, so work
    /// done on the peek (reading `/proc`) stays outside the lock without a second parse.
    fn begin_after(&self, peek: Option<Peek>) -> Result<Transaction> {
        let lock = self.open_file(LOCK_FILE, OpenOptions::new().read(true).write(true).create(true))?;
        let lock_path = self.path.join(LOCK_FILE);
        let started = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    if started.elapsed() > LOCK_TIMEOUT {
                        return Err(LedgerError::LockTimeout {
                            path: lock_path,
                            timeout: LOCK_TIMEOUT,
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(1));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
            }
        }
        let bytes = self.read_bytes()?;
        let ledger = match peek {
            Some(peek) if peek.bytes == bytes => peek.ledger,
            _ => self.parse_bytes(&bytes)?,
        };
        Ok(Transaction {
            dir: self.clone(),
            _lock: lock,
            original: ledger.clone(),
            ledger,
        })
    }

    /// Writes `ledger` atomically and returns the bytes written. Only call while holding the lock.
    fn write(&self, ledger: &Ledger) -> Result<Vec<u8>> {
        let temp_path = self.path.join(TEMP_FILE);
        let bytes = serde_json::to_vec(ledger).expect("the ledger serializes");
        // A temp file left by a hook killed mid-write is ours to replace: we hold the lock.
        match std::fs::symlink_metadata(&temp_path) {
            Ok(_) => std::fs::remove_file(&temp_path).map_err(io_err(&temp_path))?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&temp_path)(e)),
        }
        let mut temp = self.open_file(TEMP_FILE, OpenOptions::new().write(true).create_new(true))?;
        temp.write_all(&bytes).map_err(io_err(&temp_path))?;
        temp.sync_all().map_err(io_err(&temp_path))?;
        drop(temp);
        let ledger_path = self.ledger_path();
        std::fs::rename(&temp_path, &ledger_path).map_err(io_err(&ledger_path))?;
        // The rename is durable only once the directory entry is.
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.path))?;
        Ok(bytes)
    }

    /// Sets a ledger that cannot be read aside (renamed, never deleted) and starts an empty one.
    /// Returns where the old file went.
    pub fn repair(&self) -> Result<Option<PathBuf>> {
        let tx_lock = self.open_file(LOCK_FILE, OpenOptions::new().read(true).write(true).create(true))?;
        tx_lock.lock().map_err(io_err(&self.path.join(LOCK_FILE)))?;
        let ledger_path = self.ledger_path();
        let moved = match std::fs::symlink_metadata(&ledger_path) {
            Ok(_) => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let aside = self.path.join(format!("ledger.json.corrupt-{stamp}"));
                std::fs::rename(&ledger_path, &aside).map_err(io_err(&ledger_path))?;
                Some(aside)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&ledger_path)(e)),
        };
        self.write(&Ledger::default())?;
        Ok(moved)
    }
}

/// Flags std has no names for.
mod libc_flags {
    pub const O_NOFOLLOW: i32 = nix::fcntl::OFlag::O_NOFOLLOW.bits();
    pub const O_CLOEXEC: i32 = nix::fcntl::OFlag::O_CLOEXEC.bits();
    pub const O_NONBLOCK: i32 = nix::fcntl::OFlag::O_NONBLOCK.bits();
    pub const ELOOP: i32 = nix::errno::Errno::ELOOP as i32;
}

/// A locked ledger. Dropping it without `commit` releases the lock and writes nothing.
pub struct Transaction {
    dir: StateDir,
    _lock: File,
    original: Ledger,
    pub ledger: Ledger,
}

impl Transaction {
    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    /// Writes the ledger if it changed. The lock is held until the transaction is dropped,
    /// so events about what was committed can still be logged in order.
    pub fn commit(&mut self) -> Result<bool> {
        if self.ledger == self.original {
            return Ok(false);
        }
        self.ledger.generation = self.original.generation + 1;
        let bytes = self.dir.write(&self.ledger)?;
        self.original = self.ledger.clone();
        if let Some(path) = std::env::var_os(AUDIT_LOG_ENV) {
            append_audit(Path::new(&path), &bytes);
        }
        Ok(true)
    }
}

/// Appends one committed ledger to the audit log (see [`AUDIT_LOG_ENV`]). Best effort: the
/// commit already happened, so a failure is reported and the transaction stands.
fn append_audit(path: &Path, ledger_json: &[u8]) {
    let result = if path.is_absolute() {
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc_flags::O_NOFOLLOW | libc_flags::O_CLOEXEC)
            .open(path)
            .and_then(|mut f| {
                let mut line = Vec::with_capacity(ledger_json.len() + 1);
                line.extend_from_slice(ledger_json);
                line.push(b'\n');
                f.write_all(&line)
            })
    } else {
        Err(std::io::Error::other("it is not an absolute path"))
    };
    if let Err(e) = result {
        eprintln!(
            "vramgate: warning: cannot append to the audit log {}: {e}",
            path.display()
        );
    }
}

/// Milliseconds since the epoch, the ledger's clock (wall time: it must survive restarts of
/// the processes that read it).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn id(pid: u32) -> ProcessIdentity {
        ProcessIdentity { pid, start_time: 7 }
    }

    fn reservation(container: &str, pid: u32, bytes: u64) -> Reservation {
        Reservation {
            container_id: container.into(),
            gpus: vec![GpuShare {
                uuid: "GPU-a".into(),
                bytes,
            }],
            init: id(pid),
            created_unix_ms: 1,
            waited_ms: 0,
        }
    }

    fn temp_state() -> (tempfile::TempDir, StateDir) {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open_or_create(&dir.path().join("state")).unwrap();
        (dir, state)
    }

    #[test]
    fn round_trip_and_generation() {
        let (_d, state) = temp_state();
        let mut tx = state.begin().unwrap();
        assert_eq!(tx.ledger, Ledger::default());
        tx.ledger.reservations.push(reservation("c1", 1, 100));
        assert!(tx.commit().unwrap());
        drop(tx);
        let ledger = state.read().unwrap();
        assert_eq!(ledger.generation, 1);
        assert_eq!(ledger.reserved_on("GPU-a"), 100);
        // An unchanged transaction writes nothing.
        assert!(!state.begin().unwrap().commit().unwrap());
        assert_eq!(state.read().unwrap().generation, 1);
    }

    #[test]
    fn reserved_sum_saturates_instead_of_wrapping() {
        let mut ledger = Ledger::default();
        ledger.reservations = vec![reservation("a", 1, u64::MAX - 1), reservation("b", 2, 5)];
        assert_eq!(ledger.reserved_on("GPU-a"), u64::MAX);
    }

    #[test]
    fn a_fifo_in_place_of_the_ledger_is_refused_not_waited_on() {
        let (_d, state) = temp_state();
        nix::unistd::mkfifo(&state.ledger_path(), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Without O_NONBLOCK this open blocks until something writes to the FIFO: forever.
        let err = state.read().unwrap_err();
        assert!(err.to_string().contains("is not a regular file"), "{err}");
        nix::unistd::mkfifo(
            &state.path().join("events.jsonl"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(state
            .open_file("events.jsonl", OpenOptions::new().append(true).create(true))
            .is_err());
    }

    #[test]
    fn exhausted_counters_are_corrupt() {
        for field in ["next_ticket", "generation"] {
            let mut json = serde_json::to_value(Ledger::default()).unwrap();
            json[field] = serde_json::json!(u64::MAX);
            let err = Ledger::parse(&serde_json::to_vec(&json).unwrap(), Path::new("/l")).unwrap_err();
            assert!(err.to_string().contains("at its maximum"), "{err}");
        }
    }

    #[test]
    fn creates_state_dir_private() {
        let (_d, state) = temp_state();
        let mode = std::fs::metadata(state.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn routine_reclaim_covers_a_large_ledger_in_windows() {
        let mut ledger = Ledger::default();
        ledger.reservations = (0..200).map(|n| reservation(&format!("c{n}"), n + 1, 1)).collect();
        let dead_pid = 150;
        let checked = std::cell::Cell::new(0);
        let mut found_after = None;
        for write in 0..4 {
            let liveness = ledger.check_window_with(|p| {
                checked.set(checked.get() + 1);
                p.pid != dead_pid
            });
            let (reclaimed, complete) = ledger.reclaim_known(&liveness);
            assert!(!complete);
            assert!(
                checked.get() <= RECLAIM_WINDOW * (write + 1),
                "bounded work per transaction"
            );
            if !reclaimed.reservations.is_empty() {
                found_after = Some(write);
                break;
            }
            ledger.generation += 1;
        }
        assert!(found_after.is_some(), "found within ceil(200 / 64) = 4 writes");
        assert_eq!(ledger.reservations.len(), 199);
        // A small ledger is checked whole, every time.
        let mut small = Ledger::default();
        small.reservations = (0..10).map(|n| reservation(&format!("c{n}"), n + 1, 1)).collect();
        let (reclaimed, complete) = small.reclaim_known(&small.check_window_with(|p| p.pid != 3));
        assert!(complete && reclaimed.reservations.len() == 1);
    }

    #[test]
    fn reclaims_dead_and_keeps_live() {
        let mut ledger = Ledger::default();
        ledger.reservations = vec![reservation("live", 1, 10), reservation("dead", 2, 20)];
        let reclaimed = ledger.reclaim_with(|p| p.pid == 1);
        assert_eq!(ledger.reservations.len(), 1);
        assert_eq!(reclaimed.reservations[0].container_id, "dead");
    }

    #[test]
    fn corrupt_ledger_is_an_error_and_is_left_alone() {
        let (_d, state) = temp_state();
        for bad in [&b"{not json"[..], b"", b"{\"schema\":1,\"g\\neneration\":0}", b"{\"schema\":1}", b"[]", b"{\"schema\":1,\"generation\":0,\"next_ticket\":1,\"reservations\":[{\"container_id\":\"x\",\"gpus\":[],\"init\":{\"pid\":1,\"start_time\":1},\"created_unix_ms\":0}],\"queue\":[]}"] {
            std::fs::write(state.ledger_path(), bad).unwrap();
            let err = state.begin().err().expect("corrupt").to_string();
            assert!(err.contains("corrupt") && err.contains("vramgate ledger repair"), "{err}");
            assert!(!err.contains('\n'));
            assert_eq!(std::fs::read(state.ledger_path()).unwrap(), bad, "nothing lost");
        }
        std::fs::write(state.ledger_path(), br#"{"schema":99}"#).unwrap();
        assert!(state.read().unwrap_err().to_string().contains("schema version 99"));
        let aside = state.repair().unwrap().unwrap();
        assert_eq!(std::fs::read(aside).unwrap(), br#"{"schema":99}"#);
        assert_eq!(state.read().unwrap(), Ledger::default());
    }

    #[test]
    fn refuses_symlinks_and_foreign_modes() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            StateDir::open_or_create(&link),
            Err(LedgerError::Unsafe { .. })
        ));

        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            StateDir::open_or_create(&real),
            Err(LedgerError::Unsafe { .. })
        ));
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();

        let state = StateDir::open_or_create(&real).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", real.join(LEDGER_FILE)).unwrap();
        let err = state.read().unwrap_err();
        assert!(matches!(err, LedgerError::Unsafe { .. }), "{err}");
        std::fs::remove_file(real.join(LEDGER_FILE)).unwrap();
        std::os::unix::fs::symlink("/tmp/elsewhere", real.join(LOCK_FILE)).unwrap();
        assert!(matches!(state.begin(), Err(LedgerError::Unsafe { .. })));
        assert!(!Path::new("/tmp/elsewhere").exists(), "never followed");
    }
}
