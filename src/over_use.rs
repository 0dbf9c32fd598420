//! The reactive tier: `vramgate watch` measures what each reserved container holds on its
//! GPUs, from the same service snapshot `vramgate status` and the metrics read, and acts on a
//! container that holds more than its limit plus `[enforce] over_use_margin` (the limit is its
//! reservation where it asked for no more; a container asked for a larger limit may use up to
//! it, so only past it is it over).
//!
//! Why it exists beside the other tiers: each holds something narrower than a container.
//! MPS's pinned limit is per CUDA client process (measured on an H100: one container under a
//! 4 GiB limit ran two processes of 3 GiB each, 7.6 GiB in use); the framework guardrails
//! bound one framework's allocator; the driver limit (R615+) is per cgroup but needs that
//! driver. The watch works on any driver that lists processes (NVML), and holds the
//! container as a whole:
//! - `report` (the default): an `over_use` event in the event log when a container goes over,
//!   once per episode, naming what it holds and its processes; status and the metrics flag it
//!   (`over_reservation`) whenever they are read.
//! - `kill`: the same, and the container is stopped: its init process and every GPU process it
//!   owns ([`crate::attribution::Owner`]: by its recorded cgroup, nested pid namespaces
//!   included, else by its pid namespace) get SIGKILL, and an `over_use_stop` event says so.
//!   As the kernel's OOM killer stops the offender rather than its neighbours, the container
//!   that took more than it reserved pays, not the next one to allocate on that GPU.
//!
//! A stop reaches only what was judged: containers that cannot be told apart (one cgroup, or
//! one pid namespace without cgroups) are judged as one group and stopped together; only
//! reservations whose init is the process recorded are judged, and a stop is sent only when
//! every init of the group still is (pid and start time), each signal through a pidfd opened
//! before its process was checked, so a reused pid is never signalled.
//!
//! After each pass that measured, the watch touches its heartbeat in the state directory
//! ([`crate::service::beat`]): a pod's containers holding one claim count it once only while
//! that is fresh.
//!
//! It measures every `[enforce] over_use_interval` (500 ms by default): the time from over-use
//! to the event or the stop is at most one interval plus one NVML process query. A container
//! with no cgroup of its own that shares the host's pid namespace cannot be measured, so it is
//! never reported or stopped; the driver limit's per-cgroup figure covers it where that driver
//! runs.
//!
//! It runs in the host's cgroup namespace or not at all: it finds a container's processes by
//! the cgroup the hook recorded, as the host reads it, and from a namespace of its own it would
//! read every other process's as `/../..` and find none ([`run`] returns the reason:
//! [`crate::attribution::check_cgroup_namespace`]). Under Kubernetes that is a privileged
//! pod; `hostPID` alone does not give it.
//!
//! It reads the service's snapshot, so it sits above the service and `vramgate status`, not in
//! [`crate::enforce`], which they use.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use crate::attribution::{ForeignCgroupView, Owner, Unattributed};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, OverUseAction};
use crate::events::{self, Event, Kind};
use crate::inventory::GpuProcess;
use crate::ledger::{GpuShare, Ledger, Reservation, StateDir};
use crate::procfs::{self, CgroupMatch, Life, Liveness, ProcLiveness, ProcessIdentity};
use crate::quantity::{format_bytes, Quantity};
use crate::service::Service;
use crate::status::StatusReport;

/// One container over its reservation on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverUse {
    pub container: String,
    /// The container's name in the ledger (`namespace/pod/container` under Kubernetes), for
    /// the watch's log; the events carry it from the ledger too.
    pub name: Option<String>,
    pub init: ProcessIdentity,
    /// When the reservation was made: with the container id, what tells one reservation from a
    /// later one of the same name.
    pub created_unix_ms: u64,
    pub uuid: String,
    pub gpu_index: u32,
    /// What it reserved: with the containers it is judged with, what they reserved together.
    pub reserved: u64,
    /// What it may use at most (`reserved` where it asked for no more): what `used` is judged
    /// by; with the containers it is judged with, their limits together.
    pub limit: u64,
    pub used: u64,
    pub margin: u64,
    /// How many containers `used` is the sum of: more than one for the containers of a pod
    /// that hold one claim and for containers that share a pid namespace ([`over_use`]).
    pub holders: usize,
    /// The containers judged with it, itself included (itself alone when judged alone): what
    /// a stop stops together.
    pub group: Vec<String>,
    /// Whether some of `group` share a pid namespace (else: a pod's holders of a claim).
    pub shared_namespace: bool,
}

impl OverUse {
    /// "container <id>", with its name where the ledger has one: "container <id> (ns/pod/c)".
    pub fn who(&self) -> String {
        match &self.name {
            Some(name) => format!("container {} ({name})", self.container),
            None => format!("container {}", self.container),
        }
    }

    fn key(&self) -> (String, u64, String) {
        (self.container.clone(), self.created_unix_ms, self.uuid.clone())
    }

    /// What the event says: "uses 7782 MiB on GPU 0 (GPU-…), reserved 4096 MiB, over by 3686 MiB
    /// (margin 0 B)".
    pub fn describe(&self) -> String {
        let said = self.describe_one();
        if self.holders > 1 && self.shared_namespace {
            let others: Vec<&str> = self
                .group
                .iter()
                .filter(|c| **c != self.container)
                .map(String::as_str)
                .collect();
            return format!(
                "{said}, with the {} containers whose processes share a pid namespace (with {})",
                self.holders,
                others.join(", ")
            );
        }
        if self.holders > 1 {
            return format!(
                "{said}, with the {} containers of its pod that hold its claim",
                self.holders
            );
        }
        said
    }

    fn describe_one(&self) -> String {
        if self.limit > self.reserved {
            return format!(
                "uses {} on GPU {} ({}), reserved {} with a limit of {}, over its limit by {} (margin {})",
                format_bytes(self.used),
                self.gpu_index,
                self.uuid,
                format_bytes(self.reserved),
                format_bytes(self.limit),
                format_bytes(self.used.saturating_sub(self.limit)),
                format_bytes(self.margin)
            );
        }
        format!(
            "uses {} on GPU {} ({}), reserved {}, over by {} (margin {})",
            format_bytes(self.used),
            self.gpu_index,
            self.uuid,
            format_bytes(self.reserved),
            format_bytes(self.used.saturating_sub(self.reserved)),
            format_bytes(self.margin)
        )
    }
}

/// Every (container, GPU) of `report` whose measured use exceeds its limit (its reservation
/// where it asked for no more) by more than `margin` (an amount, or a percentage of the
/// limit). Where nothing was measured (`used` unknown) nothing is judged. Containers that are
/// not judged alone ([`crate::status::held_together`]: a pod's containers holding one claim,
/// which hold its memory once; containers whose processes share a pid namespace, which
/// cannot be told apart) are judged together: their use added up, against their limits added
/// up (a claim's once), and each of them is over when the sum is (of those that could be
/// measured: a lower bound).
pub fn over_use(report: &StatusReport, ledger: &Ledger, margin: Quantity) -> Vec<OverUse> {
    let mut found = Vec::new();
    for gpu in &report.gpus {
        let measured = |id: &str| {
            gpu.reservations
                .iter()
                .find(|s| s.container_id == id)
                .and_then(|s| s.used)
        };
        let shared: Vec<&[String]> = report
            .shared
            .iter()
            .filter(|(uuid, _)| *uuid == gpu.gpu.uuid)
            .map(|(_, members)| members.as_slice())
            .collect();
        // What each container not judged alone on this GPU is judged by: its group's sum.
        let together = crate::status::held_together(ledger, &gpu.gpu.uuid, &shared, &measured);
        for r in &gpu.reservations {
            let judged = together.get(r.container_id.as_str());
            let (used, reserved, limit) = match judged {
                Some(t) => (t.used, t.reserved, t.limit),
                None => (r.used, r.bytes, r.limit),
            };
            let Some(used) = used else { continue };
            let margin_bytes = margin.bytes_on(limit);
            if used <= limit.saturating_add(margin_bytes) {
                continue;
            }
            let Some(reservation) = ledger.reservation(&r.container_id) else {
                continue;
            };
            let mut group: Vec<String> = match judged {
                Some(t) => together
                    .iter()
                    .filter(|(_, other)| other.group == t.group)
                    .map(|(id, _)| id.to_string())
                    .collect(),
                None => vec![r.container_id.clone()],
            };
            group.sort();
            found.push(OverUse {
                container: r.container_id.clone(),
                name: reservation.name.clone(),
                init: reservation.init,
                created_unix_ms: reservation.created_unix_ms,
                uuid: gpu.gpu.uuid.clone(),
                gpu_index: gpu.gpu.index,
                reserved,
                limit,
                used,
                margin: margin_bytes,
                holders: group.len(),
                group,
                shared_namespace: judged.is_some_and(|t| t.shared_namespace),
            });
        }
    }
    found
}

/// The containers `members` as their processes are matched ([`Owner`]), each only while its
/// init is still the process recorded: its namespace is read, then its start time checked (a
/// pid is not reused while its process lives), so that a namespace read through a reused pid
/// is never taken for the container's.
fn verified_owners<'l>(members: &[&'l Reservation], pid_namespace: &dyn Fn(u32) -> Option<u64>) -> Vec<Owner<'l>> {
    let host = pid_namespace(std::process::id());
    members
        .iter()
        .map(|r| Owner::of(r, pid_namespace, host))
        .filter(|o| o.reservation.init.is_alive())
        .collect()
}

/// Whether process `pid` is one of `owners`' ([`Owner::owns`]); one whose cgroup cannot be
/// compared ([`CgroupMatch::CannotTell`]) is not, and is never stopped.
fn owned(owners: &[Owner], pid: u32, pid_namespace: &dyn Fn(u32) -> Option<u64>) -> bool {
    if owners.is_empty() {
        return false;
    }
    let any_cgroup = owners.iter().any(|o| o.reservation.cgroup.is_some());
    let text = if any_cgroup { procfs::cgroups(pid) } else { None };
    let ns = pid_namespace(pid);
    owners
        .iter()
        .any(|o| o.owns(text.as_deref(), ns) == CgroupMatch::Inside)
}

/// The GPU processes of the containers `members`: those attribution gives them (by cgroup
/// where one was recorded, so a process in a nested pid namespace is among them; by pid
/// namespace otherwise, never the host's: see the module documentation), each init checked
/// to be the process recorded.
pub fn container_processes<'p>(
    members: &[&Reservation],
    processes: &'p [GpuProcess],
    pid_namespace: &dyn Fn(u32) -> Option<u64>,
) -> Vec<&'p GpuProcess> {
    let owners = verified_owners(members, pid_namespace);
    processes
        .iter()
        .filter(|p| owned(&owners, p.pid, pid_namespace))
        .collect()
}

/// What one pass found and did, for the caller's log.
#[derive(Debug, Default)]
pub struct Pass {
    /// Containers newly found over (an event written for each).
    pub reported: Vec<OverUse>,
    /// Containers stopped, with the pids that were sent SIGKILL.
    pub stopped: Vec<(OverUse, Vec<u32>)>,
    /// Containers over that were not stopped, and why (an init no longer the process recorded).
    pub spared: Vec<(OverUse, String)>,
    /// The heartbeat could not be written: the service counts claim holders whole meanwhile.
    pub heartbeat_error: Option<crate::ledger::LedgerError>,
    /// GPU processes whose cgroup could not be compared with the recorded ones
    /// ([`crate::attribution::Attribution::unattributed`]): judged as no container's, stopped
    /// with none. Filled the first time any are seen in this watch's life, for the caller to
    /// say once.
    pub unattributed: Vec<Unattributed>,
}

/// The watch's memory between passes: the episodes already reported, so that one stays one
/// event however long it lasts; a container back under its reservation starts a new one.
#[derive(Debug, Default)]
pub struct Watch {
    reported: HashMap<(String, u64, String), ()>,
    /// Whether this watch has written its pid into the heartbeat file.
    heartbeat_written: bool,
    /// Whether a pass has handed over [`Pass::unattributed`] already.
    told_unattributed: bool,
}

impl Watch {
    /// One measurement: reads the ledger and the snapshot, writes an event for each new
    /// over-use and, under `kill`, stops the container.
    pub fn pass(
        &mut self,
        service: &Service,
        dir: &StateDir,
        config: &Config,
    ) -> Result<Pass, crate::service::ServiceError> {
        let mut ledger = dir.read()?;
        // A reservation whose init is gone (exited, or its pid now another process's) until
        // the next transaction reclaims it is nobody's: its pid may now lie in another
        // container's namespace, whose processes would be judged, and stopped, as its own.
        ledger.reservations.retain(|r| ProcLiveness.life(&r.init) != Life::Gone);
        let report = service.snapshot_of(&ledger)?;
        let found = over_use(&report, &ledger, config.enforce.over_use_margin);
        let now = SystemClock.now_unix_ms();
        let mut pass = Pass::default();
        if !self.told_unattributed && !report.unattributed.is_empty() {
            self.told_unattributed = true;
            pass.unattributed = report.unattributed.clone();
        }
        let mut log = Vec::new();
        let still: HashMap<(String, u64, String), ()> = found.iter().map(|o| (o.key(), ())).collect();
        self.reported.retain(|key, _| still.contains_key(key));
        // The containers a stop has reached (or refused to reach) in this pass.
        let mut done: HashSet<String> = HashSet::new();
        for over in found {
            let stop = config.enforce.over_use == OverUseAction::Kill;
            let new_episode = self.reported.insert(over.key(), ()).is_none();
            if !new_episode && !stop {
                continue;
            }
            let members: Vec<&Reservation> = over.group.iter().filter_map(|id| ledger.reservation(id)).collect();
            let processes = container_processes(&members, &report.snapshot.processes, &procfs::pid_namespace);
            let share = [GpuShare::new(over.uuid.clone(), over.reserved, over.limit)];
            if new_episode {
                let pids: Vec<String> = processes
                    .iter()
                    .filter(|p| p.gpu_uuid == over.uuid)
                    .map(|p| format!("pid {} {}", p.pid, format_bytes(p.used)))
                    .collect();
                let detail = format!("{}; processes: {}", over.describe(), pids.join(", "));
                log.push(Event::new(now, Kind::OverUse, &over.container, &share, detail));
                pass.reported.push(over.clone());
            }
            // One stop per group and pass, however many of its GPUs are over; a group still
            // measured over at the next pass (its processes not yet gone) is signalled again,
            // and logged again only if anything was left to signal.
            if !stop || done.contains(&over.container) {
                continue;
            }
            done.extend(over.group.iter().cloned());
            match stop_group(&ledger, &over.group, &report.snapshot.processes, &procfs::pid_namespace) {
                Ok(killed) => {
                    if new_episode || !killed.is_empty() {
                        let with = if over.group.len() > 1 {
                            format!(" with {}", over.group.join(", "))
                        } else {
                            String::new()
                        };
                        let detail = format!(
                            "stopped{with} ([enforce] over_use = \"kill\"): SIGKILL to {}",
                            if killed.is_empty() {
                                "nothing (its processes were gone)".to_string()
                            } else {
                                killed.iter().map(|p| format!("pid {p}")).collect::<Vec<_>>().join(", ")
                            }
                        );
                        log.push(Event::new(now, Kind::OverUseStop, &over.container, &share, detail));
                    }
                    pass.stopped.push((over, killed));
                }
                Err(why) => {
                    if new_episode {
                        let detail = format!("not stopped ([enforce] over_use = \"kill\"): {why}");
                        log.push(Event::new(now, Kind::Note, &over.container, &share, detail));
                    }
                    pass.spared.push((over, why));
                }
            }
        }
        // The events name the containers as the ledger does (where it names them).
        for event in &mut log {
            event.name = ledger.reservation(&event.container).and_then(|r| r.name.clone());
        }
        events::append(dir, &log);
        // This pass measured: a watch is seen running (claims may be held once, see
        // crate::service::watch_seen).
        pass.heartbeat_error = crate::service::beat(dir, &mut self.heartbeat_written).err();
        Ok(pass)
    }
}

/// Stops the containers of `group` together: SIGKILL to each one's init and to every GPU
/// process they own (by cgroup where one was recorded, else by pid namespace: [`Owner`]);
/// returns the pids signalled. Nothing is sent unless every init is still the process the
/// ledger recorded (pid and start time): a pid of a container that has gone may name another
/// tenant's process now, and its namespace another tenant's container. Every signal goes
/// through a pidfd opened before the process was checked, so the process checked is the
/// process signalled, never a later one given its pid.
fn stop_group(
    ledger: &Ledger,
    group: &[String],
    processes: &[GpuProcess],
    pid_namespace: &dyn Fn(u32) -> Option<u64>,
) -> Result<Vec<u32>, String> {
    let mut members = Vec::new();
    let mut inits = Vec::new();
    for id in group {
        let Some(r) = ledger.reservation(id) else {
            return Err(format!("container {id} is no longer in the ledger"));
        };
        let Some(fd) = r.init.pidfd() else {
            return Err(format!(
                "the init of container {id} (pid {}) is no longer the process the ledger recorded",
                r.init.pid
            ));
        };
        members.push(r);
        inits.push((r.init.pid, fd));
    }
    let owners = verified_owners(&members, pid_namespace);
    if owners.len() != members.len() {
        return Err("an init exited while it was checked".to_string());
    }
    let mut killed = Vec::new();
    for (pid, fd) in &inits {
        if fd.kill() {
            killed.push(*pid);
        }
    }
    for p in processes {
        if killed.contains(&p.pid) {
            continue;
        }
        // Opened first, then checked: a pid reused in between names a process outside the
        // containers, which is left alone; one reused after the check is not the fd's.
        let Some(fd) = procfs::PidFd::open(p.pid) else { continue };
        if owned(&owners, p.pid, pid_namespace) && fd.kill() {
            killed.push(p.pid);
        }
    }
    Ok(killed)
}

/// Runs the watch: one pass every `[enforce] over_use_interval`, the config read again each
/// time (a changed action or margin applies at the next pass). A pass that fails (the ledger
/// unreadable, NVML failing) is logged and the next one tried. It returns only where it
/// cannot judge at all: its inventory lists GPU processes and this process reads cgroups from
/// a namespace of its own ([`crate::attribution::check_cgroup_namespace`], asked each time the
/// inventory is opened: at the first pass, and when `[inventory]` changes), where running on
/// would judge every container as using nothing, stop none, and keep a heartbeat that tells
/// the service a watch holds claims to their limit.
pub fn run(config_path: &Path, mut log: impl FnMut(&str)) -> ForeignCgroupView {
    let mut watch = Watch::default();
    let mut inventory: Option<(Box<dyn crate::inventory::Inventory>, crate::config::InventoryConfig)> = None;
    loop {
        let interval = match pass_once(config_path, &mut watch, &mut inventory, &mut log) {
            Ok(interval) => interval,
            Err(e) => match e.downcast::<ForeignCgroupView>() {
                Ok(foreign) => return *foreign,
                Err(e) => {
                    log(&format!("vramgate watch: {e}"));
                    Duration::from_secs(1)
                }
            },
        };
        std::thread::sleep(interval);
    }
}

fn pass_once(
    config_path: &Path,
    watch: &mut Watch,
    inventory: &mut Option<(Box<dyn crate::inventory::Inventory>, crate::config::InventoryConfig)>,
    log: &mut impl FnMut(&str),
) -> Result<Duration, Box<dyn std::error::Error>> {
    let config = Config::load_from(config_path)?;
    // NVML is opened once and kept (its init takes seconds on a cold multi-GPU host); a
    // changed [inventory] opens it again.
    if inventory.as_ref().is_none_or(|(_, seen)| *seen != config.inventory) {
        let opened = crate::inventory::open(&config)?;
        crate::attribution::check_cgroup_namespace(opened.as_ref())?;
        *inventory = Some((opened, config.inventory.clone()));
    }
    let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
        return Ok(config.enforce.over_use_interval);
    };
    let (opened, _) = inventory.as_ref().expect("opened above");
    let service = Service::new(dir.clone(), opened.as_ref(), &SystemClock, &ProcLiveness, &config);
    let pass = watch.pass(&service, &dir, &config)?;
    for over in &pass.reported {
        log(&format!("vramgate watch: {} {}", over.who(), over.describe()));
    }
    if let Some(e) = &pass.heartbeat_error {
        log(&format!(
            "vramgate watch: cannot write its heartbeat ({e}): claims' holders count whole until it can"
        ));
    }
    for (over, why) in &pass.spared {
        log(&format!("vramgate watch: {} not stopped: {why}", over.who()));
    }
    for (over, pids) in &pass.stopped {
        log(&format!("vramgate watch: stopped {} (pids {pids:?})", over.who()));
    }
    if !pass.unattributed.is_empty() {
        let processes: Vec<String> = pass
            .unattributed
            .iter()
            .map(|u| match u.cgroup.as_str() {
                "" => format!("pid {} on {}", u.process.pid, u.process.gpu_uuid),
                line => format!(
                    "pid {} on {} (its cgroup read as {line:?})",
                    u.process.pid, u.process.gpu_uuid
                ),
            })
            .collect();
        log(&format!(
            "vramgate watch: cannot compare the cgroup of {} with the cgroups containers recorded, a path climbing out of this process's cgroup namespace (`..`): judged as no container's and stopped with none, their containers' reservations counted as not yet allocated (said once; the watch must run in the host's cgroup namespace)",
            processes.join(", ")
        ));
    }
    Ok(config.enforce.over_use_interval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuMemory, Inventory, InventoryError, Snapshot};
    use std::process::{Child, Command};

    const GI: u64 = 1 << 30;

    /// A GPU whose process list is what the test says: the one thing NVML would tell.
    struct ListedProcesses(std::cell::RefCell<Vec<GpuProcess>>);

    impl Inventory for ListedProcesses {
        fn snapshot(&self) -> Result<Snapshot, InventoryError> {
            Ok(Snapshot {
                gpus: vec![GpuMemory::for_test(0, None, "GPU-0")],
                processes: self.0.borrow().clone(),
                ..Snapshot::default()
            })
        }
        fn sees_processes(&self) -> bool {
            true
        }
        fn describe(&self) -> String {
            "listed".into()
        }
    }

    /// A "container": `sleep` as the init of a pid namespace of its own (`unshare`), and its
    /// pid on the host.
    struct Container {
        unshare: Child,
        init: u32,
    }

    /// The first child of `parent` that runs `sleep`, once there is one.
    fn sleeping_child(parent: u32) -> u32 {
        child_named(parent, "sleep")
    }

    /// The first child of `parent` whose command is `name`, once there is one.
    fn child_named(parent: u32, name: &str) -> u32 {
        let children = format!("/proc/{parent}/task/{parent}/children");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            // Once it runs `name`, not still the forked parent.
            let found = text
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .find(|pid: &u32| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == name)
                });
            if let Some(pid) = found {
                return pid;
            }
            assert!(std::time::Instant::now() < deadline, "no child {name} of {parent}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A cgroup v2 directory of the test's own (at /sys/fs/cgroup on a unified host, under
    /// /sys/fs/cgroup/unified on a hybrid one): a container's cgroup, as runc makes one. Its
    /// processes are killed and it is removed when dropped.
    struct TestCgroup(std::path::PathBuf);

    impl TestCgroup {
        fn new(name: &str) -> TestCgroup {
            let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.join("cgroup.controllers").exists())
                .expect("this host mounts cgroup v2");
            let dir = root.join(format!("vramgate-watch-test-{}-{name}", std::process::id()));
            std::fs::create_dir(&dir).unwrap();
            TestCgroup(dir)
        }

        fn procs(&self) -> std::path::PathBuf {
            self.0.join("cgroup.procs")
        }

        fn join(&self, pid: u32) {
            std::fs::write(self.procs(), pid.to_string()).unwrap();
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&self.0).is_err() && std::time::Instant::now() < deadline {
                for pid in std::fs::read_to_string(self.procs())
                    .unwrap_or_default()
                    .split_whitespace()
                {
                    if let Ok(pid) = pid.parse::<i32>() {
                        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// What the hook records for a container whose init is `pid`.
    fn recorded_cgroup(pid: u32) -> String {
        procfs::own_cgroup(&procfs::cgroups(pid).unwrap()).unwrap()
    }

    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
        })
    }

    impl Container {
        fn start() -> Container {
            Container::running(&["sleep", "60"])
        }

        /// `command` as the init of a pid namespace of its own; it must become a `sleep`.
        fn running(command: &[&str]) -> Container {
            let unshare = Command::new("unshare")
                .args(["--pid", "--fork"])
                .args(command)
                .spawn()
                .expect("unshare (util-linux) runs, as root");
            let init = sleeping_child(unshare.id());
            Container { unshare, init }
        }

        fn alive(&self) -> bool {
            running(self.init)
        }
    }

    impl Drop for Container {
        fn drop(&mut self) {
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
    }

    fn reserve(dir: &StateDir, id: &str, init: u32, bytes: u64) {
        let mut tx = dir.begin().unwrap();
        let mut r = Reservation::for_test(id, "GPU-0", bytes);
        r.init = ProcessIdentity::of(init).unwrap();
        tx.ledger.reservations.push(r);
        let _committed = tx.commit().unwrap();
    }

    /// A process on GPU-0, as the inventory lists it.
    fn on_gpu0(pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            gpu_uuid: "GPU-0".into(),
            pid,
            used,
        }
    }

    fn listed(processes: Vec<GpuProcess>) -> ListedProcesses {
        ListedProcesses(std::cell::RefCell::new(processes))
    }

    /// The watch's config over the state directory `dir`, acting by `over_use`.
    fn watch_config(dir: &StateDir, over_use: OverUseAction) -> Config {
        let mut config = Config::default();
        config.state_dir = dir.path().to_path_buf();
        config.enforce.over_use = over_use;
        config
    }

    /// Waits (5 s at most: a SIGKILL lands at once) until none of `pids` runs.
    fn wait_until_stopped(pids: &[u32], what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|&pid| running(pid)) {
            assert!(std::time::Instant::now() < deadline, "{what} still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn sorted(mut pids: Vec<u32>) -> Vec<u32> {
        pids.sort();
        pids
    }

    fn events(dir: &StateDir) -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join(crate::events::EVENTS_FILE))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn over_use_is_reported_once_per_episode_and_killed_when_the_config_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let greedy = Container::start();
        let neighbour = Container::start();
        reserve(&dir, "greedy", greedy.init, 4 * GI);
        reserve(&dir, "neighbour", neighbour.init, 4 * GI);
        // Two processes of the greedy container (its init among them), 3 GiB each: each
        // within the reservation, as MPS's per-process limit lets them be, 6 GiB together.
        let inventory = listed(vec![
            on_gpu0(greedy.init, 3 * GI),
            on_gpu0(greedy.init, 3 * GI),
            on_gpu0(neighbour.init, 4 * GI),
        ]);
        let mut config = watch_config(&dir, OverUseAction::Report);
        config.enforce.over_use_margin = Quantity::Bytes(GI);
        let mut watch = Watch::default();

        // Report: one event, naming the use, the reservation and the processes.
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert_eq!(pass.reported.len(), 1, "{pass:?}");
        assert_eq!((pass.reported[0].used, pass.reported[0].reserved), (6 * GI, 4 * GI));
        // The watch's log names it as the ledger does: by id, and by name where it has one.
        assert_eq!(pass.reported[0].who(), "container greedy");
        let mut named = pass.reported[0].clone();
        named.name = Some("jobs/trainer/main".into());
        assert_eq!(named.who(), "container greedy (jobs/trainer/main)");
        let logged = events(&dir);
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert_eq!(logged[0]["event"], "over_use");
        assert_eq!(logged[0]["container"], "greedy");
        let detail = logged[0]["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("uses 6144 MiB on GPU 0 (GPU-0), reserved 4096 MiB, over by 2048 MiB (margin 1024 MiB)")
                && detail.contains(&format!("pid {} 3072 MiB", greedy.init)),
            "{detail}"
        );
        // The same episode is not logged again; nothing was stopped.
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert!(pass.reported.is_empty() && pass.stopped.is_empty());
        assert_eq!(events(&dir).len(), 1);
        assert!(greedy.alive() && neighbour.alive());

        // Within the margin is not over use.
        config.enforce.over_use_margin = Quantity::Bytes(2 * GI);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        assert!(watch.pass(&service, &dir, &config).unwrap().reported.is_empty());

        // Kill: the offender's init (and so its pid namespace) is stopped, its neighbour not.
        config.enforce.over_use_margin = Quantity::Bytes(0);
        config.enforce.over_use = OverUseAction::Kill;
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert_eq!(pass.stopped.len(), 1, "{pass:?}");
        assert_eq!(pass.stopped[0].1, [greedy.init]);
        wait_until_stopped(&[greedy.init], "the greedy container");
        assert!(neighbour.alive(), "the neighbour within its reservation runs on");
        let logged = events(&dir);
        let kinds: Vec<&str> = logged.iter().map(|e| e["event"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["over_use", "over_use", "over_use_stop"]);
        assert!(
            logged[2]["detail"].as_str().unwrap().contains(&format!(
                "stopped ([enforce] over_use = \"kill\"): SIGKILL to pid {}",
                greedy.init
            )),
            "{logged:?}"
        );
    }

    /// Two containers of a pod holding one 4 GiB claim hold 4 GiB once: each within the
    /// claim's limit alone (3 GiB), together over it (6 GiB), so both are reported; another
    /// pod's container of the same use, alone, is not.
    #[test]
    fn a_pods_containers_holding_one_claim_are_judged_by_their_use_together() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let (app, sidecar, alone) = (Container::start(), Container::start(), Container::start());
        let hold = crate::ledger::ClaimHold {
            pod: "pod-1".into(),
            devices: vec!["u-gpu-0".into()],
        };
        for (id, c) in [("app", &app), ("sidecar", &sidecar)] {
            reserve(&dir, id, c.init, 4 * GI);
            let mut tx = dir.begin().unwrap();
            tx.ledger.reservations.last_mut().unwrap().claim = Some(hold.clone());
            let _committed = tx.commit().unwrap();
        }
        reserve(&dir, "alone", alone.init, 4 * GI);
        let inventory = listed(vec![
            on_gpu0(app.init, 3 * GI),
            on_gpu0(sidecar.init, 3 * GI),
            on_gpu0(alone.init, 3 * GI),
        ]);
        let config = watch_config(&dir, OverUseAction::Report);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = Watch::default().pass(&service, &dir, &config).unwrap();
        let over: Vec<(&str, u64, usize)> = pass
            .reported
            .iter()
            .map(|o| (o.container.as_str(), o.used, o.holders))
            .collect();
        assert_eq!(over, [("app", 6 * GI, 2), ("sidecar", 6 * GI, 2)], "{pass:?}");
        assert!(
            pass.reported[0]
                .describe()
                .ends_with("over by 2048 MiB (margin 0 B), with the 2 containers of its pod that hold its claim"),
            "{}",
            pass.reported[0].describe()
        );
    }

    /// A reservation whose init has gone, its pid now a process of another tenant's container
    /// (same pid, another start time), is not that container's owner: the tenant's use is
    /// judged as the tenant's (within its reservation), and nothing of the tenant is stopped.
    #[test]
    fn a_stale_reservations_reused_pid_never_gets_another_tenants_processes_stopped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let tenant = Container::start();
        reserve(&dir, "tenant", tenant.init, 4 * GI);
        let mut tx = dir.begin().unwrap();
        let mut stale = Reservation::for_test("stale", "GPU-0", GI);
        let now = ProcessIdentity::of(tenant.init).unwrap();
        stale.init = ProcessIdentity {
            pid: tenant.init,
            start_time: now.start_time.saturating_sub(1),
        };
        tx.ledger.reservations.push(stale);
        let _committed = tx.commit().unwrap();
        let inventory = listed(vec![on_gpu0(tenant.init, 3 * GI)]);
        let config = watch_config(&dir, OverUseAction::Kill);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = Watch::default().pass(&service, &dir, &config).unwrap();
        assert!(pass.reported.is_empty() && pass.stopped.is_empty(), "{pass:?}");
        assert!(tenant.alive(), "the tenant within its reservation runs on");
        assert!(events(&dir).is_empty(), "{:?}", events(&dir));
    }

    /// An over-use whose init is no longer the process the ledger recorded stops nothing: not
    /// the init's pid, not the GPU processes of the namespace that pid now lies in.
    #[test]
    fn a_stop_is_never_sent_where_an_init_is_not_the_process_recorded() {
        let tenant = Container::start();
        let mut ledger = Ledger::default();
        let mut r = Reservation::for_test("gone", "GPU-0", GI);
        let now = ProcessIdentity::of(tenant.init).unwrap();
        r.init = ProcessIdentity {
            pid: tenant.init,
            start_time: now.start_time + 1,
        };
        ledger.reservations.push(r);
        let processes = [on_gpu0(tenant.init, 3 * GI)];
        let refused = stop_group(&ledger, &["gone".into()], &processes, &procfs::pid_namespace).unwrap_err();
        assert!(
            refused.contains("is no longer the process the ledger recorded"),
            "{refused}"
        );
        assert!(container_processes(&[&ledger.reservations[0]], &processes, &procfs::pid_namespace).is_empty());
        assert!(tenant.alive());
    }

    /// Two reserved containers whose processes share one pid namespace (a pod with
    /// `shareProcessNamespace`) cannot be told apart by process: they are judged as one, their
    /// use against their reservations added up, so neither is stopped for the other's use
    /// within that; over it, both are stopped together, and a neighbour is not.
    #[test]
    fn containers_sharing_a_pid_namespace_are_judged_and_stopped_together() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        // The namespace's init (`app`) and a second process in it (`sidecar`).
        let pod = Container::running(&["sh", "-c", "sleep 60 & exec sleep 60"]);
        let sidecar = sleeping_child(pod.init);
        let neighbour = Container::start();
        reserve(&dir, "app", pod.init, 4 * GI);
        reserve(&dir, "sidecar", sidecar, 4 * GI);
        reserve(&dir, "neighbour", neighbour.init, 4 * GI);
        let inventory = listed(vec![
            on_gpu0(pod.init, GI),
            on_gpu0(sidecar, 5 * GI),
            on_gpu0(neighbour.init, 3 * GI),
        ]);
        let config = watch_config(&dir, OverUseAction::Kill);
        let mut watch = Watch::default();
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        // 6 GiB of 8 reserved together: nobody over, nobody stopped.
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert!(pass.reported.is_empty() && pass.stopped.is_empty(), "{pass:?}");
        let report = service.snapshot_of(&dir.read().unwrap()).unwrap();
        assert!(
            report.gpus[0].reservations.iter().all(|r| !r.over_reservation),
            "{report:?}"
        );
        assert!(pod.alive() && running(sidecar) && neighbour.alive());

        // 9 GiB of 8: both are over, and stopped together, once.
        inventory.0.borrow_mut()[1].used = 8 * GI;
        let pass = watch.pass(&service, &dir, &config).unwrap();
        let over: Vec<(&str, u64, u64, usize)> = pass
            .reported
            .iter()
            .map(|o| (o.container.as_str(), o.used, o.limit, o.holders))
            .collect();
        assert_eq!(
            over,
            [("app", 9 * GI, 8 * GI, 2), ("sidecar", 9 * GI, 8 * GI, 2)],
            "{pass:?}"
        );
        assert!(
            pass.reported[0].describe().ends_with(
                "over by 1024 MiB (margin 0 B), with the 2 containers whose processes share a pid namespace (with sidecar)"
            ),
            "{}",
            pass.reported[0].describe()
        );
        assert_eq!(pass.stopped.len(), 1, "{pass:?}");
        assert_eq!(sorted(pass.stopped[0].1.clone()), sorted(vec![pod.init, sidecar]));
        wait_until_stopped(&[pod.init, sidecar], "a process of the pod");
        assert!(neighbour.alive(), "the neighbour within its reservation runs on");
    }

    /// A process that a container starts in a pid namespace of its own (`unshare -Urpf` in a
    /// pod) stays in the container's cgroup: found by the cgroup recorded at admission, it is
    /// counted as the container's (not as outside vramgate), judged, and stopped with it.
    #[test]
    fn a_process_in_a_nested_pid_namespace_is_counted_judged_and_stopped_as_its_containers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let cgroup = TestCgroup::new("nested");
        // The init joins the container's cgroup, then starts a process in a nested namespace.
        let script = format!(
            "echo $$ > {}; unshare --pid --fork sleep 60 & exec sleep 60",
            cgroup.procs().display()
        );
        let container = Container::running(&["sh", "-c", &script]);
        let nested = sleeping_child(child_named(container.init, "unshare"));
        assert_ne!(procfs::pid_namespace(nested), procfs::pid_namespace(container.init));
        let neighbour = Container::start();
        reserve(&dir, "nested", container.init, 4 * GI);
        {
            let mut tx = dir.begin().unwrap();
            tx.ledger.reservations[0].cgroup = Some(recorded_cgroup(container.init));
            let _committed = tx.commit().unwrap();
        }
        reserve(&dir, "neighbour", neighbour.init, 4 * GI);
        let inventory = listed(vec![
            on_gpu0(container.init, GI),
            on_gpu0(nested, 4 * GI),
            on_gpu0(neighbour.init, 3 * GI),
        ]);
        let config = watch_config(&dir, OverUseAction::Kill);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let report = service.snapshot_of(&dir.read().unwrap()).unwrap();
        assert!(report.gpus[0].outside_processes.is_empty(), "{report:?}");
        let pass = Watch::default().pass(&service, &dir, &config).unwrap();
        let over: Vec<(&str, u64)> = pass.reported.iter().map(|o| (o.container.as_str(), o.used)).collect();
        assert_eq!(over, [("nested", 5 * GI)], "{pass:?}");
        assert_eq!(pass.stopped.len(), 1, "{pass:?}");
        assert_eq!(sorted(pass.stopped[0].1.clone()), sorted(vec![container.init, nested]));
        wait_until_stopped(&[container.init, nested], "a process of the container");
        assert!(neighbour.alive(), "the neighbour within its reservation runs on");
    }

    /// Two containers sharing one pid namespace, each in a cgroup of its own (recorded at
    /// admission): told apart by cgroup, each is judged alone, and only the one over its
    /// reservation is stopped.
    #[test]
    fn containers_sharing_a_pid_namespace_in_cgroups_of_their_own_are_judged_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let pod = Container::running(&["sh", "-c", "sleep 60 & exec sleep 60"]);
        let sidecar = sleeping_child(pod.init);
        let (app_cgroup, sidecar_cgroup) = (TestCgroup::new("app"), TestCgroup::new("sidecar"));
        app_cgroup.join(pod.init);
        sidecar_cgroup.join(sidecar);
        for (id, pid) in [("app", pod.init), ("sidecar", sidecar)] {
            reserve(&dir, id, pid, 4 * GI);
            let mut tx = dir.begin().unwrap();
            tx.ledger.reservations.last_mut().unwrap().cgroup = Some(recorded_cgroup(pid));
            let _committed = tx.commit().unwrap();
        }
        let inventory = listed(vec![on_gpu0(pod.init, GI), on_gpu0(sidecar, 5 * GI)]);
        let config = watch_config(&dir, OverUseAction::Kill);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = Watch::default().pass(&service, &dir, &config).unwrap();
        let over: Vec<(&str, u64, usize)> = pass
            .reported
            .iter()
            .map(|o| (o.container.as_str(), o.used, o.holders))
            .collect();
        assert_eq!(over, [("sidecar", 5 * GI, 1)], "{pass:?}");
        assert_eq!(pass.stopped.len(), 1);
        assert_eq!(pass.stopped[0].1, [sidecar]);
        wait_until_stopped(&[sidecar], "the sidecar");
        assert!(pod.alive(), "the app within its reservation runs on");
    }

    #[test]
    fn a_container_in_the_hosts_pid_namespace_is_never_judged_by_process() {
        let me = ProcessIdentity::current().unwrap();
        let processes = [on_gpu0(me.pid, GI)];
        let mut r = Reservation::for_test("host", "GPU-0", GI);
        r.init = me;
        assert!(container_processes(&[&r], &processes, &procfs::pid_namespace).is_empty());
    }

    /// A GPU process whose cgroup cannot be compared with the one its container recorded
    /// (a path that climbs out of the reader's cgroup namespace: here the recorded one, as a
    /// ledger edited by hand would have it; read from a namespace of the watch's own, every
    /// process's would) is never the container's: not measured as its use, so not stopped under
    /// `kill`, and not listed outside vramgate either; the pass hands it over once, for the log.
    #[test]
    fn a_process_whose_cgroup_cannot_be_compared_is_neither_stopped_nor_outside_and_is_said_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let container = Container::start();
        reserve(&dir, "climbs", container.init, GI);
        {
            let mut tx = dir.begin().unwrap();
            tx.ledger.reservations[0].cgroup = Some("0::/../elsewhere".into());
            let _committed = tx.commit().unwrap();
        }
        // 4 GiB on a 1 GiB reservation: over, were it measured.
        let inventory = listed(vec![on_gpu0(container.init, 4 * GI)]);
        let config = watch_config(&dir, OverUseAction::Kill);
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let report = service.snapshot_of(&dir.read().unwrap()).unwrap();
        assert!(report.gpus[0].outside_processes.is_empty(), "{report:?}");
        assert_eq!(report.gpus[0].reservations[0].used, Some(0), "{report:?}");
        let mut watch = Watch::default();
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert!(pass.reported.is_empty() && pass.stopped.is_empty(), "{pass:?}");
        assert_eq!(pass.unattributed.len(), 1, "{pass:?}");
        assert_eq!(pass.unattributed[0].process.pid, container.init);
        let ledger = dir.read().unwrap();
        assert!(container_processes(
            &[&ledger.reservations[0]],
            &report.snapshot.processes,
            &procfs::pid_namespace
        )
        .is_empty());
        // Said once: the next pass hands nothing over.
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert!(pass.unattributed.is_empty() && pass.stopped.is_empty(), "{pass:?}");
        assert!(container.alive());
    }
}
