//! The driver limit through the built binaries, the way an engine runs them: real runc runs
//! `vramgate-hook` from the spec (the hook alone, as podman's and CRI-O's hooks.d do) or runs
//! behind `vramgate-runtime` (Docker, containerd), on cgroup v2 (`support::in_cgroup_v2`).
//! NVML is the stub of `tests/fixtures/nvml_limit_stub.c`, as strict as NVIDIA's kernel module
//! about privilege: it refuses to set a limit unless the calling thread holds CAP_SYS_ADMIN
//! in its effective set at the time of the call. So a hook that dropped the capability, or
//! never raised it, fails here as it would on an R615 driver.
//!
//! What this cannot show: that a real R615 driver takes the call and enforces the limit
//! (no such driver can run here or on the GPU machine, which has 580).

use crate::support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use support::{in_cgroup_v2, nvml_stub, stderr, stdout, HOOK, RUNTIME};
use vramgate::config::SIMULATED_GPU_UUID;
use vramgate_testbed::Testbed;

const GIB: u64 = 1 << 30;

/// A testbed on the simulated GPU whose NVML library is the stub, with `[enforce] limit =
/// "driver"` and `extra` config; `runc` is runc itself (hook alone) or the wrapper.
struct Host {
    _dir: tempfile::TempDir,
    bed: Testbed,
    log: PathBuf,
}

impl Host {
    fn new(name: &str, wrapper: bool, with_limits: bool, extra: &str) -> Host {
        Host::with_gpus(name, wrapper, with_limits, extra, "")
    }

    /// [`Host::new`] with `[[inventory.gpus]]` tables (`gpus`) instead of the simulated GPU.
    fn with_gpus(name: &str, wrapper: bool, with_limits: bool, extra: &str, gpus: &str) -> Host {
        Host::with_enforce(name, wrapper, with_limits, extra, gpus, "limit = \"driver\"")
    }

    /// [`Host::with_gpus`] with this `[enforce]` table's body instead of `limit = "driver"`.
    fn with_enforce(name: &str, wrapper: bool, with_limits: bool, extra: &str, gpus: &str, enforce: &str) -> Host {
        support::require("runc");
        let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
        // The stub's host has the GPUs of the inventory: the simulated one, or those of `gpus`.
        let uuids: Vec<&str> = gpus
            .lines()
            .filter_map(|l| l.strip_prefix("uuid = \"")?.strip_suffix('"'))
            .collect();
        let devices = if uuids.is_empty() {
            vec![vramgate::config::SIMULATED_GPU_UUID]
        } else {
            uuids
        };
        let (lib, log) = nvml_stub(dir.path(), with_limits, &devices);
        let runtime = if wrapper {
            format!("[runtime]\nruntimes = [\"runc\"]\nhook_path = {HOOK:?}\n")
        } else {
            String::new()
        };
        let config = Testbed::default_config(
            dir.path(),
            &format!(
                "{extra}\n{runtime}[inventory]\nbackend = \"static\"\nnvml_library = {:?}\n{gpus}\n[enforce]\n{enforce}\n",
                lib.display().to_string()
            ),
        );
        let runc = if wrapper { RUNTIME } else { "runc" };
        let bed = Testbed::create(dir.path(), runc, Path::new(HOOK), &config).unwrap();
        Host { _dir: dir, bed, log }
    }

    /// A bundle running `args` whose cgroup is `cgroup` (under /sys/fs/cgroup), with `env`;
    /// with the vramgate hooks in the spec unless the wrapper adds them.
    fn bundle(&self, id: &str, args: &[&str], memory: &str, env: &[&str], cgroup: &str, with_hooks: bool) -> PathBuf {
        let annotations = [("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")];
        self.bundle_with(id, args, &annotations, env, cgroup, with_hooks)
    }

    /// [`Host::bundle`] with these annotations instead of vramgate's request.
    fn bundle_with(
        &self,
        id: &str,
        args: &[&str],
        annotations: &[(&str, &str)],
        env: &[&str],
        cgroup: &str,
        with_hooks: bool,
    ) -> PathBuf {
        let bundle = self.bed.bundle(id, args, annotations, env, with_hooks).unwrap();
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["linux"]["cgroupsPath"] = json!(cgroup);
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        bundle
    }

    /// A runc verb (through the wrapper when this host has it) on cgroup v2. Output goes to
    /// files, not pipes: a created container keeps the stdio it inherited, and a pipe would
    /// never reach its end.
    fn runc(&self, args: &[&str]) -> Output {
        let mut all: Vec<&OsStr> = vec![OsStr::new("--root"), self.bed.runc_root.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        let (key, value) = self.bed.env();
        let out = tempfile::NamedTempFile::new_in(&self.bed.dir).unwrap();
        let err = tempfile::NamedTempFile::new_in(&self.bed.dir).unwrap();
        let status = in_cgroup_v2(&self.bed.runc, &all)
            .env(key, value)
            .env("PATH", support::path_with_sbin())
            .stdin(Stdio::null())
            .stdout(out.reopen().unwrap())
            .stderr(err.reopen().unwrap())
            .status()
            .unwrap();
        Output {
            status,
            stdout: std::fs::read(out.path()).unwrap(),
            stderr: std::fs::read(err.path()).unwrap(),
        }
    }

    /// `vramgate status --json`, on cgroup v2 as the hook sees it (the driver's figures are
    /// read for each container's cgroup).
    /// `runc create` of the container `id` from `bundle`, with runc's log in `runc-<id>.log`
    /// (where the wrapper's warnings go); returns the log's path too.
    fn create_logged(&self, bundle: &Path, id: &str) -> (Output, PathBuf) {
        let log = self.bed.dir.join(format!("runc-{id}.log"));
        let out = self.runc(&[
            "--log",
            log.to_str().unwrap(),
            "create",
            "--bundle",
            bundle.to_str().unwrap(),
            id,
        ]);
        (out, log)
    }

    /// `runc create` of the container `id` from `bundle`.
    fn create(&self, bundle: &Path, id: &str) -> Output {
        self.runc(&["create", "--bundle", bundle.to_str().unwrap(), id])
    }

    fn status(&self) -> Value {
        let (key, value) = self.bed.env();
        let out = in_cgroup_v2(
            Path::new(support::VRAMGATE),
            &[OsStr::new("status"), OsStr::new("--json")],
        )
        .env(key, value)
        .output()
        .unwrap();
        assert!(out.status.success(), "vramgate status: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The processes that loaded the stub NVML library (its constructor's "load <pid>" lines).
    fn loads(&self) -> Vec<String> {
        std::fs::read_to_string(format!("{}.loads", self.log.display()))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The driver-limit records in the state directory (`vramgate::enforce::lifecycle`).
    fn records(&self) -> Vec<String> {
        std::fs::read_dir(&self.bed.state_dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(vramgate::enforce::lifecycle::RECORD_PREFIX))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.bed.state_dir.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The one reservation of `id` in status: (bytes, tier, used).
    fn reservation(&self, id: &str) -> Option<(u64, Value, Value)> {
        let status = self.status();
        status["gpus"][0]["reservations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["container_id"] == id)
            .map(|r| (r["bytes"].as_u64().unwrap(), r["tier"].clone(), r["used"].clone()))
    }
}

impl Drop for Host {
    /// Deletes every container left, on cgroup v2 as they were made (runc removes their
    /// cgroups there), then the cgroups' parent directories of this test.
    fn drop(&mut self) {
        let out = self.runc(&["list", "-q"]);
        for id in String::from_utf8_lossy(&out.stdout).lines() {
            let _ = self.runc(&["delete", "--force", id]);
        }
        let parent = support::cgroup_v2_root().join(format!("vramgate-drv/{}", std::process::id()));
        let _ = std::fs::remove_dir(parent);
    }
}

/// The cgroup (systemd-less path) of this test process's container `id`.
fn drv_cgroup(id: &str) -> String {
    format!("/vramgate-drv/{}/{id}", std::process::id())
}

/// The calls that clear a limit, as the stub logged them: "clear <uuid> <cgroup> present" when
/// the cgroup directory still existed at the call, "... gone" when it did not.
fn clears(calls: &[String]) -> Vec<&str> {
    calls
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("clear "))
        .collect()
}

/// The `detail` of each `enforce` event.
fn enforce_details(host: &Host) -> Vec<String> {
    host.events()
        .into_iter()
        .filter(|e| e["event"] == "enforce")
        .map(|e| e["detail"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The calls that set a limit, as the stub logged them: "set <uuid> <cgroup> <soft> <hard>".
fn sets(calls: &[String]) -> Vec<&str> {
    calls
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("set "))
        .collect()
}

#[test]
fn the_hook_alone_sets_the_driver_limit_with_the_privilege_it_keeps() {
    let host = Host::new("drv-hook", false, true, "");
    // cgroupfs's shape of a container's cgroup (runc's own, Docker with cgroupfs).
    let cgroup = drv_cgroup("c1");
    let bundle = host.bundle("c1", &["sleep", "30"], "2Gi", &[], &cgroup, true);
    let out = host.create(&bundle, "c1");
    assert!(out.status.success(), "create: {}", stderr(&out));

    let dir = format!("/sys/fs/cgroup{cgroup}");
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [format!("set {SIMULATED_GPU_UUID} {dir} 0 {}", 2 * GIB)],
        "the driver was asked once, with CAP_SYS_ADMIN effective: {calls:?}"
    );
    let (bytes, tier, _) = host.reservation("c1").expect("reserved");
    assert_eq!((bytes, tier), (2 * GIB, json!("driver_limit")));
    let enforce: Vec<Value> = host.events().into_iter().filter(|e| e["event"] == "enforce").collect();
    assert_eq!(enforce.len(), 1, "{enforce:?}");
    assert!(
        enforce[0]["detail"].as_str().unwrap().contains(&dir),
        "the event names the cgroup: {}",
        enforce[0]
    );

    // What the driver counts for the container's cgroup is what status shows it uses, with
    // no process list at all (the static backend has none).
    std::fs::write(
        PathBuf::from(format!("{}.usage", host.log.display())),
        format!("{SIMULATED_GPU_UUID} {dir} {}\n", 3 * GIB),
    )
    .unwrap();
    let (_, _, used) = host.reservation("c1").unwrap();
    assert_eq!(used, json!(3 * GIB));
    assert_eq!(host.status()["gpus"][0]["reservations"][0]["over_reservation"], true);

    let out = host.runc(&["delete", "--force", "c1"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
    assert!(host.reservation("c1").is_none(), "released at poststop");
}

#[test]
fn the_wrapper_path_sets_it_on_a_systemd_shaped_cgroup_and_removes_the_toolkits_variables() {
    let host = Host::new("drv-wrap", true, true, "");
    // systemd's shape (Docker and kubelet with the systemd cgroup driver), and a container
    // that asks NVIDIA's hook for a limit of its own.
    let cgroup = format!("/system.slice/docker-vramgate{}.scope", std::process::id());
    let bundle = host.bundle(
        "w1",
        &["sh", "-c", "env; sleep 1"],
        "3Gi",
        // The same amount in NVIDIA's words (a different one is refused: see
        // `a_request_only_in_nvidias_variables_gets_the_driver_limit_through_the_wrapper`).
        &["NVIDIA_GPU_MEMORY_LIMIT=3072", "NVIDIA_GPU_MEMORY_REQUEST=3072"],
        &cgroup,
        false,
    );
    let out = host.runc(&["run", "--bundle", bundle.to_str().unwrap(), "w1"]);
    assert!(out.status.success(), "run: {}", stderr(&out));
    let env = stdout(&out);
    assert!(env.contains("PATH=/bin"), "{env}");
    assert!(
        !env.contains("NVIDIA_GPU_MEMORY"),
        "the toolkit's variables are gone, so its hook sets no second limit: {env}"
    );
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [format!("set {SIMULATED_GPU_UUID} /sys/fs/cgroup{cgroup} 0 {}", 3 * GIB)],
        "{calls:?}"
    );
    assert!(host.reservation("w1").is_none(), "released when the container ended");
    assert_event_kinds(&host, &["admit", "confirm", "enforce", "release"]);
}

/// Each of `kinds` is among the events the host's binaries logged.
fn assert_event_kinds(host: &Host, kinds: &[&str]) {
    let logged: Vec<String> = host
        .events()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    for kind in kinds {
        assert!(logged.iter().any(|k| k == kind), "{kind} in {logged:?}");
    }
}

/// A container that asks only in NVIDIA's words is admitted on them through the wrapper, which
/// then removes them (the toolkit's hook would set a second limit) and writes the request and
/// the limit as `vramgate.dev/memory` and `vramgate.dev/memory-limit` for the hook, which
/// confirms and sets the driver limit from them: soft = the request, hard = the limit. Status
/// shows both.
#[test]
fn a_request_only_in_nvidias_variables_gets_the_driver_limit_through_the_wrapper() {
    let host = Host::new("drv-nvvars", true, true, "");
    let cgroup = format!("/system.slice/docker-vramgate-nv{}.scope", std::process::id());
    let bundle = host.bundle_with(
        "nv1",
        &["sh", "-c", "env; sleep 1"],
        &[("vramgate.dev/gpus", "0")],
        &["NVIDIA_GPU_MEMORY_REQUEST=1024", "NVIDIA_GPU_MEMORY_LIMIT=2048"],
        &cgroup,
        false,
    );
    let out = host.runc(&["run", "--bundle", bundle.to_str().unwrap(), "nv1"]);
    assert!(out.status.success(), "run: {}", stderr(&out));
    let env = stdout(&out);
    assert!(env.contains("PATH=/bin") && !env.contains("NVIDIA_GPU_MEMORY"), "{env}");
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [format!(
            "set {SIMULATED_GPU_UUID} /sys/fs/cgroup{cgroup} {} {}",
            GIB,
            2 * GIB
        )],
        "soft = the request, 1024 MiB; hard = the limit, 2048 MiB: {calls:?}"
    );
    let admitted = host
        .events()
        .into_iter()
        .find(|e| e["event"] == "admit")
        .expect("an admit event");
    assert_eq!(
        (&admitted["gpus"][0]["bytes"], &admitted["gpus"][0]["limit"]),
        (&json!(GIB), &json!(2 * GIB)),
        "the admission event carries the limit: {admitted}"
    );
    assert!(host.reservation("nv1").is_none(), "released when the container ended");
    assert_event_kinds(&host, &["admit", "confirm", "enforce", "release"]);
}

/// The hook alone, on `vramgate.dev/memory: 1Gi` with `vramgate.dev/memory-limit: 4Gi`: the
/// stub NVML is asked for soft = the request, hard = the limit; status shows both, and the
/// over-use flag compares what the driver counts for the cgroup with the limit: 3 GiB (past
/// the request, within the limit) is not over, 5 GiB is.
#[test]
fn the_hook_alone_sets_soft_to_the_request_and_hard_to_the_limit_and_judges_use_by_the_limit() {
    let host = Host::new("drv-limit", false, true, "");
    let cgroup = drv_cgroup("l1");
    let asks = [
        ("vramgate.dev/memory", "1Gi"),
        ("vramgate.dev/memory-limit", "4Gi"),
        ("vramgate.dev/gpus", "0"),
    ];
    let bundle = host.bundle_with("l1", &["sleep", "30"], &asks, &[], &cgroup, true);
    let out = host.create(&bundle, "l1");
    assert!(out.status.success(), "create: {}", stderr(&out));
    let dir = format!("/sys/fs/cgroup{cgroup}");
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [format!("set {SIMULATED_GPU_UUID} {dir} {} {}", GIB, 4 * GIB)],
        "{calls:?}"
    );
    let usage = PathBuf::from(format!("{}.usage", host.log.display()));
    for (used, over) in [(3 * GIB, false), (5 * GIB, true)] {
        std::fs::write(&usage, format!("{SIMULATED_GPU_UUID} {dir} {used}\n")).unwrap();
        let status = host.status();
        let r = &status["gpus"][0]["reservations"][0];
        assert_eq!(
            (&r["bytes"], &r["limit"], &r["used"], &r["over_reservation"]),
            (&json!(GIB), &json!(4 * GIB), &json!(used), &json!(over)),
            "{status}"
        );
    }
    let out = host.runc(&["delete", "--force", "l1"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
    assert!(host.reservation("l1").is_none(), "released at poststop");
}

#[test]
fn the_hook_alone_refuses_a_container_that_asks_the_toolkit_for_its_own_limit() {
    let host = Host::new("drv-conflict", false, true, "");
    let cgroup = drv_cgroup("t1");
    let bundle = host.bundle(
        "t1",
        &["sleep", "30"],
        "1Gi",
        &["NVIDIA_GPU_MEMORY_LIMIT=1024"],
        &cgroup,
        true,
    );
    let out = host.create(&bundle, "t1");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("NVIDIA_GPU_MEMORY_LIMIT") && err.contains("apply-cuda-memory-limits"),
        "{err}"
    );
    assert!(sets(&host.calls()).is_empty());
    assert!(host.reservation("t1").is_none(), "nothing reserved");
}

#[test]
fn a_driver_without_the_symbol_is_refused_with_the_reason_or_fails_open() {
    // Fail-closed (the default): the start is refused, naming what the host lacks, and the
    // memory is not left reserved.
    let host = Host::new("drv-580", false, false, "");
    let cgroup = drv_cgroup("o1");
    let bundle = host.bundle("o1", &["sleep", "30"], "1Gi", &[], &cgroup, true);
    let out = host.create(&bundle, "o1");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("does not export nvmlDeviceSetMemoryLimits_v1") && err.contains("R615"),
        "{err}"
    );
    assert!(host.reservation("o1").is_none(), "given back");
    assert!(host.calls().is_empty(), "no NVML call without every symbol");

    // Fail-open: the container starts without the limit, and the event log says why.
    let host = Host::new("drv-580-open", false, false, "on_state_error = \"fail-open\"");
    let bundle = host.bundle("o2", &["sleep", "30"], "1Gi", &[], &cgroup.replace("o1", "o2"), true);
    let out = host.create(&bundle, "o2");
    assert!(out.status.success(), "{}", stderr(&out));
    let (bytes, tier, _) = host.reservation("o2").expect("reserved, without a limit");
    assert_eq!((bytes, tier), (GIB, Value::Null));
    let fail_open: Vec<Value> = host
        .events()
        .into_iter()
        .filter(|e| e["event"] == "fail_open")
        .collect();
    assert_eq!(fail_open.len(), 1, "{fail_open:?}");
    assert!(
        fail_open[0]["detail"].as_str().unwrap().contains("R615"),
        "{}",
        fail_open[0]
    );
}

/// A hook waiting in the queue under `limit = "driver"` holds CAP_SYS_ADMIN in its permitted
/// set only; under another tier it holds nothing but CAP_SYS_PTRACE (tests/it/hostile_state.rs).
#[test]
fn a_waiting_hook_under_the_driver_tier_holds_sys_admin_permitted_not_effective() {
    let host = Host::new("drv-caps", false, true, "policy = \"wait\"");
    let full = host.bundle("full", &["sleep", "30"], "20Gi", &[], &drv_cgroup("full"), true);
    let out = host.create(&full, "full");
    assert!(out.status.success(), "{}", stderr(&out));
    let waiter = host.bundle("waiter", &["sleep", "30"], "10Gi", &[], &drv_cgroup("waiter"), true);
    let (key, value) = host.bed.env();
    let mut args: Vec<&OsStr> = vec![OsStr::new("--root"), host.bed.runc_root.as_os_str()];
    let verb = ["create", "--bundle", waiter.to_str().unwrap(), "waiter"];
    args.extend(verb.iter().map(OsStr::new));
    let mut create = support::spawn_quiet(&mut in_cgroup_v2(&host.bed.runc, &args), key, value);
    // runc runs hooks as its children; `unshare` and `sh` exec runc in the spawned process.
    let hook = support::wait_until("the waiting hook", std::time::Duration::from_secs(20), || {
        let pid = hook_pids(create.id()).into_iter().next();
        (pid.is_some(), pid)
    })
    .unwrap();
    // Queued: the hook has read its config and is waiting for room.
    support::wait_until("the waiter's ticket", std::time::Duration::from_secs(20), || {
        let queued = !host.status()["gpus"][0]["queue"].as_array().unwrap().is_empty();
        (queued, ())
    });
    let status = std::fs::read_to_string(format!("/proc/{hook}/status")).unwrap_or_default();
    let field = |name: &str| vramgate::procfs::status_field(&status, name).map(str::to_string);
    let (ptrace, admin) = (1u64 << 19, 1u64 << 21);
    let eff = field("CapEff");
    let prm = field("CapPrm");
    let _ = create.kill();
    let _ = create.wait();
    let _ = Command::new("kill").arg(hook.to_string()).status();
    assert_eq!(eff, Some(format!("{ptrace:016x}")), "{status}");
    assert_eq!(prm, Some(format!("{:016x}", ptrace | admin)), "{status}");
}

/// Pids of running `vramgate-hook` processes (this build's) whose parent is `parent`.
fn hook_pids(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe == Path::new(HOOK).canonicalize().unwrap_or_default())
        })
        .filter(|pid| {
            // The fourth field of /proc/<pid>/stat, after the command in parentheses.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(parent)
        })
        .collect()
}

/// (a) The wrapper's `delete` clears the limit on each GPU of the container, before it execs
/// runc, which removes the cgroup: the stub saw the cgroup directory still there. The poststop
/// hook that runc runs afterwards finds the record gone and calls nothing.
#[test]
fn the_wrapper_clears_the_limit_at_delete_while_the_cgroup_still_exists() {
    let (a, b) = (
        "GPU-00000000-0000-0000-0000-00000000000a",
        "GPU-00000000-0000-0000-0000-00000000000b",
    );
    let host = Host::with_gpus("drv-delete", true, true, "", &two_gpus(a, b));
    let cgroup = drv_cgroup("d1");
    let bundle = host.bundle("d1", &["sleep", "30"], "2Gi", &[], &cgroup, false);
    on_gpus(&bundle, "0,1");
    let out = host.create(&bundle, "d1");
    assert!(out.status.success(), "create: {}", stderr(&out));
    let dir = format!("/sys/fs/cgroup{cgroup}");
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [
            format!("set {a} {dir} 0 {}", 2 * GIB),
            format!("set {b} {dir} 0 {}", 2 * GIB)
        ],
        "{calls:?}"
    );
    assert!(clears(&calls).is_empty(), "{calls:?}");
    assert_eq!(host.records().len(), 1, "the hook recorded what it set");

    let out = host.runc(&["delete", "--force", "d1"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
    let calls = host.calls();
    assert_eq!(
        clears(&calls),
        [format!("clear {a} {dir} present"), format!("clear {b} {dir} present")],
        "each GPU cleared once, by the wrapper, with CAP_SYS_ADMIN, before runc removed the cgroup: {calls:?}"
    );
    assert!(
        !std::path::Path::new(&support::cgroup_v2_root().join(cgroup.trim_start_matches('/'))).exists(),
        "runc removed the cgroup after"
    );
    assert!(host.records().is_empty(), "the record is gone");
    assert!(host.reservation("d1").is_none(), "released at poststop");
    let details = enforce_details(&host);
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("driver_limit cleared at delete") && d.contains(&format!("{a} cleared"))),
        "{details:?}"
    );
}

/// (b) A two-GPU container whose second set fails is refused, and the limit already set on
/// its first GPU is cleared before the hook returns the error: no limit is left on its cgroup.
#[test]
fn a_failed_set_on_the_second_gpu_clears_the_first() {
    let (a, b) = (
        "GPU-00000000-0000-0000-0000-00000000000a",
        "GPU-00000000-0000-0000-0000-00000000000b",
    );
    let host = Host::with_gpus("drv-half", false, true, "", &two_gpus(a, b));
    std::fs::write(format!("{}.fail-set", host.log.display()), b).unwrap();
    let cgroup = drv_cgroup("h1");
    let bundle = host.bundle("h1", &["sleep", "30"], "1Gi", &[], &cgroup, true);
    on_gpus(&bundle, "0,1");
    let out = host.create(&bundle, "h1");
    assert!(!out.status.success(), "refused");
    let err = stderr(&out);
    assert!(err.contains("NVML_ERROR_NOT_SUPPORTED") && err.contains(b), "{err}");
    let dir = format!("/sys/fs/cgroup{cgroup}");
    let calls = host.calls();
    assert_eq!(
        sets(&calls),
        [format!("set {a} {dir} 0 {GIB}"), format!("set not-supported {b} {dir}")],
        "{calls:?}"
    );
    assert_eq!(
        clears(&calls),
        [format!("clear {a} {dir} present")],
        "the first GPU's limit is cleared, on the cgroup that still exists: {calls:?}"
    );
    assert!(host.reservation("h1").is_none(), "the memory is given back");
    assert!(host.records().is_empty(), "nothing left to clear, so no record");
}

/// (c) The hook alone (podman's and CRI-O's hooks.d): the poststop hook clears what it can.
/// runc has removed the cgroup by then, so the driver is asked about a path that is gone (the
/// stub, as nvml.h describes, cannot open it: nothing left to clear); the record goes, and
/// the event log says what happened.
#[test]
fn the_hook_alone_asks_the_driver_at_poststop_about_the_gone_cgroup() {
    let host = Host::new("drv-poststop", false, true, "");
    let cgroup = drv_cgroup("p1");
    let bundle = host.bundle("p1", &["sleep", "30"], "1Gi", &[], &cgroup, true);
    let out = host.create(&bundle, "p1");
    assert!(out.status.success(), "create: {}", stderr(&out));
    assert_eq!(host.records().len(), 1);
    let out = host.runc(&["delete", "--force", "p1"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
    let dir = format!("/sys/fs/cgroup{cgroup}");
    let calls = host.calls();
    assert_eq!(
        clears(&calls),
        [format!("clear {SIMULATED_GPU_UUID} {dir} gone")],
        "asked once, at poststop, after runc removed the cgroup: {calls:?}"
    );
    assert!(
        host.records().is_empty(),
        "the record goes at poststop whatever the answer"
    );
    let details = enforce_details(&host);
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("driver_limit cleared at poststop") && d.contains("cgroup gone")),
        "{details:?}"
    );
    assert!(host.reservation("p1").is_none(), "released at poststop");
}

/// (d) `delete` of a container vramgate never limited costs no NVML load, through the wrapper
/// and its poststop hook alike, even beside a limited one.
#[test]
fn a_container_without_a_limit_loads_no_nvml_at_delete() {
    let host = Host::new("drv-plain", true, true, "");
    let limited = host.bundle("lim", &["sleep", "30"], "1Gi", &[], &drv_cgroup("lim"), false);
    let out = host.create(&limited, "lim");
    assert!(out.status.success(), "create: {}", stderr(&out));
    let loads = host.loads();
    assert_eq!(loads.len(), 1, "the limited container's hook loaded NVML: {loads:?}");
    // A container with a request but no GPU limit is a different test: this one has no
    // request at all, the common case on a host where vramgate runs as the default runtime.
    let plain = host.bed.bundle("plain", &["sleep", "30"], &[], &[], false).unwrap();
    let path = plain.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["linux"]["cgroupsPath"] = json!(drv_cgroup("plain"));
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let calls = host.calls();
    for verb in [
        &["create", "--bundle", plain.to_str().unwrap(), "plain"][..],
        &["delete", "--force", "plain"][..],
    ] {
        let out = host.runc(verb);
        assert!(out.status.success(), "{verb:?}: {}", stderr(&out));
    }
    assert_eq!(host.loads(), loads, "no process loaded NVML for the plain container");
    assert_eq!(host.calls(), calls, "and called nothing");
    assert_eq!(host.records().len(), 1, "the limited container's record stands");
}

/// Two static GPUs of 80 GiB, as `[[inventory.gpus]]` tables.
fn two_gpus(a: &str, b: &str) -> String {
    format!(
        "[[inventory.gpus]]\nindex = 0\nuuid = \"{a}\"\ntotal = \"80Gi\"\n[[inventory.gpus]]\nindex = 1\nuuid = \"{b}\"\ntotal = \"80Gi\"\n"
    )
}

/// Sets the bundle's `vramgate.dev/gpus` annotation.
fn on_gpus(bundle: &Path, gpus: &str) {
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["annotations"]["vramgate.dev/gpus"] = json!(gpus);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

// The hand-off to nvidia-container-toolkit's `apply-cuda-memory-limits` CDI hook. The node's
// CDI spec is in NVIDIA's generator shape (`nvidia-ctk cdi generate`: the hook in each GPU's
// edits) and names `tests/support/nvidia-cdi-hook`, a strict stand-in that records the limit
// it would set; the spec's hook goes into the bundle as an engine's CDI injection puts it.

/// `nvidia-ctk cdi generate`'s output for the simulated GPU, with `hook` as the hook's path:
/// YAML, the hook in the device's edits beside its device node. `with_hook: false` is a
/// toolkit without it (the same spec, its other hooks only).
fn generated_cdi_spec(hook: &Path, with_hook: bool) -> String {
    let memory_hook = format!(
        "    - hookName: createContainer\n      path: {}\n      args:\n      - nvidia-cdi-hook\n      - apply-cuda-memory-limits\n      - --driver-root\n      - /\n      - --gpu-id\n      - {SIMULATED_GPU_UUID}\n      env:\n      - NVIDIA_CTK_DEBUG=false\n",
        hook.display()
    );
    format!(
        "---\ncdiVersion: 0.5.0\ncontainerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\ndevices:\n- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n    hooks:\n    - hookName: createContainer\n      path: {}\n      args:\n      - nvidia-cdi-hook\n      - update-ldcache\n{}  name: \"0\"\n- containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n  name: {SIMULATED_GPU_UUID}\nkind: nvidia.com/gpu\n",
        hook.display(),
        if with_hook { memory_hook } else { String::new() },
    )
}

/// The node's toolkit files under `dir`: a CDI directory with the generated spec in it, and
/// the stand-in hook it names.
struct ToolkitNode {
    _dir: tempfile::TempDir,
    cdi: PathBuf,
    spec: PathBuf,
    /// What the stand-in recorded.
    log: PathBuf,
}

impl ToolkitNode {
    fn new(with_hook: bool) -> ToolkitNode {
        let dir = tempfile::Builder::new().prefix("tk-node").tempdir().unwrap();
        let (cdi, spec, log) = toolkit_files(dir.path(), with_hook);
        ToolkitNode {
            _dir: dir,
            cdi,
            spec,
            log,
        }
    }

    /// The `[enforce]` table's body for `limit` on this node.
    fn enforce(&self, limit: &str) -> String {
        format!(
            "limit = \"{limit}\"\ncdi_spec_dirs = [{:?}]",
            self.cdi.display().to_string()
        )
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn toolkit_files(dir: &Path, with_hook: bool) -> (PathBuf, PathBuf, PathBuf) {
    let bin = dir.join("usr-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let hook = bin.join("nvidia-cdi-hook");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/nvidia-cdi-hook"),
        &hook,
    )
    .unwrap();
    let cdi = dir.join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let spec = cdi.join("nvidia.yaml");
    std::fs::write(&spec, generated_cdi_spec(&hook, with_hook)).unwrap();
    (cdi, spec, bin.join("nvidia-cdi-hook.log"))
}

/// What an engine's CDI injection (`nvidia.com/gpu=0`) puts into the bundle: the spec's
/// top-level and device `0` edits' env and hooks. (Its device node is left out: there is no
/// /dev/nvidia0 here, and the hooks are what these tests are about.)
fn inject_cdi_device(bundle: &Path, spec_file: &Path) {
    let cdi: Value = serde_saphyr::from_str(&std::fs::read_to_string(spec_file).unwrap()).unwrap();
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let device = cdi["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "0")
        .unwrap();
    for edits in [&cdi["containerEdits"], &device["containerEdits"]] {
        for env in edits["env"].as_array().into_iter().flatten() {
            spec["process"]["env"].as_array_mut().unwrap().push(env.clone());
        }
        for hook in edits["hooks"].as_array().into_iter().flatten() {
            let stage = hook["hookName"].as_str().unwrap();
            let mut entry = hook.clone();
            entry.as_object_mut().unwrap().remove("hookName");
            if spec["hooks"].is_null() {
                spec["hooks"] = json!({});
            }
            let mut list = spec["hooks"][stage].as_array().cloned().unwrap_or_default();
            list.push(entry);
            spec["hooks"][stage] = Value::Array(list);
        }
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

/// `vramgate doctor`'s line for `area`, run as the binary with the host's config.
fn doctor_line(host: &Host, area: &str) -> String {
    let (key, value) = host.bed.env();
    let out = Command::new(support::VRAMGATE)
        .arg("doctor")
        .env(key, value)
        .output()
        .unwrap();
    let text = stdout(&out);
    text.lines()
        .find(|l| l.contains(&format!(" {area} ")))
        .unwrap_or_else(|| panic!("no {area} line in:\n{text}"))
        .to_string()
}

/// The value of `name` in the bundle's config.json env, as runc was given it.
fn spec_env(bundle: &Path, name: &str) -> Option<String> {
    let spec: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e.as_str()?.strip_prefix(name)?.strip_prefix('=').map(str::to_string))
}

#[test]
fn the_toolkit_limit_hands_vramgates_values_to_the_cdi_hook_over_the_containers_own() {
    let node = ToolkitNode::new(true);
    let host = Host::with_enforce("tk-hook", true, true, "", "", &node.enforce("toolkit"));
    let cgroup = drv_cgroup("tk1");
    // The container asks the toolkit for a limit of its own, in the spelling its hook reads
    // first.
    let bundle = host.bundle(
        "tk1",
        &["sleep", "30"],
        "2Gi",
        &["NVIDIA_GPU_MEMORY_REQUESTS=0", "NVIDIA_GPU_MEMORY_LIMITS=999999"],
        &cgroup,
        false,
    );
    inject_cdi_device(&bundle, &node.spec);
    let (out, runc_log) = host.create_logged(&bundle, "tk1");
    assert!(out.status.success(), "create: {}", stderr(&out));

    let lines = node.lines();
    let sets: Vec<&String> = lines.iter().filter(|l| l.starts_with("set ")).collect();
    let request = spec_env(&bundle, "NVIDIA_GPU_MEMORY_REQUEST").expect("vramgate wrote the request");
    assert_eq!(
        sets,
        [&format!("set {SIMULATED_GPU_UUID} {cgroup} {request} 2048")],
        "the toolkit's hook got vramgate's request and limit (2Gi = 2048 MiB), not the container's: {lines:?}"
    );
    assert!(request.parse::<u64>().unwrap() <= 2048, "{request}");
    assert_eq!(spec_env(&bundle, "NVIDIA_GPU_MEMORY_LIMITS"), None);
    assert_eq!(spec_env(&bundle, "NVIDIA_GPU_MEMORY_REQUESTS"), None);
    let (bytes, tier, _) = host.reservation("tk1").expect("reserved");
    assert_eq!((bytes, tier), (2 * GIB, json!("toolkit_limit")));
    assert!(
        sets_of(&host).is_empty(),
        "vramgate made no NVML call of its own: {:?}",
        host.calls()
    );
    let note = std::fs::read_to_string(&runc_log).unwrap_or_default();
    assert!(
        note.contains("removed NVIDIA_GPU_MEMORY_REQUESTS and NVIDIA_GPU_MEMORY_LIMITS"),
        "{note}"
    );
    let line = doctor_line(&host, "limit-by");
    assert!(
        line.contains(&format!(
            "apply-cuda-memory-limits hook, found in {}",
            node.spec.display()
        )),
        "{line}"
    );
    let out = host.runc(&["delete", "--force", "tk1"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
}

/// The stub's set calls (what vramgate's own driver call did).
fn sets_of(host: &Host) -> Vec<String> {
    sets(&host.calls()).into_iter().map(str::to_string).collect()
}

#[test]
fn the_toolkit_limit_without_the_hook_in_the_nodes_cdi_spec_records_no_limit_and_doctor_warns() {
    let node = ToolkitNode::new(false);
    let host = Host::with_enforce("tk-none", true, true, "", "", &node.enforce("toolkit"));
    let cgroup = drv_cgroup("tk2");
    let bundle = host.bundle("tk2", &["sleep", "30"], "2Gi", &[], &cgroup, false);
    inject_cdi_device(&bundle, &node.spec);
    let (out, runc_log) = host.create_logged(&bundle, "tk2");
    assert!(out.status.success(), "the container still starts: {}", stderr(&out));

    let (bytes, tier, _) = host.reservation("tk2").expect("reserved");
    assert_eq!(
        (bytes, tier),
        (2 * GIB, json!("guardrails")),
        "no limit is claimed where nothing applies one"
    );
    let log = std::fs::read_to_string(&runc_log).unwrap_or_default();
    let notes: Vec<&str> = log.lines().filter(|l| l.contains("no toolkit memory limit")).collect();
    assert_eq!(notes.len(), 1, "{log}");
    assert!(
        notes[0].contains(&format!("no CDI spec in {} carries", node.cdi.display()))
            && notes[0].contains("apply-cuda-memory-limits"),
        "{log}"
    );
    assert!(
        node.lines().is_empty(),
        "a toolkit without the hook runs none: {:?}",
        node.lines()
    );
    assert!(sets_of(&host).is_empty(), "{:?}", host.calls());
    let line = doctor_line(&host, "limit-by");
    assert!(
        line.starts_with("PROBLEM")
            && line.contains(&format!("no CDI spec in {} carries", node.cdi.display()))
            && line.contains("; fix: "),
        "{line}"
    );
    let out = host.runc(&["delete", "--force", "tk2"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
}

#[test]
fn the_driver_limit_with_the_toolkits_hook_on_the_node_sets_one_limit() {
    let node = ToolkitNode::new(true);
    let host = Host::with_enforce("tk-drv", true, true, "", "", &node.enforce("driver"));
    let cgroup = drv_cgroup("tk3");
    // The container asks the toolkit's hook for its own limit, in the spelling it reads first.
    let bundle = host.bundle(
        "tk3",
        &["sh", "-c", "env; sleep 1"],
        "3Gi",
        &["NVIDIA_GPU_MEMORY_REQUESTS=0", "NVIDIA_GPU_MEMORY_LIMITS=999999"],
        &cgroup,
        false,
    );
    inject_cdi_device(&bundle, &node.spec);
    let out = host.runc(&["run", "--bundle", bundle.to_str().unwrap(), "tk3"]);
    assert!(out.status.success(), "run: {}", stderr(&out));
    assert!(!stdout(&out).contains("NVIDIA_GPU_MEMORY"), "{}", stdout(&out));
    assert_eq!(
        sets_of(&host),
        [format!("set {SIMULATED_GPU_UUID} /sys/fs/cgroup{cgroup} 0 {}", 3 * GIB)],
        "vramgate's driver call"
    );
    assert_eq!(
        node.lines(),
        [format!("ran apply-cuda-memory-limits {SIMULATED_GPU_UUID}")],
        "the toolkit's hook ran and found nothing to set: one limit on the cgroup"
    );
    let line = doctor_line(&host, "limit-by");
    assert!(
        line.contains("vramgate's hook: nvmlDeviceSetMemoryLimits_v1")
            && line.contains(&format!("found in {} sets none", node.spec.display())),
        "{line}"
    );

    // The hook alone (podman's and CRI-O's hooks.d) cannot remove them: it refuses the
    // container before the toolkit's hook runs.
    let alone = Host::with_enforce("tk-drv-alone", false, true, "", "", &node.enforce("driver"));
    let cgroup = drv_cgroup("tk4");
    let bundle = alone.bundle(
        "tk4",
        &["true"],
        "3Gi",
        &["NVIDIA_GPU_MEMORY_REQUESTS=0", "NVIDIA_GPU_MEMORY_LIMITS=999999"],
        &cgroup,
        true,
    );
    inject_cdi_device(&bundle, &node.spec);
    let out = alone.runc(&["run", "--bundle", bundle.to_str().unwrap(), "tk4"]);
    assert!(!out.status.success(), "refused");
    assert!(
        stderr(&out).contains("NVIDIA_GPU_MEMORY_REQUESTS and NVIDIA_GPU_MEMORY_LIMITS"),
        "{}",
        stderr(&out)
    );
    assert!(sets_of(&alone).is_empty(), "{:?}", alone.calls());
    assert_eq!(
        node.lines().len(),
        1,
        "the toolkit's hook never ran: {:?}",
        node.lines()
    );
}
