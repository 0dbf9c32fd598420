//! The CDI spec of a prepared claim: one CDI device per allocation result, whose edits give
//! the container the request vramgate reads (`VRAMGATE_MEMORY`, `VRAMGATE_GPUS`) and the GPU's
//! device nodes. Written atomically into the runtime's CDI directory (the runtime may read it
//! at any moment), one file per claim, removed at unprepare; both idempotent.

use std::path::{Path, PathBuf};

use serde_json::json;

/// The CDI kind (`vendor/class`): ids are `vramgate.dev/gpu-memory=<device>`.
pub const KIND: &str = "vramgate.dev/gpu-memory";
/// Device names start with the claim's UID, which may start with a digit: CDI 0.5.0 allows it,
/// and `env` and `deviceNodes` need nothing newer (containerd 1.7 and 2.x read it).
pub const CDI_VERSION: &str = "0.5.0";
/// Where kubelet-era runtimes look for generated specs.
pub const DEFAULT_DIR: &str = "/var/run/cdi";

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("claim uid {0:?} is not a Kubernetes UID (letters, digits and '-'); refusing to name a file after it")]
    BadUid(String),
    #[error("cannot write the CDI spec {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot remove the CDI spec {path}: {source}")]
    Remove { path: PathBuf, source: std::io::Error },
}

/// vramgate's hook, as a claim's CDI device runs it: whatever runtime handler the pod uses,
/// the container reserves at createRuntime and releases at poststop (vramgate-runtime, where
/// the pod uses it, recognises the entries and keeps one of each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    pub path: PathBuf,
    /// The config the hook reads (`VRAMGATE_CONFIG`).
    pub config: PathBuf,
    pub timeout_secs: u64,
}

impl HookSpec {
    fn entries(&self) -> serde_json::Value {
        let entry = |stage: &str| {
            let mut entry = crate::runtime::hook_entry(&self.path, stage, self.timeout_secs, Some(&self.config));
            entry["hookName"] = json!(stage);
            entry
        };
        json!([entry("createRuntime"), entry("poststop")])
    }
}

/// One device of a claim, ready for the container: what to reserve, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDevice {
    /// The device's name in the slice (`gpu-0`).
    pub device: String,
    pub bytes: u64,
    pub uuid: String,
    pub device_nodes: Vec<PathBuf>,
}

fn checked(uid: &str) -> Result<&str, CdiError> {
    let ok = !uid.is_empty() && uid.len() <= 128 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if ok {
        Ok(uid)
    } else {
        Err(CdiError::BadUid(uid.to_string()))
    }
}

/// What this driver's spec files are named by (CDI's transient-spec naming:
/// `<vendor>-<class>_<id>`).
const SPEC_PREFIX: &str = "vramgate.dev-gpu-memory_";

/// The spec file of claim `uid` in `dir`.
pub fn spec_path(dir: &Path, uid: &str) -> Result<PathBuf, CdiError> {
    Ok(dir.join(format!("{SPEC_PREFIX}{}.json", checked(uid)?)))
}

/// Writes (or rewrites: a second prepare is the same) the spec of claim `uid`; returns the CDI
/// ids kubelet hands to the runtime, one per device, in order.
pub fn write_spec(dir: &Path, uid: &str, devices: &[ClaimDevice], hook: &HookSpec) -> Result<Vec<String>, CdiError> {
    let path = spec_path(dir, uid)?;
    let names: Vec<String> = devices.iter().map(|d| format!("{uid}-{}", d.device)).collect();
    let spec = json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices.iter().zip(&names).map(|(d, name)| json!({
            "name": name,
            "containerEdits": {
                "env": [
                    format!("{}={}", crate::request::MEMORY_ENV, d.bytes),
                    format!("{}={}", crate::request::GPUS_ENV, d.uuid),
                    format!("{}={name}", super::claim_device_env(name)),
                ],
                "deviceNodes": d.device_nodes.iter().map(|p| json!({"path": p})).collect::<Vec<_>>(),
                "hooks": hook.entries(),
            },
        })).collect::<Vec<_>>(),
    });
    let write = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(write)?;
    let bytes = serde_json::to_vec_pretty(&spec).expect("JSON serializes");
    crate::atomic_file::replace(&path, &bytes, 0o644, None).map_err(write)?;
    Ok(names.iter().map(|n| format!("{KIND}={n}")).collect())
}

/// One device of a prepared claim, as its spec file says: what the claim may hold, where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub uuid: String,
    pub bytes: u64,
}

/// Every device of every claim prepared on this node, by CDI device name (`<uid>-<device>`),
/// read back from this driver's spec files in `dir`: they are the driver's record of what it
/// prepared, so the record survives a restart and needs no second file. Files of other kinds
/// and files that do not parse are passed over (the runtime reads the directory too; a
/// half-written file of ours cannot be seen, they are renamed into place).
pub fn prepared(dir: &Path) -> std::collections::HashMap<String, PreparedDevice> {
    let mut found = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(SPEC_PREFIX) && name.ends_with(".json")) {
            continue;
        }
        // Our files are a few hundred bytes; anything large is not ours.
        let Ok(Some(bytes)) = crate::spec::read_limited(&entry.path(), 1 << 20) else {
            continue;
        };
        let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if spec["kind"] != KIND {
            continue;
        }
        for device in spec["devices"].as_array().into_iter().flatten() {
            let Some(device_name) = device["name"].as_str() else {
                continue;
            };
            let env = device["containerEdits"]["env"].as_array().into_iter().flatten();
            let value = |key: &str| {
                env.clone()
                    .filter_map(|e| e.as_str()?.strip_prefix(key)?.strip_prefix('='))
                    .next()
                    .map(str::to_string)
            };
            let (Some(uuid), Some(bytes)) = (
                value(crate::request::GPUS_ENV),
                value(crate::request::MEMORY_ENV).and_then(|b| b.parse().ok()),
            ) else {
                continue;
            };
            found.insert(device_name.to_string(), PreparedDevice { uuid, bytes });
        }
    }
    found
}

/// NVIDIA's CDI kind, as `nvidia-ctk cdi generate` (the NVIDIA Container Toolkit) writes it.
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
/// Where the toolkit's spec is looked for besides the driver's own CDI directory.
pub const STATIC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// NVIDIA's CDI device for `gpu` in the specs of `dirs`, when the node has one
/// (`nvidia.com/gpu=<name>`): the toolkit names each device by UUID and/or by index (`0`, or
/// `0:1` for a MIG device), and its edits bring the driver's libraries and device nodes,
/// which a container needs to use the GPU. The UUID is preferred; the first spec that has the
/// GPU wins. Specs that do not parse are passed over (they are the runtime's to refuse).
#[cfg(feature = "dra")]
pub fn nvidia_device(dirs: &[PathBuf], gpu: &crate::inventory::GpuMemory) -> Option<String> {
    let index_name = match gpu.mig_index {
        Some(mig) => format!("{}:{mig}", gpu.index),
        None => gpu.index.to_string(),
    };
    let mut by_index = None;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let yaml = file.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if !(yaml || file.extension().is_some_and(|e| e == "json")) {
                continue;
            }
            // The toolkit's spec lists each GPU's files: tens of KiB.
            let Ok(Some(bytes)) = crate::spec::read_limited(&file, 4 << 20) else {
                continue;
            };
            let Ok(text) = String::from_utf8(bytes) else { continue };
            // JSON is YAML: one parser for both forms.
            let Ok(spec) = serde_saphyr::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            if spec["kind"] != NVIDIA_KIND {
                continue;
            }
            for name in spec["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["name"].as_str())
            {
                if name == gpu.uuid {
                    return Some(format!("{NVIDIA_KIND}={name}"));
                }
                if name == index_name && by_index.is_none() {
                    by_index = Some(format!("{NVIDIA_KIND}={name}"));
                }
            }
        }
    }
    by_index
}

/// Removes the spec of claim `uid`; a claim never prepared (or unprepared twice) is fine.
pub fn remove_spec(dir: &Path, uid: &str) -> Result<(), CdiError> {
    let path = spec_path(dir, uid)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdiError::Remove { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "dra")]
    #[test]
    fn nvidias_device_is_found_by_uuid_else_by_index_in_yaml_or_json() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::inventory::GpuMemory::for_test(1, None, "GPU-one");
        let dirs = [dir.path().to_path_buf()];
        assert_eq!(nvidia_device(&dirs, &gpu), None, "no spec");
        std::fs::write(
            dir.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: \"1\"\n  containerEdits: {}\n",
        )
        .unwrap();
        assert_eq!(nvidia_device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=1"));
        std::fs::write(
            dir.path().join("other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"GPU-one","containerEdits":{}}]}"#,
        )
        .unwrap();
        assert_eq!(nvidia_device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=GPU-one"));
        let mig = crate::inventory::GpuMemory::for_test(0, Some(2), "MIG-x");
        assert_eq!(nvidia_device(&dirs, &mig), None);
    }

    #[test]
    fn a_claims_spec_is_written_rewritten_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let device = ClaimDevice {
            device: "gpu-1".into(),
            bytes: 6 << 30,
            uuid: "GPU-one".into(),
            device_nodes: vec![PathBuf::from("/dev/nvidia1")],
        };
        let uid = "0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10";
        let hook = HookSpec {
            path: PathBuf::from("/usr/bin/vramgate-hook"),
            config: PathBuf::from("/etc/vramgate/config.toml"),
            timeout_secs: 3660,
        };
        let ids = write_spec(dir.path(), uid, std::slice::from_ref(&device), &hook).unwrap();
        assert_eq!(ids, [format!("vramgate.dev/gpu-memory={uid}-gpu-1")]);
        assert_eq!(
            write_spec(dir.path(), uid, &[device], &hook).unwrap(),
            ids,
            "prepare twice"
        );
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(spec_path(dir.path(), uid).unwrap()).unwrap()).unwrap();
        assert_eq!(
            spec["devices"][0]["containerEdits"]["env"],
            json!([
                "VRAMGATE_MEMORY=6442450944",
                "VRAMGATE_GPUS=GPU-one",
                format!("VRAMGATE_DRA_DEVICE_{}_gpu_1={uid}-gpu-1", uid.replace('-', "_"))
            ])
        );
        assert_eq!(
            prepared(dir.path()),
            std::collections::HashMap::from([(
                format!("{uid}-gpu-1"),
                PreparedDevice {
                    uuid: "GPU-one".into(),
                    bytes: 6 << 30
                }
            )])
        );
        assert_eq!(
            spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia1"
        );
        let hooks = &spec["devices"][0]["containerEdits"]["hooks"];
        assert_eq!(hooks[0]["hookName"], "createRuntime");
        assert_eq!(hooks[0]["path"], "/usr/bin/vramgate-hook");
        assert_eq!(hooks[0]["env"], json!(["VRAMGATE_CONFIG=/etc/vramgate/config.toml"]));
        assert_eq!(hooks[1]["hookName"], "poststop");
        remove_spec(dir.path(), uid).unwrap();
        remove_spec(dir.path(), uid).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(matches!(
            write_spec(dir.path(), "../../etc/x", &[], &hook),
            Err(CdiError::BadUid(_))
        ));
    }
}
