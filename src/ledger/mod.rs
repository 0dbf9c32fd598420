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
    ClaimHold, ClaimOf, Extra, GpuShare, Held, KeptPlace, Ledger, PodContainer, Reservation, Ticket, FORMAT,
    FORMAT_WITHOUT_LIMITS, MAX_KEPT_PLACES, MAX_LEDGER_BYTES,
};
pub use reclaim::{
    dra_heartbeat_stamp, dra_heartbeat_text, Reclaimed, Verdicts, DRA_ABSENT_LIMIT, DRA_BEAT, DRA_HEARTBEAT_FILE,
    RECLAIM_WINDOW,
};
pub use store::{Access, StateDir, LEDGER_FILE, LOCK_FILE};
pub use tx::{Committed, Peek, Transaction, AUDIT_LOG_ENV, LOCK_LOG_ENV, LOCK_TIMEOUT};

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

/// Which container a word of the operator's means (`vramgate status NAME|ID`,
/// `vramgate release NAME|ID`): the id is always the key; a name only leads to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The container's id: `who` was its id, the start of its id and of no other, or a name
    /// only it holds.
    Id(String),
    /// Nothing in the ledger is called or numbered so.
    Nothing,
    /// The name is held by several containers (names are not unique: any container may claim
    /// one): their ids and names, for the operator to choose by id.
    Ambiguous(Vec<(String, String)>),
}

/// Shortest start of an id taken for the id: `vramgate status` shows 24 characters.
pub const MIN_ID_PREFIX: usize = 12;

impl Ledger {
    /// What `who` means here ([`Found`]): an id first (whole, then a start of one of at least
    /// [`MIN_ID_PREFIX`] characters that no other id shares), then a name.
    pub fn find_container(&self, who: &str) -> Found {
        let entries = || {
            self.reservations
                .iter()
                .map(|r| (&r.container_id, &r.name))
                .chain(self.queue.iter().map(|t| (&t.container_id, &t.name)))
        };
        if entries().any(|(id, _)| id == who) {
            return Found::Id(who.to_string());
        }
        let mut by_prefix: Vec<&String> = entries()
            .filter(|(id, _)| who.len() >= MIN_ID_PREFIX && id.starts_with(who))
            .map(|(id, _)| id)
            .collect();
        by_prefix.dedup();
        if let [id] = by_prefix.as_slice() {
            return Found::Id(id.to_string());
        }
        let mut named: Vec<(String, String)> = entries()
            .filter(|(_, name)| name.as_deref() == Some(who))
            .map(|(id, name)| (id.clone(), name.clone().unwrap_or_default()))
            .collect();
        named.sort();
        named.dedup();
        match named.len() {
            0 => Found::Nothing,
            1 => Found::Id(named.remove(0).0),
            _ => Found::Ambiguous(named),
        }
    }
}

#[cfg(test)]
mod find_tests {
    use super::*;

    fn named(id: &str, name: Option<&str>) -> Reservation {
        Reservation {
            name: name.map(str::to_string),
            ..Reservation::for_test(id, "GPU-a", 1)
        }
    }

    #[test]
    fn an_id_a_unique_prefix_or_a_unique_name_finds_the_container_and_a_shared_name_does_not() {
        let mut ledger = Ledger::default();
        ledger.reservations.push(named("aaaaaaaaaaaa1111", Some("ns/p/c")));
        ledger.reservations.push(named("aaaaaaaaaaaa2222", Some("twin")));
        ledger.reservations.push(named("bbbbbbbbbbbb3333", Some("twin")));
        let mut waiting = Ticket::for_test("cccccccccccc4444", vec![]);
        waiting.name = Some("queued".into());
        ledger.queue.push(waiting);
        let id = |s: &str| Found::Id(s.to_string());
        assert_eq!(ledger.find_container("aaaaaaaaaaaa1111"), id("aaaaaaaaaaaa1111"));
        assert_eq!(ledger.find_container("ns/p/c"), id("aaaaaaaaaaaa1111"));
        assert_eq!(ledger.find_container("queued"), id("cccccccccccc4444"));
        assert_eq!(ledger.find_container("bbbbbbbbbbbb"), id("bbbbbbbbbbbb3333"));
        // Too short a start, or one two ids share, is no id.
        assert_eq!(ledger.find_container("bbbb"), Found::Nothing);
        assert_eq!(ledger.find_container("aaaaaaaaaaaa"), Found::Nothing);
        assert_eq!(
            ledger.find_container("twin"),
            Found::Ambiguous(vec![
                ("aaaaaaaaaaaa2222".into(), "twin".into()),
                ("bbbbbbbbbbbb3333".into(), "twin".into())
            ])
        );
        // A name that is someone's id is the id: an id is never shadowed by a name.
        ledger
            .reservations
            .push(named("dddddddddddd5555", Some("aaaaaaaaaaaa1111")));
        assert_eq!(ledger.find_container("aaaaaaaaaaaa1111"), id("aaaaaaaaaaaa1111"));
    }
}
