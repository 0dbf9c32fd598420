//! A DRA claim end to end below kubelet: Kubernetes' own allocator (tests/support/allocator.rs,
//! as kube-scheduler 1.36 runs it) allocates 6 GiB of `gpu-1` from the slice the built
//! `vramgate-dra` published (stand-in API server), kubelet's DRA manager
//! (stand-in) has the driver prepare it, kubelet's CreateContainer names the CDI device the
//! driver returned (the CRI `cdi_devices` field, as kubelet sets it), containerd 2.1's CRI
//! plugin (CDI on) applies it, and the container goes through vramgate-runtime, which reserves
//! exactly the claim's consumed memory on exactly that GPU. A claim's memory is held from its
//! allocation: a container started by hand on the same GPU before the claim's pod cannot take
//! it. After the pod is gone, unprepare leaves nothing.
//!
//! Why stand-ins here: the test times each step itself (memory taken by a container started by
//! hand between the claim's allocation and its pod's start), which the real kubelet and
//! scheduler would not hold still for. The same path with the real kubelet 1.36.3,
//! kube-scheduler and API server runs in tests/kube_node.rs.

use crate::support;
use crate::support::cri as cri_support;
use crate::support::dra as dra_support;
use crate::support::kubelet;

use std::time::Duration;

use k8s_cri::v1 as cri;

use cri_support::*;
use dra_support::*;
use kubelet::claim;
use support::*;

/// The CDI ids of a prepared claim, as kubelet puts them in the container's config.
fn cdi_devices(ids: &[String]) -> Vec<cri::CdiDevice> {
    ids.iter().map(|name| cri::CdiDevice { name: name.clone() }).collect()
}

#[test]
fn a_claim_prepared_by_the_driver_reserves_exactly_its_consumed_memory_on_its_gpu() {
    // over_use = "kill": the watch stops a pod's holders of one claim together, so the pod's
    // sidecar below holds the claim with its first container, once.
    let cri = cri_host_on(
        Containerd::Two,
        "vramgate-dra-node",
        &format!("{GPUS}[enforce]\nover_use = \"kill\"\n"),
    );
    // ...and only while it is seen running (its heartbeat): so it runs here.
    let _watch = RunningWatch::start(&cri.tb);
    let cdi_dir = cri.tb.dir.join("containerd/cdi");
    let api = ApiServer::start(&cri.tb.dir, &[NODE]);
    let driver = Driver::start(&cri.tb.dir, &cri.tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = cri.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_until("the node's slice", Duration::from_secs(10), || {
        let now = cri.block_on(api.capacities(NODE));
        (now.len() == 2, now)
    });

    // The NVIDIA Container Toolkit's CDI spec, as `nvidia-ctk cdi generate` names its devices
    // (by index and by UUID; YAML), here with a marker for its edits instead of the driver's
    // files and nodes, which this machine has not.
    std::fs::create_dir_all(&cdi_dir).unwrap();
    std::fs::write(
        cdi_dir.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
         - name: \"1\"\n  containerEdits:\n    env: [NVIDIA_CDI_DEVICE=1]\n\
         - name: GPU-one\n  containerEdits:\n    env: [NVIDIA_CDI_DEVICE=GPU-one]\n\
         containerEdits:\n  env: [NVIDIA_CDI_SPEC=toolkit]\n",
    )
    .unwrap();

    // The scheduler: 6 GiB of gpu-1 (the claim selects the GPU of index 1) for the pod's claim.
    let uid = cri.block_on(api.create_claim_on("default", "trainer-gpu", "6Gi", 1));
    let allocation = cri.block_on(api.schedule_one("default", "trainer-gpu", NODE));
    assert_eq!(
        allocator::devices(&allocation),
        [("gpu-1".to_string(), "6Gi".to_string())]
    );
    let answer = cri.block_on(kubelet::prepare(
        &registered.endpoint,
        vec![claim("default", "trainer-gpu", &uid)],
    ));
    let prepared = &answer.claims[&uid];
    assert_eq!(prepared.error, "");
    let ids = prepared.devices[0].cdi_device_ids.clone();
    assert_eq!(
        ids,
        [
            format!("vramgate.dev/gpu-memory={uid}-gpu-1"),
            "nvidia.com/gpu=GPU-one".to_string()
        ],
        "vramgate's device and, where the node has it, NVIDIA's for the same GPU"
    );

    // kubelet: a pod with no vramgate annotation; the container names the CDI device.
    let pods = run_all(&cri, vec![pod_config("trainer", &[])]);
    let mut config = container_config("main", RUN_UNTIL_STOPPED, &[]);
    config.cdi_devices = cdi_devices(&ids);
    let id = cri.create(&pods[0], config);
    cri.start_one(&id).unwrap();

    let spec = read_spec(&cri.bundle_spec(&id));
    let env = process_env(&spec);
    assert!(
        env.contains(&"VRAMGATE_MEMORY=6442450944") && env.contains(&"VRAMGATE_GPUS=GPU-one"),
        "{env:?}"
    );
    assert!(
        env.contains(&"NVIDIA_CDI_DEVICE=GPU-one") && env.contains(&"NVIDIA_CDI_SPEC=toolkit"),
        "NVIDIA's CDI device applied too: {env:?}"
    );
    assert_eq!(
        reservations_by_gpu(&cri.tb),
        [
            ("GPU-zero".to_string(), vec![]),
            ("GPU-one".to_string(), vec![(id.clone(), 6u64 << 30)])
        ],
        "exactly the claim's consumed memory, on its GPU, and nothing for the sandbox"
    );
    // One vramgate hook per stage: the CDI device's and the runtime wrapper's are one.
    assert_eq!(
        vramgate_hook_stages(&cri.bundle_spec(&id)),
        ["createRuntime", "poststop"]
    );
    // A second container of the pod naming the same claim (a sidecar): containerd writes the
    // pod's sandbox id on both, and the claim is held once by the two.
    let mut config = container_config("sidecar", RUN_UNTIL_STOPPED, &[]);
    config.cdi_devices = cdi_devices(&ids);
    let sidecar = cri.create(&pods[0], config);
    cri.start_one(&sidecar).unwrap();
    let ledger: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cri.tb.state_dir.join("ledger.json")).unwrap()).unwrap();
    let holds: Vec<&serde_json::Value> = ledger["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["claim"])
        .collect();
    let hold = serde_json::json!({"pod": pods[0].sandbox, "devices": [format!("{uid}-gpu-1")]});
    assert_eq!(holds, [&hold, &hold], "{ledger}");
    assert_eq!(
        status(&cri.tb.config_path)["gpus"][1]["reserved"],
        6u64 << 30,
        "the pod's claim once"
    );
    // The claim's own reservation leaves the published capacity as it was (the scheduler
    // counts the claim already): checked below, once a container outside Kubernetes has made
    // the driver publish gpu-1 again while this pod still holds the claim.

    // A pod without the vramgate RuntimeClass (containerd's default runc): the claim's CDI
    // device runs vramgate's hook itself, so its container still reserves exactly its memory,
    // and releases it when it stops.
    let plain = cri.block_on(api.create_claim("default", "plain-gpu", "2Gi"));
    let allocation = cri.block_on(api.schedule_one("default", "plain-gpu", NODE));
    assert_eq!(
        allocator::devices(&allocation),
        [("gpu-0".to_string(), "2Gi".to_string())],
        "the first GPU with room, in the slice's order"
    );
    let plain_ids = cri
        .block_on(kubelet::prepare(
            &registered.endpoint,
            vec![claim("default", "plain-gpu", &plain)],
        ))
        .claims[&plain]
        .devices[0]
        .cdi_device_ids
        .clone();
    let plain_pod = cri
        .block_on(run_pod_on(cri.runtime.clone(), pod_config("plain", &[]), ""))
        .unwrap();
    let mut config = container_config("main", RUN_UNTIL_STOPPED, &[]);
    config.cdi_devices = cdi_devices(&plain_ids);
    let plain_id = cri.create(&plain_pod, config);
    cri.start_one(&plain_id).unwrap();
    assert_eq!(
        reservations_by_gpu(&cri.tb)[0],
        ("GPU-zero".to_string(), vec![(plain_id.clone(), 2u64 << 30)]),
        "reserved through the CDI device's hook, without vramgate-runtime"
    );
    cri.delete_pods(std::slice::from_ref(&plain_pod));
    wait_released(&cri.tb, &plain_id);

    // A second claim, allocated when gpu-1 had room (4 of its 10 GiB left): the driver holds
    // its memory from the allocation (issue 56), before its pod exists. A container started by
    // hand on the same GPU (through the same runtime, policy reject) asking 9 GiB before that
    // pod starts is refused, saying why: the claim's memory is not there to take. One asking
    // 2 GiB starts. The claim's pod then starts and its container takes the claim's
    // reservation over, counted once.
    let late = cri.block_on(api.create_claim_on("default", "late-gpu", "4Gi", 1));
    let allocation = cri.block_on(api.schedule_one("default", "late-gpu", NODE));
    assert_eq!(
        allocator::devices(&allocation),
        [("gpu-1".to_string(), "4Gi".to_string())]
    );
    let claim_id = format!("claim-{late}");
    wait_until(
        "the late claim held from its allocation",
        Duration::from_secs(10),
        || {
            let now = reservations_by_gpu(&cri.tb);
            (now[1].1.contains(&(claim_id.clone(), 4u64 << 30)), now)
        },
    );
    let late_ids = cri
        .block_on(kubelet::prepare(
            &registered.endpoint,
            vec![claim("default", "late-gpu", &late)],
        ))
        .claims[&late]
        .devices[0]
        .cdi_device_ids
        .clone();
    let outside_pods = run_all(&cri, vec![pod_config("outside", &[])]);
    // Given GPU-one, as a device plugin gives a pod's container its GPU.
    let by_hand = |name: &str, memory: &str| {
        container_config(
            name,
            RUN_UNTIL_STOPPED,
            &[
                ("VRAMGATE_MEMORY", memory),
                ("VRAMGATE_GPUS", "GPU-one"),
                ("NVIDIA_VISIBLE_DEVICES", "GPU-one"),
            ],
        )
    };
    let hog = cri.create(&outside_pods[0], by_hand("hog", "9Gi"));
    let refused = cri.start_one(&hog).expect_err("the late claim holds gpu-1's memory");
    eprintln!("StartContainer of the 9 GiB container by hand: {}", refused.message());
    assert!(
        refused.message().contains("vramgate") && refused.message().contains("GPU 1 (GPU-one)"),
        "{}",
        refused.message()
    );
    let outside = cri.create(&outside_pods[0], by_hand("small", "2Gi"));
    cri.start_one(&outside).unwrap();
    // 16 - 2 GiB: the claims' memory (the trainer's 6 GiB held by two containers, the late
    // claim's own 4 GiB) is counted by the scheduler already and not published away again.
    let published = [
        ("gpu-0".to_string(), "16Gi".to_string()),
        ("gpu-1".to_string(), "14Gi".to_string()),
    ];
    wait_until(
        "gpu-1's capacity lowered by the 2 GiB, and by nothing else",
        Duration::from_secs(10),
        || {
            let now = cri.block_on(api.capacities(NODE));
            (now == published, now)
        },
    );
    let late_pods = run_all(&cri, vec![pod_config("late", &[])]);
    let mut config = container_config("main", RUN_UNTIL_STOPPED, &[]);
    config.cdi_devices = cdi_devices(&late_ids);
    let late_id = cri.create(&late_pods[0], config);
    cri.start_one(&late_id).unwrap();
    let on_gpu_1 = &reservations_by_gpu(&cri.tb)[1].1;
    assert!(
        on_gpu_1.contains(&(late_id.clone(), 4u64 << 30)) && !on_gpu_1.iter().any(|(id, _)| id == &claim_id),
        "the late claim's container took its reservation over: {on_gpu_1:?}"
    );

    // The pods go, then kubelet unprepares: nothing is left.
    cri.delete_pods(&late_pods);
    cri.delete_pods(&outside_pods);
    cri.delete_pods(&pods);
    wait_released(&cri.tb, &id);
    wait_released(&cri.tb, &sidecar);
    wait_released(&cri.tb, &outside);
    wait_released(&cri.tb, &late_id);
    let answer = cri.block_on(kubelet::unprepare(
        &registered.endpoint,
        vec![
            claim("default", "trainer-gpu", &uid),
            claim("default", "late-gpu", &late),
            claim("default", "plain-gpu", &plain),
        ],
    ));
    assert!(answer.claims.values().all(|r| r.error.is_empty()), "{answer:?}");
    let left: Vec<_> = std::fs::read_dir(&cdi_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["nvidia.yaml"], "only the toolkit's own spec is left");
    // The claims, still allocated, hold their memory until they are deleted (issue 56): then
    // nothing is left.
    let held: Vec<String> = reservations(&cri.tb).into_iter().map(|(id, _)| id).collect();
    assert!(held.iter().all(|id| id.starts_with("claim-")), "{held:?}");
    for name in ["trainer-gpu", "late-gpu", "plain-gpu"] {
        cri.block_on(api.delete_claim("default", name));
    }
    wait_until("the deleted claims' memory released", Duration::from_secs(10), || {
        let now = reservations_by_gpu(&cri.tb);
        (now.iter().all(|(_, list)| list.is_empty()), now)
    });
    let rejected = cri.block_on(api.rejected());
    assert!(rejected.is_empty(), "{rejected:#?}");
}
