//! The OCI hook: admission at `createRuntime`/`prestart`, release at `poststop`.
//!
//! Everything here runs as root on every container start of the host, so the common paths are
//! short: a container with no request costs one read of its spec and no lock at all; an
//! admission or release is one locked transaction (one read, at most one atomic write).
//! Waiting (policy `wait`) never holds the lock while it sleeps.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::admission::{self, Decision, Rules};
use crate::attribution;
use crate::config::{Config, ConfigError, OnStateError, Policy};
use crate::events::{self, Event, Kind};
use crate::inventory::{self, Inventory, InventoryError, Snapshot};
use crate::ledger::{now_unix_ms, GpuShare, LedgerError, Reservation, StateDir, Ticket, Transaction};
use crate::procfs::{self, ProcessIdentity};
use crate::quantity::{format_bytes, format_duration};
use crate::request::{self, Request, RequestError};
use crate::spec::{ContainerState, SpecError, SpecView};

/// Time kept between the end of the longest wait and the runtime's hook timeout, so the hook
/// always answers with a clear refusal before the runtime kills it.
pub const HOOK_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// runc, crun and youki run `createRuntime` after the container's namespaces exist, with
    /// the init pid in the state (runc reports status "creating", crun "created").
    CreateRuntime,
    /// The legacy stage podman and CRI-O's hooks.d use; same moment, same state.
    Prestart,
    CreateContainer,
    Poststop,
}

impl Stage {
    pub fn parse(name: &str) -> Option<Stage> {
        Some(match name {
            "createRuntime" => Stage::CreateRuntime,
            "prestart" => Stage::Prestart,
            "createContainer" => Stage::CreateContainer,
            "poststop" => Stage::Poststop,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("container {container}: {source}")]
    Request { container: String, source: RequestError },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    #[error("container {container}: the runtime passed no init pid in the OCI state (status {stage:?}); run the vramgate hook at createRuntime or prestart")]
    NoPid { container: String, stage: String },
    #[error("container {container}: its init process {pid} is already gone")]
    InitGone { container: String, pid: u32 },
    /// The request was decided and refused; the message is the whole story.
    #[error("{0}")]
    Refused(String),
}

impl HookError {
    /// Errors about vramgate's own state, where `on_state_error = "fail-open"` may let the
    /// container start anyway. The user's own mistakes are always refused.
    fn is_state_error(&self) -> bool {
        matches!(self, HookError::Inventory(_) | HookError::Ledger(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    NoRequest,
    Admitted {
        waited: Duration,
    },
    AlreadyAdmitted,
    Released {
        found: bool,
    },
    /// Admitted without accounting because vramgate's state is broken and config says fail-open.
    FailedOpen(String),
}

#[derive(Debug, Clone)]
pub struct HookOptions {
    /// The timeout the runtime gives this hook, when the hook entry says so (`--hook-timeout`).
    pub hook_timeout: Option<Duration>,
    /// The config file to read (the binary takes it from `$VRAMGATE_CONFIG`).
    pub config_path: PathBuf,
}

/// Runs one hook invocation: `state_json` is what the runtime wrote on stdin.
pub fn run(stage: Stage, state_json: impl std::io::Read, options: &HookOptions) -> Result<Outcome, HookError> {
    let state = ContainerState::read_from(state_json)?;
    match stage {
        Stage::Poststop => release(&state, &options.config_path),
        _ => {
            let spec = SpecView::read_bundle(&state.bundle)?;
            if !request::has_request(&spec) {
                return Ok(Outcome::NoRequest);
            }
            let request = Request::from_spec(&spec).map_err(|source| HookError::Request {
                container: state.id.clone(),
                source,
            })?;
            let Some(request) = request else {
                return Ok(Outcome::NoRequest);
            };
            let config = Config::load_from(&options.config_path)?;
            match admit(&state, &request, &config, options) {
                Err(e) if e.is_state_error() && config.on_state_error == OnStateError::FailOpen => {
                    let message = e.to_string();
                    if let Ok(dir) = StateDir::open_or_create(&config.state_dir) {
                        events::append(&dir, &[Event::new(Kind::FailOpen, &state.id, &[], &message)]);
                    }
                    Ok(Outcome::FailedOpen(message))
                }
                other => other,
            }
        }
    }
}

/// Releases the container's reservation (and any ticket it still holds). Idempotent, and a
/// container vramgate never saw is no error.
fn release(state: &ContainerState, config_path: &Path) -> Result<Outcome, HookError> {
    // The no-request path takes no lock: a spec without a request never had a reservation.
    // If the bundle is already gone we cannot tell, so we look in the ledger.
    if let Ok(spec) = SpecView::read_bundle(&state.bundle) {
        if !request::has_request(&spec) {
            return Ok(Outcome::NoRequest);
        }
    }
    let config = Config::load_from(config_path)?;
    let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
        return Ok(Outcome::Released { found: false });
    };
    let (found, _) = release_in(&dir, &state.id, "poststop")?;
    Ok(Outcome::Released { found })
}

/// Removes a container's reservation and tickets in one transaction, reclaiming the dead too.
/// Returns whether it held a reservation, and the reservation.
pub fn release_in(dir: &StateDir, container_id: &str, why: &str) -> Result<(bool, Option<Reservation>), LedgerError> {
    let (mut tx, reclaimed, _) = dir.begin_reclaiming()?;
    let mut log = Vec::new();
    let removed = tx.ledger.remove_reservation(container_id);
    let tickets: Vec<u64> = tx
        .ledger
        .queue
        .iter()
        .filter(|t| t.container_id == container_id)
        .map(|t| t.ticket)
        .collect();
    for t in tickets {
        tx.ledger.remove_ticket(t);
    }
    tx.commit()?;
    reclaim_events(&reclaimed, &mut log);
    if let Some(r) = &removed {
        log.push(Event::new(Kind::Release, &r.container_id, &r.gpus, why));
    }
    events::append(dir, &log);
    let found = removed.is_some();
    Ok((found, removed))
}

/// `vramgate gc`: one transaction that only reclaims.
pub fn gc_in(dir: &StateDir) -> Result<crate::ledger::Reclaimed, LedgerError> {
    let mut tx = dir.begin()?;
    let reclaimed = tx.ledger.reclaim_dead();
    tx.commit()?;
    let mut log = Vec::new();
    reclaim_events(&reclaimed, &mut log);
    events::append(dir, &log);
    Ok(reclaimed)
}

fn reclaim_events<'a>(reclaimed: &'a crate::ledger::Reclaimed, log: &mut Vec<Event<'a>>) {
    for r in &reclaimed.reservations {
        log.push(Event::new(
            Kind::Reclaim,
            &r.container_id,
            &r.gpus,
            format!("init pid {} is gone", r.init.pid),
        ));
    }
    for t in &reclaimed.tickets {
        log.push(Event::new(
            Kind::AbandonTicket,
            &t.container_id,
            &t.gpus,
            format!("waiting hook pid {} is gone", t.waiter.pid),
        ));
    }
}

/// The memory each GPU share asks for on this host, resolved against the inventory.
fn shares_for(request: &Request, snapshot: &Snapshot, container: &str) -> Result<Vec<GpuShare>, HookError> {
    let uuids = request.gpus.resolve(snapshot).map_err(|source| HookError::Request {
        container: container.to_string(),
        source,
    })?;
    if uuids.is_empty() {
        return Err(HookError::Request {
            container: container.to_string(),
            source: RequestError::NoGpu {
                memory: request.memory.to_string(),
            },
        });
    }
    Ok(uuids
        .into_iter()
        .map(|uuid| {
            let total = snapshot.by_uuid(&uuid).map(|g| g.total).unwrap_or(0);
            GpuShare {
                bytes: request.memory.bytes_on(total),
                uuid,
            }
        })
        .collect())
}

/// What an admission attempt under the lock concluded.
enum Step {
    Done(Outcome),
    Wait,
}

struct Admission<'a> {
    state: &'a ContainerState,
    request: &'a Request,
    config: &'a Config,
    init: ProcessIdentity,
    policy: Policy,
    wait_for: Duration,
    inventory: Box<dyn Inventory>,
    dir: StateDir,
    rules: Rules,
    started: Instant,
    waiter: ProcessIdentity,
    ticket: Option<u64>,
    /// What the waiter last saw, for the refusal message on timeout.
    last_reason: String,
    last_position: usize,
}

fn admit(
    state: &ContainerState,
    request: &Request,
    config: &Config,
    options: &HookOptions,
) -> Result<Outcome, HookError> {
    let container = state.id.clone();
    let pid = state.init_pid().ok_or_else(|| HookError::NoPid {
        container: container.clone(),
        stage: state.status.clone(),
    })?;
    let init = ProcessIdentity::of(pid).ok_or(HookError::InitGone {
        container: container.clone(),
        pid,
    })?;
    let policy = request.policy.unwrap_or(config.policy);
    let mut wait_for = request
        .timeout
        .unwrap_or(config.wait_timeout)
        .min(config.max_wait_timeout);
    if let Some(hook_timeout) = options.hook_timeout {
        wait_for = wait_for.min(hook_timeout.saturating_sub(HOOK_TIMEOUT_MARGIN));
    }
    let dir = StateDir::open_or_create(&config.state_dir)?;
    let inventory = inventory::open(config)?;
    let waiter = ProcessIdentity::current().ok_or(HookError::InitGone {
        container: container.clone(),
        pid: std::process::id(),
    })?;
    let mut admission = Admission {
        state,
        request,
        config,
        init,
        policy,
        wait_for,
        inventory,
        dir,
        rules: Rules::from_config(config),
        started: Instant::now(),
        waiter,
        ticket: None,
        last_reason: String::new(),
        last_position: 0,
    };
    let mut watcher = None;
    loop {
        match admission.attempt()? {
            Step::Done(outcome) => return Ok(outcome),
            Step::Wait => {
                let watcher = watcher.get_or_insert_with(|| LedgerWatcher::new(admission.dir.path()));
                admission.sleep_until_worth_trying(watcher);
            }
        }
    }
}

impl Admission<'_> {
    fn deadline_passed(&self) -> bool {
        self.started.elapsed() >= self.wait_for
    }

    /// One locked transaction: reclaim, decide, and admit, refuse or (re)queue.
    fn attempt(&mut self) -> Result<Step, HookError> {
        let id = self.state.id.as_str();
        let (mut tx, mut reclaimed, checked_all) = self.dir.begin_reclaiming()?;
        let mut log: Vec<Event> = Vec::new();

        // A reservation under this id from a container that is gone (outside the routine
        // reclaim's window in a large ledger) is reclaimed now, not mistaken for a live one.
        if let Some(existing) = tx.ledger.reservation(id) {
            if existing.init != self.init && !existing.init.is_alive() {
                let gone = tx.ledger.remove_reservation(id).expect("found above");
                reclaimed.reservations.push(gone);
            }
        }
        if let Some(existing) = tx.ledger.reservation(id) {
            // The same container seen at a second stage (createRuntime and prestart both
            // configured): admission is idempotent.
            if existing.init == self.init {
                self.drop_ticket(&mut tx);
                tx.commit()?;
                reclaim_events(&reclaimed, &mut log);
                events::append(&self.dir, &log);
                return Ok(Step::Done(Outcome::AlreadyAdmitted));
            }
            let holder = existing.init.pid;
            drop(tx);
            return Err(HookError::Refused(format!(
                "vramgate: refused container {id}: a live container with the same id (init pid {holder}) already holds a reservation"
            )));
        }

        // Process lists matter only where live reservations are (to count what those
        // containers already allocated); everywhere else the driver's free memory says it all.
        let reserved_on = |uuid: &str| {
            tx.ledger
                .reservations
                .iter()
                .any(|r| r.gpus.iter().any(|g| g.uuid == uuid))
        };
        let snapshot = self.inventory.snapshot_with_processes(&reserved_on)?;
        let shares = match shares_for(self.request, &snapshot, id) {
            Ok(s) => s,
            Err(e) => {
                self.drop_ticket(&mut tx);
                tx.commit()?;
                return Err(e);
            }
        };
        let now = now_unix_ms();
        let decide = |ledger: &crate::ledger::Ledger| {
            let allocated = attribution::attribute(ledger, &snapshot.processes, procfs::pid_namespace).allocated;
            admission::decide(ledger, &snapshot, &allocated, &self.rules, &shares, self.ticket, now)
        };
        let mut decision = decide(&tx.ledger);
        if matches!(decision, Decision::NoRoom { .. }) && !checked_all {
            // Only part of a large ledger was checked; before anyone is refused or queued for
            // lack of room, every reservation is. Reclaiming only adds room, so a request
            // admitted without this would be admitted with it too.
            reclaimed.extend(tx.ledger.reclaim_dead());
            decision = decide(&tx.ledger);
        }
        let waited = self.started.elapsed();
        let outcome = match decision {
            Decision::Admit => {
                let waited_in_queue = self.ticket.is_some();
                self.drop_ticket(&mut tx);
                tx.ledger.reservations.push(Reservation {
                    container_id: id.to_string(),
                    gpus: shares.clone(),
                    init: self.init,
                    created_unix_ms: now,
                    waited_ms: if waited_in_queue { waited.as_millis() as u64 } else { 0 },
                });
                tx.commit()?;
                let kind = if waited_in_queue {
                    Kind::AdmitAfterWait
                } else {
                    Kind::Admit
                };
                let mut detail = format!("{} from {}", self.request.memory, self.request.memory_source);
                if waited_in_queue {
                    detail += &format!(", after waiting {}", format_duration(waited));
                }
                log.push(Event::new(kind, id, &shares, detail));
                for note in &self.request.notes {
                    log.push(Event::new(Kind::Note, id, &[], note.clone()));
                }
                Ok(Step::Done(Outcome::Admitted { waited }))
            }
            Decision::Never { request, account } => {
                self.drop_ticket(&mut tx);
                tx.commit()?;
                let message = format!(
                    "vramgate: refused container {id}: it requests {} on GPU {}, more than the GPU can ever hold: {}; request less (annotation {}) or run it on a larger GPU",
                    format_bytes(request),
                    account.index,
                    account.describe(),
                    request::MEMORY_ANNOTATION,
                );
                log.push(Event::new(Kind::Refuse, id, &shares, message.clone()));
                Err(HookError::Refused(message))
            }
            Decision::NoRoom { .. } | Decision::Queued { .. } => {
                let (reason, position) = match &decision {
                    Decision::NoRoom { request, account } => (
                        format!("it requests {} and {}", format_bytes(*request), account.describe()),
                        queue_position(&tx.ledger, self.ticket, &shares),
                    ),
                    Decision::Queued { ahead } => (
                        format!(
                            "{ahead} container{} asked first and {} waiting for the same GPU",
                            if *ahead == 1 { "" } else { "s" },
                            if *ahead == 1 { "is" } else { "are" }
                        ),
                        ahead + 1,
                    ),
                    _ => unreachable!("matched above"),
                };
                self.last_reason = reason.clone();
                self.last_position = position;
                if self.policy == Policy::Reject {
                    tx.commit()?;
                    let message = format!(
                        "vramgate: refused container {id}: {reason}; retry when a container on that GPU stops, request less, or set {}=wait to queue",
                        request::POLICY_ANNOTATION
                    );
                    log.push(Event::new(Kind::Refuse, id, &shares, message.clone()));
                    Err(HookError::Refused(message))
                } else if self.deadline_passed() {
                    self.drop_ticket(&mut tx);
                    tx.commit()?;
                    let message = format!(
                        "vramgate: refused container {id}: waited {} (its timeout) and was still number {position} in the queue: {reason}; raise {} or retry later",
                        format_duration(waited),
                        request::TIMEOUT_ANNOTATION
                    );
                    log.push(Event::new(Kind::Timeout, id, &shares, message.clone()));
                    Err(HookError::Refused(message))
                } else {
                    if self.ticket.is_none() {
                        let ticket = tx.ledger.next_ticket;
                        tx.ledger.next_ticket += 1;
                        tx.ledger.queue.push(Ticket {
                            ticket,
                            container_id: id.to_string(),
                            gpus: shares.clone(),
                            waiter: self.waiter,
                            enqueued_unix_ms: now,
                            deadline_unix_ms: now + self.wait_for.saturating_sub(waited).as_millis() as u64,
                        });
                        self.ticket = Some(ticket);
                        log.push(Event::new(
                            Kind::Enqueue,
                            id,
                            &shares,
                            format!("ticket {ticket}, number {position}: {reason}"),
                        ));
                    }
                    tx.commit()?;
                    Ok(Step::Wait)
                }
            }
        };
        reclaim_events(&reclaimed, &mut log);
        events::append(&self.dir, &log);
        drop(tx);
        outcome
    }

    fn drop_ticket(&mut self, tx: &mut Transaction) {
        if let Some(ticket) = self.ticket.take() {
            tx.ledger.remove_ticket(ticket);
        }
    }

    /// Sleeps until a transaction could succeed: the deadline came, or this waiter may be
    /// served (it heads its GPUs' queues, or someone ahead is dead) and either the ledger
    /// changed or the poll interval passed (memory freed outside vramgate shows only in the
    /// inventory). Waiters further back only read the ledger, without the lock, so a long queue
    /// costs one locked transaction (and one inventory query) per change, not one per waiter.
    fn sleep_until_worth_trying(&mut self, watcher: &mut LedgerWatcher) {
        let poll = self.config.queue.poll_interval;
        let deadline = self.started + self.wait_for;
        let mut next_poll = Instant::now() + poll;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let changed = watcher.wait(next_poll.min(deadline) - now);
            let polled = Instant::now() >= next_poll;
            if polled {
                next_poll = Instant::now() + poll;
            }
            if (changed || polled) && self.may_be_served() {
                return;
            }
        }
    }

    /// An unlocked look at the ledger: is this waiter at the head of its GPUs' queues (or is
    /// someone ahead of it dead, which only a transaction can clean up)?
    fn may_be_served(&self) -> bool {
        let Ok(ledger) = self.dir.read() else { return true };
        let Some(mine) = ledger.queue.iter().find(|t| Some(t.ticket) == self.ticket) else {
            return true;
        };
        let ahead = ledger
            .queue
            .iter()
            .filter(|t| t.ticket < mine.ticket && t.gpus.iter().any(|g| mine.gpus.iter().any(|m| m.uuid == g.uuid)));
        let mut any_ahead = false;
        for t in ahead {
            if !t.waiter.is_alive() {
                return true;
            }
            any_ahead = true;
        }
        !any_ahead || self.config.queue.backfill
    }
}

/// 1-based place in the queue this request would have (or has) on its GPUs.
fn queue_position(ledger: &crate::ledger::Ledger, ticket: Option<u64>, shares: &[GpuShare]) -> usize {
    1 + ledger
        .queue
        .iter()
        .filter(|t| ticket.is_none_or(|mine| t.ticket < mine))
        .filter(|t| t.gpus.iter().any(|g| shares.iter().any(|s| s.uuid == g.uuid)))
        .count()
}

/// Wakes a waiter when the ledger is replaced (every commit renames a new file into place).
/// Without inotify (exhausted watches) it degrades to plain sleeping for the poll interval.
struct LedgerWatcher {
    inotify: Option<nix::sys::inotify::Inotify>,
}

impl LedgerWatcher {
    fn new(dir: &std::path::Path) -> LedgerWatcher {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .ok()
            .filter(|i| i.add_watch(dir, AddWatchFlags::IN_MOVED_TO).is_ok());
        LedgerWatcher { inotify }
    }

    /// Waits up to `timeout`; true when the ledger was replaced meanwhile.
    fn wait(&mut self, timeout: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some(inotify) = &self.inotify else {
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
                    changed |= events
                        .iter()
                        .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new(crate::ledger::LEDGER_FILE)));
                }
                changed
            }
            _ => false,
        }
    }
}
