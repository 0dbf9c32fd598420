//! The reservation service: admit, release, gc and snapshot over ledger transactions.
//!
//! Every way into vramgate calls this: the OCI hook (admit at createRuntime/prestart, release
//! at poststop), the CLI (release, gc, status) and, through them, the runtime wrapper. It is
//! given the inventory, a clock and a liveness check as traits, so its decisions run in unit
//! tests against fakes, without processes or GPUs; callers only turn their input into a
//! request and the outcome into their output.
//!
//! An admission is a loop of attempts. One attempt is one locked transaction: reclaim what is
//! gone, decide (see [`crate::admission`]), then admit, refuse, or queue. A queued request
//! sleeps without the lock until the ledger changes or the poll interval passes, and tries
//! again while it is at the head of its GPUs' queues, until its timeout.

mod attempt;
mod claims;
mod decide;
mod heartbeat;
mod outcome;
mod queue_wait;
mod release;
mod snapshot;
mod wake;

use std::path::Path;
use std::time::Duration;

pub use attempt::Step;
pub use claims::ClaimReserved;
pub use heartbeat::{beat, beat_dra, heartbeat_window, watch_seen, WatchSeen, HEARTBEAT_FILE};
pub use outcome::{Admission, GoneProcess, Refusal, Shortage};
pub use queue_wait::{wait_for, Progress, CONTAINER_CHECK};
pub use release::Released;
pub use wake::{STAT_POLL, WAKE_FILE, WAKE_SLOTS};

use crate::admission::Rules;
use crate::attribution;
use crate::clock::Clock;
use crate::config::{Config, Policy};
use crate::events::{self, Event, Kind};
use crate::inventory::{Inventory, InventoryError};
use crate::ledger::{GpuShare, Ledger, LedgerError, Reclaimed, StateDir};
use crate::procfs::{Liveness, ProcessIdentity};
use crate::request::{Request, RequestError};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("container {container}: {source}")]
    Request { container: String, source: RequestError },
    /// An attempt failed after this admission had queued, and its ticket could not be
    /// removed either: the container must not start (its own hook would queue behind it).
    #[error("{cause}; and container {container}'s queue ticket {ticket} could not be removed ({removal}), so it is refused rather than started behind its own ticket (the ticket goes when this process ends)")]
    TicketStands {
        container: String,
        ticket: u64,
        cause: Box<ServiceError>,
        removal: Box<ServiceError>,
    },
}

impl ServiceError {
    /// Errors about vramgate's own state, where `on_state_error = "fail-open"` may let a
    /// container start anyway. The user's own mistakes are always refused, and so is a
    /// container whose queue ticket still stands.
    pub fn is_state_error(&self) -> bool {
        matches!(self, ServiceError::Inventory(_) | ServiceError::Ledger(_))
    }
}

type Result<T> = std::result::Result<T, ServiceError>;

/// One container's request for memory, as a caller hands it to [`Service::admit`].
#[derive(Debug, Clone)]
pub struct AdmitRequest<'r> {
    pub container: &'r str,
    /// The container's init process: the reservation lives as long as it does.
    pub init: ProcessIdentity,
    pub request: &'r Request,
    /// The container's bundle: with the id, what a stop must match to release it.
    pub bundle: Option<&'r Path>,
    pub policy: Policy,
    /// How long it may wait in the queue under policy `wait`.
    pub wait_for: Duration,
    /// The process that holds the ticket while it waits (the hook itself).
    pub waiter: ProcessIdentity,
    /// The runtime process that runs the hook (`runc create`), when known: if it is gone, the
    /// container can no longer start and a wait for it is given up.
    pub runtime: Option<ProcessIdentity>,
    /// How long the caller has in all (the runtime's hook timeout less a margin); every wait
    /// for the ledger lock counts against it. `None`: only the ledger's own lock timeout.
    pub budget: Option<Duration>,
    /// Made by `vramgate-runtime` at `create`, before the container exists: `init` is the
    /// runtime process, and the reservation is pending until the container's hook confirms it
    /// (see [`crate::ledger::Reservation::pending`]). Only such a request may place (`auto`).
    pub pending: bool,
    /// What holds the container to its reservation, as vramgate-runtime wrote it into the spec
    /// at create (the hook passes the spec's `vramgate.dev/enforcement`). Taken only when it
    /// confirms that very admission, whose spec the wrapper rewrote: the annotation is also
    /// what a container's own `--annotation` or a pod's annotations can set, so a fresh
    /// admission (the hook alone) records no tier from it, whatever the spec says. A tier the
    /// hook itself applies is recorded through [`Service::set_enforcement`].
    pub enforcement: Option<crate::enforce::Tier>,
    /// The container's own cgroup, as the hook read it from its init's `/proc/<pid>/cgroup`
    /// ([`crate::procfs::own_cgroup`]): recorded on the reservation, what its GPU processes
    /// are found by. `None` from the wrapper at create (no init yet) and for a container that
    /// has no cgroup of its own.
    pub cgroup: Option<&'r str>,
}

pub struct Service<'a> {
    dir: StateDir,
    inventory: &'a dyn Inventory,
    clock: &'a dyn Clock,
    liveness: &'a dyn Liveness,
    rules: Rules,
    poll_interval: Duration,
    /// Where the driver's per-container figures come from (`inventory.nvml_library`).
    nvml_library: std::path::PathBuf,
    /// Those figures, loaded the first time a decision's ledger holds a container the driver
    /// limit holds ([`crate::enforce::driver_usage_for`]). On a GPU host the inventory has
    /// already loaded and started the same library, so this is a reference count, not a
    /// driver start.
    cgroup_usage: std::cell::OnceCell<crate::enforce::driver_limit::DriverUsage>,
    /// Whether the containers of a pod that share a claim may hold it once
    /// ([`crate::ledger::ClaimHold`]): only where `vramgate watch` stops them together when
    /// their use added up passes the claim's limit (`[enforce] over_use = "kill"`), and only
    /// while a watch is seen running ([`Service::watch_runs`]). Every other tier holds each
    /// container to the claim's limit alone, so K containers could use K times what one hold
    /// counts; there each holder is counted whole.
    claims_held_together: bool,
    /// The watch's `[enforce] over_use_interval`: how fresh its heartbeat must be.
    watch_interval: Duration,
}

impl<'a> Service<'a> {
    pub fn new(
        dir: StateDir,
        inventory: &'a dyn Inventory,
        clock: &'a dyn Clock,
        liveness: &'a dyn Liveness,
        config: &Config,
    ) -> Service<'a> {
        Service {
            dir,
            inventory,
            clock,
            liveness,
            rules: Rules::from_config(config),
            poll_interval: config.queue.poll_interval,
            nvml_library: config.inventory.nvml_library.clone().into(),
            cgroup_usage: std::cell::OnceCell::new(),
            claims_held_together: config.enforce.over_use == crate::config::OverUseAction::Kill,
            watch_interval: config.enforce.over_use_interval,
        }
    }

    /// Whether a claim's holders may count once now: the config says `kill` and a watch is
    /// seen running (its heartbeat is fresh; see `heartbeat.rs`). One `fstatat`, asked only
    /// where a claim hold is in question.
    fn watch_runs(&self) -> bool {
        self.claims_held_together
            && heartbeat::watch_seen(&self.dir, self.clock.now_unix_ms(), self.watch_interval).runs()
    }

    /// The driver's per-container figures for attribution (see the field).
    fn cgroup_usage(&self, ledger: &Ledger) -> &dyn attribution::CgroupUsage {
        if self.cgroup_usage.get().is_none() {
            if let Some(usage) = crate::enforce::driver_usage_for(ledger, &self.nvml_library) {
                let _ = self.cgroup_usage.set(usage);
            }
        }
        match self.cgroup_usage.get() {
            Some(usage) => usage,
            None => &attribution::NoCgroupUsage,
        }
    }

    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    fn event(&self, kind: Kind, container: &str, gpus: &[GpuShare], detail: impl Into<String>) -> Event {
        Event::new(self.clock.now_unix_ms(), kind, container, gpus, detail)
    }

    fn reclaim_events(&self, reclaimed: &Reclaimed, log: &mut Vec<Event>) {
        for r in &reclaimed.reservations {
            let detail = match &r.claim_of {
                Some(_) => format!(
                    "vramgate-dra has not been seen for over {}s: the claim's reservation is released",
                    crate::ledger::DRA_ABSENT_LIMIT.as_secs()
                ),
                None => format!("init pid {} is gone", r.init.pid),
            };
            log.push(
                self.event(Kind::Reclaim, &r.container_id, &r.gpus, detail)
                    .named(&r.name),
            );
        }
        for t in &reclaimed.tickets {
            let detail = format!("waiting hook pid {} is gone", t.waiter.pid);
            log.push(
                self.event(Kind::AbandonTicket, &t.container_id, &t.gpus, detail)
                    .named(&t.name),
            );
        }
        for r in &reclaimed.undecided {
            let detail = format!(
                "kept: cannot tell whether init pid {} still runs (/proc unreadable)",
                r.init.pid
            );
            log.push(self.event(Kind::Note, &r.container_id, &r.gpus, detail).named(&r.name));
        }
    }
}

/// The fail-open decision, in one place for the hook, its driver-limit path and the wrapper:
/// whether `container` may start unaccounted after `failure`, an error about vramgate's own
/// state (the caller says which errors are: [`ServiceError::is_state_error`]). Only where the
/// top-level `on_state_error` says `fail-open`; then the start is recorded as a `fail_open`
/// event, so that nothing starts unaccounted without a trace.
pub fn fails_open(config: &Config, container: &str, failure: &dyn std::fmt::Display) -> bool {
    if config.on_state_error != crate::config::OnStateError::FailOpen {
        return false;
    }
    log_fail_open(config, &crate::clock::SystemClock, container, &failure.to_string());
    true
}

/// Records that a container started unaccounted because the state is broken and the config
/// says fail-open. Best effort: the state directory may be what is broken.
pub fn log_fail_open(config: &Config, clock: &dyn Clock, container: &str, message: &str) {
    if let Ok(dir) = StateDir::open_or_create(&config.state_dir) {
        let event = Event::new(clock.now_unix_ms(), Kind::FailOpen, container, &[], message);
        events::append(&dir, &[event]);
    }
}

#[cfg(test)]
mod tests;
