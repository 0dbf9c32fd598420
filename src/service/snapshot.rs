//! The node as every reader sees it: `vramgate status`, the exporter, and the scheduler's
//! plugins.

use super::{Result, Service};
use crate::ledger::Ledger;
use crate::procfs;
use crate::status::StatusReport;

impl Service<'_> {
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
}
