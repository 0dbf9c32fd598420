//! vramgate on a real one-node Kubernetes 1.36.3 (tests/support/cluster.rs): etcd, kube-apiserver,
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

use support::cluster as kube_support;
use support::cri as cri_support;
use support::dra as dra_support;
mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use kube_support::*;
use support::*;

/// The node's one simulated GPU: 8 GiB, nothing used outside vramgate.
const GPU: &str = SIMULATED_GPU;
const GPU_GIB: u64 = SIMULATED_GPU_GIB;

fn node_config() -> String {
    // The test node's default inventory: one simulated GPU (`testnode up` without
    // --config-extra), so that a developer's node serves these tests as it is.
    default_config_extra()
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
        "dra_slice_policy_holds_a_pods_token_to_its_node_driver_and_pool",
        dra_slice_policy_holds_a_pods_token_to_its_node_driver_and_pool,
    ),
    (
        "dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims",
        dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims,
    ),
    (
        "dra_claim_shared_by_two_containers_of_a_pod_runs_in_both",
        dra_claim_shared_by_two_containers_of_a_pod_runs_in_both,
    ),
    (
        "dra_driver_and_kubelet_restarted_mid_way_lose_nothing",
        dra_driver_and_kubelet_restarted_mid_way_lose_nothing,
    ),
    (
        "dra_slice_follows_memory_used_outside_kubernetes_and_a_claim_spans_two_gpus",
        dra_slice_follows_memory_used_outside_kubernetes_and_a_claim_spans_two_gpus,
    ),
    (
        "a_claims_pod_cannot_lower_its_claim_by_env_or_annotation",
        a_claims_pod_cannot_lower_its_claim_by_env_or_annotation,
    ),
    (
        "runtime_class_pod_waiting_past_kubelets_deadline",
        runtime_class_pod_waiting_past_kubelets_deadline,
    ),
    (
        "dra_claim_is_held_from_allocation_and_a_pod_the_node_cannot_hold_goes_back_to_the_scheduler",
        dra_claim_is_held_from_allocation_and_a_pod_the_node_cannot_hold_goes_back_to_the_scheduler,
    ),
    (
        "dra_pod_the_first_node_cannot_hold_is_placed_on_a_second_node",
        dra_pod_the_first_node_cannot_hold_is_placed_on_a_second_node,
    ),
];

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

/// The node's allocatable units of the device plugin's resource.
fn allocatable(c: &Cluster) -> Option<String> {
    c.get_json(&["node", &c.node])
        .and_then(|n| n["status"]["allocatable"][RESOURCE].as_str().map(str::to_string))
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
    let refusal = wait_event(
        c,
        "kubelet's events show vramgate's refusal",
        "rc-refused",
        POD_LIMIT,
        |m| m.contains("vramgate: refused container"),
    );
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
    // Re-run as the test node's tool (support::cluster::start_node).
    testnode::cli::run_if_requested();
    let args = scenario_args(SCENARIOS);
    let whole = Instant::now();
    let (cluster, conclusion) = run_scenarios(&args, SCENARIOS, Cluster::start(&node_config()), |cluster| {
        eprintln!("the cluster after the failure:\n{}", cluster.state());
        cluster.delete_all_pods()
    });
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

/// Issue 53: the shipped slice policy (k8s/dra.yaml's vramgate-dra-slices) on the real
/// kube-apiserver, for the token kubelet would project into the driver's pod: a token of the
/// driver's ServiceAccount bound to a running pod of that account on this node, which the API
/// server turns into the user extra authentication.kubernetes.io/node-name (checked with a
/// SelfSubjectReview). With it: a slice on its node, of its driver, in its node's pool is
/// created, replaced and deleted; one whose pool names another node (which at a higher
/// generation would make the scheduler take that node's own slice for stale), one of another
/// driver and one of another node are each refused with the policy's message; its own slice
/// cannot be moved to another pool or driver (the API server's immutable fields, before the
/// policy); the admin's slices of another node, of another node's pool on this node and of
/// another driver on this node can be neither replaced nor deleted, and stay as they were. The scheduler never sees these slices: no claim is made meanwhile, and
/// kubelet's deletion of a departed driver's slices does not come in (run before any scenario
/// that starts the driver).
fn dra_slice_policy_holds_a_pods_token_to_its_node_driver_and_pool(c: &Cluster) {
    let k8s = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s");
    c.apply_file(&k8s.join("dra.yaml"));
    let node = c.node.as_str();
    let driver = dra_support::DRIVER;
    let other_node = "vramgate-other-node";
    let other_driver = "other.example.com";

    // A pod of the driver's account on the node, mounting no token itself: the token below is
    // bound to it, as kubelet's projected token is to the DaemonSet's pod.
    let holder = "vramgate-slice-policy";
    c.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": holder, "namespace": "kube-system"},
            "spec": {"serviceAccountName": "vramgate-dra", "automountServiceAccountToken": false,
                "restartPolicy": "Never", "hostNetwork": true, "terminationGracePeriodSeconds": 5,
                "containers": [{"name": "main", "image": cri_support::APP_IMAGE, "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", RUN_UNTIL_STOPPED]}]}})
        .to_string(),
    );
    let running = c.wait(&format!("pod {holder} runs"), POD_LIMIT, "kubelet", || {
        let p = c.get_json(&["pod", "-n", "kube-system", holder]);
        (p.as_ref().is_some_and(|p| p["status"]["phase"] == "Running"), p)
    });
    let uid = running
        .as_ref()
        .and_then(|p| p["metadata"]["uid"].as_str())
        .unwrap_or_default();
    let token = dra_token(
        c,
        &[
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            holder,
            "--bound-object-uid",
            uid,
        ],
    );
    let token = token.trim();
    let as_driver = |args: &[&str], input: &str| c.kubectl_in(&[&["--token", token][..], args].concat(), input);
    let review: Value = serde_json::from_str(&stdout(&as_driver(&["auth", "whoami", "-o", "json"], ""))).unwrap();
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"], "system:serviceaccount:kube-system:vramgate-dra",
        "{review}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([node]),
        "the pod-bound token does not carry the pod's node: {review}"
    );

    // Whatever happens below, no test slice outlives the scenario: a driver started later
    // deletes every other slice of its driver on its node first, and may not delete one of
    // another node's pool.
    let _slices = DeleteSlices(
        c,
        &[
            "policy-own",
            "policy-pool",
            "policy-driver",
            "policy-node",
            "policy-other-node",
            "policy-planted",
            "policy-foreign",
        ],
    );
    let slice = |name: &str, on: &str, of: &str, pool: &str| {
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": of, "nodeName": on,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []}})
    };
    let create = |s: &Value| as_driver(&["create", "-f", "-"], &s.to_string());
    // The slice as stored (the admin reads it), with `edit` made: what a replace sends.
    let stored = |name: &str| {
        c.get_json(&["resourceslice", name])
            .unwrap_or_else(|| panic!("no slice {name}"))
    };
    let replace = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut s = stored(name);
        edit(&mut s);
        as_driver(&["replace", "-f", "-"], &s.to_string())
    };
    let delete = |name: &str| as_driver(&["delete", "resourceslice", name, "--wait=false"], "");
    let allowed = |out: Output, what: &str| assert!(out.status.success(), "{what}: {}", stderr(&out));
    let denied = |out: Output, name: &str, message: &str| {
        let said = stderr(&out);
        let reason = format!(
            "resourceslices.resource.k8s.io \"{name}\" is forbidden: ValidatingAdmissionPolicy \
             'vramgate-dra-slices' with binding 'vramgate-dra-slices' denied request: {message}"
        );
        assert!(
            !out.status.success()
                && said.starts_with("Error from server (Forbidden): ")
                && said.trim_end().ends_with(&reason),
            "{name}: {said:?} (stdout {:?}) should end with {reason:?}",
            stdout(&out)
        );
    };
    let not_its_node = format!(
        "vramgate-dra on node '{node}' may write only its own node's ResourceSlices, not one of node '{other_node}'"
    );
    let not_its_driver = format!(
        "vramgate-dra may write only ResourceSlices whose spec.driver is {driver}, not one of driver '{other_driver}'"
    );
    let not_its_pool = format!(
        "vramgate-dra on node '{node}' may write only ResourceSlices whose spec.pool.name is its node's name \
         '{node}', not one of pool '{other_node}'"
    );
    let next_generation = |s: &mut Value| s["spec"]["pool"]["generation"] = 2.into();

    // Its own node, driver and pool: created and replaced.
    allowed(create(&slice("policy-own", node, driver, node)), "its own slice");
    allowed(
        replace("policy-own", &next_generation),
        "its own slice's next generation",
    );
    // On its node, but another node's pool, or another driver; another node's slice.
    let mut higher = slice("policy-pool", node, driver, other_node);
    higher["spec"]["pool"]["generation"] = 9.into();
    denied(create(&higher), "policy-pool", &not_its_pool);
    denied(
        create(&slice("policy-driver", node, other_driver, node)),
        "policy-driver",
        &not_its_driver,
    );
    denied(
        create(&slice("policy-node", other_node, driver, other_node)),
        "policy-node",
        &not_its_node,
    );
    // Its own slice moved to another node's pool or driver: the API server's own validation
    // refuses both before admission (spec.pool.name and spec.driver are immutable in 1.36, as
    // spec.nodeName is); the policy checks the slice before and after all the same.
    for (field, value) in [("pool.name", other_node), ("driver", other_driver)] {
        let moved = replace("policy-own", &|s: &mut Value| {
            if field == "driver" {
                s["spec"]["driver"] = value.into();
            } else {
                s["spec"]["pool"]["name"] = value.into();
            }
        });
        let said = stderr(&moved);
        let want = format!(
            "The ResourceSlice \"policy-own\" is invalid: spec.{field}: Invalid value: \"{value}\": field is immutable"
        );
        assert!(
            !moved.status.success() && said.trim_end() == want,
            "{said:?} should be {want:?}"
        );
    }

    // The admin's slices: another node's; one on this node in another node's pool (what a
    // token could plant before the pool was pinned); one of another driver on this node.
    for s in [
        slice("policy-other-node", other_node, driver, other_node),
        slice("policy-planted", node, driver, other_node),
        slice("policy-foreign", node, other_driver, node),
    ] {
        c.apply(&s.to_string());
    }
    let versions: Vec<Value> = ["policy-other-node", "policy-planted", "policy-foreign"]
        .iter()
        .map(|n| stored(n)["metadata"]["resourceVersion"].clone())
        .collect();
    denied(
        replace("policy-other-node", &next_generation),
        "policy-other-node",
        &not_its_node,
    );
    denied(delete("policy-other-node"), "policy-other-node", &not_its_node);
    denied(
        replace("policy-planted", &next_generation),
        "policy-planted",
        &not_its_pool,
    );
    denied(delete("policy-planted"), "policy-planted", &not_its_pool);
    denied(
        replace("policy-foreign", &next_generation),
        "policy-foreign",
        &not_its_driver,
    );
    denied(delete("policy-foreign"), "policy-foreign", &not_its_driver);
    for (name, version) in ["policy-other-node", "policy-planted", "policy-foreign"]
        .iter()
        .zip(versions)
    {
        assert_eq!(
            stored(name)["metadata"]["resourceVersion"],
            version,
            "{name} was written"
        );
    }

    // Its own slice: deleted (the admin's go with `_slices`).
    allowed(delete("policy-own"), "deleting its own slice");
    c.kubectl_ok(&[
        "delete",
        "pod",
        "-n",
        "kube-system",
        holder,
        "--wait=true",
        "--timeout=90s",
    ]);
}

/// Deletes the named ResourceSlices, as the admin, when dropped.
struct DeleteSlices<'a>(&'a Cluster, &'a [&'a str]);

impl Drop for DeleteSlices<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .kubectl(&[&["delete", "resourceslice", "--ignore-not-found"][..], self.1].concat())
            .output();
    }
}

/// The built `vramgate-dra` as a process on the host (not yet as a pod of the node image),
/// after k8s/dra.yaml (DeviceClass, RBAC, admission policies) is applied server-side, with its
/// ServiceAccount's token bound to this node, as the DaemonSet's projected token is, so that
/// the shipped admission policies and the API server's associated-node check judge its writes.
fn start_driver(c: &Cluster) -> dra_support::Driver {
    start_dra_driver(c, &[])
}

/// The driver's slice for this node, if published.
fn our_slice(c: &Cluster) -> Option<Value> {
    let slices = c
        .get_json(&["resourceslices"])
        .map(|s| s["items"].clone())
        .unwrap_or_default();
    slices
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["spec"]["driver"] == dra_support::DRIVER && s["spec"]["nodeName"] == c.node.as_str())
        .cloned()
}

/// Waits until the slice offers `capacities` (each device's memory, in the slice's order)
/// and `accept` takes it; returns it.
fn wait_slice(
    c: &Cluster,
    driver: &dra_support::Driver,
    what: &str,
    capacities: &[&str],
    accept: impl Fn(&Value) -> bool,
) -> Value {
    c.wait(what, POD_LIMIT, "vramgate-dra", || {
        let slice = our_slice(c);
        let offered: Vec<String> = slice
            .as_ref()
            .and_then(|s| s["spec"]["devices"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|d| {
                d["capacity"]["memory"]["value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let ok = offered == capacities && slice.as_ref().is_some_and(&accept);
        (ok, (offered, slice, tail_text(&driver.log_text(), 5)))
    })
    .1
    .unwrap_or_default()
}

/// A ResourceClaimTemplate `name` asking `count` devices of vramgate's class with `memory` each.
fn claim_template(c: &Cluster, name: &str, count: u64, memory: &str) {
    c.apply(
        &serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu-memory.vramgate.dev", "count": count,
                "capacity": {"requests": {"memory": memory}}}}]}}}})
        .to_string(),
    );
}

/// A pod of the vramgate RuntimeClass whose containers `containers` all use one claim made
/// from `template`.
fn dra_pod(c: &Cluster, name: &str, template: &str, containers: &[&str]) {
    c.apply(&dra_pod_json(name, template, containers).to_string());
}

/// The pod [`dra_pod`] applies.
fn dra_pod_json(name: &str, template: &str, containers: &[&str]) -> Value {
    let mut pod: Value = serde_json::from_str(&pod_yaml(
        name,
        &PodSpec {
            vramgate: true,
            ..PodSpec::default()
        },
    ))
    .unwrap();
    let first = pod["spec"]["containers"][0].clone();
    pod["spec"]["containers"] = containers
        .iter()
        .map(|n| {
            let mut one = first.clone();
            one["name"] = (*n).into();
            one["resources"] = serde_json::json!({"claims": [{"name": "gpu"}]});
            one
        })
        .collect();
    pod["spec"]["resourceClaims"] = serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
    pod
}

/// Prints how long a step took when it took more than 5 s (where a scenario's time goes).
struct Took(String, Instant);

impl Drop for Took {
    fn drop(&mut self) {
        if self.1.elapsed() > Duration::from_secs(5) {
            eprintln!("  {}: {:?}", self.0, self.1.elapsed());
        }
    }
}

/// The claims in the default namespace.
fn claims(c: &Cluster) -> Vec<Value> {
    c.get_json(&["resourceclaims"])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Pod `name`'s claim (made from its template), once kube-scheduler allocated it.
fn wait_allocated(c: &Cluster, name: &str) -> Value {
    let _took = Took(format!("pod {name}'s claim is allocated"), Instant::now());
    c.wait(
        &format!("kube-scheduler allocates pod {name}'s claim"),
        POD_LIMIT,
        "kube-scheduler",
        || {
            let claim = claims(c)
                .into_iter()
                .find(|cl| {
                    cl["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
                        && cl["metadata"]["ownerReferences"][0]["name"] == name
                })
                .unwrap_or_default();
            (claim["status"]["allocation"].is_object(), claim)
        },
    )
}

/// Waits until pod `name` runs with every container running; returns it.
fn wait_dra_running(c: &Cluster, driver: &dra_support::Driver, name: &str) -> Value {
    wait_dra_running_within(c, driver, name, POD_LIMIT)
}

/// How long a pod whose claim kubelet failed to prepare (its driver was down) may take to run
/// once the driver is back: kubelet retries the pod only after its back-off, which doubles
/// from 10 s to a 5-minute cap (85 s was seen on this machine).
const AFTER_KUBELETS_BACKOFF: Duration = Duration::from_secs(330);

fn wait_dra_running_within(c: &Cluster, driver: &dra_support::Driver, name: &str, limit: Duration) -> Value {
    let _took = Took(format!("pod {name} runs"), Instant::now());
    c.wait(&format!("DRA pod {name} runs"), limit, "kubelet", || {
        let p = pod(c, name);
        let running = p.as_ref().is_some_and(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.iter().all(|s| s["state"]["running"].is_object()))
        });
        (running, (p, tail_text(&driver.log_text(), 5)))
    })
    .0
    .unwrap_or_default()
}

/// The containerd id of container `container` of `pod`.
fn container_id_of(pod: &Value, container: &str) -> String {
    let status = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == container)
        .cloned()
        .unwrap_or_default();
    let mut one = pod.clone();
    one["status"]["containerStatuses"] = serde_json::json!([status]);
    container_id(&one)
}

/// Deletes pod `name` and waits until its claim is gone (kube-controller-manager deletes a
/// claim made from a template with its pod).
fn delete_dra_pod(c: &Cluster, name: &str) {
    let _took = Took(format!("pod {name} and its claim are deleted"), Instant::now());
    delete_pod(c, name);
    c.wait(
        &format!("pod {name}'s claim is deleted"),
        POD_LIMIT,
        "kube-controller-manager",
        || {
            let left: Vec<Value> = claims(c)
                .into_iter()
                .filter(|cl| cl["metadata"]["ownerReferences"][0]["name"] == name)
                .collect();
            (left.is_empty(), left)
        },
    );
}

/// The claim's `status.devices` once the driver wrote it after preparing.
fn wait_claim_status(c: &Cluster, driver: &dra_support::Driver, claim: &str) -> Value {
    c.wait(
        &format!("the driver writes claim {claim}'s status"),
        POD_LIMIT,
        "vramgate-dra",
        || {
            let got = c.get_json(&["resourceclaim", claim]).unwrap_or_default();
            let devices = got["status"]["devices"].clone();
            // The entry carries its binding condition from allocation on; prepare adds `data`.
            (
                devices
                    .as_array()
                    .is_some_and(|d| d.iter().any(|e| e["data"].is_object())),
                (devices, tail_text(&driver.log_text(), 8)),
            )
        },
    )
    .0
}

/// The DRA driver against the real API server and kube-scheduler ([`start_driver`]): it
/// publishes the node's slice (one device, the GPU's 8 GiB); a pod whose claim comes from a
/// ResourceClaimTemplate asking 6 GiB has its claim allocated by kube-scheduler on that
/// device, consuming 6Gi; kubelet registers the driver (its plugin watcher sends the socket's
/// path as HTTP/2 `:authority`, which the registration socket's front turns into `localhost`:
/// src/kubelet/authority.rs) and has it prepare the claim; the pod runs, its container sees
/// the claim's CDI edits (its 6Gi and its GPU), the ledger holds 6Gi for it; the claim's
/// status carries the driver's entry for the device with its `data` (kind, request, limit,
/// tier), written through the API server's associated-node check and the shipped admission
/// policy; a second such pod stays Pending with kube-scheduler's message, its claim
/// unallocated and nothing more in the ledger, and runs once the first is deleted, whose
/// reservation is then released; deleting it deletes its claim and nothing is reserved.
fn dra_driver_publishes_through_the_real_api_server_and_kube_scheduler_allocates_its_claims(c: &Cluster) {
    let driver = start_driver(c);
    let slice = wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |_| {
        true
    });
    let devices = slice["spec"]["devices"].as_array().expect("devices");
    claim_template(c, "gpu-6gi", 1, "6Gi");
    dra_pod(c, "dra-a", "gpu-6gi", &["main"]);
    let claim = wait_allocated(c, "dra-a");
    let result = &claim["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["driver"], dra_support::DRIVER, "{claim}");
    assert_eq!(result["pool"], c.node.as_str(), "{claim}");
    assert_eq!(result["device"], devices[0]["name"], "{claim}");
    assert_eq!(result["consumedCapacity"]["memory"], "6Gi", "{claim}");
    assert_eq!(claim["status"]["reservedFor"][0]["name"], "dra-a", "{claim}");
    // kubelet registered the driver and had it prepare the claim: else the pod waits with
    // "DRA driver gpu-memory.vramgate.dev is not registered".
    let running = wait_dra_running(c, &driver, "dra-a");
    let env = c.kubectl_ok(&["exec", "dra-a", "--", "env"]);
    let gpu = devices[0]["attributes"]["uuid"]["string"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(gpu, GPU, "{slice}");
    assert!(
        env.lines().any(|l| l == format!("VRAMGATE_MEMORY={}", 6 * GIB)),
        "{env}"
    );
    assert!(env.lines().any(|l| l == format!("VRAMGATE_GPUS={gpu}")), "{env}");
    let a = container_id(&running);
    wait_ledger(c, "the claim's 6Gi is reserved", vec![(a.clone(), 6)]);

    // The status the driver writes after preparing: its own entry for the allocated device.
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_string();
    let status = wait_claim_status(c, &driver, &claim_name);
    let entry = &status[0];
    assert_eq!(status.as_array().map(Vec::len), Some(1), "{status}");
    assert_eq!(entry["driver"], dra_support::DRIVER, "{status}");
    assert_eq!(entry["pool"], c.node.as_str(), "{status}");
    assert_eq!(entry["device"], devices[0]["name"], "{status}");
    let data = &entry["data"];
    assert_eq!(data["apiVersion"], "vramgate.dev/v1", "{status}");
    assert_eq!(data["kind"], "GpuMemoryStatus", "{status}");
    assert_eq!(data["request"], 6 * GIB, "{status}");
    assert_eq!(data["limit"], 6 * GIB, "{status}");
    assert!(data["tier"].as_str().is_some_and(|t| !t.is_empty()), "{status}");

    // A second 6Gi claim does not fit beside the first: kube-scheduler leaves the pod Pending
    // and its claim unallocated; the ledger holds only the first.
    dra_pod(c, "dra-b", "gpu-6gi", &["main"]);
    let why = wait_unschedulable(c, "dra-b");
    assert!(why.contains("cannot allocate all claims"), "{why}");
    let b_claim = claims(c)
        .into_iter()
        .find(|cl| cl["metadata"]["ownerReferences"][0]["name"] == "dra-b")
        .expect("dra-b's claim");
    assert!(b_claim["status"]["allocation"].is_null(), "{b_claim}");
    assert_eq!(ledger(c), [(a.clone(), 6)]);
    delete_dra_pod(c, "dra-a");
    let b = container_id(&wait_dra_running(c, &driver, "dra-b"));
    wait_ledger(c, "dra-a's claim is released and dra-b's 6Gi is reserved", vec![(b, 6)]);
    delete_dra_pod(c, "dra-b");
    wait_ledger(c, "nothing is reserved", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-6gi"]);
    drop(driver);
}

/// A claim shared by two containers of one pod (both name the pod's claim): kube-scheduler
/// allocates it once; both containers run and see the claim's CDI edits (its 3Gi and its GPU).
/// This node does not stop a claim's holders together (`[enforce] over_use` is not `kill`), so
/// as docs/src/dra.md says each container is counted whole (the claim's 3Gi twice): each
/// container's own limit is the claim's, and K containers could use K times one hold.
fn dra_claim_shared_by_two_containers_of_a_pod_runs_in_both(c: &Cluster) {
    let driver = start_driver(c);
    wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |_| {
        true
    });
    claim_template(c, "gpu-3gi", 1, "3Gi");
    dra_pod(c, "dra-shared", "gpu-3gi", &["main", "side"]);
    let claim = wait_allocated(c, "dra-shared");
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "{claim}");
    assert_eq!(results[0]["consumedCapacity"]["memory"], "3Gi", "{claim}");
    let running = wait_dra_running(c, &driver, "dra-shared");
    let mut want = Vec::new();
    for container in ["main", "side"] {
        let env = c.kubectl_ok(&["exec", "dra-shared", "-c", container, "--", "env"]);
        assert!(
            env.lines().any(|l| l == format!("VRAMGATE_MEMORY={}", 3 * GIB)),
            "{container}: {env}"
        );
        assert!(
            env.lines().any(|l| l == format!("VRAMGATE_GPUS={GPU}")),
            "{container}: {env}"
        );
        want.push((container_id_of(&running, container), 3));
    }
    wait_ledger(c, "each container holds the claim's 3Gi", want);
    delete_dra_pod(c, "dra-shared");
    wait_ledger(c, "nothing is reserved", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-3gi"]);
    drop(driver);
}

/// The driver stopped between the claim's allocation and the pod's start (kubelet reports it
/// is not registered), started again: the pod runs; the driver restarted while the pod runs:
/// (The first driver publishes no binding conditions, `--binding-conditions=false`: with them
/// kube-scheduler would not bind the pod while no driver answers, and kubelet would never see
/// it; that path is `dra_claim_is_held_from_allocation_and_...`.)
/// it republishes, the pod keeps its container and the ledger holds the claim once; kubelet
/// restarted while the pod runs (it deletes the node's slices at start): the driver registers
/// and publishes again, nothing is restarted or counted twice; deleting the pod releases it.
fn dra_driver_and_kubelet_restarted_mid_way_lose_nothing(c: &Cluster) {
    let mut driver = start_dra_driver(c, &["--binding-conditions=false"]);
    wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |s| {
        s["spec"]["devices"][0]["bindingConditions"].is_null()
    });
    claim_template(c, "gpu-5gi", 1, "5Gi");
    driver.stop();
    dra_pod(c, "dra-r", "gpu-5gi", &["main"]);
    // kube-scheduler allocates from the slice still there; kubelet cannot prepare the claim.
    let claim = wait_allocated(c, "dra-r");
    let claim_name = claim["metadata"]["name"].as_str().unwrap().to_string();
    wait_event(
        c,
        "kubelet reports the driver is not registered",
        "dra-r",
        // Reported at a retry of the pod, after kubelet's back-off (61 to 79 s seen here).
        AFTER_KUBELETS_BACKOFF,
        |m| m.contains("not registered"),
    );
    assert_eq!(ledger(c), [], "a reservation before the claim was prepared");
    let driver = start_driver(c);
    let running = wait_dra_running_within(c, &driver, "dra-r", AFTER_KUBELETS_BACKOFF);
    let r = container_id(&running);
    wait_ledger(c, "the claim's 5Gi is reserved", vec![(r.clone(), 5)]);
    wait_claim_status(c, &driver, &claim_name);

    let still = |c: &Cluster, why: &str| {
        let p = pod(c, "dra-r").expect("dra-r");
        assert_eq!(p["status"]["phase"], "Running", "{why}: {}", p["status"]);
        assert_eq!(container_id(&p), r, "{why} replaced dra-r's container");
        assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0, "{why}");
        assert_eq!(ledger(c), [(r.clone(), 5)], "{why}: counted again or lost");
    };
    // The driver restarted while the pod runs: a slice with a higher pool generation, still
    // offering the device's whole 8Gi (kube-scheduler subtracts what claims consumed).
    let generation = our_slice(c).unwrap()["spec"]["pool"]["generation"].as_i64().unwrap();
    drop(driver);
    let driver = start_driver(c);
    wait_slice(c, &driver, "the restarted driver publishes again", &["8Gi"], |s| {
        s["spec"]["pool"]["generation"].as_i64() > Some(generation)
    });
    still(c, "the driver's restart");

    // kubelet restarted: it deletes the node's slices at start; the driver publishes again.
    let uid = our_slice(c).unwrap()["metadata"]["uid"].clone();
    c.stop_kubelet();
    c.start_kubelet();
    c.wait_node_ready();
    wait_slice(
        c,
        &driver,
        "the slice is published again after kubelet's restart",
        &["8Gi"],
        |s| s["metadata"]["uid"] != uid,
    );
    still(c, "kubelet's restart");

    delete_dra_pod(c, "dra-r");
    wait_ledger(c, "nothing is reserved", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-5gi"]);
    drop(driver);
}

/// Writes its text back to its file when dropped.
struct RestoreFile(std::path::PathBuf, String);

impl Drop for RestoreFile {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
    }
}

/// Replaces `from` by `to` in the node's config (re-read by every hook and by the driver).
fn edit_config(c: &Cluster, from: &str, to: &str) {
    let path = &c.tb().config_path;
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {text}");
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// The node's memory used outside Kubernetes (the static inventory's `used_outside`, edited
/// in the config the driver watches) lowers what the slice offers, and gives it back; a
/// second 8 GiB GPU added to the inventory becomes a second device; a claim of count 2 gets a
/// device on each GPU, its container sees both, and the ledger holds its memory on both.
fn dra_slice_follows_memory_used_outside_kubernetes_and_a_claim_spans_two_gpus(c: &Cluster) {
    let driver = start_driver(c);
    wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |_| {
        true
    });
    let generation = our_slice(c).unwrap()["spec"]["pool"]["generation"].as_i64().unwrap();
    let _original = RestoreFile(
        c.tb().config_path.clone(),
        std::fs::read_to_string(&c.tb().config_path).unwrap(),
    );
    edit_config(c, "used_outside = \"0\"", "used_outside = \"3Gi\"");
    wait_slice(c, &driver, "3Gi used outside leaves 5Gi", &["5Gi"], |s| {
        s["spec"]["pool"]["generation"].as_i64() > Some(generation)
    });
    edit_config(c, "used_outside = \"3Gi\"", "used_outside = \"0\"");
    wait_slice(c, &driver, "the 3Gi freed is offered again", &["8Gi"], |_| true);

    const GPU1: &str = "GPU-4b000000-0000-0000-0000-000000000046";
    let second =
        format!("[[inventory.gpus]]\nindex = 1\nuuid = \"{GPU1}\"\ntotal = \"{GPU_GIB}Gi\"\nused_outside = \"0\"\n");
    let path = c.tb().config_path.clone();
    let before = std::fs::read_to_string(&path).unwrap();
    // The node's one GPU again, even when an assertion below fails.
    let _restore = RestoreFile(path.clone(), before.clone());
    let marker = format!("uuid = \"{GPU}\"\n");
    let at = before.find(&marker).expect("GPU 0 in the config");
    // After GPU 0's table (its lines end at the next blank line or table).
    let rest = &before[at..];
    let end = at + rest.find("\n[").map(|i| i + 1).unwrap_or(rest.len());
    std::fs::write(&path, format!("{}{second}{}", &before[..end], &before[end..])).unwrap();
    let slice = wait_slice(c, &driver, "a device on each GPU", &["8Gi", "8Gi"], |_| true);
    let uuids: std::collections::BTreeSet<String> = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["attributes"]["uuid"]["string"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(uuids, [GPU.to_string(), GPU1.to_string()].into(), "{slice}");
    claim_template(c, "gpu-2x3gi", 2, "3Gi");
    dra_pod(c, "dra-two", "gpu-2x3gi", &["main"]);
    let claim = wait_allocated(c, "dra-two");
    let results = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let devices: std::collections::BTreeSet<&str> = results.iter().filter_map(|r| r["device"].as_str()).collect();
    assert_eq!(devices.len(), 2, "not a device on each GPU: {claim}");
    let running = wait_dra_running(c, &driver, "dra-two");
    let env = c.kubectl_ok(&["exec", "dra-two", "--", "env"]);
    // One share per device (`VRAMGATE_GPUS`, one name for all devices, keeps the last
    // device's: docs/src/dra.md), each naming its GPU with the claim's 3Gi and limit.
    let shares: std::collections::BTreeSet<String> = env
        .lines()
        .filter(|l| l.starts_with("VRAMGATE_DRA_SHARE_"))
        .filter_map(|l| l.split_once('=').map(|(_, v)| v.to_string()))
        .collect();
    let want: std::collections::BTreeSet<String> = [GPU, GPU1]
        .iter()
        .map(|g| format!("{g},{},{}", 3 * GIB, 3 * GIB))
        .collect();
    assert_eq!(shares, want, "{env}");
    let id = container_id(&running);
    let by_gpu = c.wait("3Gi held on each GPU", POD_LIMIT, "kubelet", || {
        let mut held: Vec<(String, Vec<(String, u64)>)> = reservations_by_gpu(c.tb())
            .into_iter()
            .map(|(g, r)| (g, r.into_iter().map(|(i, b)| (i, b / GIB)).collect()))
            .collect();
        held.sort();
        let want = vec![
            (GPU.to_string(), vec![(id.clone(), 3)]),
            (GPU1.to_string(), vec![(id.clone(), 3)]),
        ];
        (held == want, held)
    });
    drop(by_gpu);
    delete_dra_pod(c, "dra-two");
    wait_ledger(c, "nothing is reserved", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-2x3gi"]);
    drop(_restore);
    wait_slice(c, &driver, "one device again", &["8Gi"], |_| true);
    drop(driver);
}

/// A RuntimeClass pod that waits in vramgate's queue longer than kubelet's
/// `runtimeRequestTimeout` (20 s on this node), as docs/src/kubernetes.md ("Waiting, and
/// kubelet's deadline") says: kubelet cancels the queued start at its deadline (the container
/// ends `StartError`), the queue guard drops the cancelled start's ticket, kubelet's retry
/// (restartPolicy Always, as a Deployment's pods) queues again, and once memory frees it runs,
/// holding its 6 GiB once, with no ticket left. Under restartPolicy Never kubelet does not
/// retry and such a pod fails: keep `vramgate.dev/timeout` under kubelet's deadline.
fn runtime_class_pod_waiting_past_kubelets_deadline(c: &Cluster) {
    let reject = PodSpec {
        vramgate: true,
        annotations: &[("vramgate.dev/memory", "6Gi"), ("vramgate.dev/policy", "reject")],
        env: &[("NVIDIA_VISIBLE_DEVICES", "0")],
        ..PodSpec::default()
    };
    c.apply(&pod_yaml("dl-a", &reject));
    let a = container_id(&wait_running(c, "dl-a"));
    let wait = PodSpec {
        annotations: &[
            ("vramgate.dev/memory", "6Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "90s"),
        ],
        ..reject
    };
    let mut waits: Value = serde_json::from_str(&pod_yaml("dl-waits", &wait)).unwrap();
    waits["spec"]["restartPolicy"] = "Always".into();
    c.apply(&waits.to_string());
    let queued = c.wait("dl-waits queues in the ledger", POD_LIMIT, "kubelet", || {
        let q = queued_ids(c.tb());
        (q.len() == 1, q)
    });
    let queued_at = Instant::now();
    // kubelet's deadline cancels the queued start.
    let limit = Duration::from_secs(RUNTIME_REQUEST_TIMEOUT_S) + POD_LIMIT;
    let cancelled = c.wait(
        "kubelet cancels the queued start at its deadline",
        limit,
        "kubelet",
        || {
            let p = pod(c, "dl-waits").unwrap_or_default();
            let s = &p["status"]["containerStatuses"][0];
            let ended = [&s["state"]["terminated"], &s["lastState"]["terminated"]]
                .into_iter()
                .find(|t| t["reason"] == "StartError")
                .cloned();
            (ended.is_some(), ended.unwrap_or_else(|| p["status"].clone()))
        },
    );
    let after = queued_at.elapsed();
    assert!(
        after + Duration::from_secs(2) >= Duration::from_secs(RUNTIME_REQUEST_TIMEOUT_S),
        "cancelled after {after:?}, before kubelet's deadline: {cancelled}"
    );
    // kubelet's deadline, as containerd saw it: the call's context cancelled by kubelet, or
    // its deadline (sent as grpc-timeout) passing first in containerd itself; which one wins
    // is a race (seen once in five whole runs), the cause is the same.
    assert!(
        cancelled["message"]
            .as_str()
            .is_some_and(|m| m.contains("context canceled") || m.contains("context deadline exceeded")),
        "{cancelled}"
    );
    // The cancelled start's ticket is gone (the queue guard): whatever is queued now is
    // kubelet's retry, a new container.
    c.wait("the cancelled start's ticket is dropped", POD_LIMIT, "kubelet", || {
        let q = queued_ids(c.tb());
        (!q.contains(&queued[0]), q)
    });
    assert_eq!(ledger(c), [(a.clone(), 6)]);
    delete_pod(c, "dl-a");
    let waited = wait_running(c, "dl-waits");
    let w = container_id(&waited);
    assert_ne!(w, queued[0], "the cancelled start ran");
    wait_ledger(c, "dl-waits holds 6 GiB once", vec![(w, 6)]);
    assert_eq!(
        queued_ids(c.tb()),
        Vec::<String>::new(),
        "a ticket is left in the queue"
    );
    delete_pod(c, "dl-waits");
    wait_ledger(c, "every reservation is released", vec![]);
}

/// A pod author against the claim, through the real kubelet and containerd's CDI: a claim's
/// container that sets its own `VRAMGATE_MEMORY` and `VRAMGATE_MEMORY_LIMIT` (1Gi) still holds
/// the claim's 6 GiB (the claim's CDI edits come after the container's env and win); a pod
/// that adds the annotation `vramgate.dev/memory: 1Gi` (which the engine copies into every
/// container's spec) beside its claim is refused at start, the reason in kubelet's events,
/// and holds nothing.
fn a_claims_pod_cannot_lower_its_claim_by_env_or_annotation(c: &Cluster) {
    let driver = start_driver(c);
    wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |_| {
        true
    });
    claim_template(c, "gpu-6gi-low", 1, "6Gi");
    let claim_pod = |name: &str, spec: &PodSpec| {
        let mut pod: Value = serde_json::from_str(&pod_yaml(name, spec)).unwrap();
        pod["spec"]["resourceClaims"] =
            serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-6gi-low"}]);
        pod["spec"]["containers"][0]["resources"] = serde_json::json!({"claims": [{"name": "gpu"}]});
        c.apply(&pod.to_string());
    };
    claim_pod(
        "low-env",
        &PodSpec {
            vramgate: true,
            env: &[("VRAMGATE_MEMORY", "1Gi"), ("VRAMGATE_MEMORY_LIMIT", "1Gi")],
            ..PodSpec::default()
        },
    );
    let running = wait_dra_running(c, &driver, "low-env");
    let env = c.kubectl_ok(&["exec", "low-env", "--", "env"]);
    wait_ledger(
        c,
        "the claim's 6Gi, not the env's 1Gi",
        vec![(container_id(&running), 6)],
    );
    assert!(
        env.lines().any(|l| l == format!("VRAMGATE_MEMORY={}", 6 * GIB)),
        "the container's own VRAMGATE_MEMORY won: {env}"
    );
    delete_dra_pod(c, "low-env");
    wait_ledger(c, "nothing is reserved", vec![]);

    claim_pod(
        "low-annotation",
        &PodSpec {
            vramgate: true,
            annotations: &[("vramgate.dev/memory", "1Gi")],
            ..PodSpec::default()
        },
    );
    let refusal = wait_event(
        c,
        "kubelet's events show vramgate's refusal",
        "low-annotation",
        POD_LIMIT,
        |m| m.contains("vramgate") && m.contains("vramgate.dev/memory"),
    );
    eprintln!("refused: {refusal}");
    let p = pod(c, "low-annotation").expect("low-annotation");
    assert_ne!(p["status"]["phase"], "Running", "{}", p["status"]);
    // Its claim's memory stays held from the allocation (issue 56), by the claim and no
    // container: until the pod goes.
    let held = ledger(c);
    assert!(
        held.len() == 1 && held[0].0.starts_with("claim-") && held[0].1 == 6,
        "the annotated pod's container holds something: {held:?}"
    );
    delete_dra_pod(c, "low-annotation");
    wait_ledger(c, "the claim's own reservation released with its pod", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-6gi-low"]);
    drop(driver);
}

/// The claims' own reservations in the ledger (`claim-<uid>`, made at allocation), by GiB.
fn claim_reservations(c: &Cluster) -> Vec<(String, u64)> {
    ledger(c)
        .into_iter()
        .filter(|(id, _)| id.starts_with("claim-"))
        .collect()
}

/// Stops the node's DRA driver (SIGSTOP: its slice keeps offering what it last published) and
/// has a runc container `id` outside Kubernetes reserve 4Gi of the GPU through the hook; returns
/// once the ledger holds it, with the stopped driver's pid (for its SIGCONT) and the container.
fn take_memory_behind_a_stopped_driver(
    c: &Cluster,
    driver: &dra_support::Driver,
    id: &str,
) -> (nix::unistd::Pid, std::process::Child) {
    let stopped = nix::unistd::Pid::from_raw(driver.child.id() as i32);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let tb = c.tb();
    let bundle = tb
        .bundle(
            id,
            &["sleep", "600"],
            &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "0")],
            &[],
            true,
        )
        .unwrap();
    let outside = tb
        .runc_run(&bundle, id)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_ledger(
        c,
        &format!("runc container {id}'s 4Gi is reserved"),
        vec![(id.into(), 4)],
    );
    (stopped, outside)
}

/// Kills and deletes runc container `id` of [`take_memory_behind_a_stopped_driver`].
fn stop_runc_container(c: &Cluster, id: &str, mut container: std::process::Child) {
    let tb = c.tb();
    tb.runc(&["kill", id, "KILL"]).output().unwrap();
    let _ = container.wait();
    let _ = tb.runc(&["delete", "--force", id]).output();
}

/// The first event message of pod `name` that contains `text`, if any.
fn pod_event_with(c: &Cluster, name: &str, text: &str) -> Option<String> {
    let selector = format!("involvedObject.name={name}");
    let events = c
        .get_json(&["events", "--field-selector", &selector])
        .unwrap_or_default();
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str())
        .find(|m| m.contains(text))
        .map(str::to_string)
}

/// One book between kube-scheduler and the node (src/dra/claim_watch.rs), through the real
/// scheduler's binding conditions (DRADeviceBindingConditions, on by default in 1.36):
/// - The driver is stopped (SIGSTOP) with the slice offering 8Gi; a runc container outside
///   Kubernetes then reserves 4Gi through the hook; a pod whose claim asks 6Gi is allocated
///   from the stale slice. Once the driver runs again, it cannot hold the claim: the claim's
///   failure condition carries vramgate's line, kube-scheduler takes the allocation back, and
///   the pod is Pending with that reason in its events, never in ContainerCreating.
/// - The runc container stops: the pod is allocated again, its claim's own reservation shows in
///   the ledger before its container starts, the driver is restarted between reservation and
///   binding, and the pod runs with the claim's 6Gi held once, by its container.
/// - A pod deleted right after its allocation leaves nothing in the ledger.
fn dra_claim_is_held_from_allocation_and_a_pod_the_node_cannot_hold_goes_back_to_the_scheduler(c: &Cluster) {
    let driver = start_driver(c);
    wait_slice(c, &driver, "the driver's slice offers the GPU's 8Gi", &["8Gi"], |_| {
        true
    });
    let slice = our_slice(c).expect("the slice");
    let device = &slice["spec"]["devices"][0];
    assert_eq!(
        device["bindingConditions"][0], "gpu-memory.vramgate.dev/reserved",
        "{slice}"
    );
    assert_eq!(
        device["bindingFailureConditions"][0], "gpu-memory.vramgate.dev/unavailable",
        "{slice}"
    );
    claim_template(c, "gpu-6gi-held", 1, "6Gi");
    let (stopped, outside) = take_memory_behind_a_stopped_driver(c, &driver, "outside-held");
    dra_pod(c, "dra-held", "gpu-6gi-held", &["main"]);
    wait_allocated(c, "dra-held");
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGCONT).unwrap();
    let line = c
        .wait(
            "the pod goes back to the scheduler with vramgate's reason",
            POD_LIMIT,
            "kube-scheduler",
            || {
                let line = pod_event_with(c, "dra-held", "MemoryUnavailable");
                (line.is_some(), (line, tail_text(&driver.log_text(), 8)))
            },
        )
        .0
        .unwrap();
    assert!(line.contains("vramgate:"), "{line}");
    let p = pod(c, "dra-held").expect("the pod");
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    assert!(p["spec"]["nodeName"].is_null(), "never bound: {p}");
    assert!(
        p["status"]["containerStatuses"].is_null(),
        "never in ContainerCreating: {p}"
    );
    assert!(claim_reservations(c).is_empty(), "{:?}", ledger(c));

    // The runc container stops: the slice grows, the claim is allocated and held at once.
    stop_runc_container(c, "outside-held", outside);
    let held = c
        .wait(
            "the claim's own reservation is in the ledger before its container starts",
            POD_LIMIT,
            "vramgate-dra",
            || {
                let held = claim_reservations(c);
                (!held.is_empty(), (held, tail_text(&driver.log_text(), 8)))
            },
        )
        .0;
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].1, 6, "{held:?}");
    let shown = status_output(&c.tb().config_path, &[]);
    assert!(shown.contains("default/dra-held/claim:"), "{shown}");
    // Restarted between reservation and binding: the new driver finds the claim answered and
    // its reservation held, and releases nothing.
    drop(driver);
    let driver = start_driver(c);
    // kubelet may have dialled the stopped driver's socket in between: its retry comes after
    // its back-off.
    let running = wait_dra_running_within(c, &driver, "dra-held", AFTER_KUBELETS_BACKOFF);
    let id = container_id(&running);
    wait_ledger(
        c,
        "the container took the claim's 6Gi over, counted once",
        vec![(id, 6)],
    );

    // A pod deleted right after its allocation leaves nothing behind.
    delete_dra_pod(c, "dra-held");
    dra_pod(c, "dra-gone", "gpu-6gi-held", &["main"]);
    wait_allocated(c, "dra-gone");
    delete_dra_pod(c, "dra-gone");
    wait_ledger(c, "nothing is reserved", vec![]);
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-6gi-held"]);
    drop(driver);
}

/// The devices' memory in the driver's slice for node `node`, in the slice's order.
fn offered_on(c: &Cluster, node: &str) -> Vec<String> {
    let slices = c.get_json(&["resourceslices"]).unwrap_or_default();
    slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == dra_support::DRIVER && s["spec"]["nodeName"] == node)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| {
            d["capacity"]["memory"]["value"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// The node a claim's allocation names (its node selector's one `metadata.name`).
fn allocated_node(claim: &Value) -> String {
    let term = &claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0];
    term["matchFields"][0]["values"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no node in the allocation: {claim}"))
        .to_string()
}

/// The case binding conditions exist for, across nodes: a pod the node kube-scheduler chose
/// cannot hold goes back to the scheduler and is placed on another node, with nobody's help.
/// A second node joins (its own kubelet, root, containerd and ledger, 8Gi like the first). The
/// first node's driver is stopped (SIGSTOP) while a runc container takes 4Gi of its GPU; a pod
/// whose claim asks 6Gi, preferring the first node, is allocated there from the stale slice.
/// Once the driver runs again, it refuses the claim with vramgate's line, the scheduler takes
/// the allocation back, and places the pod on the second node, where it runs with the 6Gi
/// held in that node's ledger. The first node's ledger never holds the claim.
fn dra_pod_the_first_node_cannot_hold_is_placed_on_a_second_node(c: &Cluster) {
    // The second kubelet runs in a mount namespace of its own, where its device-plugin
    // directory (which --root-dir does not move, and which kubelet empties at start) is not
    // the first one's.
    use std::os::unix::fs::MetadataExt;
    let first_socket = std::path::Path::new(DEVICE_PLUGINS).join("kubelet.sock");
    let socket_inode = || std::fs::metadata(&first_socket).map(|m| m.ino()).ok();
    let first_inode = socket_inode();
    assert!(first_inode.is_some(), "{} is missing", first_socket.display());
    let second = c.start_second_node();
    assert_eq!(
        socket_inode(),
        first_inode,
        "the second kubelet replaced the first one's socket"
    );
    let other = second.info.node.clone();
    let driver = start_driver(c);
    let second_driver = second.start_dra_driver(&[]);
    wait_slice(c, &driver, "the first node's slice offers 8Gi", &["8Gi"], |_| true);
    c.wait("the second node's slice offers 8Gi", POD_LIMIT, "vramgate-dra", || {
        let offered = offered_on(c, &other);
        (offered == ["8Gi"], (offered, tail_text(&second_driver.log_text(), 5)))
    });
    claim_template(c, "gpu-6gi-two-nodes", 1, "6Gi");
    let (stopped, outside) = take_memory_behind_a_stopped_driver(c, &driver, "outside-two-nodes");
    let mut pod = dra_pod_json("dra-two-nodes", "gpu-6gi-two-nodes", &["main"]);
    pod["spec"]["affinity"] = serde_json::json!({"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [c.node]}]}}]}});
    c.apply(&pod.to_string());
    let first = wait_allocated(c, "dra-two-nodes");
    assert_eq!(allocated_node(&first), c.node, "the preferred node first: {first}");
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGCONT).unwrap();

    let running = wait_dra_running(c, &second_driver, "dra-two-nodes");
    assert_eq!(running["spec"]["nodeName"], other.as_str(), "{running}");
    let refused = pod_event_with(c, "dra-two-nodes", "MemoryUnavailable")
        .unwrap_or_else(|| panic!("no refusal from the first node in the pod's events: {}", c.state()));
    assert!(refused.contains("vramgate:"), "{refused}");
    let claim = claims(c)
        .into_iter()
        .find(|cl| cl["metadata"]["ownerReferences"][0]["name"] == "dra-two-nodes")
        .expect("the pod's claim");
    assert_eq!(allocated_node(&claim), other, "{claim}");
    let id = container_id(&running);
    c.wait(
        "the second node holds the claim's 6Gi, by its container",
        POD_LIMIT,
        "second-kubelet",
        || {
            let held = second.ledger();
            (held == [(id.clone(), 6)], held)
        },
    );
    assert_eq!(
        ledger(c),
        [("outside-two-nodes".to_string(), 4)],
        "the first node never held the claim"
    );

    delete_dra_pod(c, "dra-two-nodes");
    c.wait("the second node's ledger is empty", POD_LIMIT, "vramgate-dra", || {
        let held = second.ledger();
        (held.is_empty(), held)
    });
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "gpu-6gi-two-nodes"]);
    stop_runc_container(c, "outside-two-nodes", outside);
    wait_ledger(c, "nothing is reserved on the first node", vec![]);
    drop(second_driver);
    drop(driver);
    drop(second);
    assert!(
        c.get_json(&["node", &other]).is_none(),
        "the second node is gone from the API"
    );
    assert_eq!(
        socket_inode(),
        first_inode,
        "the first kubelet's socket is its own still"
    );
}
