//! The driver limit's lifecycle: set when the container starts, cleared on every path that
//! ends it.
//!
//! A limit the driver holds for a cgroup path is not the container's: it is the path's. Left
//! there, it outlives the container (a container made again with the same id and cgroup path
//! starts under it), and a soft limit, which the driver adds into every ancestor's
//! `dmem.min`, is not taken back by deleting the leaf (NVIDIA's MPS memory-partitioning
//! guide). vramgate sets soft = 0 today; clearing both, with nvml.h's clearing values (soft 0,
//! hard `NVML_DEVICE_MEMORY_LIMIT_MAX`), keeps that true whatever a later version sets.
//!
//! - **Set** ([`set_and_record`]): the hook at createRuntime. First a record of what it is
//!   about to set (the cgroup directory and the GPUs) is written to the state directory, then
//!   the limit is set on each GPU; a failure on one GPU clears the earlier ones
//!   ([`super::driver_limit::apply_driver_limit_to`]) and removes the record.
//! - **Cleared at delete** ([`end_driver_limit`], [`EndedBy::Delete`]): `vramgate-runtime`
//!   before it execs `runc delete`, while the cgroup still exists (runc removes it, and runs
//!   the poststop hooks only after that). A clear that fails keeps the record, so the poststop
//!   hook tries again.
//! - **Cleared at poststop** ([`EndedBy::Poststop`]): the hook, on every path (the hook alone,
//!   under podman's and CRI-O's hooks.d, has no other). The cgroup is gone by then; the call
//!   is made anyway (a driver that keeps limits by path may still take it), and a driver that
//!   cannot open the path has nothing left to clear: nvml.h says removing the cgroup clears
//!   its limits. The record goes whatever the outcome: no later step could do better.
//!
//! Why a record, and not the ledger's reservation: the reservation goes when the container's
//! init is gone (any transaction reclaims it), which is before `delete`; and why not the
//! runtime's own state (`<root>/<id>/state.json`): that is runc's private format, not crun's
//! or youki's. The record is keyed by the runtime's `--root` and the container id, which is
//! what names one container to runc (containerd gives each namespace a root), and what the
//! wrapper's `delete` has on its command line; the hook reads it from the command line of the
//! runtime that runs it (its parent). A container without a record costs the wrapper's
//! `delete` one failed `openat`, and the poststop hook that and a read of its parent's
//! command line; neither loads NVML.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::driver_limit::{self, AppliedLimit, Cleared};
use super::{EnforceError, PlacedShare};
use crate::events::{self, Event, Kind};
use crate::ledger::{Access, LedgerError, StateDir};

/// The record's file name starts so, in the state directory.
pub const RECORD_PREFIX: &str = "driver-limit-";
/// Records are a few hundred bytes; anything larger is not one.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// What a container's driver limit is set on, kept until it is cleared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRecord {
    pub container_id: String,
    /// The runtime's `--root` as it was given; absent where the runtime's default applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_root: Option<PathBuf>,
    /// The container's bundle, which the poststop hook checks (the wrapper's `delete` has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<PathBuf>,
    /// The cgroup v2 directory the limit is set on (NVML's `nameSpace`).
    pub cgroup: PathBuf,
    /// The GPUs it is set on, by UUID.
    pub gpus: Vec<String>,
}

/// The record's file name for a container: a hash of the runtime root and the id, so any id
/// (any length, any bytes) makes a valid name.
pub fn record_name(runtime_root: Option<&Path>, container: &str) -> String {
    let root = runtime_root.map(|r| r.to_string_lossy()).unwrap_or_default();
    let hash = crate::ledger::marks::mark_name(&format!("{root}\0{container}"));
    format!("{RECORD_PREFIX}{}.json", hash.trim_start_matches("c-"))
}

/// Who clears a container's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    /// `vramgate-runtime`, before the runtime's `delete` removes the cgroup.
    Delete,
    /// The hook's poststop, after the runtime removed the cgroup: the last chance.
    Poststop,
}

impl EndedBy {
    fn as_str(self) -> &'static str {
        match self {
            EndedBy::Delete => "delete",
            EndedBy::Poststop => "poststop",
        }
    }
}

/// Records `record` in `dir`, then sets the limit on its cgroup for each whole GPU of
/// `shares`. The record is written first: a hook killed between the two leaves a record of a
/// limit perhaps never set, which a clear answers with "no limit held"; the other order could
/// leave a limit nobody knows of. A failure removes the record, unless the error says limits
/// are left set ([`EnforceError::LeftSet`]): then delete clears them.
pub fn set_and_record(
    dir: &StateDir,
    nvml_library: &Path,
    record: &LimitRecord,
    shares: &[PlacedShare],
) -> Result<Vec<AppliedLimit>, EnforceError> {
    if driver_limit::whole_gpus(shares).is_empty() {
        return Ok(Vec::new());
    }
    let name = record_name(record.runtime_root.as_deref(), &record.container_id);
    let bytes = serde_json::to_vec(record).map_err(|e| EnforceError::RecordCorrupt {
        path: dir.path().join(&name),
        reason: e.to_string(),
    })?;
    dir.write_file(&name, &bytes)?;
    let result = driver_limit::apply_driver_limit_to(nvml_library, &record.cgroup, shares);
    if let Err(e) = &result {
        if !matches!(e, EnforceError::LeftSet { .. }) {
            let _ = dir.remove_file(&name);
        }
    }
    result
}

/// The record of (`runtime_root`, `container`) in `dir`, if there is one.
pub fn recorded(
    dir: &StateDir,
    runtime_root: Option<&Path>,
    container: &str,
) -> Result<Option<LimitRecord>, EnforceError> {
    let name = record_name(runtime_root, container);
    let path = dir.path().join(&name);
    let file = match dir.open_file(&name, Access::Read) {
        Ok(file) => file,
        Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|source| LedgerError::Io {
            path: path.clone(),
            source,
        })?;
    let record: LimitRecord = serde_json::from_slice(&bytes).map_err(|e| EnforceError::RecordCorrupt {
        path,
        reason: e.to_string(),
    })?;
    // Another id of the same hash: not this container's.
    Ok((record.container_id == container).then_some(record))
}

/// Clears the driver limit recorded for (`runtime_root`, `container`), and `bundle` where the
/// caller knows it. `Ok(None)`: no record, so nothing was loaded or called. Each clear goes
/// to the event log (`enforce`). The record is removed once every GPU is cleared (or had
/// nothing to clear), and at poststop whatever the outcome (see the module docs).
pub fn end_driver_limit(
    dir: &StateDir,
    nvml_library: &Path,
    runtime_root: Option<&Path>,
    container: &str,
    bundle: Option<&Path>,
    by: EndedBy,
) -> Result<Option<Vec<(String, Cleared)>>, EnforceError> {
    let record = match recorded(dir, runtime_root, container) {
        Ok(Some(record)) => record,
        Ok(None) => return Ok(None),
        Err(e) => {
            if by == EndedBy::Poststop {
                let _ = dir.remove_file(&record_name(runtime_root, container));
            }
            return Err(e);
        }
    };
    if let (Some(mine), Some(theirs)) = (record.bundle.as_deref(), bundle) {
        if mine != theirs {
            // Another container of that id and root made since (its record replaced this
            // one's): its limit is not this stop's to clear.
            return Ok(None);
        }
    }
    let result = driver_limit::clear_driver_limit(nvml_library, &record.cgroup, &record.gpus);
    let detail = match &result {
        Ok(cleared) => format!(
            "driver_limit cleared at {} for cgroup {}: {}",
            by.as_str(),
            record.cgroup.display(),
            cleared
                .iter()
                .map(|(uuid, outcome)| format!("{uuid} {}", outcome.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => format!("driver_limit not cleared at {}: {e}", by.as_str()),
    };
    events::append(
        dir,
        &[Event::new(
            crate::ledger::now_unix_ms(),
            Kind::Enforce,
            container,
            &[],
            detail,
        )],
    );
    if result.is_ok() || by == EndedBy::Poststop {
        dir.remove_file(&record_name(runtime_root, container))?;
    }
    result.map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_named_by_root_and_id_and_found_only_by_them() {
        let a = record_name(Some(Path::new("/run/containerd/runc/k8s.io")), "c");
        let b = record_name(Some(Path::new("/run/containerd/runc/moby")), "c");
        let c = record_name(None, "c");
        assert!(a != b && b != c && a != c, "{a} {b} {c}");
        assert!(a.starts_with(RECORD_PREFIX) && a.ends_with(".json") && !a.contains('/'));
        assert_eq!(a, record_name(Some(Path::new("/run/containerd/runc/k8s.io")), "c"));

        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let record = LimitRecord {
            container_id: "c".into(),
            runtime_root: Some("/r".into()),
            bundle: Some("/b".into()),
            cgroup: "/sys/fs/cgroup/x".into(),
            gpus: vec!["GPU-a".into()],
        };
        let name = record_name(Some(Path::new("/r")), "c");
        dir.write_file(&name, &serde_json::to_vec(&record).unwrap()).unwrap();
        assert_eq!(recorded(&dir, Some(Path::new("/r")), "c").unwrap(), Some(record));
        assert_eq!(recorded(&dir, None, "c").unwrap(), None, "another root");
        assert_eq!(recorded(&dir, Some(Path::new("/r")), "d").unwrap(), None);
        // No record: nothing is loaded, whatever the library.
        let ended = end_driver_limit(
            &dir,
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Some(Path::new("/r")),
            "d",
            None,
            EndedBy::Delete,
        );
        assert!(matches!(ended, Ok(None)), "{ended:?}");
        // A record of another bundle (a namesake made since) is left to its own stop.
        let ended = end_driver_limit(
            &dir,
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Some(Path::new("/r")),
            "c",
            Some(Path::new("/other")),
            EndedBy::Poststop,
        );
        assert!(matches!(ended, Ok(None)), "{ended:?}");
        assert!(recorded(&dir, Some(Path::new("/r")), "c").unwrap().is_some());
    }

    #[test]
    fn a_failed_clear_keeps_the_record_at_delete_and_drops_it_at_poststop() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let record = LimitRecord {
            container_id: "c".into(),
            runtime_root: None,
            bundle: None,
            cgroup: "/sys/fs/cgroup/x".into(),
            gpus: vec!["GPU-a".into()],
        };
        dir.write_file(&record_name(None, "c"), &serde_json::to_vec(&record).unwrap())
            .unwrap();
        let missing = Path::new("/nonexistent/libnvidia-ml.so.1");
        let err = end_driver_limit(&dir, missing, None, "c", None, EndedBy::Delete).unwrap_err();
        assert!(matches!(err, EnforceError::LoadLibrary { .. }), "{err:?}");
        assert!(recorded(&dir, None, "c").unwrap().is_some(), "kept for poststop");
        let err = end_driver_limit(&dir, missing, None, "c", None, EndedBy::Poststop).unwrap_err();
        assert!(matches!(err, EnforceError::LoadLibrary { .. }), "{err:?}");
        assert!(
            recorded(&dir, None, "c").unwrap().is_none(),
            "gone after the last chance"
        );
        let events = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert_eq!(events.matches("driver_limit not cleared at").count(), 2, "{events}");
    }
}
