use super::*;

fn scratch_proc(pid: u32, cgroup: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(pid.to_string())).unwrap();
    std::fs::write(dir.path().join(pid.to_string()).join("cgroup"), cgroup).unwrap();
    dir
}

#[test]
fn the_containers_cgroup_v2_directory() {
    let proc_root = scratch_proc(7, "12:memory:/docker/abc\n0::/system.slice/docker-abc.scope\n");
    let cgroups = tempfile::tempdir().unwrap();
    let leaf = cgroups.path().join("system.slice/docker-abc.scope");
    let err = container_cgroup(7, proc_root.path(), cgroups.path()).unwrap_err();
    assert!(matches!(err, EnforceError::NotCgroupV2 { .. }), "{err}");
    std::fs::create_dir_all(&leaf).unwrap();
    std::fs::write(leaf.join("cgroup.controllers"), "memory\n").unwrap();
    assert_eq!(container_cgroup(7, proc_root.path(), cgroups.path()).unwrap(), leaf);
}

#[test]
fn cgroups_that_cannot_take_a_limit_are_refused_with_the_reason() {
    let cgroups = tempfile::tempdir().unwrap();
    std::fs::write(cgroups.path().join("cgroup.controllers"), "").unwrap();
    for (content, needle) in [
        ("12:memory:/docker/abc\n1:name=systemd:/docker/abc\n", "cgroup v1 only"),
        ("0::/\n", "the root cgroup"),
        ("0::/../../x\n", "outside the reader's cgroup namespace"),
        ("0::relative\n", "not an absolute cgroup path"),
    ] {
        let proc_root = scratch_proc(9, content);
        let err = container_cgroup(9, proc_root.path(), cgroups.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{content:?} -> {err}");
        assert!(err.contains("/9/cgroup"), "names the file: {err}");
    }
    let err = container_cgroup(1, Path::new("/nonexistent"), cgroups.path()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/1/cgroup"), "{err}");
}

#[test]
fn mig_only_containers_load_nothing() {
    let share = PlacedShare {
        uuid: "MIG-x".into(),
        index: 0,
        mig_index: Some(0),
        bytes: 1 << 30,
        limit: 1 << 30,
        total: 10 << 30,
    };
    let applied = apply_driver_limit(
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        1,
        &[share],
        Path::new("/proc"),
    )
    .unwrap();
    assert!(applied.is_empty());
}

#[test]
fn no_library_is_unavailable_not_an_error() {
    let a = driver_limit_available(Path::new("/nonexistent/libnvidia-ml.so.1"));
    assert!(matches!(a, Availability::NoLibrary { .. }), "{a:?}");
    assert!(!a.is_available());
    assert!(a.to_string().contains("/nonexistent/libnvidia-ml.so.1"), "{a}");
}

/// tests/fixtures/nvml_limit_stub.c compiled into `dir`, its host's GPUs GPU-a and GPU-b:
/// (library, call log).
fn stub(dir: &Path) -> (PathBuf, PathBuf) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvml_limit_stub.c");
    let lib = dir.join("libnvml-stub.so");
    let log = dir.join("calls.log");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg(format!("-DLOG_PATH=\"{}\"", log.display()))
        .output()
        .expect("cc (gcc) builds the NVML stub: scripts/install-deps installs it");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(format!("{}.devices", log.display()), "GPU-a\nGPU-b\n").unwrap();
    (lib, log)
}

/// A cgroup v2 directory of the test's own (the stub, as the driver, takes no other directory
/// for a cgroup), removed on drop. Needs root, as [`require_root`] says.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(name: &str) -> Cgroup {
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.controllers").exists())
            .expect("this host mounts no cgroup v2 (neither /sys/fs/cgroup nor /sys/fs/cgroup/unified)");
        let dir = root.join(format!("vramgate-unit-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        Cgroup(dir)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn calls(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The stub refuses set calls without CAP_SYS_ADMIN, as the driver does: without root these
/// tests fail (a skip would report `ok` for a check that never ran).
fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (CAP_SYS_ADMIN for the set call): run it as root (sudo scripts/test)"
    );
}

fn whole(uuid: &str, gib: u64) -> PlacedShare {
    PlacedShare {
        uuid: uuid.into(),
        index: 0,
        mig_index: None,
        bytes: gib << 30,
        limit: gib << 30,
        total: 80 << 30,
    }
}

#[test]
fn a_failed_second_gpu_clears_the_first_before_the_error_returns() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, log) = stub(tmp.path());
    let held = Cgroup::new("half");
    let cgroup = held.0.clone();
    std::fs::write(format!("{}.fail-set", log.display()), "GPU-b").unwrap();
    let err = apply_driver_limit_to(&lib, &cgroup, &[whole("GPU-a", 2), whole("GPU-b", 2)]).unwrap_err();
    assert!(matches!(err, EnforceError::Nvml { code: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("GPU-b"), "{err}");
    let c = cgroup.display();
    assert_eq!(
        calls(&log),
        [
            "init".to_string(),
            "handle GPU-a".to_string(),
            format!("set GPU-a {c} 0 {}", 2u64 << 30),
            "handle GPU-b".to_string(),
            format!("set not-supported GPU-b {c}"),
            "handle GPU-a".to_string(),
            format!("clear GPU-a {c} present"),
            "shutdown".to_string(),
        ]
    );
}

#[test]
fn a_clear_sends_nvmls_clearing_values_and_a_gone_cgroup_has_nothing_left() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let (lib, log) = stub(tmp.path());
    let held = Cgroup::new("clear");
    let cgroup = held.0.clone();
    let gpus = ["GPU-a".to_string(), "GPU-b".to_string()];
    apply_driver_limit_to(&lib, &cgroup, &[whole("GPU-a", 1), whole("GPU-b", 1)]).unwrap();
    let cleared = clear_driver_limit(&lib, &cgroup, &gpus).unwrap();
    assert_eq!(
        cleared,
        [
            ("GPU-a".to_string(), Cleared::Cleared),
            ("GPU-b".to_string(), Cleared::Cleared)
        ]
    );
    let c = cgroup.display();
    let lines = calls(&log);
    assert!(
        lines.ends_with(&[
            "init".to_string(),
            "handle GPU-a".to_string(),
            format!("clear GPU-a {c} present"),
            "handle GPU-b".to_string(),
            format!("clear GPU-b {c} present"),
            "shutdown".to_string(),
        ]),
        "{lines:?}"
    );
    // The cgroup removed (runc's delete): the driver cannot open it, nothing to clear.
    std::fs::remove_dir(&cgroup).unwrap();
    let cleared = clear_driver_limit(&lib, &cgroup, &gpus[..1]).unwrap();
    assert_eq!(cleared, [("GPU-a".to_string(), Cleared::CgroupGone)]);
    assert!(calls(&log).contains(&format!("clear GPU-a {c} gone")));
    // Nothing to clear loads nothing.
    assert!(clear_driver_limit(Path::new("/nonexistent/lib.so"), &cgroup, &[])
        .unwrap()
        .is_empty());
}

#[test]
fn only_no_limit_and_a_gone_cgroup_mean_nothing_to_clear() {
    assert_eq!(clear_outcome(0, true), Some(Cleared::Cleared));
    assert_eq!(clear_outcome(NVML_ERROR_NOT_FOUND, true), Some(Cleared::NoLimit));
    assert_eq!(
        clear_outcome(NVML_ERROR_OPERATING_SYSTEM, false),
        Some(Cleared::CgroupGone)
    );
    // A cgroup that exists but cannot be opened is a real failure, as is a refusal.
    assert_eq!(clear_outcome(NVML_ERROR_OPERATING_SYSTEM, true), None);
    assert_eq!(clear_outcome(NVML_ERROR_NO_PERMISSION, false), None);
    assert_eq!(clear_outcome(999, false), None);
    assert_eq!((CLEAR_SOFT_LIMIT, NVML_DEVICE_MEMORY_LIMIT_MAX), (0, u64::MAX));
}

#[test]
fn the_assumed_struct_has_the_documented_size() {
    // Pointer + two 64-bit integers, no padding, on 64-bit Linux.
    assert_eq!(std::mem::size_of::<SetMemoryLimitsV1>(), 24);
}
