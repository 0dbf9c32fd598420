//! Narrowing a container to the GPUs vramgate chose for it (placement, `auto`), in its spec,
//! before the next runtime reads it.
//!
//! Every place a GPU can be given to a container is rewritten, so isolation never rests on
//! `CUDA_VISIBLE_DEVICES` or on one mechanism alone:
//! - `NVIDIA_VISIBLE_DEVICES`, which nvidia-container-runtime reads in legacy and in CDI mode
//!   (rewritten in the form it had: UUIDs, or CDI names `nvidia.com/gpu=<index>`, the names
//!   `nvidia-ctk cdi generate` always writes); added when the spec has no other device for the
//!   toolkit to act on;
//! - CDI device requests in `cdi.k8s.io/*` annotations (other vendors' devices are kept);
//! - the `/dev/nvidiaN` nodes already in `linux.devices` (CDI injected upstream, as with
//!   `podman --device nvidia.com/gpu=all`), and their device-cgroup rules: nodes of GPUs that
//!   were not chosen are removed, along with the rules that allow them;
//! - the MIG capability nodes `/dev/nvidia-caps/nvidia-capN` (CDI's MIG injection gives the
//!   parent's `/dev/nvidiaN` and two of these per MIG device, which are what grant access to
//!   that MIG device): those of MIG devices not chosen go, with their rules; the host-wide
//!   `config` and `monitor` capabilities stay (see [`MigMinors::is_host_wide`]);
//! - vramgate's own `vramgate.dev/gpus` / `VRAMGATE_GPUS`, so the hook and `vramgate status`
//!   read what was chosen.

use std::path::Path;

use serde_json::{Map, Value};

use super::{Result, RuntimeError};
use crate::inventory::mig_caps::MigMinors;
use crate::inventory::GpuMemory;
use crate::request::{CDI_ANNOTATION_PREFIX, CDI_GPU_PREFIX, GPUS_ANNOTATION, GPUS_ENV, VISIBLE_DEVICES_ENV};
use crate::spec::{array_at, object_at};

/// The major number of NVIDIA's GPU device nodes (`/dev/nvidiaN`, `/dev/nvidiactl`).
const NVIDIA_MAJOR: u64 = 195;

fn shape(path: &Path, field: &str, found: &Value, expected: &'static str) -> RuntimeError {
    RuntimeError::SpecShape {
        path: path.to_path_buf(),
        field: field.to_string(),
        found: crate::spec::json_type(found),
        expected,
    }
}

/// The CDI name of a GPU: `nvidia.com/gpu=0`, or `=0:1` for a MIG device.
fn cdi_name(gpu: &GpuMemory) -> String {
    match gpu.mig_index {
        Some(mig) => format!("{CDI_GPU_PREFIX}{}:{mig}", gpu.index),
        None => format!("{CDI_GPU_PREFIX}{}", gpu.index),
    }
}

/// How [`narrow_to`] treats a spec that gives the container no GPU at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenNoneGiven {
    /// vramgate chose the GPUs (placement): tell the toolkit which, through
    /// `NVIDIA_VISIBLE_DEVICES`.
    Give,
    /// The container named its GPUs: narrowing only takes away what it was given beyond its
    /// reservation, never gives it a GPU its engine did not.
    Leave,
}

/// Rewrites `spec` (the bundle's `config.json`, at `path` for messages) so the container gets
/// exactly `chosen`. `mig_minors` says which MIG capability nodes are host-wide (kept).
/// Checks every shape before changing anything, so an error leaves the spec as it was.
pub fn narrow_to(
    spec: &mut Value,
    path: &Path,
    chosen: &[GpuMemory],
    none_given: WhenNoneGiven,
    mig_minors: &MigMinors,
) -> Result<()> {
    let root = match spec {
        Value::Object(map) => map,
        other => return Err(shape(path, "(top level)", other, "object")),
    };
    check_shapes(root, path)?;
    let uuids = chosen.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(",");
    let cdi = chosen.iter().map(cdi_name).collect::<Vec<_>>().join(",");
    let keep_minors: Vec<u32> = chosen.iter().filter_map(|g| g.minor).collect();
    let keep_caps: Vec<u32> = chosen.iter().flat_map(|g| g.mig_caps.iter().copied()).collect();

    // Device nodes and their cgroup rules: a removed node's rule is matched by the node's own
    // type, major and minor (the MIG capabilities' major is assigned at load, not fixed).
    let mut removed: Vec<(u64, u64)> = Vec::new();
    let mut had_nodes = false;
    if let Some(Value::Array(devices)) = root.get_mut("linux").and_then(|l| l.get_mut("devices")) {
        devices.retain(|d| {
            let node_path = d.get("path").and_then(Value::as_str).unwrap_or_default();
            let number = |key: &str| d.get(key).and_then(Value::as_u64);
            if let Some(minor) = crate::request::nvidia_minor(node_path) {
                had_nodes = true;
                if keep_minors.contains(&minor) {
                    return true;
                }
                removed.push((number("major").unwrap_or(NVIDIA_MAJOR), u64::from(minor)));
                return false;
            }
            if let Some(cap) = crate::request::mig_cap_minor(node_path) {
                if keep_caps.contains(&cap) || mig_minors.is_host_wide(cap) {
                    return true;
                }
                // A node without its numbers cannot be matched to a rule; runc takes the
                // numbers from the host's node then, and no rule of the spec allows it.
                if let (Some(major), Some(minor)) = (number("major"), number("minor")) {
                    removed.push((major, minor));
                }
                return false;
            }
            true
        });
    }
    if !removed.is_empty() {
        if let Some(Value::Array(rules)) = root
            .get_mut("linux")
            .and_then(|l| l.get_mut("resources"))
            .and_then(|r| r.get_mut("devices"))
        {
            rules.retain(|rule| {
                let is = |key: &str, want: u64| rule.get(key).and_then(Value::as_u64) == Some(want);
                let allows_removed = rule.get("allow").and_then(Value::as_bool) == Some(true)
                    && rule.get("type").and_then(Value::as_str) == Some("c")
                    && removed
                        .iter()
                        .any(|(major, minor)| is("major", *major) && is("minor", *minor));
                !allows_removed
            });
        }
    }

    // vramgate's own request names what it chose only after a placement (`auto`); a request
    // that named its GPUs named what was reserved.
    let placed = none_given == WhenNoneGiven::Give;
    // Annotations: vramgate's own and CDI requests.
    if let Some(Value::Object(annotations)) = root.get_mut("annotations") {
        if placed && annotations.contains_key(GPUS_ANNOTATION) {
            annotations.insert(GPUS_ANNOTATION.to_string(), Value::String(uuids.clone()));
        }
        for (key, value) in annotations.iter_mut() {
            let Some(text) = value.as_str().filter(|_| key.starts_with(CDI_ANNOTATION_PREFIX)) else {
                continue;
            };
            let names: Vec<&str> = text.split(',').map(str::trim).collect();
            let gpu_names: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| n.starts_with(CDI_GPU_PREFIX))
                .collect();
            if gpu_names.is_empty() || names_exactly(&gpu_names, chosen) {
                continue;
            }
            let mut kept: Vec<String> = names
                .iter()
                .filter(|n| !n.starts_with(CDI_GPU_PREFIX))
                .map(|n| n.to_string())
                .collect();
            kept.push(cdi.clone());
            *value = Value::String(kept.join(","));
        }
    }

    // The environment.
    let Some(env) = object_at(root, "process").and_then(|process| array_at(process, "env")) else {
        unreachable!("checked in check_shapes")
    };
    let mut saw_visible = false;
    for entry in env.iter_mut() {
        let Some((name, value)) = entry.as_str().and_then(|e| e.split_once('=')) else {
            continue;
        };
        let new = match name {
            // `none` and `void` give no GPU: there is nothing to narrow.
            VISIBLE_DEVICES_ENV if gives_no_gpu(value) && !placed => continue,
            // Already exactly the reserved GPUs, in whatever form: left as the engine wrote it.
            VISIBLE_DEVICES_ENV if names_exactly(&value.split(',').map(str::trim).collect::<Vec<_>>(), chosen) => {
                saw_visible = true;
                continue;
            }
            VISIBLE_DEVICES_ENV => {
                saw_visible = true;
                let as_cdi = value.split(',').any(|v| v.trim().starts_with(CDI_GPU_PREFIX));
                if as_cdi {
                    cdi.clone()
                } else {
                    uuids.clone()
                }
            }
            GPUS_ENV if placed => uuids.clone(),
            _ => continue,
        };
        *entry = Value::String(format!("{name}={new}"));
    }
    if !saw_visible && !had_nodes && none_given == WhenNoneGiven::Give {
        env.push(Value::String(format!("{VISIBLE_DEVICES_ENV}={uuids}")));
    }
    Ok(())
}

/// Whether a device list (`0`, `0:1`, `GPU-…`, `MIG-…`, each possibly as a CDI name
/// `nvidia.com/gpu=…`) names exactly the GPUs of `chosen`, each at least once and nothing
/// else. `all` and anything unknown do not.
fn names_exactly(names: &[&str], chosen: &[GpuMemory]) -> bool {
    let names_one = |name: &str, gpu: &GpuMemory| {
        let name = name.strip_prefix(CDI_GPU_PREFIX).unwrap_or(name);
        if name == gpu.uuid {
            return true;
        }
        let (index, mig) = match name.split_once(':') {
            Some((index, mig)) => (index, Some(mig)),
            None => (name, None),
        };
        index.parse::<u32>().ok() == Some(gpu.index) && mig.map(|m| m.parse::<u32>().ok()) == gpu.mig_index.map(Some)
    };
    !names.is_empty()
        && names.iter().all(|n| chosen.iter().any(|g| names_one(n, g)))
        && chosen.iter().all(|g| names.iter().any(|n| names_one(n, g)))
}

/// `NVIDIA_VISIBLE_DEVICES` values under which the toolkit gives no GPU.
fn gives_no_gpu(value: &str) -> bool {
    matches!(value.trim(), "" | "none" | "void")
}

/// The fields [`narrow_to`] edits must have the types the OCI spec gives them.
fn check_shapes(root: &Map<String, Value>, path: &Path) -> Result<()> {
    let want = |field: &str, value: Option<&Value>, ok: fn(&Value) -> bool, expected| match value {
        Some(v) if !v.is_null() && !ok(v) => Err(shape(path, field, v, expected)),
        _ => Ok(()),
    };
    want("process", root.get("process"), Value::is_object, "object")?;
    let process = root.get("process");
    want(
        "process.env",
        process.and_then(|p| p.get("env")),
        Value::is_array,
        "array",
    )?;
    want("annotations", root.get("annotations"), Value::is_object, "object")?;
    want("linux", root.get("linux"), Value::is_object, "object")?;
    let linux = root.get("linux");
    want(
        "linux.devices",
        linux.and_then(|l| l.get("devices")),
        Value::is_array,
        "array",
    )?;
    want(
        "linux.resources",
        linux.and_then(|l| l.get("resources")),
        Value::is_object,
        "object",
    )?;
    want(
        "linux.resources.devices",
        linux.and_then(|l| l.get("resources")).and_then(|r| r.get("devices")),
        Value::is_array,
        "array",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu(index: u32, mig: Option<u32>, uuid: &str) -> GpuMemory {
        GpuMemory::for_test(index, mig, uuid)
    }

    /// [`narrow_to`] on a host without MIG capabilities, for a spec at path "c".
    fn narrow(spec: &mut Value, chosen: &[GpuMemory], none_given: WhenNoneGiven) {
        narrow_to(spec, Path::new("c"), chosen, none_given, &MigMinors::default()).unwrap();
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
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
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
        let minors = MigMinors::parse("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n");
        let mut chosen = gpu(0, Some(1), "MIG-b");
        chosen.mig_caps = vec![21, 22];
        let mut spec = cdi_mig_spec();
        narrow_to(&mut spec, Path::new("c"), &[chosen], WhenNoneGiven::Leave, &minors).unwrap();
        let paths: Vec<&str> = spec["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["path"].as_str().unwrap())
            .collect();
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

    #[test]
    fn a_null_process_or_env_is_taken_as_missing() {
        for spec in [json!({"process": null}), json!({"process": {"env": null}})] {
            let mut spec = spec;
            narrow_to(
                &mut spec,
                Path::new("/b/config.json"),
                &[gpu(0, None, "GPU-a")],
                WhenNoneGiven::Give,
                &MigMinors::default(),
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
            let err = narrow_to(
                &mut spec,
                Path::new("/b/config.json"),
                &[gpu(0, None, "GPU-a")],
                WhenNoneGiven::Give,
                &MigMinors::default(),
            )
            .unwrap_err();
            assert!(err.to_string().contains("/b/config.json"), "{err}");
            assert_eq!(spec, bad);
        }
    }
}
