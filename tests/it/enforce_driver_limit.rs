//! The driver limit's call path, against tests/fixtures/nvml_limit_stub.c compiled here: a
//! library that exports what `nvmlDeviceSetMemoryLimits_v1` needs and records each call.
//! No driver we can run exports the symbol (it arrives with R615; the GPU host has 580), so
//! this is as close as it gets: real dlopen, real symbol lookup, the documented struct on the
//! C side, and a real process in a real cgroup v2 (created here, as root: scripts/test runs as
//! root). What it cannot show is that a real driver takes the call and enforces the limit.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use vramgate::enforce::driver_limit::{apply_driver_limit_at, apply_driver_limit_to, SET_LIMITS_SYMBOL};
use vramgate::enforce::{driver_limit_available, AppliedLimit, Availability, EnforceError, PlacedShare};

/// The stub NVML library (tests/fixtures/nvml_limit_stub.c), compiled into `dir`, its host's
/// GPUs GPU-aaaa and GPU-cccc.
fn stub(dir: &Path, with_limits: bool) -> (PathBuf, PathBuf) {
    support::nvml_stub(dir, with_limits, &["GPU-aaaa", "GPU-cccc"])
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn cgroup_v2_root() -> PathBuf {
    support::cgroup_v2_root()
}

/// A `sleep` in a cgroup v2 of its own, both removed on drop.
struct Contained {
    child: Child,
    cgroup: PathBuf,
}

impl Contained {
    fn start(name: &str) -> Contained {
        let cgroup = cgroup_v2_root().join(format!("vramgate-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&cgroup).unwrap_or_else(|e| {
            panic!(
                "cannot create the cgroup {} (the test must run as root): {e}",
                cgroup.display()
            )
        });
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        std::fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
        Contained { child, cgroup }
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

fn share(uuid: &str, index: u32, mig_index: Option<u32>, gib: u64) -> PlacedShare {
    PlacedShare {
        uuid: uuid.to_string(),
        index,
        mig_index,
        bytes: gib << 30,
        limit: gib << 30,
        total: 141 << 30,
    }
}

#[test]
fn the_limit_is_set_on_the_containers_cgroup_for_each_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let (lib, log) = stub(dir.path(), true);
    assert_eq!(
        driver_limit_available(&lib),
        Availability::Available { library: lib.clone() }
    );
    let container = Contained::start("limits");
    let shares = [
        share("GPU-aaaa", 0, None, 4),
        share("MIG-bbbb", 1, Some(0), 2),
        share("GPU-cccc", 2, None, 6),
    ];
    let applied = apply_driver_limit_at(
        &lib,
        container.child.id(),
        &shares,
        Path::new("/proc"),
        &cgroup_v2_root(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let cgroup = container.cgroup.clone();
    assert_eq!(
        applied,
        [
            AppliedLimit {
                uuid: "GPU-aaaa".into(),
                cgroup: cgroup.clone(),
                soft: 0,
                hard: 4 << 30
            },
            AppliedLimit {
                uuid: "GPU-cccc".into(),
                cgroup: cgroup.clone(),
                soft: 0,
                hard: 6 << 30
            },
        ]
    );
    // What the library received: the cgroup directory of the process, each GPU by UUID, soft
    // 0 and hard = the reservation in bytes; the MIG device never reaches the driver.
    let c = cgroup.display();
    assert_eq!(
        log_lines(&log),
        [
            "init".to_string(),
            "handle GPU-aaaa".to_string(),
            format!("set GPU-aaaa {c} 0 {}", 4u64 << 30),
            "handle GPU-cccc".to_string(),
            format!("set GPU-cccc {c} 0 {}", 6u64 << 30),
            "shutdown".to_string(),
        ]
    );
}

#[test]
fn an_unknown_gpu_is_an_error_naming_it_and_nvml_is_shut_down() {
    let dir = tempfile::tempdir().unwrap();
    let (lib, log) = stub(dir.path(), true);
    let container = Contained::start("unknown");
    let shares = [share("GPU-aaaa", 0, None, 1), share("GPU-unknown-1", 1, None, 1)];
    let err = apply_driver_limit_at(
        &lib,
        container.child.id(),
        &shares,
        Path::new("/proc"),
        &cgroup_v2_root(),
    )
    .unwrap_err();
    assert!(matches!(err, EnforceError::Nvml { code: 6, .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("nvmlDeviceGetHandleByUUID(GPU-unknown-1)") && text.contains("NVML_ERROR_NOT_FOUND"),
        "{text}"
    );
    let lines = log_lines(&log);
    assert_eq!(lines.last().map(String::as_str), Some("shutdown"), "{lines:?}");
}

/// The stand-in is as strict as the driver about what it is handed: a well-formed UUID of a GPU
/// its host does not have is NVML_ERROR_NOT_FOUND (nvml.h: "uuid does not match a valid device
/// on the system"), and a directory that is no cgroup (a plain directory under /tmp) is
/// NVML_ERROR_OPERATING_SYSTEM ("the cgroup path cannot be opened"), nothing set. The stub
/// before took any UUID but those starting "GPU-unknown", and any directory for a cgroup.
#[test]
fn the_stub_refuses_a_gpu_its_host_lacks_and_a_directory_that_is_no_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let (lib, log) = stub(dir.path(), true);
    let container = Contained::start("strict");
    let err = apply_driver_limit_to(&lib, &container.cgroup, &[share("GPU-bbbb", 1, None, 1)]).unwrap_err();
    assert!(matches!(err, EnforceError::Nvml { code: 6, .. }), "{err:?}");
    assert!(err.to_string().contains("GPU-bbbb"), "{err}");

    let plain = dir.path().join("not-a-cgroup");
    std::fs::create_dir(&plain).unwrap();
    let err = apply_driver_limit_to(&lib, &plain, &[share("GPU-aaaa", 0, None, 1)]).unwrap_err();
    assert!(matches!(err, EnforceError::Nvml { code: 17, .. }), "{err:?}");
    let lines = log_lines(&log);
    assert!(lines.contains(&"handle GPU-bbbb not-found".to_string()), "{lines:?}");
    assert!(
        lines.contains(&format!("set no-cgroup {}", plain.display())),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("set GPU-")),
        "nothing set: {lines:?}"
    );
}

#[test]
fn a_library_without_the_symbol_is_unavailable_and_nothing_is_called() {
    let dir = tempfile::tempdir().unwrap();
    let (lib, log) = stub(dir.path(), false);
    let availability = driver_limit_available(&lib);
    assert_eq!(availability, Availability::MissingSymbol { library: lib.clone() });
    let line = availability.to_string();
    assert!(line.contains(SET_LIMITS_SYMBOL) && line.contains("R615"), "{line}");

    let container = Contained::start("nosymbol");
    let err = apply_driver_limit_at(
        &lib,
        container.child.id(),
        &[share("GPU-aaaa", 0, None, 1)],
        Path::new("/proc"),
        &cgroup_v2_root(),
    )
    .unwrap_err();
    assert!(
        matches!(err, EnforceError::MissingSymbol { symbol, .. } if symbol == SET_LIMITS_SYMBOL),
        "{err:?}"
    );
    assert!(log_lines(&log).is_empty(), "no NVML call before every symbol is there");
}

#[test]
fn a_process_in_the_root_cgroup_gets_no_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (lib, log) = stub(dir.path(), true);
    let root = cgroup_v2_root();
    // A container run without a cgroup of its own: its init sits in the root cgroup, where a
    // limit would hold every process of the host.
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(root.join("cgroup.procs"), child.id().to_string()).unwrap();
    let result = apply_driver_limit_at(
        &lib,
        child.id(),
        &[share("GPU-aaaa", 0, None, 1)],
        Path::new("/proc"),
        &root,
    );
    let _ = child.kill();
    let _ = child.wait();
    let err = result.unwrap_err();
    assert!(err.to_string().contains("the root cgroup"), "{err}");
    assert!(log_lines(&log).is_empty(), "nothing loaded or called");
}

/// `vramgate doctor`'s enforcement lines under a scratch root, with `[enforce]` and the NVML
/// library given; returns the rendered report.
fn doctor(root: &Path, library: &Path, enforce: &str) -> (vramgate::doctor::Report, String) {
    let config = root.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\n[inventory]\nbackend = \"static\"\nnvml_library = \"{}\"\n[enforce]\n{enforce}\n",
            root.join("state").display(),
            library.display()
        ),
    )
    .unwrap();
    let report = vramgate::doctor::run(&vramgate::doctor::Paths::under(root, config));
    let text = vramgate::doctor::render(&report);
    (report, text)
}

fn line<'a>(text: &'a str, area: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(&format!(" {area} ")))
        .unwrap_or_else(|| panic!("no {area} line in:\n{text}"))
}

#[test]
fn doctor_names_the_driver_a_driver_limit_needs() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = stub(dir.path(), false);
    let (new, log) = stub(dir.path(), true);
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();

    let (_, text) = doctor(&root, &old, "limit = \"driver\"");
    let enforce = line(&text, "enforce");
    assert!(enforce.starts_with("PROBLEM"), "{text}");
    assert!(
        enforce.contains("does not export nvmlDeviceSetMemoryLimits_v1") && enforce.contains("R615 or later"),
        "{enforce}"
    );
    assert!(enforce.contains("; fix: install NVIDIA driver R615"), "{enforce}");

    // The symbol is there, but this root's /sys/fs/cgroup is not cgroup v2.
    let (_, text) = doctor(&root, &new, "limit = \"driver\"");
    assert!(
        line(&text, "enforce").starts_with("PROBLEM") && line(&text, "enforce").contains("is not cgroup v2"),
        "{text}"
    );
    std::fs::create_dir_all(root.join("sys/fs/cgroup")).unwrap();
    std::fs::write(root.join("sys/fs/cgroup/cgroup.controllers"), "memory\n").unwrap();
    let (_, text) = doctor(&root, &new, "limit = \"driver\"");
    assert!(line(&text, "enforce").starts_with("ok"), "{text}");
    assert!(
        line(&text, "guardrails").contains("TF_FORCE_GPU_ALLOW_GROWTH=true"),
        "{text}"
    );
    assert!(!text.contains(" driver-limit "), "the enforce line says it: {text}");

    // Another limit: the driver limit's availability is an information line.
    let (report, text) = doctor(&root, &old, "limit = \"none\"");
    assert!(line(&text, "enforce").starts_with("-"), "{text}");
    let driver = line(&text, "driver-limit");
    assert!(
        driver.starts_with("-") && driver.contains("unavailable") && driver.contains("R615"),
        "{driver}"
    );
    assert_eq!(report.checks.iter().filter(|c| c.area == "driver-limit").count(), 1);
    // Doctor only looks the symbol up: nothing was called.
    assert!(log_lines(&log).is_empty());
}

#[test]
fn doctor_checks_that_an_mps_daemon_serves_the_pipe_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = stub(dir.path(), false);
    let root = dir.path().join("root");
    let pipe = root.join("srv/mps");
    std::fs::create_dir_all(&pipe).unwrap();
    let enforce = "limit = \"mps\"\nmps_pipe_directory = \"/srv/mps\"\nmps_log_directory = \"/srv/mps-log\"\ntensorflow_allow_growth = false\njax_disable_preallocation = false\njax_memory_fraction = false";

    let (report, text) = doctor(&root, &old, enforce);
    let line_ = line(&text, "enforce");
    assert!(
        line_.starts_with("PROBLEM") && line_.contains("no MPS control daemon serves /srv/mps"),
        "{text}"
    );
    assert!(
        line_.contains("fix: start it: CUDA_MPS_PIPE_DIRECTORY=/srv/mps CUDA_MPS_LOG_DIRECTORY=/srv/mps-log nvidia-cuda-mps-control -d"),
        "{line_}"
    );
    let problems = report.problems();
    assert!(line(&text, "guardrails").contains("all off"), "{text}");
    assert!(line(&text, "driver-limit").contains("R615"), "{text}");

    // A daemon: its socket, its pid file, and its process (a scratch /proc under the root).
    let _socket = std::os::unix::net::UnixListener::bind(pipe.join("control")).unwrap();
    std::fs::write(pipe.join("nvidia-cuda-mps-control.pid"), "4242\n").unwrap();
    std::fs::create_dir_all(root.join("proc/4242")).unwrap();
    std::fs::write(root.join("proc/4242/cmdline"), "nvidia-cuda-mps-control\0-d\0").unwrap();
    let (report, text) = doctor(&root, &old, enforce);
    assert!(
        line(&text, "enforce").starts_with("ok") && line(&text, "enforce").contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "{text}"
    );
    assert_eq!(report.problems(), problems - 1, "{text}");
}
