//! Placement on a multi-GPU host: `vramgate-runtime` in front of real runc, on a static
//! inventory of 8 GPUs of 80 GiB of which some memory is used outside vramgate, so each GPU
//! has a different amount available. The wrapper chooses the GPU at create, writes it into the
//! bundle's `config.json`, and the container's hook confirms the reservation.

use crate::support;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use vramgate::placement::{self, Strategy};
use vramgate_testbed::Testbed;

/// GiB used outside vramgate on each of the 8 GPUs; available = 80 - this.
const USED_OUTSIDE: [u64; 8] = [0, 60, 30, 70, 0, 10, 50, 75];
const TOTAL_GIB: u64 = 80;

fn uuid(i: usize) -> String {
    format!("GPU-8a{i}0c0de-0000-0000-0000-00000000000{i}")
}

fn eight_gpus(extra: &str) -> String {
    let mut toml = String::from("[inventory]\nbackend = \"static\"\n");
    for (i, used) in USED_OUTSIDE.iter().enumerate() {
        toml += &format!(
            "[[inventory.gpus]]\nindex = {i}\nuuid = {:?}\nminor = {i}\ntotal = \"{TOTAL_GIB}Gi\"\n",
            uuid(i)
        );
        if *used > 0 {
            toml += &format!("used_outside = \"{used}Gi\"\n");
        }
    }
    toml + extra
}

fn testbed(name: &str, extra: &str) -> (tempfile::TempDir, Testbed) {
    wrapper_testbed(name, &eight_gpus(extra))
}

/// A bundle without hooks (the wrapper adds them) requesting `memory` with these annotations
/// and env.
fn bundle(bed: &Testbed, id: &str, annotations: &[(&str, &str)], env: &[&str]) -> PathBuf {
    bed.bundle(id, &["sleep", "60"], annotations, env, false).unwrap()
}

fn create(bed: &Testbed, id: &str, bundle: &std::path::Path) -> (bool, String) {
    wrapper(bed, &["create", "--bundle", &bundle.display().to_string(), id])
}

fn spec_of(bundle: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap()
}

fn env_of(spec: &Value, name: &str) -> Option<String> {
    spec["process"]["env"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// GPU index → the containers reserved on it, from `vramgate status --json`.
fn placed(bed: &Testbed) -> HashMap<u64, Vec<Value>> {
    let mut by_gpu = HashMap::new();
    for gpu in status(&bed.config_path)["gpus"].as_array().unwrap() {
        let index = gpu["index"].as_u64().unwrap();
        by_gpu.insert(index, gpu["reservations"].as_array().unwrap().clone());
    }
    by_gpu
}

fn gpu_of(bed: &Testbed, id: &str) -> Vec<u64> {
    let mut gpus: Vec<u64> = placed(bed)
        .into_iter()
        .filter(|(_, rs)| rs.iter().any(|r| r["container_id"] == id))
        .map(|(g, _)| g)
        .collect();
    gpus.sort();
    gpus
}

/// What CDI's `nvidia.com/gpu=all` puts into a bundle's spec: the `extra` nodes (path, minor),
/// then every one of the 8 GPUs' `/dev/nvidiaN`, each with the device-cgroup rule allowing it.
fn give_every_gpu_node(bundle: &std::path::Path, extra: &[(&str, u64)]) {
    let mut spec = spec_of(bundle);
    let nodes = extra
        .iter()
        .map(|(path, minor)| (path.to_string(), *minor))
        .chain((0..8u64).map(|i| (format!("/dev/nvidia{i}"), i)));
    let (devices, rules): (Vec<Value>, Vec<Value>) = nodes
        .map(|(path, minor)| {
            (
                json!({"path": path, "type": "c", "major": 195, "minor": minor}),
                json!({"allow": true, "type": "c", "major": 195, "minor": minor, "access": "rwm"}),
            )
        })
        .unzip();
    spec["linux"]["devices"] = json!(devices);
    spec["linux"]["resources"]["devices"] = json!(rules);
    std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

fn auto(memory: &str) -> Vec<(&str, &str)> {
    vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "auto")]
}

#[test]
fn the_wrapper_places_best_fit_writes_the_uuid_and_the_hook_confirms() {
    let (_dir, bed) = testbed("vg-place-fit", "");
    let _cleanup = Cleanup(&bed);
    // Available: 80 20 50 10 80 70 30 5 (GiB). 8 GiB goes to the tightest hole: GPU 3.
    let b = bundle(&bed, "p1", &auto("8Gi"), &[]);
    let (ok, err) = create(&bed, "p1", &b);
    assert!(ok, "{err}");
    let spec = spec_of(&b);
    assert_eq!(
        env_of(&spec, "NVIDIA_VISIBLE_DEVICES").as_deref(),
        Some(uuid(3).as_str())
    );
    assert_eq!(spec["annotations"]["vramgate.dev/gpus"], uuid(3));
    assert_eq!(
        vramgate_hook_stages(&b.join("config.json")),
        ["createRuntime", "poststop"]
    );
    let r = &placed(&bed)[&3][0];
    assert_eq!(r["container_id"], "p1");
    assert!(r.get("pending").is_none(), "the hook confirmed it: {r}");
    let state: Value = serde_json::from_slice(&bed.runc(&["state", "p1"]).output().unwrap().stdout).unwrap();
    assert_eq!(r["pid"], state["pid"], "bound to the container's init");

    // The fill goes on best-fit: 8 → GPU 1 (20), 8 → GPU 1 (12), 8 → GPU 6 (30).
    let mut got = Vec::new();
    for id in ["p2", "p3", "p4"] {
        let b = bundle(&bed, id, &auto("8Gi"), &[]);
        let (ok, err) = create(&bed, id, &b);
        assert!(ok, "{err}");
        got.extend(gpu_of(&bed, id));
    }
    assert_eq!(got, [1, 1, 6]);

    // Stops release what each got.
    for id in ["p1", "p2", "p3", "p4"] {
        assert!(wrapper(&bed, &["delete", "--force", id]).0);
    }
    assert!(placed(&bed).values().all(Vec::is_empty), "{:?}", placed(&bed));
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert_eq!(events.matches(r#""event":"confirm""#).count(), 4, "{events}");
}

#[test]
fn spread_spreads_and_auto_2_takes_two_gpus() {
    let (_dir, bed) = testbed("vg-place-spread", "[placement]\nstrategy = \"spread\"\n");
    let _cleanup = Cleanup(&bed);
    let mut got = Vec::new();
    for id in ["s1", "s2", "s3"] {
        let b = bundle(&bed, id, &auto("8Gi"), &[]);
        let (ok, err) = create(&bed, id, &b);
        assert!(ok, "{err}");
        got.extend(gpu_of(&bed, id));
    }
    // 80 and 80: GPU 0 (lower index), then GPU 4 (80 > 72), then GPU 0 (72 = 72, lower index).
    assert_eq!(got, [0, 4, 0]);
    let b = bundle(
        &bed,
        "two",
        &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "auto:2")],
        &[],
    );
    let (ok, err) = create(&bed, "two", &b);
    assert!(ok, "{err}");
    assert_eq!(gpu_of(&bed, "two"), [4, 5]);
    let visible = env_of(&spec_of(&b), "NVIDIA_VISIBLE_DEVICES").unwrap();
    assert_eq!(visible, format!("{},{}", uuid(4), uuid(5)));
}

#[test]
fn a_request_no_gpu_can_hold_is_refused_naming_the_largest() {
    let (_dir, bed) = testbed("vg-place-never", "");
    let _cleanup = Cleanup(&bed);
    let b = bundle(&bed, "huge", &auto("81Gi"), &[]);
    let (ok, err) = create(&bed, "huge", &b);
    assert!(!ok);
    assert!(
        err.contains("vramgate: refused container huge: it requests 81.0 GiB on any one of 8 GPUs, more than enough of them can ever hold (the largest is GPU 0"),
        "{err}"
    );
    // Room nowhere now (policy reject): the message names the GPU with the most room.
    let b = bundle(&bed, "big", &auto("79Gi"), &[]);
    assert!(create(&bed, "big", &b).0);
    let b = bundle(&bed, "big2", &auto("79Gi"), &[]);
    assert!(create(&bed, "big2", &b).0);
    let b = bundle(&bed, "third", &auto("71Gi"), &[]);
    let (ok, err) = create(&bed, "third", &b);
    assert!(!ok);
    assert!(
        err.contains("on any one of 8 GPUs and the one with the most room is GPU 5")
            && err.contains("70.0 GiB available"),
        "{err}"
    );
    assert!(
        runc_list(&bed).iter().all(|id| id != "third" && id != "huge"),
        "the next runtime never ran"
    );
    assert!(gpu_of(&bed, "third").is_empty());
}

fn runc_list(bed: &Testbed) -> Vec<String> {
    let out = bed.runc(&["list", "-q"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_engines_all_gets_one_gpu_and_vramgates_all_spans_them() {
    let (_dir, bed) = testbed("vg-place-all", "");
    let _cleanup = Cleanup(&bed);
    // A CUDA image's ENV NVIDIA_VISIBLE_DEVICES=all: one GPU, chosen (best fit for 4: GPU 7).
    let b = bundle(
        &bed,
        "env-all",
        &[],
        &["VRAMGATE_MEMORY=4Gi", "NVIDIA_VISIBLE_DEVICES=all"],
    );
    let (ok, err) = create(&bed, "env-all", &b);
    assert!(ok, "{err}");
    assert_eq!(gpu_of(&bed, "env-all"), [7]);
    assert_eq!(env_of(&spec_of(&b), "NVIDIA_VISIBLE_DEVICES"), Some(uuid(7)));
    // The CDI form keeps its form.
    let b = bundle(
        &bed,
        "cdi-all",
        &[],
        &["VRAMGATE_MEMORY=4Gi", "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"],
    );
    assert!(create(&bed, "cdi-all", &b).0);
    let gpu = gpu_of(&bed, "cdi-all");
    assert_eq!(
        env_of(&spec_of(&b), "NVIDIA_VISIBLE_DEVICES"),
        Some(format!("nvidia.com/gpu={}", gpu[0]))
    );
    // vramgate.dev/gpus=all: the amount on every GPU, as asked.
    let b = bundle(
        &bed,
        "span",
        &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "all")],
        &[],
    );
    assert!(create(&bed, "span", &b).0);
    assert_eq!(gpu_of(&bed, "span"), (0..8).collect::<Vec<u64>>());
}

#[test]
fn device_nodes_injected_upstream_are_narrowed_with_their_cgroup_rules() {
    let (_dir, bed) = testbed("vg-place-cdi", "");
    let _cleanup = Cleanup(&bed);
    // What `podman --device nvidia.com/gpu=all` (CDI) puts into the spec: every GPU's node.
    let b = bundle(&bed, "nodes", &auto("8Gi"), &[]);
    give_every_gpu_node(&b, &[("/dev/nvidiactl", 255)]);
    let (ok, err) = create(&bed, "nodes", &b);
    assert!(ok, "{err}");
    assert_eq!(gpu_of(&bed, "nodes"), [3]);
    let spec = spec_of(&b);
    let paths: Vec<&str> = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia3"]);
    let minors: Vec<u64> = spec["linux"]["resources"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["major"] == 195)
        .map(|r| r["minor"].as_u64().unwrap())
        .collect();
    assert_eq!(minors, [255, 3]);
    // Inside the container, only the chosen GPU's node exists.
    let out = bed.runc(&["exec", "nodes", "ls", "/dev"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("nvidia3") && !listing.contains("nvidia0"), "{listing}");
}

/// A container that names its GPU (`vramgate.dev/gpus=1`) but was given every GPU by its
/// engine (`NVIDIA_VISIBLE_DEVICES=all`, every node): it sees GPU 1 alone, and the MPS limit
/// names GPU 1, not whichever GPU the container would number 0.
#[test]
fn a_named_gpu_narrows_what_the_engine_gave_and_the_mps_limit_names_it() {
    let scratch = tempfile::tempdir().unwrap();
    let pipe = scratch.path().join("mps-pipe");
    let log = scratch.path().join("mps-log");
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(&log).unwrap();
    // An MPS control daemon as vramgate recognises one: its socket, its pid file, and a
    // process whose argv[0] is nvidia-cuda-mps-control.
    let _socket = std::os::unix::net::UnixListener::bind(pipe.join("control")).unwrap();
    let mut daemon = Command::new("sleep")
        .arg0("nvidia-cuda-mps-control")
        .arg("120")
        .spawn()
        .unwrap();
    std::fs::write(pipe.join("nvidia-cuda-mps-control.pid"), format!("{}\n", daemon.id())).unwrap();
    let (_dir, bed) = testbed(
        "vg-place-named",
        &format!(
            "[enforce]\nlimit = \"mps\"\nmps_pipe_directory = {:?}\nmps_log_directory = {:?}\n",
            pipe.display().to_string(),
            log.display().to_string()
        ),
    );
    let _cleanup = Cleanup(&bed);
    let b = bundle(
        &bed,
        "named",
        &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "1")],
        &["NVIDIA_VISIBLE_DEVICES=all"],
    );
    give_every_gpu_node(&b, &[]);
    let (ok, err) = create(&bed, "named", &b);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(ok, "{err}");
    assert_eq!(gpu_of(&bed, "named"), [1]);
    let spec = spec_of(&b);
    assert_eq!(env_of(&spec, "NVIDIA_VISIBLE_DEVICES"), Some(uuid(1)));
    assert_eq!(
        env_of(&spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        Some(format!("{}=4096M", uuid(1))),
        "keyed by the reserved GPU's UUID"
    );
    let out = bed.runc(&["exec", "named", "ls", "/dev"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("nvidia1"), "{listing}");
    for other in [0, 2, 3, 4, 5, 6, 7] {
        assert!(
            !listing.contains(&format!("nvidia{other}")),
            "nvidia{other} in {listing}"
        );
    }
}

#[test]
fn auto_through_the_hook_alone_is_refused_naming_the_wrapper() {
    // podman and CRI-O run only the hook (hooks.d): it cannot change the devices.
    let (_dir, bed) = runc_testbed("vg-place-hook", &eight_gpus(""));
    let _cleanup = Cleanup(&bed);
    let out = spawn_container(&bed, "hooked", &["true"], &auto("1Gi"))
        .wait_with_output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("which only vramgate-runtime can make"), "{err}");
}

#[test]
fn a_create_killed_before_its_hook_leaves_nothing_behind() {
    let (_dir, bed) = testbed("vg-place-killed", "");
    let _cleanup = Cleanup(&bed);
    let b = bundle(&bed, "killed", &auto("8Gi"), &[]);
    // A createRuntime hook of the spec's own that takes its time: vramgate's runs after it.
    let mut spec = spec_of(&b);
    spec["hooks"] = json!({"createRuntime": [{"path": "/bin/sleep", "args": ["sleep", "30"]}]});
    std::fs::write(b.join("config.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let (key, value) = bed.env();
    let mut create = spawn_quiet(
        &mut bed.runc(&["create", "--bundle", &b.display().to_string(), "killed"]),
        key,
        value,
    );
    wait_until(
        "the create holds a pending reservation",
        Duration::from_secs(20),
        || {
            let placed = placed(&bed);
            let pending = placed
                .values()
                .flatten()
                .any(|r| r["container_id"] == "killed" && r["pending"] == true);
            (pending, placed)
        },
    );
    // The engine gives up on the create: `runc create` (the wrapper's pid, after its exec) dies.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(create.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    create.wait().unwrap();
    let gc = Command::new(VRAMGATE)
        .arg("gc")
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap();
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert!(gpu_of(&bed, "killed").is_empty(), "{:?}", placed(&bed));
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert!(events.contains(r#""event":"reclaim","container":"killed""#), "{events}");
}

/// One line of the event log, as the replay reads it.
#[derive(Debug, serde::Deserialize)]
struct Logged {
    event: String,
    container: String,
    #[serde(default)]
    gpus: Vec<vramgate::ledger::GpuShare>,
    #[serde(default)]
    placement: Option<placement::Placement>,
    #[serde(default)]
    detail: String,
}

#[test]
fn racing_creates_never_overcommit_and_every_decision_replays_from_the_event_log() {
    let (_dir, bed) = testbed("vg-place-race", "");
    let _cleanup = Cleanup(&bed);
    let seed = Rng::seed_from_env();
    eprintln!("VRAMGATE_TEST_SEED={seed}");
    let mut rng = Rng::new(seed);
    let requests: Vec<(String, u64)> = (0..64).map(|n| (format!("r{n}"), 1 + rng.below(24))).collect();
    let bundles: Vec<PathBuf> = requests
        .iter()
        .map(|(id, gib)| bundle(&bed, id, &auto(&format!("{gib}Gi")), &[]))
        .collect();
    let results: Vec<(bool, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = requests
            .iter()
            .zip(&bundles)
            .map(|((id, _), b)| s.spawn(|| create(&bed, id, b)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted = results.iter().filter(|(ok, _)| *ok).count();
    for (ok, err) in &results {
        assert!(*ok || err.contains("vramgate: refused container"), "{err}");
    }
    assert!(admitted >= 20, "only {admitted} of 64 admitted");

    // Never over capacity on any GPU.
    for gpu in status(&bed.config_path)["gpus"].as_array().unwrap() {
        let i = gpu["index"].as_u64().unwrap() as usize;
        let reserved: u64 = gpu["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap())
            .sum();
        assert!(
            reserved <= (TOTAL_GIB - USED_OUTSIDE[i]) * GIB,
            "GPU {i} over-committed: {reserved}"
        );
    }

    // Replay: the log alone gives each decision's numbers, and the choice is the one best fit
    // makes on them ([`best_fit`], from the manual's words, not the product's function).
    let mut reserved: HashMap<String, u64> = HashMap::new();
    let mut holders: HashMap<String, usize> = HashMap::new();
    let available = |reserved: &HashMap<String, u64>, i: usize| {
        (TOTAL_GIB - USED_OUTSIDE[i]) * GIB - reserved.get(&uuid(i)).copied().unwrap_or(0)
    };
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    let (mut admits, mut refusals) = (0, 0);
    for line in events.lines() {
        let e: Logged = serde_json::from_str(line).unwrap();
        match e.event.as_str() {
            "admit" => {
                let p = e.placement.expect("a placed admission records its placement");
                assert_eq!(p.strategy, Strategy::BestFit, "{}", e.container);
                // (index, available, reservations) of each GPU that holds the request, as this
                // test counted them from the admissions before.
                let fitting: Vec<(usize, u64, usize)> = (0..8)
                    .map(|i| (i, available(&reserved, i), holders.get(&uuid(i)).copied().unwrap_or(0)))
                    .filter(|(_, available, _)| *available >= p.bytes)
                    .collect();
                let logged: Vec<(String, u64, usize)> = p
                    .candidates
                    .iter()
                    .map(|c| (c.uuid.clone(), c.available, c.reservations))
                    .collect();
                let replayed: Vec<(String, u64, usize)> = fitting.iter().map(|(i, a, n)| (uuid(*i), *a, *n)).collect();
                assert_eq!(logged, replayed, "{}: the numbers it chose by", e.container);
                assert!(
                    p.candidates.iter().all(|c| c.request == p.bytes),
                    "{}: each candidate's share",
                    e.container
                );
                assert_eq!(
                    p.chosen,
                    [uuid(best_fit(&fitting, p.bytes))],
                    "{}: best fit among {fitting:?}",
                    e.container
                );
                assert_eq!(e.gpus.len(), 1);
                assert_eq!(e.gpus[0].uuid, p.chosen[0]);
                *reserved.entry(p.chosen[0].clone()).or_default() += p.bytes;
                *holders.entry(p.chosen[0].clone()).or_default() += 1;
                admits += 1;
            }
            "refuse" => {
                let gib: u64 = requests.iter().find(|(id, _)| *id == e.container).unwrap().1;
                assert!(
                    (0..8).all(|i| available(&reserved, i) < gib * GIB),
                    "{} was refused while a GPU had room: {}",
                    e.container,
                    e.detail
                );
                refusals += 1;
            }
            "confirm" => {}
            other => panic!("unexpected event {other}: {line}"),
        }
    }
    assert_eq!((admits, refusals), (admitted, 64 - admitted));
    for (id, _) in &requests {
        let _ = wrapper(&bed, &["delete", "--force", id]);
    }
    assert!(placed(&bed).values().all(Vec::is_empty));
}

/// Best fit as docs/src/placement.md says it, the oracle of the replay above: among the GPUs
/// that hold the request (`fitting`: index, bytes available, reservations), the one left with
/// the least memory after it; ties go to the GPU with fewer reservations, then the lower
/// index. Its index.
fn best_fit(fitting: &[(usize, u64, usize)], request: u64) -> usize {
    let mut best: Option<(usize, u64, usize)> = None;
    for &(index, available, holders) in fitting {
        let left = available - request;
        let better = match best {
            None => true,
            Some((b_index, b_available, b_holders)) => {
                let b_left = b_available - request;
                left < b_left || (left == b_left && (holders < b_holders || (holders == b_holders && index < b_index)))
            }
        };
        if better {
            best = Some((index, available, holders));
        }
    }
    best.expect("a placed admission had a GPU with room").0
}

/// The oracle on cases worked by hand.
#[test]
fn best_fit_by_hand() {
    const G: u64 = 1 << 30;
    // 10 GiB asked: 12 left 2, 20 left 10, 11 left 1: the third.
    assert_eq!(best_fit(&[(0, 12 * G, 0), (1, 20 * G, 0), (2, 11 * G, 3)], 10 * G), 2);
    // Equal room: fewer reservations first, then the lower index.
    assert_eq!(best_fit(&[(0, 12 * G, 2), (1, 12 * G, 1), (2, 12 * G, 1)], G), 1);
    assert_eq!(best_fit(&[(5, 12 * G, 0), (3, 12 * G, 0)], G), 3);
}
