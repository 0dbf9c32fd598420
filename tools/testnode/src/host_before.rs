//! The host as it was before the node: what kubelet and the CNI bridge change outside the
//! node's directory, noted at start (and written to the node's directory, so that `testnode
//! down` can undo it even when the supervisor is gone), put back at the end and then checked.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::host_dirs::flock_at;
use crate::node::{BRIDGE, CGROUP_ROOT, DEVICE_PLUGINS, HOST_LOCK, KUBELET_SYSCTLS, SECOND_CGROUP_ROOT};

/// The host as it was before the node: what teardown puts back and then checks.
#[derive(Debug, Serialize, Deserialize)]
pub struct HostBefore {
    sysctls: Vec<(String, String)>,
    /// (tool, table, the chains there).
    chains: Vec<(String, String, Vec<String>)>,
    var_lib_kubelet: bool,
    device_plugins: Vec<String>,
    var_lib_cni: bool,
    bridge: bool,
}

const IPTABLES: &[&str] = &["iptables", "ip6tables"];

const TABLES: &[&str] = &["mangle", "filter", "nat"];

fn chains(tool: &str, table: &str) -> Vec<String> {
    let out = Command::new(tool).args(["-w", "5", "-t", table, "-S"]).output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("-N ").map(str::to_string))
            .collect()
    })
    .unwrap_or_default()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn listing(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

impl HostBefore {
    pub fn note() -> HostBefore {
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    std::fs::read_to_string(Path::new("/proc/sys").join(k)).unwrap_or_default(),
                )
            })
            .collect();
        let mut chains_before = Vec::new();
        for tool in IPTABLES {
            for table in TABLES {
                chains_before.push((tool.to_string(), table.to_string(), chains(tool, table)));
            }
        }
        HostBefore {
            sysctls,
            chains: chains_before,
            var_lib_kubelet: Path::new("/var/lib/kubelet").exists(),
            device_plugins: listing(DEVICE_PLUGINS),
            var_lib_cni: Path::new("/var/lib/cni").exists(),
            bridge: link_exists(BRIDGE),
        }
    }

    /// The new KUBE-* chains: each rule that jumps to one is deleted, then the chain.
    fn remove_new_chains(&self) {
        for (tool, table, before) in &self.chains {
            let new: Vec<String> = chains(tool, table)
                .into_iter()
                .filter(|c| c.starts_with("KUBE-") && !before.contains(c))
                .collect();
            if new.is_empty() {
                continue;
            }
            let rules = Command::new(tool).args(["-w", "5", "-t", table, "-S"]).output();
            let rules = rules
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for rule in rules.lines().filter_map(|l| l.strip_prefix("-A ")) {
                if new.iter().any(|c| rule.split_whitespace().any(|w| w == c)) {
                    // Through the shell: `-S` quotes comments ("kubernetes firewall for ..."),
                    // as a shell reads them.
                    let _ = Command::new("sh")
                        .arg("-c")
                        .arg(format!("{tool} -w 5 -t {table} -D {rule}"))
                        .status();
                }
            }
            for c in &new {
                let _ = Command::new(tool).args(["-w", "5", "-t", table, "-F", c]).status();
                let _ = Command::new(tool).args(["-w", "5", "-t", table, "-X", c]).status();
            }
        }
    }

    pub fn restore(&self) {
        for (key, value) in &self.sysctls {
            if !value.is_empty() {
                let _ = std::fs::write(Path::new("/proc/sys").join(key), value);
            }
        }
        self.remove_new_chains();
        if !self.bridge && link_exists(BRIDGE) {
            let _ = Command::new("ip").args(["link", "delete", BRIDGE]).status();
        }
        if !self.var_lib_kubelet {
            let _ = std::fs::remove_dir_all("/var/lib/kubelet");
        } else {
            for name in listing(DEVICE_PLUGINS) {
                if !self.device_plugins.contains(&name) {
                    let _ = std::fs::remove_file(Path::new(DEVICE_PLUGINS).join(name));
                }
            }
        }
        if !self.var_lib_cni {
            // Only what the bridge's pods left: their results and cache, no other tenant's.
            let _ = std::fs::remove_dir_all("/var/lib/cni");
        }
    }

    /// What is not as it was, one line each.
    pub fn differences(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (key, value) in &self.sysctls {
            let now = std::fs::read_to_string(Path::new("/proc/sys").join(key)).unwrap_or_default();
            if &now != value {
                left.push(format!("sysctl {key} is {:?}, was {:?}", now.trim(), value.trim()));
            }
        }
        for (tool, table, before) in &self.chains {
            for c in chains(tool, table) {
                if !before.contains(&c) {
                    left.push(format!("{tool} -t {table}: chain {c} was not there before"));
                }
            }
        }
        if !self.bridge && link_exists(BRIDGE) {
            left.push(format!("the link {BRIDGE} is still there"));
        }
        if !self.var_lib_kubelet && Path::new("/var/lib/kubelet").exists() {
            left.push("/var/lib/kubelet is still there".into());
        }
        if self.var_lib_kubelet && listing(DEVICE_PLUGINS) != self.device_plugins {
            left.push(format!(
                "{DEVICE_PLUGINS} holds {:?}, held {:?}",
                listing(DEVICE_PLUGINS),
                self.device_plugins
            ));
        }
        if !self.var_lib_cni && Path::new("/var/lib/cni").exists() {
            left.push("/var/lib/cni is still there".into());
        }
        left
    }
}

/// The cgroup hierarchies: each v1 controller's (and the named `systemd` one) and the v2 one,
/// as mounted.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (_, point, kind) = (f.next(), f.next()?, f.next()?);
            (kind == "cgroup" || kind == "cgroup2").then(|| PathBuf::from(point))
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// What the cluster could have left, other than what [`HostBefore`] compares: a process
/// running a binary of the cluster or from its directory, a mount under it or under
/// /var/lib/kubelet, a cgroup root, the directory itself.
pub fn leftovers(dir: Option<&Path>, bin: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let needles: Vec<String> = dir
        .map(|d| d.display().to_string())
        .into_iter()
        .chain([bin.display().to_string()])
        .collect();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if needles.iter().any(|n| cmdline.contains(n.as_str())) {
            left.push(format!("process {pid} still runs: {cmdline}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for point in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
        if point.starts_with("/var/lib/kubelet") || needles.iter().any(|n| point.starts_with(n.as_str())) {
            left.push(format!("{point} is still mounted"));
        }
    }
    for h in cgroup_hierarchies() {
        for root in [CGROUP_ROOT, SECOND_CGROUP_ROOT] {
            if h.join(root).exists() {
                left.push(format!("the cgroup {} is still there", h.join(root).display()));
            }
        }
    }
    if let Some(dir) = dir.filter(|d| d.exists()) {
        left.push(format!("{} is still there", dir.display()));
    }
    left
}

pub fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_lowercase();
    name.split('.').next().unwrap().to_string()
}

/// The host-wide lock ([`HOST_LOCK`]), waited for (bounded: another binary's cluster runs for
/// minutes, not hours).
pub fn take_host_lock() -> nix::fcntl::Flock<std::fs::File> {
    use nix::fcntl::FlockArg;
    let limit = Duration::from_secs(30 * 60);
    let start = Instant::now();
    let mut said = false;
    if let Some(dir) = Path::new(HOST_LOCK).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    loop {
        match flock_at(HOST_LOCK, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return lock,
            Err(errno) if errno == nix::errno::Errno::EWOULDBLOCK && start.elapsed() < limit => {
                if !said {
                    eprintln!("waiting for {HOST_LOCK}: another test binary runs a kubelet on this host");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(errno) => panic!("{HOST_LOCK}: {errno} (waited {:?})", start.elapsed()),
        }
    }
}
