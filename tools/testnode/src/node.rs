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

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vramgate_testbed::Testbed;

use crate::containerd::{build_images, spawn_containerd_on, Containerd, APP_IMAGE, HANDLER, PAUSE_IMAGE};
use crate::host::{cgroup_hierarchies, hostname, take_host_lock, HostBefore};
use crate::host_dirs::{host_dirs_enter, host_dirs_leave};
use crate::kube::Kube;
use crate::process::{daemon, path_with_sbin, remove_cgroup, require, run_ok, stderr, stop_pid, unmount_under};

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

struct Component {
    name: &'static str,
    child: Child,
}

/// What the supervisor's threads share.
struct Running {
    /// The control plane and kubelet, in start order.
    components: Vec<Component>,
    containerd: Option<Child>,
    /// How each containerd that ended ended (raw wait statuses), in order.
    containerd_exits: Vec<i32>,
}

/// The node's supervisor: it started everything, keeps containerd running, answers its
/// control socket and, on `down` or SIGTERM, stops everything and undoes what it changed.
pub struct Supervisor {
    pub info: NodeFile,
    kube: Kube,
    dir: PathBuf,
    bin: PathBuf,
    node: String,
    running: Mutex<Running>,
    changed: Condvar,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// From here SIGTERM, SIGINT and SIGHUP ask the supervisor to stop: while it starts, at its
/// next step (a panic its hook turns into a teardown); once it serves, at once.
pub fn catch_stop_signals() {
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_stop_signal),
            nix::sys::signal::SaFlags::empty(),
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler only stores to an atomic.
        unsafe { nix::sys::signal::sigaction(sig, &action) }.expect("sigaction");
    }
}

/// Between the steps of a start: a stop asked for meanwhile ends it.
fn stop_asked() {
    assert!(!STOP.load(Ordering::SeqCst), "stopped while starting");
}

impl Supervisor {
    /// Starts the node and returns once it is Ready, the RuntimeClass `vramgate` is applied and
    /// pods can be admitted; `node.json` is written then. A failure panics: the panic hook
    /// `testnode up` installs tears down what started.
    pub fn up(options: &Options) -> Supervisor {
        let started = Instant::now();
        require("runc");
        let containerd = Containerd::Two;
        let ctd_path = containerd.path();
        let bin = kubernetes_bin();
        if let Err(e) = check_vramgate_bin(&options.vramgate_bin) {
            panic!("{e}");
        }
        let lock = take_host_lock();
        let dir = options.dir.clone();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        // Before anything changes the host: what teardown puts back.
        let host = HostBefore::note();
        write_json(&dir.join(HOST_FILE), &host);
        host_dirs_enter();
        let config = Testbed::default_config(&dir, &options.config_extra);
        let tb = Testbed::create(&dir, "runc", &options.vramgate_bin.join("vramgate-hook"), &config)
            .unwrap_or_else(|e| panic!("the node's vramgate testbed in {}: {e:#}", dir.display()));
        let dir = tb.dir.clone();
        let kube_dir = dir.join("kube");
        std::fs::create_dir_all(&kube_dir).unwrap();
        let ctd_dir = dir.join("containerd");
        let info = NodeFile {
            dir: dir.clone(),
            node: hostname(),
            kubernetes_version: KUBERNETES_VERSION.into(),
            kubernetes_bin: bin.clone(),
            kubeconfig: kube_dir.join("admin.kubeconfig"),
            api_server: format!("https://127.0.0.1:{APISERVER}"),
            api_server_ca: kube_dir.join("pki/apiserver.crt"),
            kube_dir: kube_dir.clone(),
            vramgate_config: tb.config_path.clone(),
            config_extra: options.config_extra.clone(),
            vramgate_bin: options.vramgate_bin.clone(),
            containerd: ContainerdFile {
                address: ctd_dir.join("containerd.sock"),
                state: ctd_dir.join("ctd-state"),
                dir: ctd_dir.clone(),
                main_config: ctd_dir.join("config.toml"),
                path: ctd_path,
                log: ctd_dir.join("containerd.log"),
            },
            kubelet_root: kube_dir.join("kubelet"),
            cdi_dir: ctd_dir.join("cdi"),
            logs: kube_dir.clone(),
            control_socket: dir.join(CONTROL_SOCKET),
            supervisor_pid: std::process::id(),
        };
        let supervisor = Supervisor {
            kube: info.kube(),
            dir: kube_dir,
            bin,
            node: info.node.clone(),
            info,
            running: Mutex::new(Running {
                components: Vec::new(),
                containerd: None,
                containerd_exits: Vec::new(),
            }),
            changed: Condvar::new(),
            _lock: lock,
        };
        supervisor.write_files();
        supervisor.start_control_plane();
        stop_asked();
        supervisor.start_containerd(&tb);
        stop_asked();
        supervisor.start_kubelet();
        supervisor.wait_node_ready();
        stop_asked();
        supervisor.kube.apply_file(&repo().join("k8s/runtimeclass.yaml"));
        // Pods are admitted only once their namespace's ServiceAccount exists (the
        // controller-manager makes it).
        supervisor.kube.wait(
            "the default ServiceAccount exists",
            START_LIMIT,
            "kube-controller-manager",
            || {
                let out = supervisor
                    .kube
                    .kubectl(&["get", "serviceaccount", "default", "-o", "name"])
                    .output()
                    .unwrap();
                (out.status.success(), stderr(&out))
            },
        );
        write_json(&supervisor.info.dir.join(NODE_FILE), &supervisor.info);
        eprintln!("testnode: node {} Ready in {:?}", supervisor.node, started.elapsed());
        supervisor
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
            write_kubeconfig(&self.dir, name, token);
        }
    }

    /// Starts `program` as component `name`, its output in `<name>.log` (appended: a restart
    /// keeps the first run's lines).
    fn spawn(&self, name: &'static str, program: &Path, args: &[String], path: Option<&str>) {
        let log = self.kube.log(name);
        let mut cmd = daemon(program);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap_or_else(|e| panic!("{}: {e}", log.display())),
        );
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let mut running = self.running.lock().unwrap();
        running.components.push(Component { name, child });
        self.write_pids(&running);
    }

    /// The pids of what runs, for a `testnode down` without this process.
    fn write_pids(&self, running: &Running) {
        let mut pids: Vec<(String, u32)> = running
            .components
            .iter()
            .map(|c| (c.name.to_string(), c.child.id()))
            .collect();
        if let Some(c) = &running.containerd {
            pids.push(("containerd".into(), c.id()));
        }
        write_json(&self.info.dir.join(PIDS_FILE), &pids);
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
        self.kube
            .wait("the API server is ready", START_LIMIT, "kube-apiserver", || {
                let out = self.kube.kubectl(&["get", "--raw", "/readyz"]).output().unwrap();
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

    /// containerd 2.1 set up by the built `vramgate setup containerd`, with a CNI bridge config
    /// (so that the node reports its network ready) and the node's images imported.
    fn start_containerd(&self, tb: &Testbed) {
        let ctd = &self.info.containerd;
        let cni = ctd.dir.join("cni");
        for sub in ["cni/bin", "cni/net.d", "cdi"] {
            std::fs::create_dir_all(ctd.dir.join(sub)).unwrap();
        }
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
        std::fs::write(&ctd.main_config, Containerd::Two.host_config(&ctd.dir)).unwrap();
        // The drop-in as an operator gets it: the built `vramgate setup containerd`, with the
        // default runtime path (the vramgate-runtime beside it).
        run_ok(
            Command::new(self.info.vramgate_bin.join("vramgate"))
                .env("VRAMGATE_CONFIG", &tb.config_path)
                .args(["setup", "containerd", "--config-path"])
                .arg(ctd.dir.join("conf.d/vramgate.toml"))
                .arg("--containerd-config")
                .arg(&ctd.main_config),
        );
        self.spawn_containerd();
        let info = self.crictl_json(&["info"]);
        assert!(
            info["config"]["containerd"]["runtimes"][HANDLER].is_object(),
            "containerd has no `{HANDLER}` runtime after `vramgate setup containerd`: {}",
            info["config"]["containerd"]["runtimes"]
        );
        let tar = build_images(tb);
        run_ok(self.ctr(&["images", "import"]).arg(&tar));
        for image in [PAUSE_IMAGE, APP_IMAGE] {
            self.kube.wait(
                &format!("the CRI plugin sees {image}"),
                CONTAINERD_LIMIT,
                "containerd",
                || {
                    let out = self.crictl(&["inspecti", image]).output().unwrap();
                    (out.status.success(), stderr(&out))
                },
            );
        }
    }

    /// Starts containerd and waits until its CRI plugin answers.
    fn spawn_containerd(&self) {
        let ctd = &self.info.containerd;
        let (child, _, _) = spawn_containerd_on(&ctd.dir, &ctd.main_config, &self.info.vramgate_config, &ctd.path);
        {
            let mut running = self.running.lock().unwrap();
            running.containerd = Some(child);
            self.write_pids(&running);
        }
        // containerd.log is the log `wait` shows for "containerd".
        let _ = std::fs::remove_file(self.kube.log("containerd"));
        let _ = std::os::unix::fs::symlink(&ctd.log, self.kube.log("containerd"));
        self.kube.wait(
            "containerd's CRI plugin answers",
            CONTAINERD_LIMIT,
            "containerd",
            || {
                let out = self.crictl(&["version"]).output().unwrap();
                (out.status.success(), stderr(&out))
            },
        );
    }

    /// crictl against the node's containerd.
    pub fn crictl(&self, args: &[&str]) -> Command {
        crictl(&self.bin, &self.info.containerd.address, args)
    }

    fn crictl_json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&run_ok(&mut self.crictl(args))).unwrap_or_default()
    }

    /// ctr in the CRI plugin's `k8s.io` namespace.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let ctd = &self.info.containerd;
        let mut cmd = Command::new("ctr");
        cmd.env("PATH", &ctd.path)
            .arg("--address")
            .arg(&ctd.address)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    fn containerd_socket(&self) -> &Path {
        &self.info.containerd.address
    }

    fn kubelet_config(&self) -> PathBuf {
        let d = self.dir.display();
        let socket = self.containerd_socket().display();
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

    /// Starts kubelet (again, after [`Supervisor::stop_kubelet`]).
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
        self.spawn("kubelet", &self.bin.join("kubelet"), &args, Some(&path_with_sbin()));
    }

    /// Stops kubelet (SIGTERM), leaving its pods running, as a restart of the service does.
    pub fn stop_kubelet(&self) {
        let kubelet = {
            let mut running = self.running.lock().unwrap();
            let at = running.components.iter().position(|c| c.name == "kubelet");
            let kubelet = at.map(|at| running.components.remove(at));
            self.write_pids(&running);
            kubelet
        };
        if let Some(c) = kubelet {
            stop_pid(c.child.id() as i32, Duration::from_secs(20));
        }
    }

    fn kubelet_runs(&self) -> bool {
        self.running
            .lock()
            .unwrap()
            .components
            .iter()
            .any(|c| c.name == "kubelet")
    }

    pub fn wait_node_ready(&self) {
        self.kube.wait("the node is Ready", START_LIMIT, "kubelet", || {
            self.kube.node_ready(&self.node)
        });
    }

    /// Serves the control socket and keeps containerd running until `down` or SIGTERM
    /// (SIGINT, SIGHUP); then tears the node down.
    pub fn serve(self) {
        let supervisor = Arc::new(self);
        let socket = &supervisor.info.control_socket;
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).unwrap();
        listener.set_nonblocking(true).unwrap();
        while !STOP.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let supervisor = supervisor.clone();
                    std::thread::spawn(move || supervisor.answer(stream));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => eprintln!("testnode: control socket: {e}"),
            }
            supervisor.restart_containerd_if_ended();
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("testnode: stopping the node");
        teardown(&supervisor.info.dir, Some(&supervisor.kube), supervisor.kubelet_runs());
        host_dirs_leave();
    }

    /// Plays containerd's service manager: an ended containerd is started again at once with
    /// the same config, and how it ended is kept for the client that waits for it.
    fn restart_containerd_if_ended(&self) {
        let ended = {
            let mut running = self.running.lock().unwrap();
            match running.containerd.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => {
                    running.containerd = None;
                    Some(status)
                }
                _ => None,
            }
        };
        let Some(status) = ended else {
            return;
        };
        eprintln!("testnode: containerd ended ({status}); starting it again");
        self.spawn_containerd();
        self.running.lock().unwrap().containerd_exits.push(status.into_raw());
        self.changed.notify_all();
    }

    /// One request on the control socket, one line in and one line out.
    fn answer(&self, stream: UnixStream) {
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["kubelet", "stop"] => {
                self.stop_kubelet();
                "ok".to_string()
            }
            ["kubelet", "start"] => {
                if self.kubelet_runs() {
                    "error: kubelet runs".to_string()
                } else {
                    self.start_kubelet();
                    "ok".to_string()
                }
            }
            ["containerd", "pid"] => match &self.running.lock().unwrap().containerd {
                Some(child) => child.id().to_string(),
                None => "error: containerd is being restarted".to_string(),
            },
            ["containerd", "exits"] => self.running.lock().unwrap().containerd_exits.len().to_string(),
            ["containerd", "wait-exit", after, seconds] => match (after.parse::<usize>(), seconds.parse::<u64>()) {
                (Ok(after), Ok(seconds)) => self.wait_containerd_exit(after, Duration::from_secs(seconds)),
                _ => format!("error: bad request {line:?}"),
            },
            ["down"] => {
                STOP.store(true, Ordering::SeqCst);
                "ok".to_string()
            }
            _ => format!("error: unknown request {:?} (kubelet stop|start, containerd pid|exits, containerd wait-exit N SECONDS, down)", line.trim()),
        };
        let _ = (&stream).write_all(format!("{reply}\n").as_bytes());
    }

    /// Waits (at most `limit`) until containerd has ended more than `after` times and been
    /// started again; answers how the `after`-th (from 0) ended, as a raw wait status.
    fn wait_containerd_exit(&self, after: usize, limit: Duration) -> String {
        let running = self.running.lock().unwrap();
        let (running, timeout) = self
            .changed
            .wait_timeout_while(running, limit, |r| r.containerd_exits.len() <= after)
            .unwrap();
        if timeout.timed_out() {
            return format!("error: containerd did not end within {limit:?}");
        }
        format!("exited {}", running.containerd_exits[after])
    }
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
/// [`leftovers`](crate::host::leftovers) show afterwards.
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
        let _ = kube
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
    stop("kubelet", Duration::from_secs(20));
    let config = dir.join("config.toml");
    if let Some(info) = &info {
        kill_queued_hooks(&info.vramgate_bin.join("vramgate"), &config);
        let _ = crictl(
            &info.kubernetes_bin,
            &info.containerd.address,
            &["rmp", "--all", "--force"],
        )
        .output();
    }
    stop("containerd", Duration::from_secs(10));
    for name in ["kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"] {
        stop(name, Duration::from_secs(10));
    }
    unmount_under(dir);
    for h in cgroup_hierarchies() {
        remove_cgroup(&h.join(CGROUP_ROOT));
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

/// One request to the node's supervisor over its control socket, answered within `limit`.
pub fn control(socket: &Path, request: &str, limit: Duration) -> Result<String, String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("{}: {e} (is the node up?)", socket.display()))?;
    stream.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    (&stream)
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("{request}: no answer within {limit:?}: {e}"))?;
    let reply = reply.trim().to_string();
    match reply.strip_prefix("error: ") {
        Some(e) => Err(format!("{request}: {e}")),
        None if reply.is_empty() => Err(format!("{request}: the supervisor closed the socket")),
        None => Ok(reply),
    }
}
