//! Which container each GPU process belongs to.
//!
//! NVML lists the processes holding memory on each GPU, by host pid. A process belongs to a
//! reserved container when it lives in the same pid namespace as the container's recorded
//! init process. A container that shares the host's pid namespace cannot be told apart this
//! way; its reservation stays counted as wholly unallocated, which errs on the safe side.
//!
//! Where the driver limit holds a container ([`crate::enforce::Tier::DriverLimit`]), the
//! driver itself counts what the container's cgroup holds on each GPU, every process of it
//! included ([`CgroupUsage`]); that figure replaces the per-process sum. It is also right where
//! pid namespaces cannot be: two reserved containers sharing one (a pod with
//! `shareProcessNamespace`), where the sum credits the last of them with both.

use std::collections::{HashMap, HashSet};

use crate::admission::Allocated;
use crate::inventory::GpuProcess;
use crate::ledger::{Ledger, Reservation};

/// How the memory of GPU processes splits between reserved containers and everything else.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub allocated: Allocated,
    /// Processes holding GPU memory that belong to no reservation: (gpu uuid, pid, bytes).
    pub outside: Vec<GpuProcess>,
    /// The (container, gpu uuid) entries of `allocated` that the driver measured: known even
    /// where no process list is (a backend that sees none).
    pub measured: HashSet<(String, String)>,
}

/// What the driver says a reserved container holds on one GPU: `nvmlDeviceGetMemoryLimits_v1`
/// for its cgroup ([`crate::enforce::driver_limit::DriverUsage`] on a host), `None` where it
/// cannot say (no driver limit on that container, a driver before R615).
pub trait CgroupUsage {
    fn used(&self, reservation: &Reservation, uuid: &str) -> Option<u64>;
}

/// No driver figures: attribution by pid namespace alone.
pub struct NoCgroupUsage;

impl CgroupUsage for NoCgroupUsage {
    fn used(&self, _: &Reservation, _: &str) -> Option<u64> {
        None
    }
}

/// [`attribute`], then every figure the driver has for a reserved container replaces its
/// per-process sum. Processes of a measured container stay inside it (never "outside").
pub fn attribute_measured(
    ledger: &Ledger,
    processes: &[GpuProcess],
    pid_namespace: impl Fn(u32) -> Option<u64>,
    usage: &dyn CgroupUsage,
) -> Attribution {
    let mut result = attribute(ledger, processes, pid_namespace);
    for r in &ledger.reservations {
        for share in &r.gpus {
            if let Some(used) = usage.used(r, &share.uuid) {
                let key = (r.container_id.clone(), share.uuid.clone());
                result.allocated.insert(key.clone(), used);
                result.measured.insert(key);
            }
        }
    }
    result
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
            let gpus = vec![GpuShare {
                uuid: "G".into(),
                bytes: 1 << 30,
                limit: None,
            }];
            ledger
                .reservations
                .push(Reservation::held(id, gpus, ProcessIdentity { pid, start_time: 1 }));
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

    /// Two containers of one pod sharing a pid namespace: by namespace, the last reservation
    /// gets both containers' memory; the driver's per-cgroup figures split it right.
    #[test]
    fn the_drivers_figures_replace_the_sums_of_a_shared_pid_namespace() {
        let mut ledger = Ledger::default();
        for (id, pid) in [("app", 100), ("sidecar", 200)] {
            let mut r = Reservation::for_test(id, "G", 4 << 30);
            r.init = ProcessIdentity { pid, start_time: 1 };
            ledger.reservations.push(r);
        }
        let me = std::process::id();
        let ns = move |pid: u32| if pid == me { Some(1) } else { Some(7) };
        let p = |pid, used| GpuProcess {
            gpu_uuid: "G".into(),
            pid,
            used,
        };
        let processes = [p(101, 3 << 30), p(201, 1 << 30)];
        let key = |id: &str| (id.to_string(), "G".to_string());
        let by_namespace = attribute(&ledger, &processes, ns);
        assert_eq!(by_namespace.allocated.get(&key("app")), None);
        assert_eq!(by_namespace.allocated[&key("sidecar")], 4 << 30, "credited with both");

        struct Driver;
        impl CgroupUsage for Driver {
            fn used(&self, r: &Reservation, _: &str) -> Option<u64> {
                Some(if r.container_id == "app" { 3 << 30 } else { 1 << 30 })
            }
        }
        let measured = attribute_measured(&ledger, &processes, ns, &Driver);
        assert_eq!(measured.allocated[&key("app")], 3 << 30);
        assert_eq!(measured.allocated[&key("sidecar")], 1 << 30);
        assert!(measured.outside.is_empty());
        assert_eq!(measured.measured.len(), 2);
        // Without figures it is the namespace attribution, unchanged.
        assert_eq!(
            attribute_measured(&ledger, &processes, ns, &NoCgroupUsage),
            by_namespace
        );
    }
}
