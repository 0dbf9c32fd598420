//! One attempt of an admission, and the loop of them: the locked transaction, the ticket's one
//! exit, and the steps before the admission rule (a wait that ended, a confirmation, the same
//! id already in the ledger).

use std::time::Duration;

use super::queue_wait::Progress;
use super::{wake, Admission, AdmitRequest, Refusal, Result, Service, ServiceError};
use crate::config::Policy;
use crate::events::{self, Event, Kind};
use crate::inventory::Snapshot;
use crate::ledger::{Ledger, Reclaimed, Reservation, LOCK_TIMEOUT};
use crate::procfs;

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
pub(super) struct At {
    pub(super) now: crate::clock::Stamp,
    /// How long this admission has waited so far (monotonic).
    pub(super) waited: Duration,
}

/// How long removing a ticket after a failed attempt may wait for the lock: well inside the
/// hook's margin before the runtime's timeout ([`crate::hook::HOOK_TIMEOUT_MARGIN`]).
const TICKET_REMOVAL_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

impl Service<'_> {
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
        let new_watcher = || wake::LedgerWatcher::new(&self.dir, req.pending.then_some(req.bundle).flatten());
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
        // The inventory (NVML: loading the library, nvmlInit) is opened and read before the
        // lock is taken, so no start on the host waits behind a driver's initialisation or its
        // answers: on a 4-GPU host with 160 waiters, reading every GPU's memory and processes
        // inside the lock held it so long that starts failed on the lock's timeout. Read
        // before the lock, the numbers can only err on the safe side: memory of a container
        // released meanwhile still counts as used, and a container admitted meanwhile has
        // allocated nothing in them, so its reservation counts whole. A hook that confirms
        // what the wrapper reserved at create needs no GPU numbers and never opens it.
        let mut peek = self.dir.peek()?;
        loop {
            let mut snapshot = None;
            if needs_inventory(peek.ledger(), req) {
                if !self.inventory.is_open() {
                    self.inventory.open()?;
                }
                let ledger = peek.ledger();
                snapshot = Some(
                    self.inventory
                        .snapshot_with_processes(&|uuid: &str| ledger.has_reservations_on(uuid))?,
                );
            }
            let (mut tx, mut reclaimed, checked_all) = self.dir.begin_reclaiming_after(
                peek,
                self.liveness,
                self.clock.stamp(),
                self.lock_timeout(req, progress),
            )?;
            if snapshot.is_none() && needs_inventory(&tx.ledger, req) {
                // The ledger changed between the look and the lock (what was to be confirmed
                // was released): give the lock back, read the GPUs, and look again.
                drop(tx);
                peek = self.dir.peek()?;
                continue;
            }
            let mut log = Vec::new();
            let on_disk = progress.ticket;
            let step = self.decide_on(
                &mut tx.ledger,
                checked_all,
                &mut reclaimed,
                req,
                progress,
                &mut log,
                snapshot,
            );
            // Every event of this attempt is about the requesting container: its name, read
            // from its spec once, goes with each.
            for event in log.iter_mut().filter(|e| e.container == req.container) {
                event.name.clone_from(&req.request.name);
            }
            tx.ledger
                .counters
                .record_reclaimed(reclaimed.reservations.len(), reclaimed.tickets.len());
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
            let (mut tx, reclaimed, _) =
                self.dir
                    .begin_reclaiming(self.liveness, self.clock.stamp(), TICKET_REMOVAL_LOCK_TIMEOUT)?;
            let mut log = Vec::new();
            if let Some(t) = tx.ledger.remove_ticket(ticket) {
                tx.ledger.counters.record_abandon();
                let detail = format!("ticket {ticket}: {error}");
                log.push(self.event(Kind::Cancel, container, &t.gpus, detail).named(&t.name));
            }
            tx.ledger
                .counters
                .record_reclaimed(reclaimed.reservations.len(), reclaimed.tickets.len());
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
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide_on(
        &self,
        ledger: &mut Ledger,
        checked_all: bool,
        reclaimed: &mut Reclaimed,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
        read_before_lock: Option<Snapshot>,
    ) -> Result<Step> {
        let at = At {
            now: self.clock.stamp(),
            waited: self.clock.monotonic().saturating_sub(progress.started),
        };
        // Places kept for retries last only as long as their tickets could have waited.
        ledger.forget_kept_places(at.now);
        let step = self.steps(ledger, checked_all, reclaimed, req, progress, log, at, read_before_lock);
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
        read_before_lock: Option<Snapshot>,
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
        let decided = self.decide(ledger, checked_all, reclaimed, req, progress, at, read_before_lock)?;
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
        // The engine gave up on the start (the runtime process running the hook is gone, or
        // the bundle): the place is kept for its retry, as when the waiter itself is killed.
        if let Some(t) = ledger.remove_ticket(ticket) {
            ledger.keep_place_of(&t);
        }
        progress.ticket = None;
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
        // The wrapper reserved before the container had a cgroup; its init is in it now.
        r.cgroup = req.cgroup.map(str::to_string);
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
