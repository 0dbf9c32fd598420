//! The ledger: every live reservation and every waiting container, in one JSON file.
//!
//! Split by concern: [`model`] is the data and its invariants, [`store`] the state directory
//! (held open, every file opened relative to it), [`tx`] the locked read-modify-write,
//! [`reclaim`] how entries of processes that are gone leave the file, and [`compat`] what a
//! write leaves out while a reader of an older release may still run.
//!
//! One transaction = one exclusive lock on `<state>/lock`, one read of `<state>/ledger.json`,
//! and at most one atomic write (temporary file, fsync, rename, fsync of the directory). A
//! reader that does not lock (`vramgate status`, a waiter checking whether it is worth taking
//! the lock) always sees a whole ledger, old or new, never a torn one.

mod compat;
pub mod marks;
mod model;
mod reclaim;
mod store;
mod tx;

use std::path::PathBuf;
use std::time::Duration;

pub use crate::clock::now_unix_ms;
pub use model::{
    ClaimHold, Extra, GpuShare, Held, KeptPlace, Ledger, PodContainer, Reservation, Ticket, FORMAT,
    FORMAT_WITHOUT_LIMITS, MAX_KEPT_PLACES, MAX_LEDGER_BYTES,
};
pub use reclaim::{Reclaimed, Verdicts, RECLAIM_WINDOW};
pub use store::{Access, StateDir, LEDGER_FILE, LOCK_FILE};
pub use tx::{Committed, Peek, Transaction, AUDIT_LOG_ENV, LOCK_TIMEOUT};

impl Reservation {
    /// A confirmed reservation of `gpus` for `container_id`, held by `init` since the epoch,
    /// with nothing else recorded: what tests and benches build ledgers from, in one place so
    /// that a field added to a reservation is added to them once.
    pub fn held(container_id: &str, gpus: Vec<GpuShare>, init: crate::procfs::ProcessIdentity) -> Reservation {
        Reservation::new(container_id, gpus, init, 0)
    }
}

/// Whether an admission with a limit must reserve the limit whole, because a hook of a release
/// without limits waits in the queue and will read the ledger (see `ledger/compat.rs`).
pub fn limits_must_be_reserved(ledger: &Ledger) -> bool {
    compat::limits_must_be_reserved(ledger, &compat::ProcBinaries)
}

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
    #[error("ledger {path} was written by a newer vramgate (ledger format {found}; this one reads up to {FORMAT}): nothing was changed; finish upgrading vramgate on this host (an upgrade in progress: retry once it is done), or run `vramgate ledger repair` to set it aside and start a new one, forgetting its reservations")]
    NewerFormat { path: PathBuf, found: u32 },
    #[error("ledger {path} would grow to {bytes} bytes, over the {MAX_LEDGER_BYTES} bytes every vramgate reads; nothing was changed: release reservations or clear the queue (`vramgate status` lists them)")]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("the ledger lock {path} has been held by another process for more than {}; find it with `fuser -v {}`", crate::quantity::format_duration(*.waited), path.display())]
    LockTimeout { path: PathBuf, waited: Duration },
}

pub type Result<T> = std::result::Result<T, LedgerError>;

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
