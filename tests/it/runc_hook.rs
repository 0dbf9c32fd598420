//! The core path against real runc: busybox containers whose config.json runs vramgate-hook at
//! createRuntime and poststop, on the simulated 24,265 MiB GPU.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{runc_testbed, spawn_container as spawn, status, Cleanup, GIB, VRAMGATE};
use vramgate_testbed::Testbed;

/// (container id, bytes, alive) of each reservation on GPU 0.
fn reservations(bed: &Testbed) -> Vec<(String, u64, bool)> {
    status(&bed.config_path)["gpus"][0]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["container_id"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
                r["alive"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Waits (bounded) until `check` holds.
fn eventually(what: &str, check: impl Fn() -> bool) {
    support::eventually(what, Duration::from_secs(20), check);
}

fn request(memory: &str) -> Vec<(&str, &str)> {
    vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")]
}

fn run(bed: &Testbed, id: &str, args: &[&str], annotations: &[(&str, &str)]) -> Output {
    spawn(bed, id, args, annotations).wait_with_output().unwrap()
}

#[test]
fn admitted_while_running_and_released_after_exit() {
    let (_dir, bed) = runc_testbed("vg-admit", "");
    let _cleanup = Cleanup(&bed);
    let mut child = spawn(&bed, "fits", &["sleep", "30"], &request("10Gi"));
    eventually("the reservation shows in status", || {
        reservations(&bed).iter().any(|r| r.0 == "fits")
    });
    let held = reservations(&bed);
    assert_eq!(held, vec![("fits".to_string(), 10 * GIB, true)]);
    let pid = status(&bed.config_path)["gpus"][0]["reservations"][0]["pid"]
        .as_u64()
        .unwrap();
    assert!(pid > 1);

    assert!(support::runc_kill_when_running(&bed, "fits"));
    child.wait().unwrap();
    assert!(reservations(&bed).is_empty(), "poststop released it");

    // A normal exit releases too.
    let out = run(&bed, "exits", &["true"], &request("1205Mi"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(reservations(&bed).is_empty());
}

/// The hook alone (no wrapper) admits a container on NVIDIA's variables, and on a pod's KAI
/// annotations for that container (what containerd's CRI plugin copies into its spec), and
/// refuses bad values with one line naming the variable.
#[test]
fn nvidias_variables_and_kai_annotations_are_a_request_to_the_hook_alone() {
    let (_dir, bed) = runc_testbed("vg-nvvars", "");
    let _cleanup = Cleanup(&bed);
    let gpus = [("vramgate.dev/gpus", "0")];
    let bundle = bed
        .bundle("env", &["sleep", "30"], &gpus, &["NVIDIA_GPU_MEMORY_LIMIT=3072"], true)
        .unwrap();
    let mut child = bed
        .runc_run(&bundle, "env")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("admitted on NVIDIA_GPU_MEMORY_LIMIT", || {
        reservations(&bed).iter().any(|r| r.0 == "env")
    });
    assert_eq!(reservations(&bed), [("env".to_string(), 3 * GIB, true)]);
    assert!(support::runc_kill_when_running(&bed, "env"));
    child.wait().unwrap();
    assert!(reservations(&bed).is_empty(), "released at poststop");

    // The same container bringing the annotation vramgate-runtime writes beside the toolkit's
    // variables it set (`vramgate.dev/enforcement=toolkit_limit`), to have its own NVIDIA
    // variables read as vramgate's and so ignored: with no request in vramgate's words beside
    // them, they are still its request, and it is reserved as before.
    let hides = [
        ("vramgate.dev/gpus", "0"),
        ("vramgate.dev/enforcement", "toolkit_limit"),
    ];
    let bundle = bed
        .bundle(
            "hides",
            &["sleep", "30"],
            &hides,
            &["NVIDIA_GPU_MEMORY_LIMIT=3072"],
            true,
        )
        .unwrap();
    let mut child = bed
        .runc_run(&bundle, "hides")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("admitted on NVIDIA_GPU_MEMORY_LIMIT despite the annotation", || {
        reservations(&bed).iter().any(|r| r.0 == "hides")
    });
    assert_eq!(reservations(&bed), [("hides".to_string(), 3 * GIB, true)]);
    assert!(support::runc_kill_when_running(&bed, "hides"));
    child.wait().unwrap();
    assert!(reservations(&bed).is_empty(), "released at poststop");

    // A pod's container, named by the CRI annotations, with KAI's annotations for it: the
    // request (1 GiB) is reserved with the limit (2 GiB) beside it; `true` exits, and `runc
    // run` returns once it is released.
    // Its GPU is the device plugin's (a pod's containers get GPUs from the scheduler alone).
    let kai = [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.container-name", "trainer"),
        ("nvidia.com/container.trainer.gpu-memory.request", "1024"),
        ("nvidia.com/container.trainer.gpu-memory.limit", "2048"),
    ];
    let bundle = bed
        .bundle("kai", &["true"], &kai, &["NVIDIA_VISIBLE_DEVICES=0"], true)
        .unwrap();
    let out = bed.runc_run(&bundle, "kai").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    let admitted = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["event"] == "admit" && e["container"] == "kai")
        .unwrap_or_else(|| panic!("an admit event for kai in {events}"));
    assert_eq!(
        (&admitted["gpus"][0]["bytes"], &admitted["gpus"][0]["limit"]),
        (&serde_json::json!(GIB), &serde_json::json!(2 * GIB)),
        "{admitted}"
    );

    // Bad values: refused, one line naming the variable and its value, nothing reserved.
    let bundle = bed
        .bundle("bad", &["true"], &gpus, &["NVIDIA_GPU_MEMORY_LIMIT=2Gi"], true)
        .unwrap();
    let out = bed.runc_run(&bundle, "bad").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        // runc quotes the hook's line in its own, escaping the quotes.
        stderr.contains("vramgate: container bad: NVIDIA_GPU_MEMORY_LIMIT = ")
            && stderr.contains("2Gi")
            && stderr.contains("NVIDIA's memory amounts are whole MiB"),
        "{stderr}"
    );
    assert!(reservations(&bed).is_empty());
}

#[test]
fn refused_when_it_does_not_fit_and_never_runs() {
    let (_dir, bed) = runc_testbed("vg-refuse", "");
    let _cleanup = Cleanup(&bed);
    let mut holder = spawn(&bed, "holder", &["sleep", "30"], &request("20Gi"));
    eventually("holder admitted", || reservations(&bed).len() == 1);

    let out = run(&bed, "toobig", &["echo", "CONTAINER-RAN"], &request("10Gi"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("vramgate: refused container toobig: it requests 10.0 GiB"),
        "{stderr}"
    );
    assert!(
        stderr.contains("available to new requests") && stderr.contains("20.0 GiB reserved by 1 container"),
        "{stderr}"
    );
    assert!(stderr.contains("policy=wait"), "says what to do: {stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("CONTAINER-RAN"),
        "the container never ran"
    );
    assert_eq!(reservations(&bed).len(), 1, "nothing reserved for the refused one");

    // More than the whole GPU: refused as impossible, not as "try later".
    let out = run(&bed, "huge", &["echo", "CONTAINER-RAN"], &request("30Gi"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("more than the GPU can ever hold"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("CONTAINER-RAN"));

    bed.runc(&["kill", "holder", "KILL"]).status().unwrap();
    holder.wait().unwrap();
    let runc_list = bed.runc(&["list", "-q"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&runc_list.stdout).trim().is_empty(),
        "no container left half-started"
    );
}

#[test]
fn killed_runc_is_reclaimed_by_the_next_transaction() {
    let (_dir, bed) = runc_testbed("vg-reclaim", "");
    let _cleanup = Cleanup(&bed);
    let runc = spawn(&bed, "orphan", &["sleep", "300"], &request("8Gi"));
    eventually("orphan admitted", || reservations(&bed).len() == 1);
    // runc dies before it can run poststop, then the container's init dies too.
    kill_runc_then_init(&bed, runc);
    assert_eq!(
        reservations(&bed),
        vec![("orphan".to_string(), 8 * GIB, false)],
        "status shows it as gone"
    );

    // The next admission's transaction reclaims it before deciding.
    let out = run(&bed, "next", &["true"], &request("20Gi"));
    assert!(
        out.status.success(),
        "20 GiB fits once the dead 8 GiB is reclaimed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reservations(&bed).is_empty());
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert!(
        events
            .lines()
            .any(|l| l.contains("\"reclaim\"") && l.contains("\"orphan\"")),
        "{events}"
    );
}

/// Kills `runc run` (so no poststop hook runs), then the container's init process (the only
/// reservation's recorded pid), and waits until it is gone.
fn kill_runc_then_init(bed: &Testbed, mut runc: Child) {
    let pid = status(&bed.config_path)["gpus"][0]["reservations"][0]["pid"]
        .as_u64()
        .unwrap() as i32;
    runc.kill().unwrap();
    runc.wait().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    eventually("init is gone", || {
        !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid)
    });
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z "))
        .unwrap_or(true)
}

#[test]
fn gc_reclaims_without_a_container_start() {
    let (_dir, bed) = runc_testbed("vg-gc", "");
    let _cleanup = Cleanup(&bed);
    let runc = spawn(&bed, "lost", &["sleep", "300"], &request("1Gi"));
    eventually("admitted", || reservations(&bed).len() == 1);
    kill_runc_then_init(&bed, runc);

    let out = Command::new(VRAMGATE)
        .arg("gc")
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("reclaimed 1024 MiB from container lost"),
        "{stdout}"
    );
    assert!(reservations(&bed).is_empty());
    let out = Command::new(VRAMGATE)
        .arg("gc")
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to reclaim"));
}

#[test]
fn no_request_touches_nothing() {
    let (_dir, bed) = runc_testbed("vg-none", "");
    let _cleanup = Cleanup(&bed);
    let out = run(&bed, "plain", &["echo", "CONTAINER-RAN"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("CONTAINER-RAN"));
    assert!(
        !bed.state_dir.exists(),
        "no lock, no ledger, not even the state directory"
    );
}

#[test]
fn env_request_and_release_by_hand() {
    let (_dir, bed) = runc_testbed("vg-env", "");
    let _cleanup = Cleanup(&bed);
    let bundle = bed
        .bundle(
            "envreq",
            &["sleep", "30"],
            &[],
            &["VRAMGATE_MEMORY=1.5Gi", "NVIDIA_VISIBLE_DEVICES=all"],
            true,
        )
        .unwrap();
    let mut child = bed
        .runc_run(&bundle, "envreq")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("admitted from env", || reservations(&bed).len() == 1);
    assert_eq!(reservations(&bed)[0].1, 1_610_612_736);

    let release = |id: &str| {
        Command::new(VRAMGATE)
            .args(["release", id])
            .env("VRAMGATE_CONFIG", &bed.config_path)
            .output()
            .unwrap()
    };
    let out = release("envreq");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("released envreq"));
    let out = release("envreq");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no reservation for container \"envreq\""));

    bed.runc(&["kill", "envreq", "KILL"]).status().unwrap();
    child.wait().unwrap();
    assert!(
        reservations(&bed).is_empty(),
        "poststop after a manual release is harmless"
    );
}

#[test]
fn a_refused_namesake_in_another_runc_root_leaves_the_live_reservation() {
    // Two runc roots (two containerd namespaces, say) may each hold a container "twin". The
    // second is refused; runc then runs its poststop hook, which must not release the first.
    let (dir, bed) = runc_testbed("vg-twin", "");
    let _cleanup = Cleanup(&bed);
    let mut holder = spawn(&bed, "twin", &["sleep", "30"], &request("20Gi"));
    eventually("holder admitted", || reservations(&bed).len() == 1);

    let other_root = dir.path().join("other-runc-root");
    std::fs::create_dir_all(&other_root).unwrap();
    let bundle = bed
        .bundle("twin-elsewhere", &["true"], &request("10Gi"), &[], true)
        .unwrap();
    let out = Command::new("runc")
        .arg("--root")
        .arg(&other_root)
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg("twin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("vramgate: refused container twin"), "{stderr}");
    assert_eq!(
        reservations(&bed),
        vec![("twin".to_string(), 20 * GIB, true)],
        "the live container keeps its reservation"
    );

    assert!(support::runc_kill_when_running(&bed, "twin"));
    holder.wait().unwrap();
    assert!(reservations(&bed).is_empty(), "its own stop releases it");
}

#[test]
fn a_spec_rewritten_after_create_is_still_released_at_stop() {
    // The OCI spec may be rewritten after create; release is decided from the ledger, so a
    // request that is no longer in config.json at poststop is released all the same.
    let (_dir, bed) = runc_testbed("vg-rewritten", "");
    let _cleanup = Cleanup(&bed);
    let mut child = spawn(&bed, "rewritten", &["sleep", "30"], &request("10Gi"));
    eventually("admitted", || reservations(&bed).len() == 1);
    let config = bed.dir.join("bundles/rewritten/config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    spec["annotations"] = serde_json::json!({});
    std::fs::write(&config, serde_json::to_vec(&spec).unwrap()).unwrap();

    assert!(support::runc_kill_when_running(&bed, "rewritten"));
    child.wait().unwrap();
    assert!(reservations(&bed).is_empty(), "poststop released it from the ledger");
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert!(
        events
            .lines()
            .any(|l| l.contains("\"release\"") && l.contains("\"rewritten\"")),
        "a release, not a reclaim: {events}"
    );
}

/// A request of 2 GiB with a limit of 6 GiB (`vramgate.dev/memory-limit`) on an 8 GiB GPU,
/// through the built hook and real runc: the first container is admitted, and `status --json`
/// shows its request and limit side by side. A second such container has room for its request
/// (4 of 8 GiB) but not for its limit (12 GiB of limits on 8 GiB) at the default
/// `[queue] limit_overcommit = "0%"`: refused with a line that says the limits held it back.
/// With `limit_overcommit = "50%"` (limits may add up to 12 GiB) the second is admitted.
#[test]
fn a_limit_above_the_request_is_bounded_by_limit_overcommit() {
    let asks = [
        ("vramgate.dev/memory", "2Gi"),
        ("vramgate.dev/memory-limit", "6Gi"),
        ("vramgate.dev/gpus", "0"),
        ("vramgate.dev/policy", "reject"),
    ];
    for overcommit in ["", "50%"] {
        let queue = if overcommit.is_empty() {
            String::new()
        } else {
            format!("[queue]\nlimit_overcommit = {overcommit:?}\n")
        };
        let (_dir, bed) = runc_testbed(
            "vg-limit",
            &format!("{queue}[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-limit\"\ntotal = \"8Gi\"\n"),
        );
        let _cleanup = Cleanup(&bed);
        let mut first = spawn(&bed, "first", &["sleep", "30"], &asks);
        eventually("the first is admitted", || {
            reservations(&bed).iter().any(|r| r.0 == "first")
        });
        let gpu = status(&bed.config_path)["gpus"][0].clone();
        let held = &gpu["reservations"][0];
        assert_eq!(
            (&held["bytes"], &held["limit"]),
            (&serde_json::json!(2 * GIB), &serde_json::json!(6 * GIB)),
            "request and limit side by side: {gpu}"
        );
        assert_eq!(
            (&gpu["reserved"], &gpu["limits"]),
            (&serde_json::json!(2 * GIB), &serde_json::json!(6 * GIB)),
            "{gpu}"
        );

        let mut second = spawn(&bed, "second", &["sleep", "30"], &asks);
        if overcommit.is_empty() {
            let out = second.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "refused: {stderr}");
            assert!(
                stderr.contains("vramgate: refused container second: its limit is 6144 MiB and GPU 0 (GPU-limit) has room for limits up to 8192 MiB in all")
                    && stderr.contains("[queue] limit_overcommit"),
                "the line says the limits held it back: {stderr}"
            );
            assert_eq!(reservations(&bed).len(), 1, "nothing reserved for the refused one");
        } else {
            eventually("the second is admitted", || {
                reservations(&bed).iter().any(|r| r.0 == "second")
            });
            let gpu = status(&bed.config_path)["gpus"][0].clone();
            assert_eq!(
                (&gpu["reserved"], &gpu["limits"], &gpu["limit_overcommit"]),
                (
                    &serde_json::json!(4 * GIB),
                    &serde_json::json!(12 * GIB),
                    &serde_json::json!(4 * GIB)
                ),
                "{gpu}"
            );
            assert!(support::runc_kill_when_running(&bed, "second"));
            second.wait().unwrap();
        }
        assert!(support::runc_kill_when_running(&bed, "first"));
        first.wait().unwrap();
        assert!(reservations(&bed).is_empty(), "both released at poststop");
    }
}

fn vramgate(bed: &Testbed, args: &[&str]) -> Output {
    Command::new(VRAMGATE)
        .args(args)
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A container that names itself (`vramgate.dev/name`, as `podman run --annotation` and
/// `docker run --annotation` pass it; neither engine writes a name of its own) is shown by
/// that name in the table, the JSON, the metrics and the event log; `status NAME` shows it
/// alone and `release NAME` releases it; a name two containers claim is refused with the ids
/// listed; a name with a newline and quotes reaches no table line or metric label whole.
#[test]
fn containers_are_shown_and_released_by_name() {
    let (_dir, bed) = runc_testbed("vg-names", "");
    let _cleanup = Cleanup(&bed);
    let named = |name: &'static str| {
        let mut r = request("1Gi");
        r.push(("vramgate.dev/name", name));
        r
    };
    let hostile = "evil\"} 9\nvramgate_container_reserved_bytes{x=\"y";
    let mut children = vec![
        spawn(&bed, "c-trainer", &["sleep", "60"], &named("trainer")),
        spawn(&bed, "c-twin-1", &["sleep", "60"], &named("twin")),
        spawn(&bed, "c-twin-2", &["sleep", "60"], &named("twin")),
        spawn(&bed, "c-hostile", &["sleep", "60"], &named(hostile)),
        spawn(&bed, "c-nameless", &["sleep", "60"], &request("1Gi")),
    ];
    eventually("all five are admitted", || reservations(&bed).len() == 5);

    let json = status(&bed.config_path);
    let names: Vec<(String, Value)> = json["gpus"][0]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["container_id"].as_str().unwrap().to_string(), r["name"].clone()))
        .collect();
    let name_of = |id: &str| names.iter().find(|(i, _)| i == id).unwrap().1.clone();
    assert_eq!(name_of("c-trainer"), "trainer");
    assert_eq!(name_of("c-nameless"), Value::Null);
    let cleaned = name_of("c-hostile").as_str().unwrap().to_string();
    assert!(cleaned.starts_with("evil__"), "{cleaned}");
    assert!(!cleaned.contains(['"', '\n', '{', '}']), "{cleaned}");

    let table = support::status_output(&bed.config_path, &[]);
    assert!(table.lines().any(|l| l.trim_start().starts_with("trainer ")), "{table}");
    assert!(
        table.lines().any(|l| l.trim_start().starts_with("c-nameless ")),
        "{table}"
    );
    assert!(table.lines().any(|l| l.trim_start().starts_with(&cleaned)), "{table}");
    assert!(!table.lines().any(|l| l.starts_with("vramgate_")), "{table}");

    let metrics = text(&vramgate(&bed, &["metrics"]).stdout);
    assert!(
        metrics.lines().any(
            |l| l.starts_with("vramgate_container_reserved_bytes{container_id=\"c-trainer\"")
                && l.contains("name=\"trainer\"")
        ),
        "{metrics}"
    );
    // One sample line per container and family: the hostile name opened no line of its own.
    let reserved: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("vramgate_container_reserved_bytes"))
        .collect();
    assert_eq!(reserved.len(), 5, "{metrics}");
    assert!(reserved.iter().all(|l| l.ends_with(" 1073741824")), "{reserved:?}");

    // `status NAME` shows that container alone.
    let one = support::status_output(&bed.config_path, &["trainer"]);
    assert!(
        one.contains("trainer") && !one.contains("twin") && !one.contains("c-nameless"),
        "{one}"
    );
    let by_id = support::status_output(&bed.config_path, &["c-twin-1", "--json"]);
    let by_id: Value = serde_json::from_str(&by_id).unwrap();
    assert_eq!(by_id["gpus"][0]["reservations"].as_array().unwrap().len(), 1, "{by_id}");
    assert_eq!(by_id["gpus"][0]["reservations"][0]["container_id"], "c-twin-1");

    // A name two containers hold: both listed, one line saying to use the id, non-zero.
    for verb in ["status", "release"] {
        let out = vramgate(&bed, &[verb, "twin"]);
        assert_eq!(out.status.code(), Some(1), "{verb}: {}", text(&out.stderr));
        let listed = text(&out.stdout);
        assert!(
            listed.contains("c-twin-1") && listed.contains("c-twin-2"),
            "{verb}: {listed}"
        );
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{verb}: {err}");
        assert!(err.contains("give the container id"), "{verb}: {err}");
    }
    assert_eq!(reservations(&bed).len(), 5, "the ambiguous release released nothing");
    let out = vramgate(&bed, &["status", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr).lines().count(), 1, "{}", text(&out.stderr));

    // `release NAME` releases the one container of that name, by its id.
    let out = vramgate(&bed, &["release", "trainer"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("released c-trainer:"),
        "{}",
        text(&out.stdout)
    );
    assert!(!reservations(&bed).iter().any(|r| r.0 == "c-trainer"));

    // The event log names it on its admission and on its release.
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    let of_trainer: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["container"] == "c-trainer")
        .collect();
    for kind in ["admit", "release"] {
        let e = of_trainer
            .iter()
            .find(|e| e["event"] == kind)
            .unwrap_or_else(|| panic!("{kind}: {events}"));
        assert_eq!(e["name"], "trainer", "{e}");
    }

    for id in ["c-trainer", "c-twin-1", "c-twin-2", "c-hostile", "c-nameless"] {
        support::runc_kill_when_running(&bed, id);
    }
    for child in &mut children {
        child.wait().unwrap();
    }
}

/// Reads `child`'s stdout until `frames` headers of `vramgate status --watch` came, then kills
/// it: what it printed.
fn watch_frames(mut child: Child, frames: usize) -> String {
    use std::io::Read;
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while text(&seen).matches("Every 0.2s: vramgate status").count() < frames {
        assert!(
            std::time::Instant::now() < deadline,
            "no {frames} frames in 60 s: {}",
            text(&seen)
        );
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "the watch ended: {}", text(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    text(&seen)
}

/// `vramgate status --watch -n 0.2`: one table after another, with no control sequence, into a
/// pipe; on a terminal (a pty from script(1)) each table drawn over the last (clear, home); a
/// bad -n is refused with one line that says what to give.
#[test]
fn status_watch_redraws_on_a_terminal_and_appends_into_a_pipe() {
    let (_dir, bed) = runc_testbed("vg-swatch", "");
    let _cleanup = Cleanup(&bed);
    let mut child = spawn(&bed, "watched", &["sleep", "60"], &request("1Gi"));
    eventually("admitted", || reservations(&bed).len() == 1);

    let piped = Command::new(VRAMGATE)
        .args(["status", "--watch", "-n", "0.2"])
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = watch_frames(piped, 3);
    assert!(!out.contains('\x1b'), "{out:?}");
    assert!(out.matches("\n  watched ").count() >= 2, "{out}");

    let command = format!("{VRAMGATE} status -n 0.2");
    let on_tty = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = watch_frames(on_tty, 2);
    assert!(out.matches("\x1b[H\x1b[2J").count() >= 2, "{out:?}");
    assert!(out.contains("watched"), "{out:?}");

    for bad in ["0", "abc", "0.05", "1e9", "nan"] {
        let out = vramgate(&bed, &["status", "-n", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = text(&out.stderr);
        assert!(
            err.lines()
                .next()
                .unwrap_or("")
                .contains("is not a number of seconds from 0.1 to 86400"),
            "{bad}: {err}"
        );
    }

    support::runc_kill_when_running(&bed, "watched");
    child.wait().unwrap();
}
