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

use crate::support;
use crate::support::cri as cri_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::Value;

use cri_support::*;
use support::*;
use vramgate_testbed::Testbed;

/// The host's vramgate config: one simulated 24,265 MiB GPU.
const STATIC_GPU: &str = "[inventory]\nbackend = \"static\"";
const REQUEST: &str = "1205Mi";
const REQUEST_BYTES: u64 = 1205 << 20;
/// How many 1205 MiB requests the simulated 24,265 MiB GPU holds.
const FIT: usize = 20;

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
/// state; the ledger's own invariants are held to every state by tests/it/concurrency.rs.
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
/// What the device plugin gives a container on GPU 0: a pod's containers get GPUs from the
/// scheduler alone, and the pod's `vramgate.dev/gpus` only chooses among those.
const GIVEN_GPU_0: (&str, &str) = ("NVIDIA_VISIBLE_DEVICES", "0");

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

#[test]
fn of_25_pods_under_reject_20_run_and_5_are_refused() {
    of_25_pods_under_reject_20_run_and_5_are_refused_on(Containerd::Debian);
}

#[test]
fn of_25_pods_under_reject_20_run_and_5_are_refused_on_containerd_2() {
    of_25_pods_under_reject_20_run_and_5_are_refused_on(Containerd::Two);
}

fn of_25_pods_under_reject_20_run_and_5_are_refused_on(containerd: Containerd) {
    let started = Instant::now();
    let cri = cri_host_on(containerd, "vramgate-cri-reject", STATIC_GPU);
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
        .map(|pod| cri.create(pod, container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0])))
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
        .map(|pod| cri.create(pod, container_config("job", &["/bin/sleep", "2"], &[GIVEN_GPU_0])))
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
    in_a_pod_with_a_sidecar_only_the_gpu_container_reserves_on(Containerd::Debian);
}

#[test]
fn in_a_pod_with_a_sidecar_only_the_gpu_container_reserves_on_containerd_2() {
    in_a_pod_with_a_sidecar_only_the_gpu_container_reserves_on(Containerd::Two);
}

fn in_a_pod_with_a_sidecar_only_the_gpu_container_reserves_on(containerd: Containerd) {
    let cri = cri_host_on(containerd, "vramgate-cri-sidecar", STATIC_GPU);
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
    // Shown as the pod's namespace, the pod and the container, from the CRI plugin's keys.
    support::assert_shown_as(
        &cri.tb.config_path,
        &cri.tb.state_dir,
        &gpu,
        Some("default/trainer/gpu"),
    );
    assert_eq!(
        vramgate_hook_stages(&cri.bundle_spec(&gpu)),
        ["createRuntime", "poststop"]
    );
    for id in [&pod.sandbox, &sidecar] {
        assert!(vramgate_hook_stages(&cri.bundle_spec(id)).is_empty(), "{id} got hooks");
    }

    // `vramgate.dev/gpus` on the pod chooses among the GPUs each container was given, and
    // gives none to a container given none: the one given GPU 0 (the device plugin's env)
    // reserves on it, the one given nothing reserves nothing. (A CUDA image's
    // NVIDIA_VISIBLE_DEVICES=all gives no GPU in a pod: tests/it/nvidia_toolkit.rs.)
    let pods2 = run_all(
        &cri,
        vec![pod_config(
            "both",
            &[("vramgate.dev/memory", REQUEST), ("vramgate.dev/gpus", "0")],
        )],
    );
    let a = cri.create(
        &pods2[0],
        container_config("a", RUN_UNTIL_STOPPED, &[("NVIDIA_VISIBLE_DEVICES", "0")]),
    );
    let b = cri.create(&pods2[0], container_config("b", RUN_UNTIL_STOPPED, &[]));
    cri.start_one(&a).unwrap();
    cri.start_one(&b).unwrap();
    let mut held = reservations(&cri.tb);
    held.sort();
    let mut want = vec![(gpu.clone(), REQUEST_BYTES), (a.clone(), REQUEST_BYTES)];
    want.sort();
    assert_eq!(held, want, "b, given no GPU, reserved one");
    assert!(vramgate_hook_stages(&cri.bundle_spec(&b)).is_empty(), "b got hooks");

    cri.delete_pods(&pods);
    cri.delete_pods(&pods2);
    assert_eq!(reservations(&cri.tb), []);
}

/// KAI's GPU fractioning writes NVIDIA's request vocabulary on the pod, per container:
/// `nvidia.com/container.<name>.gpu-memory.request` and `.limit` (whole MiB). containerd copies
/// the pod's annotations into each container's spec only where its runtime allows them
/// (`vramgate setup containerd` allows `nvidia.com/container.*`), and names the container in
/// `io.kubernetes.cri.container-name`. The named container reserves its request (its limit
/// kept beside it), the sidecar beside it on the same GPU does not;
/// a pod whose vramgate amount disagrees with NVIDIA's is refused at StartContainer with the
/// line that names both.
#[test]
fn kais_annotations_reserve_for_the_container_they_name() {
    kais_annotations_reserve_for_the_container_they_name_on(Containerd::Debian);
}

#[test]
fn kais_annotations_reserve_for_the_container_they_name_on_containerd_2() {
    kais_annotations_reserve_for_the_container_they_name_on(Containerd::Two);
}

fn kais_annotations_reserve_for_the_container_they_name_on(containerd: Containerd) {
    let cri = cri_host_on(containerd, "vramgate-cri-kai", STATIC_GPU);
    let pods = run_all(
        &cri,
        vec![pod_config(
            "kai",
            &[
                ("nvidia.com/container.trainer.gpu-memory.request", "1024"),
                ("nvidia.com/container.trainer.gpu-memory.limit", "2048"),
            ],
        )],
    );
    let gpu = [("NVIDIA_VISIBLE_DEVICES", "0")];
    let trainer = cri.create(&pods[0], container_config("trainer", RUN_UNTIL_STOPPED, &gpu));
    let sidecar = cri.create(&pods[0], container_config("sidecar", RUN_UNTIL_STOPPED, &gpu));
    cri.start_one(&trainer).unwrap();
    cri.start_one(&sidecar)
        .unwrap_or_else(|e| panic!("the sidecar, which KAI's annotations do not name, was refused: {e}"));
    assert_eq!(reservations(&cri.tb), [(trainer.clone(), 1024 << 20)]);

    let disagree = run_all(
        &cri,
        vec![pod_config(
            "kai-disagrees",
            &[
                ("vramgate.dev/memory", "1Gi"),
                ("nvidia.com/container.app.gpu-memory.limit", "4096"),
            ],
        )],
    );
    let app = cri.create(&disagree[0], container_config("app", RUN_UNTIL_STOPPED, &gpu));
    let err = cri
        .start_one(&app)
        .expect_err("a pod whose two vocabularies disagree started");
    assert!(
        err.message().contains("nvidia.com/container.app.gpu-memory.limit")
            && err.message().contains("vramgate.dev/memory"),
        "{}",
        err.message()
    );
    assert_eq!(reservations(&cri.tb), [(trainer.clone(), 1024 << 20)]);

    cri.delete_pods(&pods);
    cri.delete_pods(&disagree);
    assert_eq!(reservations(&cri.tb), []);
}

/// kubelet puts a deadline on each CRI call (`--runtime-request-timeout`, 2 min by default).
/// When a StartContainer whose admission is queued passes it, containerd gives up on the task:
/// the runc shim SIGKILLs the waiting wrapper (vramgate-runtime admits at create, before `runc
/// create`), the bundle goes, and the container is marked exited (`StartError`); kubelet would
/// then create a new attempt. containerd 1.6 and 1.7 also run `delete --force` of the
/// container through the wrapper; 2.1 runs nothing more.
///
/// On containerd 1.6, 1.7 and 2.1 alike, the place in the queue must be given up at once
/// (at once after the cancel, the ticket is out of the ledger and out of `vramgate status`,
/// table and JSON), and nothing ever admitted for the dead container. Measured before the
/// queue guard (this VM): on 2.1.9 the ticket stayed in the ledger, listed by `status` at the
/// head of the queue with its waiter gone, more than 10 s (until some other transaction ran);
/// on 1.6.20 and 1.7.24 the `delete` dropped it within 0.2 s. Earlier still, before the
/// waiter watched its container, it kept the head of the queue until its own wait timeout.
#[test]
fn a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue() {
    a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on(Containerd::Debian);
}

#[test]
fn a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on_containerd_1_7() {
    a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on(Containerd::Seven);
}

#[test]
fn a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on_containerd_2() {
    a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on(Containerd::Two);
}

fn a_start_cancelled_by_its_deadline_gives_up_its_place_in_the_queue_on(containerd: Containerd) {
    let cri = cri_host_on(containerd, "vramgate-cri-deadline", STATIC_GPU);
    let big = run_all(
        &cri,
        vec![pod_config(
            "big",
            &[("vramgate.dev/memory", "20Gi"), ("vramgate.dev/gpus", "0")],
        )],
    );
    let big_id = cri.create(&big[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
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
    let id = cri.create(&pods[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));

    // A 3 s deadline stands for kubelet's 2 min.
    let mut client = cri.runtime.clone();
    let request = with_deadline(
        cri::StartContainerRequest {
            container_id: id.clone(),
        },
        Duration::from_secs(3),
    );
    let started = cri.block_on(async move { client.start_container(request).await });
    let cancelled = Instant::now();
    let err = started.expect_err("StartContainer returned before its deadline");
    assert!(
        matches!(err.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
        "{err}"
    );
    // At once after the cancel, whatever containerd does with the waiting wrapper (1.6
    // kills it and runs `delete --force` through the wrapper; 2.1 kills it and deletes
    // nothing), the ticket is out of the ledger and out of `vramgate status`, as its table
    // and as JSON: a dead ticket listed at the head of the queue tells an operator the GPU is
    // spoken for when it is not.
    eprintln!("after the cancel:\n{}", processes("vramgate-runtim"));
    let in_ledger = || ledger_queue(&cri.tb).contains(&id);
    let in_json = || queued(&cri.tb).iter().any(|(c, _, _)| c == &id);
    let in_table = || status_table(&cri.tb).contains(&id[..24]);
    // Without the guard, the ticket stayed until some other transaction ran or until its 20 s
    // timeout: a bound well under that, sized for a loaded machine, tells the two apart. How
    // soon it left is printed, not asserted.
    let left = (|| {
        while cancelled.elapsed() < LOADED_MACHINE_BOUND {
            if !in_ledger() && !in_json() && !in_table() {
                return Some(cancelled.elapsed());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        None
    })();
    eprintln!("the ticket left the ledger and the status {left:?} after the cancel");
    assert!(
        left.is_some(),
        "the cancelled start was still queued {LOADED_MACHINE_BOUND:?} after the cancel: \
         in the ledger {}, in status --json {}, in status {}\n{}",
        in_ledger(),
        in_json(),
        in_table(),
        processes("vramgate-runtim")
    );
    // The guard that dropped it (or found the delete had) does not linger.
    eventually("the queue guard ends", Duration::from_secs(5), || {
        !processes("--vramgate-queue-guard").contains(&id)
    });
    wait_until("containerd marks the start failed", Duration::from_secs(10), || {
        let s = cri.container_status(&id);
        (
            s.state == cri::ContainerState::ContainerExited as i32 && s.reason == "StartError",
            (s.state, s.reason, s.message),
        )
    });

    // Memory frees (its release is logged): nothing is admitted for the container that never
    // started, and no process of its create is left that could still be.
    cri.delete_pods(&big);
    wait_until("the big pod's release is logged", Duration::from_secs(15), || {
        let events = cri.events();
        let released = events
            .iter()
            .any(|e| e["event"] == "release" && e["container"] == big_id.as_str());
        (released, events)
    });
    assert_eq!(processes(&id), "", "a process of the cancelled start is left");
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
    // The next request on that GPU is served.
    let next = run_all(
        &cri,
        vec![pod_config(
            "next",
            &[("vramgate.dev/memory", "10Gi"), ("vramgate.dev/gpus", "0")],
        )],
    );
    let next_id = cri.create(&next[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
    cri.start_one(&next_id).unwrap();
    assert_eq!(
        reservations(&cri.tb).iter().filter(|(c, _)| c == &next_id).count(),
        1,
        "{:?}",
        reservations(&cri.tb)
    );
    // Still nothing for the dead container, after a later admission on its GPU.
    assert!(!cri
        .events()
        .iter()
        .any(|e| e["container"] == id.as_str() && e["event"].as_str().is_some_and(|k| k.starts_with("admit"))));
    cri.delete_pods(&next);
    cri.delete_pods(&pods);
}

/// Issue 43, item 5, through containerd 2.1's CRI as kubelet drives it: a big pod's start
/// waits, kubelet's deadline cancels it (containerd's shim kills the waiting wrapper, and the
/// queue guard drops its ticket), and kubelet retries it as a new container of the same pod
/// with the same name. The retry must take the ticket number and the age of its first attempt,
/// so that once `backfill_bound` has passed since that first attempt, a smaller pod that fits
/// no longer passes it; within the bound one still does (backfill is on). Before, the retry
/// queued at the back with a fresh age, and the smaller pod sent after the bound passed it.
#[test]
fn a_start_retried_after_its_deadline_keeps_its_place_on_containerd_2() {
    // The bound, and kubelet's deadline (a stand-in for its 2 min): the retry's own ticket is
    // at least DEADLINE younger than its first attempt, so a pod sent just past BOUND after the
    // first attempt comes within BOUND of the retry (where a fresh age would let it pass).
    const BOUND: Duration = Duration::from_secs(15);
    const DEADLINE: Duration = Duration::from_secs(5);
    // Generous for a loaded 2-core machine: how far past the bound the late pod is sent.
    const PAST_THE_BOUND: Duration = Duration::from_millis(1500);
    let config = format!("[queue]\nbackfill = true\nbackfill_bound = \"15s\"\n{STATIC_GPU}");
    let cri = cri_host_on(Containerd::Two, "vramgate-cri-retry", &config);
    let holder = run_all(
        &cri,
        vec![pod_config(
            "holder",
            &[("vramgate.dev/memory", "20Gi"), ("vramgate.dev/gpus", "0")],
        )],
    );
    let holder_id = cri.create(&holder[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
    cri.start_one(&holder_id).unwrap();
    let big = run_all(
        &cri,
        vec![pod_config(
            "big",
            &[
                ("vramgate.dev/memory", "10Gi"),
                ("vramgate.dev/gpus", "0"),
                ("vramgate.dev/policy", "wait"),
                ("vramgate.dev/timeout", "60s"),
            ],
        )],
    );
    let first_id = cri.create(&big[0], container_config("train", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
    let mut client = cri.runtime.clone();
    let request = with_deadline(
        cri::StartContainerRequest {
            container_id: first_id.clone(),
        },
        DEADLINE,
    );
    let first = cri.rt.spawn(async move { client.start_container(request).await });
    // The client's runtime runs on this thread only: the spawned calls go on while it is driven.
    let drive = || cri.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    let (first_ticket, first_enqueued) = wait_until("the first start queues", Duration::from_secs(30), || {
        drive();
        let t = ledger_ticket(&cri.tb, &first_id);
        (t.is_some(), t)
    })
    .unwrap();
    let err = cri
        .block_on(first)
        .unwrap()
        .expect_err("StartContainer returned before its deadline");
    assert!(
        matches!(err.code(), tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
        "{err}"
    );
    wait_until("the cancelled start leaves the queue", Duration::from_secs(10), || {
        let q = ledger_queue(&cri.tb);
        (q.is_empty(), q)
    });

    // kubelet's retry: a new container in the same sandbox, with the same name.
    let mut retry_config = container_config("train", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]);
    retry_config.metadata.as_mut().unwrap().attempt = 1;
    let retry_id = cri.create(&big[0], retry_config);
    // A ticket of the retry's own is taken after this instant.
    let retry_sent = now_unix_ms();
    let retry = cri.rt.spawn(start_container(cri.runtime.clone(), retry_id.clone()));
    let (retry_ticket, retry_enqueued) = wait_until("the retry queues", Duration::from_secs(30), || {
        drive();
        let t = ledger_ticket(&cri.tb, &retry_id);
        (t.is_some(), t)
    })
    .unwrap();
    eprintln!(
        "first attempt: ticket {first_ticket} at {first_enqueued}; retry: ticket {retry_ticket} at {retry_enqueued}"
    );
    assert_eq!(
        (retry_ticket, retry_enqueued),
        (first_ticket, first_enqueued),
        "the retry takes its first attempt's ticket number and age"
    );

    // Within the bound a pod that fits passes the waiting retry (backfill)...
    let small = |name: &str| pod_config(name, &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    let early = run_all(&cri, vec![small("early")]);
    let early_id = cri.create(&early[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
    let early_at = now_unix_ms().saturating_sub(first_enqueued);
    let started = cri.start_one(&early_id);
    assert!(
        started.is_ok(),
        "{early_at} ms after the first attempt (bound {BOUND:?}) a pod that fits passes: {started:?}"
    );
    // ...and once the bound has passed since the first attempt, none does, although the retry
    // itself has waited less than the bound.
    let late = run_all(&cri, vec![small("late")]);
    let late_id = cri.create(&late[0], container_config("app", RUN_UNTIL_STOPPED, &[GIVEN_GPU_0]));
    let send_at = first_enqueued + (BOUND + PAST_THE_BOUND).as_millis() as u64;
    let pause = Duration::from_millis(send_at.saturating_sub(now_unix_ms()));
    cri.block_on(async { tokio::time::sleep(pause).await });
    let retry_age = Duration::from_millis(now_unix_ms().saturating_sub(retry_sent));
    let refused = cri
        .start_one(&late_id)
        .expect_err("a pod passed the retried start past the bound");
    assert!(
        refused
            .message()
            .contains("asked first and is waiting for the same GPU"),
        "{refused}"
    );
    eprintln!("the late pod was refused; the retry itself had waited {retry_age:?} at most");
    assert!(
        retry_age < BOUND,
        "the late pod came {retry_age:?} after the retry, past the bound: the check says nothing"
    );

    // Memory frees: the retry is admitted.
    cri.delete_pods(&holder);
    cri.block_on(retry).unwrap().unwrap();
    assert_eq!(
        reservations(&cri.tb).iter().filter(|(c, _)| c == &retry_id).count(),
        1,
        "{:?}",
        reservations(&cri.tb)
    );
    cri.delete_pods(&late);
    cri.delete_pods(&early);
    cri.delete_pods(&big);
}

/// The number and enqueue time (wall clock, ms) of `container`'s ticket in the ledger file.
fn ledger_ticket(tb: &Testbed, container: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(tb.state_dir.join("ledger.json")).unwrap();
    let ledger: Value = serde_json::from_str(&text).unwrap();
    let t = ledger["queue"]
        .as_array()?
        .iter()
        .find(|t| t["container_id"] == container)?;
    Some((t["ticket"].as_u64()?, t["enqueued_unix_ms"].as_u64()?))
}

fn now_unix_ms() -> u64 {
    vramgate::ledger::now_unix_ms()
}

/// The container ids of the ledger's queue, read from the ledger file itself (not through the
/// status, which could hide a ticket the ledger still holds).
fn ledger_queue(tb: &Testbed) -> Vec<String> {
    let text = std::fs::read_to_string(tb.state_dir.join("ledger.json")).unwrap();
    let ledger: Value = serde_json::from_str(&text).unwrap();
    ledger["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["container_id"].as_str().unwrap().to_string())
        .collect()
}

/// `vramgate status` as an operator reads it.
fn status_table(tb: &Testbed) -> String {
    status_output(&tb.config_path, &[])
}

/// The processes whose command line has `word`, for a failure's message.
fn processes(word: &str) -> String {
    let out = std::process::Command::new("ps")
        .args(["-eo", "pid,ppid,pgid,sid,stat,args"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(word) && !l.contains("rustc"))
        .collect::<Vec<_>>()
        .join("\n")
}
