//! CRI-O driven as kubelet drives it, beside containerd's CRI plugin (tests/support/cri.rs,
//! whose pod and container configs and CRI calls it shares): a private crio built from the
//! repository's pruned source by `scripts/fetch-crio`, with its own root, runroot, socket,
//! state files and config under the test's directory, bookworm's conmon and runc, the cgroupfs
//! cgroup manager and the vfs storage driver. The images (the same two `build_images` makes
//! for containerd) are put into crio's storage with skopeo before it starts; nothing is
//! pulled.
//!
//! The hook runs from hooks.d alone: the package's `vramgate-prestart.json` and
//! `vramgate-poststop.json`, pointed at the built hook and the testbed's config (as
//! tests/it/podman.rs does), in crio's `hooks_dir`. Optionally crio also has the runtime handler
//! `vramgate` that the built `vramgate setup crio --runtime-handler` writes into its drop-in
//! directory.
//!
//! This VM's kernel refuses a negative oom_score_adj, and CRI-O gives its infra (pause)
//! container -998: crio runs with `drop_infra_ctr`, so a pod whose pid namespace is per
//! container (what `pod_config` asks) runs without an infra container. Pods use the host's
//! network, so no CNI plugin runs.
//!
//! `crate::support::crio`, beside `crate::support::cri`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::Value;

use crate::support::cri::*;
use crate::support::*;
use vramgate_testbed::Testbed;

/// The CRI-O that scripts/fetch-crio builds.
pub const CRIO_VERSION: &str = "1.36.3";

/// Where scripts/fetch-crio put crio and pinns.
pub fn crio_bin_dir() -> PathBuf {
    let dir =
        std::env::var("VRAMGATE_CRIO").unwrap_or_else(|_| format!("/var/cache/vramgate-tests/crio-{CRIO_VERSION}"));
    let bin = Path::new(&dir).join("bin");
    assert!(
        bin.join("crio").is_file() && bin.join("pinns").is_file(),
        "CRI-O {CRIO_VERSION} is not built in {dir}: run scripts/install-deps (or scripts/fetch-crio)"
    );
    bin
}

/// A private crio with a CRI client on it.
pub struct Crio {
    pub rt: tokio::runtime::Runtime,
    pub runtime: RuntimeClient,
    pub images: ImageClient,
    pub child: Option<Child>,
    /// crio's directory: config, root, runroot, socket, log.
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub tb: Testbed,
    /// The pods' cgroup parents, which kubelet would create and remove.
    pub pod_cgroups: Mutex<Vec<String>>,
    /// How many times crio was started (the log of each start is `crio.<n>.log`).
    pub starts: usize,
    /// The scratch directory, removed last.
    pub tmp: Option<tempfile::TempDir>,
    /// skopeo's blob-info cache, at a fixed place whatever the storage.
    pub host: Option<HostDirs>,
}

/// A runtime handler of the host's crio that passes a pod's `io.kubernetes.cri.container-type`
/// annotation into its containers' specs (see [`crio_config`]).
pub const ANNOTATIONS_HANDLER: &str = "runc-annotations";

/// The host's crio config: every path under `dir`, the settings this VM needs.
fn crio_config(dir: &Path, tb: &Testbed) -> String {
    let p = |sub: &str| dir.join(sub).display().to_string();
    let pinns = crio_bin_dir().join("pinns").display().to_string();
    // Both handlers are runc under conmon with vramgate's config; they differ in what they let
    // through.
    let runc = |name: &str| {
        format!(
            r#"[crio.runtime.runtimes.{name}]
runtime_path = "/usr/sbin/runc"
runtime_type = "oci"
runtime_root = {runc_root:?}
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"
monitor_env = ["PATH={path}", "VRAMGATE_CONFIG={config}"]"#,
            runc_root = p("runc"),
            path = path_with_sbin(),
            config = tb.config_path.display(),
        )
    };
    format!(
        r#"[crio]
root = {root:?}
runroot = {runroot:?}
storage_driver = "vfs"
log_dir = {logs:?}
version_file = {version:?}
version_file_persist = {version_persist:?}
clean_shutdown_file = {clean:?}

[crio.api]
listen = {socket:?}
# kubectl exec/logs streaming: loopback only, on a port the kernel picks.
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
default_runtime = "runc"
# This VM refuses a negative oom_score_adj, and CRI-O gives an infra container -998.
drop_infra_ctr = true
hooks_dir = [{hooks:?}]
pinns_path = {pinns:?}
namespaces_dir = {ns:?}
container_exits_dir = {exits:?}
container_attach_socket_dir = {attach:?}
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"

{runc}

# runc again, as a handler that lets pods pass containerd's container-type key through, as the
# handlers CRI-O documents for crun's wasm images do (CRI-O strips it unless a handler's
# allowed_annotations names it): the trust-edge test's forged pod runs on it.
{annotations}
allowed_annotations = ["io.kubernetes.cri.container-type"]

[crio.image]
pause_image = "{PAUSE_IMAGE}"
signature_policy = {policy:?}
# Both default to directories under /etc/crio, which crio creates.
signature_policy_dir = {policies:?}
namespaced_auth_dir = {auth:?}

[crio.network]
# Empty: the pods use the host's network, and the host's CNI config stays unread.
network_dir = {cni_conf:?}
plugin_dirs = [{cni_bin:?}]

[crio.nri]
enable_nri = false
"#,
        root = p("root"),
        runroot = p("runroot"),
        logs = p("logs"),
        version = p("run/version"),
        version_persist = p("lib/version"),
        clean = p("lib/clean.shutdown"),
        socket = p("crio.sock"),
        hooks = p("hooks.d"),
        ns = p("ns"),
        exits = p("run/exits"),
        attach = p("run/attach"),
        policy = p("policy.json"),
        policies = p("policies"),
        auth = p("auth"),
        cni_conf = p("cni/net.d"),
        cni_bin = p("cni/bin"),
        runc = runc("runc"),
        annotations = runc(ANNOTATIONS_HANDLER),
    )
}

impl Crio {
    /// Writes crio's config and hooks.d, puts the images into its storage and starts it.
    pub fn launch(tb: Testbed) -> Crio {
        let dir = tb.dir.join("crio");
        for sub in ["cni/bin", "cni/net.d", "hooks.d", "crio.conf.d", "run", "lib", "ns"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("crio.conf"), crio_config(&dir, &tb)).unwrap();
        std::fs::write(
            dir.join("policy.json"),
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        write_packaged_hooks(&dir.join("hooks.d"), &tb);
        let socket = dir.join("crio.sock");
        let (rt, channel) = cri_channel(socket.clone());
        let mut crio = Crio {
            runtime: RuntimeClient::new(channel.clone()),
            images: ImageClient::new(channel),
            rt,
            child: None,
            dir,
            socket,
            tb,
            pod_cgroups: Mutex::new(Vec::new()),
            starts: 0,
            tmp: None,
            host: Some(HostDirs::note(&[
                "/var/lib/containers/cache/blob-info-cache-v1.boltdb",
                "/var/lib/containers/cache",
                "/var/lib/containers",
            ])),
        };
        crio.import_images();
        crio.start();
        crio
    }

    /// Copies the two images into crio's storage with skopeo, as an air-gapped node gets them
    /// (crio is not running yet: they share the storage's locks, but not its caches).
    fn import_images(&self) {
        let tar = build_images(&self.tb);
        let store = format!(
            "containers-storage:[vfs@{}+{}]",
            self.dir.join("root").display(),
            self.dir.join("runroot").display()
        );
        for image in [PAUSE_IMAGE, APP_IMAGE] {
            run_ok(
                Command::new("skopeo")
                    .args(["--insecure-policy", "copy", "--quiet"])
                    .arg(format!("docker-archive:{}:{image}", tar.display()))
                    .arg(format!("{store}{image}"))
                    .env("TMPDIR", &self.tb.dir)
                    .stdin(Stdio::null()),
            );
        }
    }

    /// Starts crio (again) and waits until it answers.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "crio is running");
        self.starts += 1;
        let log = self.dir.join(format!("crio.{}.log", self.starts));
        let child = daemon(crio_bin_dir().join("crio"))
            .arg("--config")
            .arg(self.dir.join("crio.conf"))
            .arg("--config-dir")
            .arg(self.dir.join("crio.conf.d"))
            .args(["--log-level", "info"])
            .env("VRAMGATE_CONFIG", &self.tb.config_path)
            .env("PATH", path_with_sbin())
            .env("CONTAINERS_REGISTRIES_CONF", self.dir.join("registries.conf"))
            // crio makes its seccomp notifier directory in its working directory.
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting crio");
        self.child = Some(child);
        self.wait_ready(&log);
    }

    /// Stops crio (SIGTERM, as systemd does); its containers keep running under conmon.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_pid(child.id() as i32, Duration::from_secs(20));
        }
    }

    fn wait_ready(&mut self, log: &Path) {
        let start = Instant::now();
        loop {
            let answer = self.block_on(probe_version(self.runtime.clone()));
            match answer {
                Ok(v) => {
                    eprintln!("crio up after {:?}: {:?}", start.elapsed(), v.into_inner());
                    return;
                }
                Err(e) => {
                    let exited = self.child.as_mut().unwrap().try_wait().unwrap();
                    if exited.is_some() || start.elapsed() > Duration::from_secs(60) {
                        panic!(
                            "crio did not answer ({exited:?}): {e}\n{}",
                            std::fs::read_to_string(log).unwrap_or_default()
                        )
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    pub fn log(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.dir.join(format!("crio.{n}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// RunPodSandbox on `handler` ("" is crio's default runtime, runc with hooks.d).
    pub fn run_pod_on(&self, config: cri::PodSandboxConfig, handler: &str) -> Result<Pod, tonic::Status> {
        let parent = config.linux.as_ref().unwrap().cgroup_parent.clone();
        self.pod_cgroups.lock().unwrap().push(parent);
        self.block_on(run_pod_on(self.runtime.clone(), config, handler))
    }

    pub fn run_pod(&self, config: cri::PodSandboxConfig) -> Pod {
        let name = config.metadata.as_ref().unwrap().name.clone();
        self.run_pod_on(config, "")
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}\n{}", self.log()))
    }

    /// CreateContainer as kubelet (1.29 and later) sends it: the image also as the pod spec
    /// named it, which CRI-O requires ("user specified image not specified"), the pod's
    /// namespace modes and kubelet's labels.
    pub fn try_create(&self, pod: &Pod, config: cri::ContainerConfig) -> Result<String, tonic::Status> {
        self.block_on(create_container(
            self.runtime.clone(),
            self.images.clone(),
            pod,
            as_kubelet_sends(pod, config),
        ))
    }

    /// CreateContainer alone, as kubelet sends it, with this deadline.
    pub fn try_create_within(
        &self,
        pod: &Pod,
        config: cri::ContainerConfig,
        deadline: Duration,
    ) -> Result<String, tonic::Status> {
        let mut client = self.runtime.clone();
        let request = with_deadline(
            cri::CreateContainerRequest {
                pod_sandbox_id: pod.sandbox.clone(),
                config: Some(as_kubelet_sends(pod, config)),
                sandbox_config: Some(pod.config.clone()),
            },
            deadline,
        );
        self.block_on(async move { client.create_container(request).await })
            .map(|r| r.into_inner().container_id)
    }

    pub fn create(&self, pod: &Pod, config: cri::ContainerConfig) -> String {
        self.try_create(pod, config)
            .unwrap_or_else(|e| panic!("CreateContainer in {}: {e}", pod.name))
    }

    pub fn start_one(&self, id: &str) -> Result<(), tonic::Status> {
        self.block_on(start_container(self.runtime.clone(), id.to_string()))
    }

    pub fn container_status(&self, id: &str) -> cri::ContainerStatus {
        self.block_on(container_status(self.runtime.clone(), id.to_string()))
            .unwrap()
            .unwrap()
    }

    /// The containers crio lists (id, name, state), all pods.
    pub fn containers(&self) -> Vec<(String, String, i32)> {
        let mut client = self.runtime.clone();
        self.block_on(async move {
            client
                .list_containers(req(cri::ListContainersRequest { filter: None }))
                .await
        })
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .map(|c| (c.id, c.metadata.map(|m| m.name).unwrap_or_default(), c.state))
        .collect()
    }

    pub fn delete_pod(&self, pod: &Pod) {
        self.block_on(delete_pod(self.runtime.clone(), pod.sandbox.clone()))
            .unwrap_or_else(|e| panic!("deleting pod {}: {e}", pod.name));
    }

    /// The spec crio handed the runtime for container `id` (its bundle is in crio's runroot).
    pub fn bundle_spec(&self, id: &str) -> PathBuf {
        self.dir
            .join("runroot/vfs-containers")
            .join(id)
            .join("userdata/config.json")
    }

    pub fn events(&self) -> Vec<Value> {
        events_of(&self.tb)
    }
}

impl Drop for Crio {
    /// Whatever a test left: every pod stopped and removed through CRI (crio running again if
    /// the test stopped it), then crio stopped, its mounts undone, the pods' cgroups removed.
    fn drop(&mut self) {
        kill_queued_hooks(&self.tb);
        if self.child.is_none() && !std::thread::panicking() {
            self.start();
        }
        if let Ok(listed) = self.block_on(list_sandboxes(self.runtime.clone())) {
            for pod in listed {
                let client = self.runtime.clone();
                let result = self.block_on(async move {
                    tokio::time::timeout(Duration::from_secs(30), delete_pod(client, pod.id.clone())).await
                });
                if !matches!(result, Ok(Ok(()))) {
                    eprintln!("cleanup: pod: {result:?}");
                }
            }
        }
        self.stop();
        // conmon of a container crio lost track of (a test that panicked with crio stopped).
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.starts_with("/usr/bin/conmon") && cmdline.contains(&*self.dir.to_string_lossy()) {
                if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                    stop_pid(pid, Duration::from_secs(5));
                }
            }
        }
        unmount_under(&self.tb.dir);
        remove_pod_cgroups(&self.pod_cgroups.lock().unwrap());
        drop(self.tmp.take());
        drop(self.host.take());
    }
}

/// What kubelet adds to a container's config: the image as the pod spec named it (CRI-O
/// requires it: "user specified image not specified"), the pod's namespace modes (CRI-O checks
/// them against the sandbox's), and its labels, which CRI-O writes into the spec as
/// annotations (the container's name among them, which KAI's annotations are keyed by).
pub fn as_kubelet_sends(pod: &Pod, mut config: cri::ContainerConfig) -> cri::ContainerConfig {
    if let Some(image) = config.image.as_mut() {
        image.user_specified_image = image.image.clone();
    }
    let namespaces = pod
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let metadata = pod.config.metadata.clone().unwrap_or_default();
    let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    for (key, value) in [
        ("io.kubernetes.container.name", name),
        ("io.kubernetes.pod.name", metadata.name),
        ("io.kubernetes.pod.namespace", metadata.namespace),
        ("io.kubernetes.pod.uid", metadata.uid),
    ] {
        config.labels.entry(key.to_string()).or_insert(value);
    }
    let linux = config.linux.get_or_insert_with(Default::default);
    linux
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = namespaces;
    config
}

/// A scratch host (the static simulated GPU, private state, a new temporary directory) and a
/// crio on it; all of it goes when the `Crio` drops.
pub fn crio_host(name: &str, config_extra: &str) -> Crio {
    require("conmon");
    require("runc");
    require("skopeo");
    let (tmp, tb) = runc_testbed(name, config_extra);
    let mut crio = Crio::launch(tb);
    crio.tmp = Some(tmp);
    crio
}
