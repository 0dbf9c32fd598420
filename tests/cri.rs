//! Kubernetes through containerd's CRI plugin, driven as kubelet drives it: a private
//! containerd with its CRI plugin on, the runtime handler `vramgate` configured by the built
//! `vramgate setup containerd`, images built here and imported with `ctr` (nothing is
//! pulled), and the calls kubelet makes for a pod (RunPodSandbox, ImageStatus,
//! CreateContainer, StartContainer, then StopContainer, RemoveContainer, StopPodSandbox,
//! RemovePodSandbox) sent over gRPC on containerd's unix socket. Pods use the host's network,
//! so no CNI plugin runs.
//!
//! containerd copies a pod's annotations into its sandbox ("pause") container's spec as well
//! as into each container's: these tests hold vramgate to reserving once per GPU container,
//! never for the sandbox.

mod support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint, Uri};

use support::*;
use vramgate::testbed::Testbed;

type RuntimeClient = cri::runtime_service_client::RuntimeServiceClient<Channel>;
type ImageClient = cri::image_service_client::ImageServiceClient<Channel>;

const PAUSE_IMAGE: &str = "vramgate.test/pause:1";
const APP_IMAGE: &str = "vramgate.test/busybox:1";
/// The runtime handler `vramgate setup containerd` configures (a RuntimeClass's `handler`).
const HANDLER: &str = "vramgate";
const REQUEST: &str = "1205Mi";
const REQUEST_BYTES: u64 = 1205 << 20;
/// How many 1205 MiB requests the simulated 24,265 MiB GPU holds.
const FIT: usize = 20;
/// kubelet's default `--runtime-request-timeout`, the deadline it puts on each CRI call.
const CRI_DEADLINE: Duration = Duration::from_secs(120);
/// The grace period kubelet would give StopContainer; the app containers exit on SIGTERM.
const STOP_GRACE_SECONDS: i64 = 10;
/// An app container that runs until stopped, ending at once on SIGTERM (as PID 1, busybox
/// `sleep` alone would ignore it and wait out the grace period).
const RUN_UNTIL_STOPPED: &[&str] = &["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"];

/// A private containerd with the CRI plugin, set up for vramgate, and a CRI client on it.
struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeClient,
    images: ImageClient,
    child: Option<Child>,
    address: PathBuf,
    /// containerd's `--state`, where the runc shim keeps each container's bundle.
    state: PathBuf,
    tb: Testbed,
    /// The pods' cgroup parents, which kubelet would create and remove (runc removes only
    /// each container's own cgroup).
    pod_cgroups: Mutex<Vec<String>>,
    /// The scratch directory, removed last (after containerd and its mounts are gone).
    dir: Option<tempfile::TempDir>,
}

/// The runc shim keeps its sockets and runc state, and ctr its fifos, under /run/containerd
/// whatever containerd's --state is. The tests of this file run side by side, so the paths
/// are noted when the first containerd starts and removed (those that were not there, when
/// empty) when the last one stops.
static HOST_DIRS: Mutex<(usize, Option<HostDirs>)> = Mutex::new((0, None));

fn host_dirs_enter() {
    let mut host = HOST_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if host.0 == 0 {
        host.1 = Some(HostDirs::note(&[
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd/fifo",
            "/run/containerd/s",
            "/run/containerd",
        ]));
    }
    host.0 += 1;
}

fn host_dirs_leave() {
    let mut host = HOST_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    host.0 -= 1;
    if host.0 == 0 {
        drop(host.1.take());
    }
}

/// Where the pods' cgroups go, as kubelet puts them under `kubepods`.
const CGROUP_ROOT: &str = "vramgate-cri";

/// A pod that RunPodSandbox accepted: its config (which kubelet passes again on every
/// CreateContainer) and its sandbox id.
#[derive(Clone)]
struct Pod {
    name: String,
    config: cri::PodSandboxConfig,
    sandbox: String,
}

/// The host's own containerd config: the CRI plugin with the settings this VM needs, before
/// `vramgate setup containerd` adds its import.
fn host_config(dir: &Path) -> String {
    format!(
        r#"version = 2
{opt}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM lacks CAP_SYS_RESOURCE: containerd may only raise a container's oom_score_adj.
  restrict_oom_score_adj = true
  # kubectl exec/logs streaming: loopback only, on a port the kernel picks.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    # Empty: the pods use the host's network, and the host's CNI config stays unread.
    bin_dir = {cni_bin:?}
    conf_dir = {cni_conf:?}
"#,
        opt = containerd_opt_section(dir),
        cni_bin = dir.join("cni/bin").display().to_string(),
        cni_conf = dir.join("cni/net.d").display().to_string(),
    )
}

/// containerd's name for this machine's architecture, for the image config.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A docker-archive tar with two single-layer images on the testbed's busybox rootfs: the
/// sandbox image (a `sleep` standing in for `pause`) and the app image.
fn build_images(tb: &Testbed) -> PathBuf {
    let layer = rootfs_tar(tb);
    let sum = run_ok(Command::new("sha256sum").arg(&layer));
    let diff_id = format!("sha256:{}", sum.split_whitespace().next().unwrap());
    let archive = tb.dir.join("images");
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::rename(&layer, archive.join("layer.tar")).unwrap();
    let image = |file: &str, entrypoint: &[&str]| {
        let config = json!({
            "architecture": go_arch(),
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        });
        std::fs::write(archive.join(file), config.to_string()).unwrap();
    };
    image("pause.json", &["/bin/sleep", "86400"]);
    image("app.json", &[]);
    let manifest = json!([
        {"Config": "pause.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]},
        {"Config": "app.json", "RepoTags": [APP_IMAGE], "Layers": ["layer.tar"]},
    ]);
    std::fs::write(archive.join("manifest.json"), manifest.to_string()).unwrap();
    let tar = tb.dir.join("images.tar");
    run_ok(Command::new("tar").arg("-C").arg(&archive).arg("-cf").arg(&tar).args([
        "manifest.json",
        "pause.json",
        "app.json",
        "layer.tar",
    ]));
    tar
}

/// A CRI request with kubelet's deadline (sent as `grpc-timeout`; containerd cancels the
/// call's context when it passes).
fn req<T>(message: T) -> tonic::Request<T> {
    with_deadline(message, CRI_DEADLINE)
}

fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// The pod config kubelet sends for a host-network pod with these annotations.
fn pod_config(name: &str, annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
    let uid = format!("{name}-uid");
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: uid.clone(),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/{CGROUP_ROOT}/pod{uid}"),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of the app image running `command`, with these environment variables.
fn container_config(name: &str, command: &[&str], env: &[(&str, &str)]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: APP_IMAGE.to_string(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        envs: env
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn run_pod(mut client: RuntimeClient, config: cri::PodSandboxConfig) -> Result<Pod, tonic::Status> {
    let name = config.metadata.as_ref().unwrap().name.clone();
    let response = client
        .run_pod_sandbox(req(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: HANDLER.to_string(),
        }))
        .await?;
    Ok(Pod {
        name,
        config,
        sandbox: response.into_inner().pod_sandbox_id,
    })
}

/// CreateContainer in `pod`, after the ImageStatus kubelet asks first (image pull policy
/// IfNotPresent finds it present). Returns the container id.
async fn create_container(
    mut client: RuntimeClient,
    mut images: ImageClient,
    pod: &Pod,
    config: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    let status = images
        .image_status(req(cri::ImageStatusRequest {
            image: config.image.clone(),
            verbose: false,
        }))
        .await?;
    assert!(status.into_inner().image.is_some(), "{APP_IMAGE} is not present");
    let response = client
        .create_container(req(cri::CreateContainerRequest {
            pod_sandbox_id: pod.sandbox.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        }))
        .await?;
    Ok(response.into_inner().container_id)
}

async fn start_container(mut client: RuntimeClient, id: String) -> Result<(), tonic::Status> {
    client
        .start_container(req(cri::StartContainerRequest { container_id: id }))
        .await
        .map(|_| ())
}

/// What kubelet does when a pod is deleted: stop and remove its containers, then its sandbox.
async fn delete_pod(mut client: RuntimeClient, sandbox: String) -> Result<(), tonic::Status> {
    let filter = cri::ContainerFilter {
        pod_sandbox_id: sandbox.clone(),
        ..Default::default()
    };
    let containers = client
        .list_containers(req(cri::ListContainersRequest { filter: Some(filter) }))
        .await?
        .into_inner()
        .containers;
    for c in containers {
        client
            .stop_container(req(cri::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: STOP_GRACE_SECONDS,
            }))
            .await?;
        client
            .remove_container(req(cri::RemoveContainerRequest { container_id: c.id }))
            .await?;
    }
    client
        .stop_pod_sandbox(req(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        }))
        .await?;
    client
        .remove_pod_sandbox(req(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        }))
        .await?;
    Ok(())
}

impl Cri {
    /// Writes the host's containerd config, runs `vramgate setup containerd` on it, starts
    /// containerd and imports the images.
    fn launch(tb: Testbed) -> Cri {
        let dir = tb.dir.join("containerd");
        for sub in ["cni/bin", "cni/net.d"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let main = dir.join("config.toml");
        std::fs::write(&main, host_config(&dir)).unwrap();
        // The drop-in as an operator gets it: the built `vramgate setup containerd`, with the
        // default runtime path (the vramgate-runtime beside it).
        run_ok(
            Command::new(VRAMGATE)
                .env("VRAMGATE_CONFIG", &tb.config_path)
                .args(["setup", "containerd", "--config-path"])
                .arg(dir.join("conf.d/vramgate.toml"))
                .arg("--containerd-config")
                .arg(&main),
        );
        // From here on the Cri's drop undoes what containerd leaves on the host.
        host_dirs_enter();
        let (child, address, state) = spawn_containerd(&dir, &main, &tb.config_path);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = address.clone();
        // The channel's worker task lives on this runtime, which runs during each block_on.
        let channel = {
            let _runtime = rt.enter();
            Endpoint::try_from("http://[::]:0")
                .unwrap()
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(socket).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
        };
        let mut cri = Cri {
            runtime: RuntimeClient::new(channel.clone()),
            images: ImageClient::new(channel),
            rt,
            child: Some(child),
            address,
            state,
            tb,
            pod_cgroups: Mutex::new(Vec::new()),
            dir: None,
        };
        cri.wait_ready();
        cri.check_handler();
        cri.import_images();
        cri
    }

    /// The runtime handler as the CRI plugin read it from the drop-in (what `crictl info`
    /// shows): a runc-v2 runtime running the built wrapper, passing vramgate's annotations.
    fn check_handler(&self) {
        let mut client = self.runtime.clone();
        let info = self
            .block_on(async move { client.status(req(cri::StatusRequest { verbose: true })).await })
            .unwrap()
            .into_inner()
            .info;
        let config: Value = serde_json::from_str(&info["config"]).unwrap();
        let runtimes = &config["containerd"]["runtimes"];
        let handler = &runtimes[HANDLER];
        assert_eq!(handler["runtimeType"], "io.containerd.runc.v2", "{runtimes}");
        assert_eq!(handler["options"]["BinaryName"], RUNTIME, "{handler}");
        for key in ["PodAnnotations", "ContainerAnnotations"] {
            assert_eq!(handler[key], json!(["vramgate.dev/*"]), "{key}: {handler}");
        }
        assert!(runtimes["runc"].is_object(), "the default runtime is gone: {runtimes}");
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// Waits until the CRI plugin answers (it starts after containerd's own socket).
    fn wait_ready(&mut self) {
        let log = self.tb.dir.join("containerd/containerd.log");
        let start = Instant::now();
        loop {
            let mut client = self.runtime.clone();
            let answer = self.block_on(async move {
                let request = with_deadline(cri::VersionRequest { version: "v1".into() }, Duration::from_secs(2));
                client.version(request).await
            });
            match answer {
                Ok(v) => {
                    eprintln!("CRI up after {:?}: {:?}", start.elapsed(), v.into_inner());
                    return;
                }
                // containerd answers, but without the CRI service: the plugin failed to load.
                Err(e) if e.code() == tonic::Code::Unimplemented || start.elapsed() > Duration::from_secs(30) => {
                    panic!(
                        "the CRI plugin did not answer: {e}\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.env("PATH", path_with_sbin())
            .arg("--address")
            .arg(&self.address)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Imports the images into containerd's `k8s.io` namespace, as an air-gapped node gets
    /// them, and waits until the CRI plugin lists them.
    fn import_images(&mut self) {
        let tar = build_images(&self.tb);
        run_ok(self.ctr(&["images", "import"]).arg(&tar));
        wait_until("the CRI plugin sees the images", Duration::from_secs(20), || {
            let images = self.images.clone();
            let found: Vec<bool> = [PAUSE_IMAGE, APP_IMAGE]
                .iter()
                .map(|image| {
                    let mut images = images.clone();
                    let spec = cri::ImageSpec {
                        image: image.to_string(),
                        ..Default::default()
                    };
                    self.block_on(async move {
                        images
                            .image_status(req(cri::ImageStatusRequest {
                                image: Some(spec),
                                verbose: false,
                            }))
                            .await
                            .is_ok_and(|r| r.into_inner().image.is_some())
                    })
                })
                .collect();
            (found.iter().all(|f| *f), found)
        });
    }

    /// Runs `f(i)` for `i` in `0..n`, at most `limit` at a time, as kubelet's pod workers run
    /// side by side; the results in index order.
    fn concurrently<T, Fut>(&self, n: usize, limit: usize, f: impl Fn(usize) -> Fut) -> Vec<T>
    where
        T: Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        self.block_on(async {
            let permits = Arc::new(tokio::sync::Semaphore::new(limit));
            let mut set = tokio::task::JoinSet::new();
            for i in 0..n {
                let work = f(i);
                let permits = permits.clone();
                set.spawn(async move {
                    let _permit = permits.acquire_owned().await.unwrap();
                    (i, work.await)
                });
            }
            let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
            while let Some(done) = set.join_next().await {
                let (i, value) = done.unwrap();
                out[i] = Some(value);
            }
            out.into_iter().map(Option::unwrap).collect()
        })
    }

    fn run_pods(&self, configs: Vec<cri::PodSandboxConfig>) -> Vec<Result<Pod, tonic::Status>> {
        let parents = configs.iter().map(|c| c.linux.as_ref().unwrap().cgroup_parent.clone());
        self.pod_cgroups.lock().unwrap().extend(parents);
        let client = self.runtime.clone();
        self.concurrently(configs.len(), 4, |i| run_pod(client.clone(), configs[i].clone()))
    }

    fn create(&self, pod: &Pod, config: cri::ContainerConfig) -> String {
        let (client, images) = (self.runtime.clone(), self.images.clone());
        self.block_on(create_container(client, images, pod, config))
            .unwrap_or_else(|e| panic!("CreateContainer in {}: {e}", pod.name))
    }

    fn start_one(&self, id: &str) -> Result<(), tonic::Status> {
        self.block_on(start_container(self.runtime.clone(), id.to_string()))
    }

    fn container_status(&self, id: &str) -> cri::ContainerStatus {
        let mut client = self.runtime.clone();
        let request = req(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        });
        self.block_on(async move { client.container_status(request).await })
            .unwrap()
            .into_inner()
            .status
            .unwrap()
    }

    fn delete_pods(&self, pods: &[Pod]) {
        let client = self.runtime.clone();
        let results = self.concurrently(pods.len(), 4, |i| delete_pod(client.clone(), pods[i].sandbox.clone()));
        for (pod, result) in pods.iter().zip(results) {
            result.unwrap_or_else(|e| panic!("deleting pod {}: {e}", pod.name));
        }
    }

    /// The spec the runc shim handed the runtime for container (or sandbox) `id`.
    fn bundle_spec(&self, id: &str) -> PathBuf {
        self.state
            .join("io.containerd.runtime.v2.task/k8s.io")
            .join(id)
            .join("config.json")
    }

    fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.tb.state_dir.join("events.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for Cri {
    /// Whatever a test left (it may have panicked halfway): every pod is stopped and removed
    /// through CRI, so the shims exit, then containerd is stopped and its mounts undone.
    fn drop(&mut self) {
        // A hook still queued in this host's ledger (a test that failed while one waited)
        // would wait out its timeout after everything else is gone.
        for (_, pid, _) in queued(&self.tb) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let mut client = self.runtime.clone();
        let listed = self.block_on(async move {
            let request = with_deadline(cri::ListPodSandboxRequest { filter: None }, Duration::from_secs(10));
            client.list_pod_sandbox(request).await
        });
        if let Ok(listed) = listed {
            let sandboxes: Vec<String> = listed.into_inner().items.into_iter().map(|p| p.id).collect();
            let client = self.runtime.clone();
            let results = self.concurrently(sandboxes.len(), 4, |i| {
                let (client, id) = (client.clone(), sandboxes[i].clone());
                async move { tokio::time::timeout(Duration::from_secs(30), delete_pod(client, id)).await }
            });
            for (id, result) in sandboxes.iter().zip(results) {
                if !matches!(result, Ok(Ok(()))) {
                    eprintln!("cleanup: pod {id}: {result:?}");
                }
            }
        }
        if let Some(child) = self.child.take() {
            stop_pid(child.id() as i32, Duration::from_secs(10));
        }
        unmount_under(&self.tb.dir);
        // Each pod's cgroup parent in every hierarchy (v1 controllers or the v2 root), then
        // the common root once no other test's pod is in it; rmdir removes only empty ones.
        let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .chain([PathBuf::from("/sys/fs/cgroup")]);
        for hierarchy in hierarchies {
            for parent in self.pod_cgroups.lock().unwrap().iter() {
                remove_cgroup(&hierarchy.join(parent.trim_start_matches('/')));
            }
            let _ = std::fs::remove_dir(hierarchy.join(CGROUP_ROOT));
        }
        drop(self.dir.take());
        host_dirs_leave();
    }
}

/// Removes a cgroup and those below it, deepest first; rmdir removes only cgroups with no
/// process left. A pod's own containers' cgroups are normally gone already (runc removes
/// them); one whose `runc create` was killed (a cancelled start) is not.
fn remove_cgroup(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A scratch host (config with the static simulated GPU, private state, in a new temporary
/// directory) and a CRI containerd on it; all of it goes when the `Cri` drops.
fn cri_host(name: &str) -> Cri {
    require("containerd");
    require("ctr");
    require("runc");
    let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
    let mut cri = Cri::launch(testbed(dir.path()));
    cri.dir = Some(dir);
    cri
}

/// What [`Watch`] saw: the most bytes reserved on one GPU at once, the most containers
/// holding a reservation at once, the longest queue, and how many of the ledger's states
/// (generations) it read out of how many there were.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    bytes: u64,
    holders: usize,
    queued: usize,
    states: usize,
    last_generation: u64,
}

/// Reads `vramgate status --json` over and over while the pods run. Sampling can miss a
/// state; the ledger's own invariants are held to every state by tests/concurrency.rs.
struct Watch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(tb: &Testbed) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let config = tb.config_path.clone();
        let (stopping, seeing) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut generations = std::collections::HashSet::new();
            while !stopping.load(Ordering::Relaxed) {
                let status = status(&config);
                let generation = status["generation"].as_u64().unwrap();
                generations.insert(generation);
                let mut seen = seeing.lock().unwrap();
                seen.states = generations.len();
                seen.last_generation = seen.last_generation.max(generation);
                for gpu in status["gpus"].as_array().unwrap() {
                    let held = gpu["reservations"].as_array().unwrap();
                    let bytes: u64 = held.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
                    seen.bytes = seen.bytes.max(bytes);
                    seen.holders = seen.holders.max(held.len());
                    seen.queued = seen.queued.max(gpu["queue"].as_array().unwrap().len());
                }
                drop(seen);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        *self.seen.lock().unwrap()
    }
}

/// A pod whose one container asks for 1205 MiB on GPU 0, with `policy`. Waits end after
/// 30 s (the jobs queue for a few seconds), so a wait that can never end fails the test with
/// vramgate's own message well before kubelet's deadline.
fn gpu_pod(name: &str, policy: &str) -> cri::PodSandboxConfig {
    pod_config(
        name,
        &[
            ("vramgate.dev/memory", REQUEST),
            ("vramgate.dev/gpus", "0"),
            ("vramgate.dev/policy", policy),
            ("vramgate.dev/timeout", "30s"),
        ],
    )
}

fn run_all(cri: &Cri, configs: Vec<cri::PodSandboxConfig>) -> Vec<Pod> {
    cri.run_pods(configs)
        .into_iter()
        .enumerate()
        .map(|(i, pod)| {
            pod.unwrap_or_else(|e| panic!("RunPodSandbox of pod {i}: {e}\nledger: {:?}", reservations(&cri.tb)))
        })
        .collect()
}

#[test]
fn of_25_pods_under_reject_20_run_and_5_are_refused() {
    let started = Instant::now();
    let cri = cri_host("vramgate-cri-reject");
    let configs = (0..25).map(|i| gpu_pod(&format!("reject-{i:02}"), "reject")).collect();
    // Every sandbox starts, and none reserves: the pod's request is its container's.
    let pods = run_all(&cri, configs);
    assert_eq!(reservations(&cri.tb), [], "sandboxes hold reservations");
    let sandbox_spec = cri.bundle_spec(&pods[0].sandbox);
    let sandbox: Value = serde_json::from_slice(&std::fs::read(&sandbox_spec).unwrap()).unwrap();
    assert_eq!(
        sandbox["annotations"]["io.kubernetes.cri.container-type"], "sandbox",
        "containerd marks the sandbox"
    );
    assert_eq!(
        sandbox["annotations"]["vramgate.dev/memory"], REQUEST,
        "containerd copies pod annotations into the sandbox's spec"
    );
    assert!(
        vramgate_hook_stages(&sandbox_spec).is_empty(),
        "the wrapper added hooks to the sandbox"
    );

    let ids: Vec<String> = pods
        .iter()
        .map(|pod| cri.create(pod, container_config("app", RUN_UNTIL_STOPPED, &[])))
        .collect();
    let client = cri.runtime.clone();
    let results = cri.concurrently(ids.len(), 4, |i| start_container(client.clone(), ids[i].clone()));
    let mut refused = Vec::new();
    for (id, result) in ids.iter().zip(&results) {
        match result {
            Ok(()) => {}
            Err(e) => {
                let wanted = format!("vramgate: refused container {id}: it requests 1205 MiB and GPU 0");
                assert!(e.message().contains(&wanted), "StartContainer of {id}: {e}");
                assert!(e.message().contains("set vramgate.dev/policy=wait to queue"), "{e}");
                refused.push(id.clone());
            }
        }
    }
    eprintln!(
        "a refusal as the CRI client sees it: {:?}",
        results.iter().find_map(|r| r.as_ref().err())
    );
    assert_eq!(refused.len(), 25 - FIT, "refused: {refused:?}");
    let held = reservations(&cri.tb);
    assert_eq!(held.len(), FIT, "{held:?}");
    for (id, bytes) in &held {
        assert!(ids.contains(id) && !refused.contains(id), "{id} holds a reservation");
        assert_eq!(*bytes, REQUEST_BYTES);
    }
    let admitted = ids.iter().find(|id| !refused.contains(id)).unwrap();
    assert_eq!(
        vramgate_hook_stages(&cri.bundle_spec(admitted)),
        ["createRuntime", "poststop"]
    );
    for id in &ids {
        let state = cri.container_status(id).state;
        let want = if refused.contains(id) {
            cri::ContainerState::ContainerExited
        } else {
            cri::ContainerState::ContainerRunning
        };
        assert_eq!(state, want as i32, "{id}");
    }

    // Deleting the pods releases everything (the poststop hook of each admitted container).
    cri.delete_pods(&pods);
    assert_eq!(reservations(&cri.tb), []);
    eprintln!("reject: {:?}", started.elapsed());
}

#[test]
fn of_25_pods_under_wait_all_run_and_complete_never_over_capacity() {
    let started = Instant::now();
    let cri = cri_host("vramgate-cri-wait");
    let configs = (0..25).map(|i| gpu_pod(&format!("wait-{i:02}"), "wait")).collect();
    let pods = run_all(&cri, configs);
    let ids: Vec<String> = pods
        .iter()
        .map(|pod| cri.create(pod, container_config("job", &["/bin/sleep", "2"], &[])))
        .collect();

    // All 25 StartContainer calls at once; those that do not fit return when earlier jobs end.
    let watch = Watch::start(&cri.tb);
    let client = cri.runtime.clone();
    let results = cri.concurrently(ids.len(), ids.len(), |i| {
        let (client, id) = (client.clone(), ids[i].clone());
        async move {
            let t = Instant::now();
            start_container(client, id).await.map(|()| t.elapsed())
        }
    });
    for (id, result) in ids.iter().zip(&results) {
        assert!(result.is_ok(), "StartContainer of {id}: {result:?}");
    }
    wait_until("every job has run to its end", Duration::from_secs(60), || {
        let states: Vec<(i32, i32)> = ids
            .iter()
            .map(|id| {
                let s = cri.container_status(id);
                (s.state, s.exit_code)
            })
            .collect();
        let done = states
            .iter()
            .all(|s| *s == (cri::ContainerState::ContainerExited as i32, 0));
        (done, states)
    });
    wait_until("every job is released", Duration::from_secs(15), || {
        let held = reservations(&cri.tb);
        (held.is_empty(), held)
    });
    let seen = watch.finish();

    let events = cri.events();
    let count = |kind: &str| events.iter().filter(|e| e["event"] == kind).count();
    let capacity = GPU_MIB << 20;
    let mut waits: Vec<Duration> = results.into_iter().map(Result::unwrap).collect();
    waits.sort();
    eprintln!(
        "wait: {:?}; StartContainer took {:?} (fastest) to {:?} (slowest); {seen:?}; events: {} admit, \
         {} admit_after_wait, {} release, {} reclaim",
        started.elapsed(),
        waits[0],
        waits[24],
        count("admit"),
        count("admit_after_wait"),
        count("release"),
        count("reclaim"),
    );
    assert!(
        seen.bytes <= capacity,
        "{seen:?}: more than the GPU's {capacity} bytes reserved"
    );
    assert!(seen.holders <= FIT, "{seen:?}");
    assert!(
        seen.holders == FIT && seen.queued > 0,
        "{seen:?}: the GPU was never full"
    );
    assert_eq!(count("admit") + count("admit_after_wait"), 25);
    assert!(count("admit_after_wait") >= 25 - FIT, "fewer than 5 waited");
    // A job that has exited is released by its poststop hook, whose transaction (or a waiter's
    // before it) first reclaims it as gone: either way, once each.
    assert_eq!(count("release") + count("reclaim"), 25);
    // Only the jobs appear in the log, never a sandbox.
    let sandboxes: Vec<&String> = pods.iter().map(|p| &p.sandbox).collect();
    assert!(events
        .iter()
        .all(|e| !sandboxes.contains(&&e["container"].as_str().unwrap().to_string())));
    cri.delete_pods(&pods);
}

#[test]
fn in_a_pod_with_a_sidecar_only_the_gpu_container_reserves() {
    let cri = cri_host("vramgate-cri-sidecar");
    // The device plugin names the GPU in the one container that asked for it
    // (NVIDIA_VISIBLE_DEVICES); the pod annotation says how much.
    let pods = run_all(&cri, vec![pod_config("trainer", &[("vramgate.dev/memory", REQUEST)])]);
    let pod = &pods[0];
    let gpu = cri.create(
        pod,
        container_config("gpu", RUN_UNTIL_STOPPED, &[("NVIDIA_VISIBLE_DEVICES", "0")]),
    );
    let sidecar = cri.create(pod, container_config("sidecar", RUN_UNTIL_STOPPED, &[]));
    cri.start_one(&gpu).unwrap();
    cri.start_one(&sidecar)
        .unwrap_or_else(|e| panic!("the sidecar, which names no GPU, was refused: {e}"));
    assert_eq!(reservations(&cri.tb), [(gpu.clone(), REQUEST_BYTES)]);
    assert_eq!(
        vramgate_hook_stages(&cri.bundle_spec(&gpu)),
        ["createRuntime", "poststop"]
    );
    for id in [&pod.sandbox, &sidecar] {
        assert!(vramgate_hook_stages(&cri.bundle_spec(id)).is_empty(), "{id} got hooks");
    }

    // `vramgate.dev/gpus` on the pod names the GPU for every container: both reserve.
    let pods2 = run_all(
        &cri,
        vec![pod_config(
            "both",
            &[("vramgate.dev/memory", REQUEST), ("vramgate.dev/gpus", "0")],
        )],
    );
    let a = cri.create(&pods2[0], container_config("a", RUN_UNTIL_STOPPED, &[]));
    let b = cri.create(&pods2[0], container_config("b", RUN_UNTIL_STOPPED, &[]));
    cri.start_one(&a).unwrap();
    cri.start_one(&b).unwrap();
    let mut held = reservations(&cri.tb);
    held.sort();
    let mut want = vec![
        (gpu.clone(), REQUEST_BYTES),
        (a.clone(), REQUEST_BYTES),
        (b.clone(), REQUEST_BYTES),
    ];
    want.sort();
    assert_eq!(held, want);

    cri.delete_pods(&pods);
    cri.delete_pods(&pods2);
    assert_eq!(reservations(&cri.tb), []);
}

/// The ledger's queue as `vramgate status` lists it: (container id, waiting hook's pid).
/// (container id, waiter pid, whether the waiter still runs) of each ticket.
fn queued(tb: &Testbed) -> Vec<(String, u64, bool)> {
    status(&tb.config_path)["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["queue"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            (
                t["container_id"].as_str().unwrap().to_string(),
                t["waiter_pid"].as_u64().unwrap(),
                t["alive"].as_bool().unwrap_or(true),
            )
        })
        .collect()
}

/// kubelet puts a deadline on each CRI call (`--runtime-request-timeout`, 2 min by default).
/// When a StartContainer whose admission is queued passes it, containerd cancels the task's
/// creation: the shim kills the runtime process (`runc create`, or vramgate-runtime waiting
/// before it), and the container is marked exited (`StartError`); kubelet then creates a new
/// attempt. The wait must end then, and nothing ever be admitted for the dead container.
///
/// Since vramgate-runtime admits at create, the waiter is the wrapper itself, and the shim's
/// SIGKILL ends it: its ticket is abandoned (status shows its waiter gone at once), waiters
/// behind it pass it, and the next transaction drops it.
///
/// Before the waiter watched its container (containerd 1.6.20, runc 1.1.5, this VM), the hook,
/// reparented to `containerd-shim-runc-v2`, kept its ticket at the head of the GPU's queue until
/// its own wait timeout, and when memory freed it was admitted for the init that was gone. Now
/// the service checks the init and the runtime process at least every second
/// (`service::CONTAINER_CHECK`) and refuses the wait.
#[test]
fn a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue() {
    let cri = cri_host("vramgate-cri-deadline");
    let big = run_all(
        &cri,
        vec![pod_config(
            "big",
            &[("vramgate.dev/memory", "20Gi"), ("vramgate.dev/gpus", "0")],
        )],
    );
    let big_id = cri.create(&big[0], container_config("app", RUN_UNTIL_STOPPED, &[]));
    cri.start_one(&big_id).unwrap();
    let pods = run_all(
        &cri,
        vec![pod_config(
            "queued",
            &[
                ("vramgate.dev/memory", "10Gi"),
                ("vramgate.dev/gpus", "0"),
                ("vramgate.dev/policy", "wait"),
                ("vramgate.dev/timeout", "20s"),
            ],
        )],
    );
    let id = cri.create(&pods[0], container_config("app", RUN_UNTIL_STOPPED, &[]));

    // A 3 s deadline stands for kubelet's 2 min.
    let mut client = cri.runtime.clone();
    let request = with_deadline(
        cri::StartContainerRequest {
            container_id: id.clone(),
        },
        Duration::from_secs(3),
    );
    let started = cri.block_on(async move { client.start_container(request).await });
    let err = started.expect_err("StartContainer returned before its deadline");
    assert!(
        matches!(err.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
        "{err}"
    );
    wait_until("containerd marks the start failed", Duration::from_secs(10), || {
        let s = cri.container_status(&id);
        (
            s.state == cri::ContainerState::ContainerExited as i32 && s.reason == "StartError",
            (s.state, s.reason, s.message),
        )
    });
    wait_until("the cancelled start no longer waits", Duration::from_secs(10), || {
        let q = queued(&cri.tb);
        (!q.iter().any(|(c, _, alive)| c == &id && *alive), q)
    });

    // Memory frees: nothing is admitted for the container that never started, and the
    // transaction that frees it drops the abandoned ticket.
    cri.delete_pods(&big);
    std::thread::sleep(Duration::from_secs(3));
    assert!(!reservations(&cri.tb).iter().any(|(c, _)| c == &id));
    assert!(
        !queued(&cri.tb).iter().any(|(c, _, _)| c == &id),
        "{:?}",
        queued(&cri.tb)
    );
    assert!(!cri
        .events()
        .iter()
        .any(|e| e["container"] == id.as_str() && e["event"] == "admit_after_wait"));
    cri.delete_pods(&pods);
}
