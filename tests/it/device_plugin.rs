//! The device plugin as kubelet sees it: the built `vramgate-device-plugin` started on a test
//! directory, this test playing kubelet over the same API (its Registration service on
//! `kubelet.sock`, then ListAndWatch, GetPreferredAllocation and Allocate on the plugin's
//! socket), on a static inventory of two GPUs. What the plugin grants is then started through
//! containerd's CRI plugin (tests/support/cri.rs) and reserved by the node's runtime wrapper.
//!
//! Why this test plays kubelet, when tests/kube_node.rs registers the plugin with the real
//! kubelet 1.36.3: it calls GetPreferredAllocation with the must-include ids and sizes kubelet
//! sends only in some states, watches each ListAndWatch update as it comes, and starts the
//! plugin before its first view of the node exists; the real kubelet does none of that on
//! demand.
//!
//! Timings printed here are for the reader; the targets (a ledger change in ListAndWatch
//! within 1 s, Allocate within 5 ms) are measured by bench/device-plugin.sh. The bounds
//! asserted are looser, for a loaded test machine.

use crate::support;
use crate::support::cri as cri_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::Status;

use cri_support::*;
use support::*;
use vramgate::deviceplugin::api;
use vramgate::deviceplugin::api::device_plugin_client::DevicePluginClient;
use vramgate_testbed::kubelet::{list_and_watch, Kubelet};
use vramgate_testbed::Testbed;

const PLUGIN: &str = env!("CARGO_BIN_EXE_vramgate-device-plugin");
const RESOURCE: &str = "vramgate.dev/gpu-memory-gib";
const SOCKET: &str = "vramgate-gpu-memory-gib.sock";
/// Two GPUs of different sizes: 16 and 24 units of 1 GiB.
const GPU0: &str = "GPU-d0000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-d1000000-0000-0000-0000-000000000001";
/// The loose bound on how long a change may take to reach ListAndWatch here (the target,
/// 1 s, is the bench's).
const SEEN_WITHIN: Duration = Duration::from_secs(3);

/// The static inventory; GPU 1's `used_outside` line is what the tests edit.
fn two_gpus() -> String {
    format!(
        "[inventory]\nbackend = \"static\"\n\
         [[inventory.gpus]]\nindex = 0\nuuid = \"{GPU0}\"\ntotal = \"16Gi\"\n\
         [[inventory.gpus]]\nindex = 1\nuuid = \"{GPU1}\"\ntotal = \"24Gi\"\nused_outside = \"0\"\n"
    )
}

/// Rewrites GPU 1's `used_outside` in `config` atomically, as an editor saves a file.
fn set_used_outside(config: &Path, value: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    let at = text.find("used_outside = ").expect("the config has the line");
    let end = at + text[at..].find('\n').unwrap();
    let new = format!("{}used_outside = \"{value}\"{}", &text[..at], &text[end..]);
    let tmp = config.with_extension("toml.new");
    std::fs::write(&tmp, new).unwrap();
    std::fs::rename(&tmp, config).unwrap();
}

/// The built plugin, stopped (SIGTERM) when dropped; its stderr in `log`.
struct PluginProcess {
    child: Child,
    log: PathBuf,
}

impl PluginProcess {
    /// The plugin for the node `bed`, whose state directory is made first, as the package's
    /// tmpfiles.d entry makes `/run/vramgate` at boot (the plugin never creates it).
    fn start(dir: &Path, bed: &Testbed, extra: &[&str]) -> PluginProcess {
        vramgate::ledger::StateDir::open_or_create(&bed.state_dir).unwrap();
        PluginProcess::spawn(dir, &bed.config_path, extra)
    }

    fn spawn(dir: &Path, config: &Path, extra: &[&str]) -> PluginProcess {
        let log = dir.with_extension("plugin.log");
        let child = Command::new(PLUGIN)
            .arg("--plugin-dir")
            .arg(dir)
            .args(extra)
            .env("VRAMGATE_CONFIG", config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        PluginProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        stop_pid(self.child.id() as i32, Duration::from_secs(5));
    }
}

/// A gRPC client of the plugin, on a runtime of its own (calls block).
struct PluginClient {
    rt: tokio::runtime::Runtime,
    client: DevicePluginClient<tonic::transport::Channel>,
}

impl PluginClient {
    fn connect(socket: &Path) -> PluginClient {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let channel = rt
            .block_on(vramgate::kubelet::connect(socket.to_path_buf()))
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
        PluginClient {
            rt,
            client: DevicePluginClient::new(channel),
        }
    }

    fn options(&mut self) -> api::DevicePluginOptions {
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.get_device_plugin_options(api::Empty {}).await })
            .unwrap()
            .into_inner()
    }

    fn preferred(&mut self, available: &[String], must: &[&str], size: i32) -> Vec<String> {
        let mut client = self.client.clone();
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.iter().map(|s| s.to_string()).collect(),
                allocation_size: size,
            }],
        };
        let response = self
            .rt
            .block_on(async move { client.get_preferred_allocation(request).await })
            .unwrap()
            .into_inner();
        response.container_responses[0].device_i_ds.clone()
    }

    fn allocate(&mut self, ids: &[String]) -> Result<api::ContainerAllocateResponse, Status> {
        let mut client = self.client.clone();
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        };
        self.rt
            .block_on(async move { client.allocate(request).await })
            .map(|r| r.into_inner().container_responses.remove(0))
    }
}

/// ListAndWatch, read on a thread of its own as kubelet keeps it open: each list, with when
/// it arrived.
struct Watch {
    lists: mpsc::Receiver<(Instant, Vec<api::Device>)>,
    latest: Vec<api::Device>,
}

impl Watch {
    fn open(socket: &Path) -> Watch {
        let lists = list_and_watch(socket);
        Watch {
            lists,
            latest: Vec::new(),
        }
    }

    /// Waits until a list satisfies `check`; returns when that list arrived.
    fn until(&mut self, what: &str, limit: Duration, check: impl Fn(&[api::Device]) -> bool) -> Instant {
        let deadline = Instant::now() + limit;
        // Judge the newest list the plugin sent, not one that a queued update already replaced.
        while let Ok((_, list)) = self.lists.try_recv() {
            self.latest = list;
        }
        if check(&self.latest) && !self.latest.is_empty() {
            return Instant::now();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lists.recv_timeout(left) {
                Ok((at, list)) => {
                    self.latest = list;
                    if check(&self.latest) {
                        return at;
                    }
                }
                Err(_) => panic!(
                    "ListAndWatch did not show {what} within {limit:?}; last: {}",
                    summary(&self.latest)
                ),
            }
        }
    }
}

/// Healthy units of `gpu` in a list.
fn healthy(list: &[api::Device], gpu: &str) -> usize {
    list.iter()
        .filter(|d| d.id.starts_with(&format!("{gpu}/")) && d.health == "Healthy")
        .count()
}

fn summary(list: &[api::Device]) -> String {
    format!(
        "{} devices, healthy: GPU 0 {}, GPU 1 {}",
        list.len(),
        healthy(list, GPU0),
        healthy(list, GPU1)
    )
}

fn healthy_ids(list: &[api::Device]) -> Vec<String> {
    list.iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

#[test]
fn registers_lists_places_allocates_and_follows_kubelet_and_the_node() {
    require("runc");
    let (_dir, bed) = runc_testbed("vramgate-dp-api", &two_gpus());
    let _cleanup = Cleanup(&bed);
    let plugin_dir = bed.dir.join("device-plugins");
    let kubelet = Kubelet::start(&plugin_dir);

    // A state directory that does not exist (a DaemonSet that mounts another path than the
    // config's state_dir) is an error at start, never an empty ledger with every unit free.
    let missing = bed.dir.join("no-state");
    let elsewhere = bed.dir.join("elsewhere.toml");
    std::fs::write(
        &elsewhere,
        format!("state_dir = {:?}\n{}", missing.display().to_string(), two_gpus()),
    )
    .unwrap();
    let mut wrong = PluginProcess::spawn(&plugin_dir, &elsewhere, &[]);
    let exit = wait_until(
        "the plugin exits without its state directory",
        Duration::from_secs(10),
        || {
            let exit = wrong.child.try_wait().unwrap();
            (exit.is_some(), exit)
        },
    );
    assert_eq!(exit.unwrap().code(), Some(1), "{}", wrong.log());
    assert!(
        wrong
            .log()
            .contains(&format!("state directory {} does not exist", missing.display())),
        "{}",
        wrong.log()
    );
    assert!(!missing.exists());

    let plugin = PluginProcess::start(&plugin_dir, &bed, &[]);

    // Registration: the API version, the resource with its unit in the name, the socket.
    let registration = kubelet.registration(Duration::from_secs(20));
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.resource_name, RESOURCE);
    assert_eq!(registration.endpoint, SOCKET);
    assert!(registration.options.unwrap().get_preferred_allocation_available);
    let socket = plugin_dir.join(SOCKET);
    let mut client = PluginClient::connect(&socket);
    assert!(client.options().get_preferred_allocation_available);

    // ListAndWatch: 16 + 24 units, IDs that name their GPU, all healthy.
    let mut watch = Watch::open(&socket);
    watch.until("every unit", SEEN_WITHIN, |l| l.len() == 40);
    assert_eq!(healthy(&watch.latest, GPU0), 16, "{}", plugin.log());
    assert_eq!(healthy(&watch.latest, GPU1), 24);
    assert!(watch.latest.iter().any(|d| d.id == format!("{GPU1}/23")));

    // GetPreferredAllocation: 10 units, all from one GPU, the tighter fit (GPU 0, 16 GiB).
    let available = healthy_ids(&watch.latest);
    let preferred = client.preferred(&available, &[], 10);
    assert_eq!(preferred.len(), 10, "{preferred:?}");
    assert!(
        preferred.iter().all(|id| id.starts_with(&format!("{GPU0}/"))),
        "{preferred:?}"
    );
    // 20 units fit only GPU 1; a unit kubelet must include decides the GPU.
    let preferred = client.preferred(&available, &[], 20);
    assert!(
        preferred.iter().all(|id| id.starts_with(&format!("{GPU1}/"))),
        "{preferred:?}"
    );
    let must = format!("{GPU1}/5");
    let preferred = client.preferred(&available, &[&must], 2);
    assert_eq!(preferred[0], must);
    assert!(preferred[1].starts_with(GPU1), "{preferred:?}");

    // Allocate: the memory and the GPU, for the node's hook.
    let granted: Vec<String> = (0..4).map(|n| format!("{GPU0}/{n}")).collect();
    let response = client.allocate(&granted).unwrap();
    assert_eq!(response.envs["VRAMGATE_MEMORY"], "4Gi");
    assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], GPU0);
    assert_eq!(response.envs["VRAMGATE_GPUS"], GPU0);
    assert_eq!(response.envs["VRAMGATE_DEVICE_IDS"], granted.join(","));
    assert_eq!(response.annotations["vramgate.dev/memory"], "4Gi");
    assert_eq!(response.annotations["vramgate.dev/gpus"], GPU0);
    // Units on two GPUs: refused, naming both.
    let err = client
        .allocate(&[format!("{GPU0}/1"), format!("{GPU1}/1")])
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains(GPU0) && err.message().contains(GPU1) && err.message().contains("one GPU"),
        "{err}"
    );
    let err = client.allocate(&["GPU-nope/1".to_string()]).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("GPU-nope/1"), "{err}");

    // Memory used outside vramgate (the static inventory's used_outside): 5 GiB on GPU 1
    // makes 5 of its units unhealthy; freeing it brings them back.
    let changed = Instant::now();
    set_used_outside(&bed.config_path, "5Gi");
    let seen = watch.until("GPU 1 with 19 healthy units", SEEN_WITHIN, |l| healthy(l, GPU1) == 19);
    eprintln!(
        "used_outside 5Gi -> ListAndWatch: {:?}",
        seen.saturating_duration_since(changed)
    );
    assert_eq!(healthy(&watch.latest, GPU0), 16);
    let changed = Instant::now();
    set_used_outside(&bed.config_path, "0");
    let seen = watch.until("GPU 1 all healthy again", SEEN_WITHIN, |l| healthy(l, GPU1) == 24);
    eprintln!(
        "used_outside 0 -> ListAndWatch: {:?}",
        seen.saturating_duration_since(changed)
    );

    // A refresh that never returns (here: the config replaced by a FIFO nobody writes, so
    // reading it blocks, as NVML can on a GPU that fell off the bus): within the watchdog's
    // limit every unit is unhealthy, and the next view that completes brings them back.
    let hung = Instant::now();
    let config = HungConfig::hang(&bed.config_path);
    let limit = vramgate::kubelet::watchdog::stale_after(vramgate::deviceplugin::DEFAULT_POLL_INTERVAL);
    let seen = watch.until("every unit unhealthy while the view hangs", limit + SEEN_WITHIN, |l| {
        healthy(l, GPU0) + healthy(l, GPU1) == 0
    });
    eprintln!("view hung -> all unhealthy: {:?}", seen.saturating_duration_since(hung));
    assert!(plugin.log().contains("no new view for"), "{}", plugin.log());
    config.release();
    watch.until("every unit healthy once the view returns", SEEN_WITHIN, |l| {
        healthy(l, GPU0) + healthy(l, GPU1) == 40
    });

    // A reservation made outside Kubernetes: a plain runc container with the hooks, 3 GiB on
    // GPU 1 (GPU 0 still has 4 units granted to a pod that has not started: no effect). It
    // sets the plugin's marker env itself, naming units nobody granted: still someone else's.
    let changed = Instant::now();
    let forged = format!("VRAMGATE_DEVICE_IDS={GPU1}/0,{GPU1}/1,{GPU1}/2");
    let bundle = bed
        .bundle(
            "outside-k8s",
            &["sleep", "60"],
            &[("vramgate.dev/memory", "3Gi"), ("vramgate.dev/gpus", "1")],
            &[&forged],
            true,
        )
        .unwrap();
    let mut outside = bed
        .runc_run(&bundle, "outside-k8s")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = watch.until("GPU 1 with 21 healthy units", SEEN_WITHIN, |l| healthy(l, GPU1) == 21);
    eprintln!(
        "outside reservation -> ListAndWatch: {:?}",
        seen.saturating_duration_since(changed)
    );
    wait_reserved(&bed, "outside-k8s", 3 * GIB);
    let changed = Instant::now();
    bed.cleanup_containers();
    let _ = outside.wait();
    let seen = watch.until("GPU 1 all healthy after the container stopped", SEEN_WITHIN, |l| {
        healthy(l, GPU1) == 24
    });
    eprintln!("release -> ListAndWatch: {:?}", seen.saturating_duration_since(changed));

    // kubelet restarts: its socket and the plugin's are removed, then kubelet.sock is created
    // again. The plugin serves on a new socket and registers again.
    kubelet.stop_and_clear();
    let restarted = Instant::now();
    let kubelet = Kubelet::start(&plugin_dir);
    let again = kubelet.registration(Duration::from_secs(20));
    eprintln!("re-registered {:?} after kubelet came back", restarted.elapsed());
    assert_eq!(again.resource_name, RESOURCE);
    let mut watch = Watch::open(&plugin_dir.join(SOCKET));
    watch.until("every unit after the restart", SEEN_WITHIN, |l| {
        healthy(l, GPU0) + healthy(l, GPU1) == 40
    });
    assert!(plugin.log().contains("registering again") || plugin.log().contains("serving again"));

    // SIGTERM: the plugin removes its socket and exits 0.
    let mut plugin = plugin;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(plugin.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = wait_until("the plugin exits on SIGTERM", Duration::from_secs(10), || {
        let exit = plugin.child.try_wait().unwrap();
        (exit.is_some(), exit)
    });
    assert!(exit.unwrap().success(), "{exit:?}: {}", plugin.log());
    assert!(!plugin_dir.join(SOCKET).exists(), "{}", plugin.log());
    eprintln!("plugin log:\n{}", plugin.log());
}

/// What the first-view tests give `--startup-timeout`: past the steady state's limit
/// (ten poll intervals of 100 ms, 2 s at least), so that the two are told apart.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(4);

#[test]
fn a_first_view_that_never_comes_ends_the_plugin_with_the_reason() {
    // Refresher::open's config read blocks (a FIFO nobody writes), as NVML's start can on a GPU
    // that fell off the bus: once --startup-timeout has passed, the plugin must end with the
    // reason and the flag to raise, not sit unregistered.
    let (_dir, bed) = runc_testbed("vramgate-dp-first-view", &two_gpus());
    vramgate::ledger::StateDir::open_or_create(&bed.state_dir).unwrap();
    let _config = HungConfig::hang(&bed.config_path);
    let plugin_dir = bed.dir.join("device-plugins");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    let started = Instant::now();
    let allowance = format!("{}s", STARTUP_TIMEOUT.as_secs());
    let mut plugin = PluginProcess::spawn(
        &plugin_dir,
        &bed.config_path,
        &["--poll-interval", "100ms", "--startup-timeout", &allowance],
    );
    let exit = wait_until(
        "the plugin ends without a first view",
        STARTUP_TIMEOUT + SEEN_WITHIN * 3,
        || {
            let exit = plugin.child.try_wait().unwrap();
            (exit.is_some(), exit)
        },
    );
    let took = started.elapsed();
    assert_eq!(exit.unwrap().code(), Some(1), "{}", plugin.log());
    let reason = format!("no first view within {}s", STARTUP_TIMEOUT.as_secs());
    assert!(plugin.log().contains(&reason), "{}", plugin.log());
    assert!(
        plugin.log().contains("--startup-timeout"),
        "the error does not name the flag: {}",
        plugin.log()
    );
    assert!(
        took >= STARTUP_TIMEOUT,
        "ended after {took:?}, before --startup-timeout {STARTUP_TIMEOUT:?}"
    );
    assert!(!plugin_dir.join(SOCKET).exists(), "it served a socket without a view");
}

#[test]
fn a_first_view_later_than_ten_poll_intervals_is_waited_for_then_registered() {
    // NVML's start on a cold multi-GPU host can take longer than ten poll intervals, the limit
    // a view has once the plugin runs: within --startup-timeout the plugin waits, says so, and
    // serves nothing until the view comes; then it registers and lists every unit.
    let (_dir, bed) = runc_testbed("vramgate-dp-slow-start", &two_gpus());
    vramgate::ledger::StateDir::open_or_create(&bed.state_dir).unwrap();
    let config = HungConfig::hang(&bed.config_path);
    let plugin_dir = bed.dir.join("device-plugins");
    let kubelet = Kubelet::start(&plugin_dir);
    let mut plugin = PluginProcess::spawn(
        &plugin_dir,
        &bed.config_path,
        &["--poll-interval", "100ms", "--startup-timeout", "20s"],
    );
    // Past the point where a view in steady state would count as hung, the plugin says it
    // still waits (not a sleep: the line is the moment it could have given up); it has not
    // ended, and serves nothing. Its registration below, by this same process, shows it
    // never ended in between.
    wait_until(
        "the plugin says it still waits for its first view",
        Duration::from_secs(20),
        || (plugin.log().contains("still waiting"), plugin.log()),
    );
    assert!(
        plugin.child.try_wait().unwrap().is_none(),
        "the plugin ended in a late first view: {}",
        plugin.log()
    );
    assert!(!plugin_dir.join(SOCKET).exists(), "it served a socket without a view");

    config.release();
    let registration = kubelet.registration(Duration::from_secs(10));
    assert_eq!(registration.resource_name, RESOURCE);
    assert_eq!(registration.endpoint, SOCKET);
    let mut watch = Watch::open(&plugin_dir.join(SOCKET));
    watch.until("every unit healthy", SEEN_WITHIN, |l| {
        l.len() == 40 && healthy(l, GPU0) + healthy(l, GPU1) == 40
    });
    assert!(plugin.child.try_wait().unwrap().is_none(), "{}", plugin.log());
}

/// The status of the GPU `uuid` in `vramgate status --json`.
fn gpu_status(config: &Path, uuid: &str) -> Value {
    status(config)["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"] == uuid)
        .cloned()
        .unwrap()
}

#[test]
fn a_pod_started_with_what_allocate_granted_reserves_exactly_that_on_that_gpu() {
    let cri = cri_host_with("vramgate-dp-cri", &two_gpus());
    let plugin_dir = cri.tb.dir.join("device-plugins");
    let kubelet = Kubelet::start(&plugin_dir);
    let plugin = PluginProcess::start(&plugin_dir, &cri.tb, &[]);
    kubelet.registration(Duration::from_secs(20));
    let socket = plugin_dir.join(SOCKET);
    let mut client = PluginClient::connect(&socket);
    let mut watch = Watch::open(&socket);
    watch.until("every unit", SEEN_WITHIN, |l| l.len() == 40);

    // kubelet admits a pod asking for 3 units: the plugin's preference, then Allocate.
    let ids = client.preferred(&healthy_ids(&watch.latest), &[], 3);
    let gpu = ids[0].rsplit_once('/').unwrap().0.to_string();
    assert!(ids.iter().all(|id| id.starts_with(&format!("{gpu}/"))), "{ids:?}");
    let t = Instant::now();
    let granted = client.allocate(&ids).unwrap();
    eprintln!("Allocate took {:?} (one call, with connection reuse)", t.elapsed());
    // The pod carries its own vramgate.dev/memory annotation too: the container annotation
    // from Allocate wins, so the node reserves what the scheduler granted.
    let pod = pod_config("dp-pod", &[("vramgate.dev/memory", "1205Mi")]);
    kubelet.checkpoint_allocation(&pod.metadata.as_ref().unwrap().uid, "app", RESOURCE, &ids);
    let pods = run_all(&cri, vec![pod]);
    let envs: BTreeMap<&str, &str> = granted.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let env_list: Vec<(&str, &str)> = envs.into_iter().collect();
    let mut config = container_config("app", RUN_UNTIL_STOPPED, &env_list);
    // kubelet passes a device plugin's annotations as the container's.
    config.annotations = granted.annotations.clone();
    let id = cri.create(&pods[0], config);
    cri.start_one(&id)
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", plugin.log()));

    // The node's ledger holds exactly the grant, on the chosen GPU.
    assert_eq!(reservations(&cri.tb), [(id.clone(), 3 * GIB)]);
    let on_gpu = gpu_status(&cri.tb.config_path, &gpu);
    let held: Vec<&str> = on_gpu["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["container_id"].as_str().unwrap())
        .collect();
    assert_eq!(held, [id.as_str()], "{on_gpu}");
    let spec: Value = serde_json::from_slice(&std::fs::read(cri.bundle_spec(&id)).unwrap()).unwrap();
    assert_eq!(
        spec["annotations"]["vramgate.dev/memory"], "3Gi",
        "the container annotation won"
    );

    // The pod's own units stay healthy (kubelet counts them in use), and nothing else on
    // that GPU changes: its memory is Kubernetes' own.
    let units = if gpu == GPU0 { 16 } else { 24 };
    std::thread::sleep(Duration::from_secs(1));
    watch.until("the pod's GPU still all healthy", SEEN_WITHIN, |l| {
        healthy(l, &gpu) == units
    });
    for id in &ids {
        let unit = watch.latest.iter().find(|d| &d.id == id).unwrap();
        assert_eq!(unit.health, "Healthy", "{id}");
    }
    assert!(plugin.log().contains("healthy units"), "{}", plugin.log());

    // The plugin restarts (an upgrade, a crash): what it granted is gone from its memory, and
    // kubelet's checkpoint vouches for the pod's units, so they are still Kubernetes' own.
    drop(watch);
    drop(client);
    drop(plugin);
    let plugin = PluginProcess::start(&plugin_dir, &cri.tb, &[]);
    kubelet.registration(Duration::from_secs(20));
    let mut watch = Watch::open(&socket);
    watch.until(
        "the pod's GPU all healthy after the plugin restarted",
        SEEN_WITHIN,
        |l| l.len() == 40 && healthy(l, &gpu) == units,
    );
    assert!(plugin.log().contains("healthy units"), "{}", plugin.log());

    cri.delete_pods(&pods);
    assert_eq!(reservations(&cri.tb), []);
}

/// Whether a demangled symbol names an item of `krate` (`tonic::…`, not `monotonic::…`).
fn names_crate(symbol: &str, krate: &str) -> bool {
    let path = format!("{krate}::");
    symbol.match_indices(&path).any(|(at, _)| {
        symbol[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// The hot-path binaries link none of the plugin's gRPC stack: no function or data of tokio,
/// tonic, prost, h2 or hyper is defined in them. (Their symbol tables still name those
/// crates' object files, which the linker was given and dropped, so the bytes alone would.)
#[test]
fn the_hook_and_the_runtime_wrapper_link_no_grpc() {
    for binary in [HOOK, RUNTIME] {
        let symbols = run_ok(Command::new("nm").args(["--demangle", "--defined-only"]).arg(binary));
        assert!(symbols.lines().count() > 1000, "{binary} has no symbol table to check");
        let linked: Vec<&str> = symbols
            .lines()
            .filter(|line| {
                ["tokio", "tonic", "prost", "h2", "hyper"]
                    .iter()
                    .any(|c| names_crate(line, c))
            })
            .take(5)
            .collect();
        assert!(linked.is_empty(), "{binary} links the gRPC stack: {linked:?}");
    }
}
