//! Every claim the scheduler's allocator can produce for this driver runs on the node (issue
//! 35, items 2 and 3): a claim of `count: 2` and one of `allocationMode: All` (the same amount
//! on several GPUs) become one container reservation with a share on each GPU; two requests
//! that land on one GPU add up; a claim's init container and its app container are counted
//! once; different amounts on different GPUs are refused at the container's start with one
//! line, and a container given one request's devices runs. And the slice lists its devices in
//! ascending order of capacity, so that the allocator's first fit is the node's best fit when
//! a container outside Kubernetes already uses one GPU.
//!
//! The built `vramgate-dra` runs between the stand-in kubelet and the stand-in API server
//! (tests/support/dra.rs); the claims' containers are real runc containers with the vramgate
//! hook (and, for the placement, vramgate-runtime), started from the env of the CDI devices
//! the driver wrote, merged as a CDI runtime merges them (by name, the last device winning).
//! The scheduler's allocation is Kubernetes' own allocator's ([`allocate`]: the 1.36 allocator
//! built by scripts/fetch-dra-allocator), from the slice the driver published.
//!
//! Why stand-ins here: each claim shape (`allocationMode: All`, two requests on one GPU,
//! different amounts on different GPUs, a forged CDI device) is made and prepared in well under
//! a second, dozens per run, and some are shapes kube-scheduler would not produce for a real
//! pod. Claims through the real kubelet 1.36.3 and kube-scheduler (one on two GPUs, one shared
//! by two containers) run in tests/kube_node.rs.

use crate::support;
use crate::support::dra as dra_support;
use crate::support::kubelet;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use dra_support::*;
use kubelet::claim;
use support::*;

const NODE: &str = "node-a";
const GPUS: &str = "[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n\
    [[inventory.gpus]]\nindex = 1\nuuid = \"GPU-one\"\ntotal = \"16Gi\"\n";
const GI: u64 = 1 << 30;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Creates claim `name` with `requests` (its `spec.devices.requests`); returns its uid.
fn create_claim(rt: &tokio::runtime::Runtime, api: &ApiServer, name: &str, requests: Value) -> String {
    rt.block_on(api.create_claim_spec("default", name, json!({"requests": requests})))
}

/// A request of this driver's class for `memory`, `exactly`, with `extra` fields (`count`,
/// `allocationMode`).
fn request(name: &str, memory: &str, extra: Value) -> Value {
    let mut exactly = json!({"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}});
    for (k, v) in extra.as_object().unwrap() {
        exactly[k] = v.clone();
    }
    json!({"name": name, "exactly": exactly})
}

/// The scheduler's decision for claim `name`, made by Kubernetes' own allocator (1.36's, with
/// 1.36's default features: tests/support/allocator.rs) from the node's slice as the driver
/// published it, the DeviceClass of k8s/dra.yaml and every claim allocated before it, written
/// into the claim's `status.allocation` as kube-scheduler writes it. Returns the results.
fn allocate(rt: &tokio::runtime::Runtime, api: &ApiServer, name: &str) -> Vec<Value> {
    let allocation = rt.block_on(api.schedule_one("default", name, NODE));
    allocation["devices"]["results"].as_array().unwrap().clone()
}

/// `pairs` as owned strings, to compare with [`decided`] and the capacities.
fn want(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// The (device, memory) of each result, in order.
fn decided(results: &[Value]) -> Vec<(String, String)> {
    results
        .iter()
        .map(|r| {
            (
                r["device"].as_str().unwrap().to_string(),
                r["consumedCapacity"]["memory"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The stand-in API server for node-a and the built driver on `tb` (CDI specs in its `cdi`
/// directory), registered as kubelet registers it, once its slice publishes both GPUs whole.
fn driver_on(tb: &vramgate_testbed::Testbed) -> (tokio::runtime::Runtime, ApiServer, Driver, kubelet::Registered) {
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    let driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    (rt, api, driver, registered)
}

/// The API server rejected none of the driver's writes.
fn assert_nothing_rejected(rt: &tokio::runtime::Runtime, api: &ApiServer) {
    let rejected = rt.block_on(api.rejected());
    assert!(rejected.is_empty(), "{rejected:#?}");
}

/// The container's env as a CDI runtime leaves it after applying the CDI devices `ids` (as
/// kubelet lists them, a device once per result) from the driver's spec files in `cdi_dir`:
/// each device's env in turn, a variable replacing one of the same name.
fn cdi_env(cdi_dir: &Path, ids: &[String]) -> Vec<String> {
    let mut env: Vec<String> = Vec::new();
    for id in ids {
        let name = id.strip_prefix("vramgate.dev/gpu-memory=").expect("vramgate's CDI id");
        let uid = &name[..36];
        let spec: Value = serde_json::from_slice(
            &std::fs::read(cdi_dir.join(format!("vramgate.dev-gpu-memory_{uid}.json"))).unwrap(),
        )
        .unwrap();
        let device = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {spec}"));
        for entry in device["containerEdits"]["env"].as_array().unwrap() {
            let entry = entry.as_str().unwrap().to_string();
            let key = entry.split_once('=').unwrap().0.to_string();
            match env.iter_mut().find(|e| e.split_once('=').unwrap().0 == key) {
                Some(same) => *same = entry,
                None => env.push(entry),
            }
        }
    }
    env
}

/// Prepares claim `uid`; its devices' CDI ids as kubelet hands them to a container that names
/// the claim (every result), or only request `only`'s.
fn prepare(
    rt: &tokio::runtime::Runtime,
    endpoint: &Path,
    name: &str,
    uid: &str,
    only: Option<&str>,
) -> Result<Vec<String>, String> {
    let answer = rt.block_on(kubelet::prepare(endpoint, vec![claim("default", name, uid)]));
    let prepared = &answer.claims[uid];
    if !prepared.error.is_empty() {
        return Err(prepared.error.clone());
    }
    Ok(prepared
        .devices
        .iter()
        .filter(|d| only.is_none_or(|r| d.request_names.iter().any(|n| n == r)))
        .flat_map(|d| d.cdi_device_ids.clone())
        .filter(|id| id.starts_with("vramgate.dev/"))
        .collect())
}

/// A bundle running `args`, with `annotations` and its own `env`, given the CDI devices `ids`
/// as a CDI runtime applies the driver's spec: its env, device nodes and hooks (vramgate's
/// hooks come from the spec, as on a node; none are added here).
fn claim_bundle(
    tb: &vramgate_testbed::Testbed,
    id: &str,
    args: &[&str],
    annotations: &[(&str, &str)],
    env: &[&str],
    ids: &[String],
) -> std::path::PathBuf {
    let bundle = tb.bundle(id, args, annotations, env, false).unwrap();
    apply_cdi(&bundle, &tb.dir.join("cdi"), ids);
    bundle
}

/// `runc run` of a container given the CDI devices `ids` (env and hooks from the driver's spec)
/// in the background.
fn start(tb: &vramgate_testbed::Testbed, id: &str, args: &[&str], ids: &[String]) -> std::process::Child {
    let bundle = claim_bundle(tb, id, args, &[], &[], ids);
    tb.runc_run(&bundle, id)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn stop(tb: &vramgate_testbed::Testbed, id: &str, child: &mut std::process::Child) {
    tb.runc(&["kill", id, "KILL"]).status().unwrap();
    let _ = child.wait();
    wait_released(tb, id);
}

/// Removes every container of a wrapper testbed however the test ends: its `runc` is
/// vramgate-runtime, which reads the testbed's config to pass `list` and `delete` on.
struct WrapperCleanup<'a>(&'a vramgate_testbed::Testbed);

impl Drop for WrapperCleanup<'_> {
    fn drop(&mut self) {
        let (key, value) = self.0.env();
        let Ok(out) = self.0.runc(&["list", "-q"]).env(key, &value).output() else {
            return;
        };
        for id in String::from_utf8_lossy(&out.stdout).lines() {
            let _ = self
                .0
                .runc(&["delete", "--force", id])
                .env(key, &value)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

fn capacities(rt: &tokio::runtime::Runtime, api: &ApiServer) -> Vec<(String, String)> {
    rt.block_on(api.capacities(NODE))
}

fn wait_capacities(rt: &tokio::runtime::Runtime, api: &ApiServer, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want.iter().map(|(d, c)| (d.to_string(), c.to_string())).collect();
    wait_until("the slice's capacities", Duration::from_secs(10), || {
        let now = capacities(rt, api);
        (now == want, now)
    });
}

/// The shares of reservation `id` in the ledger: (GPU, bytes), by GPU.
fn shares_of(tb: &vramgate_testbed::Testbed, id: &str) -> Vec<(String, u64)> {
    reservations_by_gpu(tb)
        .into_iter()
        .filter_map(|(gpu, list)| {
            list.into_iter()
                .find(|(container, _)| container == id)
                .map(|(_, bytes)| (gpu, bytes))
        })
        .collect()
}

/// `count: 2` and `allocationMode: All`: one share on each GPU, one reservation of that amount
/// on both GPUs, and the published capacity unchanged by it (the scheduler counts the claim on
/// both already). A claim's init container, gone before the app container starts, is counted
/// once: the app container fits where the two together would not.
#[test]
fn a_claim_on_several_gpus_is_one_reservation_with_a_share_on_each() {
    let (dir, tb) = runc_testbed("vramgate-dra-claims-many", GPUS);
    let cleanup = Cleanup(&tb);
    let (rt, api, driver, registered) = driver_on(&tb);

    // count: 2, 4 GiB each.
    let pair = create_claim(&rt, &api, "pair", json!([request("gpu", "4Gi", json!({"count": 2}))]));
    let results = allocate(&rt, &api, "pair");
    assert_eq!(decided(&results), want(&[("gpu-0", "4Gi"), ("gpu-1", "4Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "pair", &pair, None).expect("a claim on two GPUs is prepared");
    assert_eq!(
        ids,
        [
            format!("vramgate.dev/gpu-memory={pair}-gpu-0"),
            format!("vramgate.dev/gpu-memory={pair}-gpu-1")
        ]
    );
    let mut main = start(&tb, "pair-main", &["sleep", "60"], &ids);
    wait_until("pair-main's reservation", Duration::from_secs(10), || {
        let shares = shares_of(&tb, "pair-main");
        (
            shares == [("GPU-zero".to_string(), 4 * GI), ("GPU-one".to_string(), 4 * GI)],
            shares,
        )
    });
    // One entry in the ledger, with a share on each GPU.
    let ledger: Value = serde_json::from_slice(&std::fs::read(tb.dir.join("state/ledger.json")).unwrap()).unwrap();
    let entries = ledger["reservations"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{ledger}");
    assert_eq!(
        entries[0]["gpus"],
        json!([{"uuid": "GPU-zero", "bytes": 4 * GI}, {"uuid": "GPU-one", "bytes": 4 * GI}]),
        "{ledger}"
    );
    // The claim's container holds on both GPUs as the claim's: the capacity stays (a change
    // elsewhere shows a view computed after the reservation).
    let mut nudge = spawn_container(
        &tb,
        "nudge",
        &["sleep", "60"],
        &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "GPU-zero")],
    );
    wait_reserved(&tb, "nudge", GI);
    wait_capacities(&rt, &api, &[("gpu-0", "15Gi"), ("gpu-1", "16Gi")]);
    stop(&tb, "nudge", &mut nudge);
    stop(&tb, "pair-main", &mut main);

    // allocationMode: All, 10 GiB on every GPU. Its init container runs and exits (kubelet
    // leaves an exited init container in place until the pod goes, so no poststop releases
    // it); the app container then needs the same 10 GiB on both GPUs, which the two together
    // would not have (16 GiB each, less the 4 GiB the first claim is still allocated).
    let every = create_claim(
        &rt,
        &api,
        "every",
        json!([request("gpu", "10Gi", json!({"allocationMode": "All"}))]),
    );
    let results = allocate(&rt, &api, "every");
    assert_eq!(decided(&results), want(&[("gpu-0", "10Gi"), ("gpu-1", "10Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "every", &every, None).expect("allocationMode All is prepared");
    let bundle = claim_bundle(&tb, "every-init", &["true"], &[], &[], &ids);
    // Its output to a file: the created container keeps the stdio it inherited, and a pipe
    // would never reach its end.
    let said = tempfile::NamedTempFile::new_in(&tb.dir).unwrap();
    let created = tb
        .runc(&["create", "--bundle", bundle.to_str().unwrap(), "every-init"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(said.reopen().unwrap())
        .status()
        .unwrap();
    assert!(
        created.success(),
        "init create: {}",
        std::fs::read_to_string(said.path()).unwrap()
    );
    assert_eq!(
        shares_of(&tb, "every-init"),
        [("GPU-zero".to_string(), 10 * GI), ("GPU-one".to_string(), 10 * GI)]
    );
    let out = tb.runc(&["start", "every-init"]).output().unwrap();
    assert!(out.status.success(), "init start: {}", stderr(&out));
    wait_until("the init container to exit", Duration::from_secs(10), || {
        let state = tb.runc(&["state", "every-init"]).output().unwrap();
        let status = serde_json::from_slice::<Value>(&state.stdout).map(|s| s["status"].clone());
        (status.as_ref().is_ok_and(|s| s == "stopped"), status.ok())
    });
    let mut app = start(&tb, "every-app", &["sleep", "60"], &ids);
    wait_until("every-app's reservation", Duration::from_secs(10), || {
        let shares = shares_of(&tb, "every-app");
        (
            shares == [("GPU-zero".to_string(), 10 * GI), ("GPU-one".to_string(), 10 * GI)],
            shares,
        )
    });
    assert!(
        shares_of(&tb, "every-init").is_empty(),
        "the exited init container's reservation went: {:?}",
        reservations(&tb)
    );
    stop(&tb, "every-app", &mut app);
    let _ = tb.runc(&["delete", "--force", "every-init"]).status();

    assert_nothing_rejected(&rt, &api);
    // Containers first: their testbed (config, runc root) goes with `dir`.
    drop(cleanup);
    drop(driver);
    drop(dir);
}

/// Two requests of one claim: both on one GPU add up to one share there; on two GPUs with
/// different amounts, a container given both is refused at its start with one line saying
/// what to write instead, and a container given one request's device runs with its amount.
#[test]
fn two_requests_add_up_on_one_gpu_and_different_amounts_on_two_are_refused_at_start() {
    let (dir, tb) = runc_testbed("vramgate-dra-claims-two", GPUS);
    let cleanup = Cleanup(&tb);
    let (rt, api, driver, registered) = driver_on(&tb);

    // 2 GiB and 4 GiB: first fit puts both on gpu-0.
    let both = create_claim(
        &rt,
        &api,
        "both",
        json!([request("small", "2Gi", json!({})), request("large", "4Gi", json!({}))]),
    );
    let results = allocate(&rt, &api, "both");
    assert_eq!(decided(&results), want(&[("gpu-0", "2Gi"), ("gpu-0", "4Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "both", &both, None).expect("two requests on one GPU are prepared");
    assert_eq!(
        ids,
        [
            format!("vramgate.dev/gpu-memory={both}-gpu-0"),
            format!("vramgate.dev/gpu-memory={both}-gpu-0")
        ],
        "one CDI device for the GPU, named by each result"
    );
    let mut main = start(&tb, "both-main", &["sleep", "60"], &ids);
    wait_reserved(&tb, "both-main", 6 * GI);
    assert_eq!(shares_of(&tb, "both-main"), [("GPU-zero".to_string(), 6 * GI)]);
    stop(&tb, "both-main", &mut main);
    // Back to the claim, which holds it while it is allocated (the allocator below counts it).
    let both_id = format!("claim-{both}");
    assert_eq!(reservations(&tb), [(both_id.clone(), 6 * GI)]);

    // 8 GiB and 6 GiB: gpu-0 has 10 GiB left, so the 6 GiB go to gpu-1.
    let apart = create_claim(
        &rt,
        &api,
        "apart",
        json!([request("large", "8Gi", json!({})), request("small", "6Gi", json!({}))]),
    );
    let results = allocate(&rt, &api, "apart");
    assert_eq!(decided(&results), want(&[("gpu-0", "8Gi"), ("gpu-1", "6Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "apart", &apart, None).expect("prepared: each device alone runs");
    let bundle = claim_bundle(&tb, "apart-main", &["true"], &[], &[], &ids);
    let out = tb.runc_run(&bundle, "apart-main").output().unwrap();
    let said = stderr(&out);
    eprintln!("a container given both devices: {said}");
    assert!(!out.status.success());
    assert!(
        said.contains("different amounts on different GPUs (8192 MiB on GPU-zero, 6144 MiB on GPU-one)")
            && said.contains("resources.claims[].request"),
        "{said}"
    );
    // Nothing of the container; the claim's own reservation, made by the driver at its
    // allocation (issue 56), holds both requests (beside the first claim's).
    let claim_id = format!("claim-{apart}");
    wait_until("only the claim's own reservation", Duration::from_secs(10), || {
        let now = reservations(&tb);
        let want = [
            (both_id.clone(), 6 * GI),
            (claim_id.clone(), 8 * GI),
            (claim_id.clone(), 6 * GI),
        ];
        (now == want, now)
    });
    // A container that names only the small request gets only its device, and takes over
    // that much of the claim's reservation: the claim keeps holding the other 8 GiB.
    let only = prepare(&rt, &registered.endpoint, "apart", &apart, Some("small")).unwrap();
    let mut small = start(&tb, "apart-small", &["sleep", "60"], &only);
    wait_reserved(&tb, "apart-small", 6 * GI);
    assert_eq!(shares_of(&tb, "apart-small"), [("GPU-one".to_string(), 6 * GI)]);
    assert_eq!(shares_of(&tb, &claim_id), [("GPU-zero".to_string(), 8 * GI)]);
    stop(&tb, "apart-small", &mut small);

    assert_nothing_rejected(&rt, &api);
    // Containers first: their testbed (config, runc root) goes with `dir`.
    drop(cleanup);
    drop(driver);
    drop(dir);
}

/// A container outside Kubernetes holds 10 GiB of GPU-one. The slice publishes gpu-1's
/// capacity as 6 GiB (the ledger's view: what is left for Kubernetes) and lists it first, so
/// the allocator's first fit takes gpu-1 for a 4 GiB claim, which is the GPU the node's own
/// `auto` (best fit) takes for 4 GiB: the whole GPU stays whole for a claim that needs it.
#[test]
fn the_allocators_first_fit_is_the_nodes_best_fit_when_one_gpu_is_in_use() {
    let (dir, tb) = wrapper_testbed("vramgate-dra-claims-fit", GPUS);
    let cleanup = WrapperCleanup(&tb);
    let (rt, api, driver, registered) = driver_on(&tb);

    // A container given the CDI devices `ids` (none: a container outside Kubernetes).
    let create = |id: &str, annotations: &[(&str, &str)], ids: &[String]| {
        let bundle = claim_bundle(&tb, id, &["sleep", "60"], annotations, &[], ids);
        let (ok, said) = wrapper(&tb, &["create", "--bundle", bundle.to_str().unwrap(), id]);
        assert!(ok, "create {id}: {said}");
    };
    create(
        "outside",
        &[("vramgate.dev/memory", "10Gi"), ("vramgate.dev/gpus", "GPU-one")],
        &[],
    );
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "6Gi")]);
    assert_eq!(
        rt.block_on(api.device_order(NODE)),
        ["gpu-1", "gpu-0"],
        "the GPU with less room first"
    );

    // The node's own choice for 4 GiB.
    create(
        "auto",
        &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "auto")],
        &[],
    );
    assert_eq!(shares_of(&tb, "auto"), [("GPU-one".to_string(), 4 * GI)]);
    let (ok, said) = wrapper(&tb, &["delete", "--force", "auto"]);
    assert!(ok, "{said}");
    wait_released(&tb, "auto");

    // The scheduler's choice for a claim of 4 GiB, and its container on the node.
    let uid = create_claim(&rt, &api, "fits", json!([request("gpu", "4Gi", json!({}))]));
    let results = allocate(&rt, &api, "fits");
    assert_eq!(decided(&results), want(&[("gpu-1", "4Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "fits", &uid, None).unwrap();
    create("claimed", &[], &ids);
    assert_eq!(shares_of(&tb, "claimed"), [("GPU-one".to_string(), 4 * GI)]);
    // Nothing republished for the claim's own container: the order and capacities stay. A
    // container outside Kubernetes made after it (1 GiB of GPU-zero) is published, so the
    // driver has read the ledger with the claim's container in it: gpu-1 still shows 6 GiB,
    // not the 2 GiB it would if the claim were counted again.
    create(
        "later",
        &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "GPU-zero")],
        &[],
    );
    wait_capacities(&rt, &api, &[("gpu-0", "15Gi"), ("gpu-1", "6Gi")]);
    assert_eq!(rt.block_on(api.device_order(NODE)), ["gpu-1", "gpu-0"]);

    assert_nothing_rejected(&rt, &api);
    // Containers first: their testbed (config, runc root) goes with `dir`.
    drop(cleanup);
    drop(driver);
    drop(dir);
}

/// A claim shared by the containers of one pod is held once (issue 35, item 2), on a node whose
/// `vramgate watch` stops the holders together (`over_use = "kill"`): the second
/// container of the pod given the claim's device starts where the GPU could not hold the claim
/// twice, `vramgate status` counts the claim once, and the first container's stop leaves the
/// second holding all of it. The same device in another pod's container is counted again (a
/// container can be handed any claim's CDI device by name). A container that adds a forged
/// marker and share, or copies its real marker under another name, is refused with one line,
/// without the secret.
#[test]
fn a_claim_shared_by_a_pods_containers_is_held_once_and_a_forged_marker_is_refused() {
    // The watch stops a pod's holders together: what lets a claim be held once.
    let (dir, tb) = runc_testbed(
        "vramgate-dra-claims-shared",
        &format!("{GPUS}[enforce]\nover_use = \"kill\"\n"),
    );
    let cleanup = Cleanup(&tb);
    // ...and only while it is seen running (its heartbeat): so it runs here.
    let _watch = RunningWatch::start(&tb);
    let (rt, api, driver, registered) = driver_on(&tb);

    let uid = create_claim(&rt, &api, "shared", json!([request("gpu", "10Gi", json!({}))]));
    let results = allocate(&rt, &api, "shared");
    assert_eq!(decided(&results), want(&[("gpu-0", "10Gi")]));
    let ids = prepare(&rt, &registered.endpoint, "shared", &uid, None).unwrap();
    let env = cdi_env(&tb.dir.join("cdi"), &ids);
    // What containerd's CRI plugin writes on each container of a pod.
    let in_pod = |pod: &'static str| {
        [
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-id", pod),
        ]
    };
    // A container of `pod` given the claim's device, with `extra` env of its own.
    let run = |id: &str, pod: &'static str, extra: &[String]| {
        let own: Vec<&str> = extra.iter().map(String::as_str).collect();
        let bundle = claim_bundle(&tb, id, &["sleep", "60"], &in_pod(pod), &own, &ids);
        tb.runc_run(&bundle, id)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let reserved_on_gpu0 = || status(&tb.config_path)["gpus"][0]["reserved"].as_u64().unwrap();
    let mut app = run("shared-app", "pod-1", &[]);
    wait_reserved(&tb, "shared-app", 10 * GI);
    // 6 GiB left on GPU-zero: the pod's second container fits only as the claim's holder.
    let mut sidecar = run("shared-sidecar", "pod-1", &[]);
    wait_reserved(&tb, "shared-sidecar", 10 * GI);
    assert_eq!(reserved_on_gpu0(), 10 * GI, "the claim once: {:?}", reservations(&tb));
    let ledger: Value = serde_json::from_slice(&std::fs::read(tb.dir.join("state/ledger.json")).unwrap()).unwrap();
    for entry in ledger["reservations"].as_array().unwrap() {
        assert_eq!(
            entry["claim"],
            json!({"pod": "pod-1", "devices": [format!("{uid}-gpu-0")]}),
            "{ledger}"
        );
    }
    // Nothing republished for the claim's containers.
    assert_eq!(capacities(&rt, &api), want(&[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]));

    // Another pod's container handed the same device: counted again, so it does not fit.
    let other = run("other-pod", "pod-2", &[]);
    let out = other.wait_with_output().unwrap();
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(said.contains("other-pod") && said.contains("GPU 0"), "{said}");
    assert!(shares_of(&tb, "other-pod").is_empty());

    // The app container stops: the sidecar holds the claim whole.
    stop(&tb, "shared-app", &mut app);
    assert_eq!(reserved_on_gpu0(), 10 * GI, "{:?}", reservations(&tb));
    let plain = spawn_container(
        &tb,
        "plain-7g",
        &["sleep", "60"],
        &[("vramgate.dev/memory", "7Gi"), ("vramgate.dev/gpus", "GPU-zero")],
    );
    let out = plain.wait_with_output().unwrap();
    assert!(!out.status.success(), "7 GiB beside the held claim: {}", stderr(&out));

    // Forged and copied markers, in the claim's own pod.
    let secret = env
        .iter()
        .find_map(|e| e.strip_prefix("VRAMGATE_DRA_DEVICE_"))
        .and_then(|e| e.split_once(':'))
        .map(|(_, s)| s.to_string())
        .unwrap();
    let suffix = uid.replace('-', "_");
    for (id, extra) in [
        (
            "forged",
            vec![
                format!("VRAMGATE_DRA_DEVICE_{suffix}_gpu_1={uid}-gpu-1:{}", "0".repeat(32)),
                format!("VRAMGATE_DRA_SHARE_{suffix}_gpu_1=GPU-one,{},{}", 10 * GI, 16 * GI),
            ],
        ),
        (
            "copied",
            vec![
                format!("VRAMGATE_DRA_DEVICE_again={uid}-gpu-0:{secret}"),
                format!("VRAMGATE_DRA_SHARE_again=GPU-zero,{},{}", 10 * GI, 10 * GI),
            ],
        ),
    ] {
        let out = run(id, "pod-1", &extra).wait_with_output().unwrap();
        assert!(!out.status.success(), "{id} started");
        let said = stderr(&out);
        assert!(
            said.contains("which no claim this node's DRA driver prepared gives it"),
            "{id}: {said}"
        );
        assert!(!said.contains(&secret), "{id}: the secret in {said}");
        assert!(shares_of(&tb, id).is_empty(), "{id}: {:?}", reservations(&tb));
    }

    // The pod's last holder stops: the claim, still allocated, keeps its memory (issue 56)
    // until it is deleted.
    stop(&tb, "shared-sidecar", &mut sidecar);
    assert_eq!(reserved_on_gpu0(), 10 * GI, "{:?}", reservations(&tb));
    assert_eq!(reservations(&tb), [(format!("claim-{uid}"), 10 * GI)]);
    rt.block_on(api.delete_claim("default", "shared"));
    wait_until("the deleted claim's memory released", Duration::from_secs(10), || {
        (reserved_on_gpu0() == 0, reservations(&tb))
    });
    assert_nothing_rejected(&rt, &api);
    // Containers first: their testbed (config, runc root) goes with `dir`.
    drop(cleanup);
    drop(driver);
    drop(dir);
}

/// A driver removed for good (its chart uninstalled, its node taken out of its DaemonSet)
/// leaves the claims' own reservations it kept, and nothing else sees a claim deallocated. They
/// stay held while its heartbeat is recent (a restarting driver loses nothing) and leave the
/// ledger at the next transaction (here a container's start) once it has been gone past
/// vramgate's limit (10 minutes; here its last beat is aged by hand, on both clocks, as time
/// would age it).
#[test]
fn a_claims_reservation_outlives_a_driver_gone_for_good_by_the_limit_only() {
    let (dir, tb) = runc_testbed("vramgate-dra-claims-absent", GPUS);
    let cleanup = Cleanup(&tb);
    let (rt, api, driver, _registered) = driver_on(&tb);
    let uid = create_claim(&rt, &api, "orphan", json!([request("gpu", "10Gi", json!({}))]));
    assert_eq!(decided(&allocate(&rt, &api, "orphan")), want(&[("gpu-0", "10Gi")]));
    let claim_id = format!("claim-{uid}");
    wait_until("the claim's own reservation", Duration::from_secs(10), || {
        let held = reservations(&tb);
        (held == [(claim_id.clone(), 10 * GI)], held)
    });
    let heartbeat = tb.state_dir.join("dra.heartbeat");
    assert!(
        heartbeat.is_file(),
        "the driver's heartbeat in {}",
        tb.state_dir.display()
    );
    drop(driver);
    let eight_on_gpu0 = |id: &str| {
        spawn_container(
            &tb,
            id,
            &["sleep", "60"],
            &[("vramgate.dev/memory", "8Gi"), ("vramgate.dev/gpus", "GPU-zero")],
        )
    };

    // Just gone: the claim's 10 of GPU 0's 16 GiB stay held.
    let out = eight_on_gpu0("too-soon").wait_with_output().unwrap();
    assert!(!out.status.success(), "8Gi beside the claim's 10Gi started");
    assert_eq!(reservations(&tb), [(claim_id.clone(), 10 * GI)]);

    // Its last beat 11 minutes ago, on both clocks.
    use vramgate::clock::Clock;
    let written = std::fs::read_to_string(&heartbeat).unwrap();
    assert!(vramgate::ledger::dra_heartbeat_stamp(&written).is_some(), "{written:?}");
    let eleven_minutes = 11 * 60 * 1000;
    let now = vramgate::clock::SystemClock.stamp();
    let then = vramgate::clock::Stamp {
        unix_ms: now.unix_ms - eleven_minutes,
        boot_ms: now
            .boot_ms
            .map(|b| b.checked_sub(eleven_minutes).expect("the host up for 11 minutes")),
    };
    std::fs::write(&heartbeat, vramgate::ledger::dra_heartbeat_text(4242, then)).unwrap();

    let mut later = eight_on_gpu0("later");
    wait_reserved(&tb, "later", 8 * GI);
    assert_eq!(reservations(&tb), [("later".to_string(), 8 * GI)]);
    let released = events_in(&tb.state_dir)
        .into_iter()
        .find(|e| e["event"] == "reclaim" && e["container"] == claim_id.as_str())
        .unwrap_or_else(|| panic!("no reclaim event for {claim_id}: {:?}", events_in(&tb.state_dir)));
    assert!(
        released["detail"]
            .as_str()
            .unwrap()
            .contains("vramgate-dra has not been seen for over 600s"),
        "{released}"
    );
    stop(&tb, "later", &mut later);
    drop(cleanup);
    drop(dir);
}
