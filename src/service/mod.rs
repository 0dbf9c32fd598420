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

mod outcome;
mod wait;

use std::path::Path;
use std::time::Duration;

pub use outcome::{Admission, GoneProcess, Refusal, Shortage};

/// How often a waiter checks that its container can still start, whatever the poll interval:
/// an engine that gave up on a start must not find its memory taken by it later.
pub const CONTAINER_CHECK: Duration = Duration::from_secs(1);

use crate::admission::{self, Decision, Rules};
use crate::attribution;
use crate::clock::Clock;
use crate::config::{Config, Policy};
use crate::events::{self, Event, Kind};
use crate::inventory::{Inventory, InventoryError, Snapshot};
use crate::ledger::{GpuShare, Ledger, LedgerError, Reclaimed, Reservation, StateDir, Ticket, LOCK_TIMEOUT};
use crate::procfs::{self, Liveness, ProcessIdentity};
use crate::quantity::format_duration;
use crate::request::{Request, RequestError};
use crate::status::StatusReport;

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
    /// (see [`Reservation::pending`]). Only such a request may place (`auto`).
    pub pending: bool,
    /// What holds the container to its reservation, as vramgate-runtime wrote it into the spec
    /// at create (the hook passes the spec's `vramgate.dev/enforcement`). Taken only when it
    /// confirms that very admission, whose spec the wrapper rewrote: the annotation is also
    /// what a container's own `--annotation` or a pod's annotations can set, so a fresh
    /// admission (the hook alone) records no tier from it, whatever the spec says. A tier the
    /// hook itself applies is recorded through [`Service::set_enforcement`].
    pub enforcement: Option<crate::enforce::Tier>,
}

/// What a release found.
#[derive(Debug, Default)]
pub struct Released {
    pub reservation: Option<Reservation>,
    /// Waits that were ended (their hooks refuse their containers).
    pub cancelled: Vec<Ticket>,
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
}

/// Where one admission's queue wait stands between attempts. [`Service::admit`] keeps one;
/// a caller that drives the attempts itself ([`Service::attempt`], e.g. on a virtual clock)
/// starts one with [`Progress::start`] and hands it to each attempt.
#[derive(Debug, Default)]
pub struct Progress {
    /// Monotonic time of the first attempt.
    started: Duration,
    ticket: Option<u64>,
    /// What the last attempt that had to wait saw, for the timeout message.
    last: Option<(Shortage, usize)>,
}

impl Progress {
    /// A new admission, its wait counted from `clock`'s now.
    pub fn start(clock: &dyn Clock) -> Progress {
        Progress {
            started: clock.monotonic(),
            ..Progress::default()
        }
    }

    /// The queue ticket this admission holds while it waits.
    pub fn ticket(&self) -> Option<u64> {
        self.ticket
    }
}

/// What one attempt concluded.
#[derive(Debug)]
pub enum Step {
    Done(Admission),
    /// Queued (it holds a ticket): try again when the ledger changes or the poll interval
    /// passes ([`Service::admit`] sleeps until then).
    Wait,
}

/// The instant one attempt decides at.
#[derive(Debug, Clone, Copy)]
struct At {
    now: crate::clock::Stamp,
    /// How long this admission has waited so far (monotonic).
    waited: Duration,
}

/// How long removing a ticket after a failed attempt may wait for the lock: well inside the
/// hook's margin before the runtime's timeout ([`crate::hook::HOOK_TIMEOUT_MARGIN`]).
const TICKET_REMOVAL_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

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
        }
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

    /// Admits `req`, waiting in the queue under policy `wait`. Refusals are outcomes
    /// ([`Admission::Refused`]); errors are about the request's GPUs or vramgate's own state.
    pub fn admit(&self, req: &AdmitRequest) -> Result<Admission> {
        self.admit_then(req, &mut || {})
    }

    /// [`Service::admit`], calling `on_queued` once, when the request first holds a ticket and
    /// is about to wait: what `vramgate-runtime` starts its queue guard from, so that a create
    /// admitted at once costs no extra process.
    pub fn admit_then(&self, req: &AdmitRequest, on_queued: &mut dyn FnMut()) -> Result<Admission> {
        let mut progress = Progress::start(self.clock);
        let mut queued = false;
        // The watcher exists before a ticket can be committed, so a release that lands between
        // the commit and the first sleep still wakes this waiter.
        let new_watcher = || wait::LedgerWatcher::new(self.dir.path(), req.pending.then_some(req.bundle).flatten());
        let mut watcher = (req.policy == Policy::Wait).then(new_watcher);
        loop {
            match self.attempt(req, &mut progress)? {
                Step::Done(admission) => return Ok(admission),
                Step::Wait => {
                    if !std::mem::replace(&mut queued, true) {
                        on_queued();
                    }
                    let watcher = watcher.get_or_insert_with(new_watcher);
                    self.sleep_until_worth_trying(req, &progress, watcher);
                }
            }
        }
    }

    /// How long the next lock wait may take: the ledger's own limit, or what is left of the
    /// caller's budget.
    fn lock_timeout(&self, req: &AdmitRequest, progress: &Progress) -> Duration {
        match req.budget {
            Some(budget) => {
                let spent = self.clock.monotonic().saturating_sub(progress.started);
                budget.saturating_sub(spent).min(LOCK_TIMEOUT)
            }
            None => LOCK_TIMEOUT,
        }
    }

    /// One attempt of an admission: one locked transaction that reclaims, decides, and admits,
    /// refuses or (re)queues. It never sleeps: [`Service::admit`] is this in a loop with the
    /// waits between, and a caller on a virtual clock can drive it the same way.
    ///
    /// An attempt that ends in anything but [`Step::Wait`] leaves no ticket behind: inside the
    /// transaction [`Service::decide_on`] removes it; an error outside it (the lock, the
    /// inventory, the write) removes it here, in a transaction of its own. When even that
    /// fails, the error says the ticket stands ([`ServiceError::TicketStands`]), and that is
    /// never a reason to start a container unaccounted: the ticket would queue the container's
    /// own hook behind itself.
    pub fn attempt(&self, req: &AdmitRequest, progress: &mut Progress) -> Result<Step> {
        match self.attempt_locked(req, progress) {
            Err(error) => match progress.ticket.take() {
                Some(ticket) => Err(self.remove_ticket_after(req.container, ticket, error)),
                None => Err(error),
            },
            step => step,
        }
    }

    fn attempt_locked(&self, req: &AdmitRequest, progress: &mut Progress) -> Result<Step> {
        // The inventory (NVML: loading the library, nvmlInit) is opened before the lock is
        // taken, so no start on the host waits behind a driver's initialisation; only the
        // memory reads happen inside. A hook that confirms what the wrapper reserved at create
        // needs no GPU numbers and never opens it.
        let mut peek = self.dir.peek()?;
        loop {
            if !self.inventory.is_open() && needs_inventory(peek.ledger(), req) {
                self.inventory.open()?;
            }
            let (mut tx, mut reclaimed, checked_all) =
                self.dir
                    .begin_reclaiming_after(peek, self.liveness, self.lock_timeout(req, progress))?;
            if !self.inventory.is_open() && needs_inventory(&tx.ledger, req) {
                // The ledger changed between the look and the lock (what was to be confirmed
                // was released): give the lock back, open, and look again.
                drop(tx);
                self.inventory.open()?;
                peek = self.dir.peek()?;
                continue;
            }
            let mut log = Vec::new();
            let on_disk = progress.ticket;
            let step = self.decide_on(&mut tx.ledger, checked_all, &mut reclaimed, req, progress, &mut log);
            tx.ledger.counters.record_reclaimed(&reclaimed);
            // A request error still commits: the reclaim happened, and its ticket is dropped.
            let committed = match tx.commit() {
                Ok(committed) => committed,
                Err(e) => {
                    // The write failed (a full state directory, EIO, the size limit): the
                    // ledger on disk still holds the ticket from before this attempt, whatever
                    // `decide_on` did in memory, and a failure after the rename (the
                    // directory's fsync) may have left a ticket it just took. Handing either
                    // back sends this error through the removal in `attempt`, which says when
                    // the ticket stands: a container is never started unaccounted behind its
                    // own ticket (its waiter would live on as runc, and the queue behind it
                    // would wait on it).
                    progress.ticket = on_disk.or(progress.ticket);
                    return Err(e.into());
                }
            };
            self.reclaim_events(&reclaimed, &mut log);
            events::append(&self.dir, &log);
            drop(committed);
            return step;
        }
    }

    /// Removes `ticket` after an attempt failed outside its transaction, best effort and
    /// bounded: returns the error to report, which says so when the ticket still stands.
    fn remove_ticket_after(&self, container: &str, ticket: u64, error: ServiceError) -> ServiceError {
        let removed = (|| -> Result<()> {
            let (mut tx, reclaimed, _) = self.dir.begin_reclaiming(self.liveness, TICKET_REMOVAL_LOCK_TIMEOUT)?;
            let mut log = Vec::new();
            if let Some(t) = tx.ledger.remove_ticket(ticket) {
                tx.ledger.counters.record_abandon();
                let detail = format!("ticket {ticket}: {error}");
                log.push(self.event(Kind::Cancel, container, &t.gpus, detail));
            }
            tx.ledger.counters.record_reclaimed(&reclaimed);
            let committed = tx.commit()?;
            self.reclaim_events(&reclaimed, &mut log);
            events::append(&self.dir, &log);
            drop(committed);
            Ok(())
        })();
        match removed {
            Ok(()) => error,
            Err(removal) => ServiceError::TicketStands {
                container: container.to_string(),
                ticket,
                cause: Box::new(error),
                removal: Box::new(removal),
            },
        }
    }

    /// The decision of one attempt on a locked ledger, which it changes in place; the events
    /// it causes go to `log`. Separate from the transaction so that tests can run it on a
    /// ledger in memory.
    ///
    /// The one exit for the ticket: whatever the steps conclude, other than to keep waiting
    /// (an admission, a refusal, an error), takes this admission's ticket out of the queue.
    fn decide_on(
        &self,
        ledger: &mut Ledger,
        checked_all: bool,
        reclaimed: &mut Reclaimed,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
    ) -> Result<Step> {
        let at = At {
            now: self.clock.stamp(),
            waited: self.clock.monotonic().saturating_sub(progress.started),
        };
        let step = self.steps(ledger, checked_all, reclaimed, req, progress, log, at);
        if !matches!(step, Ok(Step::Wait)) {
            if let Some(ticket) = progress.ticket.take() {
                ledger.remove_ticket(ticket);
            }
        }
        step
    }

    /// The steps of one attempt, in order: is the wait still wanted, is this a confirmation,
    /// what does the same id in the ledger say, and otherwise decide on the GPUs' numbers
    /// and apply the decision.
    #[allow(clippy::too_many_arguments)]
    fn steps(
        &self,
        ledger: &mut Ledger,
        checked_all: bool,
        reclaimed: &mut Reclaimed,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
        at: At,
    ) -> Result<Step> {
        if let Some(refusal) = self.wait_ended(ledger, req, progress, log, at) {
            return Ok(Step::Done(Admission::Refused(refusal)));
        }
        if let Some(confirmed) = self.confirm(ledger, req, log) {
            return Ok(Step::Done(confirmed));
        }
        if let Some(done) = self.same_id(ledger, reclaimed, req) {
            return Ok(Step::Done(done));
        }
        let decided = self.decide(ledger, checked_all, reclaimed, req, progress, at)?;
        Ok(self.apply(ledger, decided, req, progress, log, at))
    }

    /// A waiter whose ticket was removed (`vramgate release`), or whose container can no
    /// longer start (the engine gave up on the start and killed or deleted it), leaves the
    /// queue and is never admitted afterwards.
    fn wait_ended(
        &self,
        ledger: &mut Ledger,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
        at: At,
    ) -> Option<Refusal> {
        let ticket = progress.ticket?;
        let container = req.container.to_string();
        if ledger.ticket(ticket).is_none() {
            progress.ticket = None;
            ledger.counters.record_abandon();
            return Some(Refusal::Cancelled {
                container,
                waited: at.waited,
            });
        }
        let gone = self.gone_process(req)?;
        let refusal = Refusal::ContainerGone {
            container,
            waited: at.waited,
            process: gone,
        };
        log.push(self.event(Kind::Cancel, req.container, &[], refusal.to_string()));
        ledger.counters.record_abandon();
        Some(refusal)
    }

    /// The hook of a container that vramgate-runtime admitted at create: binds the pending
    /// reservation to the init process, and to the bundle as the runtime reports it, which is
    /// what the stop will name (the wrapper saw the engine's spelling of it: a symlink, `..`).
    fn confirm(&self, ledger: &mut Ledger, req: &AdmitRequest, log: &mut Vec<Event>) -> Option<Admission> {
        let r = ledger.reservations.iter_mut().find(|r| confirms(r, req))?;
        r.pending = false;
        r.init = req.init;
        if let Some(bundle) = req.bundle {
            r.bundle = Some(bundle.to_path_buf());
        }
        if req.enforcement.is_some() {
            r.enforcement = req.enforcement;
        }
        let shares = r.gpus.clone();
        log.push(self.event(
            Kind::Confirm,
            req.container,
            &shares,
            format!("init pid {}", req.init.pid),
        ));
        Some(Admission::Confirmed { shares })
    }

    /// What a reservation already under this id means: none, a gone container's (reclaimed
    /// now, even outside the routine reclaim's window of a large ledger), this very container
    /// seen at a second stage (createRuntime and prestart both configured: idempotent), or a
    /// live namesake (refused).
    fn same_id(&self, ledger: &mut Ledger, reclaimed: &mut Reclaimed, req: &AdmitRequest) -> Option<Admission> {
        let existing = ledger.reservation(req.container)?;
        if existing.init == req.init {
            return Some(Admission::AlreadyAdmitted);
        }
        if self.liveness.life(&existing.init) == procfs::Life::Gone {
            reclaimed.reservations.extend(ledger.remove_reservation(req.container));
            return None;
        }
        Some(Admission::Refused(Refusal::SameIdLive {
            container: req.container.to_string(),
            holder_pid: existing.init.pid,
        }))
    }

    /// The admission rule on the GPUs' numbers now (see [`crate::admission`]).
    fn decide(
        &self,
        ledger: &mut Ledger,
        checked_all: bool,
        reclaimed: &mut Reclaimed,
        req: &AdmitRequest,
        progress: &Progress,
        at: At,
    ) -> Result<Decided> {
        // Process lists matter only where live reservations are (to count what those
        // containers already allocated); everywhere else the driver's free memory says it all.
        let snapshot = self
            .inventory
            .snapshot_with_processes(&|uuid: &str| ledger.has_reservations_on(uuid))?;
        let (mut shares, choose) = shares_for(req.request, &snapshot, req.container, req.pending)?;
        // A hook of a release without limits waits and will read what this writes: the limit
        // is decided on and reserved whole, as that release would (see ledger/compat.rs), so
        // the rewrite that leaves limits out of the file cannot fill a GPU past its memory.
        if shares.iter().any(|s| s.limit.is_some()) && crate::ledger::limits_must_be_reserved(ledger) {
            for share in &mut shares {
                *share = GpuShare::new(std::mem::take(&mut share.uuid), share.limit_bytes(), 0);
            }
        }
        let decide = |ledger: &Ledger| {
            let usage = self.cgroup_usage(ledger);
            let allocated =
                attribution::attribute_measured(ledger, &snapshot.processes, procfs::pid_namespace, usage).allocated;
            admission::decide(
                ledger,
                &snapshot,
                &allocated,
                &self.rules,
                &shares,
                choose,
                progress.ticket,
                req.request.expected_duration.map(|d| d.as_millis() as u64),
                at.now,
            )
        };
        let mut decision = decide(ledger);
        if matches!(decision, Decision::NoRoom { .. }) && !checked_all {
            // Only part of a large ledger was checked; before anyone is refused or queued for
            // lack of room, every reservation is. Reclaiming only adds room, so a request
            // admitted without this would be admitted with it too.
            reclaimed.extend(ledger.reclaim_all(self.liveness));
            decision = decide(ledger);
        }
        Ok(Decided {
            decision,
            snapshot,
            shares,
            choose,
        })
    }

    /// Carries a decision out on the ledger: reserve, refuse, or queue (the ticket is taken
    /// at the first wait and kept by later ones).
    fn apply(
        &self,
        ledger: &mut Ledger,
        decided: Decided,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
        at: At,
    ) -> Step {
        let id = req.container;
        let Decided {
            decision,
            snapshot,
            shares,
            choose,
        } = decided;
        let refuse = |ledger: &mut Ledger, log: &mut Vec<Event>, kind: Kind, refusal: Refusal| {
            log.push(self.event(kind, id, &shares, refusal.to_string()));
            if kind == Kind::Timeout {
                ledger.counters.record_timeout();
            } else {
                ledger.counters.record_refuse();
            }
            Step::Done(Admission::Refused(refusal))
        };
        let shortage = match decision {
            Decision::Admit {
                shares: chosen,
                placement,
            } => {
                let queued = progress.ticket.is_some();
                let waited = if queued { at.waited } else { Duration::ZERO };
                ledger.reservations.push(Reservation {
                    container_id: id.to_string(),
                    gpus: chosen.clone(),
                    init: req.init,
                    created_unix_ms: at.now.unix_ms,
                    waited_ms: waited.as_millis() as u64,
                    bundle: req.bundle.map(Path::to_path_buf),
                    pending: req.pending,
                    // Only a confirmation takes the spec's word (see AdmitRequest::enforcement).
                    enforcement: None,
                    extra: Default::default(),
                });
                let kind = if queued { Kind::AdmitAfterWait } else { Kind::Admit };
                let mut detail = format!("{} from {}", req.request.memory, req.request.memory_source);
                if let Some(limit) = req.request.limit {
                    detail += &format!(", limit {limit} from {}", req.request.limit_source);
                }
                if queued {
                    detail += &format!(", after waiting {}", format_duration(waited));
                }
                if let Some(placement) = &placement {
                    detail += &format!("; placed {}", placement.describe());
                }
                let mut event = self.event(kind, id, &chosen, detail);
                event.placement = placement.clone();
                log.push(event);
                for note in &req.request.notes {
                    log.push(self.event(Kind::Note, id, &[], note.clone()));
                }
                ledger.counters.record_admit(queued.then_some(waited));
                let gpus = chosen
                    .iter()
                    .filter_map(|s| snapshot.by_uuid(&s.uuid).cloned())
                    .collect();
                return Step::Done(Admission::Admitted {
                    waited,
                    queued,
                    shares: chosen,
                    gpus,
                    placement,
                });
            }
            Decision::Never {
                request,
                account,
                among,
                bound,
            } => {
                let refusal = Refusal::NeverFits {
                    container: id.to_string(),
                    request,
                    account,
                    among,
                    bound,
                };
                return refuse(ledger, log, Kind::Refuse, refusal);
            }
            Decision::NoRoom {
                request,
                account,
                among,
                bound,
            } => Shortage::Memory {
                request,
                account,
                among,
                bound,
            },
            Decision::Queued { ahead } => Shortage::Queue { ahead },
        };
        let position = match shortage {
            Shortage::Queue { ahead } => ahead + 1,
            Shortage::Memory { .. } => crate::queue::position(ledger, progress.ticket, &shares),
        };
        progress.last = Some((shortage.clone(), position));
        if req.policy == Policy::Reject {
            let refusal = Refusal::NoRoom {
                container: id.to_string(),
                shortage,
            };
            return refuse(ledger, log, Kind::Refuse, refusal);
        }
        if at.waited >= req.wait_for {
            let refusal = Refusal::TimedOut {
                container: id.to_string(),
                waited: at.waited,
                position,
                shortage,
            };
            return refuse(ledger, log, Kind::Timeout, refusal);
        }
        if progress.ticket.is_none() {
            let now = at.now.unix_ms;
            let ticket = ledger.enqueue(Ticket {
                ticket: 0,
                container_id: id.to_string(),
                gpus: shares.clone(),
                waiter: req.waiter,
                enqueued_unix_ms: now,
                enqueued_boot_ms: at.now.boot_ms,
                deadline_unix_ms: now.saturating_add(req.wait_for.saturating_sub(at.waited).as_millis() as u64),
                bundle: req.bundle.map(Path::to_path_buf),
                choose,
                expected_ms: req.request.expected_duration.map(|d| d.as_millis() as u64),
                extra: Default::default(),
            });
            progress.ticket = Some(ticket);
            log.push(self.event(
                Kind::Enqueue,
                id,
                &shares,
                format!("ticket {ticket}, number {position}: {shortage}"),
            ));
        }
        Step::Wait
    }

    /// Which process a waiting container needs is gone: its init (the engine killed or deleted
    /// the container) or the runtime process running the hook (the engine cancelled the start).
    fn gone_process(&self, req: &AdmitRequest) -> Option<GoneProcess> {
        if self.liveness.life(&req.init) == procfs::Life::Gone {
            return Some(GoneProcess::Init(req.init.pid));
        }
        // A wait at create (the runtime wrapper) has no init yet, and the engine that gives up
        // on the start may leave this process alone (containerd's shim does): the engine
        // deleting the bundle is what shows it.
        if req.pending {
            if let Some(bundle) = req.bundle.filter(|b| !b.join("config.json").exists()) {
                return Some(GoneProcess::Bundle(bundle.to_path_buf()));
            }
        }
        let runtime = req.runtime?;
        (self.liveness.life(&runtime) == procfs::Life::Gone).then_some(GoneProcess::Runtime(runtime.pid))
    }

    /// Sleeps until an attempt could succeed: the deadline came, the container can no longer
    /// start (checked at least every [`CONTAINER_CHECK`]), or this waiter may be served (it
    /// heads its GPUs' queues, or someone ahead is gone) and either the ledger changed or the
    /// poll interval passed (memory freed outside vramgate shows only in the inventory).
    /// Waiters further back only read the ledger, without the lock, so a long queue costs one
    /// locked transaction (and one inventory query) per change, not one per waiter.
    fn sleep_until_worth_trying(&self, req: &AdmitRequest, progress: &Progress, watcher: &mut wait::LedgerWatcher) {
        let deadline = progress.started + req.wait_for;
        let mut next_poll = self.clock.monotonic() + self.poll_interval;
        loop {
            let now = self.clock.monotonic();
            if now >= deadline {
                return;
            }
            // Saturating: the poll time may already be past (a slow wake-up on a loaded host).
            let wake = next_poll.min(deadline).min(now + CONTAINER_CHECK);
            let changed = watcher.wait(wake.saturating_sub(now));
            if self.gone_process(req).is_some() {
                return;
            }
            let polled = self.clock.monotonic() >= next_poll;
            if polled {
                next_poll = self.clock.monotonic() + self.poll_interval;
            }
            if (changed || polled) && self.may_be_served(progress) {
                return;
            }
        }
    }

    /// An unlocked look at the ledger: is this waiter at the head of its GPUs' queues, or is
    /// someone ahead of it gone (which only a transaction can clean up), or was its ticket
    /// removed (cancelled)? What a waiter asks before it tries again; a caller that drives the
    /// attempts itself (`vramgate replay`) asks the same.
    pub fn may_be_served(&self, progress: &Progress) -> bool {
        let Ok(ledger) = self.dir.read() else { return true };
        self.may_be_served_in(&ledger, progress)
    }

    /// [`Service::may_be_served`] on a ledger the caller has read: one read for a whole
    /// queue's worth of questions.
    pub fn may_be_served_in(&self, ledger: &Ledger, progress: &Progress) -> bool {
        let Some(mine) = progress.ticket.and_then(|t| ledger.ticket(t)) else {
            return true;
        };
        let mut any_ahead = false;
        for t in crate::queue::ahead_of(ledger, Some(mine.ticket), &mine.gpus) {
            if self.liveness.life(&t.waiter) == procfs::Life::Gone {
                return true;
            }
            any_ahead = true;
        }
        !any_ahead || self.rules.backfill
    }

    /// Removes a container's reservation and ends its waits, in one transaction that also
    /// reclaims what is gone. With a `bundle` (a stop seen by the hook), only entries of that
    /// container match, never a namesake's; without (`vramgate release <id>`), the id decides.
    /// What is released is decided from the ledger alone: a container's spec may have changed
    /// since it was admitted. A container the ledger does not hold costs three `stat`s (the
    /// markers of [`crate::ledger::marks`]), or one unlocked read where they cannot say.
    /// `why` goes into the event log ("poststop", "vramgate release").
    pub fn release(&self, container: &str, bundle: Option<&Path>, why: &str) -> Result<Released> {
        let held = |ledger: &Ledger| {
            ledger.reservations.iter().any(|r| r.belongs_to(container, bundle))
                || ledger.queue.iter().any(|t| t.belongs_to(container, bundle))
        };
        // The stop of a container vramgate never held (every container, under podman's and
        // CRI-O's hooks.d) costs three `stat`s, not a read of the ledger.
        if self.dir.surely_not_held(container) {
            return Ok(Released::default());
        }
        let peek = self.dir.peek()?;
        if !held(peek.ledger()) {
            return Ok(Released::default());
        }
        let (mut tx, mut reclaimed, _) = self.dir.begin_reclaiming_after(peek, self.liveness, LOCK_TIMEOUT)?;
        let mut released = Released {
            reservation: tx.ledger.remove_reservation_of(container, bundle),
            cancelled: tx.ledger.remove_tickets_of(container, bundle),
        };
        // At poststop the container's init is already gone, so the routine reclaim that opens
        // the transaction may have taken its reservation first: it is this stop's release, and
        // logged as one (a reclaim means a stop that was never seen).
        if released.reservation.is_none() {
            if let Some(at) = reclaimed
                .reservations
                .iter()
                .position(|r| r.belongs_to(container, bundle))
            {
                released.reservation = Some(reclaimed.reservations.remove(at));
            }
        }
        // A ticket whose waiting hook is already gone (killed at the runtime's hook timeout)
        // stays an abandoned ticket in the log: this stop did not end a live wait.
        tx.ledger.counters.record_reclaimed(&reclaimed);
        if released.reservation.is_some() {
            tx.ledger.counters.record_release();
        }
        let _committed = tx.commit()?;
        let mut log = Vec::new();
        self.reclaim_events(&reclaimed, &mut log);
        if let Some(r) = &released.reservation {
            log.push(self.event(Kind::Release, &r.container_id, &r.gpus, why));
        }
        for t in &released.cancelled {
            log.push(self.event(
                Kind::Cancel,
                &t.container_id,
                &t.gpus,
                format!("ticket {} ({why})", t.ticket),
            ));
        }
        events::append(&self.dir, &log);
        Ok(released)
    }

    /// Records what holds a container to its reservation, found after it was admitted (the
    /// hook setting the driver limit), with an `enforce` event whose `detail` says how.
    /// Returns whether the reservation was there.
    pub fn set_enforcement(
        &self,
        container: &str,
        bundle: Option<&Path>,
        tier: crate::enforce::Tier,
        detail: &str,
    ) -> Result<bool> {
        let mut tx = self.dir.begin()?;
        let Some(r) = tx
            .ledger
            .reservations
            .iter_mut()
            .find(|r| r.belongs_to(container, bundle))
        else {
            return Ok(false);
        };
        r.enforcement = Some(tier);
        let event = self.event(Kind::Enforce, container, &r.gpus, format!("{tier}: {detail}"));
        let _committed = tx.commit()?;
        events::append(&self.dir, &[event]);
        Ok(true)
    }

    /// One transaction that only reclaims, checking every entry.
    pub fn gc(&self) -> Result<Reclaimed> {
        self.gc_within(LOCK_TIMEOUT)
    }

    /// [`Service::gc`], waiting at most `lock_timeout` for the ledger's lock: for a caller
    /// inside someone else's deadline (the wrapper's `delete`, inside the engine's).
    pub fn gc_within(&self, lock_timeout: Duration) -> Result<Reclaimed> {
        let mut tx = self.dir.begin_within(lock_timeout)?;
        let reclaimed = tx.ledger.reclaim_all(self.liveness);
        tx.ledger.counters.record_reclaimed(&reclaimed);
        let _committed = tx.commit()?;
        let mut log = Vec::new();
        self.reclaim_events(&reclaimed, &mut log);
        events::append(&self.dir, &log);
        Ok(reclaimed)
    }

    /// What each GPU holds, who reserved it and who waits: an unlocked read that changes
    /// nothing (entries whose process is gone are shown as such).
    pub fn snapshot(&self) -> Result<StatusReport> {
        self.snapshot_of(&self.dir.read()?)
    }

    /// [`Service::snapshot`] of a ledger the caller already read.
    pub fn snapshot_of(&self, ledger: &Ledger) -> Result<StatusReport> {
        let sources = crate::status::Sources {
            inventory: self.inventory,
            clock: self.clock,
            liveness: self.liveness,
            pid_namespace: &procfs::pid_namespace,
            cgroup_usage: self.cgroup_usage(ledger),
        };
        Ok(crate::status::build_report(
            &sources,
            &self.rules,
            self.dir.path(),
            ledger,
        )?)
    }

    /// The node as the scheduler's plugins publish it (the device plugin's healthy units, the
    /// DRA driver's capacity): the ledger read without the lock, less what the next
    /// transaction reclaims (a reservation whose container is gone holds nothing a new request
    /// must wait for), and the snapshot of that ledger. `vramgate status` shows those
    /// reservations as gone instead.
    pub fn schedulable(&self) -> Result<(Ledger, StatusReport)> {
        let mut ledger = self.dir.read()?;
        // The transactions' own rule: a process that cannot be checked keeps its entry.
        ledger.reclaim_all(self.liveness);
        let report = self.snapshot_of(&ledger)?;
        Ok((ledger, report))
    }

    fn reclaim_events(&self, reclaimed: &Reclaimed, log: &mut Vec<Event>) {
        for r in &reclaimed.reservations {
            let detail = format!("init pid {} is gone", r.init.pid);
            log.push(self.event(Kind::Reclaim, &r.container_id, &r.gpus, detail));
        }
        for t in &reclaimed.tickets {
            let detail = format!("waiting hook pid {} is gone", t.waiter.pid);
            log.push(self.event(Kind::AbandonTicket, &t.container_id, &t.gpus, detail));
        }
        for r in &reclaimed.undecided {
            let detail = format!(
                "kept: cannot tell whether init pid {} still runs (/proc unreadable)",
                r.init.pid
            );
            log.push(self.event(Kind::Note, &r.container_id, &r.gpus, detail));
        }
    }
}

/// What the admission rule concluded, with what it concluded it from.
struct Decided {
    decision: Decision,
    snapshot: Snapshot,
    shares: Vec<GpuShare>,
    choose: Option<u32>,
}

/// Whether `r` is the pending reservation `req` confirms: a hook (never the wrapper itself)
/// of the same container, with the bundle it was reserved with or run by the runtime process
/// that reserved it (the wrapper execs the runtime, which runs the hook).
fn confirms(r: &Reservation, req: &AdmitRequest) -> bool {
    !req.pending
        && r.pending
        && r.container_id == req.container
        && (r.bundle.is_some() && r.belongs_to(req.container, req.bundle) || req.runtime == Some(r.init))
}

/// Whether an attempt of `req` on `ledger` may need the GPUs' numbers: everything but a
/// confirmation and a second stage of an admitted container does.
fn needs_inventory(ledger: &Ledger, req: &AdmitRequest) -> bool {
    let confirming = ledger.reservations.iter().any(|r| confirms(r, req));
    let again = ledger.reservation(req.container).is_some_and(|r| r.init == req.init);
    !(confirming || again)
}

/// The memory each GPU share asks for on this host, resolved against the inventory. For a
/// placement (only when `placing`: the runtime wrapper at create), the shares are the
/// candidates and the count is how many to choose.
fn shares_for(
    request: &Request,
    snapshot: &Snapshot,
    container: &str,
    placing: bool,
) -> Result<(Vec<GpuShare>, Option<u32>)> {
    let request_error = |source| ServiceError::Request {
        container: container.to_string(),
        source,
    };
    let (uuids, choose) = match request.gpus.candidates(snapshot) {
        Some(_) if !placing => {
            // resolve() says why a placement cannot be made here.
            return Err(request_error(request.gpus.resolve(snapshot).expect_err("a placement")));
        }
        Some(found) => {
            let (count, uuids) = found.map_err(request_error)?;
            (uuids, Some(count))
        }
        None => (request.gpus.resolve(snapshot).map_err(request_error)?, None),
    };
    if uuids.is_empty() {
        return Err(request_error(RequestError::NoGpu {
            memory: request.memory.to_string(),
        }));
    }
    let shares = uuids
        .into_iter()
        .map(|uuid| {
            let total = snapshot.by_uuid(&uuid).map(|g| g.total).unwrap_or(0);
            let limit = request.limit_on(total).map_err(request_error)?;
            Ok(GpuShare::new(uuid, request.memory.bytes_on(total), limit))
        })
        .collect::<Result<_>>()?;
    Ok((shares, choose))
}

/// How long a request may wait in the queue: its own timeout, else the config's, never past
/// `max_wait_timeout`, nor past the caller's `budget` (a hook's timeout less its margin).
pub fn wait_for(request: &Request, config: &Config, budget: Option<Duration>) -> Duration {
    let wait = request
        .timeout
        .unwrap_or(config.wait_timeout)
        .min(config.max_wait_timeout);
    budget.map_or(wait, |budget| wait.min(budget))
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
