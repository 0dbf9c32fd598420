//! Which reservations in the ledger were allocated through this plugin: those whose
//! container's spec carries [`super::DEVICE_IDS_ENV`], checked against what they reserved.

use std::collections::HashMap;
use std::path::Path;

use super::{DeviceId, Unit, DEVICE_IDS_ENV};
use crate::ledger::{Ledger, Reservation};
use crate::spec::{SpecView, MAX_SPEC_BYTES};

/// The units a plugin-allocated reservation holds, or `None` for everyone else's.
pub type Held = Option<Vec<DeviceId>>;

/// The answer for each reservation, by (container id, created time): a reservation never
/// changes what it holds, so its bundle is read once.
#[derive(Debug, Default)]
pub struct Origins {
    known: HashMap<(String, u64), Held>,
}

impl Origins {
    /// The units `r` holds through this plugin (see the module documentation of
    /// [`super`]); `None` when it is not the plugin's, or its spec cannot be read now, or its
    /// marker names units that `granted` does not vouch for (kubelet's checkpoint and the
    /// plugin's own grants: any container can set the env). The last two are asked again
    /// next time (a bundle being written, a checkpoint not yet rewritten); the rest is kept.
    pub fn held(&mut self, r: &Reservation, unit: &Unit, granted: &dyn Fn(&DeviceId) -> bool) -> Held {
        let key = (r.container_id.clone(), r.created_unix_ms);
        if let Some(held) = self.known.get(&key) {
            return held.clone();
        }
        let bundle = r.bundle.as_deref()?;
        let ids = read_marker(bundle).ok()?;
        let held = ids.and_then(|ids| matches_reservation(ids, r, unit));
        if held.as_ref().is_some_and(|ids| !ids.iter().all(granted)) {
            return None;
        }
        self.known.insert(key, held.clone());
        held
    }

    /// Forgets reservations that are no longer in `ledger`.
    pub fn retain(&mut self, ledger: &Ledger) {
        if self.known.len() <= ledger.reservations.len() {
            return;
        }
        let live: std::collections::HashSet<(&str, u64)> = ledger
            .reservations
            .iter()
            .map(|r| (r.container_id.as_str(), r.created_unix_ms))
            .collect();
        self.known.retain(|(id, at), _| live.contains(&(id.as_str(), *at)));
    }
}

/// The marker's IDs in `<bundle>/config.json`: `Ok(None)` when the spec has no marker,
/// `Err` when it cannot be read (yet).
fn read_marker(bundle: &Path) -> std::io::Result<Option<Vec<DeviceId>>> {
    let path = bundle.join("config.json");
    // A spec too large to be one vramgate-runtime passed is no marker.
    let Some(bytes) = crate::spec::read_limited(&path, MAX_SPEC_BYTES)? else {
        return Ok(None);
    };
    let Ok(spec) = SpecView::parse(&bytes, &path) else {
        return Ok(None);
    };
    let Some(value) = spec.env(DEVICE_IDS_ENV) else {
        return Ok(None);
    };
    // One unparsable ID and the marker is not ours: the reservation counts as someone else's.
    let ids: Option<Vec<DeviceId>> = value.split(',').map(|id| DeviceId::parse(id.trim())).collect();
    Ok(ids)
}

/// The IDs when they are all on the one GPU the reservation holds memory on and add up to
/// exactly what it reserved there; `None` otherwise (a hand-set marker, a container that
/// also named other GPUs, a unit changed since).
fn matches_reservation(ids: Vec<DeviceId>, r: &Reservation, unit: &Unit) -> Held {
    let [share] = r.gpus.as_slice() else { return None };
    let on_gpu = ids.iter().all(|id| id.uuid == share.uuid);
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    let exact = distinct.len() == ids.len() && (ids.len() as u64).saturating_mul(unit.bytes()) == share.bytes;
    (on_gpu && exact && !ids.is_empty()).then_some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::GpuShare;
    use crate::procfs::ProcessIdentity;

    const GIB: u64 = 1 << 30;

    fn reservation(bundle: &Path, uuid: &str, bytes: u64) -> Reservation {
        let init = ProcessIdentity { pid: 1, start_time: 1 };
        Reservation {
            bundle: Some(bundle.to_path_buf()),
            ..Reservation::new("c1", vec![GpuShare::new(uuid, bytes, 0)], init, 7)
        }
    }

    fn bundle_with_env(env: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let spec = serde_json::json!({"ociVersion": "1.0.2", "process": {"env": env}});
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        dir
    }

    #[test]
    fn a_marked_spec_that_matches_its_reservation_is_the_plugins() {
        let dir = bundle_with_env(&["PATH=/bin", "VRAMGATE_DEVICE_IDS=GPU-a/3,GPU-a/4"]);
        let mut origins = Origins::default();
        let held = origins.held(&reservation(dir.path(), "GPU-a", 2 * GIB), &Unit::gib(), &|_| true);
        assert_eq!(held.unwrap().len(), 2);
        // Cached: the bundle is not read again.
        std::fs::remove_file(dir.path().join("config.json")).unwrap();
        assert!(origins
            .held(&reservation(dir.path(), "GPU-a", 2 * GIB), &Unit::gib(), &|_| true)
            .is_some());
    }

    #[test]
    fn a_marker_naming_units_nobody_granted_is_someone_elses_until_they_are() {
        let dir = bundle_with_env(&["VRAMGATE_DEVICE_IDS=GPU-a/3,GPU-a/4"]);
        let r = reservation(dir.path(), "GPU-a", 2 * GIB);
        let mut origins = Origins::default();
        let only_3 = |id: &DeviceId| id.n == 3;
        assert_eq!(origins.held(&r, &Unit::gib(), &only_3), None);
        // Not kept: once kubelet's checkpoint lists both, the reservation is the plugin's.
        assert_eq!(origins.held(&r, &Unit::gib(), &|_| true).map(|ids| ids.len()), Some(2));
    }

    #[test]
    fn anything_else_is_someone_elses() {
        let unit = Unit::gib();
        let cases: [(&[&str], &str, u64); 5] = [
            (&["PATH=/bin"], "GPU-a", 2 * GIB),                           // no marker
            (&["VRAMGATE_DEVICE_IDS=GPU-a/3,GPU-a/4"], "GPU-a", 3 * GIB), // amount differs
            (&["VRAMGATE_DEVICE_IDS=GPU-a/3,GPU-b/4"], "GPU-a", 2 * GIB), // another GPU
            (&["VRAMGATE_DEVICE_IDS=GPU-a/3,GPU-a/3"], "GPU-a", 2 * GIB), // a unit twice
            (&["VRAMGATE_DEVICE_IDS=GPU-a/x"], "GPU-a", GIB),             // not an ID
        ];
        for (env, uuid, bytes) in cases {
            let dir = bundle_with_env(env);
            let held = Origins::default().held(&reservation(dir.path(), uuid, bytes), &unit, &|_| true);
            assert_eq!(held, None, "{env:?}");
        }
        let gone = reservation(Path::new("/nonexistent/bundle"), "GPU-a", GIB);
        assert_eq!(Origins::default().held(&gone, &unit, &|_| true), None);
    }
}
