//! The CDI spec of a prepared claim: one CDI device per allocation result, whose edits give
//! the container the request vramgate reads (`VRAMGATE_MEMORY`, `VRAMGATE_GPUS`) and the GPU's
//! device nodes. Written atomically into the runtime's CDI directory (the runtime may read it
//! at any moment), one file per claim, removed at unprepare; both idempotent.

use std::path::{Path, PathBuf};

use serde_json::json;

pub use crate::request::prepared_claims::KIND;
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
    #[error("cannot draw a claim marker's secret from {path}: {source}")]
    Secret { path: PathBuf, source: std::io::Error },
}

/// Where a claim marker's secret comes from.
const RANDOM_SOURCE: &str = "/dev/urandom";

/// The value of a prepared claim device's marker variable: its CDI device name, and a secret
/// drawn at its first prepare (`<uid>-gpu-0:<32 hex digits>`). The name alone is derivable by
/// anyone who can read the claim, and a container that set it would have its own reservation
/// counted as the claim's (and the published capacity over-state what the node can give); the
/// secret is only in the claim's spec file (mode 0600, the runtime's to read) and in the
/// environment of the claim's own containers, so a marker that carries it was put there by
/// the runtime from that spec.
fn marker_value(name: &str, secret: &str) -> String {
    format!("{name}:{secret}")
}

/// 128 random bits, as hex.
fn new_secret() -> Result<String, CdiError> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open(RANDOM_SOURCE)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| CdiError::Secret {
            path: PathBuf::from(RANDOM_SOURCE),
            source,
        })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
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
    /// The limit the claim's configuration asks ([`super::resource_claim::Share::limit`]).
    pub limit: Option<u64>,
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

use crate::request::prepared_claims::SPEC_PREFIX;

/// The spec file of claim `uid` in `dir`.
pub fn spec_path(dir: &Path, uid: &str) -> Result<PathBuf, CdiError> {
    Ok(dir.join(format!("{SPEC_PREFIX}{}.json", checked(uid)?)))
}

/// Writes (or rewrites: a second prepare is the same) the spec of claim `uid`; returns the CDI
/// ids kubelet hands to the runtime, one per device, in order.
/// A device's marker keeps the secret its first prepare drew (containers already started from
/// the spec carry it), so a second prepare writes the same file.
pub fn write_spec(dir: &Path, uid: &str, devices: &[ClaimDevice], hook: &HookSpec) -> Result<Vec<String>, CdiError> {
    let path = spec_path(dir, uid)?;
    let names: Vec<String> = devices.iter().map(|d| format!("{uid}-{}", d.device)).collect();
    let before = read_spec(&path).map(|spec| prepared_in(&spec)).unwrap_or_default();
    let mut markers = Vec::with_capacity(names.len());
    for name in &names {
        markers.push(match before.get(name) {
            Some(device) => device.marker.clone(),
            None => marker_value(name, &new_secret()?),
        });
    }
    let spec = json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices.iter().zip(&names).zip(&markers).map(|((d, name), marker)| {
            let mut env = vec![
                format!("{}={}", crate::request::MEMORY_ENV, d.bytes),
                format!("{}={}", crate::request::GPUS_ENV, d.uuid),
                format!("{}={marker}", super::claim_device_env(name)),
                // The device's own share under its own name: a container given several
                // devices keeps each (the two above keep only the last device's).
                format!(
                    "{}={},{},{}",
                    super::claim_share_env(name),
                    d.uuid,
                    d.bytes,
                    d.limit.unwrap_or(d.bytes).max(d.bytes)
                ),
            ];
            // Always, the request where the claim asked no limit: the claim's value comes after
            // the container's own env and so wins, and a container cannot give itself a limit
            // the scheduler never counted.
            env.push(format!(
                "{}={}",
                crate::request::MEMORY_LIMIT_ENV,
                d.limit.unwrap_or(d.bytes)
            ));
            json!({
            "name": name,
            "containerEdits": {
                "env": env,
                "deviceNodes": d.device_nodes.iter().map(|p| json!({"path": p})).collect::<Vec<_>>(),
                "hooks": hook.entries(),
            },
        })}).collect::<Vec<_>>(),
    });
    let write = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(write)?;
    let bytes = serde_json::to_vec_pretty(&spec).expect("JSON serializes");
    // Root's alone: the markers' secrets are in it (the runtime reads it as root).
    crate::atomic_file::replace(&path, &bytes, 0o600, None).map_err(write)?;
    Ok(names.iter().map(|n| format!("{KIND}={n}")).collect())
}

pub use crate::request::prepared_claims::{prepared, PreparedDevice};
use crate::request::prepared_claims::{prepared_in, read_claim_spec as read_spec};

/// NVIDIA's CDI kind, as `nvidia-ctk cdi generate` (the NVIDIA Container Toolkit) writes it.
pub const NVIDIA_KIND: &str = "nvidia.com/gpu";
use crate::cdi_files::read_regular;
#[cfg(feature = "dra")]
use crate::cdi_files::{parse_spec, regular_stamp, Stamp, NVIDIA_SPEC_LIMIT};
pub use crate::cdi_files::{read_node_spec, spec_files};
pub use crate::config::CDI_STATIC_DIRS as STATIC_DIRS;

/// NVIDIA's device names in the spec files of the node, as last read: each file is read and
/// parsed again only when its [`Stamp`] changed, so a prepare costs a `stat` per file, not a
/// parse of every spec on the node (the toolkit's spec is tens of KiB of YAML).
#[cfg(feature = "dra")]
#[derive(Debug, Default)]
pub struct NvidiaSpecs {
    /// Every spec file of the last scan: its stamp, and NVIDIA's device names in it (none
    /// for a file of another kind, or one that does not parse).
    files: std::collections::HashMap<PathBuf, (Stamp, Vec<String>)>,
    /// How many files were parsed since this was made: what the cache saves, for its tests.
    parsed: u64,
}

#[cfg(feature = "dra")]
impl NvidiaSpecs {
    /// NVIDIA's CDI device for `gpu` in the specs of `dirs`, when the node has one
    /// (`nvidia.com/gpu=<name>`): the toolkit names each device by UUID and/or by index (`0`,
    /// or `0:1` for a MIG device), and its edits bring the driver's libraries and device
    /// nodes, which a container needs to use the GPU. The UUID is preferred; the first spec
    /// that has the GPU wins. Specs that do not parse, and files that are not regular files
    /// or larger than [`NVIDIA_SPEC_LIMIT`], are passed over (they are the runtime's to refuse).
    /// Blocking file system calls: run it off the async runtime.
    pub fn device(&mut self, dirs: &[PathBuf], gpu: &crate::inventory::GpuMemory) -> Option<String> {
        let index_name = match gpu.mig_index {
            Some(mig) => format!("{}:{mig}", gpu.index),
            None => gpu.index.to_string(),
        };
        let mut by_index = None;
        let mut by_uuid = None;
        let mut scanned = std::collections::HashMap::new();
        for file in spec_files(dirs) {
            let Some(names) = self.names(&file) else { continue };
            if by_uuid.is_none() {
                for name in &names {
                    if *name == gpu.uuid {
                        by_uuid = Some(format!("{NVIDIA_KIND}={name}"));
                        break;
                    }
                    if *name == index_name && by_index.is_none() {
                        by_index = Some(format!("{NVIDIA_KIND}={name}"));
                    }
                }
            }
            scanned.insert(file.clone(), self.files[&file].clone());
        }
        // Files gone since are forgotten; the whole scan is kept, so the next prepare (of
        // another GPU) finds every file already parsed.
        self.files = scanned;
        by_uuid.or(by_index)
    }

    /// NVIDIA's device names in the spec file at `path`, parsed again only when it changed;
    /// `None` when it is not a regular file.
    fn names(&mut self, path: &Path) -> Option<Vec<String>> {
        let stamp = regular_stamp(path)?;
        if let Some((known, names)) = self.files.get(path) {
            if *known == stamp {
                return Some(names.clone());
            }
        }
        let (stamp, names) = match read_regular(path, NVIDIA_SPEC_LIMIT) {
            Some((read, bytes)) => {
                self.parsed += 1;
                (read, nvidia_names(&bytes))
            }
            // Too large, or swapped for something else since the look: nothing of NVIDIA's,
            // and not opened again until it changes.
            None => (stamp, Vec::new()),
        };
        self.files.insert(path.to_path_buf(), (stamp, names.clone()));
        Some(names)
    }
}

/// NVIDIA's device names in one spec file's bytes; none when it is of another kind or does
/// not parse.
#[cfg(feature = "dra")]
fn nvidia_names(bytes: &[u8]) -> Vec<String> {
    let Some(spec) = parse_spec(bytes) else {
        return Vec::new();
    };
    if spec["kind"] != NVIDIA_KIND {
        return Vec::new();
    }
    spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
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
        let mut specs = NvidiaSpecs::default();
        assert_eq!(specs.device(&dirs, &gpu), None, "no spec");
        std::fs::write(
            dir.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits: {}\n- name: \"1\"\n  containerEdits: {}\n",
        )
        .unwrap();
        assert_eq!(specs.device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=1"));
        std::fs::write(
            dir.path().join("other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"GPU-one","containerEdits":{}}]}"#,
        )
        .unwrap();
        assert_eq!(specs.device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=GPU-one"));
        let mig = crate::inventory::GpuMemory::for_test(0, Some(2), "MIG-x");
        assert_eq!(specs.device(&dirs, &mig), None);
    }

    /// A spec is parsed once while it stays the same, again once it changes (a new mtime,
    /// even at the same size), and forgotten once removed.
    #[cfg(feature = "dra")]
    #[test]
    fn a_spec_is_parsed_again_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::inventory::GpuMemory::for_test(0, None, "GPU-zero");
        let dirs = [dir.path().to_path_buf()];
        let spec = dir.path().join("nvidia.json");
        let named = |name: &str| {
            format!(
                r#"{{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{{"name":"{name}","containerEdits":{{}}}}]}}"#
            )
        };
        std::fs::write(&spec, named("GPU-zero")).unwrap();
        std::fs::write(dir.path().join("other.yaml"), "kind: example.com/other\n").unwrap();
        let mut specs = NvidiaSpecs::default();
        assert_eq!(specs.device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=GPU-zero"));
        assert_eq!(specs.parsed, 2, "each file once");
        for _ in 0..3 {
            assert_eq!(specs.device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=GPU-zero"));
        }
        assert_eq!(specs.parsed, 2, "unchanged files are not parsed again");

        // Rewritten in place, same size, another mtime: the new names are seen.
        let file = std::fs::OpenOptions::new().write(true).open(&spec).unwrap();
        std::io::Write::write_all(&mut &file, named("GPU-nope").as_bytes()).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        file.set_modified(old).unwrap();
        drop(file);
        assert_eq!(specs.device(&dirs, &gpu), None, "GPU-zero is gone from the spec");
        assert_eq!(specs.parsed, 3, "only the changed file is parsed again");

        // Removed: forgotten.
        std::fs::remove_file(&spec).unwrap();
        assert_eq!(specs.device(&dirs, &gpu), None);
        assert_eq!(specs.files.len(), 1, "{:?}", specs.files.keys());
    }

    /// What is not a regular file is never opened for reading: a FIFO would wait for a
    /// writer forever, a device may never end, a link to either is the same; a file over the
    /// bound is not read either.
    #[cfg(feature = "dra")]
    #[test]
    fn a_fifo_or_a_device_among_the_specs_is_passed_over_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = crate::inventory::GpuMemory::for_test(0, None, "GPU-zero");
        let dirs = [dir.path().to_path_buf()];
        nix::unistd::mkfifo(
            &dir.path().join("a-fifo.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("b-zero.yaml")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a-fifo.json"), dir.path().join("c-link.json")).unwrap();
        std::fs::write(
            dir.path().join("d-nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-zero\n  containerEdits: {}\n",
        )
        .unwrap();
        // Over the bound (sparse, so the test writes nothing): never read.
        let huge = std::fs::File::create(dir.path().join("e-huge.json")).unwrap();
        huge.set_len(NVIDIA_SPEC_LIMIT + 1).unwrap();
        let mut specs = NvidiaSpecs::default();
        assert_eq!(specs.device(&dirs, &gpu).as_deref(), Some("nvidia.com/gpu=GPU-zero"));
        assert_eq!(specs.parsed, 1);
        assert_eq!(read_spec(&dir.path().join("a-fifo.json")), None);
        assert_eq!(read_regular(&dir.path().join("e-huge.json"), NVIDIA_SPEC_LIMIT), None);
    }

    /// A claim whose configuration asks a limit: its device's edits carry it beside the
    /// request, in bytes; one without carries the request as its limit.
    #[test]
    fn a_limit_the_claim_asked_is_in_its_devices_env() {
        let dir = tempfile::tempdir().unwrap();
        let hook = HookSpec {
            path: PathBuf::from("/usr/bin/vramgate-hook"),
            config: PathBuf::from("/etc/vramgate/config.toml"),
            timeout_secs: 3660,
        };
        let device = |limit| ClaimDevice {
            device: "gpu-0".into(),
            bytes: 6 << 30,
            limit,
            uuid: "GPU-zero".into(),
            device_nodes: Vec::new(),
        };
        let env = |uid: &str, limit| {
            write_spec(dir.path(), uid, &[device(limit)], &hook).unwrap();
            let spec: serde_json::Value =
                serde_json::from_slice(&std::fs::read(spec_path(dir.path(), uid).unwrap()).unwrap()).unwrap();
            spec["devices"][0]["containerEdits"]["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let limited = env("0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10", Some(8 << 30));
        assert_eq!(limited[0], "VRAMGATE_MEMORY=6442450944");
        assert_eq!(limited[4], "VRAMGATE_MEMORY_LIMIT=8589934592");
        assert_eq!(
            limited[3],
            "VRAMGATE_DRA_SHARE_0b6e2f5a_3c44_4a8e_9f1d_2a7c5e8b9d10_gpu_0=GPU-zero,6442450944,8589934592"
        );
        // Without one the limit is the request, written all the same: the container's own
        // VRAMGATE_MEMORY_LIMIT comes before it in the spec and so loses.
        let plain = env("1c6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10", None);
        assert_eq!(plain[4], "VRAMGATE_MEMORY_LIMIT=6442450944");
    }

    #[test]
    fn a_claims_spec_is_written_rewritten_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let device = ClaimDevice {
            device: "gpu-1".into(),
            bytes: 6 << 30,
            limit: None,
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
        let path = spec_path(dir.path(), uid).unwrap();
        let first = std::fs::read(&path).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions()) & 0o777,
            0o600,
            "the markers' secrets are root's alone"
        );
        assert_eq!(
            write_spec(dir.path(), uid, std::slice::from_ref(&device), &hook).unwrap(),
            ids,
            "prepare twice"
        );
        assert_eq!(std::fs::read(&path).unwrap(), first, "the same file, the same secret");
        let spec: serde_json::Value = serde_json::from_slice(&first).unwrap();
        let env = spec["devices"][0]["containerEdits"]["env"].as_array().unwrap();
        assert_eq!(
            env[..2],
            [json!("VRAMGATE_MEMORY=6442450944"), json!("VRAMGATE_GPUS=GPU-one")]
        );
        let marker_env = format!("VRAMGATE_DRA_DEVICE_{}_gpu_1=", uid.replace('-', "_"));
        let marker = env[2].as_str().unwrap().strip_prefix(&marker_env).unwrap();
        let secret = marker.strip_prefix(&format!("{uid}-gpu-1:")).unwrap();
        assert!(
            secret.len() == 32 && secret.bytes().all(|b| b.is_ascii_hexdigit()),
            "{marker}"
        );
        assert_eq!(
            prepared(dir.path()),
            std::collections::HashMap::from([(
                format!("{uid}-gpu-1"),
                PreparedDevice {
                    uuid: "GPU-one".into(),
                    bytes: 6 << 30,
                    marker: marker.to_string(),
                    share: Some(format!("GPU-one,{},{}", 6u64 << 30, 6u64 << 30)),
                }
            )])
        );
        // Another claim's device draws its own secret.
        let other = "1c6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10";
        write_spec(dir.path(), other, std::slice::from_ref(&device), &hook).unwrap();
        assert_ne!(
            prepared(dir.path())[&format!("{other}-gpu-1")]
                .marker
                .split_once(':')
                .unwrap()
                .1,
            secret
        );
        remove_spec(dir.path(), other).unwrap();
        // A spec written before markers had a secret vouches for no container.
        let old = spec.to_string().replace(&format!(":{secret}"), "");
        std::fs::write(&path, old).unwrap();
        assert!(prepared(dir.path()).is_empty());
        write_spec(dir.path(), uid, std::slice::from_ref(&device), &hook).unwrap();
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
