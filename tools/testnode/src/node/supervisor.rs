//! The node's supervisor: it starts the control plane, containerd and kubelet, keeps
//! containerd running as its service manager would, answers the control socket, and on
//! `down` or SIGTERM tears the node down.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vramgate_testbed::Testbed;

use super::*;
use crate::containerd::{build_images, spawn_containerd_on, Containerd, APP_IMAGE, HANDLER, PAUSE_IMAGE};
use crate::host_before::{cgroup_hierarchies, hostname, take_host_lock, HostBefore};
use crate::host_dirs::{host_dirs_enter, host_dirs_leave};
use crate::kube::Kube;
use crate::process::{daemon, path_with_sbin, require, run_ok, stderr, stop_pid};

mod second;
pub use second::panic_is_caught;

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
    /// The second node, while it is up (its processes are among `components`).
    second: Option<SecondNodeFile>,
    /// Whether a `second up` is under way (one at a time; `second down` waits for it).
    second_starting: bool,
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
                second: None,
                second_starting: false,
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
        // Built in, so the tool runs where its source tree is not (a GPU host it was carried to).
        supervisor.kube.apply(RUNTIME_CLASS);
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
                 nodetoken,system:node:{node},node,system:nodes\n\
                 secondnodetoken,system:node:{node}-second,second-node,system:nodes\n"
            ),
        )
        .unwrap();
        for (name, token) in [
            ("admin", "admintoken"),
            ("kcm", "kcmtoken"),
            ("sched", "schedtoken"),
            ("kubelet", "nodetoken"),
            ("second-kubelet", "secondnodetoken"),
        ] {
            write_kubeconfig(&self.dir, name, token);
        }
    }

    /// Starts `program` as component `name`, its output in `<name>.log` (appended: a restart
    /// keeps the first run's lines).
    fn spawn(&self, name: &'static str, program: &Path, args: &[String], path: Option<&str>) {
        let mut cmd = daemon(program);
        cmd.args(args);
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        self.spawn_command(name, cmd);
    }

    /// Starts `cmd` (a [`daemon`]) as component `name`, as [`Supervisor::spawn`] does.
    fn spawn_command(&self, name: &'static str, mut cmd: Command) {
        let log = self.kube.log(name);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap_or_else(|e| panic!("{}: {e}", log.display())),
        );
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
        self.configure_containerd(ctd, tb);
        self.spawn_containerd();
        self.import_images(ctd, tb, "containerd");
    }

    /// containerd's config in `ctd.dir` for the node whose vramgate testbed is `tb`: its host
    /// config, the CNI bridge config (so that the node reports its network ready; one bridge
    /// and one address store for the nodes of this host), and the drop-in of the built
    /// `vramgate setup containerd`.
    fn configure_containerd(&self, ctd: &ContainerdFile, tb: &Testbed) {
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
                          "dataDir": self.info.dir.join("cni-ipam").display().to_string()}},
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
    }

    /// Checks that the running containerd at `ctd` has vramgate's runtime, and imports the
    /// node's images (built from `tb`'s rootfs) into it; `log` names its log for a failure.
    fn import_images(&self, ctd: &ContainerdFile, tb: &Testbed, log: &str) {
        let crictl_on = |args: &[&str]| crictl(&self.bin, &ctd.address, args);
        let info: serde_json::Value = serde_json::from_str(&run_ok(&mut crictl_on(&["info"]))).unwrap_or_default();
        assert!(
            info["config"]["containerd"]["runtimes"][HANDLER].is_object(),
            "containerd has no `{HANDLER}` runtime after `vramgate setup containerd`: {}",
            info["config"]["containerd"]["runtimes"]
        );
        let tar = build_images(tb);
        run_ok(crate::containerd::ctr(&ctd.path, &ctd.address, &["images", "import"]).arg(&tar));
        for image in [PAUSE_IMAGE, APP_IMAGE] {
            self.kube
                .wait(&format!("the CRI plugin sees {image}"), CONTAINERD_LIMIT, log, || {
                    let out = crictl_on(&["inspecti", image]).output().unwrap();
                    (out.status.success(), stderr(&out))
                });
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

    /// ctr in the CRI plugin's `k8s.io` namespace.
    pub fn ctr(&self, args: &[&str]) -> Command {
        crate::containerd::ctr(&self.info.containerd.path, &self.info.containerd.address, args)
    }

    fn containerd_socket(&self) -> &Path {
        &self.info.containerd.address
    }

    fn kubelet_config(&self) -> PathBuf {
        kubelet_config(
            &self.dir,
            self.containerd_socket(),
            CGROUP_ROOT,
            KUBELET,
            KUBELET_HEALTHZ,
        )
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
        self.stop_component("kubelet", Duration::from_secs(20));
    }

    /// Stops component `name` (SIGTERM, then SIGKILL after `grace`), if it runs, and forgets it.
    fn stop_component(&self, name: &str, grace: Duration) {
        let component = {
            let mut running = self.running.lock().unwrap();
            let at = running.components.iter().position(|c| c.name == name);
            let component = at.map(|at| running.components.remove(at));
            self.write_pids(&running);
            component
        };
        if let Some(c) = component {
            stop_pid(c.child.id() as i32, grace);
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
        // The second node first, while the API server runs: its Node object goes too.
        supervisor.second_down();
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
            ["second", "up"] => self.second_up(),
            ["second", "down"] => self.second_down(),
            ["down"] => {
                STOP.store(true, Ordering::SeqCst);
                "ok".to_string()
            }
            _ => format!("error: unknown request {:?} (kubelet stop|start, containerd pid|exits, containerd wait-exit N SECONDS, second up|down, down)", line.trim()),
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

/// kubelet's config in `dir` (`kubelet.yaml`) for a node on the containerd at `socket`, with
/// its pods under cgroup `cgroup_root` and its ports; returns its path.
fn kubelet_config(dir: &Path, socket: &Path, cgroup_root: &str, port: u16, healthz: u16) -> PathBuf {
    let d = dir.display();
    let socket = socket.display();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failSwapOn: false
# Since 1.35 kubelet refuses a cgroup v1 host unless told; this one mounts the v1 controllers.
failCgroupV1: false
port: {port}
healthzPort: {healthz}
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
    let path = dir.join("kubelet.yaml");
    std::fs::write(&path, config).unwrap();
    path
}
