//! Every file under `tests/fixtures/invalid/` fed to the real hook binary: each gets exit 1 and
//! one line on stderr that starts with "vramgate" and says what is wrong, never a panic, and
//! the ledger is left exactly as it was.
//!
//! `cargo test --test bad_input -- --nocapture` prints each input with what the user sees.

use std::path::{Path, PathBuf};

use vramgate::testbed::{oci_state, HookHarness};

mod support;

use support::harness;

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 5, "fixtures in {}", dir.display());
    files
}

/// A scratch host with one bundle, which requests 1 GiB on GPU 0.
fn host(config_extra: &str) -> (HookHarness, PathBuf) {
    let h = harness(config_extra);
    let bundle = h.bundle("c", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    (h, bundle)
}

fn state_json(bundle: &Path, id: &str) -> Vec<u8> {
    // The test process stands in for the container's init: it is alive for the whole test.
    oci_state(id, Some(std::process::id()), bundle)
}

/// Runs the hook (a broken pipe, from one that refuses before reading all of stdin, is
/// fine); returns (exit code, stderr).
fn hook(h: &HookHarness, stage: &str, stdin: &[u8]) -> (Option<i32>, String) {
    let out = h.hook(stage, stdin);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_clear_refusal(what: &Path, code: Option<i32>, stderr: &str) {
    println!(
        "{:<40} {}",
        what.file_name().unwrap().to_string_lossy(),
        stderr.trim_end()
    );
    assert_eq!(code, Some(1), "{}: exit {code:?}, stderr {stderr}", what.display());
    assert!(!stderr.contains("panicked"), "{}: {stderr}", what.display());
    assert!(stderr.starts_with("vramgate"), "{}: {stderr}", what.display());
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{}: one line: {stderr}",
        what.display()
    );
    assert!(
        stderr.len() < 1500,
        "{}: short enough to read: {stderr}",
        what.display()
    );
}

#[test]
fn invalid_states() {
    let (h, _bundle) = host("");
    for file in fixtures("state") {
        let (code, stderr) = hook(&h, "createRuntime", &std::fs::read(&file).unwrap());
        assert_clear_refusal(&file, code, &stderr);
        assert!(!stderr.contains("admitted everything\n"), "no forged lines");
    }
}

/// What the user must see for each spec fixture: the value or key to fix.
const SPEC_MESSAGES: &[(&str, &str)] = &[
    ("annotation-not-string.json", "expected a string"),
    (
        "env-memory-bad-unit.json",
        "VRAMGATE_MEMORY = \"2Gb\": \"2Gb\" has unknown unit",
    ),
    ("gpus-missing.json", "names no GPU: set NVIDIA_VISIBLE_DEVICES"),
    ("gpus-none.json", "names no GPU"),
    ("gpus-path.json", "\"../../etc/passwd\" is not a GPU"),
    (
        "gpus-unknown-index.json",
        "names GPU \"7\", which this host does not have",
    ),
    (
        "gpus-unknown-uuid.json",
        "names GPU \"GPU-does-not-exist\", which this host does not have",
    ),
    (
        "limit-below-request.json",
        "vramgate.dev/memory-limit = \"2Gi\" (2048 MiB) is less than the request vramgate.dev/memory (6144 MiB)",
    ),
    ("limit-malformed.json", "vramgate.dev/memory-limit = \"plenty\""),
    (
        "limit-nvidia-disagrees.json",
        "VRAMGATE_MEMORY = \"1Gi\" with VRAMGATE_MEMORY_LIMIT = \"4Gi\" and NVIDIA_GPU_MEMORY_REQUEST = \"1024\", NVIDIA_GPU_MEMORY_LIMIT = \"2048\" ask for different amounts (request 1024 MiB, limit 4096 MiB and request 1024 MiB, limit 2048 MiB)",
    ),
    ("memory-absurd.json", "more than the GPU can ever hold"),
    ("memory-malformed.json", "vramgate.dev/memory = \"lots\""),
    ("memory-negative.json", "\"-4Gi\" is negative"),
    ("memory-overflow.json", "is too large to be a memory amount"),
    ("memory-percent-over.json", "\"150%\" is not a share of the GPU"),
    ("memory-unknown-unit.json", "has unknown unit \"Pi\""),
    ("memory-zero.json", "\"0\" is zero"),
    (
        "nvidia-disagrees.json",
        "VRAMGATE_MEMORY = \"1Gi\" and NVIDIA_GPU_MEMORY_LIMIT = \"2048\" ask for different amounts",
    ),
    (
        "nvidia-kai-negative.json",
        "nvidia.com/container.app.gpu-memory.limit = \"-1\": NVIDIA's memory amounts are whole MiB",
    ),
    (
        "nvidia-limit-unit.json",
        "NVIDIA_GPU_MEMORY_LIMIT = \"2GiB\": NVIDIA's memory amounts are whole MiB",
    ),
    (
        "nvidia-request-over-limit.json",
        "NVIDIA_GPU_MEMORY_REQUEST = \"4096\": is more than NVIDIA_GPU_MEMORY_LIMIT = \"1024\"",
    ),
    (
        "expected-duration-malformed.json",
        "vramgate.dev/expected-duration = \"a while\"",
    ),
    (
        "limit-without-request.json",
        "vramgate.dev/memory-limit = \"4Gi\" is a limit without a request",
    ),
    ("policy-unknown.json", "vramgate.dev/policy = \"sometimes\""),
    ("timeout-malformed.json", "vramgate.dev/timeout = \"forever\""),
    (
        "timeout-too-long.json",
        "\"200h\" is too long a duration: the longest is 168h (a week)",
    ),
    ("truncated.json", "is not a valid OCI spec"),
];

#[test]
fn invalid_specs() {
    let (h, bundle) = host("");
    for file in fixtures("spec") {
        std::fs::copy(&file, bundle.join("config.json")).unwrap();
        let (code, stderr) = hook(&h, "createRuntime", &state_json(&bundle, "c1"));
        assert_clear_refusal(&file, code, &stderr);
        // Each message names the value or the key the user must fix.
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let expected = SPEC_MESSAGES
            .iter()
            .find(|(f, _)| *f == name)
            .unwrap_or_else(|| panic!("add {name} to SPEC_MESSAGES"))
            .1;
        assert!(stderr.contains(expected), "{name}: expected {expected:?} in: {stderr}");
    }
    assert!(
        !h.state_dir.join("ledger.json").exists() || {
            let ledger: serde_json::Value =
                serde_json::from_slice(&std::fs::read(h.state_dir.join("ledger.json")).unwrap()).unwrap();
            ledger["reservations"].as_array().unwrap().is_empty()
        }
    );
}

#[test]
fn invalid_configs() {
    for file in fixtures("config") {
        let (h, bundle) = host("");
        std::fs::copy(&file, &h.config).unwrap();
        let (code, stderr) = hook(&h, "createRuntime", &state_json(&bundle, "c1"));
        assert_clear_refusal(&file, code, &stderr);
        assert!(
            stderr.contains(&h.config.display().to_string()),
            "names the file: {stderr}"
        );
    }
}

#[test]
fn corrupt_ledgers_are_refused_and_left_alone() {
    for file in fixtures("ledger") {
        let (h, bundle) = host("");
        std::fs::create_dir(&h.state_dir).unwrap();
        std::fs::set_permissions(&h.state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let ledger = h.state_dir.join("ledger.json");
        std::fs::copy(&file, &ledger).unwrap();
        std::fs::set_permissions(&ledger, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let before = std::fs::read(&ledger).unwrap();
        for stage in ["createRuntime", "poststop"] {
            let (code, stderr) = hook(&h, stage, &state_json(&bundle, "c1"));
            assert_clear_refusal(&file, code, &stderr);
            assert!(
                stderr.contains("vramgate ledger repair"),
                "says how to recover: {stderr}"
            );
            assert_eq!(
                std::fs::read(&ledger).unwrap(),
                before,
                "{}: nothing lost",
                file.display()
            );
        }
    }
}

#[test]
fn fail_open_lets_the_container_start_and_says_so() {
    let (h, bundle) = host("on_state_error = \"fail-open\"\n");
    std::fs::create_dir(&h.state_dir).unwrap();
    std::fs::set_permissions(&h.state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(h.state_dir.join("ledger.json"), "{broken").unwrap();
    let (code, stderr) = hook(&h, "createRuntime", &state_json(&bundle, "c1"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("fail-open") && stderr.contains("corrupt"), "{stderr}");
    // A user's own mistake is still refused under fail-open.
    std::fs::write(
        bundle.join("config.json"),
        r#"{"annotations":{"vramgate.dev/memory":"lots","vramgate.dev/gpus":"0"}}"#,
    )
    .unwrap();
    let (code, _) = hook(&h, "createRuntime", &state_json(&bundle, "c2"));
    assert_eq!(code, Some(1));
}

#[test]
fn unknown_stage_is_a_usage_error() {
    let (h, bundle) = host("");
    let (code, stderr) = hook(&h, "prestop", &state_json(&bundle, "c1"));
    assert_eq!(code, Some(2));
    assert!(stderr.contains("unknown stage \"prestop\""), "{stderr}");
}
