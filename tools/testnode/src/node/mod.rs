//! The one-node Kubernetes 1.36.3 the real-node tests are clients of, started and stopped by
//! one supervisor process (`testnode up`, or a test binary re-run as the tool), with nothing
//! left on the host afterwards: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
//! and kubelet built from the Go module tools/kube by `scripts/fetch-kubernetes`, on containerd
//! 2.1 whose runtime handler `vramgate` the built `vramgate setup containerd` configures.
//! Nothing in it is a stand-in.
//!
//! Without a certificate authority, as Kubernetes' own node e2e services start one: the API
//! server self-signs its serving certificate (a bundle naming kubernetes.default.svc and the
//! service address 10.96.0.1), every client authenticates with a static token, and kubelet
//! serves with a self-signed certificate and allows anonymous access (logs and exec need no
//! client certificate). Authorization is Node and RBAC, admission the defaults plus
//! NodeRestriction, as a cluster has them.
//!
//! The supervisor plays the node's service manager: it restarts containerd whenever it exits
//! (systemd's `Restart=always`, which `vramgate setup-node`'s SIGHUP relies on), and stops and
//! starts kubelet when a client asks, over the node's control socket. It writes what a client
//! needs into `node.json` once the node is Ready, and what teardown needs (the host as it was,
//! the pids) into the node's directory as it goes, so that `testnode down` can undo a node
//! whose supervisor is gone.
//!
//! What kubelet changes on the host outside its directories, and how it is undone:
//! - `/var/lib/kubelet/device-plugins/` (kubelet.sock and its checkpoint): `--root-dir` does not
//!   move it, so a host-wide lock keeps two nodes from running a kubelet at once; what was not
//!   there before is removed.
//! - its cgroup root in every cgroup v1 hierarchy (including the named `systemd` one, where
//!   kubelet refuses to start without it) and in the v2 one: made here, removed here.
//! - the kernel tunables it sets at start (vm.overcommit_memory, kernel.panic, ...): read before,
//!   written back after.
//! - the iptables chains it makes (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY, KUBE-FIREWALL, ... in
//!   IPv4 and IPv6): the KUBE-* chains that were not there before are unlinked and deleted.
//!   Other chains (another test binary's Docker) are left alone.
//! - containerd 2.1's /run/containerd/{s,runc/k8s.io}, CNI's /var/lib/cni, and the CNI bridge's
//!   link: removed when this node made them.
//!
//! A second node joins on request (`second up` on the control socket, supervisor/second.rs):
//! its own kubelet, root, containerd and vramgate ledger, for the scenarios where
//! kube-scheduler chooses between nodes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::kube::Kube;

mod control;
mod supervisor;
mod teardown;

pub use control::control;
pub use supervisor::{catch_stop_signals, panic_is_caught, Supervisor};
pub use teardown::{kill_queued_hooks, teardown};

/// The version tools/kube pins; the cluster must report it.
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// kubelet's `runtimeRequestTimeout` on the node, in seconds (see [`Supervisor::kubelet_config`]).
pub const RUNTIME_REQUEST_TIMEOUT_S: u64 = 20;
/// The host-wide lock: kubelet's device plugin directory is /var/lib/kubelet/device-plugins
/// whatever `--root-dir` says, and the ports below are fixed, so only one node on a host may
/// run a kubelet at a time. flock: released by the kernel when the holder exits, however it
/// ends.
pub const HOST_LOCK: &str = "/run/lock/vramgate-tests-kubelet.lock";
/// kubelet's device plugin directory, which `--root-dir` does not move.
pub const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";
/// The pods' cgroup root (kubelet's `cgroupRoot`), in every hierarchy.
pub const CGROUP_ROOT: &str = "vramgate-kube";
/// The CNI bridge the pods that are not on the host's network are attached to.
pub const BRIDGE: &str = "vgkube0";
/// The API server's port on 127.0.0.1 (a pod on the node's network reaches it there: this
/// cluster runs no kube-proxy).
pub const API_SERVER_PORT: u16 = 16443;
/// Loopback ports: fixed (the host lock makes them this node's), away from the defaults of
/// a cluster that may run on a developer's machine.
const ETCD_CLIENT: u16 = 23790;
const ETCD_PEER: u16 = 23800;
const APISERVER: u16 = API_SERVER_PORT;
const KCM: u16 = 10357;
const SCHEDULER: u16 = 10359;
const KUBELET: u16 = 10350;
const KUBELET_HEALTHZ: u16 = 10348;
/// The second node's kubelet ([`SecondNodeFile`]).
const SECOND_KUBELET: u16 = 10352;
const SECOND_KUBELET_HEALTHZ: u16 = 10346;
/// The second node's pods' cgroup root, in every hierarchy.
pub const SECOND_CGROUP_ROOT: &str = "vramgate-kube-second";
/// The second node's one simulated GPU, as large as the first node's.
pub const SECOND_GPU: &str = "GPU-4b000000-0000-0000-0000-000000000046";
/// What kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables
/// with protectKernelDefaults off).
pub const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    // The CNI bridge plugin turns forwarding on for a gateway bridge.
    "net/ipv4/ip_forward",
];
/// How long a component may take to come up on the loaded 2-core machine.
pub const START_LIMIT: Duration = Duration::from_secs(120);
/// How long containerd may take to answer on its CRI socket after a start.
const CONTAINERD_LIMIT: Duration = Duration::from_secs(60);

/// The simulated GPU of the node's default inventory (`testnode up` without `--config-extra`).
pub const SIMULATED_GPU: &str = "GPU-4b000000-0000-0000-0000-000000000045";
pub const SIMULATED_GPU_GIB: u64 = 8;

/// The node's vramgate config beyond its state directory, by default: one simulated GPU.
pub fn default_config_extra() -> String {
    format!(
        "[inventory]\nbackend = \"static\"\n\
         [[inventory.gpus]]\nindex = 0\nuuid = \"{SIMULATED_GPU}\"\ntotal = \"{SIMULATED_GPU_GIB}Gi\"\nused_outside = \"0\"\n"
    )
}

/// The RuntimeClass the node starts with: the shipped k8s/runtimeclass.yaml.
pub const RUNTIME_CLASS: &str = include_str!("../../../../k8s/runtimeclass.yaml");

/// The repository this crate is built from (its manifests, its pinned Kubernetes).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where `scripts/fetch-kubernetes` put the binaries: `$VRAMGATE_KUBERNETES`, else the cache
/// directory keyed as that script keys it (the sha256 of the pins and the script). Fails with
/// one line naming the script that builds them when they are not there.
pub fn kubernetes_bin() -> PathBuf {
    let repo = repo();
    let dir = match std::env::var_os("VRAMGATE_KUBERNETES") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let module = repo.join("tools/kube");
            let mut text = Vec::new();
            for file in ["go.mod", "go.sum", "crictl.mod", "crictl.sum"] {
                let path = module.join(file);
                text.extend(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
            }
            text.extend(std::fs::read(repo.join("scripts/fetch-kubernetes")).unwrap_or_default());
            let mut child = Command::new("sha256sum")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("sha256sum");
            child.stdin.take().unwrap().write_all(&text).unwrap();
            let sum = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
            PathBuf::from(format!("/var/cache/vramgate-tests/kubernetes-{}", &sum[..16]))
        }
    };
    let bin = dir.join("bin");
    for b in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kubectl",
        "crictl",
    ] {
        assert!(
            bin.join(b).is_file(),
            "Kubernetes {KUBERNETES_VERSION} is not built in {}: run scripts/install-deps (or scripts/fetch-kubernetes)",
            dir.display()
        );
    }
    bin
}

/// The file a Ready node's supervisor writes in its directory for its clients.
pub const NODE_FILE: &str = "node.json";
/// The file the supervisor writes once the second node is Ready, removed when it goes.
pub const SECOND_FILE: &str = "second.json";
/// The host as it was, written before anything changes it.
pub const HOST_FILE: &str = "host-before.json";
/// The pids of the node's processes, rewritten on every start and stop.
pub const PIDS_FILE: &str = "pids.json";
/// The control socket (root only).
pub const CONTROL_SOCKET: &str = "control.sock";

/// What a client needs to use the node: written by the supervisor once the node is Ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeFile {
    /// The node's directory (vramgate's testbed: its config, state and rootfs; `kube/`).
    pub dir: PathBuf,
    /// The node's name.
    pub node: String,
    pub kubernetes_version: String,
    /// The Kubernetes binaries (kubectl among them).
    pub kubernetes_bin: PathBuf,
    /// The admin's kubeconfig.
    pub kubeconfig: PathBuf,
    pub api_server: String,
    /// The API server's serving certificate, which clients trust.
    pub api_server_ca: PathBuf,
    /// The cluster's files: certificates, kubeconfigs, etcd's data, kubelet's root, the logs.
    pub kube_dir: PathBuf,
    /// The node's vramgate config (what the hooks, the wrapper and `vramgate status` read).
    pub vramgate_config: PathBuf,
    /// What that config holds beyond its state directory (the inventory).
    pub config_extra: String,
    /// The vramgate binaries the node was set up with.
    pub vramgate_bin: PathBuf,
    pub containerd: ContainerdFile,
    pub kubelet_root: PathBuf,
    /// The CDI directory containerd reads.
    pub cdi_dir: PathBuf,
    /// The directory of `<component>.log`.
    pub logs: PathBuf,
    pub control_socket: PathBuf,
    pub supervisor_pid: u32,
}

/// The node's containerd, as a client reaches it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContainerdFile {
    pub address: PathBuf,
    /// Its `--state`, where the runc shim keeps each container's bundle.
    pub state: PathBuf,
    /// Its directory (log, root, drop-ins) and main config.
    pub dir: PathBuf,
    pub main_config: PathBuf,
    /// The PATH containerd, its shims and `ctr` are found on.
    pub path: String,
    pub log: PathBuf,
}

impl NodeFile {
    /// The node file in `dir`, or one line saying why there is none.
    pub fn read(dir: &Path) -> Result<NodeFile, String> {
        let path = dir.join(NODE_FILE);
        let text = std::fs::read(&path).map_err(|e| {
            format!(
                "{}: {e}: no Ready node there (start one with `testnode up --dir {}`)",
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// kubectl as the admin.
    pub fn kube(&self) -> Kube {
        Kube {
            kubectl: self.kubernetes_bin.join("kubectl"),
            kubeconfig: self.kubeconfig.clone(),
            logs: self.logs.clone(),
        }
    }
}

/// The second node, as a client uses it: written by the supervisor once it is Ready. Its own
/// vramgate config, ledger and simulated GPU; its kubelet's root is `kube_dir/kubelet` (where a
/// DRA driver for it registers), its containerd's CDI directory `cdi_dir`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecondNodeFile {
    pub node: String,
    /// Its vramgate testbed (config, state, rootfs); everything of the node is under it.
    pub dir: PathBuf,
    pub vramgate_config: PathBuf,
    /// kubelet's files (its root, config, logs).
    pub kube_dir: PathBuf,
    pub containerd: ContainerdFile,
    pub cdi_dir: PathBuf,
}

impl SecondNodeFile {
    /// The second node of the node in `dir`, or one line saying why there is none.
    pub fn read(dir: &Path) -> Result<SecondNodeFile, String> {
        let path = dir.join(SECOND_FILE);
        let text = std::fs::read(&path)
            .map_err(|e| format!("{}: {e}: no second node (ask for one with `second up`)", path.display()))?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// The second node's vramgate config beyond its state directory: one simulated GPU of the
/// first node's size.
pub fn second_config_extra() -> String {
    default_config_extra().replace(SIMULATED_GPU, SECOND_GPU)
}

/// What `testnode up` is given.
#[derive(Debug, Clone)]
pub struct Options {
    /// The node's directory: made by `up`, removed by `down`.
    pub dir: PathBuf,
    /// The node's vramgate config beyond its state directory (its inventory).
    pub config_extra: String,
    /// Where the vramgate binaries are (vramgate, vramgate-hook, vramgate-runtime).
    pub vramgate_bin: PathBuf,
}

/// The vramgate binaries a node is set up with, checked present.
pub fn check_vramgate_bin(dir: &Path) -> Result<(), String> {
    for b in ["vramgate", "vramgate-hook", "vramgate-runtime"] {
        if !dir.join(b).is_file() {
            return Err(format!(
                "{} is missing: build vramgate first (cargo build --release), or pass --vramgate-bin",
                dir.join(b).display()
            ));
        }
    }
    Ok(())
}

/// crictl against the containerd at `address`, with a deadline long enough to stop pods.
pub fn crictl(bin: &Path, address: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin.join("crictl"));
    cmd.arg("--runtime-endpoint")
        .arg(format!("unix://{}", address.display()))
        .args(["--timeout", "60s"])
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// A kubeconfig for the API server with `token`, as `<dir>/<name>.kubeconfig`; returns its
/// path.
pub fn write_kubeconfig(dir: &Path, name: &str, token: &str) -> PathBuf {
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: https://127.0.0.1:{APISERVER}, certificate-authority: {}}}\n\
         users:\n- name: u\n  user: {{token: {token}}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        dir.join("pki/apiserver.crt").display()
    );
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, config).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

fn write_json(path: &Path, value: &impl Serialize) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
