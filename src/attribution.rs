//! Which container each GPU process belongs to.
//!
//! NVML lists the processes holding memory on each GPU, by host pid. A process belongs to a
//! reserved container when it lives in the same pid namespace as the container's recorded
//! init process. A container that shares the host's pid namespace cannot be told apart this
//! way; its reservation stays counted as wholly unallocated, which errs on the safe side.

use std::collections::HashMap;

use crate::admission::Allocated;
use crate::inventory::GpuProcess;
use crate::ledger::Ledger;

/// How the memory of GPU processes splits between reserved containers and everything else.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub allocated: Allocated,
    /// Processes holding GPU memory that belong to no reservation: (gpu uuid, pid, bytes).
    pub outside: Vec<GpuProcess>,
}

/// Attributes `processes` to the reservations in `ledger`, given a way to read a process's
/// pid namespace (`procfs::pid_namespace` on a real host).
pub fn attribute(ledger: &Ledger, processes: &[GpuProcess], pid_namespace: impl Fn(u32) -> Option<u64>) -> Attribution {
    let mut result = Attribution::default();
    if processes.is_empty() {
        return result;
    }
    let host_namespace = pid_namespace(std::process::id());
    let mut namespace_owner: HashMap<u64, &str> = HashMap::new();
    for r in &ledger.reservations {
        if let Some(ns) = pid_namespace(r.init.pid) {
            if Some(ns) != host_namespace {
                namespace_owner.insert(ns, &r.container_id);
            }
        }
    }
    for process in processes {
        let owner = pid_namespace(process.pid).and_then(|ns| namespace_owner.get(&ns));
        match owner {
            Some(container) => {
                *result
                    .allocated
                    .entry((container.to_string(), process.gpu_uuid.clone()))
                    .or_default() += process.used;
            }
            None => result.outside.push(process.clone()),
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{GpuShare, Reservation};
    use crate::procfs::ProcessIdentity;

    #[test]
    fn processes_are_attributed_by_pid_namespace() {
        let mut ledger = Ledger::default();
        for (id, pid) in [("a", 100), ("b", 200)] {
            ledger.reservations.push(Reservation {
                container_id: id.into(),
                gpus: vec![GpuShare {
                    uuid: "G".into(),
                    bytes: 1 << 30,
                }],
                init: ProcessIdentity { pid, start_time: 1 },
                created_unix_ms: 0,
                waited_ms: 0,
                bundle: None,
                pending: false,
                enforcement: None,
            });
        }
        let me = std::process::id();
        let ns = move |pid: u32| match pid {
            100 | 101 | 102 => Some(1000),
            200 => Some(2000),
            p if p == me => Some(1),
            _ => Some(1),
        };
        let p = |pid, used| GpuProcess {
            gpu_uuid: "G".into(),
            pid,
            used,
        };
        let a = attribute(&ledger, &[p(101, 300), p(102, 200), p(555, 50)], ns);
        assert_eq!(a.allocated[&("a".to_string(), "G".to_string())], 500);
        assert!(!a.allocated.contains_key(&("b".to_string(), "G".to_string())));
        assert_eq!(a.outside, vec![p(555, 50)]);
    }
}
