//! Removing the package: the real `packaging/debian/postrm` (which the rpm's %postun runs too)
//! against a custom `state_dir` filled by the built binaries, so the script's list of file
//! names cannot drift from what the code writes. The script runs in a private mount namespace
//! with a tmpfs over /run, so its `rm -rf /run/vramgate` never touches the host's.

use crate::support;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::*;
use vramgate::enforce::lifecycle::{record_name, LimitRecord};
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const INVENTORY: &str = "policy = \"wait\"\n[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-removal\"\ntotal = \"8Gi\"\n";

fn postrm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/debian/postrm")
}

/// `sh postrm remove`, as dpkg runs it, with the scratch config.
fn run_postrm(scratch: &HookHarness) -> Output {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the removal test runs as root: sudo scripts/test"
    );
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs vramgate-removal-test /run && exec sh \"$0\" remove")
        .arg(postrm())
        .env("VRAMGATE_CONFIG", &scratch.config)
        .output()
        .expect("running unshare")
}

/// Every name under `dir`, relative to it, sorted (directories too).
fn tree(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            names.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    names.sort();
    names
}

/// A custom state directory holding every kind of file vramgate writes there, each made by
/// the code that makes it on a host: the hook's admissions (ledger, lock, events, held/
/// markers and their ledger-<inode>-<ctime>-<size>), `vramgate ledger repair` (a ledger set
/// aside), a rotated events log, a driver-limit record written as the hook writes it, and a
/// pod's notice (src/pod_notice.rs) left by the hook.
fn filled_state() -> (HookHarness, Vec<FakeContainer>) {
    let scratch = harness(INVENTORY);
    let bundle = scratch.bundle("a", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    // A ledger that cannot be read, set aside by `vramgate ledger repair` as an admin would.
    let zero = FakeContainer::start();
    let out = scratch.hook("createRuntime", &oci_state("zero", Some(zero.pid()), &bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(scratch.state_dir.join("ledger.json"), b"{ torn").unwrap();
    let out = scratch.cli(&["ledger", "repair"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut inits = vec![zero];
    for id in ["one", "two"] {
        let init = FakeContainer::start();
        let out = scratch.hook("createRuntime", &oci_state(id, Some(init.pid()), &bundle));
        assert!(out.status.success(), "{}", stderr(&out));
        inits.push(init);
    }
    // The events log rotates at 4 MiB: pad it past that, and the next event rotates it.
    let events = scratch.state_dir.join("events.jsonl");
    let mut padded = std::fs::read(&events).unwrap();
    padded.resize(padded.len() + (4 << 20) + 1, b'\n');
    std::fs::write(&events, padded).unwrap();
    let init = FakeContainer::start();
    let out = scratch.hook("createRuntime", &oci_state("three", Some(init.pid()), &bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    inits.push(init);
    let out = scratch.hook("poststop", &oci_state("three", None, &bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    let record = LimitRecord {
        container_id: "one".into(),
        runtime_root: None,
        bundle: Some(bundle.clone()),
        cgroup: "/sys/fs/cgroup/removal-test".into(),
        gpus: vec!["GPU-removal".into()],
    };
    scratch
        .open_state()
        .write_file(&record_name(None, "one"), &serde_json::to_vec(&record).unwrap())
        .unwrap();
    // The watch's and the DRA driver's heartbeats, as they beat.
    vramgate::service::beat(&scratch.open_state(), &mut false).unwrap();
    vramgate::service::beat_dra(&scratch.open_state(), &vramgate::clock::SystemClock).unwrap();

    // A pod's container given no GPU under the pod's memory annotation: the hook's notice.
    let pod = scratch.bundle(
        "p",
        &[
            ("vramgate.dev/memory", "1Gi"),
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-id", "sandbox1"),
            ("io.kubernetes.cri.sandbox-namespace", "default"),
            ("io.kubernetes.cri.sandbox-name", "trainer"),
            ("io.kubernetes.cri.container-name", "main"),
            ("io.kubernetes.cri.sandbox-uid", "0b7c8c1e-4a53-4f0c-9d39-1f6a2d0c9e21"),
        ],
    );
    let init = FakeContainer::start();
    let out = scratch.hook("createRuntime", &oci_state("pod-main", Some(init.pid()), &pod));
    assert!(out.status.success(), "{}", stderr(&out));
    inits.push(init);

    let names = tree(&scratch.state_dir);
    for expected in [
        "ledger.json",
        "lock",
        "events.jsonl",
        "events.jsonl.1",
        "held",
        "watch.heartbeat",
        "dra.heartbeat",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} in {names:?}");
    }
    for prefix in [
        "ledger.json.corrupt-",
        "driver-limit-",
        "held/c-",
        "held/ledger-",
        "notice.",
    ] {
        assert!(names.iter().any(|n| n.starts_with(prefix)), "{prefix}* in {names:?}");
    }
    (scratch, inits)
}

#[test]
fn postrm_removes_a_custom_state_dir_that_holds_only_vramgates_files() {
    let (scratch, _inits) = filled_state();
    let out = run_postrm(&scratch);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "nothing to say when everything went");
    assert!(!scratch.state_dir.exists(), "left: {:?}", tree(&scratch.state_dir));
}

#[test]
fn postrm_keeps_foreign_files_and_never_follows_a_link_out() {
    let (scratch, _inits) = filled_state();
    std::fs::write(scratch.state_dir.join("notes.txt"), b"not vramgate's").unwrap();
    // A link under one of vramgate's names, and held/ itself a link: neither is vramgate's,
    // and what they point at must survive.
    let outside = scratch.dir().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("c-0123456789abcdef"), b"keep").unwrap();
    std::fs::write(outside.join("target"), b"keep").unwrap();
    symlink(outside.join("target"), scratch.state_dir.join("ledger.json.corrupt-1")).unwrap();
    let out = run_postrm(&scratch);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        tree(&scratch.state_dir),
        vec!["ledger.json.corrupt-1".to_string(), "notes.txt".to_string()]
    );
    let msg = stderr(&out);
    assert!(
        msg.contains(&scratch.state_dir.display().to_string()) && msg.contains("notes.txt"),
        "{msg}"
    );
    assert_eq!(std::fs::read(outside.join("target")).unwrap(), b"keep");

    // held/ as a link out of the directory: nothing behind it is removed.
    std::fs::remove_file(scratch.state_dir.join("notes.txt")).unwrap();
    std::fs::remove_file(scratch.state_dir.join("ledger.json.corrupt-1")).unwrap();
    symlink(&outside, scratch.state_dir.join("held")).unwrap();
    let out = run_postrm(&scratch);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(tree(&scratch.state_dir), vec!["held".to_string()]);
    assert!(stderr(&out).contains("held"), "{}", stderr(&out));
    assert!(outside.join("c-0123456789abcdef").exists());
}
