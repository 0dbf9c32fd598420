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
//! - the DRM nodes (`/dev/dri/card*`, `renderD*`) newer NVIDIA CDI specs add per GPU: those of
//!   GPUs not chosen go with their rules (another vendor's stay);
//! - the device-cgroup rules themselves, since a container with `CAP_MKNOD` can make a node the
//!   spec does not list ([`crate::device_rules`]): a rule for a GPU not chosen goes, a wildcard
//!   over NVIDIA's major (`c 195:* rwm`) or the DRM major becomes one rule per node the
//!   container keeps, and a rule over every character device (`c *:* rwm`, a privileged
//!   container) is refused with a line, since no rewrite keeps it and holds the container to
//!   its GPUs;
//! - vramgate's own `vramgate.dev/gpus` / `VRAMGATE_GPUS`, so the hook and `vramgate status`
//!   read what was chosen.
//!
//! It only ever takes away: the GPUs chosen are among those the engine gave (admission checks
//! it: [`crate::request::RequestError::OutsideGiven`]), or placed where the engine gave all.

use std::path::Path;

use serde_json::{Map, Value};

use super::{Result, RuntimeError};
use crate::device_rules::{self, DeviceRule, DrmNode, HostPaths, Kept, DRM_MAJOR, NVIDIA_CONTROL_MINORS, NVIDIA_MAJOR};
use crate::inventory::mig_caps::{MigMinors, NVIDIA_CAPS_DRIVER};
use crate::inventory::GpuMemory;
use crate::request::{CDI_ANNOTATION_PREFIX, CDI_GPU_PREFIX, GPUS_ANNOTATION, GPUS_ENV, VISIBLE_DEVICES_ENV};
use crate::spec::{array_at, object_at};

/// Where DRM nodes live in a container.
const DRM_DIR: &str = "/dev/dri/";

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
/// exactly `chosen`. `mig_minors` says which MIG capability nodes are host-wide (kept); `host`
/// whose each DRM node is. Checks every shape and rule before changing anything, so an error
/// leaves the spec as it was.
pub fn narrow_to(
    spec: &mut Value,
    path: &Path,
    chosen: &[GpuMemory],
    none_given: WhenNoneGiven,
    mig_minors: &MigMinors,
    host: &HostPaths,
) -> Result<()> {
    let root = match spec {
        Value::Object(map) => map,
        other => return Err(shape(path, "(top level)", other, "object")),
    };
    check_shapes(root, path)?;
    check_rules(root, path)?;
    let uuids = chosen.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(",");
    let cdi = chosen.iter().map(cdi_name).collect::<Vec<_>>().join(",");
    let keep_minors: Vec<u32> = chosen.iter().filter_map(|g| g.minor).collect();
    let keep_caps: Vec<u32> = chosen.iter().flat_map(|g| g.mig_caps.iter().copied()).collect();

    // Device nodes and their cgroup rules: a removed node's rule is matched by the node's own
    // type, major and minor (the MIG capabilities' major is assigned at load, not fixed).
    let mut removed: Vec<(u64, u64)> = Vec::new();
    let mut kept_drm: Vec<u64> = Vec::new();
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
            if node_path.starts_with(DRM_DIR) {
                let Some(minor) = number("minor").filter(|_| number("major").is_none_or(|m| m == DRM_MAJOR)) else {
                    return true;
                };
                let keep = match host.drm_node(minor) {
                    DrmNode::OtherVendor => true,
                    DrmNode::NvidiaGpu(gpu) => keep_minors.contains(&gpu),
                    DrmNode::Unknown => false,
                };
                if keep {
                    kept_drm.push(minor);
                } else {
                    removed.push((DRM_MAJOR, minor));
                }
                return keep;
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
    if let Some(Value::Array(rules)) = root
        .get_mut("linux")
        .and_then(|l| l.get_mut("resources"))
        .and_then(|r| r.get_mut("devices"))
    {
        let gpu_minors: Vec<u64> = NVIDIA_CONTROL_MINORS
            .into_iter()
            .chain(keep_minors.iter().map(|m| u64::from(*m)))
            .collect();
        // The MIG capabilities' major is assigned at load: a wildcard over it would reach
        // every MIG device's capability, so it becomes one rule per capability kept (its own
        // and the host-wide ones).
        let caps = host.char_major(NVIDIA_CAPS_DRIVER).map(|major| {
            let minors = keep_caps
                .iter()
                .copied()
                .chain(mig_minors.host_wide_minors())
                .map(u64::from)
                .collect::<Vec<u64>>();
            (major, minors)
        });
        let kept = Kept {
            gpu_minors: &keep_minors,
            caps: None,
            host,
        };
        *rules = narrow_rules(
            std::mem::take(rules),
            &removed,
            &gpu_minors,
            &kept_drm,
            caps.as_ref(),
            &kept,
        );
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

/// A container holding a reservation must not keep a rule that opens every character device
/// (`c *:* rw`, any allow rule of type `a`, which runc reads as every device whatever its
/// numbers): with `mknod` it reaches every GPU, and no rewrite of the rule both keeps what it
/// was for and holds the container to its GPUs. Nor a rule runc would read otherwise than we
/// do ([`device_rules::misread_rule`]), since what is narrowed must be what runc applies.
fn check_rules(root: &Map<String, Value>, path: &Path) -> Result<()> {
    let rules = root
        .get("linux")
        .and_then(|l| l.get("resources"))
        .and_then(|r| r.get("devices"))
        .and_then(Value::as_array);
    if let Some((index, why)) = rules.and_then(|rules| device_rules::misread_rule(rules)) {
        return Err(RuntimeError::MisreadDeviceRule {
            path: path.to_path_buf(),
            index,
            why,
        });
    }
    match rules
        .into_iter()
        .flatten()
        .map(DeviceRule)
        .find(DeviceRule::opens_every_char_major)
    {
        Some(rule) => Err(RuntimeError::WideDeviceRule {
            path: path.to_path_buf(),
            rule: rule.describe(),
        }),
        None => Ok(()),
    }
}

/// The device-cgroup rules of a container narrowed to its GPUs: rules that allow a removed
/// node, or a GPU (or MIG capability) minor it does not keep, go, and so does one for a DRM
/// minor that is neither a node it keeps nor, on the host, its GPU's or another vendor's (a
/// rule for another GPU's render node needs no node in the spec: `mknod` makes one); a
/// wildcard over NVIDIA's major, the DRM major or the MIG capabilities' (`caps`: its major and
/// the minors kept) that opens nodes becomes one rule per minor it keeps there (`gpu_minors`:
/// the control nodes and its GPUs'; `drm_minors`); everything else stays, in order.
fn narrow_rules(
    rules: Vec<Value>,
    removed: &[(u64, u64)],
    gpu_minors: &[u64],
    drm_minors: &[u64],
    caps: Option<&(u64, Vec<u64>)>,
    kept: &Kept,
) -> Vec<Value> {
    let mut narrowed = Vec::with_capacity(rules.len());
    for rule in rules {
        let r = DeviceRule(&rule);
        let char_allow = r.allows() && matches!(r.kind(), "a" | "c");
        let split = |minors: &[u64]| -> Vec<Value> {
            minors
                .iter()
                .map(|minor| {
                    let mut one = rule.clone();
                    one["type"] = Value::from("c");
                    one["minor"] = Value::from(*minor);
                    one
                })
                .collect()
        };
        match (r.major(), r.minor()) {
            (Some(major), Some(minor)) if char_allow && removed.contains(&(major, minor)) => {}
            (Some(NVIDIA_MAJOR), Some(minor)) if char_allow && r.opens() && !gpu_minors.contains(&minor) => {}
            (Some(NVIDIA_MAJOR), None) if char_allow && r.opens() => narrowed.extend(split(gpu_minors)),
            (Some(DRM_MAJOR), None) if char_allow && r.opens() => narrowed.extend(split(drm_minors)),
            (Some(DRM_MAJOR), Some(minor))
                if char_allow && r.opens() && !drm_minors.contains(&minor) && !kept.keeps_drm_minor(minor) => {}
            (Some(major), minor) if char_allow && r.opens() && caps.is_some_and(|(m, _)| *m == major) => {
                let kept = caps.map(|(_, kept)| kept.as_slice()).unwrap_or_default();
                match minor {
                    None => narrowed.extend(split(kept)),
                    Some(minor) if kept.contains(&minor) => narrowed.push(rule),
                    Some(_) => {}
                }
            }
            _ => narrowed.push(rule),
        }
    }
    narrowed
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
    // Each field with whether it is an array (else an object); parents before their children,
    // so a child is looked up only under a parent of the right shape (or none).
    const FIELDS: [(&str, bool); 7] = [
        ("process", false),
        ("process.env", true),
        ("annotations", false),
        ("linux", false),
        ("linux.devices", true),
        ("linux.resources", false),
        ("linux.resources.devices", true),
    ];
    for (field, array) in FIELDS {
        let mut keys = field.split('.');
        let top = root.get(keys.next().unwrap_or_default());
        let value = keys.fold(top, |v, key| v.and_then(|v| v.get(key)));
        let (ok, expected): (fn(&Value) -> bool, _) = if array {
            (Value::is_array, "array")
        } else {
            (Value::is_object, "object")
        };
        match value {
            Some(v) if !v.is_null() && !ok(v) => return Err(shape(path, field, v, expected)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
