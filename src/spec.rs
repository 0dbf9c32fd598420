//! Reading what the runtime hands a hook: the OCI state on stdin and the bundle's `config.json`.
//!
//! We deserialize only the fields vramgate reads, into structs that ignore the rest, instead of
//! the full `oci-spec` types: a spec written by a newer engine (or with a field our version of a
//! crate rejects) must never stop a container start, and skipping the rest is several times
//! faster than building the whole typed tree on every start.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Inputs larger than this are refused before parsing; real states are a few hundred bytes and
/// real specs tens of kilobytes.
pub const MAX_STATE_BYTES: u64 = 1 << 20;
pub const MAX_SPEC_BYTES: u64 = 16 << 20;
/// Container ids longer than this are refused (Docker and CRI-O use 64 hex characters).
pub const MAX_CONTAINER_ID_LEN: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read the OCI state from stdin: {0}")]
    ReadState(std::io::Error),
    #[error("the OCI state on stdin is larger than {MAX_STATE_BYTES} bytes")]
    StateTooLarge,
    #[error("the OCI state on stdin is not valid JSON of the OCI state schema: {0}")]
    ParseState(serde_json::Error),
    #[error("the OCI state has a bad container id {id:?}: {reason}")]
    BadId { id: String, reason: &'static str },
    #[error("the OCI state has bundle {bundle:?}, which is not an absolute path")]
    RelativeBundle { bundle: PathBuf },
    #[error("cannot read the container spec {path}: {source}")]
    ReadSpec { path: PathBuf, source: std::io::Error },
    #[error("the container spec {path} is larger than {MAX_SPEC_BYTES} bytes")]
    SpecTooLarge { path: PathBuf },
    #[error("the container spec {path} is not a valid OCI spec: {source}")]
    ParseSpec { path: PathBuf, source: serde_json::Error },
}

/// The OCI runtime state, as a hook receives it.
#[derive(Debug, Clone, Deserialize)]
pub struct ContainerState {
    pub id: String,
    #[serde(default)]
    pub status: String,
    /// The container's init process, in the runtime's pid namespace. Absent or 0 at poststop.
    #[serde(default)]
    pub pid: Option<i64>,
    pub bundle: PathBuf,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl ContainerState {
    pub fn parse(bytes: &[u8]) -> Result<ContainerState, SpecError> {
        let state: ContainerState = serde_json::from_slice(bytes).map_err(SpecError::ParseState)?;
        validate_container_id(&state.id)?;
        if !state.bundle.is_absolute() {
            return Err(SpecError::RelativeBundle { bundle: state.bundle });
        }
        Ok(state)
    }

    pub fn read_from(reader: impl Read) -> Result<ContainerState, SpecError> {
        // A state is a few hundred bytes: one read call instead of one per doubling from 32.
        let mut bytes = Vec::with_capacity(4096);
        reader
            .take(MAX_STATE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(SpecError::ReadState)?;
        if bytes.len() as u64 > MAX_STATE_BYTES {
            return Err(SpecError::StateTooLarge);
        }
        ContainerState::parse(&bytes)
    }

    /// The init pid when the runtime gave a real one.
    pub fn init_pid(&self) -> Option<u32> {
        self.pid
            .filter(|&p| p > 0 && p <= i64::from(i32::MAX))
            .map(|p| p as u32)
    }
}

/// Container ids are shown to people and written into JSON, never used as file names; still,
/// control characters (a forged log line) and unbounded lengths have no business in one.
pub fn validate_container_id(id: &str) -> Result<(), SpecError> {
    let bad = |reason| {
        Err(SpecError::BadId {
            id: id.chars().take(80).collect(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > MAX_CONTAINER_ID_LEN {
        return bad("it is longer than 256 bytes");
    }
    if id.chars().any(|c| c.is_control()) {
        return bad("it contains control characters");
    }
    Ok(())
}

/// The parts of `config.json` that vramgate reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SpecView {
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub process: Option<ProcessView>,
    #[serde(default)]
    pub linux: Option<LinuxView>,
    /// What NVIDIA's device plugin mounts under its `volume-mounts` strategy is read from here
    /// ([`crate::request::GpuSelector`]).
    #[serde(default)]
    pub mounts: Vec<MountView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProcessView {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub capabilities: Option<CapabilitiesView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CapabilitiesView {
    #[serde(default)]
    pub bounding: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MountView {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LinuxView {
    #[serde(default)]
    pub devices: Vec<DeviceView>,
    /// Kept as JSON: only its `devices` rules are read ([`SpecView::device_rules`]), and a
    /// field of an unexpected type elsewhere in it is the engine's business, not the hook's.
    #[serde(default)]
    pub resources: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceView {
    #[serde(default)]
    pub path: String,
}

impl SpecView {
    pub fn parse(bytes: &[u8], path: &Path) -> Result<SpecView, SpecError> {
        serde_json::from_slice(bytes).map_err(|source| SpecError::ParseSpec {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads `<bundle>/config.json`.
    pub fn read_bundle(bundle: &Path) -> Result<SpecView, SpecError> {
        let path = bundle.join("config.json");
        let bytes = read_limited(&path, MAX_SPEC_BYTES)
            .map_err(|source| SpecError::ReadSpec {
                path: path.clone(),
                source,
            })?
            .ok_or_else(|| SpecError::SpecTooLarge { path: path.clone() })?;
        SpecView::parse(&bytes, &path)
    }

    /// The device-cgroup rules (`linux.resources.devices`) as written; empty when there are
    /// none or they are not a list.
    pub fn device_rules(&self) -> &[serde_json::Value] {
        self.linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .and_then(|r| r.get("devices"))
            .and_then(serde_json::Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// `process.env` as written (empty without a process).
    pub fn env_entries(&self) -> &[String] {
        self.process.as_ref().map_or(&[], |p| &p.env)
    }

    /// The value of `name` in `process.env`; the last one wins, as it does for the process.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.process.as_ref()?.env.iter().rev().find_map(|entry| {
            let (key, value) = entry.split_once('=')?;
            (key == name).then_some(value)
        })
    }

    /// Whether the container is privileged as NVIDIA's toolkit tells it (`image.IsPrivileged`):
    /// CAP_SYS_ADMIN in its bounding set.
    pub fn is_privileged(&self) -> bool {
        self.process
            .as_ref()
            .and_then(|p| p.capabilities.as_ref())
            .is_some_and(|c| c.bounding.iter().any(|cap| cap == "CAP_SYS_ADMIN"))
    }

    pub fn device_paths(&self) -> impl Iterator<Item = &str> {
        self.linux
            .iter()
            .flat_map(|l| l.devices.iter().map(|d| d.path.as_str()))
    }
}

/// `path` with `.` and `..` resolved by name, as Go's `filepath.Clean` (what containerd and
/// NVIDIA's toolkit apply to the paths they read) does; a `..` above `/` stays at `/`.
pub fn clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            // Above `/` stays at `/` (popping the root does nothing).
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Reads a whole file of at most `limit` bytes; `Ok(None)` when it is larger.
pub fn read_limited(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    read_open_limited(std::fs::File::open(path)?, limit)
}

/// [`read_limited`] of a file already open (one opened with other flags, say).
pub fn read_open_limited(file: std::fs::File, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    // Sized from the file's length: read_to_end on a `Take` would otherwise grow from 32
    // bytes, a read call per doubling (seven for a typical config.json).
    let hint = file.metadata().map_or(0, |m| m.len()).min(limit) as usize;
    let mut bytes = Vec::with_capacity(hint + 1);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// The object at `key` in a spec's JSON map, created when missing or null (both mean "none
/// yet" in an OCI spec); `None` when it is something else.
pub fn object_at<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a mut serde_json::Map<String, serde_json::Value>> {
    slot(map, key, || serde_json::Value::Object(serde_json::Map::new())).as_object_mut()
}

/// The array at `key` in a spec's JSON map, created when missing or null; `None` when it is
/// something else.
pub fn array_at<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a mut Vec<serde_json::Value>> {
    slot(map, key, || serde_json::Value::Array(Vec::new())).as_array_mut()
}

fn slot<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    key: &str,
    empty: fn() -> serde_json::Value,
) -> &'a mut serde_json::Value {
    let slot = map.entry(key).or_insert(serde_json::Value::Null);
    if slot.is_null() {
        *slot = empty();
    }
    slot
}

/// JSON's name for a value's type, for errors about a spec's shape.
pub fn json_type(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_runc_state() {
        let s = ContainerState::parse(
            br#"{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":4242,"bundle":"/run/b","annotations":{"k":"v"}}"#,
        )
        .unwrap();
        assert_eq!(s.id, "abc");
        assert_eq!(s.init_pid(), Some(4242));
        assert_eq!(s.annotations["k"], "v");
    }

    #[test]
    fn poststop_state_without_pid() {
        let s =
            ContainerState::parse(br#"{"ociVersion":"1.0.2","id":"abc","status":"stopped","bundle":"/b"}"#).unwrap();
        assert_eq!(s.init_pid(), None);
        let s = ContainerState::parse(br#"{"id":"abc","pid":0,"bundle":"/b"}"#).unwrap();
        assert_eq!(s.init_pid(), None);
    }

    #[test]
    fn refuses_bad_states() {
        for bad in [
            &br#"{"id":"","bundle":"/b"}"#[..],
            br#"{"id":"a\nforged","bundle":"/b"}"#,
            br#"{"id":"a","bundle":"relative"}"#,
            br#"{"bundle":"/b"}"#,
            br#"{"id":"a","bundle":"/b","pid":"12"}"#,
            br#"not json"#,
            br#""#,
        ] {
            let err = ContainerState::parse(bad).expect_err(&String::from_utf8_lossy(bad));
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        let long = format!(r#"{{"id":"{}","bundle":"/b"}}"#, "x".repeat(300));
        assert!(ContainerState::parse(long.as_bytes()).is_err());
    }

    #[test]
    fn spec_env_last_wins_and_unknown_fields_are_kept_out() {
        let spec = SpecView::parse(
            br#"{"ociVersion":"1.2.0","someFutureField":{"x":1},"process":{"env":["A=1","VRAMGATE_MEMORY=1Gi","VRAMGATE_MEMORY=2Gi","NOEQUALS"]},
                "linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}]}}"#,
            Path::new("/b/config.json"),
        )
        .unwrap();
        assert_eq!(spec.env("VRAMGATE_MEMORY"), Some("2Gi"));
        assert_eq!(spec.env("NOEQUALS"), None);
        assert_eq!(spec.device_paths().collect::<Vec<_>>(), ["/dev/nvidia0"]);
    }
}
