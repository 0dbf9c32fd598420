//! `vramgate watch` and what rests on it, through the built binaries under real runc:
//!
//! - The hook records a container's own cgroup with its reservation (read from its init's
//!   `/proc/<pid>/cgroup`), and a process the container starts in a pid namespace of its own
//!   lies in it: what attribution, status and the watch find the container's processes by, so
//!   that a nested namespace is no longer outside vramgate.
//! - `vramgate doctor` says whether a watch runs under `over_use = "kill"` (its heartbeat in the
//!   state directory, which is what lets a pod's holders of one claim count it once): a problem
//!   before one runs, ok while the built `vramgate watch` runs, a problem again once it stopped.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use vramgate::procfs;
use vramgate::testbed::Testbed;

const ONE_GPU: &str =
    "[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n";

/// The first child of `parent` whose command is `name`, once there is one.
fn child_named(parent: u32, name: &str) -> u32 {
    wait_until(&format!("a child {name} of {parent}"), Duration::from_secs(10), || {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        let found = children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .find(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == name));
        (found.is_some(), found)
    })
    .unwrap()
}

#[test]
fn the_hook_records_the_containers_cgroup_and_a_process_in_a_nested_pid_namespace_lies_in_it() {
    let (_dir, bed) = runc_testbed("vg-watch-cgroup", ONE_GPU);
    let _cleanup = Cleanup(&bed);
    let unshare = bed.rootfs.join("bin/unshare");
    if !unshare.exists() {
        std::os::unix::fs::symlink("busybox", &unshare).unwrap();
    }
    let bundle = bed
        .bundle(
            "nested",
            &["sh", "-c", "unshare --pid --fork sleep 60 & exec sleep 60"],
            &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "GPU-zero")],
            &[],
            true,
        )
        .unwrap();
    // `unshare --pid` needs CAP_SYS_ADMIN (in a pod, a user namespace of its own gives it:
    // `unshare -Urpf`); the container's cgroup is the same either way.
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for set in ["bounding", "effective", "permitted"] {
        spec["process"]["capabilities"][set]
            .as_array_mut()
            .unwrap()
            .push(json!("CAP_SYS_ADMIN"));
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let mut run = bed
        .runc_run(&bundle, "nested")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("nested reserved, or its start failed", Duration::from_secs(15), || {
        let failed = run.try_wait().unwrap().is_some();
        (failed || reservations(&bed).iter().any(|(c, _)| c == "nested"), ())
    });
    if run.try_wait().unwrap().is_some() {
        let out = run.wait_with_output().unwrap();
        panic!("the container did not start: {}", stderr(&out));
    }
    wait_reserved(&bed, "nested", GIB);

    let ledger: Value = serde_json::from_slice(&std::fs::read(bed.state_dir.join("ledger.json")).unwrap()).unwrap();
    let entry = &ledger["reservations"][0];
    let init = entry["init"]["pid"].as_u64().unwrap() as u32;
    let recorded = entry["cgroup"]
        .as_str()
        .unwrap_or_else(|| panic!("no cgroup recorded: {ledger}"));
    let init_cgroups = procfs::cgroups(init).unwrap();
    assert_eq!(
        Some(recorded),
        procfs::own_cgroup(&init_cgroups).as_deref(),
        "{init_cgroups}"
    );
    assert!(
        recorded.ends_with("/nested"),
        "runc's cgroup for the container: {recorded}"
    );

    let nested = child_named(child_named(init, "unshare"), "sleep");
    assert_ne!(procfs::pid_namespace(nested), procfs::pid_namespace(init));
    assert!(
        procfs::in_cgroup(recorded, &procfs::cgroups(nested).unwrap()),
        "{recorded} / {:?}",
        procfs::cgroups(nested)
    );
    // The host's processes are not the container's.
    assert!(!procfs::in_cgroup(
        recorded,
        &procfs::cgroups(std::process::id()).unwrap()
    ));
}

/// `vramgate doctor`'s watch line for the testbed.
fn doctor_watch_line(bed: &Testbed) -> String {
    let (key, value) = bed.env();
    let out = Command::new(VRAMGATE).arg("doctor").env(key, value).output().unwrap();
    let text = stdout(&out);
    text.lines()
        .find(|l| l.contains(" watch "))
        .unwrap_or_else(|| panic!("no watch line in:\n{text}"))
        .to_string()
}

#[test]
fn doctor_says_whether_a_watch_runs_and_what_that_means_for_claims() {
    let (_dir, bed) = runc_testbed(
        "vg-watch-doctor",
        &format!("{ONE_GPU}[enforce]\nover_use = \"kill\"\nover_use_interval = \"100ms\"\n"),
    );
    vramgate::ledger::StateDir::open_or_create(&bed.state_dir).unwrap();
    let never = doctor_watch_line(&bed);
    assert!(
        never.starts_with("PROBLEM")
            && never.contains("over_use = \"kill\", but no `vramgate watch` has ever measured here")
            && never.contains("each count it whole"),
        "{never}"
    );

    let watch = RunningWatch::start(&bed);
    let runs = doctor_watch_line(&bed);
    assert!(
        runs.starts_with("ok")
            && runs.contains("`vramgate watch` runs")
            && runs.contains("a pod's containers that hold one DRA claim count it once"),
        "{runs}"
    );

    // Stopped: once its heartbeat is older than four intervals and 2 s, claims count whole.
    watch.stop();
    let stale = wait_until("doctor to see the watch gone", Duration::from_secs(15), || {
        let line = doctor_watch_line(&bed);
        (line.contains("no `vramgate watch` has measured for"), line)
    });
    assert!(
        stale.starts_with("PROBLEM") && stale.contains("each count it whole"),
        "{stale}"
    );
}
