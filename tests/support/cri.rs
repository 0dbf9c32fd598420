//! containerd's CRI plugin driven as kubelet drives it, shared by the tests that need it
//! (tests/it/cri.rs, tests/it/device_plugin.rs): a private containerd with its CRI plugin on, the
//! runtime handler `vramgate` configured by the built `vramgate setup containerd`, images built
//! here and imported with `ctr` (nothing is pulled), and the CRI calls kubelet makes for a pod
//! over gRPC on containerd's unix socket. Pods use the host's network, so no CNI plugin runs.
//!
//! `crate::support::cri`; it uses `crate::support`.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::support::*;
pub use testnode::containerd::{build_images, Containerd, APP_IMAGE, HANDLER, PAUSE_IMAGE};
use vramgate_testbed::Testbed;

pub type RuntimeClient = cri::runtime_service_client::RuntimeServiceClient<Channel>;
pub type ImageClient = cri::image_service_client::ImageServiceClient<Channel>;

/// kubelet's default `--runtime-request-timeout`, the deadline it puts on each CRI call.
pub const CRI_DEADLINE: Duration = Duration::from_secs(120);
/// The grace period kubelet would give StopContainer; the app containers exit on SIGTERM.
pub const STOP_GRACE_SECONDS: i64 = 10;
/// An app container that runs until stopped, ending at once on SIGTERM (as PID 1, busybox
/// `sleep` alone would ignore it and wait out the grace period).
pub const RUN_UNTIL_STOPPED: &[&str] = &["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"];

/// A private containerd with the CRI plugin, set up for vramgate, and a CRI client on it.
pub struct Cri {
    pub rt: tokio::runtime::Runtime,
    pub runtime: RuntimeClient,
    pub images: ImageClient,
    /// containerd's process: a lock, since the test plays its service manager (restarts it)
    /// through a shared reference.
    pub child: Mutex<Option<Child>>,
    /// containerd's directory (socket, state, log) and main config, for a restart.
    pub config_dir: PathBuf,
    pub main_config: PathBuf,
    pub address: PathBuf,
    /// containerd's `--state`, where the runc shim keeps each container's bundle.
    pub state: PathBuf,
    pub tb: Testbed,
    /// Which containerd runs, and the PATH it (and its shims, and `ctr`) are found on.
    pub containerd: Containerd,
    pub path: String,
    /// The pods' cgroup parents, which kubelet would create and remove (runc removes only
    /// each container's own cgroup).
    pub pod_cgroups: Mutex<Vec<String>>,
    /// The scratch directory, removed last (after containerd and its mounts are gone).
    pub dir: Option<tempfile::TempDir>,
    /// The test node's supervisor, when this containerd is the node's (tools/testnode): it
    /// restarts containerd and owns its pods; `Cri` is then only a client.
    pub node: Option<NodeControl>,
}

/// A test node's control socket, and how many of its containerd's ends this client has seen.
pub struct NodeControl {
    pub socket: PathBuf,
    pub seen_exits: Mutex<usize>,
}

/// Where the pods' cgroups go, as kubelet puts them under `kubepods`.
pub const CGROUP_ROOT: &str = "vramgate-cri";

/// A pod that RunPodSandbox accepted: its config (which kubelet passes again on every
/// CreateContainer) and its sandbox id.
#[derive(Clone)]
pub struct Pod {
    pub name: String,
    pub config: cri::PodSandboxConfig,
    pub sandbox: String,
}

/// A CRI request with kubelet's deadline (sent as `grpc-timeout`; containerd cancels the
/// call's context when it passes).
pub fn req<T>(message: T) -> tonic::Request<T> {
    with_deadline(message, CRI_DEADLINE)
}

pub fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// The pod config kubelet sends for a host-network pod with these annotations. Its uid, and
/// so its cgroup parent, is this call's own (the test process and a count): the tests of a
/// binary run side by side and name their pods alike ("big"), and one test's cleanup of a
/// cgroup parent must never reach under another test's live pod.
pub fn pod_config(name: &str, annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
    static PODS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PODS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let uid = format!("{name}-{}-{n}", std::process::id());
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
pub fn container_config(name: &str, command: &[&str], env: &[(&str, &str)]) -> cri::ContainerConfig {
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

pub async fn run_pod(client: RuntimeClient, config: cri::PodSandboxConfig) -> Result<Pod, tonic::Status> {
    run_pod_on(client, config, HANDLER).await
}

/// RunPodSandbox with the runtime handler `handler` (a RuntimeClass's; "" is containerd's
/// default runtime, runc without vramgate).
pub async fn run_pod_on(
    mut client: RuntimeClient,
    config: cri::PodSandboxConfig,
    handler: &str,
) -> Result<Pod, tonic::Status> {
    let name = config.metadata.as_ref().unwrap().name.clone();
    let response = client
        .run_pod_sandbox(req(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_string(),
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
pub async fn create_container(
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

pub async fn start_container(mut client: RuntimeClient, id: String) -> Result<(), tonic::Status> {
    client
        .start_container(req(cri::StartContainerRequest { container_id: id }))
        .await
        .map(|_| ())
}

/// ContainerStatus of container `id`: the status in the answer.
pub async fn container_status(
    mut client: RuntimeClient,
    id: String,
) -> Result<Option<cri::ContainerStatus>, tonic::Status> {
    let request = req(cri::ContainerStatusRequest {
        container_id: id,
        verbose: false,
    });
    Ok(client.container_status(request).await?.into_inner().status)
}

/// Version with a short deadline: whether the runtime answers yet, as a start waits for it.
pub async fn probe_version(mut client: RuntimeClient) -> Result<tonic::Response<cri::VersionResponse>, tonic::Status> {
    let request = with_deadline(cri::VersionRequest { version: "v1".into() }, Duration::from_secs(2));
    client.version(request).await
}

/// Every pod sandbox the runtime lists, with a deadline a cleanup can wait out.
pub async fn list_sandboxes(mut client: RuntimeClient) -> Result<Vec<cri::PodSandbox>, tonic::Status> {
    let request = with_deadline(cri::ListPodSandboxRequest { filter: None }, Duration::from_secs(10));
    Ok(client.list_pod_sandbox(request).await?.into_inner().items)
}

/// What kubelet does when a pod is deleted: stop and remove its containers, then its sandbox.
pub async fn delete_pod(mut client: RuntimeClient, sandbox: String) -> Result<(), tonic::Status> {
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
    pub fn launch(tb: Testbed, containerd: Containerd) -> Cri {
        let dir = tb.dir.join("containerd");
        for sub in ["cni/bin", "cni/net.d", "cdi"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let main = dir.join("config.toml");
        std::fs::write(&main, containerd.host_config(&dir)).unwrap();
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
        let mut cri = Cri::start(tb, containerd, &dir, &main);
        cri.check_handler();
        cri.import_images();
        cri
    }

    /// Starts containerd with the main config `main`, its state, socket and log in `dir`, as
    /// it is (nothing set up), and waits for its CRI plugin.
    pub fn start(tb: Testbed, containerd: Containerd, dir: &Path, main: &Path) -> Cri {
        // From here on the Cri's drop undoes what containerd leaves on the host.
        host_dirs_enter();
        let path = containerd.path();
        let (child, address, state) = spawn_containerd_on(dir, main, &tb.config_path, &path);
        let (rt, channel) = cri_channel(address.clone());
        let cri = Cri {
            runtime: RuntimeClient::new(channel.clone()),
            images: ImageClient::new(channel),
            rt,
            child: Mutex::new(Some(child)),
            config_dir: dir.to_path_buf(),
            main_config: main.to_path_buf(),
            address,
            state,
            tb,
            containerd,
            path,
            pod_cgroups: Mutex::new(Vec::new()),
            dir: None,
            node: None,
        };
        cri.wait_ready();
        cri
    }

    /// A CRI client of the test node's containerd (tools/testnode), which its supervisor runs.
    pub fn attach(tb: Testbed, info: &testnode::node::NodeFile) -> Cri {
        let ctd = &info.containerd;
        let (rt, channel) = cri_channel(ctd.address.clone());
        let socket = info.control_socket.clone();
        let exits = testnode::node::control(&socket, "containerd exits", Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("the test node's supervisor: {e}"));
        let cri = Cri {
            runtime: RuntimeClient::new(channel.clone()),
            images: ImageClient::new(channel),
            rt,
            child: Mutex::new(None),
            config_dir: ctd.dir.clone(),
            main_config: ctd.main_config.clone(),
            address: ctd.address.clone(),
            state: ctd.state.clone(),
            tb,
            containerd: Containerd::Two,
            path: ctd.path.clone(),
            pod_cgroups: Mutex::new(Vec::new()),
            dir: None,
            node: Some(NodeControl {
                socket,
                seen_exits: Mutex::new(exits.parse().unwrap()),
            }),
        };
        cri.wait_ready();
        cri
    }

    /// Plays the engine's service manager: waits (at most `timeout`) for containerd to exit,
    /// starts it again with the same config, and returns how the old one ended.
    pub fn restart_after_exit(&self, timeout: Duration) -> std::process::ExitStatus {
        if let Some(node) = &self.node {
            // The node's supervisor is the service manager: it waits for the next end this
            // client has not seen, and answers once containerd runs again.
            let mut seen = node.seen_exits.lock().unwrap();
            let request = format!("containerd wait-exit {} {}", *seen, timeout.as_secs().max(1));
            let reply = testnode::node::control(&node.socket, &request, timeout + Duration::from_secs(90))
                .unwrap_or_else(|e| panic!("{e}"));
            *seen += 1;
            let raw = reply.strip_prefix("exited ").and_then(|r| r.parse().ok());
            use std::os::unix::process::ExitStatusExt;
            let status = std::process::ExitStatus::from_raw(raw.unwrap_or_else(|| panic!("{request}: {reply}")));
            drop(seen);
            self.wait_ready();
            return status;
        }
        let mut child = self.child.lock().unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.as_mut().expect("containerd runs").try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < timeout,
                "containerd did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let (new, _, _) = spawn_containerd_on(&self.config_dir, &self.main_config, &self.tb.config_path, &self.path);
        *child = Some(new);
        drop(child);
        self.wait_ready();
        status
    }

    /// `systemctl restart containerd`: SIGTERM, then started again once it has exited.
    pub fn restart(&self, timeout: Duration) {
        let pid = match &self.node {
            Some(node) => testnode::node::control(&node.socket, "containerd pid", Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("{e}"))
                .parse()
                .unwrap(),
            None => self.child.lock().unwrap().as_ref().expect("containerd runs").id(),
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.restart_after_exit(timeout);
    }

    /// The CRI plugin's runtimes as it loaded them (what `crictl info` shows).
    pub fn runtimes(&self) -> Value {
        let mut client = self.runtime.clone();
        let info = self
            .block_on(async move { client.status(req(cri::StatusRequest { verbose: true })).await })
            .unwrap()
            .into_inner()
            .info;
        let config: Value = serde_json::from_str(&info["config"]).unwrap();
        config["containerd"]["runtimes"].clone()
    }

    /// The runtime handler as the CRI plugin read it from the drop-in (what `crictl info`
    /// shows): a runc-v2 runtime running the built wrapper, passing vramgate's annotations.
    pub fn check_handler(&self) {
        let runtimes = &self.runtimes();
        let handler = &runtimes[HANDLER];
        assert_eq!(handler["runtimeType"], "io.containerd.runc.v2", "{runtimes}");
        assert_eq!(handler["options"]["BinaryName"], RUNTIME, "{handler}");
        assert_eq!(
            handler["PodAnnotations"],
            json!(["vramgate.dev/*", "nvidia.com/container.*"]),
            "{handler}"
        );
        // A device plugin's CDI requests, which kubelet writes on the container only.
        assert_eq!(
            handler["ContainerAnnotations"],
            json!(["vramgate.dev/*", "nvidia.com/container.*", "cdi.k8s.io/*"]),
            "{handler}"
        );
        assert!(runtimes["runc"].is_object(), "the default runtime is gone: {runtimes}");
    }

    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// Waits until the CRI plugin answers (it starts after containerd's own socket).
    pub fn wait_ready(&self) {
        let log = self.tb.dir.join("containerd/containerd.log");
        let start = Instant::now();
        loop {
            let answer = self.block_on(probe_version(self.runtime.clone()));
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

    pub fn ctr(&self, args: &[&str]) -> Command {
        testnode::containerd::ctr(&self.path, &self.address, args)
    }

    /// Imports the images into containerd's `k8s.io` namespace, as an air-gapped node gets
    /// them, and waits until the CRI plugin lists them.
    pub fn import_images(&mut self) {
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
    pub fn concurrently<T, Fut>(&self, n: usize, limit: usize, f: impl Fn(usize) -> Fut) -> Vec<T>
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

    pub fn run_pods(&self, configs: Vec<cri::PodSandboxConfig>) -> Vec<Result<Pod, tonic::Status>> {
        let parents = configs.iter().map(|c| c.linux.as_ref().unwrap().cgroup_parent.clone());
        self.pod_cgroups.lock().unwrap().extend(parents);
        let client = self.runtime.clone();
        self.concurrently(configs.len(), 4, |i| run_pod(client.clone(), configs[i].clone()))
    }

    pub fn create(&self, pod: &Pod, config: cri::ContainerConfig) -> String {
        let (client, images) = (self.runtime.clone(), self.images.clone());
        self.block_on(create_container(client, images, pod, config))
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

    pub fn delete_pods(&self, pods: &[Pod]) {
        let client = self.runtime.clone();
        let results = self.concurrently(pods.len(), 4, |i| delete_pod(client.clone(), pods[i].sandbox.clone()));
        for (pod, result) in pods.iter().zip(results) {
            result.unwrap_or_else(|e| panic!("deleting pod {}: {e}", pod.name));
        }
    }

    /// The spec the runc shim handed the runtime for container (or sandbox) `id`.
    pub fn bundle_spec(&self, id: &str) -> PathBuf {
        self.state
            .join("io.containerd.runtime.v2.task/k8s.io")
            .join(id)
            .join("config.json")
    }

    pub fn events(&self) -> Vec<Value> {
        events_of(&self.tb)
    }
}

impl Drop for Cri {
    /// Whatever a test left (it may have panicked halfway): every pod is stopped and removed
    /// through CRI, so the shims exit, then containerd is stopped and its mounts undone.
    fn drop(&mut self) {
        if self.node.is_some() {
            // The node's supervisor owns containerd and its pods.
            return;
        }
        kill_queued_hooks(&self.tb);
        if let Ok(listed) = self.block_on(list_sandboxes(self.runtime.clone())) {
            let sandboxes: Vec<String> = listed.into_iter().map(|p| p.id).collect();
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
        if let Some(child) = self.child.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            stop_pid(child.id() as i32, Duration::from_secs(10));
        }
        unmount_under(&self.tb.dir);
        remove_pod_cgroups(&self.pod_cgroups.lock().unwrap());
        drop(self.dir.take());
        host_dirs_leave();
    }
}

/// A runtime of its own and a CRI channel on it to the unix socket `socket`, connected on first
/// use (the engine may not be listening yet). The channel's worker task lives on this runtime,
/// which runs during each block_on.
pub fn cri_channel(socket: PathBuf) -> (tokio::runtime::Runtime, Channel) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
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
    (rt, channel)
}

/// The events the host `tb`'s hooks logged, in order (each with its kind and container:
/// [`events_in`]).
pub fn events_of(tb: &Testbed) -> Vec<Value> {
    events_in(&tb.state_dir)
}

/// Kills every hook still queued in `tb`'s ledger (a test that failed while one waited):
/// it would wait out its timeout after everything else is gone. Cleanup, not a check: it
/// reads the pids it can and never panics (a panic in a drop while unwinding would abort and
/// hide the test's own failure).
pub fn kill_queued_hooks(tb: &Testbed) {
    testnode::node::kill_queued_hooks(Path::new(VRAMGATE), &tb.config_path)
}

/// Each pod cgroup parent in `parents` from every hierarchy (v1 controllers or the v2 root),
/// then the common root once no other test's pod is in it; rmdir removes only empty ones.
pub fn remove_pod_cgroups(parents: &[String]) {
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .chain([PathBuf::from("/sys/fs/cgroup")]);
    for hierarchy in hierarchies {
        for parent in parents {
            remove_cgroup(&hierarchy.join(parent.trim_start_matches('/')));
        }
        let _ = std::fs::remove_dir(hierarchy.join(CGROUP_ROOT));
    }
}

/// A scratch host (config with the static simulated GPU, private state, in a new temporary
/// directory) and a CRI containerd on it; all of it goes when the `Cri` drops.
pub fn cri_host(name: &str) -> Cri {
    cri_host_with(name, "[inventory]\nbackend = \"static\"")
}

/// [`cri_host`] with `config_extra` in the host's vramgate config (a static inventory of
/// several GPUs, say).
pub fn cri_host_with(name: &str, config_extra: &str) -> Cri {
    cri_host_on(Containerd::Debian, name, config_extra)
}

/// [`cri_host_with`] on the given containerd.
pub fn cri_host_on(containerd: Containerd, name: &str, config_extra: &str) -> Cri {
    require("containerd");
    require("ctr");
    require("runc");
    let (dir, tb) = runc_testbed(name, config_extra);
    let mut cri = Cri::launch(tb, containerd);
    cri.dir = Some(dir);
    cri
}

pub fn run_all(cri: &Cri, configs: Vec<cri::PodSandboxConfig>) -> Vec<Pod> {
    cri.run_pods(configs)
        .into_iter()
        .enumerate()
        .map(|(i, pod)| {
            pod.unwrap_or_else(|e| panic!("RunPodSandbox of pod {i}: {e}\nledger: {:?}", reservations(&cri.tb)))
        })
        .collect()
}

/// The ledger's queue as `vramgate status` lists it: (container id, waiting hook's pid,
/// whether that hook still runs) of each ticket. Every field is required: status omits
/// `alive` when it cannot tell, and a test that asks whether a waiter is alive must not be
/// answered yes by an unknown.
pub fn queued(tb: &Testbed) -> Vec<(String, u64, bool)> {
    status_gpus(&status(&tb.config_path))
        .iter()
        .flat_map(|g| array_field(g, "queue").clone())
        .map(|t| {
            (
                str_field(&t, "container_id").to_string(),
                u64_field(&t, "waiter_pid"),
                bool_field(&t, "alive"),
            )
        })
        .collect()
}
