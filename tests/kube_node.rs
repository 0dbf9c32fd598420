//! vramgate on a real one-node Kubernetes 1.36.3 (tests/support/kube.rs): etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kubelet built by `scripts/fetch-kubernetes`, on
//! containerd 2.1 set up by the built `vramgate setup containerd`, with the built binaries as
//! shipped. No stand-in: the fake kubelet and the Python API server of the other tests are not
//! used here.
//!
//! A plain program (`harness = false`) on libtest-mimic: `main` starts the cluster once, runs
//! each scenario as a named trial (`cargo test --test kube_node -- <filter>` and `--list` work),
//! then tears the cluster down and fails when anything it made is left on the host. The trials
//! run one at a time whatever `--test-threads` says: they share the node, its one simulated GPU
//! and its ledger, and each asserts what the whole node holds.

#[path = "support/cri.rs"]
mod cri_support;
#[path = "support/dra.rs"]
mod dra_support;
#[path = "support/kube.rs"]
mod kube_support;
mod support;

use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

use kube_support::*;
use support::*;

/// The node's one simulated GPU: 8 GiB, nothing used outside vramgate.
const GPU: &str = "GPU-4b000000-0000-0000-0000-000000000045";
const GPU_GIB: u64 = 8;

fn node_config() -> String {
    format!(
        "[inventory]\nbackend = \"static\"\n\
         [[inventory.gpus]]\nindex = 0\nuuid = \"{GPU}\"\ntotal = \"{GPU_GIB}Gi\"\nused_outside = \"0\"\n"
    )
}

type Scenario = fn(&Cluster);

const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "node_is_ready_and_runs_kubernetes_1_36_3",
        node_is_ready_and_runs_kubernetes_1_36_3,
    ),
    (
        "device_plugin_pods_are_placed_queued_released_and_survive_a_kubelet_restart",
        device_plugin_pods_are_placed_queued_released_and_survive_a_kubelet_restart,
    ),
    (
        "runtime_class_pods_reserve_by_annotation_are_refused_in_events_and_wait",
        runtime_class_pods_reserve_by_annotation_are_refused_in_events_and_wait,
    ),
    ("every_manifest_applies_server_side", every_manifest_applies_server_side),
    (
        "dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims",
        dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims,
    ),
];

/// The device plugin's resource.
const RESOURCE: &str = "vramgate.dev/gpu-memory-gib";
/// How long a pod may take to be placed, started or deleted on the loaded machine.
const POD_LIMIT: Duration = Duration::from_secs(90);
/// An app container that runs until stopped, ending at once on SIGTERM.
const RUN_UNTIL_STOPPED: &str = "trap 'exit 0' TERM; sleep 600 & wait";

/// What a test pod is: every one runs the imported busybox image until stopped.
#[derive(Default, Clone, Copy)]
struct PodSpec<'a> {
    /// On the pod network (the CNI bridge); else the host's.
    network: bool,
    /// runtimeClassName vramgate.
    vramgate: bool,
    /// Units of the device plugin's resource the container asks for.
    gib: Option<u64>,
    annotations: &'a [(&'a str, &'a str)],
    env: &'a [(&'a str, &'a str)],
}

fn pod_yaml(name: &str, spec: &PodSpec) -> String {
    let annotations: serde_json::Map<String, Value> = spec
        .annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let env: Vec<Value> = spec
        .env
        .iter()
        .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
        .collect();
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": !spec.network,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": cri_support::APP_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", RUN_UNTIL_STOPPED],
                "env": env,
            }],
        },
    });
    if spec.vramgate {
        pod["spec"]["runtimeClassName"] = "vramgate".into();
    }
    if let Some(gib) = spec.gib {
        pod["spec"]["containers"][0]["resources"] = serde_json::json!({"limits": {(RESOURCE): gib.to_string()}});
    }
    // JSON is YAML.
    pod.to_string()
}

fn pod(c: &Cluster, name: &str) -> Option<Value> {
    c.get_json(&["pod", name])
}

/// Waits until pod `name` runs; returns it.
fn wait_running(c: &Cluster, name: &str) -> Value {
    c.wait(&format!("pod {name} runs"), POD_LIMIT, "kubelet", || {
        let p = pod(c, name);
        let running = p.as_ref().is_some_and(|p| {
            p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        });
        (running, p)
    })
    .expect("a running pod")
}

/// The containerd id of pod `name`'s container (what the ledger names).
fn container_id(pod: &Value) -> String {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default();
    id.strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("no containerd id in {}", pod["status"]))
        .to_string()
}

/// Waits until kube-scheduler says pod `name` does not fit; returns its message.
fn wait_unschedulable(c: &Cluster, name: &str) -> String {
    c.wait(
        &format!("pod {name} is unschedulable"),
        POD_LIMIT,
        "kube-scheduler",
        || {
            let p = pod(c, name);
            let cond = p
                .as_ref()
                .and_then(|p| p["status"]["conditions"].as_array().cloned())
                .unwrap_or_default()
                .into_iter()
                .find(|c| c["type"] == "PodScheduled");
            let unschedulable = cond
                .as_ref()
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Unschedulable");
            (unschedulable, cond)
        },
    )
    .map(|c| c["message"].as_str().unwrap_or_default().to_string())
    .unwrap_or_default()
}

/// Deletes pod `name` and returns once the API server no longer has it (kubelet stopped its
/// containers and confirmed).
fn delete_pod(c: &Cluster, name: &str) {
    c.kubectl_ok(&["delete", "pod", name, "--wait=true", "--timeout=90s"]);
    assert!(pod(c, name).is_none(), "pod {name} is still there");
}

/// The node's allocatable units of the device plugin's resource.
fn allocatable(c: &Cluster) -> Option<String> {
    c.get_json(&["node", &c.node])
        .and_then(|n| n["status"]["allocatable"][RESOURCE].as_str().map(str::to_string))
}

/// The ledger's reservations (`vramgate status --json`), as (container id, GiB), sorted.
fn ledger(c: &Cluster) -> Vec<(String, u64)> {
    let mut held: Vec<(String, u64)> = reservations(c.tb()).into_iter().map(|(id, b)| (id, b / GIB)).collect();
    held.sort();
    held
}

fn wait_ledger(c: &Cluster, what: &str, mut want: Vec<(String, u64)>) {
    want.sort();
    c.wait(what, POD_LIMIT, "kubelet", || {
        let held = ledger(c);
        (held == want, held)
    });
}

/// The built `vramgate-device-plugin` as k8s/device-plugin.yaml runs it (the same arguments,
/// kubelet's device plugin directory, vramgate's config), as a process on the host rather than
/// a pod: the node image is not imported here. Stopped (SIGTERM) when dropped.
struct DevicePlugin {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl DevicePlugin {
    fn start(c: &Cluster) -> DevicePlugin {
        // The state directory exists before, as the package's tmpfiles entry makes it.
        vramgate::ledger::StateDir::open_or_create(&c.tb().state_dir).unwrap();
        let log = c.log("device-plugin");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_vramgate-device-plugin"))
            .args(["--plugin-dir", DEVICE_PLUGINS, "--unit", "1Gi"])
            .env("VRAMGATE_CONFIG", &c.tb().config_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        DevicePlugin { child, log }
    }

    fn registrations(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(&format!("registered {RESOURCE} with kubelet"))
            .count()
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        stop_pid(self.child.id() as i32, Duration::from_secs(5));
    }
}

/// Pods asking for the device plugin's resource: the plugin registers with the real kubelet,
/// the node offers the GPU's 8 GiB, kube-scheduler places a 5 GiB pod and vramgate-runtime
/// reserves exactly that; a second 5 GiB pod stays Pending (Insufficient) until the first is
/// deleted, whose reservation is then released; after a kubelet restart the plugin registers
/// again, the running pod is not restarted and is counted once (a 3 GiB pod still fits, a
/// 1 GiB one more does not).
fn device_plugin_pods_are_placed_queued_released_and_survive_a_kubelet_restart(c: &Cluster) {
    let plugin = DevicePlugin::start(c);
    let offered = c.wait("the node offers the GPU's 8 GiB", POD_LIMIT, "kubelet", || {
        let a = allocatable(c);
        (a.as_deref() == Some("8"), a)
    });
    assert_eq!(offered.as_deref(), Some("8"));
    let five = PodSpec {
        vramgate: true,
        gib: Some(5),
        annotations: &[("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "60s")],
        ..PodSpec::default()
    };
    c.apply(&pod_yaml("dp-a", &five));
    let a = container_id(&wait_running(c, "dp-a"));
    assert_eq!(ledger(c), [(a.clone(), 5)], "the ledger holds what the plugin granted");
    c.apply(&pod_yaml("dp-b", &five));
    let why = wait_unschedulable(c, "dp-b");
    assert!(why.contains(&format!("Insufficient {RESOURCE}")), "{why}");
    assert_eq!(ledger(c), [(a.clone(), 5)]);
    delete_pod(c, "dp-a");
    let b = container_id(&wait_running(c, "dp-b"));
    wait_ledger(
        c,
        "dp-a's reservation is released and dp-b holds 5 GiB",
        vec![(b.clone(), 5)],
    );

    let before = plugin.registrations();
    c.stop_kubelet();
    c.start_kubelet();
    c.wait(
        "the plugin registers with the new kubelet",
        POD_LIMIT,
        "kubelet",
        || (plugin.registrations() > before, tail(&plugin.log, 5)),
    );
    c.wait_node_ready();
    c.wait("the node offers 8 units again", POD_LIMIT, "kubelet", || {
        let a = allocatable(c);
        (a.as_deref() == Some("8"), a)
    });
    let pod_b = pod(c, "dp-b").unwrap();
    assert_eq!(container_id(&pod_b), b, "kubelet's restart replaced dp-b's container");
    assert_eq!(pod_b["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(ledger(c), [(b.clone(), 5)], "counted twice after the restart");
    c.apply(&pod_yaml("dp-c", &PodSpec { gib: Some(3), ..five }));
    let cc = container_id(&wait_running(c, "dp-c"));
    wait_ledger(c, "dp-b and dp-c hold 5 and 3 GiB", vec![(b, 5), (cc, 3)]);
    c.apply(&pod_yaml("dp-d", &PodSpec { gib: Some(1), ..five }));
    let why = wait_unschedulable(c, "dp-d");
    assert!(why.contains(&format!("Insufficient {RESOURCE}")), "{why}");
    for name in ["dp-b", "dp-c", "dp-d"] {
        delete_pod(c, name);
    }
    wait_ledger(c, "every reservation is released", vec![]);
    drop(plugin);
}

/// The RuntimeClass path of k8s/pod.yaml, without the device plugin: the pod's annotations
/// reserve 6 GiB on the GPU its container names; a second such pod under `reject` is refused
/// and kubelet's events carry vramgate's line; one under `wait` queues, and runs (not killed
/// by kubelet's CRI deadline, not restarted) once the first pod is deleted.
fn runtime_class_pods_reserve_by_annotation_are_refused_in_events_and_wait(c: &Cluster) {
    let gpu_env: &[(&str, &str)] = &[("NVIDIA_VISIBLE_DEVICES", "0")];
    let reject = PodSpec {
        vramgate: true,
        annotations: &[("vramgate.dev/memory", "6Gi"), ("vramgate.dev/policy", "reject")],
        env: gpu_env,
        ..PodSpec::default()
    };
    c.apply(&pod_yaml("rc-a", &reject));
    let a = container_id(&wait_running(c, "rc-a"));
    assert_eq!(ledger(c), [(a.clone(), 6)]);
    c.apply(&pod_yaml("rc-refused", &reject));
    let refusal = c.wait("kubelet's events show vramgate's refusal", POD_LIMIT, "kubelet", || {
        let events = c
            .get_json(&["events", "--field-selector", "involvedObject.name=rc-refused"])
            .map(|e| e["items"].clone())
            .unwrap_or_default();
        let line = events
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str())
            .find(|m| m.contains("vramgate: refused container"))
            .map(str::to_string);
        (line.is_some(), line.unwrap_or_else(|| events.to_string()))
    });
    assert!(refusal.contains("set vramgate.dev/policy=wait to queue"), "{refusal}");
    assert_eq!(ledger(c), [(a.clone(), 6)], "the refused pod holds nothing");
    delete_pod(c, "rc-refused");

    let wait = PodSpec {
        annotations: &[
            ("vramgate.dev/memory", "6Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "90s"),
        ],
        ..reject
    };
    c.apply(&pod_yaml("rc-waits", &wait));
    c.wait("rc-waits queues in the ledger", POD_LIMIT, "kubelet", || {
        let q = queued_ids(c.tb());
        (q.len() == 1, q)
    });
    assert!(pod(c, "rc-waits").is_some_and(|p| p["status"]["phase"] == "Pending"));
    delete_pod(c, "rc-a");
    let waited = wait_running(c, "rc-waits");
    let w = container_id(&waited);
    assert_eq!(waited["status"]["containerStatuses"][0]["restartCount"], 0);
    wait_ledger(c, "rc-waits holds 6 GiB", vec![(w, 6)]);
    assert_eq!(
        queued_ids(c.tb()),
        Vec::<String>::new(),
        "a ticket is left in the queue"
    );
    delete_pod(c, "rc-waits");
    wait_ledger(c, "every reservation is released", vec![]);
}

/// Every manifest in k8s/ through the real API server (its validation, admission and the
/// ValidatingAdmissionPolicies' own type checks), server-side, without a warning: the objects
/// that start nothing here are applied for real (the DaemonSets select nodes labelled
/// vramgate.dev/ready, which this one is not) and removed after; the Pods are dry runs.
fn every_manifest_applies_server_side(c: &Cluster) {
    let k8s = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s");
    let mut files: Vec<_> = std::fs::read_dir(&k8s).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let starts_pods = text.lines().any(|l| l.trim() == "kind: Pod");
        let mut args = vec!["apply", "--server-side", "--field-manager=vramgate-tests"];
        if starts_pods {
            args.push("--dry-run=server");
        }
        let out = c.kubectl(&args).arg("-f").arg(file).output().unwrap();
        assert!(out.status.success(), "{}: {}", file.display(), stderr(&out));
        assert!(
            !stderr(&out).contains("Warning"),
            "{} applies with a warning: {}",
            file.display(),
            stderr(&out)
        );
        eprintln!("{}: {}", file.display(), stdout(&out).replace('\n', "; "));
    }
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        if file.ends_with("runtimeclass.yaml") || text.lines().any(|l| l.trim() == "kind: Pod") {
            continue;
        }
        c.kubectl_ok(&[
            "delete",
            "--wait=true",
            "--timeout=60s",
            "-f",
            &file.display().to_string(),
        ]);
    }
}

fn main() {
    let mut args = Arguments::from_args();
    // One at a time: see the file's comment.
    args.test_threads = Some(1);
    if args.list {
        let trials = SCENARIOS
            .iter()
            .map(|(name, _)| Trial::test(*name, || Ok(())))
            .collect();
        libtest_mimic::run(&args, trials).exit();
    }
    let whole = Instant::now();
    let cluster = std::sync::Arc::new(Cluster::start(&node_config()));
    let trials = SCENARIOS
        .iter()
        .map(|(name, scenario)| {
            let (cluster, scenario) = (cluster.clone(), *scenario);
            Trial::test(*name, move || {
                let start = Instant::now();
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&cluster)));
                eprintln!("{name}: {:?}", start.elapsed());
                if result.is_err() {
                    // What a failed scenario left (its pods) must not fail the next one.
                    cluster.delete_all_pods();
                }
                result.map_err(|e| Failed::from(panic_message(&e)))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    let cluster = std::sync::Arc::try_unwrap(cluster).unwrap_or_else(|_| panic!("a trial still holds the cluster"));
    let started_in = cluster.started_in;
    let left = cluster.teardown();
    eprintln!(
        "cluster start {started_in:?}; whole binary {:?} (start, scenarios and teardown)",
        whole.elapsed()
    );
    if !left.is_empty() {
        eprintln!("the cluster left on the host:\n  {}", left.join("\n  "));
        std::process::exit(101);
    }
    conclusion.exit();
}

fn panic_message(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// The harness's sanity check: kubectl, the API server and the node's kubelet all report the
/// version tools/kube pins, and the node is Ready (kubelet runs on containerd 2.1, its network
/// is configured).
fn node_is_ready_and_runs_kubernetes_1_36_3(c: &Cluster) {
    let version: Value = serde_json::from_str(&c.kubectl_ok(&["version", "-o", "json"])).unwrap();
    assert_eq!(version["serverVersion"]["gitVersion"], KUBERNETES_VERSION, "{version}");
    assert_eq!(version["clientVersion"]["gitVersion"], KUBERNETES_VERSION, "{version}");
    let node = c.get_json(&["node", &c.node]).expect("the node is registered");
    let info = &node["status"]["nodeInfo"];
    assert_eq!(info["kubeletVersion"], KUBERNETES_VERSION, "{info}");
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("containerd://2.1")),
        "{info}"
    );
    let ready = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|cond| cond["type"] == "Ready" && cond["status"] == "True");
    assert!(ready, "{}", node["status"]["conditions"]);
    // The RuntimeClass the pods name, applied from k8s/runtimeclass.yaml.
    let class = c
        .get_json(&["runtimeclass", "vramgate"])
        .expect("RuntimeClass vramgate");
    assert_eq!(class["handler"], "vramgate");
    // A pod on the pod network (the CNI bridge), with containerd's default runtime: the node
    // runs pods that are not vramgate's as before.
    c.apply(&pod_yaml(
        "plain",
        &PodSpec {
            network: true,
            ..PodSpec::default()
        },
    ));
    let pod = wait_running(c, "plain");
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_string();
    assert!(
        ip.starts_with("10.244.45."),
        "the pod's address {ip:?} is not the bridge's: {}",
        pod["status"]
    );
    delete_pod(c, "plain");
}

/// The DRA driver against the real API server and kube-scheduler: k8s/dra.yaml (DeviceClass,
/// RBAC, admission policies) applied server-side; the built `vramgate-dra` as a process on the
/// host (not yet as a pod of the node image) with its ServiceAccount's token bound to this
/// node, as the DaemonSet's projected token is, so that the shipped admission policies judge
/// its writes; it publishes the node's slice (one device, the GPU's 8 GiB); a pod whose claim
/// comes from a ResourceClaimTemplate asking 6 GiB has its claim allocated by kube-scheduler
/// on that device, consuming 6Gi; kubelet registers the driver (its plugin watcher sends the
/// socket's path as HTTP/2 `:authority`, which the registration socket's front turns into
/// `localhost`: src/kubelet/authority.rs) and has it prepare the claim; the pod runs, its
/// container sees the claim's CDI edits (its 6Gi and its GPU), the ledger holds 6Gi for it;
/// deleting the pod deletes the claim and nothing is reserved.
fn dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims(c: &Cluster) {
    let k8s = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s");
    c.apply_file(&k8s.join("dra.yaml"));
    let token = c.kubectl_ok(&[
        "create",
        "token",
        "vramgate-dra",
        "-n",
        "kube-system",
        "--bound-object-kind",
        "Node",
        "--bound-object-name",
        &c.node,
        "--duration",
        "1h",
    ]);
    let kubeconfig = c.write_kubeconfig("vramgate-dra", &token);
    let cdi_dir = c.tb().dir.join("containerd/cdi");
    let driver = dra_support::Driver::start_as(&c.dir, &c.tb().config_path, &kubeconfig, &c.node, &cdi_dir, &[]);
    let slice = c.wait("the driver's slice is published", POD_LIMIT, "kube-apiserver", || {
        let slices = c
            .get_json(&["resourceslices"])
            .map(|s| s["items"].clone())
            .unwrap_or_default();
        let ours = slices
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["spec"]["driver"] == dra_support::DRIVER && s["spec"]["nodeName"] == c.node.as_str())
            .cloned();
        (ours.is_some(), ours.unwrap_or_else(|| Value::String(driver.log_text())))
    });
    let devices = slice["spec"]["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "{slice}");
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "8Gi", "{slice}");
    let template = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu-6gi", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-memory.vramgate.dev", "count": 1,
            "capacity": {"requests": {"memory": "6Gi"}}}}]}}}}"#;
    c.apply(template);
    let mut pod: Value = serde_json::from_str(&pod_yaml(
        "dra-a",
        &PodSpec {
            vramgate: true,
            ..PodSpec::default()
        },
    ))
    .unwrap();
    pod["spec"]["resourceClaims"] = serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-6gi"}]);
    pod["spec"]["containers"][0]["resources"] = serde_json::json!({"claims": [{"name": "gpu"}]});
    c.apply(&pod.to_string());
    let claim = c.wait(
        "kube-scheduler allocates the pod's claim",
        POD_LIMIT,
        "kube-scheduler",
        || {
            let items = c
                .get_json(&["resourceclaims"])
                .map(|l| l["items"].clone())
                .unwrap_or_default();
            let claim = items.as_array().and_then(|a| a.first()).cloned().unwrap_or_default();
            (claim["status"]["allocation"].is_object(), claim)
        },
    );
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["driver"], dra_support::DRIVER, "{claim}");
    assert_eq!(result["pool"], c.node.as_str(), "{claim}");
    assert_eq!(result["device"], devices[0]["name"], "{claim}");
    assert_eq!(result["consumedCapacity"]["memory"], "6Gi", "{claim}");
    assert_eq!(claim["status"]["reservedFor"][0]["name"], "dra-a", "{claim}");
    // kubelet registered the driver and had it prepare the claim: else the pod waits with
    // "DRA driver gpu-memory.vramgate.dev is not registered".
    let running = c.wait("the DRA pod runs", POD_LIMIT, "kubelet", || {
        let p = self::pod(c, "dra-a");
        let running = p.as_ref().is_some_and(|p| {
            p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        });
        (running, p.unwrap_or_else(|| Value::String(driver.log_text())))
    });
    let env = c.kubectl_ok(&["exec", "dra-a", "--", "env"]);
    let gpu = devices[0]["attributes"]["uuid"]["string"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        env.lines().any(|l| l == format!("VRAMGATE_MEMORY={}", 6 * GIB)),
        "{env}"
    );
    assert!(
        !gpu.is_empty() && env.lines().any(|l| l == format!("VRAMGATE_GPUS={gpu}")),
        "{gpu:?} {env}\n{slice}"
    );
    wait_ledger(c, "the claim's 6Gi is reserved", vec![(container_id(&running), 6)]);
    delete_pod(c, "dra-a");
    c.wait(
        "the pod's claim is deleted",
        POD_LIMIT,
        "kube-controller-manager",
        || {
            let items = c
                .get_json(&["resourceclaims"])
                .map(|l| l["items"].clone())
                .unwrap_or_default();
            (items.as_array().is_some_and(Vec::is_empty), items)
        },
    );
    assert_eq!(ledger(c), []);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-6gi"]);
    drop(driver);
}
