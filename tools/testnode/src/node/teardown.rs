//! Stopping a node and putting the host back, from the node's files alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{crictl, NodeFile, SecondNodeFile, CGROUP_ROOT, HOST_FILE, PIDS_FILE, SECOND_CGROUP_ROOT};
use crate::host_before::{cgroup_hierarchies, HostBefore};
use crate::kube::Kube;
use crate::process::{remove_cgroup, stop_pid, unmount_under};

/// Whether process `pid` still runs a program of this node (its binaries or its directory):
/// a pid from a file may have been reused.
fn runs_ours(pid: u32, dir: &Path, names: &[&str]) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let dir = dir.display().to_string();
    cmdline.contains(&dir)
        || names
            .iter()
            .any(|n| cmdline.split('\0').next().is_some_and(|p| p.ends_with(n)))
}

/// Stops the node in `dir` and undoes what it changed on the host, from its files alone (the
/// supervisor's own teardown, and `testnode down` after a supervisor that is gone). The order
/// matters: pods go through kubelet while it runs (`kube` given and `kubelet_runs`); kubelet
/// stops before containerd (it would start the pods again); the hooks still queued are killed
/// and whatever sandboxes are left go through CRI; then containerd and the control plane stop.
/// Cleanup: it never panics, and what it could not undo, [`HostBefore::differences`] and
/// [`leftovers`](crate::host_before::leftovers) show afterwards.
pub fn teardown(dir: &Path, kube: Option<&Kube>, kubelet_runs: bool) {
    let pids: Vec<(String, u32)> = std::fs::read(dir.join(PIDS_FILE))
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok())
        .unwrap_or_default();
    let pids: BTreeMap<String, u32> = pids.into_iter().collect();
    let info = NodeFile::read(dir).ok();
    let stop = |name: &str, grace: Duration| {
        if let Some(pid) = pids.get(name) {
            if runs_ours(*pid, dir, &[name]) {
                stop_pid(*pid as i32, grace);
            }
        }
    };
    if let (Some(kube), true) = (kube, kubelet_runs) {
        kube.delete_all_pods();
    }
    stop("kubelet", Duration::from_secs(20));
    stop("second-kubelet", Duration::from_secs(20));
    if let Some(info) = &info {
        // The second node's too, when one was started (its supervisor's `second down` did not
        // run), at the paths it starts with: `second.json` is written only once it is Ready.
        let second = SecondNodeFile::read(dir)
            .ok()
            .map(|s| (s.vramgate_config, s.containerd.address));
        let second = second.or_else(|| {
            let at = dir.join("second");
            at.is_dir()
                .then(|| (at.join("config.toml"), at.join("containerd/containerd.sock")))
        });
        let nodes = [(dir.join("config.toml"), info.containerd.address.clone())]
            .into_iter()
            .chain(second);
        for (config, address) in nodes {
            kill_queued_hooks(&info.vramgate_bin.join("vramgate"), &config);
            let _ = crictl(&info.kubernetes_bin, &address, &["rmp", "--all", "--force"]).output();
        }
    }
    stop("containerd", Duration::from_secs(10));
    stop("second-containerd", Duration::from_secs(10));
    for name in ["kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"] {
        stop(name, Duration::from_secs(10));
    }
    unmount_under(dir);
    for h in cgroup_hierarchies() {
        remove_cgroup(&h.join(CGROUP_ROOT));
        remove_cgroup(&h.join(SECOND_CGROUP_ROOT));
    }
    let host: Option<HostBefore> = std::fs::read(dir.join(HOST_FILE))
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok());
    if let Some(host) = &host {
        host.restore();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills every hook still queued in the ledger of the host whose config is `config` (a test
/// that failed while one waited): it would wait out its timeout after everything else is gone.
/// Cleanup, not a check: it reads the pids it can and never panics.
pub fn kill_queued_hooks(vramgate: &Path, config: &Path) {
    let Ok(out) = Command::new(vramgate)
        .args(["status", "--json"])
        .env("VRAMGATE_CONFIG", config)
        .output()
    else {
        return;
    };
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let pids = status["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["queue"].as_array().into_iter().flatten())
        .filter_map(|t| t["waiter_pid"].as_u64());
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
