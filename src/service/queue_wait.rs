//! The queue wait between attempts: where an admission's wait stands, how long it may last,
//! and when a waiter wakes to try again.

use std::time::Duration;

use super::{wake, AdmitRequest, GoneProcess, Service, Shortage};
use crate::clock::Clock;
use crate::config::Config;
use crate::ledger::Ledger;
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
    /// start (checked at least every [`CONTAINER_CHECK`]), or this waiter may be served (it
    /// heads its GPUs' queues, or someone ahead is gone) and either the ledger changed or the
    /// poll interval passed (memory freed outside vramgate shows only in the inventory).
    /// Waiters further back only read the ledger, without the lock, so a long queue costs one
    /// locked transaction (and one inventory query) per change, not one per waiter.
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
        for t in crate::queue_order::ahead_of(ledger, Some(mine.ticket), &mine.gpus) {
            if self.liveness.life(&t.waiter) == procfs::Life::Gone {
                return true;
            }
            any_ahead = true;
        }
        !any_ahead || self.rules.backfill
    }
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
