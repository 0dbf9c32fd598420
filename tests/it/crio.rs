//! Kubernetes through CRI-O, driven as kubelet drives it (tests/support/crio.rs): a private
//! crio 1.36 built from the repository's pruned source, the package's hooks.d entry pointed at
//! the built hook, images put into crio's storage with skopeo, and the CRI calls kubelet makes
//! for a pod sent over gRPC on crio's unix socket.
//!
//! CRI-O runs `runc create` inside CreateContainer (containerd waits for StartContainer), so
//! the prestart hook admits, queues or refuses there: a refusal is the error of the
//! CreateContainer call.

use crate::support;
use crate::support::cri as cri_support;
use crate::support::crio as crio_support;

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use cri_support::*;
use crio_support::*;
use support::*;

/// The host's vramgate config: one simulated 24,265 MiB GPU.
const STATIC_GPU: &str = "[inventory]\nbackend = \"static\"";

/// A container the device plugin gave GPU 0 (its `NVIDIA_VISIBLE_DEVICES`): a pod's containers
/// get GPUs from the scheduler alone, and the pod's `vramgate.dev/gpus` chooses among them.
fn gpu_container(name: &str) -> cri::ContainerConfig {
    container_config(name, RUN_UNTIL_STOPPED, &[("NVIDIA_VISIBLE_DEVICES", "0")])
}

/// A pod that crio's runtime handler `handler` ran; a refusal fails the test with crio's log.
fn pod_on(crio: &Crio, handler: &str, config: cri::PodSandboxConfig) -> Pod {
    crio.run_pod_on(config, handler)
        .unwrap_or_else(|e| panic!("RunPodSandbox on {handler}: {e}\n{}", crio.log()))
}

fn gpu_pod(name: &str, memory: &str, extra: &[(&str, &str)]) -> cri::PodSandboxConfig {
    let mut annotations = vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")];
    annotations.extend_from_slice(extra);
    pod_config(name, &annotations)
}

/// The package's hooks.d entry alone (crio's default runtime, plain runc): a pod annotated
/// `vramgate.dev/memory: 6Gi` is reserved when CreateContainer runs `runc create`, runs, and
/// is released when kubelet removes it; a 30000Mi request is refused, with vramgate's line in
/// the error of CreateContainer, and leaves nothing behind.
#[test]
fn hooks_d_reserves_at_create_releases_at_removal_and_refuses_in_create_container() {
    let crio = crio_host("vramgate-crio-hooks", STATIC_GPU);
    let pod = crio.run_pod(gpu_pod("gpu", "6Gi", &[]));
    assert_eq!(reservations(&crio.tb), [], "the pod's sandbox holds a reservation");
    let id = crio.create(&pod, gpu_container("app"));
    // Reserved by CreateContainer itself, before any StartContainer.
    assert_eq!(reservations(&crio.tb), [(id.clone(), 6 * GIB)]);
    // Shown as the pod's namespace, the pod and the container, from CRI-O's keys.
    support::assert_shown_as(&crio.tb.config_path, &crio.tb.state_dir, &id, Some("default/gpu/app"));
    // CRI-O puts the hooks.d entry's `prestart` stage into the spec as `createRuntime` (the
    // same moment, runc's name for it since OCI 1.0.2); the hook is run with `prestart`.
    let stages = vramgate_hook_stages(&crio.bundle_spec(&id));
    assert_eq!(
        stages,
        ["createRuntime", "poststop"],
        "crio did not add the hooks.d entries"
    );
    crio.start_one(&id).unwrap();
    assert_eq!(
        crio.container_status(&id).state,
        cri::ContainerState::ContainerRunning as i32
    );

    // 6 GiB held, 20 GiB asked: refused, and the CRI error says so in vramgate's words.
    let big = crio.run_pod(gpu_pod("big", "20Gi", &[]));
    let err = crio
        .try_create(&big, gpu_container("app"))
        .expect_err("a 20Gi request was created beside 6Gi");
    eprintln!("the refusal as the CRI client sees it: {err}");
    assert!(
        err.message().contains("vramgate: refused container")
            && err.message().contains("it requests 20.0 GiB and GPU 0")
            && err.message().contains("set vramgate.dev/policy=wait to queue"),
        "{err}"
    );
    assert_eq!(reservations(&crio.tb), [(id.clone(), 6 * GIB)]);
    assert_eq!(queued(&crio.tb), []);
    let listed = crio.containers();
    assert_eq!(listed.len(), 1, "the refused container is listed: {listed:?}");

    // kubelet deletes the pod: stop, remove, then the sandbox. The poststop hook releases.
    crio.delete_pod(&pod);
    wait_released(&crio.tb, &id);
    assert_eq!(reservations(&crio.tb), []);
    crio.delete_pod(&big);
}

/// A container of the app image with these annotations (its own, not the pod's).
fn annotated(name: &str, env: &[(&str, &str)], annotations: &[(&str, &str)]) -> cri::ContainerConfig {
    let mut config = container_config(name, RUN_UNTIL_STOPPED, env);
    config.annotations = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config
}

/// CRI-O writes a pod's annotations into every container's spec, then the container's own
/// over them: a pod annotation is each GPU container's request, a container annotation is
/// that container's, and where both name the key the container's wins. A sidecar that names
/// no GPU reserves nothing; KAI's per-container annotation on the pod reaches the container it
/// names (CRI-O writes the name as `io.kubernetes.container.name`).
#[test]
fn pod_and_container_annotations_reach_the_hook_as_crio_passes_them() {
    let crio = crio_host("vramgate-crio-annotations", STATIC_GPU);
    let held = |id: &str| -> Vec<u64> {
        reservations(&crio.tb)
            .into_iter()
            .filter(|(c, _)| c == id)
            .map(|(_, b)| b)
            .collect()
    };

    // The pod's annotation, nothing on the container.
    let from_pod = crio.run_pod(gpu_pod("from-pod", "2Gi", &[]));
    let a = crio.create(&from_pod, annotated("app", &[("NVIDIA_VISIBLE_DEVICES", "0")], &[]));
    assert_eq!(held(&a), [2 * GIB]);

    // The container's annotations, nothing on the pod.
    let plain = crio.run_pod(pod_config("from-container", &[]));
    let b = crio.create(
        &plain,
        annotated(
            "app",
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
            &[("vramgate.dev/memory", "3Gi"), ("vramgate.dev/gpus", "0")],
        ),
    );
    assert_eq!(held(&b), [3 * GIB]);

    // Both: the container's value is the one in the spec.
    let both = crio.run_pod(gpu_pod("both", "1Gi", &[]));
    let c = crio.create(
        &both,
        annotated(
            "app",
            &[("NVIDIA_VISIBLE_DEVICES", "0")],
            &[("vramgate.dev/memory", "4Gi")],
        ),
    );
    let spec = read_spec(&crio.bundle_spec(&c));
    assert_eq!(spec["annotations"]["vramgate.dev/memory"], "4Gi");
    assert_eq!(held(&c), [4 * GIB]);

    // A pod request without vramgate.dev/gpus: the container the device plugin gave a GPU
    // (NVIDIA_VISIBLE_DEVICES) reserves, its sidecar does not.
    let sidecar_pod = crio.run_pod(pod_config("sidecar", &[("vramgate.dev/memory", "1Gi")]));
    let gpu = crio.create(&sidecar_pod, annotated("gpu", &[("NVIDIA_VISIBLE_DEVICES", "0")], &[]));
    let side = crio.create(&sidecar_pod, annotated("side", &[], &[]));
    assert_eq!(held(&gpu), [GIB]);
    assert_eq!(held(&side), Vec::<u64>::new());

    // KAI's annotation on the pod, keyed by the container's name (whole MiB).
    let kai = crio.run_pod(pod_config(
        "kai",
        &[
            ("nvidia.com/container.worker.gpu-memory.request", "512"),
            ("vramgate.dev/gpus", "0"),
        ],
    ));
    let worker = crio.create(&kai, annotated("worker", &[("NVIDIA_VISIBLE_DEVICES", "0")], &[]));
    let other = crio.create(&kai, annotated("other", &[], &[]));
    assert_eq!(held(&worker), [512 << 20]);
    assert_eq!(held(&other), Vec::<u64>::new());

    for pod in [&from_pod, &plain, &both, &sidecar_pod, &kai] {
        crio.delete_pod(pod);
    }
    assert_eq!(reservations(&crio.tb), []);
}

/// A pod author's annotations never switch vramgate off nor hand a container a GPU (the hooks.d
/// path). CRI-O copies every pod annotation but its own `io.kubernetes.cri-o.*` keys into each
/// container's spec, containerd's sandbox marker included: the GPU container under it still
/// reserves. A pod whose container its engine gave no GPU, naming every GPU in full, reserves
/// nothing (a pod's GPUs come from the scheduler alone); the same through the container's own
/// env is refused with the line saying so.
///
/// CRI-O strips containerd's key unless the runtime handler's `allowed_annotations` names it, as
/// the handlers CRI-O documents for crun's wasm images do: the forged pod runs on such a handler
/// (`ANNOTATIONS_HANDLER`), and on the default one the key is seen stripped.
#[test]
fn a_pods_annotations_neither_hide_a_gpu_container_nor_give_a_container_a_gpu() {
    let crio = crio_host("vramgate-crio-pod-edges", STATIC_GPU);
    let forged_pod = |name: &str| {
        pod_config(
            name,
            &[
                ("vramgate.dev/memory", "2Gi"),
                ("io.kubernetes.cri.container-type", "sandbox"),
            ],
        )
    };
    let stripped = crio.run_pod(forged_pod("stripped"));
    let plain = crio.create(&stripped, gpu_container("gpu"));
    let spec = read_spec(&crio.bundle_spec(&plain));
    assert_eq!(
        spec["annotations"]["io.kubernetes.cri.container-type"],
        serde_json::Value::Null,
        "the default handler strips containerd's key"
    );
    assert_eq!(reservations(&crio.tb), [(plain.clone(), 2 * GIB)]);
    crio.delete_pod(&stripped);
    assert_eq!(reservations(&crio.tb), []);

    let forged = pod_on(&crio, ANNOTATIONS_HANDLER, forged_pod("forged"));
    let gpu = crio.create(&forged, gpu_container("gpu"));
    let spec = read_spec(&crio.bundle_spec(&gpu));
    assert_eq!(
        (
            &spec["annotations"]["io.kubernetes.cri.container-type"],
            &spec["annotations"]["io.kubernetes.cri-o.ContainerType"]
        ),
        (&serde_json::json!("sandbox"), &serde_json::json!("container")),
        "CRI-O passes the pod's key beside its own"
    );
    assert_eq!(reservations(&crio.tb), [(gpu.clone(), 2 * GIB)]);
    crio.start_one(&gpu).unwrap();

    let greedy = crio.run_pod(pod_config(
        "greedy",
        &[("vramgate.dev/memory", "100%"), ("vramgate.dev/gpus", "all")],
    ));
    let app = crio.create(&greedy, container_config("app", RUN_UNTIL_STOPPED, &[]));
    crio.start_one(&app).unwrap();
    assert_eq!(
        crio.container_status(&app).state,
        cri::ContainerState::ContainerRunning as i32
    );
    assert_eq!(
        reservations(&crio.tb),
        [(gpu.clone(), 2 * GIB)],
        "the container its engine gave no GPU reserved one"
    );
    let err = crio
        .try_create(
            &greedy,
            container_config(
                "own",
                RUN_UNTIL_STOPPED,
                &[("VRAMGATE_MEMORY", "1Gi"), ("VRAMGATE_GPUS", "all")],
            ),
        )
        .expect_err("a pod's container given no GPU was created on one");
    assert!(err.message().contains("Kubernetes gave it no GPU"), "{err}");
    assert_eq!(reservations(&crio.tb), [(gpu.clone(), 2 * GIB)]);
    for pod in [&forged, &greedy] {
        crio.delete_pod(pod);
    }
    assert_eq!(reservations(&crio.tb), []);
}

/// crio restarted with pods running (an upgrade, a crash: systemd starts it again): it
/// restores its pods and containers from its state, and each reservation stays counted once,
/// bound to the same container; removing the pod afterwards releases it.
#[test]
fn a_crio_restart_with_pods_running_keeps_each_reservation_once() {
    let mut crio = crio_host("vramgate-crio-restart", STATIC_GPU);
    let pod = crio.run_pod(gpu_pod("gpu", "6Gi", &[]));
    let id = crio.create(&pod, gpu_container("app"));
    crio.start_one(&id).unwrap();
    let before = status(&crio.tb.config_path);
    crio.stop();
    crio.start();
    let listed = crio.containers();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, id);
    assert_eq!(listed[0].2, cri::ContainerState::ContainerRunning as i32, "{listed:?}");
    assert_eq!(reservations(&crio.tb), [(id.clone(), 6 * GIB)]);
    let after = status(&crio.tb.config_path);
    let held = |status: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
        status["gpus"][0]["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["container_id"].clone(), r["bytes"].clone(), r["pid"].clone()))
            .collect()
    };
    assert_eq!(
        held(&after),
        held(&before),
        "the reservation changed across the restart"
    );
    // A second container in the restored pod reserves its own, once.
    let second = crio.create(&pod, gpu_container("second"));
    crio.start_one(&second).unwrap();
    let mut both = reservations(&crio.tb);
    both.sort();
    let mut want = vec![(id.clone(), 6 * GIB), (second.clone(), 6 * GIB)];
    want.sort();
    assert_eq!(both, want);
    let admits = crio
        .events()
        .iter()
        .filter(|e| e["container"] == id.as_str() && e["event"].as_str().is_some_and(|k| k.starts_with("admit")))
        .count();
    assert_eq!(admits, 1, "{:?}", crio.events());
    crio.delete_pod(&pod);
    assert_eq!(reservations(&crio.tb), []);
}

/// The host's 20 GiB GPU held by the running container of pod "big" (returned with its id),
/// and the pod "queued" whose 10 GiB container may wait `timeout` for it.
fn full_gpu_and_a_waiting_pod(crio: &Crio, timeout: &str) -> (Pod, String, Pod) {
    let big = crio.run_pod(gpu_pod("big", "20Gi", &[]));
    let big_id = crio.create(&big, gpu_container("app"));
    crio.start_one(&big_id).unwrap();
    let queued = crio.run_pod(gpu_pod(
        "queued",
        "10Gi",
        &[("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", timeout)],
    ));
    (big, big_id, queued)
}

/// CreateContainer of `config` in `pod` with a 3 s deadline (standing for kubelet's 2 min),
/// which must run out while the container waits in the queue.
fn create_past_its_deadline(crio: &Crio, pod: &Pod, config: cri::ContainerConfig) {
    let created = crio.try_create_within(pod, config, Duration::from_secs(3));
    let err = created.expect_err("CreateContainer returned before its deadline");
    assert!(
        matches!(err.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
        "{err}"
    );
}

/// kubelet puts a deadline on each CRI call (2 min). Under CRI-O a queued admission is in
/// CreateContainer, and CRI-O does not end the creation when the call's deadline passes: it
/// goes on, keeps the result, and hands the container to kubelet's next CreateContainer of
/// the same name. So the waiting hook keeps its place in the queue (giving it up would send
/// the retry to the back), is admitted when memory frees, and the retry gets that container,
/// reserved once.
#[test]
fn a_create_past_its_deadline_keeps_its_place_and_the_retry_gets_the_container() {
    let crio = crio_host("vramgate-crio-deadline", STATIC_GPU);
    let (big, _, pod) = full_gpu_and_a_waiting_pod(&crio, "60s");
    let config = gpu_container("app");

    create_past_its_deadline(&crio, &pod, config.clone());
    // That it keeps its place until memory frees is checked below, against its events.
    let waiting = queued(&crio.tb);
    assert_eq!(waiting.len(), 1, "the queued create left the queue: {waiting:?}");
    let queued_id = waiting[0].0.clone();
    assert!(waiting[0].2, "its waiter is gone: {waiting:?}");

    // Memory frees: the waiting hook is admitted, and kubelet's retry gets that container.
    crio.delete_pod(&big);
    wait_reserved(&crio.tb, &queued_id, 10 * GIB);
    // The retry as kubelet's comes, well after CRI-O has finished the creation and kept it (it
    // logs this line right after). One that comes while CRI-O is still finishing it (on a
    // loaded host, the few ms after the hook's admission) waits out its own deadline and fails
    // with "will be provided to the kubelet on next retry" (CRI-O's getResourceOrWait); the
    // next retry gets the container.
    wait_until(
        "CRI-O kept the created container for the retry",
        Duration::from_secs(30),
        || {
            (
                crio.log()
                    .contains("CreateCtr: context was either canceled or the deadline was exceeded"),
                (),
            )
        },
    );
    let retried = crio.try_create(&pod, config).unwrap_or_else(|e| {
        let log = crio.log();
        let mut tail: Vec<&str> = log.lines().rev().take(60).collect();
        tail.reverse();
        panic!(
            "the retried CreateContainer: {e}\nthe queued container's events: {:?}\ncrio's log, last lines:\n{}",
            crio.events()
                .iter()
                .filter(|e| e["container"] == queued_id.as_str())
                .collect::<Vec<_>>(),
            tail.join("\n")
        )
    });
    // One wait from the enqueue to the admission, never given up or started again (read once
    // the create has returned: the admission is logged after the commit that shows it).
    let queue_kinds = [
        "enqueue",
        "admit",
        "admit_after_wait",
        "timeout",
        "cancel",
        "abandon_ticket",
        "refuse",
    ];
    let kinds: Vec<String> = crio
        .events()
        .iter()
        .filter(|e| e["container"] == queued_id.as_str())
        .map(|e| str_field(e, "event").to_string())
        .filter(|k| queue_kinds.contains(&k.as_str()))
        .collect();
    assert_eq!(kinds, ["enqueue", "admit_after_wait"], "the waiting create's events");
    assert_eq!(retried, queued_id, "the retry made another container");
    crio.start_one(&retried).unwrap();
    assert_eq!(reservations(&crio.tb), [(queued_id.clone(), 10 * GIB)]);
    crio.delete_pod(&pod);
    assert_eq!(reservations(&crio.tb), []);
}

/// Two simulated GPUs of 24 GiB; 20 GiB of GPU 0 is used outside vramgate.
const TWO_GPUS: &str = "[inventory]
backend = \"static\"
[[inventory.gpus]]
index = 0
uuid = \"GPU-00000000-0000-0000-0000-0000000000a0\"
minor = 0
total = \"24Gi\"
used_outside = \"20Gi\"
[[inventory.gpus]]
index = 1
uuid = \"GPU-00000000-0000-0000-0000-0000000000a1\"
minor = 1
total = \"24Gi\"
";

/// The runtime handler `vramgate` from the built `vramgate setup crio` (its drop-in in
/// crio's drop-in directory, as written): a pod on it (RuntimeClass handler `vramgate`) with
/// `vramgate.dev/gpus: auto` is placed by vramgate-runtime on the one GPU with room, its spec
/// narrowed to that GPU, and reserved once although the hooks.d entry runs for it too;
/// removal releases it. `vramgate setup crio --remove` takes away exactly what setup wrote.
#[test]
fn the_vramgate_handler_from_setup_places_and_narrows_under_crio() {
    let (tmp, tb) = wrapper_testbed("vramgate-crio-handler", TWO_GPUS);
    let dir = tb.dir.join("crio");
    let conf_d = dir.join("crio.conf.d");
    std::fs::create_dir_all(&conf_d).unwrap();
    // The admin's own drop-in beside vramgate's, which setup must leave alone.
    std::fs::write(conf_d.join("50-admin.conf"), "[crio.runtime]\nlog_size_max = -1\n").unwrap();
    // vramgate-runtime finds its config at /etc/vramgate/config.toml on a node; here the
    // testbed's is named by a two-line stand-in, since crio gives conmon (which runs the
    // runtime) only the handler's monitor_env, and a second drop-in replaces the whole table.
    let runtime = tb.dir.join("vramgate-runtime");
    std::fs::write(
        &runtime,
        format!(
            "#!/bin/sh\nVRAMGATE_CONFIG={:?} exec {RUNTIME:?} \"$@\"\n",
            tb.config_path.display().to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hooks_elsewhere = tb.dir.join("setup-hooks.d");
    let config_path = tb.config_path.clone();
    let setup = |remove: bool| {
        let mut cmd = std::process::Command::new(VRAMGATE);
        cmd.env("VRAMGATE_CONFIG", &config_path)
            .args(["setup", "crio", "--config-path"])
            .arg(&hooks_elsewhere)
            .arg("--crio-drop-in")
            .arg(conf_d.join("10-vramgate.conf"))
            .arg("--runtime-path")
            .arg(&runtime);
        if remove {
            cmd.arg("--remove");
        }
        run_ok(&mut cmd)
    };
    let out = setup(false);
    assert!(out.contains("10-vramgate.conf"), "{out}");
    let drop_in = std::fs::read_to_string(conf_d.join("10-vramgate.conf")).unwrap();
    assert!(drop_in.contains("[crio.runtime.runtimes.vramgate]"), "{drop_in}");

    let host = HostDirs::note(&["/run/runc"]);
    let mut crio = Crio::launch(tb);
    crio.tmp = Some(tmp);
    let pod = pod_on(
        &crio,
        HANDLER,
        pod_config(
            "placed",
            &[("vramgate.dev/memory", "8Gi"), ("vramgate.dev/gpus", "auto")],
        ),
    );
    // Given both GPUs (the device plugin's env): `auto` chooses among them.
    let id = crio.create(
        &pod,
        container_config("app", RUN_UNTIL_STOPPED, &[("NVIDIA_VISIBLE_DEVICES", "0,1")]),
    );
    crio.start_one(&id).unwrap();
    let by_gpu = reservations_by_gpu(&crio.tb);
    eprintln!("placed: {by_gpu:?}");
    let on: Vec<&String> = by_gpu
        .iter()
        .filter(|(_, held)| held.iter().any(|(c, _)| c == &id))
        .map(|(gpu, _)| gpu)
        .collect();
    assert_eq!(on.len(), 1, "{by_gpu:?}");
    assert!(
        on[0].ends_with("a1") || on[0] == "1",
        "placed on {} (only GPU 1 has room): {by_gpu:?}",
        on[0]
    );
    assert_eq!(reservations(&crio.tb), [(id.clone(), 8 * GIB)]);
    let spec = read_spec(&crio.bundle_spec(&id));
    assert_eq!(
        spec["annotations"]["vramgate.dev/gpus"],
        "GPU-00000000-0000-0000-0000-0000000000a1"
    );
    let env = process_env(&spec);
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-0000000000a1"),
        "{env:?}"
    );
    crio.delete_pod(&pod);
    assert_eq!(reservations(&crio.tb), []);

    // A pod on the handler whose container was given no GPU: `auto` places it on none, and
    // vramgate-runtime writes no GPU into its spec behind the scheduler's back.
    let sneaky = pod_on(
        &crio,
        HANDLER,
        pod_config(
            "sneaky",
            &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "auto")],
        ),
    );
    let id = crio.create(&sneaky, container_config("app", RUN_UNTIL_STOPPED, &[]));
    crio.start_one(&id).unwrap();
    let spec = read_spec(&crio.bundle_spec(&id));
    let env = process_env(&spec);
    assert!(
        !env.iter().any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=")),
        "a GPU was handed out: {env:?}"
    );
    assert_eq!(spec["annotations"]["vramgate.dev/gpus"], "auto");
    assert_eq!(reservations(&crio.tb), []);
    crio.delete_pod(&sneaky);

    // --remove: vramgate's drop-in and hooks.d files go, the admin's drop-in stays, and
    // nothing else is left in crio's drop-in directory (no backup, which crio would read).
    let out = setup(true);
    assert!(out.contains("removed"), "{out}");
    let left: Vec<_> = std::fs::read_dir(&conf_d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["50-admin.conf"]);
    assert_eq!(std::fs::read_dir(&hooks_elsewhere).unwrap().count(), 0);
    drop(crio);
    drop(host);
}

/// kubelet deletes a pod whose CreateContainer waits in the queue (past its deadline, CRI-O
/// still creating). CRI-O's RemovePodSandbox waits for that creation, and the waiting hook
/// does not know its pod is going: the ticket keeps its place until the wait ends with
/// vramgate's timeout refusal (here 10 s; by default `max_wait_timeout`, bounded by CRI-O's own
/// create timeout), and only then does the removal return. Nothing is ever reserved for the
/// removed pod's container, and the GPU serves the next request.
#[test]
fn a_pod_removed_while_its_create_is_queued_holds_its_ticket_until_the_wait_times_out() {
    let crio = crio_host("vramgate-crio-removed", STATIC_GPU);
    let (big, big_id, pod) = full_gpu_and_a_waiting_pod(&crio, "10s");
    let asked = Instant::now();
    create_past_its_deadline(&crio, &pod, gpu_container("app"));
    let waiting = queued(&crio.tb);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let queued_id = waiting[0].0.clone();

    crio.delete_pod(&pod);
    let removed_after = asked.elapsed();
    eprintln!("RemovePodSandbox returned {removed_after:?} after the create was sent");
    assert!(
        removed_after >= Duration::from_secs(9) && removed_after < Duration::from_secs(20),
        "the removal returned {removed_after:?} after the create (the wait times out at 10 s)"
    );
    assert_eq!(queued(&crio.tb), []);
    assert_eq!(reservations(&crio.tb), [(big_id.clone(), 20 * GIB)]);
    assert!(
        !crio.events().iter().any(
            |e| e["container"] == queued_id.as_str() && e["event"].as_str().is_some_and(|k| k.starts_with("admit"))
        ),
        "the removed pod's container was admitted: {:?}",
        crio.events()
    );

    // The GPU serves the next request once the big one is gone.
    crio.delete_pod(&big);
    let next = crio.run_pod(gpu_pod("next", "10Gi", &[]));
    let next_id = crio.create(&next, gpu_container("app"));
    assert_eq!(reservations(&crio.tb), [(next_id, 10 * GIB)]);
    crio.delete_pod(&next);
}
