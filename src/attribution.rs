//! Which container each GPU process belongs to.
//!
//! NVML lists the processes holding memory on each GPU, by host pid. A process belongs to a
//! reserved container when it lies in the container's cgroup (or below it), as recorded at
//! admission from the init's `/proc/<pid>/cgroup` ([`crate::ledger::Reservation::cgroup`]):
//! in whatever pid namespace it runs, so a process a container starts in a nested namespace
//! (`unshare -Urpf`) is still the container's. A container without a recorded cgroup is found
//! by its init's pid namespace, as before cgroups were recorded; one that also shares the
//! host's pid namespace cannot be told apart this way, and its reservation stays counted as
//! wholly unallocated, which errs on the safe side. [`Owner::owns`] is that rule, for status,
//! the metrics, admission and `vramgate watch` alike.
//!
//! Containers whose processes cannot be told apart (cgroups that are one or nested; without
//! cgroups, inits sharing a pid namespace: a pod with `shareProcessNamespace`) are named in
//! [`Attribution::shared`] and judged as one ([`crate::status::held_together`]).
//!
//! Every path is compared as this process reads it, relative to its own cgroup namespace: the
//! recorded one was read by the hook in the host's. [`check_cgroup_namespace`] refuses a reader
//! in a namespace of its own, where no process would ever be found in its container; a single
//! path that still climbs out of the reader's namespace is [`Attribution::unattributed`]: no
//! container's, and not outside vramgate either.
//!
//! Where the driver limit holds a container ([`crate::enforce::Tier::DriverLimit`]), the
//! driver itself counts what the container's cgroup holds on each GPU, every process of it
//! included ([`CgroupUsage`]); that figure replaces the per-process sum.

use std::collections::{HashMap, HashSet};

use crate::admission::Allocated;
use crate::inventory::{GpuProcess, Inventory};
use crate::ledger::{Ledger, Reservation};
use crate::procfs::{self, CgroupMatch};

/// How the memory of GPU processes splits between reserved containers and everything else.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub allocated: Allocated,
    /// Processes holding GPU memory that belong to no reservation: (gpu uuid, pid, bytes).
    pub outside: Vec<GpuProcess>,
    /// The (container, gpu uuid) entries of `allocated` that the driver measured: known even
    /// where no process list is (a backend that sees none).
    pub measured: HashSet<(String, String)>,
    /// Reservations whose processes cannot be told apart, by GPU: (gpu uuid, the containers,
    /// two or more, whose inits share one pid namespace and that hold a share on that GPU, none
    /// of them measured there by the driver). A pod with `shareProcessNamespace`, or a
    /// container started in another's namespace. Their processes are credited to one of them
    /// (`allocated` stays what admission counts: each reservation at least its share), and
    /// they are judged as one: their use added up against their limits added up
    /// ([`crate::status::held_together`]), so that neither is judged, nor stopped, for the
    /// other's use.
    pub shared: Vec<(String, Vec<String>)>,
    /// Processes owned by no reservation whose cgroup, in a hierarchy some reservation
    /// recorded, climbs out of this process's cgroup namespace ([`CgroupMatch::CannotTell`]):
    /// whether they are a container's cannot be told, so they are neither credited to one nor
    /// listed `outside`. Their containers' reservations stay counted as not yet allocated (as
    /// admission counts them, the safe side), and the watch stops none of them. Where every
    /// process would be one, [`check_cgroup_namespace`] refuses to start instead.
    pub unattributed: Vec<Unattributed>,
}

/// A GPU process whose cgroup could not be compared with the recorded ones
/// ([`Attribution::unattributed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unattributed {
    pub process: GpuProcess,
    /// The line of its `/proc/<pid>/cgroup` that climbs, as this process read it.
    pub cgroup: String,
}

impl Attribution {
    /// The groups of [`Attribution::shared`] on GPU `uuid`.
    pub fn shared_on<'a>(&'a self, uuid: &'a str) -> impl Iterator<Item = &'a [String]> + 'a {
        self.shared
            .iter()
            .filter(move |(u, _)| u == uuid)
            .map(|(_, members)| members.as_slice())
    }
}

/// What to set where a reader runs in a cgroup namespace of its own: the end of each
/// [`ForeignCgroupView`] line. containerd's CRI plugin and CRI-O give every container that is
/// not privileged a cgroup namespace of its own on cgroup v2 (on v1 none), and a pod has no
/// field for it: `hostPID` leaves it as it is, `privileged: true` is the one way to the host's.
/// docker and podman do the same on cgroup v2 unless told `--cgroupns=host`.
const RUN_IN_THE_HOSTS_CGROUP_NAMESPACE: &str = "run it in the host's cgroup namespace: under Kubernetes a privileged container (securityContext.privileged: true; containerd and CRI-O give every other container on cgroup v2 a cgroup namespace of its own, hostPID or not), under docker or podman `run --cgroupns=host`";

/// Why this process cannot attribute GPU processes to containers by cgroup
/// ([`check_cgroup_namespace`]); each `Display` is the one line a binary exits with.
#[derive(Debug, thiserror::Error)]
pub enum ForeignCgroupView {
    #[error("this process is in a cgroup namespace of its own (/proc/self/ns/cgroup is cgroup:[{own}], pid 1's /proc/1/ns/cgroup is cgroup:[{host}]): it reads every other process's cgroup relative to its own, so no GPU process would be found in the cgroup its container recorded; {}", RUN_IN_THE_HOSTS_CGROUP_NAMESPACE)]
    OwnNamespace { own: u64, host: u64 },
    #[error("/proc/1/cgroup reads {line:?} here, a path above this process's cgroup namespace: it reads every other process's cgroup relative to its own, so no GPU process would be found in the cgroup its container recorded; {}", RUN_IN_THE_HOSTS_CGROUP_NAMESPACE)]
    Climbs { line: String },
    #[error("cannot read /proc/1/cgroup ({source}) to tell whether this process reads cgroups as the host does; run it with the host's /proc (in a pod: hostPID: true)")]
    Unreadable { source: std::io::Error },
}

/// Whether this process may attribute the GPU processes `inventory` lists to containers: the
/// one decision every program that does so asks when it opens its inventory (`vramgate watch`,
/// `vramgate exporter`, `status` and `metrics`, the device plugin, the DRA driver), and refuses
/// to run on.
///
/// Why: a reservation records its container's cgroup as the hook read it, in the runtime's
/// cgroup namespace, the host's. The kernel writes every path of `/proc/<pid>/cgroup`
/// relative to the *reader's* namespace, so a reader in one of its own reads each process
/// outside its own subtree as `/../..`: none in its container's cgroup. Every GPU process
/// would count as outside vramgate, the watch would stop no one, and the plugins would count
/// what containers allocated twice (once as outside, once as not yet allocated) and publish
/// less than there is, all silently.
///
/// The test: this process's cgroup namespace is pid 1's. Pid 1 is the host's init where these
/// programs run as they must, in the host's pid namespace (NVML names processes by host pid;
/// the chart's pods have `hostPID`), and the runtime and its hooks run in its cgroup
/// namespace. A cgroup namespace covers every hierarchy at once, so the test holds alike on
/// cgroup v1, v2 and hybrid hosts, whatever is mounted at /sys/fs/cgroup (the own cgroup
/// reading `/` would not do: so does a process of the host's root cgroup). Where either
/// namespace cannot be read (pid 1's needs ptrace read access: no `CAP_SYS_PTRACE`, an LSM
/// that denies it; a kernel without cgroup namespaces has no link), the fallback is the
/// symptom itself: pid 1's cgroup, as this process reads `/proc/1/cgroup` (readable by
/// anyone), climbs ([`procfs::climbing_line`]). It lets pass a namespace made in the root
/// cgroup, which reads every path as the host does anyway, and misses only one made in pid 1's
/// own cgroup (no container's).
///
/// An inventory that lists no processes (the static one) attributes nothing, so it runs
/// anywhere: the chart's `privileged: false` on nodes of a static inventory stays possible.
pub fn check_cgroup_namespace(inventory: &dyn Inventory) -> Result<(), ForeignCgroupView> {
    if !inventory.sees_processes() {
        return Ok(());
    }
    cgroup_view(procfs::cgroup_namespace("self"), procfs::cgroup_namespace("1"), || {
        std::fs::read_to_string("/proc/1/cgroup")
    })
}

/// [`check_cgroup_namespace`]'s rule on what it read: this process's cgroup namespace, pid
/// 1's, and a way to read pid 1's `/proc/<pid>/cgroup` for the fallback.
fn cgroup_view(
    own: std::io::Result<u64>,
    host: std::io::Result<u64>,
    init_cgroups: impl FnOnce() -> std::io::Result<String>,
) -> Result<(), ForeignCgroupView> {
    if let (Ok(own), Ok(host)) = (&own, &host) {
        if own == host {
            return Ok(());
        }
        return Err(ForeignCgroupView::OwnNamespace { own: *own, host: *host });
    }
    let text = init_cgroups().map_err(|source| ForeignCgroupView::Unreadable { source })?;
    match procfs::climbing_line(&text) {
        Some(line) => Err(ForeignCgroupView::Climbs { line: line.to_string() }),
        None => Ok(()),
    }
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
    // The driver's figure is the container's own: one measured is judged alone.
    let measured = &result.measured;
    for (uuid, members) in &mut result.shared {
        members.retain(|id| !measured.contains(&(id.clone(), uuid.clone())));
    }
    result.shared.retain(|(_, members)| members.len() > 1);
    result
}

/// Attributes `processes` to the reservations in `ledger`, given a way to read a process's
/// pid namespace (`procfs::pid_namespace` on a real host); cgroups are read from `/proc`
/// ([`attribute_in`]), and only where a reservation recorded one.
pub fn attribute(ledger: &Ledger, processes: &[GpuProcess], pid_namespace: impl Fn(u32) -> Option<u64>) -> Attribution {
    attribute_in(ledger, processes, &pid_namespace, &crate::procfs::cgroups)
}

/// A reservation as processes are matched against it: by its recorded cgroup where it has
/// one, else by its init's pid namespace (not the host's).
pub struct Owner<'l> {
    pub reservation: &'l Reservation,
    /// Its init's pid namespace, where it has no cgroup recorded and that is not the host's.
    pub pid_namespace: Option<u64>,
}

impl<'l> Owner<'l> {
    /// `r`, its namespace read with `pid_namespace` where it needs one (`host`: the host's).
    pub fn of(r: &'l Reservation, pid_namespace: &dyn Fn(u32) -> Option<u64>, host: Option<u64>) -> Owner<'l> {
        let ns = match r.cgroup {
            Some(_) => None,
            None => pid_namespace(r.init.pid).filter(|ns| Some(*ns) != host),
        };
        Owner {
            reservation: r,
            pid_namespace: ns,
        }
    }

    /// Whether a process that lives in `cgroups` (its `/proc/<pid>/cgroup` text) and pid
    /// namespace `ns` is this container's ([`CgroupMatch::Inside`]): the one rule attribution,
    /// status, the metrics and `vramgate watch`'s stop all follow. By cgroup where one was
    /// recorded (a process in a namespace nested inside the container stays in its cgroup; one
    /// that merely shares its namespace from another cgroup is not its), by pid namespace
    /// otherwise. [`CgroupMatch::CannotTell`] where its cgroup climbs out of this process's
    /// cgroup namespace ([`procfs::cgroup_match`]); a process whose cgroup cannot be read (it
    /// is gone) is not its.
    pub fn owns(&self, cgroups: Option<&str>, ns: Option<u64>) -> CgroupMatch {
        match &self.reservation.cgroup {
            Some(recorded) => cgroups.map_or(CgroupMatch::Outside, |text| procfs::cgroup_match(recorded, text)),
            None if self.pid_namespace.is_some() && ns == self.pid_namespace => CgroupMatch::Inside,
            None => CgroupMatch::Outside,
        }
    }

    /// How deep its cgroup lies: of nested owners, the innermost takes a process.
    fn depth(&self) -> usize {
        self.reservation.cgroup.as_ref().map_or(0, String::len)
    }
}

/// [`attribute`] with the way to read a process's cgroups (`/proc/<pid>/cgroup` on a host)
/// given too.
pub fn attribute_in(
    ledger: &Ledger,
    processes: &[GpuProcess],
    pid_namespace: &dyn Fn(u32) -> Option<u64>,
    cgroups: &dyn Fn(u32) -> Option<String>,
) -> Attribution {
    let mut result = Attribution::default();
    if processes.is_empty() {
        return result;
    }
    let host_namespace = pid_namespace(std::process::id());
    let owners: Vec<Owner> = ledger
        .reservations
        .iter()
        .map(|r| Owner::of(r, pid_namespace, host_namespace))
        .collect();
    let any_cgroup = owners.iter().any(|o| o.reservation.cgroup.is_some());
    for process in processes {
        let text = if any_cgroup { cgroups(process.pid) } else { None };
        let ns = pid_namespace(process.pid);
        let has_share = |o: &&Owner| o.reservation.gpus.iter().any(|s| s.uuid == process.gpu_uuid);
        let matched: Vec<CgroupMatch> = owners.iter().map(|o| o.owns(text.as_deref(), ns)).collect();
        let mine: Vec<&Owner> = owners
            .iter()
            .zip(&matched)
            .filter(|(_, m)| **m == CgroupMatch::Inside)
            .map(|(o, _)| o)
            .collect();
        // Of several owners (nested cgroups, a shared namespace: judged together, see
        // `shared`), the innermost that holds a share on the process's GPU, the last of equals;
        // else the innermost.
        let innermost = |list: &mut dyn Iterator<Item = &&Owner>| -> Option<usize> {
            let mut best: Option<(usize, usize)> = None;
            for (at, o) in list.enumerate() {
                if best.is_none_or(|(_, depth)| o.depth() >= depth) {
                    best = Some((at, o.depth()));
                }
            }
            best.map(|(at, _)| at)
        };
        let on_gpu: Vec<&Owner> = mine.iter().copied().filter(|o| has_share(o)).collect();
        let owner = match innermost(&mut on_gpu.iter()) {
            Some(at) => Some(on_gpu[at]),
            None => innermost(&mut mine.iter()).map(|at| mine[at]),
        };
        match owner {
            Some(o) => {
                *result
                    .allocated
                    .entry((o.reservation.container_id.clone(), process.gpu_uuid.clone()))
                    .or_default() += process.used;
            }
            // Never a quiet "outside": see `Attribution::unattributed`.
            None if matched.contains(&CgroupMatch::CannotTell) => result.unattributed.push(Unattributed {
                process: process.clone(),
                cgroup: text
                    .as_deref()
                    .and_then(procfs::climbing_line)
                    .unwrap_or_default()
                    .to_string(),
            }),
            None => result.outside.push(process.clone()),
        }
    }
    result.shared = shared_groups(&owners);
    result
}

/// The owners that cannot be told apart, by GPU (see [`Attribution::shared`]): those whose
/// recorded cgroups are one or nested, and those without one whose inits share a pid namespace.
fn shared_groups(owners: &[Owner]) -> Vec<(String, Vec<String>)> {
    // Groups of owner indices, joined pairwise.
    let mut parent: Vec<usize> = (0..owners.len()).collect();
    fn root(parent: &mut [usize], mut at: usize) -> usize {
        while parent[at] != at {
            parent[at] = parent[parent[at]];
            at = parent[at];
        }
        at
    }
    fn join(parent: &mut [usize], a: usize, b: usize) {
        let (a, b) = (root(parent, a), root(parent, b));
        parent[a] = b;
    }
    let mut by_namespace: HashMap<u64, usize> = HashMap::new();
    for (at, o) in owners.iter().enumerate() {
        if let Some(ns) = o.pid_namespace {
            if let Some(&first) = by_namespace.get(&ns) {
                join(&mut parent, first, at);
            } else {
                by_namespace.insert(ns, at);
            }
        }
    }
    // Sorted, a cgroup's descendants follow it: each is compared with those after it while
    // they start with it, not with every other.
    let mut with_cgroup: Vec<(&str, usize)> = owners
        .iter()
        .enumerate()
        .filter_map(|(at, o)| Some((o.reservation.cgroup.as_deref()?, at)))
        .collect();
    with_cgroup.sort_unstable();
    for (i, &(line, at)) in with_cgroup.iter().enumerate() {
        for &(other, other_at) in with_cgroup[i + 1..].iter().take_while(|(l, _)| l.starts_with(line)) {
            if crate::procfs::cgroups_nest(line, other) {
                join(&mut parent, at, other_at);
            }
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for at in 0..owners.len() {
        let r = root(&mut parent, at);
        groups.entry(r).or_default().push(at);
    }
    let mut shared = Vec::new();
    for members in groups.values().filter(|m| m.len() > 1) {
        let mut uuids: Vec<&str> = members
            .iter()
            .flat_map(|&at| owners[at].reservation.gpus.iter().map(|s| s.uuid.as_str()))
            .collect();
        uuids.sort_unstable();
        uuids.dedup();
        for uuid in uuids {
            let on_gpu: Vec<String> = members
                .iter()
                .map(|&at| owners[at].reservation)
                .filter(|r| r.gpus.iter().any(|s| s.uuid == uuid))
                .map(|r| r.container_id.clone())
                .collect();
            if on_gpu.len() > 1 {
                shared.push((uuid.to_string(), on_gpu));
            }
        }
    }
    shared.sort();
    shared
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

    /// The start-up rule: the namespace compared where both can be read; else pid 1's cgroup
    /// as read here, which climbs only from a namespace of this process's own.
    #[test]
    fn a_reader_in_a_cgroup_namespace_of_its_own_is_refused_with_what_to_set() {
        fn denied<T>() -> std::io::Result<T> {
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        }
        let unread = || -> std::io::Result<String> { panic!("the namespaces decided") };
        assert!(cgroup_view(Ok(7), Ok(7), unread).is_ok());
        let own = cgroup_view(Ok(8), Ok(7), unread).unwrap_err();
        assert!(
            matches!(own, ForeignCgroupView::OwnNamespace { own: 8, host: 7 }),
            "{own:?}"
        );
        let line = own.to_string();
        assert!(
            line.contains("cgroup:[8]")
                && line.contains("cgroup:[7]")
                && line.ends_with("under Kubernetes a privileged container (securityContext.privileged: true; containerd and CRI-O give every other container on cgroup v2 a cgroup namespace of its own, hostPID or not), under docker or podman `run --cgroupns=host`")
                && !line.contains('\n'),
            "{line}"
        );
        // Pid 1's namespace unreadable (no CAP_SYS_PTRACE over it): the fallback.
        let hybrid_host = "9:name=systemd:/init.scope\n8:pids:/\n0::/init.scope\n";
        assert!(cgroup_view(Ok(8), denied(), || Ok(hybrid_host.to_string())).is_ok());
        let from_a_pod = "9:name=systemd:/../../../init.scope\n8:pids:/../..\n0::/../../../init.scope\n";
        let climbs = cgroup_view(Ok(8), denied(), || Ok(from_a_pod.to_string())).unwrap_err();
        assert!(
            climbs.to_string().starts_with(
                "/proc/1/cgroup reads \"9:name=systemd:/../../../init.scope\" here, a path above this process's cgroup namespace"
            ),
            "{climbs}"
        );
        // No link of its own either (a kernel without cgroup namespaces): the same fallback.
        assert!(cgroup_view(denied(), denied(), || Ok(hybrid_host.to_string())).is_ok());
        let unreadable = cgroup_view(Ok(8), denied(), denied::<String>).unwrap_err();
        assert!(
            unreadable
                .to_string()
                .starts_with("cannot read /proc/1/cgroup (permission denied)"),
            "{unreadable}"
        );
    }

    /// A GPU process whose cgroup climbs out of the reader's namespace is no container's and
    /// not outside either: its container's reservation stays counted as unallocated.
    #[test]
    fn a_process_whose_cgroup_climbs_is_neither_a_containers_nor_outside() {
        let mut ledger = Ledger::default();
        let mut r = Reservation::for_test("c1", "G", 4 << 30);
        r.init = ProcessIdentity {
            pid: 100,
            start_time: 1,
        };
        r.cgroup = Some("0::/kubepods/pod1/c1".into());
        ledger.reservations.push(r);
        let p = |pid, used| GpuProcess {
            gpu_uuid: "G".into(),
            pid,
            used,
        };
        let cgroups = |pid: u32| -> Option<String> {
            Some(
                match pid {
                    101 => "0::/kubepods/pod1/c1\n",
                    102 => "0::/../../pod1/c1\n",
                    _ => "0::/system.slice/other\n",
                }
                .to_string(),
            )
        };
        let ns = |_: u32| Some(1);
        let a = attribute_in(&ledger, &[p(101, 1 << 30), p(102, 2 << 30), p(555, 50)], &ns, &cgroups);
        assert_eq!(a.allocated[&("c1".to_string(), "G".to_string())], 1 << 30);
        assert_eq!(a.outside, vec![p(555, 50)]);
        assert_eq!(
            a.unattributed,
            vec![Unattributed {
                process: p(102, 2 << 30),
                cgroup: "0::/../../pod1/c1".into(),
            }]
        );
        let owner = Owner::of(&ledger.reservations[0], &ns, Some(1));
        assert_eq!(
            owner.owns(Some("0::/../../pod1/c1\n"), Some(1)),
            CgroupMatch::CannotTell
        );
        assert_eq!(owner.owns(None, Some(1)), CgroupMatch::Outside);
    }
}
