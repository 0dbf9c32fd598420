//! `vramgate-runtime` in front of real runc: busybox bundles *without* vramgate hooks, so
//! every reservation here exists only because the wrapper added the hooks, on the simulated
//! 24,265 MiB GPU.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{wrapper, wrapper_testbed as testbed, Cleanup, LOADED_MACHINE_BOUND, VRAMGATE as CLI};
use vramgate_testbed::Testbed;

/// The container's state as runc reports it through the wrapper (`state` passes through).
fn container_status(bed: &Testbed, id: &str) -> Option<String> {
    let (key, value) = bed.env();
    let out = bed.runc(&["state", id]).env(key, value).output().unwrap();
    let state: Value = serde_json::from_slice(&out.stdout).ok()?;
    state["status"].as_str().map(str::to_string)
}

/// A bundle running `args` with `annotations`, as an engine hands it to the wrapper: no
/// hooks in its spec (the wrapper adds them) and no env of its own.
fn wrapped_bundle(bed: &Testbed, name: &str, args: &[&str], annotations: &[(&str, &str)]) -> PathBuf {
    bed.bundle(name, args, annotations, &[], false).unwrap()
}

/// Container `name` (`sleep 600`, with `annotations`) created through the wrapper, which must
/// succeed: a container that holds its reservation while a test goes on.
fn created(bed: &Testbed, name: &str, annotations: &[(&str, &str)]) {
    let bundle = wrapped_bundle(bed, name, &["sleep", "600"], annotations);
    assert_ok(
        wrapper(bed, &["create", "--bundle", &bundle.to_string_lossy(), name]),
        &format!("create {name}"),
    );
}

fn reserved_ids(bed: &Testbed) -> Vec<String> {
    let out = Command::new(CLI)
        .args(["status", "--json"])
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    status["gpus"][0]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["container_id"].as_str().unwrap().to_string())
        .collect()
}

fn eventually(what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn request() -> Vec<(&'static str, &'static str)> {
    vec![("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]
}

fn assert_ok((ok, stderr): (bool, String), what: &str) {
    assert!(ok, "{what}: {stderr}");
}

#[test]
fn a_failing_poststop_hook_of_the_spec_does_not_skip_the_release() {
    let (_dir, bed) = testbed("vg-rt-poststop", "");
    let _cleanup = Cleanup(&bed);
    let bundle = wrapped_bundle(&bed, "c1", &["true"], &request());
    // The spec's own poststop hook fails; runc runs no poststop hook after a failing one.
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["hooks"] = json!({"poststop": [{"path": "/bin/false", "args": ["false"]}]});
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

    let bundle = bundle.to_string_lossy().into_owned();
    assert_ok(wrapper(&bed, &["create", "--bundle", &bundle, "c1"]), "create");
    assert_eq!(reserved_ids(&bed), ["c1"], "admitted at createRuntime");
    assert_ok(wrapper(&bed, &["start", "c1"]), "start");
    eventually("the container exits", || {
        container_status(&bed, "c1").as_deref() == Some("stopped")
    });
    let (_, stderr) = wrapper(&bed, &["delete", "c1"]);
    assert!(reserved_ids(&bed).is_empty(), "vramgate's poststop ran: {stderr}");
    // ...first: runc reports the spec's hook as the second one, and it failed.
    assert!(stderr.contains("hook #1"), "{stderr}");
}

/// The reservations on GPU 0: (container id, bytes).
fn reserved_bytes(bed: &Testbed) -> Vec<(String, u64)> {
    support::reservations_by_gpu(bed).swap_remove(0).1
}

/// A container that asks only in NVIDIA's words (the toolkit's variables, whole MiB) is
/// admitted on its request with its limit beside it, under `limit = "toolkit"`, where the
/// wrapper replaces those variables with its own values (the same request and limit) and pins
/// both in vramgate's words before the hook confirms; one that also says a different amount in
/// vramgate's words is refused with one line and reserves nothing.
#[test]
fn nvidias_variables_alone_are_a_request_through_the_wrapper() {
    let (_dir, bed) = testbed("vg-rt-nvvars", "[enforce]\nlimit = \"toolkit\"\n");
    let _cleanup = Cleanup(&bed);
    let gpus = [("vramgate.dev/gpus", "0")];
    let env = ["NVIDIA_GPU_MEMORY_REQUEST=512", "NVIDIA_GPU_MEMORY_LIMIT=1536"];
    let bundle = bed.bundle("n1", &["sleep", "30"], &gpus, &env, false).unwrap();
    let bundle = bundle.to_string_lossy().into_owned();
    assert_ok(
        wrapper(&bed, &["run", "--detach", "--bundle", &bundle, "n1"]),
        "run --detach",
    );
    assert_eq!(
        reserved_bytes(&bed),
        [("n1".to_string(), 512 << 20)],
        "the request, 512 MiB, reserved and confirmed"
    );
    let status = support::status(&bed.config_path);
    assert_eq!(
        status["gpus"][0]["reservations"][0]["limit"],
        json!(1536u64 << 20),
        "{status}"
    );
    let spec: Value = serde_json::from_slice(&std::fs::read(Path::new(&bundle).join("config.json")).unwrap()).unwrap();
    let env: Vec<&str> = spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        env.contains(&"NVIDIA_GPU_MEMORY_LIMIT=1536") && env.contains(&"NVIDIA_GPU_MEMORY_REQUEST=512"),
        "the toolkit tier's own values: {env:?}"
    );
    assert_eq!(
        (
            &spec["annotations"]["vramgate.dev/memory"],
            &spec["annotations"]["vramgate.dev/memory-limit"]
        ),
        (&json!((512u64 << 20).to_string()), &json!((1536u64 << 20).to_string()))
    );
    assert_ok(wrapper(&bed, &["kill", "n1", "KILL"]), "kill");
    eventually("the container stops", || {
        container_status(&bed, "n1").as_deref() == Some("stopped")
    });
    assert_ok(wrapper(&bed, &["delete", "n1"]), "delete");
    assert!(reserved_ids(&bed).is_empty(), "released at poststop");

    let env = ["VRAMGATE_MEMORY=1Gi", "NVIDIA_GPU_MEMORY_LIMIT=1536"];
    let bundle = bed.bundle("n2", &["true"], &gpus, &env, false).unwrap();
    let bundle = bundle.to_string_lossy().into_owned();
    let (ok, stderr) = wrapper(&bed, &["create", "--bundle", &bundle, "n2"]);
    assert!(!ok, "refused");
    assert!(
        stderr.contains("VRAMGATE_MEMORY = \"1Gi\" and NVIDIA_GPU_MEMORY_LIMIT = \"1536\" ask for different amounts"),
        "{stderr}"
    );
    assert!(reserved_ids(&bed).is_empty(), "nothing reserved");
}

#[test]
fn runc_run_through_the_wrapper_is_accounted() {
    let (_dir, bed) = testbed("vg-rt-run", "");
    let _cleanup = Cleanup(&bed);
    let bundle = wrapped_bundle(&bed, "r1", &["sleep", "30"], &request());
    let bundle = bundle.to_string_lossy().into_owned();
    assert_ok(
        wrapper(&bed, &["run", "--detach", "--bundle", &bundle, "r1"]),
        "run --detach",
    );
    assert_eq!(reserved_ids(&bed), ["r1"], "admitted at createRuntime");
    assert_ok(wrapper(&bed, &["kill", "r1", "KILL"]), "kill");
    eventually("the container stops", || {
        container_status(&bed, "r1").as_deref() == Some("stopped")
    });
    assert_ok(wrapper(&bed, &["delete", "r1"]), "delete");
    assert!(reserved_ids(&bed).is_empty(), "released at poststop");
}

#[test]
fn a_create_that_no_runtime_will_run_reserves_nothing() {
    let dir = tempfile::Builder::new().prefix("vg-rt-none").tempdir().unwrap();
    let config = Testbed::default_config(dir.path(), "[runtime]\nruntimes = [\"/nonexistent/runc\"]");
    let bed = support::wrapper_testbed_in(dir.path(), &config);
    let bundle = wrapped_bundle(&bed, "n1", &["true"], &request());
    let (ok, stderr) = wrapper(&bed, &["create", "--bundle", &bundle.to_string_lossy(), "n1"]);
    assert!(!ok);
    assert!(stderr.contains("vramgate: no runtime to run next"), "{stderr}");
    assert!(reserved_ids(&bed).is_empty());
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap_or_default();
    assert!(!events.contains("\"admit\""), "{events}");
}

#[test]
fn a_create_whose_runtime_cannot_be_executed_gives_back_what_it_reserved() {
    let dir = tempfile::Builder::new().prefix("vg-rt-noexec").tempdir().unwrap();
    // Found and executable, but exec fails: its interpreter does not exist.
    let broken = dir.path().join("broken-runc");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = Testbed::default_config(
        dir.path(),
        &format!("[runtime]\nruntimes = [{:?}]", broken.display().to_string()),
    );
    let bed = support::wrapper_testbed_in(dir.path(), &config);
    let bundle = wrapped_bundle(&bed, "x1", &["true"], &request());
    let (ok, stderr) = wrapper(&bed, &["create", "--bundle", &bundle.to_string_lossy(), "x1"]);
    assert!(!ok, "{stderr}");
    assert!(reserved_ids(&bed).is_empty(), "{stderr}");
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"admit\"") && events.contains("create failed"),
        "{events}"
    );
}

/// The engine may name the bundle through a symlink or with `..`: the wrapper admits under
/// that spelling, runc reports its own (`..` cleaned), and the poststop names runc's. The
/// hook's confirmation records runc's spelling, so the stop releases the container at once,
/// with a `release` event, rather than leaving it for a later reclaim.
#[test]
fn a_bundle_named_through_a_symlink_and_dotdot_is_released_at_stop() {
    let (dir, bed) = testbed("vg-rt-symlink", "");
    let _cleanup = Cleanup(&bed);
    let real = wrapped_bundle(&bed, "s1", &["true"], &request());
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    std::fs::create_dir(dir.path().join("detour")).unwrap();
    let spelled = dir.path().join("detour/../link");
    let spelled = spelled.to_string_lossy().into_owned();
    assert_ok(wrapper(&bed, &["create", "--bundle", &spelled, "s1"]), "create");
    assert_eq!(reserved_ids(&bed), ["s1"], "admitted at create");
    assert_ok(wrapper(&bed, &["start", "s1"]), "start");
    eventually("the container exits", || {
        container_status(&bed, "s1").as_deref() == Some("stopped")
    });
    assert_ok(wrapper(&bed, &["delete", "s1"]), "delete");
    assert!(reserved_ids(&bed).is_empty(), "released at poststop");
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["container"] == "s1")
        .map(|e| e["event"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(kinds.iter().any(|k| k == "release"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "reclaim"), "{kinds:?}");
}

/// The ledger's queue as its file holds it: (container id, waiter pid).
fn ledger_queue(bed: &Testbed) -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(bed.state_dir.join("ledger.json")).unwrap();
    let ledger: Value = serde_json::from_str(&text).unwrap();
    ledger["queue"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let id = t["container_id"].as_str().unwrap().to_string();
            (id, t["waiter"]["pid"].as_u64().unwrap())
        })
        .collect()
}

/// An engine cancels a create that waits in the queue by SIGKILLing the wrapper (containerd's
/// runc shim does, at kubelet's deadline), and may run nothing through it afterwards
/// (containerd 2.1 does not). The killed wrapper runs no code: its queue guard drops the
/// ticket at once, with no other transaction on the host, and then ends. Before the
/// guard the ticket stayed, its waiter gone, until some other transaction ran.
#[test]
fn a_create_killed_while_it_waits_leaves_the_queue_at_once() {
    let (_dir, bed) = testbed("vg-rt-killed-wait", "");
    let _cleanup = Cleanup(&bed);
    created(
        &bed,
        "big",
        &[("vramgate.dev/memory", "20Gi"), ("vramgate.dev/gpus", "0")],
    );
    let waits = [
        ("vramgate.dev/memory", "10Gi"),
        ("vramgate.dev/gpus", "0"),
        ("vramgate.dev/policy", "wait"),
        ("vramgate.dev/timeout", "60s"),
    ];
    // Its queue guard is found by name in the host's `ps`: a name of this process's own.
    let w1 = support::own_name("w1");
    let mut create = queued_create(&bed, &w1, &waits);
    // The guard runs with no capability at all (and so the drop below proves its work needs
    // none): it inherited the wrapper's full permitted set, meant for runc.
    // Started right after the ticket's commit, when the create is about to wait.
    let guard_pid = || {
        let out = Command::new("ps").args(["-eo", "pid=,args="]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains(&format!("--vramgate-queue-guard {w1} ")))
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
    };
    eventually("a waiting create has a queue guard", || guard_pid().is_some());
    let guard_pid = guard_pid().unwrap();
    let field = |name: &str| {
        let status = std::fs::read_to_string(format!("/proc/{guard_pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()))
            .unwrap()
    };
    // Its first step; the ticket may show a moment before it.
    eventually("the guard drops every capability", || {
        field("CapPrm") == "0000000000000000"
    });
    assert_eq!(field("CapEff"), "0000000000000000");
    assert_eq!(field("NoNewPrivs"), "1");
    // What containerd's shim does: SIGKILL to the runtime process alone.
    create.kill().unwrap();
    let killed = Instant::now();
    create.wait().unwrap();
    let guard_of_w1 = || {
        let out = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.contains(&format!("--vramgate-queue-guard {w1} ")))
    };
    // Without the guard nothing would drop it (no other transaction runs here) until the
    // wait's 60 s timeout at the earliest: a bound well under that, for a loaded machine,
    // tells the guard's drop from that. How fast it was is printed, not asserted.
    let gone = || !ledger_queue(&bed).iter().any(|(id, _)| *id == w1);
    while !gone() && killed.elapsed() < LOADED_MACHINE_BOUND {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = killed.elapsed();
    eprintln!("the ticket left the ledger {left:?} after the kill");
    assert!(
        gone(),
        "the killed create's ticket stayed {left:?} (at most {LOADED_MACHINE_BOUND:?} on a loaded machine): {:?}",
        ledger_queue(&bed)
    );
    eventually("the queue guard ends", || !guard_of_w1());
    assert_eq!(reserved_ids(&bed), ["big"], "nothing admitted for the killed create");
}

/// A create that queues, as `vramgate-runtime create` under policy `wait`, in the background;
/// its ticket is in the ledger when this returns.
fn queued_create(bed: &Testbed, id: &str, annotations: &[(&str, &str)]) -> std::process::Child {
    let bundle = wrapped_bundle(bed, id, &["true"], annotations);
    let (key, value) = bed.env();
    let create = bed
        .runc(&["create", "--bundle", &bundle.to_string_lossy(), id])
        .env(key, value)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let waiter = create.id() as u64;
    eventually(&format!("{id} waits in the queue"), || {
        ledger_queue(bed).contains(&(id.to_string(), waiter))
    });
    create
}

/// Issue 43 item 6: a limit in the ledger, two waiters, one killed; the request and the limit
/// stay as they were. The killed create's queue guard drops its ticket in a commit of its own,
/// and holds no capability, so it cannot read the other waiter's `/proc/<pid>/exe` (EACCES).
/// The commit took that for a waiter of an older release (one without limits) and rewrote
/// the ledger in the old format, the running container reserved at its 6 GiB limit from then
/// on. The other waiter started long after the installed binaries: it runs this release.
#[test]
fn a_killed_waiter_leaves_a_running_containers_request_and_limit_as_they_were() {
    let (_dir, bed) = testbed("vg-rt-killed-limit", "");
    let _cleanup = Cleanup(&bed);
    created(
        &bed,
        "lim",
        &[
            ("vramgate.dev/memory", "2Gi"),
            ("vramgate.dev/memory-limit", "6Gi"),
            ("vramgate.dev/gpus", "0"),
        ],
    );
    // (schema of the file, bytes and limit of lim's share), as written on disk and as
    // `status --json` reads it.
    let held = || {
        let file: Value = serde_json::from_slice(&std::fs::read(bed.state_dir.join("ledger.json")).unwrap()).unwrap();
        let status = support::status(&bed.config_path);
        let lim = status["gpus"][0]["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["container_id"] == "lim")
            .cloned()
            .unwrap_or_else(|| panic!("lim is held: {status}"));
        (file["schema"].clone(), lim["bytes"].clone(), lim["limit"].clone())
    };
    const GIB: u64 = 1 << 30;
    let as_admitted = (json!(2), json!(2 * GIB), json!(6 * GIB));
    assert_eq!(held(), as_admitted, "the request and the limit side by side");
    // 2 GiB + 22 GiB is past the 24,265 MiB GPU: both wait.
    let waits = [
        ("vramgate.dev/memory", "22Gi"),
        ("vramgate.dev/gpus", "0"),
        ("vramgate.dev/policy", "wait"),
        ("vramgate.dev/timeout", "60s"),
    ];
    let mut w1 = queued_create(&bed, "w1", &waits);
    let mut w2 = queued_create(&bed, "w2", &waits);
    assert_eq!(held(), as_admitted, "two waiters of this release change nothing");
    // What containerd's shim does at kubelet's deadline: SIGKILL to the runtime alone. Its
    // guard's commit drops the ticket.
    w1.kill().unwrap();
    w1.wait().unwrap();
    eventually("the killed create's ticket leaves the ledger", || {
        !ledger_queue(&bed).iter().any(|(id, _)| id == "w1")
    });
    assert_eq!(
        ledger_queue(&bed).iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["w2"]
    );
    assert_eq!(
        held(),
        as_admitted,
        "the guard's commit left the request and the limit as they were (not the limit reserved whole, in format 1)"
    );
    w2.kill().unwrap();
    w2.wait().unwrap();
    eventually("w2's ticket leaves the ledger", || ledger_queue(&bed).is_empty());
    assert_eq!(held(), as_admitted);
    assert_eq!(reserved_ids(&bed), ["lim"], "nothing admitted for the killed creates");
}
