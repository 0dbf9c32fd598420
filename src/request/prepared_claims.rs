//! The DRA driver's record of what it prepared (its CDI spec files, one per claim), read where
//! a container's claim devices are checked: by the hook and the runtime wrapper before they
//! reserve ([`verified_claim_devices`]), and by the driver itself ([`crate::dra`]). Below
//! both, so neither reaches the other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::claim_env::{claim_marker_device, claim_vars, ClaimVars};
use super::{RequestError, CLAIM_DEVICE_ENV_PREFIX, CLAIM_SHARE_ENV_PREFIX, GPUS_ENV, MEMORY_ENV};
use crate::cdi_files::read_regular;
use crate::spec::SpecView;

/// The CDI kind (`vendor/class`) of the driver's devices: ids are
/// `vramgate.dev/gpu-memory=<device>`.
pub const KIND: &str = "vramgate.dev/gpu-memory";

/// What the driver's spec files are named by (CDI's transient-spec naming:
/// `<vendor>-<class>_<claim uid>.json`).
pub const SPEC_PREFIX: &str = "vramgate.dev-gpu-memory_";

/// Our files are a few hundred bytes; anything larger is not ours.
const CLAIM_SPEC_LIMIT: u64 = 1 << 20;

/// The variable a prepared claim device's CDI edits set to its marker (the CDI device's name
/// `<claim uid>-<device>` and its secret): what tells a claim's container (see [`crate::dra`]
/// and [`CLAIM_DEVICE_ENV_PREFIX`]).
pub fn claim_device_env(cdi_device: &str) -> String {
    format!("{CLAIM_DEVICE_ENV_PREFIX}{}", env_suffix(cdi_device))
}

/// The variable a prepared claim device's CDI edits set to its share
/// (`<GPU UUID>,<bytes>,<limit bytes>`), under the same suffix as its marker: what a container
/// given several devices is reserved from ([`super::claim_shares`]).
pub fn claim_share_env(cdi_device: &str) -> String {
    format!("{CLAIM_SHARE_ENV_PREFIX}{}", env_suffix(cdi_device))
}

fn env_suffix(cdi_device: &str) -> String {
    cdi_device.replace(['-', '.'], "_")
}

/// One device of a prepared claim, as its spec file says: what the claim may hold, where, the
/// marker value its containers carry (the device's name and a secret drawn at its first
/// prepare, see [`crate::dra::cdi_spec`]), and its share, where the file has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub uuid: String,
    pub bytes: u64,
    pub marker: String,
    /// The share variable's value (`<GPU UUID>,<bytes>,<limit bytes>`); absent in a spec
    /// written by a driver before shares.
    pub share: Option<String>,
}

/// Every device of every claim prepared on this node, by CDI device name (`<uid>-<device>`),
/// read back from the driver's spec files in `dir`: they are the driver's record of what it
/// prepared, so the record survives a restart and needs no second file. Files of other kinds
/// and files that do not parse are passed over (the runtime reads the directory too; a
/// half-written file of ours cannot be seen, they are renamed into place).
pub fn prepared(dir: &Path) -> HashMap<String, PreparedDevice> {
    let mut found = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(SPEC_PREFIX) && name.ends_with(".json")) {
            continue;
        }
        if let Some(spec) = read_claim_spec(&entry.path()) {
            found.extend(prepared_in(&spec));
        }
    }
    found
}

/// One of the driver's spec files, parsed; `None` when it is missing, not a regular file, too
/// large to be ours, not JSON or of another kind. Read with [`read_regular`]'s care: a FIFO
/// under our name is never opened for a wait.
pub fn read_claim_spec(path: &Path) -> Option<serde_json::Value> {
    let (_, bytes) = read_regular(path, CLAIM_SPEC_LIMIT)?;
    let spec = serde_json::from_slice::<serde_json::Value>(&bytes).ok()?;
    (spec["kind"] == KIND).then_some(spec)
}

/// The devices of one spec file. A device whose marker carries no secret (a spec written by a
/// vramgate before markers had one) is passed over: its containers then count as held by
/// others, which can only lower the published capacity, never over-state it.
pub fn prepared_in(spec: &serde_json::Value) -> HashMap<String, PreparedDevice> {
    let mut found = HashMap::new();
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
        let (Some(uuid), Some(bytes), Some(marker)) = (
            value(GPUS_ENV),
            value(MEMORY_ENV).and_then(|b| b.parse().ok()),
            value(&claim_device_env(device_name)),
        ) else {
            continue;
        };
        if claim_marker_device(&marker) != device_name || !marker.contains(':') {
            continue;
        }
        let share = value(&claim_share_env(device_name));
        found.insert(
            device_name.to_string(),
            PreparedDevice {
                uuid,
                bytes,
                marker,
                share,
            },
        );
    }
    found
}

/// The claim's UID in a device name of this driver (`<uid>-gpu-<n>`, `<uid>-gpu-<n>-mig-<m>`):
/// what its spec file is named by. `None` for a name the driver never writes.
fn claim_uid(device: &str) -> Option<&str> {
    let (uid, _) = device.rsplit_once("-gpu-")?;
    let ok = !uid.is_empty() && uid.len() <= 128 && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then_some(uid)
}

/// The claim devices the container was given, checked against the driver's record in `dirs`
/// (`[enforce] cdi_spec_dirs`), sorted: each marker variable must be the one the driver's spec
/// sets for that device (its own name, the device's name and its secret) and each share beside
/// it the one the spec sets. Only the spec files of the claims the markers name are read.
///
/// What this keeps out: a container that writes a marker and share of a device it was not
/// given (forged, or copied from another claim's container under another name) would be
/// taken as given one more device: more memory reserved, but a limit past the claim's, and,
/// for a container that shares a claim with others, a hold it never had
/// ([`crate::ledger::ClaimHold`]). Such a container is refused with one line naming the
/// device, never the secret. A container without markers reads nothing, and one with more than
/// [`super::claim_env::MAX_CLAIM_DEVICES`] markers or shares is refused before any file is read.
pub fn verified_claim_devices(spec: &SpecView, dirs: &[PathBuf]) -> Result<Vec<String>, RequestError> {
    let ClaimVars { markers, shares } = claim_vars(spec)?;
    if markers.is_empty() {
        return Ok(Vec::new());
    }
    let mut record: HashMap<String, PreparedDevice> = HashMap::new();
    let mut read_files: Vec<PathBuf> = Vec::new();
    let mut devices = Vec::with_capacity(markers.len());
    for (suffix, value) in &markers {
        let device = claim_marker_device(value);
        // The container's own text: one line, whatever it holds.
        let shown: String = device.chars().filter(|c| !c.is_control()).take(100).collect();
        let not_prepared = || RequestError::ClaimDeviceNotPrepared {
            device: shown.clone(),
            dirs: crate::cdi_files::dirs_named(dirs),
        };
        if let Some(uid) = claim_uid(device) {
            for dir in dirs {
                let file = dir.join(format!("{SPEC_PREFIX}{uid}.json"));
                if !read_files.contains(&file) {
                    if let Some(spec) = read_claim_spec(&file) {
                        record.extend(prepared_in(&spec));
                    }
                    read_files.push(file);
                }
            }
        }
        let prepared = record.get(device).ok_or_else(not_prepared)?;
        // The marker's own name and value, as the driver wrote them: a value copied under
        // another name would be a second device.
        if *suffix != env_suffix(device) || prepared.marker != *value {
            return Err(not_prepared());
        }
        let share = shares.get(suffix).copied();
        if share.is_some() && share != prepared.share.as_deref() {
            return Err(RequestError::ClaimShareNotPrepared { device: shown });
        }
        devices.push(device.to_string());
    }
    devices.sort();
    devices.dedup();
    Ok(devices)
}
