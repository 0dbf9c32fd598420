//! Every file under `tests/fixtures/invalid/` fed to the real hook binary: each gets exit 1 and
//! one line on stderr that starts with "vramgate" and says what is wrong, never a panic, and
//! the ledger is left exactly as it was.
//!
//! `cargo test --test it bad_input:: -- --nocapture` prints each input with what the user sees.

use std::path::{Path, PathBuf};

use vramgate_testbed::{oci_state, HookHarness};

use crate::support;

use support::harness;

/// What each fixture was written for: `tests/fixtures/invalid/expected.txt`, one line per
/// fixture, `<kind>/<file>`, a tab, and the fragment its one line must contain (the value or
/// key the user must fix). Any refusal is not enough: a fixture refused for another reason
/// (an earlier check that fires first, a message that lost the value) fails.
fn expected(file: &Path) -> String {
    let kind = file.parent().unwrap().file_name().unwrap().to_string_lossy();
    let key = format!("{kind}/{}", file.file_name().unwrap().to_string_lossy());
    expectations()
        .into_iter()
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("add {key} to tests/fixtures/invalid/expected.txt with the refusal it is for"))
        .1
}

fn expectations() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid/expected.txt");
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (key, fragment) = l
                .split_once('\t')
                .unwrap_or_else(|| panic!("{}: no tab in {l:?}", path.display()));
            assert!(!fragment.trim().is_empty(), "{}: no fragment for {key}", path.display());
            (key.to_string(), fragment.to_string())
        })
        .collect()
}

/// Every line of expected.txt names a fixture that is there, once.
#[test]
fn every_expectation_has_its_fixture() {
    let mut keys: Vec<String> = expectations().into_iter().map(|(k, _)| k).collect();
    for key in &keys {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/invalid")
            .join(key);
        assert!(file.is_file(), "expected.txt names {key}, which is not a fixture");
    }
    let count = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), count, "a fixture named twice in expected.txt");
}

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
    let fragment = expected(what);
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
    assert!(
        stderr.contains(&fragment),
        "{}: refused, but not for what it was written for: expected {fragment:?} in: {stderr}",
        what.display()
    );
}

#[test]
fn invalid_states() {
    let (h, _bundle) = host("");
    for file in fixtures("state") {
        let (code, stderr) = hook(&h, "createRuntime", &std::fs::read(&file).unwrap());
        assert_clear_refusal(&file, code, &stderr);
    }
}

/// Every spec fixture refused for its own mistake, with a reservation already in the ledger:
/// the refusals reserve and queue nothing (a refusal of the request itself, one no GPU can
/// ever hold, is counted in the ledger's counters; nothing else changes).
#[test]
fn invalid_specs() {
    let (h, bundle) = host("");
    let (code, stderr) = hook(&h, "createRuntime", &state_json(&bundle, "held"));
    assert_eq!(code, Some(0), "the valid request before the fixtures: {stderr}");
    let ledger = h.state_dir.join("ledger.json");
    let held = |bytes: &[u8]| {
        let ledger: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        (
            support::array_field(&ledger, "reservations").clone(),
            support::array_field(&ledger, "queue").clone(),
        )
    };
    let before = held(&std::fs::read(&ledger).unwrap());
    assert_eq!(before.0.len(), 1, "the ledger holds the valid request: {before:?}");
    for file in fixtures("spec") {
        std::fs::copy(&file, bundle.join("config.json")).unwrap();
        let (code, stderr) = hook(&h, "createRuntime", &state_json(&bundle, "c1"));
        assert_clear_refusal(&file, code, &stderr);
    }
    assert_eq!(
        held(&std::fs::read(&ledger).unwrap()),
        before,
        "a refusal reserved or queued something"
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
