//! The Kubernetes manifests in `k8s/`: every object of every file is valid for Kubernetes 1.36
//! as the API server's strict field validation checks it (tests/support/check_manifests.py,
//! with the upstream strict JSON schemas that scripts/fetch-k8s-schemas fetches), and the
//! check itself refuses a misspelt field. What the objects do on a cluster is tested elsewhere:
//! the DRA driver's admission policies in tests/it/dra_driver.rs, the driver's pod and mounts in
//! tests/it/node_image.rs.

use crate::support::helm as helm_support;

use std::path::PathBuf;

use helm_support::{check_manifests, root};

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_object_in_k8s_is_valid_for_kubernetes_1_36() {
    let files = manifests();
    let out = check_manifests(&files);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for file in &files {
        // One line per object: a file of none would have been checked for nothing.
        let prefix = format!("{}: ", file.display());
        assert!(
            stdout.lines().any(|l| l.starts_with(&prefix) && l.ends_with(" ok")),
            "no object of {} checked: {stdout}",
            file.display()
        );
    }
    let dra = root().join("k8s/dra.yaml");
    for object in helm_support::DRA_DRIVER_OBJECTS {
        let line = format!("{}: {object} ok", dra.display());
        assert!(stdout.lines().any(|l| l == line), "{line:?} not in: {stdout}");
    }
}

#[test]
fn the_manifest_check_refuses_what_the_api_server_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let dra = std::fs::read_to_string(root().join("k8s/dra.yaml")).unwrap();
    for (name, from, to, says) in [
        (
            "binding",
            "validationActions: [Deny]",
            "validationAction: [Deny]",
            "ValidatingAdmissionPolicyBinding vramgate-dra-slices: spec: 'validationActions' is a required property",
        ),
        (
            "policy",
            "    - name: callerNode\n      expression:",
            "    - name: callerNode\n      expresion:",
            "spec.variables[0].expresion: Additional properties are not allowed",
        ),
        (
            "kind",
            "kind: ValidatingAdmissionPolicyBinding",
            "kind: ValidatingAdmissionPolicyBindings",
            "no schema validatingadmissionpolicybindings-admissionregistration-v1.json",
        ),
    ] {
        assert!(dra.contains(from), "k8s/dra.yaml changed: {from:?}");
        let broken = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&broken, dra.replacen(from, to, 1)).unwrap();
        let out = check_manifests(&[broken]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr:?} should say {says:?}");
    }
}
