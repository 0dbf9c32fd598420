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
//! - vramgate's own `vramgate.dev/gpus` / `VRAMGATE_GPUS`, so the hook and `vramgate status`
//!   read what was chosen.

use std::path::Path;

use serde_json::{Map, Value};

use super::{Result, RuntimeError};
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

/// Rewrites `spec` (the bundle's `config.json`, at `path` for messages) so the container gets
/// exactly `chosen`. Checks every shape before changing anything, so an error leaves the spec
/// as it was.
pub fn narrow_to(spec: &mut Value, path: &Path, chosen: &[GpuMemory]) -> Result<()> {
    let root = match spec {
        Value::Object(map) => map,
        other => return Err(shape(path, "(top level)", other, "object")),
    };
    check_shapes(root, path)?;
    let uuids = chosen.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(",");
    let cdi = chosen.iter().map(cdi_name).collect::<Vec<_>>().join(",");
    let keep_minors: Vec<u32> = chosen.iter().filter_map(|g| g.minor).collect();

    // Device nodes and their cgroup rules.
    let mut removed = Vec::new();
    let mut had_nodes = false;
    if let Some(Value::Array(devices)) = root.get_mut("linux").and_then(|l| l.get_mut("devices")) {
        devices.retain(|d| {
            let Some(minor) = d
                .get("path")
                .and_then(Value::as_str)
                .and_then(crate::request::nvidia_minor)
            else {
                return true;
            };
            had_nodes = true;
            if keep_minors.contains(&minor) {
                return true;
            }
            removed.push(minor);
            false
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
                    && is("major", NVIDIA_MAJOR)
                    && removed.iter().any(|m| is("minor", u64::from(*m)));
                !allows_removed
            });
        }
    }

    // Annotations: vramgate's own and CDI requests.
    if let Some(Value::Object(annotations)) = root.get_mut("annotations") {
        if annotations.contains_key(GPUS_ANNOTATION) {
            annotations.insert(GPUS_ANNOTATION.to_string(), Value::String(uuids.clone()));
        }
        for (key, value) in annotations.iter_mut() {
            let Some(text) = value.as_str().filter(|_| key.starts_with(CDI_ANNOTATION_PREFIX)) else {
                continue;
            };
            let names: Vec<&str> = text.split(',').map(str::trim).collect();
            if !names.iter().any(|n| n.starts_with(CDI_GPU_PREFIX)) {
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
            VISIBLE_DEVICES_ENV => {
                saw_visible = true;
                let as_cdi = value.split(',').any(|v| v.trim().starts_with(CDI_GPU_PREFIX));
                if as_cdi {
                    cdi.clone()
                } else {
                    uuids.clone()
                }
            }
            GPUS_ENV => uuids.clone(),
            _ => continue,
        };
        *entry = Value::String(format!("{name}={new}"));
    }
    if !saw_visible && !had_nodes {
        env.push(Value::String(format!("{VISIBLE_DEVICES_ENV}={uuids}")));
    }
    Ok(())
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
        narrow_to(&mut spec, Path::new("c"), &chosen).unwrap();
        assert_eq!(
            spec["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-b", "VRAMGATE_GPUS=GPU-b"])
        );
        let mut spec = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"]}});
        narrow_to(&mut spec, Path::new("c"), &[gpu(0, Some(2), "MIG-x")]).unwrap();
        assert_eq!(
            spec["process"]["env"],
            json!(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0:2"])
        );
        // Nothing named a GPU: the toolkit is told which one.
        let mut spec = json!({"annotations": {"vramgate.dev/gpus": "auto"}});
        narrow_to(&mut spec, Path::new("c"), &chosen).unwrap();
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
        narrow_to(&mut spec, Path::new("c"), &[gpu(2, None, "GPU-c")]).unwrap();
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

    #[test]
    fn a_null_process_or_env_is_taken_as_missing() {
        for spec in [json!({"process": null}), json!({"process": {"env": null}})] {
            let mut spec = spec;
            narrow_to(&mut spec, Path::new("/b/config.json"), &[gpu(0, None, "GPU-a")]).unwrap();
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
            let err = narrow_to(&mut spec, Path::new("/b/config.json"), &[gpu(0, None, "GPU-a")]).unwrap_err();
            assert!(err.to_string().contains("/b/config.json"), "{err}");
            assert_eq!(spec, bad);
        }
    }
}
