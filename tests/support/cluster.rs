//! The one-node Kubernetes 1.36.3 as the real-node binaries (tests/kube_node.rs,
//! tests/kube_helm.rs) see it: as clients. The node itself is tools/testnode's (the crate
//! `testnode`): with `VRAMGATE_TESTNODE=<dir>` the tests use the node a developer's
//! `testnode up --dir <dir>` started (and leave it up); without it, the binary re-runs itself as
//! the tool (`testnode up --foreground`, the same code), waits for the node to be Ready, and
//! stops it at the end, then checks that the host is as it was.
//!
//! What the scenarios ask of the node's internals (its vramgate config and ledger, containerd's
//! socket and state, kubelet's root) comes from the node's `node.json`; a kubelet stop or start
//! and a wait for containerd's restart go to its supervisor's control socket.
//!
//! `crate::support::cluster`; it uses `crate::support` and `crate::support::cri`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use testnode::host_before::HostBefore;
use testnode::kube::Kube;
use testnode::node::{control, NodeFile, SecondNodeFile, HOST_FILE};
// What the scenarios check the node against.
#[allow(unused_imports)]
pub use testnode::node::{
    default_config_extra, kubernetes_bin, API_SERVER_PORT, DEVICE_PLUGINS, KUBERNETES_VERSION,
    RUNTIME_REQUEST_TIMEOUT_S, SIMULATED_GPU, SIMULATED_GPU_GIB, START_LIMIT,
};

use crate::support::cri::*;
use crate::support::*;

/// The variable that points the tests at a running node's directory.
pub const TESTNODE_ENV: &str = "VRAMGATE_TESTNODE";
/// How long the node may take to come up (the tool's components each have a shorter limit).
const UP_LIMIT: Duration = Duration::from_secs(600);

/// The node, as its clients use it.
pub struct Cluster {
    pub info: NodeFile,
    kube: Kube,
    /// The Kubernetes binaries.
    pub bin: PathBuf,
    /// The cluster's files (certificates, kubeconfigs, logs); kubeconfigs a test writes go here.
    pub dir: PathBuf,
    pub node: String,
    /// The admin's kubeconfig.
    pub admin: PathBuf,
    cri: Cri,
    /// The supervisor, when this binary started the node; None when it uses another's.
    supervisor: Option<Child>,
    /// The host as it was before this binary's node, checked after it stops.
    host: Option<HostBefore>,
    pub started_in: Duration,
}

impl Cluster {
    /// The node for these tests, whose vramgate config holds `config_extra` (its inventory):
    /// the one `VRAMGATE_TESTNODE` names (which must have that config), else one started here
    /// through the tool.
    pub fn start(config_extra: &str) -> Cluster {
        let started = Instant::now();
        let (info, supervisor) = match std::env::var_os(TESTNODE_ENV) {
            Some(dir) => {
                let info = NodeFile::read(Path::new(&dir)).unwrap_or_else(|e| panic!("{TESTNODE_ENV}: {e}"));
                assert_eq!(
                    info.config_extra, config_extra,
                    "{TESTNODE_ENV}={}: the node's vramgate config is not the one these tests need (start it with `testnode up` and no --config-extra)",
                    info.dir.display()
                );
                eprintln!("using the node in {} ({TESTNODE_ENV})", info.dir.display());
                (info, None)
            }
            None => {
                let (info, child) = start_node(config_extra);
                (info, Some(child))
            }
        };
        let host = supervisor
            .as_ref()
            .map(|_| serde_json::from_slice(&std::fs::read(info.dir.join(HOST_FILE)).unwrap()).unwrap());
        let tb = vramgate_testbed::Testbed::open(&info.dir, "runc", &info.vramgate_bin.join("vramgate-hook"))
            .unwrap_or_else(|e| panic!("the node's testbed in {}: {e:#}", info.dir.display()));
        let cri = Cri::attach(tb, &info);
        let cluster = Cluster {
            kube: info.kube(),
            bin: info.kubernetes_bin.clone(),
            dir: info.kube_dir.clone(),
            node: info.node.clone(),
            admin: info.kubeconfig.clone(),
            info,
            cri,
            supervisor,
            host,
            started_in: started.elapsed(),
        };
        eprintln!("cluster up in {:?}", cluster.started_in);
        cluster
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    pub fn tb(&self) -> &vramgate_testbed::Testbed {
        &self.cri.tb
    }

    /// A kubeconfig for the API server with `token`, as `<name>.kubeconfig`; returns its path.
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        testnode::node::write_kubeconfig(&self.dir, name, token)
    }

    /// The log of component `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.kube.log(name)
    }

    /// Starts kubelet again, after [`Cluster::stop_kubelet`].
    pub fn start_kubelet(&self) {
        control(&self.info.control_socket, "kubelet start", Duration::from_secs(60)).unwrap();
    }

    /// Stops kubelet (SIGTERM), leaving its pods running, as a restart of the service does.
    pub fn stop_kubelet(&self) {
        control(&self.info.control_socket, "kubelet stop", Duration::from_secs(60)).unwrap();
    }

    pub fn wait_node_ready(&self) {
        self.wait("the node is Ready", START_LIMIT, "kubelet", || {
            self.kube.node_ready(&self.node)
        });
    }

    /// Polls `check` every 200 ms for at most `limit`; fails with `what`, the last state and
    /// the tail of `component`'s log.
    pub fn wait<T: std::fmt::Debug>(
        &self,
        what: &str,
        limit: Duration,
        component: &str,
        check: impl FnMut() -> (bool, T),
    ) -> T {
        self.kube.wait(what, limit, component, check)
    }

    /// The real kubectl, as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Command {
        self.kube.kubectl(args)
    }

    /// kubectl with `input` on its stdin.
    pub fn kubectl_in(&self, args: &[&str], input: &str) -> Output {
        self.kube.kubectl_in(args, input)
    }

    /// `kubectl <args>`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kube.kubectl_ok(args)
    }

    /// `kubectl get <args> -o json`; None when kubectl fails (not found, API down).
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        self.kube.get_json(args)
    }

    /// Server-side apply of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        self.kube.apply(yaml)
    }

    pub fn apply_file(&self, file: &Path) -> String {
        self.kube.apply_file(file)
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
        self.kube.delete_all_pods()
    }

    /// Stops the node this binary started (the tool's teardown) and lists what is still on
    /// the host that was not before (empty: the host is clean). A node this binary did not
    /// start stays up, its pods deleted.
    pub fn teardown(mut self) -> Vec<String> {
        let Some(child) = self.supervisor.take() else {
            self.give_back();
            return Vec::new();
        };
        stop_node(child, &self.info);
        let mut left = self.host.take().map(|h| h.differences()).unwrap_or_default();
        left.extend(testnode::host_before::leftovers(Some(&self.info.dir), &self.bin));
        left
    }

    /// Removes what the scenarios make on a node they share with the next run (one
    /// `VRAMGATE_TESTNODE` names): every pod, claim, claim template and slice, and the objects
    /// of the manifests they apply (k8s/dra.yaml, k8s/device-plugin.yaml). Cleanup: what
    /// cannot be removed is printed, not failed.
    pub fn give_back(&self) {
        self.delete_all_pods();
        let k8s = testnode::node::repo().join("k8s");
        let mut deletes: Vec<Vec<String>> = ["resourceclaims", "resourceclaimtemplates"]
            .iter()
            .map(|kind| vec![kind.to_string(), "--all".into(), "--all-namespaces".into()])
            .collect();
        deletes.push(vec!["resourceslices".into(), "--all".into()]);
        for manifest in ["dra.yaml", "device-plugin.yaml"] {
            deletes.push(vec!["-f".into(), k8s.join(manifest).display().to_string()]);
        }
        for what in deletes {
            let mut args = vec!["delete", "--ignore-not-found", "--wait=true", "--timeout=60s"];
            args.extend(what.iter().map(String::as_str));
            let out = self.kubectl(&args).output().unwrap();
            if !out.status.success() {
                eprintln!("giving the node back: kubectl {}: {}", args.join(" "), stderr(&out));
            }
        }
    }

    /// containerd's task directory (its `--state`'s io.containerd.runtime.v2.task): each
    /// container's bundle, which the ledger names.
    pub fn containerd_tasks(&self) -> PathBuf {
        self.info.containerd.state.join("io.containerd.runtime.v2.task")
    }

    /// The CDI directory containerd reads (its `cdi_spec_dirs`).
    pub fn cdi_dir(&self) -> PathBuf {
        self.info.cdi_dir.clone()
    }

    /// kubelet's `--root-dir`, where its plugin watcher's and DRA drivers' directories are.
    pub fn kubelet_root(&self) -> PathBuf {
        self.info.kubelet_root.clone()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(child) = self.supervisor.take() {
            stop_node(child, &self.info);
        }
    }
}

/// This binary re-run as the tool (`testnode up --foreground`) on a new directory; returns once
/// the node is Ready. The supervisor gets SIGTERM (and tears the node down) when this process
/// ends, however it ends.
fn start_node(config_extra: &str) -> (NodeFile, Child) {
    use std::os::unix::process::CommandExt;
    let scratch = tempfile::Builder::new().prefix("vramgate-kube").tempdir().unwrap();
    // The supervisor makes the node's directory and removes it at the end.
    let dir = scratch.path().join("node");
    let extra = scratch.path().join("config-extra.toml");
    std::fs::write(&extra, config_extra).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([testnode::cli::AS_TOOL, "up", "--foreground", "--dir"])
        .arg(&dir)
        .arg("--config-extra")
        .arg(&extra)
        .arg("--vramgate-bin")
        .arg(Path::new(VRAMGATE).parent().unwrap())
        .stdin(std::process::Stdio::null());
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().expect("starting the node's supervisor");
    let started = Instant::now();
    loop {
        if let Ok(info) = NodeFile::read(&dir) {
            // The scratch directory's guard would remove the node's directory under it: it is
            // the supervisor's to remove, and the (empty) scratch directory is removed after.
            let _ = scratch.keep();
            return (info, child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the test node did not come up ({status}): its output is above");
        }
        assert!(
            started.elapsed() < UP_LIMIT,
            "the test node was not Ready within {UP_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGTERM to the supervisor, and its teardown waited for.
fn stop_node(mut child: Child, info: &NodeFile) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    if let Some(scratch) = info.dir.parent() {
        let _ = std::fs::remove_file(scratch.join("config-extra.toml"));
        let _ = std::fs::remove_dir(scratch);
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

/// A workload manifest of k8s/ as a user reads it, ready for this node: each placeholder image
/// (`registry.example/…`, "your CUDA image", which no registry here serves) becomes the node's
/// imported busybox image, running until stopped (its `command` replaced, or given one). Every
/// other line is the file's. Fails when the file has no placeholder: then it needs no change.
pub fn example(file: &str) -> String {
    let path = testnode::node::repo().join("k8s").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out: Vec<String> = Vec::new();
    let mut replaced = 0;
    // The indentation of the container whose image was replaced, until its command is seen.
    let mut in_container: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if let Some(at) = in_container {
            if indent == at && trimmed.starts_with("command:") {
                out.push(format!(
                    "{}command: {}",
                    " ".repeat(at),
                    serde_json::json!(RUN_UNTIL_STOPPED_ARGV)
                ));
                in_container = None;
                continue;
            }
            if indent < at || (indent == at && trimmed.starts_with("- ")) || trimmed.starts_with("---") {
                out.push(format!(
                    "{}command: {}",
                    " ".repeat(at),
                    serde_json::json!(RUN_UNTIL_STOPPED_ARGV)
                ));
                in_container = None;
            }
        }
        if trimmed.starts_with("image: registry.example/") && !trimmed.starts_with("image: registry.example/vramgate:")
        {
            out.push(format!("{}image: {APP_IMAGE}", " ".repeat(indent)));
            replaced += 1;
            in_container = Some(indent);
            continue;
        }
        out.push(line.to_string());
    }
    if let Some(at) = in_container {
        out.push(format!(
            "{}command: {}",
            " ".repeat(at),
            serde_json::json!(RUN_UNTIL_STOPPED_ARGV)
        ));
    }
    assert!(replaced > 0, "{}: no placeholder image to replace", path.display());
    out.join("\n") + "\n"
}

/// [`RUN_UNTIL_STOPPED`] as a container's command.
pub const RUN_UNTIL_STOPPED_ARGV: [&str; 3] = ["/bin/sh", "-c", RUN_UNTIL_STOPPED];

/// `vramgate status --json`'s reservation named `name` (`namespace/pod/container`): its bytes.
pub fn reserved_as(c: &Cluster, name: &str) -> Option<u64> {
    let status = status(&c.tb().config_path);
    status["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["reservations"].as_array().into_iter().flatten())
        .find(|r| r["name"] == name)
        .and_then(|r| r["bytes"].as_u64())
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

/// The built `vramgate-dra` as a process on the host with `extra` flags, after k8s/dra.yaml
/// (DeviceClass, RBAC, admission policies) is applied server-side, with its ServiceAccount's
/// token bound to this node, as the DaemonSet's projected token is, so that the shipped
/// admission policies and the API server's associated-node check judge its writes.
pub fn start_dra_driver(c: &Cluster, extra: &[&str]) -> crate::support::dra::Driver {
    let on = DriverNode {
        node: &c.node,
        kube_dir: &c.dir,
        config: &c.tb().config_path,
        cdi_dir: &c.tb().dir.join("containerd/cdi"),
    };
    start_dra_driver_on(c, &on, extra)
}

/// A token of the driver's ServiceAccount (`kube-system/vramgate-dra`), valid for an hour,
/// bound as `bound` says (`--bound-object-kind` and the rest), as a projected token is.
pub fn dra_token(c: &Cluster, bound: &[&str]) -> String {
    let args = [
        &["create", "token", "vramgate-dra", "-n", "kube-system"][..],
        bound,
        &["--duration", "1h"],
    ]
    .concat();
    c.kubectl_ok(&args)
}

/// The node a DRA driver serves: its name, kubelet's files (its root is `kube_dir/kubelet`;
/// the driver's log goes there), its vramgate config and its containerd's CDI directory.
pub struct DriverNode<'a> {
    pub node: &'a str,
    pub kube_dir: &'a Path,
    pub config: &'a Path,
    pub cdi_dir: &'a Path,
}

/// [`start_dra_driver`] for the node `on`.
pub fn start_dra_driver_on(c: &Cluster, on: &DriverNode, extra: &[&str]) -> crate::support::dra::Driver {
    let k8s = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s");
    c.apply_file(&k8s.join("dra.yaml"));
    let token = dra_token(c, &["--bound-object-kind", "Node", "--bound-object-name", on.node]);
    let kubeconfig = c.write_kubeconfig(&format!("vramgate-dra-{}", on.node), &token);
    let registrations = |log: &str| log.matches("registered with kubelet as").count();
    let before = registrations(&std::fs::read_to_string(on.kube_dir.join("vramgate-dra.log")).unwrap_or_default());
    let driver = crate::support::dra::Driver::start_as(on.kube_dir, on.config, &kubeconfig, on.node, on.cdi_dir, extra);
    // Returned once kubelet has registered this process: a pod created before that (its
    // slice may be the previous driver's, still published) has kubelet dial the previous
    // process's socket, fail its prepare and retry only after its back-off (60 to 80 s here).
    c.wait("kubelet registers the driver", POD_LIMIT, "kubelet", || {
        let log = driver.log_text();
        (registrations(&log) > before, tail_text(&log, 5))
    });
    driver
}

/// The second node (`second up` on the node's control socket), for as long as this lives: a
/// kubelet of its own (its own name, root and containerd 2.1) and its own vramgate config,
/// ledger and simulated GPU ([`SECOND_GPU`](testnode::node::SECOND_GPU)), joined to the
/// cluster. Dropped: `second down` deletes its pods, stops it and removes its Node.
pub struct SecondNode<'a> {
    c: &'a Cluster,
    pub info: SecondNodeFile,
    /// Its vramgate testbed (config, ledger), as the first node's is [`Cluster::tb`].
    pub tb: vramgate_testbed::Testbed,
}

impl Cluster {
    /// Starts the second node; returns once it is Ready.
    pub fn start_second_node(&self) -> SecondNode<'_> {
        let started = Instant::now();
        // Past the supervisor's own bounds on each step (about 6 minutes at worst).
        control(&self.info.control_socket, "second up", Duration::from_secs(480)).unwrap_or_else(|e| panic!("{e}"));
        let info = SecondNodeFile::read(&self.info.dir).unwrap_or_else(|e| panic!("{e}"));
        let tb = vramgate_testbed::Testbed::open(&info.dir, "runc", &self.info.vramgate_bin.join("vramgate-hook"))
            .unwrap_or_else(|e| panic!("the second node's testbed in {}: {e:#}", info.dir.display()));
        eprintln!("  second node {} Ready in {:?}", info.node, started.elapsed());
        SecondNode { c: self, info, tb }
    }
}

impl SecondNode<'_> {
    /// The built `vramgate-dra` for this node, as [`start_dra_driver`] starts the first's.
    pub fn start_dra_driver(&self, extra: &[&str]) -> crate::support::dra::Driver {
        let on = DriverNode {
            node: &self.info.node,
            kube_dir: &self.info.kube_dir,
            config: &self.info.vramgate_config,
            cdi_dir: &self.info.cdi_dir,
        };
        start_dra_driver_on(self.c, &on, extra)
    }

    /// What its ledger holds: (id, GiB), sorted.
    pub fn ledger(&self) -> Vec<(String, u64)> {
        let mut held: Vec<(String, u64)> = reservations(&self.tb)
            .into_iter()
            .map(|(id, b)| (id, b / GIB))
            .collect();
        held.sort();
        held
    }
}

impl Drop for SecondNode<'_> {
    fn drop(&mut self) {
        if let Err(e) = control(&self.c.info.control_socket, "second down", Duration::from_secs(180)) {
            eprintln!("second down: {e}");
        }
    }
}

/// The last `lines` lines of `text`.
pub fn tail_text(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
