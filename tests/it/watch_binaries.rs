//! `vramgate watch` and what rests on it, through the built binaries under real runc:
//!
//! - The hook records a container's own cgroup with its reservation (read from its init's
//!   `/proc/<pid>/cgroup`), and a process the container starts in a pid namespace of its own
//!   lies in it: what attribution, status and the watch find the container's processes by, so
//!   that a nested namespace is no longer outside vramgate.
//! - `vramgate doctor` says whether a watch runs under `over_use = "kill"` (its heartbeat in the
//!   state directory, which is what lets a pod's holders of one claim count it once): a problem
//!   before one runs, ok while the built `vramgate watch` runs, a problem again once it stopped.
//! - Under `over_use = "kill"`, the built `vramgate watch` on the NVML backend (the stub of
//!   `tests/fixtures/nvml_inventory_stub.c`, which lists the processes the test says hold
//!   memory) stops the runc container that holds more than its reservation, and only it: its
//!   neighbour on the same GPU, under its own reservation, runs on through later passes.
//! - Every built binary that tells which container a GPU process is (`watch`, `exporter`,
//!   `status`, `metrics`, the device plugin, the DRA driver) refuses to run in a cgroup
//!   namespace of its own, where it would read every other process's cgroup as `/../..`, and
//!   runs in the host's.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use vramgate::procfs;
use vramgate_testbed::Testbed;

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

/// Compiles the inventory's stub NVML (`tests/fixtures/nvml_inventory_stub.c`) into `dir`, its
/// "host" the file it returns second (`gpu <uuid> <total>` and `proc <uuid> <pid> <bytes>`
/// lines, read again on every call); every process-list call is logged, with the caller's pid,
/// in that file's path plus `.log`. A missing compiler fails the test.
fn nvml_inventory_stub(dir: &Path) -> (PathBuf, PathBuf) {
    let lib = dir.join("libnvml-inventory.so");
    let host = dir.join("nvml-host");
    compile_fixture_library(
        "nvml_inventory_stub.c",
        &lib,
        &[format!("-DGPUS_PATH=\"{}\"", host.display())],
    );
    (lib, host)
}

/// The ledger's record of container `id`'s init pid.
fn init_of(bed: &Testbed, id: &str) -> u32 {
    let ledger: Value = serde_json::from_slice(&std::fs::read(bed.state_dir.join("ledger.json")).unwrap()).unwrap();
    let entry = array_field(&ledger, "reservations")
        .iter()
        .find(|r| str_field(r, "container_id") == id)
        .unwrap_or_else(|| panic!("{id} is not in the ledger: {ledger}"));
    u64_field(field(entry, "init"), "pid") as u32
}

/// What runc says of container `id`: its status, or why it could not say (gone).
fn runc_status(bed: &Testbed, id: &str) -> String {
    let out = bed.runc(&["state", id]).output().unwrap();
    if !out.status.success() {
        return format!("no state: {}", stderr(&out));
    }
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    str_field(&state, "status").to_string()
}

/// The events about container `id` of kind `kind`.
fn events_of(bed: &Testbed, id: &str, kind: &str) -> Vec<Value> {
    events_in(&bed.state_dir)
        .into_iter()
        .filter(|e| str_field(e, "container") == id && str_field(e, "event") == kind)
        .collect()
}

#[test]
fn the_watch_under_kill_stops_only_the_container_over_its_reservation() {
    let dir = tempfile::Builder::new().prefix("vg-watch-kill").tempdir().unwrap();
    let (lib, host) = nvml_inventory_stub(dir.path());
    std::fs::write(&host, format!("gpu GPU-zero {}\n", 16 * GIB)).unwrap();
    let config = Testbed::default_config(
        dir.path(),
        &format!(
            "[inventory]\nbackend = \"nvml\"\nnvml_library = {:?}\n[enforce]\nover_use = \"kill\"\nover_use_interval = \"100ms\"\nover_use_margin = \"512Mi\"\n",
            lib.display().to_string()
        ),
    );
    let bed = Testbed::create(dir.path(), "runc", Path::new(HOOK), &config).unwrap();
    let _cleanup = Cleanup(&bed);

    // Two containers on GPU 0, 4Gi reserved each, admitted by the built hook on the stub NVML.
    let mut runs = Vec::new();
    for id in ["under", "over"] {
        runs.push(spawn_container(
            &bed,
            id,
            &["sleep", "60"],
            &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "GPU-zero")],
        ));
    }
    for id in ["under", "over"] {
        wait_reserved(&bed, id, 4 * GIB);
        eventually(&format!("runc says {id} runs"), Duration::from_secs(20), || {
            runc_status(&bed, id) == "running"
        });
    }
    let (under, over) = (init_of(&bed, "under"), init_of(&bed, "over"));

    // What NVML lists: "under" within its 4Gi, "over" 2 GiB past it (and past the margin).
    std::fs::write(
        &host,
        format!(
            "gpu GPU-zero {}\nproc GPU-zero {under} {}\nproc GPU-zero {over} {}\n",
            16 * GIB,
            3 * GIB,
            6 * GIB
        ),
    )
    .unwrap();
    // Status on the same NVML attributes each process to its container: the watch measures both.
    let measured = status(&bed.config_path);
    let used: Vec<(String, u64)> = array_field(&status_gpus(&measured)[0], "reservations")
        .iter()
        .map(|r| (str_field(r, "container_id").to_string(), u64_field(r, "used")))
        .collect();
    assert!(
        used.contains(&("under".to_string(), 3 * GIB)) && used.contains(&("over".to_string(), 6 * GIB)),
        "{used:?}"
    );

    let watch = RunningWatch::start(&bed);
    let stop = wait_until("an over_use_stop event for over", Duration::from_secs(15), || {
        let stops = events_of(&bed, "over", "over_use_stop");
        (!stops.is_empty(), stops)
    });
    assert!(
        str_field(&stop[0], "detail").contains(&format!("SIGKILL to pid {over}")),
        "{stop:?}"
    );
    assert_eq!(events_of(&bed, "over", "over_use").len(), 1);
    eventually("runc says over is no longer running", Duration::from_secs(15), || {
        runc_status(&bed, "over") != "running"
    });
    let exited = runs[1].wait().unwrap();
    assert!(!exited.success(), "over's sleep was killed, not finished: {exited:?}");

    // Two more process queries by the watch after the stop was logged: a whole pass since has
    // measured "under" at 3 GiB (its line still in the stub's list) and left it alone.
    let watch_pid = std::fs::read_to_string(bed.state_dir.join(vramgate::service::HEARTBEAT_FILE))
        .unwrap()
        .trim()
        .to_string();
    let log = PathBuf::from(format!("{}.log", host.display()));
    let queries = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| *l == format!("processes GPU-zero {watch_pid}"))
            .count()
    };
    let seen = queries();
    wait_until("two more passes of the watch", Duration::from_secs(15), || {
        let now = queries();
        (now >= seen + 2, now)
    });
    assert_eq!(runc_status(&bed, "under"), "running");
    assert!(runs[0].try_wait().unwrap().is_none(), "under's runc run exited");
    assert!(
        events_of(&bed, "under", "over_use").is_empty() && events_of(&bed, "under", "over_use_stop").is_empty(),
        "{:?}",
        events_in(&bed.state_dir)
    );
    wait_released(&bed, "over");
    wait_reserved(&bed, "under", 4 * GIB);

    watch.stop();
    assert!(runc_kill_when_running(&bed, "under"));
    runs[0].wait().unwrap();
    wait_released(&bed, "under");
}

/// Where a binary runs in [`every_attributing_binary_refuses_a_cgroup_namespace_of_its_own`]:
/// its cgroup namespace, and what it finds at /proc and /sys/fs/cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placing {
    /// The test's own namespaces.
    Host,
    /// A cgroup namespace of its own (`unshare --cgroup`), made in a cgroup v2 directory of
    /// the test's (as containerd makes one in the container's cgroup), the host's layout
    /// otherwise: hybrid on the development VM.
    OwnCgroupNamespace,
    /// The same, with cgroup v2 at /sys/fs/cgroup, as on a GPU host (on a hybrid host: a
    /// private mount namespace with the unified hierarchy bound over /sys/fs/cgroup).
    OwnCgroupNamespaceOnV2,
    /// A cgroup namespace of its own under a pid namespace whose pid 1 (a shell left in the
    /// test's cgroup namespace) it may read: `/proc/1/ns/cgroup` is compared, whatever the
    /// host's pid 1 lets a root process read.
    OwnCgroupNamespaceReadablePid1,
    /// The host's cgroup namespace under that pid namespace: the comparison finds one.
    HostCgroupNamespaceReadablePid1,
    /// The host's cgroup namespace with cgroup v2 at /sys/fs/cgroup: the layout alone is no
    /// reason to refuse.
    HostCgroupNamespaceOnV2,
}

/// A cgroup v2 directory of the test's own, whose processes are killed and which is removed
/// when dropped: where a [`Placing`] makes its cgroup namespace.
struct ScratchCgroup {
    /// Its name under the v2 root.
    name: String,
    dir: PathBuf,
}

impl ScratchCgroup {
    fn new(label: &str) -> ScratchCgroup {
        let name = format!("vramgate-cgroupns-test-{}-{label}", std::process::id());
        let dir = cgroup_v2_root().join(&name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        ScratchCgroup { name, dir }
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && std::time::Instant::now() < deadline {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `program args` placed as `placing` says, its cgroup namespace (where one of its own) made in
/// `cgroup`. The shell joins the cgroup first, so the namespace's root is that cgroup and pid 1
/// lies outside it, as a container's namespace is rooted in the container's cgroup.
fn placed(placing: Placing, cgroup: &ScratchCgroup, program: &Path, args: &[&str]) -> Command {
    let v2_root = cgroup_v2_root();
    let bind_v2 = if v2_root == Path::new("/sys/fs/cgroup") {
        String::new()
    } else {
        format!("mount --bind {} /sys/fs/cgroup && ", v2_root.display())
    };
    let join = |root: &Path| format!("echo $$ > {}/cgroup.procs", root.join(&cgroup.name).display());
    // `"$0" "$@"`: the program and its arguments, passed after the script.
    let (wrapper, script): (&[&str], String) = match placing {
        Placing::Host => {
            let mut cmd = Command::new(program);
            cmd.args(args);
            return cmd;
        }
        Placing::OwnCgroupNamespace => (
            &[],
            format!("{} && exec unshare --cgroup \"$0\" \"$@\"", join(&v2_root)),
        ),
        Placing::OwnCgroupNamespaceOnV2 => (
            &["--mount", "--propagation", "private"],
            format!(
                "{bind_v2}{} && exec unshare --cgroup \"$0\" \"$@\"",
                join(Path::new("/sys/fs/cgroup"))
            ),
        ),
        // The shell stays pid 1 (no exec), in the cgroup it joined, in the test's namespace.
        Placing::OwnCgroupNamespaceReadablePid1 => (
            &["--pid", "--fork", "--mount-proc"],
            format!("{} && unshare --cgroup \"$0\" \"$@\"; exit $?", join(&v2_root)),
        ),
        Placing::HostCgroupNamespaceReadablePid1 => (
            &["--pid", "--fork", "--mount-proc"],
            format!("{} && \"$0\" \"$@\"; exit $?", join(&v2_root)),
        ),
        Placing::HostCgroupNamespaceOnV2 => (
            &["--mount", "--propagation", "private"],
            format!("{bind_v2}exec \"$0\" \"$@\""),
        ),
    };
    let mut cmd = Command::new("unshare");
    cmd.args(wrapper).args(["sh", "-c"]).arg(script).arg(program).args(args);
    cmd
}

/// Runs `cmd` to its end (20 s at most: each refusal comes before any wait), stdin and stdout
/// closed; returns its exit code and stderr.
fn run_to_end(mut cmd: Command, what: &str) -> (Option<i32>, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let exited = wait_until(&format!("{what} to exit"), Duration::from_secs(20), || {
        let status = child.try_wait().unwrap();
        (status.is_some(), status)
    });
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (exited.and_then(|s| s.code()), err)
}

/// The one line every refusal ends with: what to set.
const RUN_IN_THE_HOSTS: &str = "run it in the host's cgroup namespace: under Kubernetes a privileged container (securityContext.privileged: true; containerd and CRI-O give every other container on cgroup v2 a cgroup namespace of its own, hostPID or not), under docker or podman `run --cgroupns=host`";

/// Seen from a cgroup namespace of its own (what containerd and CRI-O give every pod that is
/// not privileged on cgroup v2), every other process's `/proc/<pid>/cgroup` climbs (`/../..`)
/// and none lies in its container's recorded cgroup: the watch would stop no one, the exporter
/// and status would show all GPU memory as used outside vramgate, the plugins would publish
/// less than there is. Each built binary that attributes GPU processes (`vramgate watch`,
/// `exporter`, `status`, `metrics`, `vramgate-device-plugin`, `vramgate-dra`), on an NVML
/// inventory (the stub), refuses to run there: exit 1, and a last line that says what to set.
/// On the host's layout and on cgroup v2 at /sys/fs/cgroup alike; where pid 1's namespace can
/// be read (a pid namespace of the test's), by the comparison itself. In the host's cgroup
/// namespace, the same config works (the watch measures, the exporter serves, status prints),
/// with cgroup v2 at /sys/fs/cgroup and under that pid namespace too; and an inventory that
/// lists no processes (the static one) runs even from a namespace of its own.
#[test]
fn every_attributing_binary_refuses_a_cgroup_namespace_of_its_own() {
    let dir = tempfile::Builder::new().prefix("vg-cgroupns").tempdir().unwrap();
    let (lib, host) = nvml_inventory_stub(dir.path());
    std::fs::write(&host, format!("gpu GPU-zero {}\n", 16 * GIB)).unwrap();
    let nvml_config = dir.path().join("nvml.toml");
    std::fs::write(
        &nvml_config,
        Testbed::default_config(
            dir.path(),
            &format!(
                "[inventory]\nbackend = \"nvml\"\nnvml_library = {:?}\n[enforce]\nover_use_interval = \"100ms\"\n",
                lib.display().to_string()
            ),
        ),
    )
    .unwrap();
    let static_config = dir.path().join("static.toml");
    std::fs::write(&static_config, Testbed::default_config(dir.path(), ONE_GPU)).unwrap();
    let plugin_dir = dir.path().join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let plugin_dir = plugin_dir.display().to_string();
    let (vramgate, device_plugin, dra) = (
        PathBuf::from(VRAMGATE),
        built_binary("vramgate-device-plugin"),
        built_binary("vramgate-dra"),
    );
    let binaries: [(&str, &Path, Vec<&str>); 6] = [
        ("vramgate watch", &vramgate, vec!["watch"]),
        (
            "vramgate exporter",
            &vramgate,
            vec!["exporter", "--listen", "127.0.0.1:0"],
        ),
        ("vramgate status", &vramgate, vec!["status"]),
        ("vramgate metrics", &vramgate, vec!["metrics"]),
        (
            "vramgate-device-plugin",
            &device_plugin,
            vec!["--plugin-dir", &plugin_dir],
        ),
        ("vramgate-dra", &dra, vec!["--node-name", "node-1"]),
    ];
    let cgroup = ScratchCgroup::new("refused");
    for placing in [
        Placing::OwnCgroupNamespace,
        Placing::OwnCgroupNamespaceOnV2,
        Placing::OwnCgroupNamespaceReadablePid1,
    ] {
        for (name, program, args) in &binaries {
            let what = format!("{name} ({placing:?})");
            let mut cmd = placed(placing, &cgroup, program, args);
            cmd.env("VRAMGATE_CONFIG", &nvml_config);
            let (code, err) = run_to_end(cmd, &what);
            let last = err.lines().last().unwrap_or_default();
            assert_eq!(code, Some(1), "{what}: {err}");
            assert!(last.ends_with(RUN_IN_THE_HOSTS), "{what}: {err}");
            let compared = last.contains("is in a cgroup namespace of its own (/proc/self/ns/cgroup is cgroup:[");
            // Where the host's pid 1 cannot be read (the development VM's), its cgroup as read
            // from the namespace: the v2 root, above the namespace's.
            let climbed = last.contains("/proc/1/cgroup reads \"")
                && last.contains("a path above this process's cgroup namespace");
            if placing == Placing::OwnCgroupNamespaceReadablePid1 {
                assert!(compared, "{what}: {err}");
            } else {
                assert!(compared || climbed, "{what}: {err}");
            }
            let prefix = name.split(' ').next().unwrap();
            assert!(last.starts_with(&format!("{prefix}: ")), "{what}: {err}");
        }
    }

    // The host's cgroup namespace: status prints the GPU, whatever the layout and pid 1.
    for placing in [
        Placing::Host,
        Placing::HostCgroupNamespaceOnV2,
        Placing::HostCgroupNamespaceReadablePid1,
    ] {
        let mut cmd = placed(placing, &cgroup, &vramgate, &["status", "--json"]);
        cmd.env("VRAMGATE_CONFIG", &nvml_config);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "status ({placing:?}): {}", stderr(&out));
        assert!(stdout(&out).contains("\"uuid\": \"GPU-zero\""), "{}", stdout(&out));
    }
    // The watch measures (its heartbeat: a pass went through) and the exporter serves.
    let state = vramgate::ledger::StateDir::open_or_create(&dir.path().join("state")).unwrap();
    let mut watch = Command::new(VRAMGATE)
        .arg("watch")
        .env("VRAMGATE_CONFIG", &nvml_config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let heartbeat = state.path().join(vramgate::service::HEARTBEAT_FILE);
    let measured = wait_until(
        "the watch's first heartbeat, or its exit",
        Duration::from_secs(10),
        || {
            let exited = watch.try_wait().unwrap();
            (exited.is_some() || heartbeat.exists(), exited)
        },
    );
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(
        measured.is_none() && heartbeat.exists(),
        "the watch exited: {measured:?}"
    );
    let mut exporter = Command::new(VRAMGATE)
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env("VRAMGATE_CONFIG", &nvml_config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(exporter.stderr.as_mut().unwrap()),
        &mut first,
    )
    .unwrap();
    let served = first
        .trim()
        .strip_prefix("vramgate exporter: serving http://")
        .and_then(|url| url.strip_suffix("/metrics"))
        .map(str::to_string);
    let metrics = served.as_deref().map(|addr| http_get(addr, "/metrics"));
    let _ = exporter.kill();
    let _ = exporter.wait();
    let metrics = metrics.unwrap_or_else(|| panic!("the exporter did not start: {first}"));
    assert!(
        metrics.contains("vramgate_gpu_memory_total_bytes{") && metrics.contains("GPU-zero"),
        "{metrics}"
    );

    // No process listed, nothing attributed: a static inventory runs from a namespace of its own.
    let mut cmd = placed(Placing::OwnCgroupNamespace, &cgroup, &vramgate, &["status", "--json"]);
    cmd.env("VRAMGATE_CONFIG", &static_config);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "status on a static inventory: {}", stderr(&out));
    assert!(stdout(&out).contains("\"uuid\": \"GPU-zero\""), "{}", stdout(&out));
}

/// The body of `GET path` from `addr` (`host:port`), over plain HTTP/1.0.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    answer
}
