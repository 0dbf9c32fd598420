//! The locked read-modify-write of the ledger.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use super::model::Ledger;
use super::reclaim::{dra_heartbeat_stamp, Reclaimed, DRA_HEARTBEAT_FILE};
use super::store::Access;
use super::store::StateDir;
use super::Result;
use crate::clock::Stamp;
use crate::procfs::Liveness;

/// Opt-in audit trail for tests and debugging: when set (an absolute path), every committed
/// ledger is appended to that file as one JSON line, while the lock is still held, so the
/// file holds every generation in order. Watching the state directory with inotify cannot
/// promise that: two commits can land between a watcher's wake-up and its read, and the
/// middle state is never seen. Only the runtime's hook entry (written by the admin) sets a
/// hook's environment, never a container.
pub const AUDIT_LOG_ENV: &str = "VRAMGATE_AUDIT_LOG";
/// Opt-in count of lock acquisitions for benchmarks (`bench/queue-lock.sh`): when set (an
/// absolute path), every time a process takes the ledger lock it appends one line to that file,
/// its pid and how long it waited for the lock in microseconds. Counted where the lock is
/// taken, so what it counts is what hook processes really did, not a model of it; unset (as on
/// every real host), it costs one environment lookup per lock. Set like [`AUDIT_LOG_ENV`].
pub const LOCK_LOG_ENV: &str = "VRAMGATE_LOCK_LOG";
/// How long a transaction waits for the lock when its caller gives no tighter budget.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// An unlocked read of the ledger: its bytes and what they parse to. A transaction begun after
/// it ([`StateDir::begin_reclaiming_after`]) reuses the parse when the file is unchanged.
pub struct Peek {
    bytes: Option<Vec<u8>>,
    ledger: Ledger,
}

impl Peek {
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
}

/// A locked ledger. Dropping it without `commit` releases the lock and writes nothing.
pub struct Transaction {
    dir: StateDir,
    _lock: File,
    original: Ledger,
    pub ledger: Ledger,
}

impl StateDir {
    /// Starts a transaction: takes the lock (waiting at most [`LOCK_TIMEOUT`]) and reads the
    /// ledger.
    pub fn begin(&self) -> Result<Transaction> {
        self.begin_after(None, LOCK_TIMEOUT)
    }

    /// [`StateDir::begin`], waiting at most `lock_timeout` for the lock.
    pub fn begin_within(&self, lock_timeout: Duration) -> Result<Transaction> {
        self.begin_after(None, lock_timeout)
    }

    /// Starts a transaction, waiting at most `lock_timeout` for the lock, and runs the routine
    /// reclaim (see [`Ledger::check_window`]) with its `/proc` reads done before the lock is
    /// taken, on an unlocked copy of the ledger: the lock then only applies the verdicts (a
    /// process found gone stays gone), and other container starts wait that much less for it.
    /// Returns what was reclaimed and whether every remaining reservation is known to be alive.
    /// Claims' own reservations left by a DRA driver gone for good go too
    /// ([`Ledger::release_claims_of_absent_driver`]; its heartbeat, a few bytes, is read only
    /// when the ledger holds such a reservation). `now` is this instant on both clocks.
    pub fn begin_reclaiming(
        &self,
        liveness: &dyn Liveness,
        now: Stamp,
        lock_timeout: Duration,
    ) -> Result<(Transaction, Reclaimed, bool)> {
        self.begin_reclaiming_after(self.peek()?, liveness, now, lock_timeout)
    }

    /// Reads the ledger without the lock, for a caller that looks before it decides whether a
    /// transaction is needed at all.
    pub fn peek(&self) -> Result<Peek> {
        let bytes = self.read_bytes()?;
        let ledger = self.parse_bytes(&bytes)?;
        Ok(Peek { bytes, ledger })
    }

    /// [`StateDir::begin_reclaiming`] on a peek the caller already took, so the file is not
    /// read and parsed a second time outside the lock.
    pub fn begin_reclaiming_after(
        &self,
        peek: Peek,
        liveness: &dyn Liveness,
        now: Stamp,
        lock_timeout: Duration,
    ) -> Result<(Transaction, Reclaimed, bool)> {
        let verdicts = peek.ledger.check_window(liveness);
        let claims_held = peek.ledger.reservations.iter().any(|r| r.claim_of.is_some());
        let driver_seen = if claims_held { self.dra_heartbeat() } else { None };
        let mut tx = self.begin_after(Some(peek), lock_timeout)?;
        let (mut reclaimed, checked_all) = tx.ledger.reclaim_known(&verdicts, liveness);
        let released = tx.ledger.release_claims_of_absent_driver(now, driver_seen);
        reclaimed.reservations.extend(released);
        Ok((tx, reclaimed, checked_all))
    }

    /// The DRA driver's last beat ([`DRA_HEARTBEAT_FILE`]); None where there is none, or it
    /// cannot be read, or it is not one.
    fn dra_heartbeat(&self) -> Option<Stamp> {
        use std::io::Read;
        let mut text = String::new();
        self.open_file(DRA_HEARTBEAT_FILE, Access::Read)
            .ok()?
            .take(128)
            .read_to_string(&mut text)
            .ok()?;
        dra_heartbeat_stamp(&text)
    }

    /// Starts a transaction after an unlocked peek: under the lock the file is read again, and
    /// when its bytes are the same the peeked parse is used as it is, so work done on the peek
    /// (reading `/proc`) stays outside the lock without a second parse.
    fn begin_after(&self, peek: Option<Peek>, lock_timeout: Duration) -> Result<Transaction> {
        let lock = self.lock(lock_timeout)?;
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
}

impl Transaction {
    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    /// Writes the ledger if it changed, and ends the transaction. The lock stays held until
    /// the returned [`Committed`] is dropped, so events about what was committed can still be
    /// logged in order. Consuming the transaction saves a copy of the ledger that a second
    /// commit would need: at 500 reservations that copy and its freeing were a tenth of a
    /// container start's admission.
    pub fn commit(self) -> Result<Committed> {
        let Transaction {
            dir,
            _lock: lock,
            original,
            mut ledger,
        } = self;
        let changed = ledger != original;
        if changed {
            ledger.generation = original.generation + 1;
            let marks = super::marks::MarksUpdate::before_write(dir.dir_file(), &original, &ledger);
            let bytes = dir.write(&ledger)?;
            marks.after_write(dir.dir_file());
            if let Some(path) = std::env::var_os(AUDIT_LOG_ENV) {
                append_audit(Path::new(&path), &bytes);
            }
        }
        Ok(Committed { _lock: lock, changed })
    }
}

/// A transaction that has been committed, still holding the ledger's lock until dropped.
#[must_use = "dropping it releases the ledger's lock; keep it while logging what was committed"]
pub struct Committed {
    _lock: File,
    /// Whether the ledger had changed and was written.
    pub changed: bool,
}

/// Appends one committed ledger to the audit log (see [`AUDIT_LOG_ENV`]). Best effort: the
/// commit already happened, so a failure is reported and the transaction stands.
fn append_audit(path: &Path, ledger_json: &[u8]) {
    let mut line = Vec::with_capacity(ledger_json.len() + 1);
    line.extend_from_slice(ledger_json);
    line.push(b'\n');
    append_line(path, &line, "audit log");
}

/// One line of the lock log ([`LOCK_LOG_ENV`]), when it is set: this lock was taken after
/// `waited`.
pub(super) fn log_lock(waited: Duration) {
    if let Some(path) = std::env::var_os(LOCK_LOG_ENV) {
        let line = format!("{} {}\n", std::process::id(), waited.as_micros());
        append_line(Path::new(&path), line.as_bytes(), "lock log");
    }
}

/// Appends `line` to the file at `path` (absolute, never followed through a symlink), one
/// `write` so that lines of concurrent processes do not interleave; best effort, with a warning.
fn append_line(path: &Path, line: &[u8], what: &str) {
    let result = if path.is_absolute() {
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(path)
            .and_then(|mut f| f.write_all(line))
    } else {
        Err(std::io::Error::other("it is not an absolute path"))
    };
    if let Err(e) = result {
        eprintln!("vramgate: warning: cannot append to the {what} {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::store::Access;
    use crate::ledger::{GpuShare, LedgerError, Reservation, LEDGER_FILE, LOCK_FILE};
    use crate::procfs::ProcessIdentity;
    use std::os::unix::fs::PermissionsExt;

    fn reservation(container: &str, bytes: u64) -> Reservation {
        let init = ProcessIdentity { pid: 1, start_time: 7 };
        Reservation::new(container, vec![GpuShare::new("GPU-a", bytes, 0)], init, 1)
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
        tx.ledger.reservations.push(reservation("c1", 100));
        assert!(tx.commit().unwrap().changed);
        let ledger = state.read().unwrap();
        assert_eq!(ledger.generation, 1);
        assert_eq!(ledger.reserved_on("GPU-a"), 100);
        // An unchanged transaction writes nothing.
        assert!(!state.begin().unwrap().commit().unwrap().changed);
        assert_eq!(state.read().unwrap().generation, 1);
    }

    #[test]
    fn waiting_for_the_lock_is_bounded_by_the_callers_budget() {
        let (_d, state) = temp_state();
        let holder = state.begin().unwrap();
        let started = std::time::Instant::now();
        let err = state
            .begin_reclaiming(&crate::procfs::ProcLiveness, Stamp::wall(0), Duration::from_millis(50))
            .err()
            .expect("the lock is held");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(matches!(err, LedgerError::LockTimeout { .. }), "{err}");
        assert!(err.to_string().contains("fuser -v"), "{err}");
        drop(holder);
        assert!(state
            .begin_reclaiming(&crate::procfs::ProcLiveness, Stamp::wall(0), Duration::from_millis(50))
            .is_ok());
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
        assert!(state.open_file("events.jsonl", Access::AppendCreate).is_err());
    }

    #[test]
    fn creates_state_dir_private_and_refuses_one_open_to_others() {
        let (_d, state) = temp_state();
        let mode = std::fs::metadata(state.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = StateDir::open_or_create(state.path()).unwrap_err().to_string();
        assert!(
            err.contains("is open to group or others (mode 755)") && err.contains("mode 0700"),
            "{err}"
        );
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
        let err = state.read().unwrap_err().to_string();
        assert!(
            err.contains("written by a newer vramgate (ledger format 99; this one reads up to 3)"),
            "{err}"
        );
        let aside = state.repair().unwrap().unwrap();
        assert_eq!(std::fs::read(aside).unwrap(), br#"{"schema":99}"#);
        let fresh = state.read().unwrap();
        assert!(fresh.reservations.is_empty() && fresh.queue.is_empty());
    }

    #[test]
    fn repair_keeps_the_generation_increasing() {
        let (_d, state) = temp_state();
        // A ledger far ahead of the clock's milliseconds, then damaged but still showing its
        // generation: the repaired ledger starts above it.
        let ahead = u64::MAX / 2;
        std::fs::write(
            state.ledger_path(),
            format!(r#"{{"schema":1,"generation":{ahead},"next_ticket":1,"reservations":"damaged","queue":[]}}"#),
        )
        .unwrap();
        assert!(state.read().is_err());
        state.repair().unwrap();
        assert_eq!(state.read().unwrap().generation, ahead + 1);
        // Unreadable garbage: the clock's milliseconds are a floor no earlier ledger reached.
        std::fs::write(state.ledger_path(), b"\x00garbage").unwrap();
        state.repair().unwrap();
        assert!(state.read().unwrap().generation >= crate::clock::now_unix_ms() - 60_000);
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
        // The link's target is this test's own, absent path: a host-wide one (/tmp/elsewhere)
        // could be made by anything else running, failing this test for nothing.
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, real.join(LOCK_FILE)).unwrap();
        assert!(matches!(state.begin(), Err(LedgerError::Unsafe { .. })));
        assert!(!elsewhere.exists(), "never followed");
    }

    #[test]
    fn a_directory_swapped_after_opening_is_not_followed() {
        // The state directory is held open: moving it away and putting a symlink to another
        // directory in its place does not redirect the next write.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let state = StateDir::open_or_create(&path).unwrap();
        let moved = dir.path().join("moved");
        std::fs::rename(&path, &moved).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let mut tx = state.begin().unwrap();
        tx.ledger.reservations.push(reservation("c", 1));
        let _ = tx.commit().unwrap();
        assert!(moved.join(LEDGER_FILE).exists());
        assert!(!elsewhere.join(LEDGER_FILE).exists());
    }
}
