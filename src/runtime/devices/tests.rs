use super::*;
use serde_json::json;

fn gpu(index: u32, mig: Option<u32>, uuid: &str) -> GpuMemory {
    GpuMemory::for_test(index, mig, uuid)
}

/// [`narrow_to`] on a host without MIG capabilities or DRM nodes, for a spec at `path`.
fn try_narrow(spec: &mut Value, path: &str, chosen: &[GpuMemory], none_given: WhenNoneGiven) -> Result<()> {
    let host = HostPaths::default();
    narrow_to(spec, Path::new(path), chosen, none_given, &MigMinors::default(), &host)
}

/// [`try_narrow`] for a spec at path "c", which must succeed.
fn narrow(spec: &mut Value, chosen: &[GpuMemory], none_given: WhenNoneGiven) {
    try_narrow(spec, "c", chosen, none_given).unwrap();
}

fn node(n: &str, minor: u64) -> Value {
    json!({"path": n, "type": "c", "major": 195, "minor": minor})
}

fn rule(minor: u64) -> Value {
    json!({"allow": true, "type": "c", "major": 195, "minor": minor, "access": "rwm"})
}

#[test]
fn env_forms_are_kept() {
    let chosen = [gpu(1, None, "GPU-b")];
    let mut spec = json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "VRAMGATE_GPUS=auto"]}});
    narrow(&mut spec, &chosen, WhenNoneGiven::Give);
    assert_eq!(
        spec["process"]["env"],
        json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-b", "VRAMGATE_GPUS=GPU-b"])
    );
    let mut spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"]}});
    narrow(&mut spec, &[gpu(0, Some(2), "MIG-x")], WhenNoneGiven::Give);
    assert_eq!(
        spec["process"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0:2"])
    );
    // Nothing named a GPU: the toolkit is told which one.
    let mut spec = json!({"annotations": {"vramgate.dev/gpus": "auto"}});
    narrow(&mut spec, &chosen, WhenNoneGiven::Give);
    assert_eq!(spec["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=GPU-b"]));
    assert_eq!(spec["annotations"]["vramgate.dev/gpus"], "GPU-b");
}

#[test]
fn injected_nodes_and_their_rules_are_narrowed() {
    let mut spec = json!({
        "annotations": {"cdi.k8s.io/plugin_x": "nvidia.com/gpu=all,vendor.com/nic=0"},
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        "linux": {
            "devices": [node("/dev/nvidiactl", 255), node("/dev/nvidia0", 0), node("/dev/nvidia1", 1), node("/dev/nvidia2", 2)],
            "resources": {"devices": [{"allow": false, "access": "rwm"}, rule(255), rule(0), rule(1), rule(2)]}
        }
    });
    narrow(&mut spec, &[gpu(2, None, "GPU-c")], WhenNoneGiven::Give);
    let paths = node_paths(&spec);
    assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia2"]);
    assert_eq!(
        spec["linux"]["resources"]["devices"],
        json!([{"allow": false, "access": "rwm"}, rule(255), rule(2)])
    );
    assert_eq!(spec["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=GPU-c"]));
    assert_eq!(
        spec["annotations"]["cdi.k8s.io/plugin_x"],
        "vendor.com/nic=0,nvidia.com/gpu=2"
    );
}

/// What `nvidia-ctk cdi generate` injects for `nvidia.com/gpu=all` on a GPU in MIG mode with
/// two MIG devices (0:0 and 0:1): the parent's node, each MIG device's GPU-instance and
/// compute-instance capability nodes (major of nvidia-caps, 511 here), the host-wide
/// monitor capability, and a device-cgroup rule for each.
fn cdi_mig_spec() -> Value {
    let cap = |minor: u64| json!({"path": format!("/dev/nvidia-caps/nvidia-cap{minor}"), "type": "c", "major": 511, "minor": minor});
    let cap_rule = |minor: u64| json!({"allow": true, "type": "c", "major": 511, "minor": minor, "access": "rw"});
    json!({
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
        "linux": {
            "devices": [node("/dev/nvidiactl", 255), node("/dev/nvidia0", 0), cap(2), cap(12), cap(13), cap(21), cap(22)],
            "resources": {"devices": [{"allow": false, "access": "rwm"}, rule(255), rule(0), cap_rule(2), cap_rule(12), cap_rule(13), cap_rule(21), cap_rule(22)]}
        }
    })
}

#[test]
fn mig_capabilities_of_unchosen_mig_devices_go_with_their_rules() {
    let minors = MigMinors::parse(
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n",
    );
    let mut chosen = gpu(0, Some(1), "MIG-b");
    chosen.mig_caps = vec![21, 22];
    let mut spec = cdi_mig_spec();
    narrow_to(
        &mut spec,
        Path::new("c"),
        &[chosen],
        WhenNoneGiven::Leave,
        &minors,
        &HostPaths::default(),
    )
    .unwrap();
    let paths = node_paths(&spec);
    assert_eq!(
        paths,
        [
            "/dev/nvidiactl",
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap2",
            "/dev/nvidia-caps/nvidia-cap21",
            "/dev/nvidia-caps/nvidia-cap22"
        ]
    );
    let allowed: Vec<(u64, u64)> = spec["linux"]["resources"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["allow"] == true)
        .map(|r| (r["major"].as_u64().unwrap(), r["minor"].as_u64().unwrap()))
        .collect();
    assert_eq!(allowed, [(195, 255), (195, 0), (511, 2), (511, 21), (511, 22)]);
    // `void` gave no GPU through the toolkit, and still gives none.
    assert_eq!(spec["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=void"]));
}

/// A wildcard over the MIG capabilities' major (assigned at load: 511 here, as
/// `/proc/devices` says) would reach every MIG device's capability: it becomes one rule per
/// capability kept, and a rule for another MIG device's capability goes without its node.
#[test]
fn a_wildcard_over_the_mig_capabilities_keeps_only_the_chosen_mig_devices() {
    let minors = MigMinors::parse(
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n",
    );
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    std::fs::write(
        root.path().join("proc/devices"),
        "Character devices:\n195 nvidia\n511 nvidia-caps\n",
    )
    .unwrap();
    let host = HostPaths {
        sys: root.path().join("sys"),
        proc: root.path().join("proc"),
    };
    let mut chosen = gpu(0, Some(1), "MIG-b");
    chosen.mig_caps = vec![21, 22];
    let mut spec = json!({
        "linux": {
            "devices": [node("/dev/nvidia0", 0)],
            "resources": {"devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 511, "minor": 12, "access": "r"},
                {"allow": true, "type": "c", "major": 511, "access": "r"}
            ]}
        }
    });
    narrow_to(
        &mut spec,
        Path::new("c"),
        &[chosen],
        WhenNoneGiven::Leave,
        &minors,
        &host,
    )
    .unwrap();
    let caps: Vec<Option<u64>> = allowed(&spec)
        .iter()
        .filter(|r| r.1 == Some(511))
        .map(|r| r.2)
        .collect();
    assert_eq!(caps, [Some(21), Some(22), Some(1), Some(2)]);
}

#[test]
fn a_container_that_named_its_gpus_is_only_ever_narrowed() {
    let chosen = [gpu(1, None, "GPU-b")];
    // Reserved on GPU 1 but given every GPU: it sees GPU 1 alone.
    let mut spec =
        json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "annotations": {"vramgate.dev/gpus": "1"}});
    narrow(&mut spec, &chosen, WhenNoneGiven::Leave);
    assert_eq!(spec["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=GPU-b"]));
    assert_eq!(spec["annotations"]["vramgate.dev/gpus"], "1", "its own request stays");
    // Given exactly what it reserved, in any form: nothing changes.
    for (visible, cdi) in [
        ("1", "nvidia.com/gpu=1"),
        ("GPU-b", "nvidia.com/gpu=GPU-b"),
        ("nvidia.com/gpu=1", "nvidia.com/gpu=1,vendor.com/nic=0"),
    ] {
        let before = json!({"process": {"env": [format!("NVIDIA_VISIBLE_DEVICES={visible}")]}, "annotations": {"cdi.k8s.io/x": cdi}});
        let mut spec = before.clone();
        narrow(&mut spec, &chosen, WhenNoneGiven::Leave);
        assert_eq!(spec, before);
    }
    let mut spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1,2"]}});
    narrow(&mut spec, &chosen, WhenNoneGiven::Leave);
    assert_eq!(
        spec["process"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=GPU-b"]),
        "one GPU too many"
    );
    // Given no GPU at all: none is added.
    for env in [json!([]), json!(["NVIDIA_VISIBLE_DEVICES=none"])] {
        let mut spec = json!({"process": {"env": env.clone()}});
        narrow(&mut spec, &chosen, WhenNoneGiven::Leave);
        assert_eq!(spec["process"]["env"], env);
    }
}

/// The paths of the spec's device nodes, in order.
fn node_paths(spec: &Value) -> Vec<&str> {
    spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect()
}

fn allowed(spec: &Value) -> Vec<(String, Option<u64>, Option<u64>, String)> {
    spec["linux"]["resources"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["allow"] == true)
        .map(|r| {
            (
                r["type"].as_str().unwrap_or("a").to_string(),
                r["major"].as_u64(),
                r["minor"].as_u64(),
                r["access"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// `--device-cgroup-rule 'c 195:* rwm'` beside one injected GPU, a leftover rule for GPU 2
/// with no node, and the engines' default `c *:* m`: with mknod, the container could make
/// `/dev/nvidia1` and open it. After narrowing no rule opens a GPU it does not hold.
#[test]
fn rules_that_would_reach_another_gpu_are_narrowed_too() {
    let mut spec = json!({
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        "linux": {
            "devices": [node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)],
            "resources": {"devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": null, "minor": null, "access": "m"},
                {"allow": true, "type": "c", "major": 195, "minor": null, "access": "rwm"},
                rule(2),
                {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}
            ]}
        }
    });
    narrow(&mut spec, &[gpu(1, None, "GPU-b")], WhenNoneGiven::Leave);
    let s = |t: &str| t.to_string();
    assert_eq!(
        allowed(&spec),
        [
            (s("c"), None, None, s("m")),
            (s("c"), Some(195), Some(254), s("rwm")),
            (s("c"), Some(195), Some(255), s("rwm")),
            (s("c"), Some(195), Some(1), s("rwm")),
            (s("c"), Some(1), Some(3), s("rwm")),
        ]
    );
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    let host = HostPaths {
        sys: "/nonexistent/sys".into(),
        proc: "/nonexistent/proc".into(),
    };
    let kept = crate::device_rules::Kept {
        gpu_minors: &[1],
        caps: None,
        host: &host,
    };
    assert!(crate::device_rules::reaching_other_gpus(rules, &kept).is_none());
}

#[test]
fn a_rule_over_every_character_device_is_refused_and_the_spec_left_alone() {
    for wide in [
        json!({"allow": true, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": -1, "minor": -1, "access": "rw"}),
        // runc reads type `a` as every device, whatever its numbers and access.
        json!({"allow": true, "type": "a", "major": 195, "minor": 1, "access": "rwm"}),
        json!({"allow": true, "type": "a", "major": null, "minor": null, "access": "m"}),
        json!({"allow": true, "type": "a", "major": 1, "minor": 3, "access": "rwm"}),
        json!({"allow": true, "type": "", "major": 1, "minor": 3, "access": "rwm"}),
    ] {
        let before = json!({
            "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
            "linux": {"devices": [node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)],
                      "resources": {"devices": [wide]}}
        });
        let mut spec = before.clone();
        let err = try_narrow(
            &mut spec,
            "/b/config.json",
            &[gpu(1, None, "GPU-b")],
            WhenNoneGiven::Leave,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/b/config.json") && err.contains("\"allow ") && err.contains("drop --privileged"),
            "{err}"
        );
        assert_eq!(spec, before);
    }
}

/// Newer NVIDIA CDI specs add each GPU's DRM nodes: those of GPUs not chosen go (by the PCI
/// device behind them), another vendor's stay, and a wildcard over the DRM major becomes
/// one rule per node kept.
#[test]
fn drm_nodes_of_gpus_not_chosen_go_with_their_rules() {
    let scratch = crate::device_rules::ScratchHost::new();
    let host = &scratch.paths;
    for (minor, address, vendor) in [
        (0, "0000:00:02.0", "0x8086"),
        (1, "0000:3b:00.0", "0x10de"),
        (2, "0000:5e:00.0", "0x10de"),
        (129, "0000:5e:00.0", "0x10de"),
    ] {
        scratch.drm_node(minor, address, vendor);
    }
    scratch.nvidia_gpu("0000:3b:00.0", 0);
    scratch.nvidia_gpu("0000:5e:00.0", 1);
    let drm =
        |name: &str, minor: u64| json!({"path": format!("/dev/dri/{name}"), "type": "c", "major": 226, "minor": minor});
    let mut spec = json!({
        "linux": {
            "devices": [node("/dev/nvidia0", 0), node("/dev/nvidia1", 1), drm("card0", 0), drm("card1", 1), drm("card2", 2), drm("renderD129", 129), drm("card7", 7)],
            "resources": {"devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 226, "minor": 1, "access": "rw"},
                {"allow": true, "type": "c", "major": 226, "access": "rw"}
            ]}
        }
    });
    narrow_to(
        &mut spec,
        Path::new("c"),
        &[gpu(1, None, "GPU-b")],
        WhenNoneGiven::Leave,
        &MigMinors::default(),
        host,
    )
    .unwrap();
    let paths = node_paths(&spec);
    assert_eq!(
        paths,
        [
            "/dev/nvidia1",
            "/dev/dri/card0",
            "/dev/dri/card2",
            "/dev/dri/renderD129"
        ]
    );
    let minors: Vec<Option<u64>> = allowed(&spec).iter().map(|r| r.2).collect();
    assert_eq!(
        minors,
        [Some(0), Some(2), Some(129)],
        "card1's rule gone, the wildcard split"
    );

    // A rule for GPU 0's DRM node with no node in the spec: `mknod` makes one, so it goes too;
    // rules for another vendor's node and for its own GPU's stay without their nodes.
    let mut spec = json!({
        "linux": {
            "devices": [node("/dev/nvidia1", 1)],
            "resources": {"devices": [
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 226, "minor": 1, "access": "rw"},
                {"allow": true, "type": "c", "major": 226, "minor": 0, "access": "rw"},
                {"allow": true, "type": "c", "major": 226, "minor": 2, "access": "rw"},
                {"allow": true, "type": "c", "major": 226, "minor": 99, "access": "rw"}
            ]}
        }
    });
    narrow_to(
        &mut spec,
        Path::new("c"),
        &[gpu(1, None, "GPU-b")],
        WhenNoneGiven::Leave,
        &MigMinors::default(),
        &host,
    )
    .unwrap();
    let minors: Vec<Option<u64>> = allowed(&spec).iter().map(|r| r.2).collect();
    assert_eq!(
        minors,
        [Some(0), Some(2)],
        "GPU 0's card1 and the unknown minor 99 gone without their nodes"
    );
}

/// A rule whose keys runc matches without case (`"Allow"`) is refused, naming the rule.
#[test]
fn a_rule_runc_would_read_otherwise_is_refused_and_the_spec_left_alone() {
    let before = json!({
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        "linux": {"devices": [node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)],
                  "resources": {"devices": [
                      {"allow": false, "access": "rwm"},
                      {"Allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}
                  ]}}
    });
    let mut spec = before.clone();
    let err = try_narrow(
        &mut spec,
        "/b/config.json",
        &[gpu(1, None, "GPU-b")],
        WhenNoneGiven::Leave,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("/b/config.json") && err.contains("linux.resources.devices[1]") && err.contains("\"Allow\""),
        "{err}"
    );
    assert_eq!(spec, before);
}

#[test]
fn a_null_process_or_env_is_taken_as_missing() {
    for spec in [json!({"process": null}), json!({"process": {"env": null}})] {
        let mut spec = spec;
        try_narrow(
            &mut spec,
            "/b/config.json",
            &[gpu(0, None, "GPU-a")],
            WhenNoneGiven::Give,
        )
        .unwrap();
        assert_eq!(spec["process"]["env"], json!(["NVIDIA_VISIBLE_DEVICES=GPU-a"]));
    }
}

#[test]
fn misshapen_specs_are_errors_and_left_alone() {
    for bad in [
        json!({"process": {"env": "x"}}),
        json!({"linux": {"devices": {}}}),
        json!({"annotations": []}),
        json!({"linux": {"resources": {"devices": 1}}}),
    ] {
        let mut spec = bad.clone();
        let err = try_narrow(
            &mut spec,
            "/b/config.json",
            &[gpu(0, None, "GPU-a")],
            WhenNoneGiven::Give,
        )
        .unwrap_err();
        assert!(err.to_string().contains("/b/config.json"), "{err}");
        assert_eq!(spec, bad);
    }
}
