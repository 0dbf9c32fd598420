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

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use support::{in_cgroup_v2, nvml_stub, stderr, stdout, HOOK, RUNTIME};
use vramgate::config::SIMULATED_GPU_UUID;
use vramgate::testbed::Testbed;

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
        support::require("runc");
        let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
        let (lib, log) = nvml_stub(dir.path(), with_limits);
        let runtime = if wrapper {
            format!("[runtime]\nruntimes = [\"runc\"]\nhook_path = {HOOK:?}\n")
        } else {
            String::new()
        };
        let config = Testbed::default_config(
            dir.path(),
            &format!(
                "{extra}\n{runtime}[inventory]\nbackend = \"static\"\nnvml_library = {:?}\n[enforce]\nlimit = \"driver\"\n",
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
        let bundle = self
            .bed
            .bundle(
                id,
                args,
                &[("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")],
                env,
                with_hooks,
            )
            .unwrap();
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
    let cgroup = format!("/vramgate-drv/{}/c1", std::process::id());
    let bundle = host.bundle("c1", &["sleep", "30"], "2Gi", &[], &cgroup, true);
    let out = host.runc(&["create", "--bundle", bundle.to_str().unwrap(), "c1"]);
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
        &["NVIDIA_GPU_MEMORY_LIMIT=999999", "NVIDIA_GPU_MEMORY_REQUEST=1"],
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
    let kinds: Vec<String> = host
        .events()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    for kind in ["admit", "confirm", "enforce", "release"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} in {kinds:?}");
    }
}

#[test]
fn the_hook_alone_refuses_a_container_that_asks_the_toolkit_for_its_own_limit() {
    let host = Host::new("drv-conflict", false, true, "");
    let cgroup = format!("/vramgate-drv/{}/t1", std::process::id());
    let bundle = host.bundle(
        "t1",
        &["sleep", "30"],
        "1Gi",
        &["NVIDIA_GPU_MEMORY_LIMIT=999999"],
        &cgroup,
        true,
    );
    let out = host.runc(&["create", "--bundle", bundle.to_str().unwrap(), "t1"]);
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
    let cgroup = format!("/vramgate-drv/{}/o1", std::process::id());
    let bundle = host.bundle("o1", &["sleep", "30"], "1Gi", &[], &cgroup, true);
    let out = host.runc(&["create", "--bundle", bundle.to_str().unwrap(), "o1"]);
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
    let out = host.runc(&["create", "--bundle", bundle.to_str().unwrap(), "o2"]);
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
/// set only; under another tier it holds nothing but CAP_SYS_PTRACE (tests/hostile_state.rs).
#[test]
fn a_waiting_hook_under_the_driver_tier_holds_sys_admin_permitted_not_effective() {
    let host = Host::new("drv-caps", false, true, "policy = \"wait\"");
    let full = host.bundle(
        "full",
        &["sleep", "30"],
        "20Gi",
        &[],
        &format!("/vramgate-drv/{}/full", std::process::id()),
        true,
    );
    let out = host.runc(&["create", "--bundle", full.to_str().unwrap(), "full"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let waiter = host.bundle(
        "waiter",
        &["sleep", "30"],
        "10Gi",
        &[],
        &format!("/vramgate-drv/{}/waiter", std::process::id()),
        true,
    );
    let (key, value) = host.bed.env();
    let mut args: Vec<&OsStr> = vec![OsStr::new("--root"), host.bed.runc_root.as_os_str()];
    let verb = ["create", "--bundle", waiter.to_str().unwrap(), "waiter"];
    args.extend(verb.iter().map(OsStr::new));
    let mut create = in_cgroup_v2(&host.bed.runc, &args)
        .env(key, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
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
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
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
