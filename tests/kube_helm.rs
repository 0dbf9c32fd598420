//! vramgate's chart (charts/vramgate) installed with the real Helm (scripts/fetch-helm) on a real
//! one-node Kubernetes 1.36.3 (tests/support/cluster.rs), its pods running the node image built
//! from this run's binaries (tests/support/node_image.rs), imported into the node's containerd
//! and never pulled: `helm install` in DRA mode, a claim's pod reserved and released; `helm
//! upgrade` with other values rolling the driver without losing a running claim's reservation;
//! `helm uninstall` leaving no object behind; the same in device-plugin mode.
//!
//! The node keeps vramgate's config and ledger, containerd's state, its CDI directory and
//! kubelet's root in the test's private directories (other tests run beside it on this host):
//! the chart's `hostPaths` values point the pods there, as a user on k3s or with another CDI
//! directory points them. kubelet's device plugin directory is the real
//! /var/lib/kubelet/device-plugins (kubelet fixes it), which the cluster's host lock keeps to
//! one binary. The cluster runs no kube-proxy: the driver's pod is on the node's network and
//! told the API server's address (`hostNetwork`, `apiServer`).
//!
//! A plain program (`harness = false`) on libtest-mimic, as tests/kube_node.rs: `main` starts
//! the cluster, builds and imports the image once, runs each scenario as a named trial (one at
//! a time, in order: each leaves the release as the next expects, and makes it so when run
//! alone), then tears the cluster down and fails when anything it made is left on the host.

use support::cluster as kube_support;
use support::cri as cri_support;
use support::dra as dra_support;
use support::helm as helm_support;
use support::node_image;
mod support;

use std::time::Instant;

use serde_json::{json, Value};

use helm_support::{Helm, Release};
use kube_support::*;
use support::*;

/// The node's one simulated GPU: 8 GiB, nothing used outside vramgate.
const GPU: &str = SIMULATED_GPU;

fn node_config() -> String {
    // The test node's default inventory: one simulated GPU (`testnode up` without
    // --config-extra), so that a developer's node serves these tests as it is.
    default_config_extra()
}

/// What `helm install`/`upgrade`/`uninstall` may wait for the release's pods.
const HELM_TIMEOUT: &str = "180s";
const TEMPLATE: &str = "gpu-6gi";

/// The test's state beside the cluster: Helm and the release's base values.
struct Setup {
    cluster: Cluster,
    helm: Helm,
    base: Value,
}

type Scenario = fn(&Setup);

const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "helm_install_runs_the_dra_driver_from_the_node_image_and_a_claims_pod_is_reserved_and_released",
        helm_install_runs_the_dra_driver_from_the_node_image_and_a_claims_pod_is_reserved_and_released,
    ),
    (
        "helm_upgrade_rolls_the_driver_onto_new_values_and_keeps_a_running_claims_reservation",
        helm_upgrade_rolls_the_driver_onto_new_values_and_keeps_a_running_claims_reservation,
    ),
    (
        "helm_uninstall_leaves_no_object_of_the_release",
        helm_uninstall_leaves_no_object_of_the_release,
    ),
    (
        "helm_install_in_device_plugin_mode_offers_the_resource_and_uninstall_removes_it",
        helm_install_in_device_plugin_mode_offers_the_resource_and_uninstall_removes_it,
    ),
    (
        "node_setup_sets_up_a_bare_node_from_the_chart_and_uninstall_gives_its_files_back_byte_for_byte",
        node_setup_sets_up_a_bare_node_from_the_chart_and_uninstall_gives_its_files_back_byte_for_byte,
    ),
    (
        "the_exporter_and_the_watch_run_as_the_charts_pods_and_see_the_nodes_reservations",
        the_exporter_and_the_watch_run_as_the_charts_pods_and_see_the_nodes_reservations,
    ),
    (
        "node_setup_reads_the_hosts_drop_ins_and_lives_through_a_helm_upgrade_with_a_pod_running",
        node_setup_reads_the_hosts_drop_ins_and_lives_through_a_helm_upgrade_with_a_pod_running,
    ),
];

impl Setup {
    fn c(&self) -> &Cluster {
        &self.cluster
    }

    fn release(&self, extra: Value) -> Release {
        let mut values = self.base.clone();
        helm_support::merge(&mut values, extra);
        Release::new(values)
    }

    /// `helm upgrade --install`, which must succeed (its pods ready).
    fn install(&self, release: &Release) {
        let out = self.helm.install(&self.c().admin, release, HELM_TIMEOUT);
        assert!(
            out.status.success(),
            "helm install: {}{}\n{}",
            stdout(&out),
            stderr(&out),
            self.c().state()
        );
    }

    fn uninstall(&self, release: &Release) {
        let out = self.helm.uninstall(&self.c().admin, release, HELM_TIMEOUT);
        assert!(out.status.success(), "helm uninstall: {}{}", stdout(&out), stderr(&out));
    }

    fn installed(&self, release: &Release) -> bool {
        self.helm.manifest(&self.c().admin, release).status.success()
    }
}

/// The pod of DaemonSet `name` in kube-system (app.kubernetes.io/name=`name`) that runs,
/// once there is exactly one and it is Ready.
fn daemon_pod(c: &Cluster, name: &str) -> Value {
    c.wait(&format!("{name}'s one pod is ready"), POD_LIMIT, "kubelet", || {
        let pods = c
            .get_json(&[
                "pods",
                "-n",
                "kube-system",
                "-l",
                &format!("app.kubernetes.io/name={name}"),
            ])
            .map(|l| l["items"].clone())
            .unwrap_or_default();
        let items = pods.as_array().cloned().unwrap_or_default();
        let live: Vec<&Value> = items
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        let ready = items.len() == 1
            && live.len() == 1
            && live[0]["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready, if ready { live[0].clone() } else { pods })
    })
}

/// Waits for a line containing `text` in the log of the pod `pod` (in kube-system).
fn wait_pod_log(c: &Cluster, pod: &Value, text: &str) -> String {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    c.wait(&format!("{name} logs {text:?}"), POD_LIMIT, "kubelet", || {
        let log = c
            .kubectl(&["logs", "-n", "kube-system", &name])
            .output()
            .map(|o| stdout(&o))
            .unwrap_or_default();
        (log.contains(text), log)
    })
}

/// A pod `name` whose claim asks 6 GiB, created once kubelet has registered the release's
/// driver pod (else kubelet retries it only after its back-off), running and reserved: its
/// container's id.
fn claims_pod_reserved(c: &Cluster, name: &str) -> String {
    let driver = daemon_pod(c, "vramgate-dra");
    wait_pod_log(c, &driver, "registered with kubelet as");
    apply_template(c);
    c.apply(&claim_pod(name));
    let id = container_id(&wait_running(c, name));
    wait_ledger(c, "the claim's 6Gi is reserved", vec![(id.clone(), 6)]);
    id
}

/// The driver's ResourceSlice for this node, once there is one.
fn slice(c: &Cluster, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    c.wait(what, POD_LIMIT, "kube-apiserver", || {
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
        (ours.as_ref().is_some_and(&want), ours.unwrap_or(slices))
    })
}

fn slices_of_driver(c: &Cluster) -> Vec<Value> {
    c.get_json(&["resourceslices"])
        .and_then(|s| s["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s["spec"]["driver"] == dra_support::DRIVER)
        .collect()
}

fn test_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": false,
            "runtimeClassName": "vramgate",
            "containers": [{
                "name": "main",
                "image": cri_support::APP_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", RUN_UNTIL_STOPPED],
            }],
        },
    })
}

/// A pod whose claim comes from the ResourceClaimTemplate asking 6 GiB.
fn claim_pod(name: &str) -> String {
    let mut pod = test_pod(name);
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    pod.to_string()
}

fn apply_template(c: &Cluster) {
    c.apply(&format!(
        r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {{"name": "{TEMPLATE}", "namespace": "default"}},
        "spec": {{"spec": {{"devices": {{"requests": [{{"name": "gpu", "exactly": {{
            "deviceClassName": "gpu-memory.vramgate.dev", "count": 1,
            "capacity": {{"requests": {{"memory": "6Gi"}}}}}}}}]}}}}}}}}"#
    ));
}

fn claims(c: &Cluster) -> Vec<Value> {
    c.get_json(&["resourceclaims"])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

/// The host's pid of a pod's container, from the node's containerd.
fn container_pid(c: &Cluster, container: &str) -> u32 {
    let tasks = run_ok(&mut c.cri().ctr(&["tasks", "list"]));
    tasks
        .lines()
        .find(|l| l.split_whitespace().next() == Some(container))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no task {container} in containerd: {tasks}"))
}

/// A pod (app.kubernetes.io/name=`name`) of the DaemonSet, its image the imported one, never
/// pulled: kubelet's status names the image and its containerd id.
fn assert_runs_the_node_image(pod: &Value) {
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(status["image"], node_image::image(), "{status}");
    assert_eq!(
        pod["spec"]["containers"][0]["imagePullPolicy"], "Never",
        "{}",
        pod["spec"]
    );
}

/// 1. `helm install` (DRA mode, the chart's default) with the test node's values: the
/// driver's DaemonSet pod of the node image runs, registers with the real kubelet and
/// publishes the node's slice (one device, the GPU's 8 GiB); a pod whose claim asks 6 GiB runs
/// under runtimeClassName vramgate, sees its claim's CDI edits, and the ledger holds 6 GiB for
/// its container; deleting it deletes the claim and frees the memory.
fn helm_install_runs_the_dra_driver_from_the_node_image_and_a_claims_pod_is_reserved_and_released(s: &Setup) {
    let c = s.c();
    s.install(&s.release(json!({})));
    let driver = daemon_pod(c, "vramgate-dra");
    assert_runs_the_node_image(&driver);
    let slice = slice(c, "the driver's pod publishes the node's slice", |_| true);
    let devices = slice["spec"]["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1, "{slice}");
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "8Gi", "{slice}");
    assert_eq!(
        devices[0]["capacity"]["memory"]["requestPolicy"]["validRange"]["step"], "256Mi",
        "{slice}"
    );
    // The claim's pod only once kubelet has registered the pod's driver: a pod it cannot
    // prepare yet is retried after kubelet's back-off (85 s here), not when the driver comes.
    wait_pod_log(c, &driver, "registered with kubelet as");
    // The slice's owner is the node: the driver, not a stand-in, published it.
    // The README's quick start: the example as a user reads it (its image the node's).
    c.apply(&example("dra-pod.yaml"));
    // kubelet registered the pod's driver and had it prepare the claim: else the pod waits
    // with "DRA driver gpu-memory.vramgate.dev is not registered".
    let running = wait_running(c, "trainer");
    let allocated = c.kubectl_ok(&[
        "get",
        "resourceclaims",
        "-o",
        "jsonpath={.items[*].status.allocation.devices.results[*].device}",
    ]);
    assert_eq!(allocated, "gpu-0", "kubectl get resourceclaims: the claim is allocated");
    // On the node, `vramgate status` shows its 6 GiB by the pod's name.
    let shown = status_output(&c.tb().config_path, &[]);
    assert!(
        shown
            .lines()
            .any(|l| l.contains("default/trainer/main") && l.contains(&vramgate::quantity::format_bytes(6 * GIB))),
        "{shown}"
    );
    assert_eq!(reserved_as(c, "default/trainer/main"), Some(6 * GIB));
    let env = c.kubectl_ok(&["exec", "trainer", "--", "env"]);
    assert!(
        env.lines().any(|l| l == format!("VRAMGATE_MEMORY={}", 6 * GIB)),
        "{env}"
    );
    assert!(env.lines().any(|l| l == format!("VRAMGATE_GPUS={GPU}")), "{env}");
    wait_ledger(c, "the claim's 6Gi is reserved", vec![(container_id(&running), 6)]);
    pod_given_no_gpu_runs_with_a_warning_in_its_events(c);
    delete_pod(c, "trainer");
    c.wait(
        "the pod's claim is deleted",
        POD_LIMIT,
        "kube-controller-manager",
        || {
            let all = claims(c);
            (all.is_empty(), all)
        },
    );
    wait_ledger(c, "the claim's memory is released", vec![]);
}

/// A pod whose annotation asks for 2 GiB but that asks Kubernetes for no GPU (no claim) runs
/// under the vramgate RuntimeClass with nothing reserved, as a sidecar would; the runtime
/// wrapper's notice reaches the pod's events through the driver's pod, one Warning line that
/// `kubectl describe pod` shows (the event names the pod's uid).
fn pod_given_no_gpu_runs_with_a_warning_in_its_events(c: &Cluster) {
    let mut pod = test_pod("helm-nogpu");
    pod["metadata"]["annotations"] = json!({"vramgate.dev/memory": "2Gi"});
    c.apply(&pod.to_string());
    let running = wait_running(c, "helm-nogpu");
    let line = wait_event(
        c,
        "the pod's events say it was given no GPU",
        "helm-nogpu",
        POD_LIMIT,
        |m| m.contains("container main was given no GPU"),
    );
    assert!(
        line.contains("vramgate.dev/memory=2Gi") && !line.contains('\n'),
        "{line}"
    );
    let described = c.kubectl_ok(&["describe", "pod", "helm-nogpu"]);
    assert!(
        described
            .lines()
            .any(|l| l.contains("Warning") && l.contains(vramgate::pod_notice::REASON)),
        "kubectl describe pod shows the warning:\n{described}"
    );
    assert_eq!(reserved_as(c, "default/helm-nogpu/main"), None);
    assert!(!ledger(c).iter().any(|(id, _)| *id == container_id(&running)));
    // Posted once and gone from the node.
    let dir = vramgate::ledger::StateDir::open_existing(&c.tb().state_dir)
        .unwrap()
        .unwrap();
    assert_eq!(vramgate::pod_notice::count(&dir), 0);
    delete_pod(c, "helm-nogpu");
}

/// 2. `helm upgrade` with other values (the config from the chart, a ConfigMap with the
/// node's settings; the driver's step 512Mi) while a claim's pod runs: the DaemonSet rolls (a
/// new pod, reading the chart's config.toml, publishing the new step), the running pod is
/// untouched, and its 6 GiB stay reserved throughout.
fn helm_upgrade_rolls_the_driver_onto_new_values_and_keeps_a_running_claims_reservation(s: &Setup) {
    let c = s.c();
    let base = s.release(json!({}));
    s.install(&base);
    let before = daemon_pod(c, "vramgate-dra");
    slice(c, "the slice offers steps of 256Mi", |s| {
        s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "256Mi"
    });
    apply_template(c);
    c.apply(&claim_pod("helm-b"));
    let running = wait_running(c, "helm-b");
    let id = container_id(&running);
    wait_ledger(c, "the claim's 6Gi is reserved", vec![(id.clone(), 6)]);

    let settings = chart_settings(c);
    let upgraded = s.release(json!({
        "dra": {"step": "512Mi"},
        "config": {"fromChart": true, "settings": settings},
    }));
    s.install(&upgraded);
    let after = c.wait("the DaemonSet rolled onto a new pod", POD_LIMIT, "kubelet", || {
        let p = daemon_pod(c, "vramgate-dra");
        (p["metadata"]["uid"] != before["metadata"]["uid"], p)
    });
    assert!(
        after["metadata"]["annotations"]["vramgate.dev/config-sha256"].is_string(),
        "{}",
        after["metadata"]
    );
    // The new pod reads the chart's config.toml (the ConfigMap at the host's config path).
    let pid = container_pid(c, &container_id(&after));
    let config_dir = s.base["hostPaths"]["config"].as_str().unwrap();
    let seen = std::fs::read_to_string(format!("/proc/{pid}/root{config_dir}/config.toml"))
        .unwrap_or_else(|e| panic!("the new driver's config.toml: {e}"));
    assert!(seen.contains("rendered by the vramgate chart"), "{seen}");
    assert!(seen.contains(GPU), "{seen}");
    // The ledger the host's hook writes, not the default one: the chart names hostPaths.state.
    let state = s.base["hostPaths"]["state"].as_str().unwrap();
    assert!(seen.contains(&format!("state_dir = {state:?}")), "{seen}");
    slice(c, "the new pod publishes steps of 512Mi", |s| {
        s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "512Mi"
    });
    let still = c.get_json(&["pod", "helm-b"]).expect("helm-b is still there");
    assert_eq!(container_id(&still), id, "the upgrade replaced the claim's container");
    assert_eq!(still["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(ledger(c), [(id, 6)], "the upgrade lost the claim's reservation");
    delete_pod(c, "helm-b");
    wait_ledger(c, "the claim's memory is released", vec![]);
    // Back to the base values, as the next scenario expects.
    s.install(&base);
}

/// The node's config as the chart's values: what the host's file says, as JSON, without
/// state_dir (the chart writes it itself, from hostPaths.state).
fn chart_settings(c: &Cluster) -> Value {
    let text = std::fs::read_to_string(&c.tb().config_path).unwrap();
    let mut settings: Value = serde_json::to_value(text.parse::<toml::Table>().unwrap()).unwrap();
    settings.as_object_mut().unwrap().remove("state_dir");
    settings
}

/// (kind, namespace or "", name) of each object of a release's manifest.
fn manifest_objects(s: &Setup, release: &Release) -> Vec<(String, String, String)> {
    let out = s.helm.manifest(&s.c().admin, release);
    assert!(out.status.success(), "helm get manifest: {}", stderr(&out));
    helm_support::objects(&stdout(&out))
        .iter()
        .map(|o| {
            let namespaced = !o["metadata"]["namespace"].is_null() || kind_is_namespaced(o["kind"].as_str().unwrap());
            (
                o["kind"].as_str().unwrap().to_string(),
                if namespaced {
                    release.namespace.clone()
                } else {
                    String::new()
                },
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn kind_is_namespaced(kind: &str) -> bool {
    matches!(kind, "ConfigMap" | "ServiceAccount" | "DaemonSet" | "Service")
}

/// Which of `objects` the API server still has.
fn still_there(c: &Cluster, objects: &[(String, String, String)]) -> Vec<String> {
    objects
        .iter()
        .filter_map(|(kind, ns, name)| {
            let mut args = vec!["get", kind.as_str(), name.as_str(), "-o", "name", "--ignore-not-found"];
            if !ns.is_empty() {
                args.extend(["-n", ns.as_str()]);
            }
            let out = c.kubectl_ok(&args);
            (!out.trim().is_empty()).then(|| format!("{kind} {ns}/{name}"))
        })
        .collect()
}

/// 3. `helm uninstall` (installed with the config from the chart, so that the ConfigMap is
/// among the objects): every object the release made, namespaced and cluster-scoped, is gone
/// from the API server, the driver's pods and its ResourceSlice with them.
fn helm_uninstall_leaves_no_object_of_the_release(s: &Setup) {
    let c = s.c();
    let settings = chart_settings(c);
    let release = s.release(json!({"config": {"fromChart": true, "settings": settings}}));
    s.install(&release);
    daemon_pod(c, "vramgate-dra");
    slice(c, "the driver's slice is published", |_| true);
    let objects = manifest_objects(s, &release);
    let mut kinds: Vec<&str> = objects.iter().map(|(k, _, _)| k.as_str()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "DeviceClass",
            "RuntimeClass",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
        "{objects:?}"
    );
    assert_eq!(still_there(c, &objects).len(), objects.len(), "{objects:?}");
    s.uninstall(&release);
    assert_eq!(still_there(c, &objects), Vec::<String>::new(), "left by helm uninstall");
    // The DaemonSet's pods go after it, by the garbage collector, each within its grace
    // period (the driver deregisters on SIGTERM).
    c.wait("the release's pods are gone", POD_LIMIT, "kubelet", || {
        let pods = c
            .get_json(&["pods", "-n", "kube-system"])
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default();
        let names: Vec<String> = pods
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        (names.is_empty(), names)
    });
    assert!(!s.installed(&release), "helm still lists the release");
    // The driver withdraws its node's slice when it stops (SIGTERM from the pod's deletion):
    // a slice left behind would have kube-scheduler allocate claims on a node without driver.
    c.wait("the driver's slice is withdrawn", POD_LIMIT, "kube-apiserver", || {
        let left = slices_of_driver(c);
        (left.is_empty(), left)
    });
}

/// 4. `helm install` in device-plugin mode: the plugin's pod of the node image registers with
/// the real kubelet, the node offers the GPU's 8 units of vramgate.dev/gpu-memory-gib, a pod
/// asking 5 runs under runtimeClassName vramgate and the ledger holds 5 GiB for it; deleting it
/// frees them; `helm uninstall` removes every object of the release.
fn helm_install_in_device_plugin_mode_offers_the_resource_and_uninstall_removes_it(s: &Setup) {
    let c = s.c();
    let dra = s.release(json!({}));
    if s.installed(&dra) {
        s.uninstall(&dra);
    }
    let release = s.release(json!({"dra": {"enabled": false}, "devicePlugin": {"enabled": true}}));
    s.install(&release);
    let plugin = daemon_pod(c, "vramgate-device-plugin");
    assert_runs_the_node_image(&plugin);
    c.wait("the node offers the GPU's 8 GiB", POD_LIMIT, "kubelet", || {
        let a = c
            .get_json(&["node", &c.node])
            .and_then(|n| n["status"]["allocatable"][RESOURCE].as_str().map(str::to_string));
        (a.as_deref() == Some("8"), a)
    });
    // The shipped example, as a user reads it (its image the node's).
    c.apply(&example("pod-gpu-memory.yaml"));
    let running = wait_running(c, "inference-6gib");
    wait_ledger(c, "the plugin's 6 GiB are reserved", vec![(container_id(&running), 6)]);
    assert_eq!(reserved_as(c, "default/inference-6gib/model"), Some(6 * GIB));
    delete_pod(c, "inference-6gib");
    wait_ledger(c, "the pod's memory is released", vec![]);
    let objects = manifest_objects(s, &release);
    assert!(
        objects
            .iter()
            .any(|(k, _, n)| k == "DaemonSet" && n == "vramgate-device-plugin"),
        "{objects:?}"
    );
    s.uninstall(&release);
    assert_eq!(still_there(c, &objects), Vec::<String>::new(), "left by helm uninstall");
    // The node offers nothing once the plugin's pod is gone (kubelet zeroes the resource of a
    // plugin that went away).
    c.wait("the node offers none of the resource", POD_LIMIT, "kubelet", || {
        let a = c
            .get_json(&["node", &c.node])
            .and_then(|n| n["status"]["allocatable"][RESOURCE].as_str().map(str::to_string));
        (a.as_deref().map_or(true, |a| a == "0"), a)
    });
}

/// How long containerd may take to exit on setup-node's SIGHUP: the pod's start, or its undo
/// after kubelet's SIGTERM, comes first.
const ENGINE_EXIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// The node's files the set-up may touch, with their bytes (None: absent): containerd's main
/// config, its backup, the drop-in directory's files, the host's config.toml, the install
/// directory.
fn engine_files(s: &Setup, install_dir: &std::path::Path) -> Vec<(std::path::PathBuf, Option<Vec<u8>>)> {
    let cri = s.c().cri();
    let mut paths = vec![
        cri.main_config.clone(),
        std::path::PathBuf::from(format!("{}.vramgate-backup", cri.main_config.display())),
        cri.config_dir.join("conf.d"),
        std::path::Path::new(s.base["hostPaths"]["config"].as_str().unwrap()).join("config.toml"),
        install_dir.to_path_buf(),
    ];
    if let Ok(entries) = std::fs::read_dir(cri.config_dir.join("conf.d")) {
        paths.extend(entries.map(|e| e.unwrap().path()));
    }
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let bytes = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => Some(b"(directory)".to_vec()),
                Ok(_) => Some(std::fs::read(&p).unwrap()),
                Err(_) => None,
            };
            (p, bytes)
        })
        .collect()
}

/// The suite's own set-up of the node's containerd (`vramgate setup containerd`, as
/// tests/support/cri.rs does it), undone or done again, and containerd restarted to load it.
fn suite_setup(c: &Cluster, remove: bool) {
    let cri = c.cri();
    let mut setup = std::process::Command::new(VRAMGATE);
    setup
        .env("VRAMGATE_CONFIG", &c.tb().config_path)
        .args(["setup", "containerd", "--config-path"])
        .arg(cri.config_dir.join("conf.d/vramgate.toml"))
        .arg("--containerd-config")
        .arg(&cri.main_config);
    if remove {
        setup.arg("--remove");
    }
    run_ok(&mut setup);
    cri.restart(ENGINE_EXIT_LIMIT);
    assert_eq!(cri.runtimes().get("vramgate").is_some(), !remove, "{}", cri.runtimes());
}

/// When the scenario ends, passed or not: a release left installed is uninstalled (its undo
/// restarting containerd, which is started again) and the suite's set-up put back, so that
/// the next scenario's pods find the handler. A failure here is printed, not raised: the
/// scenario's own failure is the one to see.
struct SuiteSetupBack<'a>(&'a Setup, Release);

impl Drop for SuiteSetupBack<'_> {
    fn drop(&mut self) {
        let (s, release) = (self.0, &self.1);
        if std::thread::panicking() {
            // What the set-up's pod did and how it ended, before the clean-up changes it.
            let c = s.c();
            for args in [
                &["get", "pods", "-A", "-o", "wide"][..],
                &[
                    "logs",
                    "-n",
                    "kube-system",
                    "-l",
                    "app.kubernetes.io/name=vramgate-node-setup",
                    "--tail=-1",
                ][..],
                &[
                    "logs",
                    "-n",
                    "kube-system",
                    "-l",
                    "app.kubernetes.io/name=vramgate-node-setup",
                    "--previous",
                    "--tail=-1",
                ][..],
                &["get", "events", "-A"][..],
            ] {
                let out = c
                    .kubectl(args)
                    .output()
                    .map(|o| stdout(&o) + &stderr(&o))
                    .unwrap_or_default();
                eprintln!("kubectl {}:\n{out}", args.join(" "));
            }
            let history = s
                .helm
                .command()
                .args([
                    "history",
                    &release.name,
                    "--namespace",
                    &release.namespace,
                    "--kubeconfig",
                ])
                .arg(&c.admin)
                .output()
                .map(|o| stdout(&o) + &stderr(&o))
                .unwrap_or_default();
            eprintln!("helm history:\n{history}");
            eprintln!("{}", tail(&c.log("kubelet"), 30));
            eprintln!("{}", tail(&c.tb().dir.join("containerd/containerd.log"), 30));
        }
        let back = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if s.installed(release) {
                while_the_engine_restarts(s.c(), "the undo", || {
                    let _ = s.helm.uninstall(&s.c().admin, release, HELM_TIMEOUT);
                });
            }
            if s.c().cri().runtimes().get("vramgate").is_none() {
                suite_setup(s.c(), false);
            }
        }));
        if let Err(e) = back {
            eprintln!("putting the suite's set-up back failed: {}", panic_message(&e));
        }
    }
}

/// Runs `during` while playing containerd's service manager: containerd is expected to end
/// on setup-node's SIGHUP meanwhile, and is started again as systemd's Restart=always would.
fn while_the_engine_restarts(c: &Cluster, what: &str, during: impl FnOnce()) {
    std::thread::scope(|scope| {
        let manager = scope.spawn(|| c.cri().restart_after_exit(ENGINE_EXIT_LIMIT));
        during();
        let ended = manager
            .join()
            .unwrap_or_else(|e| panic!("containerd did not end on {what}: {}", panic_message(&e)));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            ended.signal(),
            Some(nix::libc::SIGHUP),
            "containerd ended with {ended:?} on {what}"
        );
    });
}

/// 5. The chart's node set-up on a node without vramgate (the suite's `vramgate setup
/// containerd` undone, containerd restarted: no handler): `helm install` with
/// nodeSetup.enabled and the config from the chart runs `vramgate setup-node` in a privileged
/// pod of the node image, which copies the hook and the wrapper into installDir, writes the
/// chart's config.toml where the host's hook reads it, sets containerd up and restarts it
/// (SIGHUP; the test plays systemd and starts it again). A claim's pod then runs under
/// runtimeClassName vramgate through the copied wrapper and hook (its CDI spec names them too)
/// and holds 6 GiB; deleted, it releases them. `helm uninstall` while a pod of the RuntimeClass
/// runs has the set-up's pod undo it: containerd restarted once more, without the handler; the
/// running pod, deleted then, stops through the copied wrapper the undo waited to remove,
/// releasing its 2 GiB; then containerd's config, backup and drop-ins, and the host's
/// config.toml, are byte-for-byte as before and the install directory gone.
fn node_setup_sets_up_a_bare_node_from_the_chart_and_uninstall_gives_its_files_back_byte_for_byte(s: &Setup) {
    let c = s.c();
    let dra = s.release(json!({}));
    if s.installed(&dra) {
        s.uninstall(&dra);
    }
    let cri = c.cri();
    let install_dir = c.tb().dir.join("node-lib-vramgate");
    let release = s.release(json!({
        "nodeSetup": {
            "enabled": true,
            "engineConfig": cri.main_config.display().to_string(),
            "engineSocket": cri.address.display().to_string(),
            "installDir": install_dir.display().to_string(),
        },
        "config": {"fromChart": true, "settings": chart_settings(c)},
    }));
    suite_setup(c, true);
    let back = SuiteSetupBack(s, release);
    let release = &back.1;
    c.wait_node_ready();
    let before = engine_files(s, &install_dir);
    while_the_engine_restarts(c, "the set-up", || s.install(release));

    let setup_pod = daemon_pod(c, "vramgate-node-setup");
    assert_runs_the_node_image(&setup_pod);
    let log = wait_pod_log(c, &setup_pod, "node set up; waiting for SIGTERM");
    assert!(log.contains("restarted the engine: SIGHUP to pid"), "{log}");
    let runtimes = cri.runtimes();
    assert_eq!(
        runtimes["vramgate"]["options"]["BinaryName"],
        install_dir.join("vramgate-runtime").display().to_string(),
        "{runtimes}"
    );
    let host_config = std::path::Path::new(s.base["hostPaths"]["config"].as_str().unwrap()).join("config.toml");
    let installed = std::fs::read_to_string(&host_config).unwrap();
    assert!(installed.contains("rendered by the vramgate chart"), "{installed}");

    let id = claims_pod_reserved(c, "helm-ns");

    // Every vramgate-hook the container's spec runs (the wrapper's and the claim's CDI edit)
    // is the one the set-up copied.
    let spec: Value = serde_json::from_slice(&std::fs::read(cri.bundle_spec(&id)).unwrap()).unwrap();
    let hooks: Vec<&str> = spec["hooks"]
        .as_object()
        .into_iter()
        .flat_map(|stages| stages.values())
        .flat_map(|list| list.as_array().into_iter().flatten())
        .filter_map(|h| h["path"].as_str())
        .filter(|p| p.ends_with("vramgate-hook"))
        .collect();
    let copied = install_dir.join("vramgate-hook").display().to_string();
    assert!(!hooks.is_empty() && hooks.iter().all(|h| *h == copied), "{hooks:?}");
    delete_pod(c, "helm-ns");
    wait_ledger(c, "the claim's memory is released", vec![]);

    // Uninstalled while a pod of the RuntimeClass runs (its annotation asks 2Gi; a claim's pod
    // would wait for the uninstalled DRA driver to unprepare it, as any DRA driver's does):
    // containerd's config goes back and containerd restarts without the handler; the undo then
    // waits for the pod, whose shim stops it through the copied wrapper (removed, the pod stayed
    // Terminating with its memory held: kubelet's "fork/exec .../vramgate-runtime").
    let mut pod = test_pod("helm-ns-rc");
    pod["metadata"]["annotations"] = json!({"vramgate.dev/memory": "2Gi"});
    // The GPU the device plugin would have given it.
    pod["spec"]["containers"][0]["env"] = json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]);
    c.apply(&pod.to_string());
    let running = wait_running(c, "helm-ns-rc");
    wait_ledger(c, "the pod's 2Gi is reserved", vec![(container_id(&running), 2)]);
    while_the_engine_restarts(c, "the undo", || s.uninstall(release));
    assert!(cri.runtimes().get("vramgate").is_none(), "{}", cri.runtimes());
    assert!(
        install_dir.join("vramgate-runtime").is_file(),
        "removed under a running pod"
    );
    delete_pod(c, "helm-ns-rc");
    wait_ledger(c, "the pod's memory is released", vec![]);
    wait_node_setup_pods_gone(c);
    let after = engine_files(s, &install_dir);
    assert!(
        after == before,
        "the undo did not give the node's files back: {}",
        files_differing(&before, &after)
    );
    let runtimes = cri.runtimes();
    assert!(
        runtimes.get("vramgate").is_none(),
        "containerd still has the handler: {runtimes}"
    );
}

/// 7. The chart's node set-up on a node laid out as kubeadm lays one out, and through a `helm
/// upgrade`:
///
/// - the host's containerd config imports its drop-ins by absolute path
///   (`<dir>/conf.d/*.toml`, a directory the set-up's pod sees only through `/host`), one of
///   which sets runc's `SystemdCgroup = true`: the handler the pod writes takes it, as
///   `containerd config dump` of that config shows (a config of the test's own, set up with
///   `restart: none`: a runc under SystemdCgroup would start no pod on this machine, which has
///   no systemd). Read in the pod's own file system, the import found nothing.
/// - `helm upgrade` that rolls the set-up's pod while a pod of the RuntimeClass runs: the old
///   pod undoes (containerd restarted without the handler), waits `waitSeconds` for the running
///   pod, keeps the binaries; the new pod finishes that undo and sets up again (containerd
///   restarted, the handler back), the kept binaries replaced; the running pod keeps its
///   container and its 2 GiB throughout, and stops and releases through the new binaries; the
///   uninstall gives the node's files back byte-for-byte.
fn node_setup_reads_the_hosts_drop_ins_and_lives_through_a_helm_upgrade_with_a_pod_running(s: &Setup) {
    let c = s.c();
    let dra = s.release(json!({}));
    if s.installed(&dra) {
        s.uninstall(&dra);
    }
    let cri = c.cri();
    let install_dir = c.tb().dir.join("node-lib-vramgate-7");

    // The host's drop-ins, read through /host.
    let host_etc = c.tb().dir.join("host-etc-containerd");
    std::fs::create_dir_all(host_etc.join("conf.d")).unwrap();
    let copied = host_etc.join("config.toml");
    // The node's own settings, with the host's drop-ins as its only import (the suite's set-up
    // imports its own drop-in, which the set-up would refuse to live beside).
    let original: String = std::fs::read_to_string(&cri.main_config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("imports") && !l.starts_with("# added by `vramgate setup containerd`"))
        .map(|l| format!("{l}\n"))
        .collect();
    let main = original.replacen(
        "version = 3\n",
        &format!("version = 3\nimports = [\"{}/conf.d/*.toml\"]\n", host_etc.display()),
        1,
    );
    assert_ne!(main, original, "the node's config does not start with its version");
    std::fs::write(&copied, &main).unwrap();
    std::fs::write(
        host_etc.join("conf.d/10-kubeadm.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n",
    )
    .unwrap();
    let drop_ins = s.release(json!({
        "dra": {"enabled": false},
        "nodeSetup": {
            "enabled": true,
            "engineConfig": copied.display().to_string(),
            "engineSocket": cri.address.display().to_string(),
            "installDir": install_dir.display().to_string(),
            "restart": "none",
        },
    }));
    let guard = SuiteSetupBack(s, drop_ins);
    s.install(&guard.1);
    let pod = daemon_pod(c, "vramgate-node-setup");
    let log = wait_pod_log(c, &pod, "node set up; waiting for SIGTERM");
    let dump = run_ok(
        std::process::Command::new(cri_support::Containerd::Two.binary())
            .arg("--config")
            .arg(&copied)
            .args(["config", "dump"]),
    );
    let dump: toml::Table = toml::from_str(&dump).unwrap();
    let runtimes = &dump["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"];
    assert_eq!(
        runtimes["vramgate"]["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "the handler lost the host's drop-in: {runtimes}\n{log}"
    );
    assert_eq!(
        runtimes["vramgate"]["options"]["BinaryName"].as_str(),
        Some(install_dir.join("vramgate-runtime").to_str().unwrap())
    );
    s.uninstall(&guard.1);
    // The set-up pod's undo still removes the binaries and the install directory after helm
    // returns: the second part's "before" must not see them (it once did, on a node reused
    // by a second run).
    wait_node_setup_pods_gone(c);
    assert_eq!(
        std::fs::read_to_string(&copied).unwrap(),
        main,
        "the undo changed the host's config"
    );
    assert!(
        !install_dir.exists(),
        "the first set-up's undo left {}",
        install_dir.display()
    );
    drop(guard);

    // Through a helm upgrade with a pod of the RuntimeClass running.
    let values = |wait: u64| {
        json!({
            "nodeSetup": {
                "enabled": true,
                "engineConfig": cri.main_config.display().to_string(),
                "engineSocket": cri.address.display().to_string(),
                "installDir": install_dir.display().to_string(),
                "waitSeconds": wait,
            },
            "config": {"fromChart": true, "settings": chart_settings(c)},
        })
    };
    suite_setup(c, true);
    let guard = SuiteSetupBack(s, s.release(values(5)));
    c.wait_node_ready();
    let before = engine_files(s, &install_dir);
    while_the_engine_restarts(c, "the set-up", || s.install(&guard.1));
    let first = daemon_pod(c, "vramgate-node-setup");
    wait_pod_log(c, &first, "node set up; waiting for SIGTERM");
    let mut pod = test_pod("helm-up-rc");
    pod["metadata"]["annotations"] = json!({"vramgate.dev/memory": "2Gi"});
    pod["spec"]["containers"][0]["env"] = json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]);
    c.apply(&pod.to_string());
    let running = container_id(&wait_running(c, "helm-up-rc"));
    wait_ledger(c, "the pod's 2Gi is reserved", vec![(running.clone(), 2)]);

    // waitSeconds 5 -> 6 rolls the DaemonSet: the undo, then the set-up, each restarting
    // containerd (the test plays systemd twice).
    let upgraded = s.release(values(6));
    std::thread::scope(|scope| {
        let manager = scope.spawn(|| {
            (0..2)
                .map(|_| cri.restart_after_exit(ENGINE_EXIT_LIMIT))
                .collect::<Vec<_>>()
        });
        s.install(&upgraded);
        let ended = manager
            .join()
            .unwrap_or_else(|e| panic!("containerd did not end twice on the upgrade: {}", panic_message(&e)));
        use std::os::unix::process::ExitStatusExt;
        assert!(
            ended.iter().all(|e| e.signal() == Some(nix::libc::SIGHUP)),
            "containerd ended with {ended:?}"
        );
    });
    let second = daemon_pod(c, "vramgate-node-setup");
    assert_ne!(
        second["metadata"]["uid"], first["metadata"]["uid"],
        "the upgrade did not roll the pod"
    );
    let log = wait_pod_log(c, &second, "node set up; waiting for SIGTERM");
    for line in [
        "was left by an earlier run",
        "installed ",
        "restarted the engine: SIGHUP to pid",
    ] {
        assert!(log.contains(line), "no {line:?} in the new pod's log:\n{log}");
    }
    let old_log = c
        .kubectl(&["logs", "-n", "kube-system", first["metadata"]["name"].as_str().unwrap()])
        .output()
        .map(|o| stdout(&o))
        .unwrap_or_default();
    let runtimes = cri.runtimes();
    assert_eq!(
        runtimes["vramgate"]["options"]["BinaryName"],
        install_dir.join("vramgate-runtime").display().to_string(),
        "{runtimes}\nold pod:\n{old_log}"
    );
    let still = container_id(&wait_running(c, "helm-up-rc"));
    assert_eq!(still, running, "the pod's container was replaced");
    wait_ledger(c, "the pod still holds its 2Gi", vec![(running, 2)]);
    delete_pod(c, "helm-up-rc");
    wait_ledger(c, "the pod's memory is released", vec![]);
    while_the_engine_restarts(c, "the undo", || s.uninstall(&upgraded));
    // The undo removes the binaries and the install directory after the engine is back:
    // the files are compared once its pod is gone, as in scenario 5.
    wait_node_setup_pods_gone(c);
    let after = engine_files(s, &install_dir);
    assert!(
        after == before,
        "the undo did not give the node's files back: {}",
        files_differing(&before, &after)
    );
}

/// Waits until no pod of the node set-up's DaemonSet is left: its undo has ended (the binaries
/// and the install directory it removes after the engine is back included).
fn wait_node_setup_pods_gone(c: &Cluster) {
    c.wait("the node set-up's pod is gone", POD_LIMIT, "kubelet", || {
        let left = c
            .get_json(&[
                "pods",
                "-n",
                "kube-system",
                "-l",
                "app.kubernetes.io/name=vramgate-node-setup",
            ])
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default();
        (left.is_empty(), left)
    });
}

/// The paths of two `engine_files` lists that differ, each with what it was and what it is,
/// for a failure message.
fn files_differing(
    before: &[(std::path::PathBuf, Option<Vec<u8>>)],
    after: &[(std::path::PathBuf, Option<Vec<u8>>)],
) -> String {
    let show = |b: Option<&Option<Vec<u8>>>| match b {
        None => "(not listed)".to_string(),
        Some(None) => "(absent)".to_string(),
        Some(Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
    };
    let mut paths: Vec<&std::path::PathBuf> = before.iter().chain(after).map(|(p, _)| p).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| {
            let was = before.iter().find(|(q, _)| q == p).map(|(_, b)| b);
            let is = after.iter().find(|(q, _)| q == p).map(|(_, b)| b);
            (was != is).then(|| format!("\n--- {}\nbefore:\n{}\nafter:\n{}", p.display(), show(was), show(is)))
        })
        .collect()
}

/// One HTTP/1.0 GET of `path` on 127.0.0.1:`port` (std only): the status line and the body.
fn http_get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Ok((head.lines().next().unwrap_or_default().to_string(), body.to_string()))
}

/// A TCP port on loopback that nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// 6. The exporter and the watch as the chart's DaemonSets (pods of the node image under the
/// real kubelet, on the node's network, in the host's PID namespace), with the config from
/// the chart saying `over_use = "kill"`: the exporter's /metrics, scraped at the node's port,
/// shows the claim's pod's container by id and name holding 6 GiB, and the GPU's 6 GiB
/// reserved; the watch measures every second, its heartbeat in the host's ledger directory
/// written by its container's process and kept fresh, so that `vramgate doctor` on the host,
/// with the chart's config.toml, says the watch runs.
fn the_exporter_and_the_watch_run_as_the_charts_pods_and_see_the_nodes_reservations(s: &Setup) {
    let c = s.c();
    let port = free_port();
    let mut settings = chart_settings(c);
    settings["enforce"]["over_use"] = json!("kill");
    settings["enforce"]["over_use_interval"] = json!("1s");
    let release = s.release(json!({
        "exporter": {"enabled": true, "port": port},
        "watch": {"enabled": true},
        "config": {"fromChart": true, "settings": settings},
    }));
    s.install(&release);
    let exporter = daemon_pod(c, "vramgate-exporter");
    let watch = daemon_pod(c, "vramgate-watch");
    assert_runs_the_node_image(&exporter);
    assert_runs_the_node_image(&watch);
    let id = claims_pod_reserved(c, "helm-ex");

    let six = (6 * GIB).to_string();
    let container_line = format!(
        "vramgate_container_reserved_bytes{{container_id=\"{id}\",gpu=\"0\",gpu_uuid=\"{GPU}\",name=\"default/helm-ex/main\"}} {six}"
    );
    let metrics = c.wait(
        "the exporter's metrics show the claim's container",
        POD_LIMIT,
        "kubelet",
        || {
            let got = http_get(port, "/metrics");
            let shown = got
                .as_ref()
                .is_ok_and(|(status, body)| status.contains(" 200 ") && body.lines().any(|l| l == container_line));
            (shown, got.map(|(_, body)| body).unwrap_or_else(|e| e.to_string()))
        },
    );
    let gpu_line = metrics
        .lines()
        .find(|l| l.starts_with("vramgate_gpu_memory_reserved_bytes{"))
        .unwrap_or_else(|| panic!("no GPU line in:\n{metrics}"));
    assert!(gpu_line.ends_with(&format!(" {six}")), "{gpu_line}");

    // The watch's heartbeat: written by its own process (the host's pid: hostPID), and
    // touched again at each pass.
    let heartbeat = c.tb().state_dir.join(vramgate::service::HEARTBEAT_FILE);
    let watch_pid = container_pid(c, &container_id(&watch));
    let beat = |what: &str| -> std::time::SystemTime {
        c.wait(what, POD_LIMIT, "kubelet", || {
            let modified = std::fs::metadata(&heartbeat).and_then(|m| m.modified());
            (modified.is_ok(), modified.map_err(|e| e.to_string()))
        })
        .unwrap()
    };
    let first = beat("the watch writes its heartbeat");
    assert_eq!(
        std::fs::read_to_string(&heartbeat).unwrap().trim(),
        watch_pid.to_string(),
        "the heartbeat is not the watch pod's"
    );
    c.wait("the watch beats again", POD_LIMIT, "kubelet", || {
        let now = beat("the heartbeat is there");
        (now > first, now)
    });
    let config = c.kubectl_ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "vramgate-config",
        "-o",
        "jsonpath={.data.config\\.toml}",
    ]);
    let chart_config = c.tb().dir.join("chart-config.toml");
    std::fs::write(&chart_config, &config).unwrap();
    let doctor = std::process::Command::new(VRAMGATE)
        .arg("doctor")
        .env("VRAMGATE_CONFIG", &chart_config)
        .output()
        .unwrap();
    let said = stdout(&doctor);
    let line = said
        .lines()
        .find(|l| l.contains(" watch "))
        .unwrap_or_else(|| panic!("no watch line in:\n{said}"));
    assert!(
        line.starts_with("ok") && line.contains("`vramgate watch` runs"),
        "{line}"
    );

    delete_pod(c, "helm-ex");
    wait_ledger(c, "the claim's memory is released", vec![]);
    c.wait(
        "the exporter's metrics drop the container",
        POD_LIMIT,
        "kubelet",
        || {
            let body = http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
            (!body.contains(&id), body)
        },
    );
    s.uninstall(&release);
}

fn main() {
    // Re-run as the test node's tool (support::cluster::start_node).
    testnode::cli::run_if_requested();
    let args = scenario_args(SCENARIOS);
    let whole = Instant::now();
    let cluster = Cluster::start(&node_config());
    let image_start = Instant::now();
    let tar = node_image::build(&cluster.dir.join("image"));
    let built_in = image_start.elapsed();
    let import_start = Instant::now();
    node_image::import(cluster.cri(), &tar);
    let imported_in = import_start.elapsed();
    eprintln!("node image: built in {built_in:?}, imported in {imported_in:?}");
    let (setup, conclusion) = run_scenarios(&args, SCENARIOS, prepare(cluster), |setup| {
        eprintln!("the cluster after the failure:\n{}", setup.c().state());
        for pod in [
            "trainer",
            "helm-nogpu",
            "helm-b",
            "inference-6gib",
            "helm-ns",
            "helm-ns-rc",
            "helm-ex",
            "helm-up-rc",
        ] {
            let _ = setup
                .c()
                .kubectl(&[
                    "delete",
                    "pod",
                    pod,
                    "--ignore-not-found",
                    "--wait=true",
                    "--timeout=90s",
                ])
                .output();
        }
    });
    // Whatever release a failed scenario left goes before the cluster does.
    for release in [setup.release(json!({}))] {
        if setup.installed(&release) {
            let _ = setup.helm.uninstall(&setup.c().admin, &release, HELM_TIMEOUT);
        }
    }
    let Setup { cluster, .. } = setup;
    unprepare(&cluster);
    let started_in = cluster.started_in;
    let left = cluster.teardown();
    eprintln!(
        "cluster start {started_in:?}; node image built {built_in:?}, imported {imported_in:?}; \
         whole binary {:?} (start, image, scenarios and teardown)",
        whole.elapsed()
    );
    if !left.is_empty() {
        eprintln!("the cluster left on the host:\n  {}", left.join("\n  "));
        std::process::exit(101);
    }
    conclusion.exit();
}

/// The node given back as [`prepare`] found it (it may be a developer's node, which the next
/// run uses): the RuntimeClass applied again (the one the node starts with), the label and the node's config directories gone.
fn unprepare(c: &Cluster) {
    c.apply(testnode::node::RUNTIME_CLASS);
    c.kubectl_ok(&["label", "node", &c.node, "vramgate.dev/ready-"]);
    for dir in ["etc-vramgate", "etc-cdi"] {
        let _ = std::fs::remove_dir_all(c.tb().dir.join(dir));
    }
}

/// The node as the chart's pods find it, and the values that point them at it: the node
/// labelled vramgate.dev/ready=true; the RuntimeClass the cluster applied from
/// k8s/runtimeclass.yaml removed (the release makes its own, and Helm adopts nothing); the
/// ledger's directory made, as the package's tmpfiles entry makes it; containerd's CDI
/// directory listed in the config's [enforce] cdi_spec_dirs, as `--cdi-dir` needs.
fn prepare(cluster: Cluster) -> Setup {
    let c = &cluster;
    c.kubectl_ok(&["label", "node", &c.node, "vramgate.dev/ready=true", "--overwrite"]);
    c.kubectl_ok(&[
        "delete",
        "runtimeclass",
        "vramgate",
        "--ignore-not-found",
        "--wait=true",
    ]);
    vramgate::ledger::StateDir::open_or_create(&c.tb().state_dir).unwrap();
    let cdi = c.cdi_dir();
    dra_support::lists_cdi_dir(&c.tb().config_path, &cdi);
    // The node's config directory: the testbed's config.toml (what the host's hook and runtime
    // read) hard-linked into a directory of its own, which the pods mount; the testbed's own
    // directory holds the whole cluster (kubelet's root among it), which no pod should see.
    let config_dir = c.tb().dir.join("etc-vramgate");
    std::fs::create_dir_all(&config_dir).unwrap();
    let _ = std::fs::remove_file(config_dir.join("config.toml"));
    std::fs::hard_link(&c.tb().config_path, config_dir.join("config.toml")).unwrap();
    let static_cdi = c.tb().dir.join("etc-cdi");
    std::fs::create_dir_all(&static_cdi).unwrap();
    let kubelet = c.kubelet_root();
    let p = |path: &std::path::Path| path.display().to_string();
    let base = helm_support::test_node_values(json!({
        "image": {"tag": node_image::image_tag()},
        "hostNetwork": true,
        "apiServer": {"host": "127.0.0.1", "port": API_SERVER_PORT},
        "hostPaths": {
            "config": p(&config_dir),
            "state": p(&c.tb().state_dir),
            "containerdTasks": p(&c.containerd_tasks()),
            "cdi": p(&cdi),
            "cdiStatic": p(&static_cdi),
            "kubeletPluginsRegistry": p(&kubelet.join("plugins_registry")),
            "kubeletPlugins": p(&kubelet.join("plugins")),
            "devicePlugins": DEVICE_PLUGINS,
            "hook": HOOK,
        },
    }));
    Setup {
        cluster,
        helm: Helm::new(),
        base,
    }
}
