//! A real one-node Kubernetes 1.36.3 cluster, started once by a test binary (tests/kube_node.rs)
//! and torn down with nothing left on the host: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kubelet built from the Go module tools/kube by `scripts/fetch-kubernetes`,
//! on containerd 2.1 (tests/support/cri.rs) whose runtime handler `vramgate` the built
//! `vramgate setup containerd` configures. Nothing in it is a stand-in.
//!
//! Without a certificate authority, as Kubernetes' own node e2e services start one: the API
//! server self-signs its serving certificate (a bundle naming kubernetes.default.svc and the
//! service address 10.96.0.1), every client authenticates with a static token, and kubelet
//! serves with a self-signed certificate and allows anonymous access (logs and exec need no
//! client certificate). Authorization is Node and RBAC, admission the defaults plus
//! NodeRestriction, as a cluster has them.
//!
//! What kubelet changes on the host outside its directories, and how it is undone:
//! - `/var/lib/kubelet/device-plugins/` (kubelet.sock and its checkpoint): `--root-dir` does not
//!   move it, so a host-wide lock (below) keeps two test binaries from running a kubelet at once;
//!   what was not there before is removed.
//! - its cgroup root in every cgroup v1 hierarchy (including the named `systemd` one, where
//!   kubelet refuses to start without it) and in the v2 one: made here, removed here.
//! - the kernel tunables it sets at start (vm.overcommit_memory, kernel.panic, ...): read before,
//!   written back after.
//! - the iptables chains it makes (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY, KUBE-FIREWALL, ... in
//!   IPv4 and IPv6): the KUBE-* chains that were not there before are unlinked and deleted.
//!   Other chains (another test binary's Docker) are left alone.
//! - containerd 2.1's /run/containerd/{s,runc/k8s.io} (tests/support/cri.rs), CNI's
//!   /var/lib/cni, and the CNI bridge's link: removed when this cluster made them.
//!
//! `crate::support::cluster`, used by the real-node binaries (tests/kube_node.rs,
//! tests/kube_helm.rs); it uses `crate::support` and `crate::support::cri`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::cri::*;
use crate::support::*;

/// The version tools/kube pins; the cluster must report it.
/// kubelet's `runtimeRequestTimeout` on the test node, in seconds (see [`Cluster::kubelet_config`]).
pub const RUNTIME_REQUEST_TIMEOUT_S: u64 = 20;
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// The host-wide lock: kubelet's device plugin directory is /var/lib/kubelet/device-plugins
/// whatever `--root-dir` says, and the ports below are fixed, so only one test binary on a
/// host may run a kubelet at a time. flock: released by the kernel when the holder exits,
/// however it ends.
pub const HOST_LOCK: &str = "/run/lock/vramgate-tests-kubelet.lock";
/// kubelet's device plugin directory, which `--root-dir` does not move.
pub const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";
/// The pods' cgroup root (kubelet's `cgroupRoot`), in every hierarchy.
pub const CGROUP_ROOT: &str = "vramgate-kube";
/// The CNI bridge the pods that are not on the host's network are attached to.
pub const BRIDGE: &str = "vgkube0";
/// A wait that takes longer than this is printed with its time.
pub const SLOW_WAIT: Duration = Duration::from_secs(5);
/// Loopback ports: fixed (the host lock makes them this binary's), away from the defaults of
/// a cluster that may run on a developer's machine.
const ETCD_CLIENT: u16 = 23790;
const ETCD_PEER: u16 = 23800;
const APISERVER: u16 = 16443;
const KCM: u16 = 10357;
const SCHEDULER: u16 = 10359;
const KUBELET: u16 = 10350;
const KUBELET_HEALTHZ: u16 = 10348;
/// What kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables
/// with protectKernelDefaults off).
const KUBELET_SYSCTLS: &[&str] = &[
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
const START_LIMIT: Duration = Duration::from_secs(120);

/// Where `scripts/fetch-kubernetes` put the binaries: `$VRAMGATE_KUBERNETES`, else the cache
/// directory keyed as that script keys it (the sha256 of the pins and the script). Fails with
/// one line naming the script that builds them when they are not there.
pub fn kubernetes_bin() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = match std::env::var_os("VRAMGATE_KUBERNETES") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let module = repo.join("tools/kube");
            let mut text = Vec::new();
            for file in ["go.mod", "go.sum", "crictl.mod", "crictl.sum"] {
                text.extend(std::fs::read(module.join(file)).unwrap());
            }
            text.extend(std::fs::read(repo.join("scripts/fetch-kubernetes")).unwrap());
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
    ] {
        assert!(
            bin.join(b).is_file(),
            "Kubernetes {KUBERNETES_VERSION} is not built in {}: run scripts/install-deps (or scripts/fetch-kubernetes)",
            dir.display()
        );
    }
    bin
}

/// A process of the cluster, its output in `log`.
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// The last `lines` lines of a log, for a failure message.
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("({}: {e})", log.display()));
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!(
        "--- last {} lines of {} ---\n{}",
        all.len() - from,
        log.display(),
        all[from..].join("\n")
    )
}

/// The host as it was before the cluster: what teardown puts back and then checks.
struct HostBefore {
    sysctls: Vec<(&'static str, String)>,
    /// (tool, table) -> the chains there.
    chains: BTreeMap<(&'static str, &'static str), Vec<String>>,
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
    fn note() -> HostBefore {
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|k| {
                (
                    *k,
                    std::fs::read_to_string(Path::new("/proc/sys").join(k)).unwrap_or_default(),
                )
            })
            .collect();
        let mut chains_before = BTreeMap::new();
        for tool in IPTABLES {
            for table in TABLES {
                chains_before.insert((*tool, *table), chains(tool, table));
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
        for ((tool, table), before) in &self.chains {
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

    fn restore(&self) {
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
    fn differences(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (key, value) in &self.sysctls {
            let now = std::fs::read_to_string(Path::new("/proc/sys").join(key)).unwrap_or_default();
            if &now != value {
                left.push(format!("sysctl {key} is {:?}, was {:?}", now.trim(), value.trim()));
            }
        }
        for ((tool, table), before) in &self.chains {
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
fn cgroup_hierarchies() -> Vec<PathBuf> {
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

/// The one-node cluster. Dropped (or [`Cluster::teardown`]) it stops everything it started and
/// undoes what they changed.
pub struct Cluster {
    pub bin: PathBuf,
    /// containerd 2.1 with the CRI plugin and the `vramgate` handler, and the node's vramgate
    /// (its testbed: config, ledger). Dropped after kubelet stops.
    cri: Option<Cri>,
    /// The cluster's files (certificates, tokens, kubeconfigs, etcd's data, kubelet's root,
    /// logs): inside the testbed's temporary directory, removed last.
    pub dir: PathBuf,
    scratch: Option<tempfile::TempDir>,
    components: Mutex<Vec<Component>>,
    pub node: String,
    pub admin: PathBuf,
    host: Option<HostBefore>,
    lock: Option<nix::fcntl::Flock<std::fs::File>>,
    pub started_in: Duration,
}

impl Cluster {
    /// Starts the cluster on a vramgate node whose config has `config_extra` (its inventory),
    /// and returns once the node is Ready and the RuntimeClass `vramgate` is applied.
    pub fn start(config_extra: &str) -> Cluster {
        let started = Instant::now();
        require("containerd");
        require("ctr");
        require("runc");
        let bin = kubernetes_bin();
        let lock = take_host_lock();
        let (scratch, tb) = runc_testbed("vramgate-kube", config_extra);
        let dir = tb.dir.join("kube");
        std::fs::create_dir_all(&dir).unwrap();
        let node = hostname();
        let mut cluster = Cluster {
            bin,
            cri: None,
            admin: dir.join("admin.kubeconfig"),
            dir,
            scratch: Some(scratch),
            components: Mutex::new(Vec::new()),
            node,
            host: Some(HostBefore::note()),
            lock: Some(lock),
            started_in: Duration::ZERO,
        };
        // From here a panic drops `cluster`, which stops what started.
        cluster.write_files();
        cluster.start_control_plane();
        cluster.cri = Some(cluster.start_containerd(tb));
        cluster.start_kubelet();
        cluster.wait_node_ready();
        cluster.apply_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/runtimeclass.yaml"));
        // Pods are admitted only once their namespace's ServiceAccount exists (the
        // controller-manager makes it).
        cluster.wait(
            "the default ServiceAccount exists",
            START_LIMIT,
            "kube-controller-manager",
            || {
                let out = cluster
                    .kubectl(&["get", "serviceaccount", "default", "-o", "name"])
                    .output()
                    .unwrap();
                (out.status.success(), stderr(&out))
            },
        );
        cluster.started_in = started.elapsed();
        eprintln!("cluster up in {:?}", cluster.started_in);
        cluster
    }

    pub fn cri(&self) -> &Cri {
        self.cri.as_ref().expect("containerd runs")
    }

    pub fn tb(&self) -> &vramgate_testbed::Testbed {
        &self.cri().tb
    }

    fn write_files(&self) {
        let d = &self.dir;
        for sub in ["pki", "etcd", "kubelet", "kubelet-pki", "podlogs"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        run_ok(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(d.join("pki/sa.key"))
                .arg("2048"),
        );
        let node = &self.node;
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "admintoken,admin,admin,system:masters\n\
                 kcmtoken,system:kube-controller-manager,kcm\n\
                 schedtoken,system:kube-scheduler,sched\n\
                 nodetoken,system:node:{node},node,system:nodes\n"
            ),
        )
        .unwrap();
        for (name, token) in [
            ("admin", "admintoken"),
            ("kcm", "kcmtoken"),
            ("sched", "schedtoken"),
            ("kubelet", "nodetoken"),
        ] {
            self.write_kubeconfig(name, token);
        }
    }

    /// A kubeconfig for the API server with `token`, as `<name>.kubeconfig`; returns its path.
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let d = &self.dir;
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: https://127.0.0.1:{APISERVER}, certificate-authority: {}}}\n\
             users:\n- name: u\n  user: {{token: {token}}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            d.join("pki/apiserver.crt").display()
        );
        let path = d.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, config).unwrap();
        path
    }

    fn spawn(&self, name: &'static str, program: &Path, args: &[String], path: Option<&str>) {
        let log = self.dir.join(format!("{name}.log"));
        let mut cmd = daemon(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.components.lock().unwrap().push(Component { name, child, log });
    }

    /// The log of component `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn start_control_plane(&self) {
        let d = self.dir.display();
        let peer = format!("http://127.0.0.1:{ETCD_PEER}");
        let client = format!("http://127.0.0.1:{ETCD_CLIENT}");
        let etcd = [
            "--name=node".to_string(),
            format!("--data-dir={d}/etcd"),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=node={peer}"),
            "--listen-metrics-urls=".to_string(),
        ];
        self.spawn("etcd", &self.bin.join("etcd"), &etcd, None);
        let apiserver = [
            format!("--etcd-servers={client}"),
            format!("--secure-port={APISERVER}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--cert-dir={d}/pki"),
            format!("--token-auth-file={d}/tokens.csv"),
            "--authorization-mode=Node,RBAC".to_string(),
            // The defaults stay on; NodeRestriction is the one a cluster adds.
            "--enable-admission-plugins=NodeRestriction".to_string(),
            format!("--service-account-key-file={d}/pki/sa.key"),
            format!("--service-account-signing-key-file={d}/pki/sa.key"),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            "--api-audiences=https://kubernetes.default.svc".to_string(),
            "--service-cluster-ip-range=10.96.0.0/16".to_string(),
            "--allow-privileged".to_string(),
        ];
        self.spawn("kube-apiserver", &self.bin.join("kube-apiserver"), &apiserver, None);
        self.wait("the API server is ready", START_LIMIT, "kube-apiserver", || {
            let out = self.kubectl(&["get", "--raw", "/readyz"]).output().unwrap();
            (out.status.success(), stderr(&out))
        });
        let kcm = [
            format!("--kubeconfig={d}/kcm.kubeconfig"),
            "--leader-elect=false".to_string(),
            "--controllers=*".to_string(),
            format!("--root-ca-file={d}/pki/apiserver.crt"),
            format!("--service-account-private-key-file={d}/pki/sa.key"),
            // Each controller with its own ServiceAccount's token, as RBAC's bootstrap roles
            // expect (the controller-manager's own user has only what it needs to start them).
            "--use-service-account-credentials".to_string(),
            format!("--secure-port={KCM}"),
        ];
        self.spawn(
            "kube-controller-manager",
            &self.bin.join("kube-controller-manager"),
            &kcm,
            None,
        );
        let scheduler = [
            format!("--kubeconfig={d}/sched.kubeconfig"),
            "--leader-elect=false".to_string(),
            format!("--secure-port={SCHEDULER}"),
        ];
        self.spawn("kube-scheduler", &self.bin.join("kube-scheduler"), &scheduler, None);
    }

    /// containerd 2.1 set up by the built `vramgate setup containerd` (tests/support/cri.rs),
    /// with a CNI bridge config, so that the node reports its network ready.
    fn start_containerd(&self, tb: vramgate_testbed::Testbed) -> Cri {
        let cni = tb.dir.join("containerd/cni");
        std::fs::create_dir_all(cni.join("bin")).unwrap();
        std::fs::create_dir_all(cni.join("net.d")).unwrap();
        for plugin in ["bridge", "host-local", "loopback"] {
            let from = Path::new("/usr/lib/cni").join(plugin);
            assert!(
                from.is_file(),
                "{} is missing: run scripts/install-deps (containernetworking-plugins)",
                from.display()
            );
            std::os::unix::fs::symlink(&from, cni.join("bin").join(plugin)).unwrap();
        }
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "vramgate-kube",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.45.0/24"}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": tb.dir.join("cni-ipam").display().to_string()}},
                {"type": "loopback"}
            ]
        });
        std::fs::write(cni.join("net.d/10-bridge.conflist"), conflist.to_string()).unwrap();
        Cri::launch(tb, Containerd::Two)
    }

    fn kubelet_config(&self) -> PathBuf {
        let d = self.dir.display();
        let socket = self.cri().address.display();
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
failSwapOn: false
# Since 1.35 kubelet refuses a cgroup v1 host unless told; this one mounts the v1 controllers.
failCgroupV1: false
port: {KUBELET}
healthzPort: {KUBELET_HEALTHZ}
readOnlyPort: 0
podLogsDir: {d}/podlogs
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
# The images are imported and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
# kubelet's deadline on each CRI call (2m by default), short so that a test can wait past it:
# a start queued in vramgate longer than this is cancelled by kubelet itself.
runtimeRequestTimeout: {RUNTIME_REQUEST_TIMEOUT_S}s
"
        );
        let path = self.dir.join("kubelet.yaml");
        std::fs::write(&path, config).unwrap();
        path
    }

    /// Starts kubelet (again, after [`Cluster::stop_kubelet`]).
    pub fn start_kubelet(&self) {
        // Its cgroup root must exist in every hierarchy, the named `systemd` one included.
        for h in cgroup_hierarchies() {
            let _ = std::fs::create_dir_all(h.join(CGROUP_ROOT));
        }
        let d = self.dir.display();
        let config = self.kubelet_config();
        let args = [
            format!("--config={}", config.display()),
            format!("--kubeconfig={d}/kubelet.kubeconfig"),
            format!("--root-dir={d}/kubelet"),
            format!("--cert-dir={d}/kubelet-pki"),
            format!("--hostname-override={}", self.node),
        ];
        // Appends to its log: a restart keeps the first run's lines.
        let log = self.log("kubelet");
        let child = Command::new(self.bin.join("kubelet"))
            .args(args)
            .env("PATH", path_with_sbin())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .expect("starting kubelet");
        self.components.lock().unwrap().push(Component {
            name: "kubelet",
            child,
            log,
        });
    }

    /// Stops kubelet (SIGTERM), leaving its pods running, as a restart of the service does.
    pub fn stop_kubelet(&self) {
        let mut components = self.components.lock().unwrap();
        if let Some(at) = components.iter().position(|c| c.name == "kubelet") {
            let c = components.remove(at);
            stop_pid(c.child.id() as i32, Duration::from_secs(20));
        }
    }

    pub fn wait_node_ready(&self) {
        self.wait("the node is Ready", START_LIMIT, "kubelet", || {
            let node = self.get_json(&["node", &self.node]);
            let ready = node
                .as_ref()
                .and_then(|n| n["status"]["conditions"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (ready, node.map(|n| n["status"]["conditions"].clone()))
        });
    }

    /// Polls `check` every 200 ms for at most `limit`; fails with `what`, the last state and
    /// the tail of `component`'s log. A wait longer than [`SLOW_WAIT`] prints its time.
    pub fn wait<T: std::fmt::Debug>(
        &self,
        what: &str,
        limit: Duration,
        component: &str,
        mut check: impl FnMut() -> (bool, T),
    ) -> T {
        let start = Instant::now();
        loop {
            let (done, state) = check();
            if done {
                // A slow step is named in the output, so that a run's time can be read back
                // to the wait that spent it (the limits are sized for a loaded machine).
                if start.elapsed() > SLOW_WAIT {
                    eprintln!("waited {:?} until {what}", start.elapsed());
                }
                return state;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting until {what}; last: {state:?}\n{}",
                    tail(&self.log(component), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The real kubectl, as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.admin).args(args).stdin(Stdio::null());
        cmd
    }

    /// kubectl with `input` on its stdin.
    pub fn kubectl_in(&self, args: &[&str], input: &str) -> Output {
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `kubectl <args>`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        run_ok(&mut self.kubectl(args))
    }

    /// `kubectl get <args> -o json`; None when kubectl fails (not found, API down).
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let out = self
            .kubectl(&[&["get"], args, &["-o", "json"]].concat())
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// Server-side apply of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_in(
            &["apply", "--server-side", "--field-manager=vramgate-tests", "-f", "-"],
            yaml,
        );
        assert!(out.status.success(), "kubectl apply: {}\n{yaml}", stderr(&out));
        stdout(&out)
    }

    pub fn apply_file(&self, file: &Path) -> String {
        let out = self
            .kubectl(&["apply", "--server-side", "--field-manager=vramgate-tests", "-f"])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl apply {}: {}",
            file.display(),
            stderr(&out)
        );
        stdout(&out)
    }

    /// The cluster as a failed scenario left it, for its failure: the node's conditions, every
    /// pod and claim, the last events, the slices, the node's ledger (`vramgate status`) and the
    /// tails of kubelet's and containerd's logs. Each part is read with a bound; one that cannot
    /// be read says why in its place.
    pub fn state(&self) -> String {
        let mut out = String::new();
        let parts: [(&str, &[&str]); 5] = [
            ("node", &["get", "nodes", "-o", "wide"]),
            ("pods", &["get", "pods", "-A", "-o", "wide"]),
            ("claims", &["get", "resourceclaims", "-A"]),
            ("slices", &["get", "resourceslices", "-o", "wide"]),
            ("events", &["get", "events", "-A", "--sort-by=.lastTimestamp"]),
        ];
        for (what, args) in parts {
            let mut args = args.to_vec();
            args.push("--request-timeout=10s");
            let text = match self.kubectl(&args).output() {
                Ok(o) => stdout(&o) + &stderr(&o),
                Err(e) => format!("kubectl: {e}"),
            };
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(40);
            out += &format!("--- {what}\n{}\n", lines[from..].join("\n"));
        }
        let status = Command::new(VRAMGATE)
            .arg("status")
            .env("VRAMGATE_CONFIG", &self.tb().config_path)
            .output()
            .map(|o| stdout(&o) + &stderr(&o))
            .unwrap_or_else(|e| format!("vramgate status: {e}"));
        out += &format!("--- vramgate status\n{status}\n");
        for log in [self.log("kubelet"), self.tb().dir.join("containerd/containerd.log")] {
            out += &format!("{}\n", tail(&log, 20));
        }
        out
    }

    /// Deletes every pod and waits until they are gone (kubelet stopped their containers).
    pub fn delete_all_pods(&self) {
        let _ = self
            .kubectl(&[
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--wait=true",
                "--timeout=90s",
            ])
            .output();
    }

    /// Stops everything and undoes what the cluster changed on the host; then lists what is
    /// still there that was not before (empty: the host is clean).
    pub fn teardown(mut self) -> Vec<String> {
        let dir = self.scratch.as_ref().map(|s| s.path().to_path_buf());
        let bin = self.bin.clone();
        let host = self.stop_all();
        let mut left = host.map(|h| h.differences()).unwrap_or_default();
        left.extend(leftovers(dir.as_deref(), &bin));
        left
    }

    /// The order matters: pods go through kubelet while it runs; kubelet stops before
    /// containerd (it would start the pods again); whatever sandboxes are left go through CRI
    /// (tests/support/cri.rs's drop), then the control plane stops.
    fn stop_all(&mut self) -> Option<HostBefore> {
        if self.components.lock().unwrap().iter().any(|c| c.name == "kubelet") {
            self.delete_all_pods();
        }
        self.stop_kubelet();
        drop(self.cri.take());
        let mut components = std::mem::take(&mut *self.components.lock().unwrap());
        while let Some(c) = components.pop() {
            stop_pid(c.child.id() as i32, Duration::from_secs(10));
        }
        let host = self.host.take();
        if let Some(scratch) = &self.scratch {
            unmount_under(scratch.path());
        }
        for h in cgroup_hierarchies() {
            remove_cgroup(&h.join(CGROUP_ROOT));
        }
        if let Some(host) = &host {
            host.restore();
        }
        drop(self.scratch.take());
        drop(self.lock.take());
        host
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// What the cluster could have left, other than what [`HostBefore`] compares: a process
/// running a binary of the cluster or from its directory, a mount under it or under
/// /var/lib/kubelet, a cgroup root, the directory itself.
fn leftovers(dir: Option<&Path>, bin: &Path) -> Vec<String> {
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
        if h.join(CGROUP_ROOT).exists() {
            left.push(format!("the cgroup {} is still there", h.join(CGROUP_ROOT).display()));
        }
    }
    if let Some(dir) = dir.filter(|d| d.exists()) {
        left.push(format!("{} is still there", dir.display()));
    }
    left
}

fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_lowercase();
    name.split('.').next().unwrap().to_string()
}

/// The host-wide lock ([`HOST_LOCK`]), waited for (bounded: another binary's cluster runs for
/// minutes, not hours).
fn take_host_lock() -> nix::fcntl::Flock<std::fs::File> {
    use nix::fcntl::{Flock, FlockArg};
    let limit = Duration::from_secs(30 * 60);
    let start = Instant::now();
    let mut said = false;
    if let Some(dir) = Path::new(HOST_LOCK).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)
            .unwrap_or_else(|e| panic!("{HOST_LOCK}: {e}"));
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return lock,
            Err((_, errno)) if errno == nix::errno::Errno::EWOULDBLOCK && start.elapsed() < limit => {
                if !said {
                    eprintln!("waiting for {HOST_LOCK}: another test binary runs a kubelet on this host");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err((_, errno)) => panic!("{HOST_LOCK}: {errno} (waited {:?})", start.elapsed()),
        }
    }
}

/// The API server's port on 127.0.0.1, for a pod on the node's network that cannot reach it
/// through the kubernetes Service (this cluster runs no kube-proxy).
pub const API_SERVER_PORT: u16 = APISERVER;

impl Cluster {
    /// containerd's task directory (its `--state`'s io.containerd.runtime.v2.task): each
    /// container's bundle, which the ledger names.
    pub fn containerd_tasks(&self) -> PathBuf {
        self.cri().state.join("io.containerd.runtime.v2.task")
    }

    /// The CDI directory containerd reads (its `cdi_spec_dirs`).
    pub fn cdi_dir(&self) -> PathBuf {
        self.tb().dir.join("containerd/cdi")
    }

    /// kubelet's `--root-dir`, where its plugin watcher's and DRA drivers' directories are.
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
}

// What both real-node binaries (tests/kube_node.rs, tests/kube_helm.rs) do with pods and the
// node's ledger.

/// The device plugin's resource.
pub const RESOURCE: &str = "vramgate.dev/gpu-memory-gib";
/// How long a pod may take to be placed, started or deleted on the loaded machine.
pub const POD_LIMIT: Duration = Duration::from_secs(120);
/// An app container that runs until stopped, ending at once on SIGTERM.
pub const RUN_UNTIL_STOPPED: &str = "trap 'exit 0' TERM; sleep 600 & wait";

pub fn pod(c: &Cluster, name: &str) -> Option<Value> {
    c.get_json(&["pod", name])
}

/// Waits until pod `name` runs; returns it.
pub fn wait_running(c: &Cluster, name: &str) -> Value {
    c.wait(&format!("pod {name} runs"), POD_LIMIT, "kubelet", || {
        let p = pod(c, name);
        let running = p.as_ref().is_some_and(|p| {
            p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        });
        (running, p)
    })
    .expect("a running pod")
}

/// The message of the first of pod `name`'s events that `matches`, once there is one (waiting
/// at most `limit`); the failure shows the events there were.
pub fn wait_event(c: &Cluster, what: &str, name: &str, limit: Duration, matches: impl Fn(&str) -> bool) -> String {
    let selector = format!("involvedObject.name={name}");
    c.wait(what, limit, "kubelet", || {
        let events = c
            .get_json(&["events", "--field-selector", &selector])
            .map(|e| e["items"].clone())
            .unwrap_or_default();
        let line = events
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str())
            .find(|m| matches(m))
            .map(str::to_string);
        (line.is_some(), line.unwrap_or_else(|| events.to_string()))
    })
}

/// The containerd id of the pod's (first) container: what the ledger names.
pub fn container_id(pod: &Value) -> String {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default();
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("no containerd id in {}", pod["status"]))
        .to_string()
}

/// Deletes pod `name` and returns once the API server no longer has it (kubelet stopped its
/// containers and confirmed).
pub fn delete_pod(c: &Cluster, name: &str) {
    c.kubectl_ok(&["delete", "pod", name, "--wait=true", "--timeout=90s"]);
    assert!(pod(c, name).is_none(), "pod {name} is still there");
}

/// The ledger's reservations (`vramgate status --json`), as (container id, GiB), sorted.
pub fn ledger(c: &Cluster) -> Vec<(String, u64)> {
    let mut held: Vec<(String, u64)> = reservations(c.tb()).into_iter().map(|(id, b)| (id, b / GIB)).collect();
    held.sort();
    held
}

/// Waits until the ledger holds exactly `want` (any order).
pub fn wait_ledger(c: &Cluster, what: &str, mut want: Vec<(String, u64)>) {
    want.sort();
    c.wait(what, POD_LIMIT, "kubelet", || {
        let held = ledger(c);
        (held == want, held)
    });
}

/// The real-node binaries' arguments (libtest-mimic's, so `cargo test --test kube_node --
/// <filter>` and `--list` work), with one thread: their scenarios share the node, its GPU and
/// its ledger. With `--list`, lists the scenarios and exits before any cluster starts.
pub fn scenario_args<S>(scenarios: &[(&'static str, fn(&S))]) -> libtest_mimic::Arguments {
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    if args.list {
        let trials = scenarios
            .iter()
            .map(|(name, _)| libtest_mimic::Trial::test(*name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    args
}

/// Runs each scenario as a named trial on `state`, printing its time; after a failed one,
/// names it and runs `after_failure`, which prints the cluster's state and removes what it
/// left (its pods), so that it does not fail the next. Gives
/// `state` back for the binary's teardown.
pub fn run_scenarios<S: Send + Sync + 'static>(
    args: &libtest_mimic::Arguments,
    scenarios: &[(&'static str, fn(&S))],
    state: S,
    after_failure: fn(&S),
) -> (S, libtest_mimic::Conclusion) {
    let state = std::sync::Arc::new(state);
    let trials = scenarios
        .iter()
        .map(|&(name, scenario)| {
            let state = state.clone();
            libtest_mimic::Trial::test(name, move || {
                let start = Instant::now();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&state)));
                eprintln!("{name}: {:?}", start.elapsed());
                let result = result.map_err(|e| panic_message(&e));
                if let Err(message) = &result {
                    eprintln!("scenario {name} failed: {message}");
                    after_failure(&state);
                }
                result.map_err(|message| libtest_mimic::Failed::from(format!("scenario {name}: {message}")))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(args, trials);
    let state = std::sync::Arc::try_unwrap(state).unwrap_or_else(|_| panic!("a trial still holds the cluster"));
    (state, conclusion)
}

/// A scenario's panic as the trial's failure message.
pub fn panic_message(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}
