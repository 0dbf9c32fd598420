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
//! - `kill`: the same, and the container is stopped: its init process (checked by its start
//!   time, never a reused pid) and every GPU process in its pid namespace get SIGKILL, and an
//!   `over_use_stop` event says so. As the kernel's OOM killer stops the offender rather than
//!   its neighbours, the container that took more than it reserved pays, not the next one to
//!   allocate on that GPU.
//!
//! It measures every `[enforce] over_use_interval` (500 ms by default): the time from over-use
//! to the event or the stop is at most one interval plus one NVML process query. A container
//! that shares the host's pid namespace cannot be measured (attribution is by pid namespace),
//! so it is never reported or stopped; the driver limit's per-cgroup figure covers it where
//! that driver runs.
//!
//! It reads the service's snapshot, so it sits above the service and `vramgate status`, not in
//! [`crate::enforce`], which they use.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::config::{Config, OverUseAction};
use crate::events::{self, Event, Kind};
use crate::inventory::GpuProcess;
use crate::ledger::{GpuShare, Ledger, StateDir};
use crate::procfs::{self, ProcLiveness, ProcessIdentity};
use crate::quantity::{format_bytes, Quantity};
use crate::service::Service;
use crate::status::StatusReport;

/// One container over its reservation on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverUse {
    pub container: String,
    pub init: ProcessIdentity,
    /// When the reservation was made: with the container id, what tells one reservation from a
    /// later one of the same name.
    pub created_unix_ms: u64,
    pub uuid: String,
    pub gpu_index: u32,
    pub reserved: u64,
    /// What it may use at most (`reserved` where it asked for no more): what `used` is judged by.
    pub limit: u64,
    pub used: u64,
    pub margin: u64,
    /// How many containers `used` is the sum of: more than one for the containers of a pod
    /// that hold one claim ([`over_use`]).
    pub holders: usize,
}

impl OverUse {
    fn key(&self) -> (String, u64, String) {
        (self.container.clone(), self.created_unix_ms, self.uuid.clone())
    }

    /// What the event says: "uses 7782 MiB on GPU 0 (GPU-…), reserved 4096 MiB, over by 3686 MiB
    /// (margin 0 B)".
    pub fn describe(&self) -> String {
        let said = self.describe_one();
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
            format_bytes(self.used - self.reserved),
            format_bytes(self.margin)
        )
    }
}

/// Every (container, GPU) of `report` whose measured use exceeds its limit (its reservation
/// where it asked for no more) by more than `margin` (an amount, or a percentage of the
/// limit). Where nothing was measured (`used` unknown) nothing is judged. The containers of a
/// pod that hold one claim ([`crate::ledger::ClaimHold`]) hold its memory once, so they are
/// judged together: their use added up, against the claim's limit, and each of them is over
/// when the sum is (of those that could be measured: a lower bound).
pub fn over_use(report: &StatusReport, ledger: &Ledger, margin: Quantity) -> Vec<OverUse> {
    let mut found = Vec::new();
    for gpu in &report.gpus {
        let measured = |id: &str| {
            gpu.reservations
                .iter()
                .find(|s| s.container_id == id)
                .and_then(|s| s.used)
        };
        // What each holder of a hold shared on this GPU is judged by: the hold's sum.
        let together = crate::status::held_together(ledger, &gpu.gpu.uuid, &measured);
        for r in &gpu.reservations {
            let (used, holders) = match together.get(r.container_id.as_str()) {
                Some(&(sum, holders)) => (sum, holders),
                None => (r.used, 1),
            };
            let Some(used) = used else { continue };
            let margin_bytes = margin.bytes_on(r.limit);
            if used <= r.limit.saturating_add(margin_bytes) {
                continue;
            }
            let Some(reservation) = ledger.reservation(&r.container_id) else {
                continue;
            };
            found.push(OverUse {
                container: r.container_id.clone(),
                init: reservation.init,
                created_unix_ms: reservation.created_unix_ms,
                uuid: gpu.gpu.uuid.clone(),
                gpu_index: gpu.gpu.index,
                reserved: r.bytes,
                limit: r.limit,
                used,
                margin: margin_bytes,
                holders,
            });
        }
    }
    found
}

/// The GPU processes of the container whose init is `init`: those in its pid namespace, when
/// that is not the host's (see the module documentation).
pub fn container_processes<'p>(
    init: &ProcessIdentity,
    processes: &'p [GpuProcess],
    pid_namespace: &dyn Fn(u32) -> Option<u64>,
) -> Vec<&'p GpuProcess> {
    let Some(ns) = pid_namespace(init.pid) else {
        return Vec::new();
    };
    if Some(ns) == pid_namespace(std::process::id()) {
        return Vec::new();
    }
    processes.iter().filter(|p| pid_namespace(p.pid) == Some(ns)).collect()
}

/// What one pass found and did, for the caller's log.
#[derive(Debug, Default)]
pub struct Pass {
    /// Containers newly found over (an event written for each).
    pub reported: Vec<OverUse>,
    /// Containers stopped, with the pids that were sent SIGKILL.
    pub stopped: Vec<(OverUse, Vec<u32>)>,
}

/// The watch's memory between passes: the episodes already reported, so that one stays one
/// event however long it lasts; a container back under its reservation starts a new one.
#[derive(Debug, Default)]
pub struct Watch {
    reported: HashMap<(String, u64, String), ()>,
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
        let ledger = dir.read()?;
        let report = service.snapshot_of(&ledger)?;
        let found = over_use(&report, &ledger, config.enforce.over_use_margin);
        let now = SystemClock.now_unix_ms();
        let mut pass = Pass::default();
        let mut log = Vec::new();
        let still: HashMap<(String, u64, String), ()> = found.iter().map(|o| (o.key(), ())).collect();
        self.reported.retain(|key, _| still.contains_key(key));
        for over in found {
            let stop = config.enforce.over_use == OverUseAction::Kill;
            let new_episode = self.reported.insert(over.key(), ()).is_none();
            if !new_episode && !stop {
                continue;
            }
            let processes = container_processes(&over.init, &report.snapshot.processes, &procfs::pid_namespace);
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
            // One stop per container and pass, however many of its GPUs are over; a container
            // still measured over at the next pass (its processes not yet gone) is signalled
            // again, and logged again only if anything was left to signal.
            if stop && !pass.stopped.iter().any(|(o, _)| o.container == over.container) {
                let killed = stop_container(&over.init, &processes);
                if new_episode || !killed.is_empty() {
                    let detail = format!(
                        "stopped ([enforce] over_use = \"kill\"): SIGKILL to {}",
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
        }
        events::append(dir, &log);
        Ok(pass)
    }
}

/// Sends SIGKILL to the container's init (when it is still that process) and to its GPU
/// processes; returns the pids signalled.
fn stop_container(init: &ProcessIdentity, processes: &[&GpuProcess]) -> Vec<u32> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let mut killed = Vec::new();
    if ProcessIdentity::of(init.pid).is_some_and(|now| now == *init)
        && kill(Pid::from_raw(init.pid as i32), Signal::SIGKILL).is_ok()
    {
        killed.push(init.pid);
    }
    for p in processes {
        if !killed.contains(&p.pid) && kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL).is_ok() {
            killed.push(p.pid);
        }
    }
    killed
}

/// Runs the watch until killed: one pass every `[enforce] over_use_interval`, the config read
/// again each time (a changed action or margin applies at the next pass). A pass that fails
/// (the ledger unreadable, NVML failing) is logged and the next one tried.
pub fn run(config_path: &Path, mut log: impl FnMut(&str)) -> ! {
    let mut watch = Watch::default();
    let mut inventory: Option<(Box<dyn crate::inventory::Inventory>, crate::config::InventoryConfig)> = None;
    loop {
        let interval = match pass_once(config_path, &mut watch, &mut inventory, &mut log) {
            Ok(interval) => interval,
            Err(e) => {
                log(&format!("vramgate watch: {e}"));
                Duration::from_secs(1)
            }
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
        *inventory = Some((crate::inventory::open(&config)?, config.inventory.clone()));
    }
    let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
        return Ok(config.enforce.over_use_interval);
    };
    let (opened, _) = inventory.as_ref().expect("opened above");
    let service = Service::new(dir.clone(), opened.as_ref(), &SystemClock, &ProcLiveness, &config);
    let pass = watch.pass(&service, &dir, &config)?;
    for over in &pass.reported {
        log(&format!(
            "vramgate watch: container {} {}",
            over.container,
            over.describe()
        ));
    }
    for (over, pids) in &pass.stopped {
        log(&format!(
            "vramgate watch: stopped container {} (pids {pids:?})",
            over.container
        ));
    }
    Ok(config.enforce.over_use_interval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{GpuMemory, Inventory, InventoryError, Snapshot};
    use crate::ledger::Reservation;
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

    impl Container {
        fn start() -> Container {
            let unshare = Command::new("unshare")
                .args(["--pid", "--fork", "sleep", "60"])
                .spawn()
                .expect("unshare (util-linux) runs, as root");
            let children = format!("/proc/{}/task/{}/children", unshare.id(), unshare.id());
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let init = loop {
                let text = std::fs::read_to_string(&children).unwrap_or_default();
                if let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
                    // Once it is sleep, not still the forked unshare.
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    if comm.trim() == "sleep" {
                        break pid;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "unshare's child did not start");
                std::thread::sleep(Duration::from_millis(10));
            };
            Container { unshare, init }
        }

        fn alive(&self) -> bool {
            std::fs::read_to_string(format!("/proc/{}/stat", self.init)).is_ok_and(|stat| {
                !stat
                    .rsplit(')')
                    .next()
                    .unwrap_or_default()
                    .trim_start()
                    .starts_with('Z')
            })
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
        let inventory = ListedProcesses(std::cell::RefCell::new(vec![
            GpuProcess {
                gpu_uuid: "GPU-0".into(),
                pid: greedy.init,
                used: 3 * GI,
            },
            GpuProcess {
                gpu_uuid: "GPU-0".into(),
                pid: greedy.init,
                used: 3 * GI,
            },
            GpuProcess {
                gpu_uuid: "GPU-0".into(),
                pid: neighbour.init,
                used: 4 * GI,
            },
        ]));
        let mut config = Config::default();
        config.state_dir = dir.path().to_path_buf();
        config.enforce.over_use_margin = Quantity::Bytes(GI);
        let mut watch = Watch::default();

        // Report: one event, naming the use, the reservation and the processes.
        let service = Service::new(dir.clone(), &inventory, &SystemClock, &ProcLiveness, &config);
        let pass = watch.pass(&service, &dir, &config).unwrap();
        assert_eq!(pass.reported.len(), 1, "{pass:?}");
        assert_eq!((pass.reported[0].used, pass.reported[0].reserved), (6 * GI, 4 * GI));
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
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while greedy.alive() {
            assert!(std::time::Instant::now() < deadline, "the greedy container still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
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
        let process = |pid: u32| GpuProcess {
            gpu_uuid: "GPU-0".into(),
            pid,
            used: 3 * GI,
        };
        let inventory = ListedProcesses(std::cell::RefCell::new(vec![
            process(app.init),
            process(sidecar.init),
            process(alone.init),
        ]));
        let mut config = Config::default();
        config.state_dir = dir.path().to_path_buf();
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

    #[test]
    fn a_container_in_the_hosts_pid_namespace_is_never_judged_by_process() {
        let me = ProcessIdentity::current().unwrap();
        let processes = [GpuProcess {
            gpu_uuid: "GPU-0".into(),
            pid: me.pid,
            used: GI,
        }];
        assert!(container_processes(&me, &processes, &procfs::pid_namespace).is_empty());
    }
}
