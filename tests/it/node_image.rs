//! The node image: `scripts/build-image` makes an OCI image of the package (built here by
//! `scripts/package` from the binaries `cargo test --release` built), containerd imports it,
//! and the DRA driver runs from it as a pod through CRI, as kubelet would run the DaemonSet of
//! k8s/dra.yaml: host PID namespace and network, the manifest's host mounts at the same paths.
//! From inside the pod it registers with the stand-in kubelet, publishes the node's slice to
//! the stand-in API server and prepares a claim into the runtime's CDI directory.
//!
//! The same pod under the real kubelet 1.36.3, from the Helm chart, runs in tests/kube_helm.rs;
//! this one stays as the check of the manifest's mounts against the image's binaries, without
//! a cluster.

use crate::support;
use crate::support::cri as cri_support;
use crate::support::dra as dra_support;
use crate::support::kubelet;
use crate::support::node_image;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;

use cri_support::*;
use dra_support::*;
use support::*;

const NODE: &str = "node-a";
const GPUS: &str = "[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The host paths k8s/dra.yaml mounts into the driver's pod, each at the same path.
const MANIFEST_MOUNTS: [&str; 9] = [
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins",
    "/var/run/cdi",
    "/etc/cdi",
    "/etc/vramgate",
    "/run/vramgate",
    "/run/containerd/io.containerd.runtime.v2.task",
    "/dev",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
];

fn mount(path: &Path, readonly: bool) -> cri::Mount {
    cri::Mount {
        container_path: path.display().to_string(),
        host_path: path.display().to_string(),
        readonly,
        ..Default::default()
    }
}

#[test]
fn the_dra_driver_runs_from_the_node_image_as_a_pod() {
    // The mounts below are the manifest's, at this test host's paths (NVML aside: the
    // inventory here is static).
    let manifest = std::fs::read_to_string(root().join("k8s/dra.yaml")).unwrap();
    let mounted: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.split("mountPath: ").nth(1))
        .map(|rest| rest.split([',', '}']).next().unwrap().trim())
        .collect();
    assert_eq!(
        mounted, MANIFEST_MOUNTS,
        "k8s/dra.yaml's mounts changed: change this test with it"
    );

    // 1. The package and the image, built from this run's binaries (tests/support/node_image.rs).
    // 2. Imported into containerd, as a node pulls it.
    let cri = cri_host_on(Containerd::Two, "vramgate-node-image", GPUS);
    let tar = node_image::build(&cri.tb.dir.join("image"));
    let image = node_image::import(&cri, &tar);

    // 3. The DaemonSet's pod.
    let api = ApiServer::start(&cri.tb.dir, &[NODE]);
    let kubelet_dir = cri.tb.dir.join("kubelet");
    let registry_dir = kubelet_dir.join("plugins_registry");
    let plugins_dir = kubelet_dir.join("plugins");
    let cdi_dir = cri.tb.dir.join("containerd/cdi");
    // The node's /etc/cdi, with NVIDIA's spec for the GPU (the toolkit's YAML, by UUID).
    let static_cdi = cri.tb.dir.join("etc-cdi");
    for dir in [&registry_dir, &plugins_dir, &cdi_dir, &static_cdi] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let tasks = cri.state.join("io.containerd.runtime.v2.task");
    // The state directory exists on a node (tmpfiles makes it at boot, mode 0700): were it
    // missing, the runtime would make the mount's source itself, open to all.
    vramgate::ledger::StateDir::open_or_create(&cri.tb.state_dir).unwrap();
    let logs = cri.tb.dir.join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut pod = pod_config("vramgate-dra", &[]);
    pod.log_directory = logs.display().to_string();
    let namespaces = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options
        .as_mut()
        .unwrap();
    namespaces.pid = cri::NamespaceMode::Node as i32;
    let pods = run_all(&cri, vec![pod]);
    let plugin_dir = plugins_dir.join(DRIVER);
    let args: Vec<String> = [
        "--config".into(),
        cri.tb.config_path.display().to_string(),
        "--kubeconfig".into(),
        api.kubeconfig.display().to_string(),
        "--registry-dir".into(),
        registry_dir.display().to_string(),
        "--plugin-dir".into(),
        plugin_dir.display().to_string(),
        "--cdi-dir".into(),
        cdi_dir.display().to_string(),
        // The host's hook, which the claims' CDI devices name (run by the runtime on the host).
        "--hook".into(),
        HOOK.into(),
    ]
    .into();
    // As an operator would: the driver's --cdi-dir is where the hook looks for claims' specs.
    lists_cdi_dir(&cri.tb.config_path, &cdi_dir);
    let mut config = container_config("dra", &[], &[("NODE_NAME", NODE)]);
    config.image = Some(cri::ImageSpec {
        image: image.clone(),
        ..Default::default()
    });
    config.args = args;
    config.log_path = "dra.log".into();
    config.mounts = vec![
        mount(&registry_dir, false),
        mount(&plugins_dir, false),
        mount(&cdi_dir, false),
        cri::Mount {
            container_path: "/etc/cdi".into(),
            host_path: static_cdi.display().to_string(),
            readonly: true,
            ..Default::default()
        },
        mount(cri.tb.config_path.parent().unwrap(), true),
        mount(&cri.tb.state_dir, false),
        mount(&tasks, true),
        mount(Path::new("/dev"), true),
        mount(&api.kubeconfig, true),
    ];
    let id = cri.create(&pods[0], config);
    cri.start_one(&id).unwrap();

    // 4. From inside the pod: registration, the slice, a prepared claim.
    let socket = registry_dir.join(format!("{DRIVER}-reg.sock"));
    wait_until("the driver's registration socket", Duration::from_secs(30), || {
        let state = cri.container_status(&id).state;
        if state == cri::ContainerState::ContainerExited as i32 {
            panic!(
                "the driver's container exited: {}",
                std::fs::read_to_string(logs.join("dra.log")).unwrap_or_default()
            );
        }
        (socket.exists(), state)
    });
    let registered = cri.block_on(kubelet::register(&socket, DRIVER));
    wait_until("the node's slice", Duration::from_secs(10), || {
        let now = cri.block_on(api.capacities(NODE));
        (now == [("gpu-0".to_string(), "16Gi".to_string())], now)
    });
    std::fs::write(
        static_cdi.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-zero\n  containerEdits:\n    env: [NVIDIA_CDI_DEVICE=GPU-zero]\n",
    )
    .unwrap();
    let uid = cri.block_on(api.create_claim("default", "trainer", "2Gi"));
    cri.block_on(api.schedule_one("default", "trainer", NODE));
    let answer = cri.block_on(kubelet::prepare(
        &registered.endpoint,
        vec![kubelet::claim("default", "trainer", &uid)],
    ));
    assert_eq!(answer.claims[&uid].error, "");
    assert_eq!(
        answer.claims[&uid].devices[0].cdi_device_ids[1], "nvidia.com/gpu=GPU-zero",
        "NVIDIA's device, found in the node's /etc/cdi from inside the pod"
    );
    assert!(cdi_dir.join(format!("vramgate.dev-gpu-memory_{uid}.json")).is_file());

    // 5. The pod stops: the driver deregisters on SIGTERM.
    cri.delete_pods(&pods);
    assert!(!socket.exists(), "the registration socket outlived the pod");
    let rejected = cri.block_on(api.rejected());
    assert!(rejected.is_empty(), "{rejected:#?}");
}
