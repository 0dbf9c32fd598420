//! Kubernetes' own DRA allocator for the DRA tests: what kube-scheduler decides for a claim,
//! instead of what a test author writes by hand. `allocate` runs tools/kube/dra-allocator
//! (k8s.io/dynamic-resource-allocation/structured at the staging module's v0.36.3, the one
//! Kubernetes 1.36.3 builds kube-scheduler with, with the features Kubernetes 1.36 turns on by
//! default), built from the Go module tools/kube by scripts/fetch-dra-allocator (run by
//! scripts/install-deps). A machine without it fails the test that needs it, naming
//! the script: an allocation a test invented would pass where the scheduler's would not.
//!
//! `crate::support::dra::allocator`.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The staging module's tag the helper links (tools/kube/go.mod's replace; scripts/fetch-dra-allocator).
pub const STAGING_VERSION: &str = "0.36.3";

/// The DeviceClass manifest the allocator reads its classes from: the one we ship.
pub fn class_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/dra.yaml")
}

/// The helper, checked: present, and built from the tools/kube/dra-allocator/main.go, go.mod
/// and go.sum of this checkout (a binary from an older one would decide by other rules, or
/// link other libraries, unnoticed).
pub fn binary() -> PathBuf {
    let dir = std::env::var_os("VRAMGATE_DRA_ALLOCATOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/var/cache/vramgate-tests/dra-allocator-{STAGING_VERSION}")));
    let binary = dir.join("bin/dra-allocator");
    assert!(
        binary.exists(),
        "{}: no DRA allocator helper (Kubernetes' allocator, which decides every claim of the DRA \
         tests); run scripts/fetch-dra-allocator (scripts/install-deps runs it)",
        binary.display()
    );
    let version = assert_built_from(&binary, "dra-allocator/main.go", "scripts/fetch-dra-allocator");
    assert!(
        version.lines().next() == Some(&format!("k8s.io/dynamic-resource-allocation v{STAGING_VERSION}")),
        "{}: not the allocator of v{STAGING_VERSION}: {version:?}; run scripts/fetch-dra-allocator",
        binary.display()
    );
    binary
}

/// What the allocator decided for one claim: `Ok(status.allocation)` as kube-scheduler writes
/// it, or `Err` with the reason it gives (`unschedulable: ...` when the node cannot take the
/// claim, `error: ...` when the allocator refuses the input).
pub type Decision = Result<Value, String>;

/// The allocator's decisions for `claims` (as stored: the API server's defaults set) on `node`,
/// one scheduling cycle per claim in order, with `slices` published, the DeviceClasses of
/// k8s/dra.yaml, and `allocated` (claims allocated already, anywhere) in use; each claim it
/// allocates is in use for the later ones.
pub fn allocate(node: &str, slices: &[Value], allocated: &[Value], claims: &[Value]) -> Vec<Decision> {
    let input = json!({
        "node": node,
        "resourceSlices": slices,
        "deviceClassManifests": [class_manifest()],
        "allocatedClaims": allocated,
        "claims": claims,
    });
    let mut child = Command::new(binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the helper starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&input).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the DRA allocator helper failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the DRA allocator helper's answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), claims.len(), "one decision per claim: {answer}");
    results
        .iter()
        .map(
            |r| match (r.get("allocation"), r.get("unschedulable"), r.get("error")) {
                (Some(allocation), _, _) => Ok(allocation.clone()),
                (_, Some(why), _) => Err(format!("unschedulable: {}", why.as_str().unwrap_or_default())),
                (_, _, Some(error)) => Err(format!("error: {}", error.as_str().unwrap_or_default())),
                _ => panic!("a decision the helper does not make: {r}"),
            },
        )
        .collect()
}

/// `(device, consumed memory)` of each result of an allocation, in order.
/// Each field is required: an allocation without them is not one of no devices.
pub fn devices(allocation: &Value) -> Vec<(String, String)> {
    use crate::support::{array_field, field, str_field};
    array_field(field(allocation, "devices"), "results")
        .iter()
        .map(|r| {
            (
                str_field(r, "device").to_string(),
                str_field(field(r, "consumedCapacity"), "memory").to_string(),
            )
        })
        .collect()
}

/// Asserts that the Go helper `binary` (its `version` lists `source <sha256> <name>` for its
/// sources) was built from this checkout's tools/kube `main_go`, go.mod and go.sum; else fails
/// naming `fetch_script`, which builds it again. Returns what `version` printed.
pub fn assert_built_from(binary: &Path, main_go: &str, fetch_script: &str) -> String {
    let version = Command::new(binary).arg("version").output().expect("the helper runs");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kube");
    for (file, name) in [(main_go, "main.go"), ("go.mod", "go.mod"), ("go.sum", "go.sum")] {
        let source = module.join(file);
        let sum = Command::new("sha256sum").arg(&source).output().expect("sha256sum runs");
        let sum = String::from_utf8_lossy(&sum.stdout);
        let sum = sum.split_whitespace().next().unwrap_or_default();
        assert!(
            version.lines().any(|l| l == format!("source {sum} {name}")),
            "{}: built from another {} (it says {version:?}, the file's sha256 is {sum}); run \
             {fetch_script} to build it again",
            binary.display(),
            source.display()
        );
    }
    version
}
