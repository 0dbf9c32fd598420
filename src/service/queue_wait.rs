//! The queue wait between attempts: where an admission's wait stands, how long it may last,
//! and when a waiter wakes to try again.

use std::time::Duration;

use super::{wake, AdmitRequest, GoneProcess, Service, Shortage};
use crate::admission;
use crate::clock::Clock;
use crate::config::Config;
use crate::inventory::{GpuMemory, Snapshot};
use crate::ledger::{GpuShare, Ledger};
use crate::procfs;
use crate::request::Request;

/// How often a waiter checks that its container can still start, whatever the poll interval:
/// an engine that gave up on a start must not find its memory taken by it later.
pub const CONTAINER_CHECK: Duration = Duration::from_secs(1);

/// Where one admission's queue wait stands between attempts. [`Service::admit`] keeps one;
/// a caller that drives the attempts itself ([`Service::attempt`], e.g. on a virtual clock)
/// starts one with [`Progress::start`] and hands it to each attempt.
#[derive(Debug, Default)]
pub struct Progress {
    /// Monotonic time of the first attempt.
    pub(super) started: Duration,
    pub(super) ticket: Option<u64>,
    /// What the last attempt that had to wait saw, for the timeout message.
    pub(super) last: Option<(Shortage, usize)>,
    /// What it asked for and of which GPUs, for judging its room without the lock; `None`
    /// (before the first wait, or for a claim's holder) tries on every change.
    pub(super) asked: Option<Asked>,
}

/// A waiting request as its last attempt saw it: its shares (`choose` of them for a
/// placement) and those GPUs from the inventory, of which only the totals are used
/// ([`crate::admission::ledger_has_room`]).
#[derive(Debug, Clone)]
pub(super) struct Asked {
    shares: Vec<GpuShare>,
    choose: Option<u32>,
    gpus: Vec<GpuMemory>,
}

impl Asked {
    pub(super) fn new(shares: Vec<GpuShare>, choose: Option<u32>, snapshot: &Snapshot) -> Asked {
        let gpus = shares
            .iter()
            .filter_map(|s| snapshot.by_uuid(&s.uuid).cloned())
            .collect();
        Asked { shares, choose, gpus }
    }
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

impl Service<'_> {
    /// Which process a waiting container needs is gone: its init (the engine killed or deleted
    /// the container) or the runtime process running the hook (the engine cancelled the start).
    pub(super) fn gone_process(&self, req: &AdmitRequest) -> Option<GoneProcess> {
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
    /// start (checked at least every [`CONTAINER_CHECK`]), or the ledger changed or the poll
    /// interval passed and this waiter may be served ([`Service::may_be_served_in`]: nobody
    /// alive is ahead of it by the queue's rule, and the ledger leaves it room), or, at a poll,
    /// it heads its GPUs' queues ([`heads_its_queues`]). Waiters that may not be served only
    /// read the ledger, without the lock, so a long queue costs a locked transaction (and an
    /// inventory query) per change for those that could use it, not one per waiter.
    pub(super) fn sleep_until_worth_trying(
        &self,
        req: &AdmitRequest,
        progress: &Progress,
        watcher: &mut wake::LedgerWatcher,
    ) {
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
            if (changed || polled) && self.worth_trying(progress, polled) {
                return;
            }
        }
    }

    /// Whether a waiter woken by a change (`polled` false) or its poll should take the lock:
    /// it may be served ([`Service::may_be_served_in`]), or this is a poll and it heads its
    /// GPUs' queues. An unreadable ledger is the attempt's to report.
    fn worth_trying(&self, progress: &Progress, polled: bool) -> bool {
        let Ok(ledger) = self.dir.read() else { return true };
        self.worth_trying_in(&ledger, progress, polled)
    }

    /// [`Service::worth_trying`] on a ledger read already.
    pub(super) fn worth_trying_in(&self, ledger: &Ledger, progress: &Progress, polled: bool) -> bool {
        (polled && heads_its_queues(ledger, progress)) || self.may_be_served_in(ledger, progress)
    }

    /// An unlocked look at the ledger: may this waiter be served now? See
    /// [`Service::may_be_served_in`].
    pub fn may_be_served(&self, progress: &Progress) -> bool {
        let Ok(ledger) = self.dir.read() else { return true };
        self.may_be_served_in(&ledger, progress)
    }

    /// Whether an attempt of this waiter could end other than in the same wait, as far as an
    /// unlocked read of `ledger` can tell: its ticket was removed (cancelled); or, by the
    /// queue's rule, nobody is ahead of it ([`admission::holding_back`]: without backfill every
    /// older waiter on its GPUs, with it those past the bound) or the first such one is gone
    /// (only a transaction removes it); and the ledger leaves it room by the rules the ledger
    /// alone decides ([`admission::ledger_has_room`]). What a waiter asks on every change
    /// before it takes the lock; a caller that drives the attempts itself (`vramgate replay`)
    /// asks the same.
    ///
    /// Wrong only in the harmless direction: a waiter judged to have room may still find too
    /// little free memory under the lock (a lock for nothing); one judged without room cannot
    /// be admitted on this ledger, whatever the GPUs' free memory. What the ledger cannot
    /// show, a container dead without its release, is found by the waiters that head their
    /// queues, which take the lock at every poll whatever this says ([`heads_its_queues`]);
    /// their transaction reclaims it, and the change wakes the rest.
    pub fn may_be_served_in(&self, ledger: &Ledger, progress: &Progress) -> bool {
        let Some(mine) = progress.ticket.and_then(|t| ledger.ticket(t)) else {
            return true;
        };
        // The first alive is enough: the ones behind it can only hold this waiter back more.
        if let Some(first) =
            admission::holding_back(ledger, &self.rules, &mine.gpus, Some(mine.ticket), self.clock.stamp()).next()
        {
            return self.liveness.life(&first.waiter) == procfs::Life::Gone;
        }
        progress
            .asked
            .as_ref()
            .is_none_or(|a| admission::ledger_has_room(ledger, &a.gpus, &self.rules, &a.shares, a.choose))
    }
}

/// Whether no older ticket shares a GPU with this waiter's (or it has none). The oldest
/// waiter always heads its queues, so at every poll interval at least one waiter takes the
/// lock whatever the ledger says: its transaction reclaims what the ledger cannot show gone
/// (a container that died without its release) and sees the GPUs' memory as it is now.
/// Under FIFO these are the only waiters that can be admitted, and they tried at every poll
/// before, so FIFO's polling is unchanged.
fn heads_its_queues(ledger: &Ledger, progress: &Progress) -> bool {
    let Some(mine) = progress.ticket.and_then(|t| ledger.ticket(t)) else {
        return true;
    };
    crate::queue_order::ahead_of(ledger, Some(mine.ticket), &mine.gpus)
        .next()
        .is_none()
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
