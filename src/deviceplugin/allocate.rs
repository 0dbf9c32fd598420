//! What kubelet asks at pod admission: which units to take (GetPreferredAllocation) and what
//! a container needs for them (Allocate).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::unit_view::NodeView;
use super::{api, DeviceId, Unit, DEVICE_IDS_ENV};
use crate::admission;
use crate::ledger::Ledger;
use crate::placement::{self, Candidate};
use crate::request::{GPUS_ANNOTATION, GPUS_ENV, MEMORY_ANNOTATION, MEMORY_ENV, VISIBLE_DEVICES_ENV};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocateError {
    #[error("no devices to allocate")]
    Empty,
    #[error("device {id:?} is not one of this plugin's (expected <GPU-uuid>/<n> of a GPU on this node)")]
    Unknown { id: String },
    #[error("device {id:?} is asked for twice; each unit can be given once")]
    Duplicate { id: String },
    #[error("the units of one container must be on one GPU, and these are on {}: {}", gpus.len(), gpus.join(", "))]
    SpansGpus { gpus: Vec<String> },
}

/// Units granted by Allocate, with when: kept for [`super::GRANT_GRACE`] or until their
/// container's reservation shows in the ledger (the view then knows them from there).
#[derive(Debug, Default)]
pub struct Grants {
    granted: BTreeMap<DeviceId, Instant>,
}

impl Grants {
    /// Every unit granted and not yet forgotten.
    pub fn ids(&self) -> impl Iterator<Item = &DeviceId> {
        self.granted.keys()
    }

    pub fn add(&mut self, ids: &[DeviceId], now: Instant) {
        for id in ids {
            self.granted.insert(id.clone(), now);
        }
    }

    /// The grants still pending at `now`, dropping those past `grace` or already `reserved`.
    pub fn pending(&mut self, now: Instant, grace: Duration, reserved: &BTreeSet<DeviceId>) -> BTreeSet<DeviceId> {
        self.granted
            .retain(|id, at| now.saturating_duration_since(*at) < grace && !reserved.contains(id));
        self.granted.keys().cloned().collect()
    }
}

/// Parses IDs and checks they are distinct units of GPUs present in `view`.
fn known_ids(view: &NodeView, ids: &[String]) -> Result<Vec<DeviceId>, AllocateError> {
    let mut seen = BTreeSet::new();
    ids.iter()
        .map(|raw| {
            let shown = || raw.chars().take(80).collect();
            let id = DeviceId::parse(raw)
                .filter(|id| view.gpu(&id.uuid).is_some_and(|g| g.present && id.n < g.units))
                .ok_or_else(|| AllocateError::Unknown { id: shown() })?;
            if !seen.insert(id.clone()) {
                return Err(AllocateError::Duplicate { id: shown() });
            }
            Ok(id)
        })
        .collect()
}

/// The one GPU that all of `ids` are on.
fn one_gpu(ids: &[DeviceId]) -> Result<&str, AllocateError> {
    let first = ids.first().ok_or(AllocateError::Empty)?;
    let gpus: BTreeSet<&str> = ids.iter().map(|id| id.uuid.as_str()).collect();
    if gpus.len() > 1 {
        return Err(AllocateError::SpansGpus {
            gpus: gpus.into_iter().map(str::to_string).collect(),
        });
    }
    Ok(&first.uuid)
}

/// What one container gets for `ids`: the memory and the GPU, for the node's hook, and the
/// GPU's device nodes of those under `dev` (kubelet adds them to the container and its device
/// cgroup). NVIDIA's container toolkit, where the node has it, gives the same nodes again from
/// NVIDIA_VISIBLE_DEVICES; without it, they are how the container gets its GPU at all.
pub fn allocate(
    view: &NodeView,
    unit: &Unit,
    ids: &[String],
    dev: &std::path::Path,
) -> Result<(api::ContainerAllocateResponse, Vec<DeviceId>), AllocateError> {
    let parsed = known_ids(view, ids)?;
    let uuid = one_gpu(&parsed)?.to_string();
    let memory = unit.amount(parsed.len() as u64);
    let marker: Vec<String> = parsed.iter().map(DeviceId::to_string).collect();
    let envs = [
        (MEMORY_ENV, memory.clone()),
        (GPUS_ENV, uuid.clone()),
        (VISIBLE_DEVICES_ENV, uuid.clone()),
        (DEVICE_IDS_ENV, marker.join(",")),
    ];
    let devices = view
        .snapshot
        .by_uuid(&uuid)
        .map(|g| g.device_nodes(dev))
        .unwrap_or_default()
        .into_iter()
        .map(|path| {
            let path = path.display().to_string();
            api::DeviceSpec {
                container_path: path.clone(),
                host_path: path,
                permissions: "rw".into(),
            }
        })
        .collect();
    let annotations = [(MEMORY_ANNOTATION, memory), (GPUS_ANNOTATION, uuid)];
    let response = api::ContainerAllocateResponse {
        envs: envs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        annotations: annotations.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        devices,
        ..Default::default()
    };
    Ok((response, parsed))
}

/// The units kubelet should give a container that asks for `size`: all on one GPU, the one
/// that best fit picks on `ledger` (read just now) among the GPUs where kubelet has `size`
/// free units and which hold the units that `must_include` names. A preference only: when
/// no GPU qualifies, the IDs kubelet must include, then the first available ones.
pub fn preferred(
    view: &NodeView,
    ledger: &Ledger,
    unit: &Unit,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut by_gpu: BTreeMap<String, Vec<DeviceId>> = BTreeMap::new();
    for id in available.iter().filter_map(|id| DeviceId::parse(id)) {
        if view.gpu(&id.uuid).is_some() {
            by_gpu.entry(id.uuid.clone()).or_default().push(id);
        }
    }
    let must: Vec<DeviceId> = must_include.iter().filter_map(|id| DeviceId::parse(id)).collect();
    let must_gpu: BTreeSet<&str> = must.iter().map(|id| id.uuid.as_str()).collect();
    let bytes = (size as u64).saturating_mul(unit.bytes());
    // Each GPU kubelet can satisfy the request on, with what a new reservation could take there
    // now (the admission rule's number on the live ledger).
    let candidates: Vec<Candidate> = by_gpu
        .iter()
        .filter(|(uuid, ids)| {
            let extra = ids.iter().filter(|id| !must.contains(id)).count();
            must_gpu.iter().all(|m| *m == uuid.as_str()) && must.len() + extra >= size
        })
        .filter_map(|(uuid, _)| {
            let gpu = view.snapshot.by_uuid(uuid)?;
            Some(admission::account(ledger, gpu, &view.allocated, &view.rules).candidate(bytes))
        })
        .collect();
    let fitting: Vec<Candidate> = candidates.iter().filter(|c| c.available >= bytes).cloned().collect();
    // When none fits by the ledger (it changed since kubelet's count), still pick the best of
    // those kubelet can satisfy: the node's admission has the last word when the pod starts.
    let offered = if fitting.is_empty() { &candidates } else { &fitting };
    let chosen = placement::choose(view.rules.strategy, offered, 1).and_then(|c| c.into_iter().next());
    let mut out: Vec<String> = must.iter().map(DeviceId::to_string).collect();
    let pool: Vec<&DeviceId> = match &chosen {
        Some(uuid) => by_gpu
            .get(uuid.as_str())
            .map(|ids| ids.iter().collect())
            .unwrap_or_default(),
        None => by_gpu.values().flatten().collect(),
    };
    let mut pool = pool;
    pool.sort();
    for id in pool {
        if out.len() >= size {
            break;
        }
        let id = id.to_string();
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Allocated, Rules};
    use crate::deviceplugin::unit_view::Facts;
    use crate::inventory::{GpuMemory, Snapshot};
    use crate::ledger::Reservation;
    use crate::placement::Strategy;
    use crate::quantity::Quantity;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn rules() -> Rules {
        Rules {
            headroom: Quantity::Bytes(0),
            backfill: false,
            backfill_bound: Duration::from_secs(30),
            backfill_order: crate::queue_order::BackfillOrder::Arrival,
            strategy: Strategy::BestFit,
            limit_overcommit_ppm: 0,
        }
    }

    /// Three 16 GiB GPUs with 0, 10 and 4 GiB reserved outside Kubernetes.
    fn node() -> (NodeView, Ledger) {
        let snapshot = Snapshot {
            gpus: (0..3)
                .map(|i| GpuMemory {
                    total: 16 * GIB,
                    free: 16 * GIB,
                    ..GpuMemory::for_test(i, None, &format!("GPU-{i}"))
                })
                .collect(),
            ..Default::default()
        };
        let reserve = |uuid: &str, gib: u64| Reservation::for_test(&format!("other-{uuid}"), uuid, gib * GIB);
        let ledger = Ledger {
            reservations: vec![reserve("GPU-1", 10), reserve("GPU-2", 4)],
            ..Default::default()
        };
        let facts = Facts {
            snapshot: &snapshot,
            ledger: &ledger,
            allocated: &Allocated::new(),
            rules: &rules(),
            unit: &Unit::gib(),
            granted: &BTreeSet::new(),
            plugin_held: &[],
        };
        (NodeView::compute(&facts, &[]), ledger)
    }

    fn healthy_ids(view: &NodeView) -> Vec<String> {
        view.devices
            .iter()
            .filter(|d| d.health == super::super::HEALTHY)
            .map(|d| d.id.clone())
            .collect()
    }

    #[test]
    fn preferred_takes_every_unit_from_the_best_fitting_gpu() {
        let (view, ledger) = node();
        let available = healthy_ids(&view);
        // 5 GiB: GPU 1 has 6 left (tightest), GPU 2 has 12, GPU 0 has 16.
        let ids = preferred(&view, &ledger, &Unit::gib(), &available, &[], 5);
        assert_eq!(ids, ["GPU-1/0", "GPU-1/1", "GPU-1/2", "GPU-1/3", "GPU-1/4"]);
        // 8 GiB: GPU 1 cannot; GPU 2 is the tightest that can.
        let ids = preferred(&view, &ledger, &Unit::gib(), &available, &[], 8);
        assert!(
            ids.iter().all(|id| id.starts_with("GPU-2/")) && ids.len() == 8,
            "{ids:?}"
        );
        // A unit kubelet must include decides the GPU.
        let ids = preferred(&view, &ledger, &Unit::gib(), &available, &["GPU-0/9".into()], 2);
        assert_eq!(ids, ["GPU-0/9", "GPU-0/0"]);
    }

    /// A device directory with no GPU nodes: the response lists none.
    fn no_dev() -> &'static std::path::Path {
        std::path::Path::new("/nonexistent-dev")
    }

    #[test]
    fn allocate_hands_the_container_its_gpus_nodes_and_no_other_gpus() {
        let (view, _) = node();
        let dev = tempfile::tempdir().unwrap();
        for node in ["nvidia0", "nvidia2", "nvidiactl", "nvidia-uvm"] {
            std::fs::write(dev.path().join(node), "").unwrap();
        }
        let (response, _) = allocate(&view, &Unit::gib(), &["GPU-2/3".into()], dev.path()).unwrap();
        let paths: Vec<(&str, &str, &str)> = response
            .devices
            .iter()
            .map(|d| (d.container_path.as_str(), d.host_path.as_str(), d.permissions.as_str()))
            .collect();
        let at = |n: &str| dev.path().join(n).display().to_string();
        let (two, ctl, uvm) = (at("nvidia2"), at("nvidiactl"), at("nvidia-uvm"));
        assert_eq!(
            paths,
            [
                (two.as_str(), two.as_str(), "rw"),
                (ctl.as_str(), ctl.as_str(), "rw"),
                (uvm.as_str(), uvm.as_str(), "rw")
            ]
        );
    }

    #[test]
    fn allocate_names_the_memory_and_the_gpu() {
        let (view, _) = node();
        let (response, granted) =
            allocate(&view, &Unit::gib(), &["GPU-2/3".into(), "GPU-2/4".into()], no_dev()).unwrap();
        assert_eq!(granted.len(), 2);
        assert_eq!(response.envs["VRAMGATE_MEMORY"], "2Gi");
        assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-2");
        assert_eq!(response.envs["VRAMGATE_GPUS"], "GPU-2");
        assert_eq!(response.envs["VRAMGATE_DEVICE_IDS"], "GPU-2/3,GPU-2/4");
        assert_eq!(response.annotations["vramgate.dev/memory"], "2Gi");
        assert_eq!(response.annotations["vramgate.dev/gpus"], "GPU-2");
    }

    #[test]
    fn allocate_refuses_units_on_several_gpus_or_unknown_ones() {
        let (view, _) = node();
        let err = allocate(&view, &Unit::gib(), &["GPU-0/1".into(), "GPU-2/1".into()], no_dev()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the units of one container must be on one GPU, and these are on 2: GPU-0, GPU-2"
        );
        for bad in ["GPU-9/1", "GPU-0/16", "nonsense"] {
            let err = allocate(&view, &Unit::gib(), &[bad.to_string()], no_dev()).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert_eq!(
            allocate(&view, &Unit::gib(), &[], no_dev()).unwrap_err(),
            AllocateError::Empty
        );
        // A unit twice would grant 2Gi for one unit's health.
        let err = allocate(&view, &Unit::gib(), &["GPU-0/1".into(), "GPU-0/1".into()], no_dev()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "device \"GPU-0/1\" is asked for twice; each unit can be given once"
        );
        // A GPU that is gone takes no new containers.
        let mut gone = view.clone();
        gone.gpus.iter_mut().for_each(|g| g.present = false);
        let err = allocate(&gone, &Unit::gib(), &["GPU-0/1".into()], no_dev()).unwrap_err();
        assert!(matches!(err, AllocateError::Unknown { .. }), "{err}");
    }

    #[test]
    fn grants_expire_or_end_when_reserved() {
        let mut grants = Grants::default();
        let t0 = Instant::now();
        let a = DeviceId {
            uuid: "GPU-0".into(),
            n: 1,
        };
        let b = DeviceId {
            uuid: "GPU-0".into(),
            n: 2,
        };
        grants.add(&[a.clone(), b.clone()], t0);
        let grace = Duration::from_secs(600);
        assert_eq!(grants.pending(t0, grace, &[a.clone()].into()), [b.clone()].into());
        assert!(grants.pending(t0 + grace, grace, &BTreeSet::new()).is_empty());
    }
}
