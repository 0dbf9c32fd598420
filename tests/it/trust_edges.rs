//! What a container writes into its own spec must never widen what it gets: through the built
//! `vramgate-runtime` in front of real runc, and through the built hook alone under real runc
//! (podman's and CRI-O's hooks.d path), on two simulated GPUs (minors 0 and 1).
//!
//! - A container its engine gave GPU 0 (an env UUID, a CDI annotation, an injected node) that
//!   names GPU 1 is refused with one line naming both, and nothing is reserved.
//! - A container reserved on GPU 0 that holds `CAP_MKNOD` and a wildcard device rule over
//!   NVIDIA's major (`c 195:* rwm`) makes `/dev/nvidia0` and `/dev/nvidia1` itself: it can open
//!   its own GPU's node (no driver here: ENXIO, past the device cgroup) but not the other's
//!   (the device cgroup: EPERM). A rule over every device is refused.

use crate::support;

use std::process::Stdio;

use serde_json::{json, Value};
use support::{reservations, runc_testbed, wrapper, wrapper_testbed, Cleanup};
use vramgate_testbed::Testbed;

const TWO_GPUS: &str = "[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n[[inventory.gpus]]\nindex = 1\nuuid = \"GPU-one\"\ntotal = \"16Gi\"\n";

/// Edits `<bundle>/config.json` in place.
fn edit_spec(bundle: &std::path::Path, edit: impl FnOnce(&mut Value)) {
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut spec);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

/// The engine gives GPU 0 in each of its ways; the container names GPU 1 (vramgate.dev/gpus).
#[test]
fn a_container_given_gpu_0_that_names_gpu_1_is_refused_through_the_wrapper() {
    let (_dir, bed) = wrapper_testbed("vg-given", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    let cases: [(&str, &str, Box<dyn Fn(&mut Value)>); 3] = [
        (
            "env",
            "NVIDIA_VISIBLE_DEVICES = \"GPU-zero\"",
            Box::new(|spec: &mut Value| {
                spec["process"]["env"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!("NVIDIA_VISIBLE_DEVICES=GPU-zero"));
            }),
        ),
        (
            "cdi",
            "cdi.k8s.io annotations = \"nvidia.com/gpu=0\"",
            Box::new(|spec: &mut Value| {
                spec["annotations"]["cdi.k8s.io/nvidia-device-plugin_a"] = json!("nvidia.com/gpu=0");
            }),
        ),
        (
            "node",
            "linux.devices = \"/dev/nvidia0\"",
            Box::new(|spec: &mut Value| {
                spec["linux"]["devices"] = json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]);
            }),
        ),
    ];
    for (id, given, edit) in cases {
        let bundle = bed
            .bundle(
                id,
                &["true"],
                &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "1")],
                &[],
                false,
            )
            .unwrap();
        edit_spec(&bundle, edit);
        let (ok, stderr) = wrapper(&bed, &["create", "--bundle", bundle.to_str().unwrap(), id]);
        assert!(!ok, "{id}: a container given GPU 0 was created on GPU 1");
        let line = stderr.lines().next().unwrap_or_default();
        assert!(
            line.contains(&format!("container {id}: vramgate.dev/gpus = \"1\" names GPU 1 (GPU-one), which the container's engine did not give it ({given})")),
            "{id}: {stderr}"
        );
        assert!(reservations(&bed).is_empty(), "{id}: nothing reserved");
    }
    // Naming the GPU it was given, in another spelling, is a narrowing: it runs.
    let bundle = bed
        .bundle(
            "narrowed",
            &["true"],
            &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "GPU-zero")],
            &["NVIDIA_VISIBLE_DEVICES=0"],
            false,
        )
        .unwrap();
    let (ok, stderr) = wrapper(&bed, &["run", "--bundle", bundle.to_str().unwrap(), "narrowed"]);
    assert!(ok, "{stderr}");
}

/// The container's shell, with CAP_MKNOD, Docker's default `c *:* m` and `rule`, makes both
/// GPUs' nodes and tries to open each; it prints what each open gave.
fn mknod_bundle(bed: &Testbed, id: &str, with_hooks: bool, rule: Value) -> std::path::PathBuf {
    let script = "for n in 0 1; do mknod /dev/nvidia$n c 195 $n; if cat /dev/nvidia$n 2>/tmp/e; then echo nvidia$n: opened; else echo nvidia$n: $(cat /tmp/e); fi; done";
    let bundle = bed
        .bundle(
            id,
            &["sh", "-c", script],
            &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")],
            &[],
            with_hooks,
        )
        .unwrap();
    edit_spec(&bundle, |spec| {
        for set in ["bounding", "effective", "permitted"] {
            spec["process"]["capabilities"][set]
                .as_array_mut()
                .unwrap()
                .push(json!("CAP_MKNOD"));
        }
        // Docker's default: mknod of any character device (opening is the rules' business).
        let rules = spec["linux"]["resources"]["devices"].as_array_mut().unwrap();
        rules.push(json!({"allow": true, "type": "c", "major": null, "minor": null, "access": "m"}));
        rules.push(rule);
        // A writable /tmp for the error text (the rootfs is read-only).
        spec["mounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}));
    });
    bundle
}

fn run_foreground(bed: &Testbed, bundle: &std::path::Path, id: &str) -> (bool, String, String) {
    let (key, value) = bed.env();
    let out = bed
        .runc(&["run", "--bundle", bundle.to_str().unwrap(), id])
        .env(key, value)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_wildcard_rule_over_nvidias_major_reaches_only_the_reserved_gpu_through_the_wrapper() {
    let (_dir, bed) = wrapper_testbed("vg-mknod", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    let wildcard = json!({"allow": true, "type": "c", "major": 195, "access": "rwm"});
    let bundle = mknod_bundle(&bed, "mk", false, wildcard);
    let (ok, stdout, stderr) = run_foreground(&bed, &bundle, "mk");
    assert!(ok, "{stdout}{stderr}");
    // No NVIDIA driver here: an open the device cgroup lets through ends in ENXIO.
    assert!(
        stdout.contains("nvidia0: cat: can't open '/dev/nvidia0': No such device or address"),
        "its own GPU's node is allowed: {stdout}"
    );
    assert!(
        stdout.contains("nvidia1: cat: can't open '/dev/nvidia1': Operation not permitted"),
        "the other GPU's node is denied: {stdout}"
    );

    // A rule over every character device cannot be narrowed: refused, nothing reserved.
    let every = json!({"allow": true, "type": "c", "access": "rwm"});
    let bundle = mknod_bundle(&bed, "every", false, every);
    let (ok, stdout, stderr) = run_foreground(&bed, &bundle, "every");
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("has the device rule \"allow c *:* rwm\"") && stderr.contains("drop --privileged"),
        "{stderr}"
    );
    assert!(reservations(&bed).is_empty());
}

/// The hook alone (podman's and CRI-O's hooks.d) cannot rewrite the spec runc has read: the
/// container whose rule reaches another GPU is refused at createRuntime, and its reservation
/// given back.
#[test]
fn a_wildcard_rule_over_nvidias_major_is_refused_by_the_hook_alone() {
    let (_dir, bed) = runc_testbed("vg-mknod-hook", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    for (id, rule, says) in [
        (
            "nv",
            json!({"allow": true, "type": "c", "major": 195, "access": "rwm"}),
            "allow c 195:* rwm",
        ),
        ("all", json!({"allow": true, "access": "rwm"}), "allow a *:* rwm"),
    ] {
        let bundle = mknod_bundle(&bed, id, true, rule);
        let (ok, stdout, stderr) = run_foreground(&bed, &bundle, id);
        assert!(!ok, "{id}: {stdout}");
        // runc quotes the hook's stderr (Go's %q): the line's own quotes come escaped.
        assert!(
            stderr.contains(&format!("vramgate: container {id}: its device rule "))
                && stderr.contains(says)
                && stderr.contains("lets it open the nodes of GPUs it holds no reservation on"),
            "{id}: {stderr}"
        );
        assert!(reservations(&bed).is_empty(), "{id}: given back");
    }
    // The same container without the rule runs: the engines' own rules keep it to its GPU.
    let bundle = mknod_bundle(
        &bed,
        "plain",
        true,
        json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}),
    );
    let (ok, stdout, stderr) = run_foreground(&bed, &bundle, "plain");
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("nvidia1: cat: can't open '/dev/nvidia1': Operation not permitted"),
        "{stdout}"
    );
}

/// Rules that runc reads as every device or otherwise than their keys say: a rule of type `a`
/// whatever its numbers and access, one with no type, and one whose key is `"Allow"` (Go's
/// JSON decoder matches keys without case). Each, with the rule and what the refusal says.
fn misread_rules() -> [(&'static str, Value, &'static str); 5] {
    [
        (
            "a-nv0",
            json!({"allow": true, "type": "a", "major": 195, "minor": 0, "access": "rwm"}),
            "allow a 195:0 rwm",
        ),
        (
            "a-mknod",
            json!({"allow": true, "type": "a", "access": "m"}),
            "allow a *:* m",
        ),
        (
            "a-null",
            json!({"allow": true, "type": "a", "major": 1, "minor": 3, "access": "rwm"}),
            "allow a 1:3 rwm",
        ),
        (
            "no-type",
            json!({"allow": true, "major": 1, "minor": 3, "access": "rwm"}),
            "allow a 1:3 rwm",
        ),
        (
            "case",
            json!({"Allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"}),
            "Allow",
        ),
    ]
}

/// What real runc does with these rules, without vramgate: the container makes the other
/// GPU's node and the device cgroup lets the open through (no driver here: ENXIO, where a
/// denied open is EPERM). This is why vramgate must refuse them.
#[test]
fn runc_reads_a_rule_of_type_a_as_every_device_and_keys_without_case() {
    let (_dir, bed) = runc_testbed("vg-rule-runc", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    for (id, rule, _) in misread_rules() {
        let bundle = mknod_bundle(&bed, id, false, rule);
        let (ok, stdout, stderr) = run_foreground(&bed, &bundle, id);
        assert!(ok, "{id}: {stdout}{stderr}");
        assert!(
            stdout.contains("nvidia1: cat: can't open '/dev/nvidia1': No such device or address"),
            "{id}: runc let the container open GPU 1's node: {stdout}"
        );
    }
}

#[test]
fn a_rule_runc_reads_as_every_device_or_otherwise_is_refused_through_the_wrapper() {
    let (_dir, bed) = wrapper_testbed("vg-rule-wrap", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    for (id, rule, says) in misread_rules() {
        let bundle = mknod_bundle(&bed, id, false, rule);
        let (ok, stdout, stderr) = run_foreground(&bed, &bundle, id);
        assert!(!ok, "{id}: ran: {stdout}");
        let refused = if id == "case" {
            stderr.contains("linux.resources.devices[")
                && stderr.contains("has the key \"Allow\"")
                && stderr.contains("runc would read it otherwise than vramgate")
        } else {
            stderr.contains(&format!("has the device rule \"{says}\""))
                && stderr.contains("lets it open every character device")
        };
        assert!(refused, "{id}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{id}: one line: {stderr}");
        assert!(reservations(&bed).is_empty(), "{id}: nothing reserved");
    }
}

#[test]
fn a_rule_runc_reads_as_every_device_or_otherwise_is_refused_by_the_hook_alone() {
    let (_dir, bed) = runc_testbed("vg-rule-hook", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    for (id, rule, says) in misread_rules() {
        let bundle = mknod_bundle(&bed, id, true, rule);
        let (ok, stdout, stderr) = run_foreground(&bed, &bundle, id);
        assert!(!ok, "{id}: ran: {stdout}");
        // runc quotes the hook's stderr (Go's %q): the line's own quotes come escaped.
        let refused = if id == "case" {
            stderr.contains(&format!(
                "vramgate: container {id}: its device rule linux.resources.devices["
            )) && stderr.contains("Allow")
                && stderr.contains("runc would read it otherwise than vramgate")
        } else {
            stderr.contains(&format!("vramgate: container {id}: its device rule "))
                && stderr.contains(says)
                && stderr.contains("lets it open the nodes of GPUs it holds no reservation on")
        };
        assert!(refused, "{id}: {stderr}");
        assert!(reservations(&bed).is_empty(), "{id}: nothing reserved");
    }
    // A rule for a DRM minor that is no GPU's the host can name (here: no DRM device at all)
    // may be another GPU's render node: the hook alone refuses it, as it does NVIDIA's major.
    assert!(
        !std::path::Path::new("/sys/dev/char/226:129").exists(),
        "this test needs a host without DRM node 226:129"
    );
    let drm = json!({"allow": true, "type": "c", "major": 226, "minor": 129, "access": "rw"});
    let bundle = mknod_bundle(&bed, "drm", true, drm);
    let (ok, stdout, stderr) = run_foreground(&bed, &bundle, "drm");
    assert!(!ok, "drm: ran: {stdout}");
    assert!(
        stderr.contains("vramgate: container drm: its device rule ") && stderr.contains("allow c 226:129 rw"),
        "{stderr}"
    );
    assert!(reservations(&bed).is_empty());
}

/// Issue 43 item 6: the claim marker scan was quadratic in the number of `VRAMGATE_DRA_*`
/// variables. A spec with 10,000 markers is refused through the built wrapper with one line
/// naming the count, the limit and what to remove, before any claim spec file is read (before,
/// the first marker was looked up and refused as not prepared); nothing is reserved.
#[test]
fn ten_thousand_claim_markers_are_refused_with_one_line_through_the_wrapper() {
    let (_dir, bed) = wrapper_testbed("vg-markers", TWO_GPUS);
    let _cleanup = Cleanup(&bed);
    let secret = "0".repeat(32);
    let env: Vec<String> = ["VRAMGATE_MEMORY=1Gi".to_string(), "VRAMGATE_GPUS=GPU-zero".to_string()]
        .into_iter()
        .chain((0..10_000).map(|i| format!("VRAMGATE_DRA_DEVICE_u{i}_gpu_0=u{i}-gpu-0:{secret}")))
        .collect();
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let bundle = bed.bundle("m1", &["true"], &[], &env, false).unwrap();
    let started = std::time::Instant::now();
    let (ok, stderr) = wrapper(&bed, &["create", "--bundle", &bundle.to_string_lossy(), "m1"]);
    let took = started.elapsed();
    assert!(!ok, "refused: {stderr}");
    let line = "the container's environment has 10000 VRAMGATE_DRA_DEVICE_* variables, more than the 64 Kubernetes resource claim devices vramgate reads (the DRA driver sets one per device): remove the container's own VRAMGATE_DRA_DEVICE_* variables, or give it at most 64 claim devices";
    assert!(stderr.contains(line), "{stderr}");
    assert!(!stderr.contains(&secret), "{stderr}");
    // A generous bound, not a measurement: the refusal line above is the oracle.
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    eprintln!("10,000 claim markers refused in {took:?}");
    assert!(reservations(&bed).is_empty());
}
