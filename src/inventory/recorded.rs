//! NVML answers recorded on a GPU host (`vramgate status --record FILE`), replayed on hosts
//! without one. The tests use it to run attribution, admission and status on what a real
//! driver said while real GPU containers were running.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Inventory, InventoryError, Snapshot};
use crate::ledger::Ledger;

/// One moment of a GPU host: what NVML reported, the ledger, and the pid namespace of every
/// process involved (attribution needs them, and they cannot be read back later).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RecordedHost {
    /// What was running when this was recorded.
    #[serde(default)]
    pub note: String,
    /// The inventory's own description ("NVML (driver 580.xx)").
    pub inventory: String,
    pub snapshot: Snapshot,
    #[serde(default)]
    pub ledger: Ledger,
    /// The pid namespace (inode of `/proc/<pid>/ns/pid`) of each GPU process and of each
    /// reservation's init process.
    pub pid_namespaces: BTreeMap<u32, u64>,
    /// The namespace of the recording process itself: the host's.
    pub host_pid_namespace: u64,
}

impl RecordedHost {
    /// Records the host now: a full snapshot (processes of every device), the ledger, and the
    /// namespaces behind them.
    pub fn capture(inventory: &dyn Inventory, ledger: &Ledger, note: &str) -> Result<RecordedHost, InventoryError> {
        let snapshot = inventory.snapshot()?;
        let pids = snapshot
            .processes
            .iter()
            .map(|p| p.pid)
            .chain(ledger.reservations.iter().map(|r| r.init.pid));
        let pid_namespaces = pids
            .filter_map(|pid| Some((pid, crate::procfs::pid_namespace(pid)?)))
            .collect();
        Ok(RecordedHost {
            note: note.to_string(),
            inventory: inventory.describe(),
            snapshot,
            ledger: ledger.clone(),
            pid_namespaces,
            host_pid_namespace: crate::procfs::pid_namespace(std::process::id()).unwrap_or(0),
        })
    }

    pub fn load(path: &Path) -> Result<RecordedHost, InventoryError> {
        let text = std::fs::read_to_string(path).map_err(|e| InventoryError::Static {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| InventoryError::Static {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// The recorded `pid_namespace` function, for `attribution::attribute`. The calling
    /// process's own pid answers with the recorded host namespace.
    pub fn pid_namespace(&self) -> impl Fn(u32) -> Option<u64> + '_ {
        let me = std::process::id();
        move |pid| {
            if pid == me {
                Some(self.host_pid_namespace)
            } else {
                self.pid_namespaces.get(&pid).copied()
            }
        }
    }
}

/// An inventory that answers with a recorded snapshot.
pub struct RecordedInventory {
    pub host: RecordedHost,
}

impl Inventory for RecordedInventory {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        Ok(self.host.snapshot.clone())
    }

    fn snapshot_with_processes(&self, processes_on: &dyn Fn(&str) -> bool) -> Result<Snapshot, InventoryError> {
        let mut snapshot = self.host.snapshot.clone();
        snapshot.processes.retain(|p| processes_on(&p.gpu_uuid));
        Ok(snapshot)
    }

    fn describe(&self) -> String {
        format!("recorded {}", self.host.inventory)
    }

    fn sees_processes(&self) -> bool {
        true
    }
}
