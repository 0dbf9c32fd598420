//! The node side of a DRA claim with consumable capacity (issue 21, in progress): a claim as
//! the scheduler leaves it (6 GiB consumed on device `gpu-1`) is prepared into a CDI spec by
//! the library the DRA plugin will call, kubelet's CreateContainer names the CDI device (the
//! CRI `cdi_devices` field, as kubelet sets it), containerd 2.1's CRI plugin (CDI on) applies
//! it, and the container goes through vramgate-runtime, which reserves exactly the claim's
//! memory on exactly that GPU. After the pod is gone, unprepare leaves nothing.

#[path = "support/cri.rs"]
mod cri_support;
mod support;

use k8s_cri::v1 as cri;

use cri_support::*;
use support::*;
use vramgate::dra;

const GPUS: &str = "[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n\
    [[inventory.gpus]]\nindex = 1\nuuid = \"GPU-one\"\ntotal = \"16Gi\"\n";
const UID: &str = "0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10";
const CLAIM: &str = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
  "metadata":{"name":"trainer-gpu","namespace":"default","uid":"0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10"},
  "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu-memory.vramgate.dev","capacity":{"requests":{"memory":"6Gi"}}}}]}},
  "status":{"allocation":{"devices":{"results":[
    {"request":"gpu","driver":"gpu-memory.vramgate.dev","pool":"node-a","device":"gpu-1",
     "shareID":"9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60","consumedCapacity":{"memory":"6Gi"}}]}}}}"#;

#[test]
fn a_prepared_claim_reserves_exactly_its_consumed_memory_on_its_gpu() {
    let cri = cri_host_on(Containerd::Two, "vramgate-dra-node", GPUS);
    let cdi_dir = cri.tb.dir.join("containerd/cdi");

    // Prepare, as the plugin's NodePrepareResources will: this driver's results, each on the
    // GPU the slice published under that device name.
    let config = vramgate::config::Config::load_from(&cri.tb.config_path).unwrap();
    let gpus = vramgate::inventory::open(&config).unwrap().snapshot().unwrap().gpus;
    let devices: Vec<dra::cdi::ClaimDevice> = dra::claim::shares(CLAIM.as_bytes(), "default", "trainer-gpu", UID)
        .unwrap()
        .into_iter()
        .map(|share| {
            let gpu = dra::gpu_named(&share.device, &gpus).expect("a published device");
            dra::cdi::ClaimDevice {
                device: share.device.clone(),
                bytes: share.bytes,
                uuid: gpu.uuid.clone(),
                device_nodes: dra::device_nodes(gpu, std::path::Path::new("/dev")),
            }
        })
        .collect();
    let ids = dra::cdi::write_spec(&cdi_dir, UID, &devices).unwrap();
    assert_eq!(ids, [format!("vramgate.dev/gpu-memory={UID}-gpu-1")]);

    // kubelet: a pod with no vramgate annotation; the container names the CDI device.
    let pods = run_all(&cri, vec![pod_config("trainer", &[])]);
    let mut config = container_config("main", RUN_UNTIL_STOPPED, &[]);
    config.cdi_devices = ids.iter().map(|name| cri::CdiDevice { name: name.clone() }).collect();
    let id = cri.create(&pods[0], config);
    cri.start_one(&id).unwrap();

    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(cri.bundle_spec(&id)).unwrap()).unwrap();
    let env: Vec<&str> = spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        env.contains(&"VRAMGATE_MEMORY=6442450944") && env.contains(&"VRAMGATE_GPUS=GPU-one"),
        "{env:?}"
    );
    assert_eq!(
        reservations_by_gpu(&cri.tb),
        [
            ("GPU-zero".to_string(), vec![]),
            ("GPU-one".to_string(), vec![(id.clone(), 6u64 << 30)])
        ],
        "exactly the claim's consumed memory, on its GPU, and nothing for the sandbox"
    );

    // The pod goes, then kubelet unprepares: nothing is left.
    cri.delete_pods(&pods);
    wait_released(&cri.tb, &id);
    dra::cdi::remove_spec(&cdi_dir, UID).unwrap();
    dra::cdi::remove_spec(&cdi_dir, UID).unwrap();
    assert_eq!(std::fs::read_dir(&cdi_dir).unwrap().count(), 0);
    assert!(
        reservations_by_gpu(&cri.tb).iter().all(|(_, list)| list.is_empty()),
        "{:?}",
        reservations_by_gpu(&cri.tb)
    );
}
