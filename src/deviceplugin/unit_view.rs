//! The node's view for kubelet: each GPU's units and how many of them are healthy (the rule
//! is in the documentation of [`super`]), computed from the inventory and the live ledger.

use std::collections::BTreeSet;

use super::api;
use super::unit::MAX_DEVICE_ID_LEN;
use super::{DeviceId, Unit, HEALTHY, UNHEALTHY};
use crate::admission::{self, Allocated, Rules};
use crate::inventory::Snapshot;
use crate::ledger::Ledger;

/// One GPU (memory domain) as the plugin advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUnits {
    pub uuid: String,
    pub index: u32,
    pub mig_index: Option<u32>,
    /// Its units: `floor(total / unit)`.
    pub units: u32,
    /// How many of them are healthy now.
    pub healthy: u32,
    /// Unit numbers held by this plugin's live containers, or granted and not reserved yet.
    pub in_use: BTreeSet<u32>,
    /// False for a GPU seen earlier that the inventory no longer lists: all its units are
    /// unhealthy, and kept in the list so kubelet sees them fall sick rather than vanish.
    pub present: bool,
}

/// What the plugin knows at one moment.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub gpus: Vec<GpuUnits>,
    /// What ListAndWatch sends: every unit of every GPU with its health.
    pub devices: Vec<api::Device>,
    /// The inventory's answer and what containers had allocated, for placement on the live
    /// ledger (GetPreferredAllocation).
    pub snapshot: Snapshot,
    pub allocated: Allocated,
    pub rules: Rules,
    /// Why every unit is unhealthy, when the inventory or the ledger could not be read.
    pub error: Option<String>,
    /// GPUs left out (a UUID too long for a device ID), for the log.
    pub left_out: Vec<String>,
}

/// The facts one view is computed from.
pub struct Facts<'a> {
    pub snapshot: &'a Snapshot,
    /// The live reservations (those of processes known to be gone already taken out).
    pub ledger: &'a Ledger,
    pub allocated: &'a Allocated,
    pub rules: &'a Rules,
    pub unit: &'a Unit,
    /// Units granted by Allocate whose containers have not reserved yet.
    pub granted: &'a BTreeSet<DeviceId>,
    /// The units each of the plugin's own reservations holds (see [`super::origin`]).
    pub plugin_held: &'a [Vec<DeviceId>],
}

impl NodeView {
    /// The view of `facts`; `earlier` is the last view's GPUs (those gone since stay listed).
    pub fn compute(facts: &Facts, earlier: &[GpuUnits]) -> NodeView {
        let unit = facts.unit;
        let mut gpus = Vec::new();
        let mut left_out = Vec::new();
        for gpu in &facts.snapshot.gpus {
            let units = unit.units_in(gpu.total).min(u64::from(u32::MAX)) as u32;
            if units > 0 && gpu.uuid.len() + 1 + (units - 1).to_string().len() > MAX_DEVICE_ID_LEN {
                left_out.push(format!(
                    "GPU {} ({}): its UUID makes device IDs longer than kubelet's {MAX_DEVICE_ID_LEN} characters",
                    gpu.index, gpu.uuid
                ));
                continue;
            }
            let account = admission::account(facts.ledger, gpu, facts.allocated, facts.rules);
            // The plugin's containers' units on this GPU, each counted once: two containers
            // that name the same unit hold one unit's worth for Kubernetes, not two.
            let mut held_units: BTreeSet<u32> = facts
                .plugin_held
                .iter()
                .flatten()
                .filter(|id| id.uuid == gpu.uuid)
                .map(|id| id.n)
                .collect();
            held_units.retain(|n| *n < units);
            let plugin_bytes = u64::from(held_units.len() as u32).saturating_mul(unit.bytes());
            let mut in_use = held_units;
            in_use.extend(facts.granted.iter().filter(|id| id.uuid == gpu.uuid).map(|id| id.n));
            in_use.retain(|n| *n < units);
            // What Kubernetes may use on this GPU: what a new reservation could take now, plus
            // what the plugin's own containers hold (kubelet counts those as in use).
            let for_kubernetes = account.available().saturating_add(plugin_bytes);
            let healthy = unit.units_in(for_kubernetes).min(u64::from(units)) as u32;
            gpus.push(GpuUnits {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
                mig_index: gpu.mig_index,
                units,
                healthy,
                in_use,
                present: true,
            });
        }
        gpus.extend(gone(earlier, &gpus));
        sort(&mut gpus);
        NodeView {
            devices: devices(&gpus),
            gpus,
            snapshot: facts.snapshot.clone(),
            allocated: facts.allocated.clone(),
            rules: *facts.rules,
            error: None,
            left_out,
        }
    }

    /// The view when the facts cannot be read: every known unit unhealthy, so the scheduler
    /// sends nothing here while vramgate cannot account for it.
    pub fn failed(earlier: &[GpuUnits], rules: Rules, error: String) -> NodeView {
        let gpus: Vec<GpuUnits> = earlier
            .iter()
            .map(|g| GpuUnits {
                healthy: 0,
                ..g.clone()
            })
            .collect();
        NodeView {
            devices: devices(&gpus),
            gpus,
            snapshot: Snapshot::default(),
            allocated: Allocated::new(),
            rules,
            error: Some(error),
            left_out: Vec::new(),
        }
    }

    pub fn gpu(&self, uuid: &str) -> Option<&GpuUnits> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    pub fn healthy_units(&self) -> u32 {
        self.gpus.iter().map(|g| g.healthy).sum()
    }

    /// One line for the log: "GPU 0: 75/80 healthy, 4 in use; GPU 1: ...".
    pub fn describe(&self) -> String {
        let gpus: Vec<String> = self
            .gpus
            .iter()
            .map(|g| {
                let name = match g.mig_index {
                    Some(m) => format!("GPU {}:{m}", g.index),
                    None => format!("GPU {}", g.index),
                };
                let gone = if g.present { "" } else { " (gone)" };
                format!(
                    "{name}{gone}: {}/{} healthy, {} in use",
                    g.healthy,
                    g.units,
                    g.in_use.len()
                )
            })
            .collect();
        match &self.error {
            Some(e) => format!("all units unhealthy: {e}"),
            None => gpus.join("; "),
        }
    }
}

/// GPUs of the earlier view that are no longer listed, all unhealthy.
fn gone(earlier: &[GpuUnits], now: &[GpuUnits]) -> Vec<GpuUnits> {
    earlier
        .iter()
        .filter(|g| !now.iter().any(|n| n.uuid == g.uuid))
        .map(|g| GpuUnits {
            healthy: 0,
            present: false,
            ..g.clone()
        })
        .collect()
}

fn sort(gpus: &mut [GpuUnits]) {
    gpus.sort_by(|a, b| (a.index, a.mig_index, &a.uuid).cmp(&(b.index, b.mig_index, &b.uuid)));
}

/// Every unit with its health: of a GPU's units, `healthy` are healthy, those in use first,
/// then the lowest numbers.
fn devices(gpus: &[GpuUnits]) -> Vec<api::Device> {
    let mut out = Vec::with_capacity(gpus.iter().map(|g| g.units as usize).sum());
    for g in gpus {
        let mut left = g.healthy;
        let mut health = vec![false; g.units as usize];
        for n in &g.in_use {
            if left == 0 {
                break;
            }
            health[*n as usize] = true;
            left -= 1;
        }
        for slot in health.iter_mut().filter(|h| !**h) {
            if left == 0 {
                break;
            }
            *slot = true;
            left -= 1;
        }
        for (n, healthy) in health.into_iter().enumerate() {
            out.push(api::Device {
                id: DeviceId {
                    uuid: g.uuid.clone(),
                    n: n as u32,
                }
                .to_string(),
                health: if healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::GpuMemory;
    use crate::ledger::Reservation;
    use crate::placement::Strategy;
    use crate::quantity::Quantity;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn rules(headroom_gib: u64) -> Rules {
        Rules {
            headroom: Quantity::Bytes(headroom_gib * GIB),
            backfill: false,
            backfill_bound: Duration::from_secs(30),
            backfill_order: crate::queue_order::BackfillOrder::Arrival,
            strategy: Strategy::BestFit,
            limit_overcommit_ppm: 0,
        }
    }

    fn gpu(index: u32, total_gib: u64, used_outside_gib: u64) -> GpuMemory {
        GpuMemory {
            total: total_gib * GIB,
            free: (total_gib - used_outside_gib) * GIB,
            ..GpuMemory::for_test(index, None, &format!("GPU-{index}"))
        }
    }

    fn reservation(id: &str, uuid: &str, gib: u64) -> Reservation {
        Reservation::for_test(id, uuid, gib * GIB)
    }

    /// The view of `gpus` and `reservations`, where containers named `k8s-…` hold the units
    /// `GPU-x/70..` of their size through the plugin.
    fn view(gpus: Vec<GpuMemory>, reservations: Vec<Reservation>, headroom_gib: u64) -> NodeView {
        let snapshot = Snapshot {
            gpus,
            ..Default::default()
        };
        let plugin_held: Vec<Vec<DeviceId>> = reservations
            .iter()
            .filter(|r| r.container_id.starts_with("k8s-"))
            .map(|r| {
                let share = &r.gpus[0];
                (0..(share.bytes / GIB) as u32)
                    .map(|n| DeviceId {
                        uuid: share.uuid.clone(),
                        n: 70 + n,
                    })
                    .collect()
            })
            .collect();
        let ledger = Ledger {
            reservations,
            ..Default::default()
        };
        let facts = Facts {
            snapshot: &snapshot,
            ledger: &ledger,
            allocated: &Allocated::new(),
            rules: &rules(headroom_gib),
            unit: &Unit::gib(),
            granted: &BTreeSet::new(),
            plugin_held: &plugin_held,
        };
        NodeView::compute(&facts, &[])
    }

    /// The view of `snapshot` with nothing reserved, `granted` units, no headroom, after
    /// `earlier`.
    fn on_empty_ledger(snapshot: &Snapshot, granted: &BTreeSet<DeviceId>, earlier: &[GpuUnits]) -> NodeView {
        let facts = Facts {
            snapshot,
            ledger: &Ledger::default(),
            allocated: &Allocated::new(),
            rules: &rules(0),
            unit: &Unit::gib(),
            granted,
            plugin_held: &[],
        };
        NodeView::compute(&facts, earlier)
    }

    fn health(v: &NodeView, id: &str) -> String {
        v.devices.iter().find(|d| d.id == id).unwrap().health.clone()
    }

    #[test]
    fn an_idle_gpu_is_all_healthy_but_its_headroom() {
        let v = view(vec![gpu(0, 80, 0), gpu(1, 24, 0)], vec![], 2);
        assert_eq!(v.devices.len(), 104);
        assert_eq!((v.gpus[0].units, v.gpus[0].healthy), (80, 78));
        assert_eq!((v.gpus[1].units, v.gpus[1].healthy), (24, 22));
        assert_eq!(health(&v, "GPU-0/0"), HEALTHY);
        assert_eq!(health(&v, "GPU-0/78"), UNHEALTHY);
    }

    #[test]
    fn memory_held_by_others_is_unhealthy_the_plugins_own_is_not() {
        // 10 GiB used outside vramgate, 5.5 GiB reserved outside Kubernetes, 4 GiB by a pod.
        let v = view(
            vec![gpu(0, 80, 10)],
            vec![reservation("docker-1", "GPU-0", 5), reservation("k8s-1", "GPU-0", 4)],
            0,
        );
        let g = &v.gpus[0];
        assert_eq!((g.units, g.healthy), (80, 65), "80 - 10 - 5 = 65, the pod's 4 included");
        // The pod's units (70..74) stay healthy; the unhealthy ones are the highest free ones.
        for n in 70..74 {
            assert_eq!(health(&v, &format!("GPU-0/{n}")), HEALTHY, "{n}");
        }
        assert_eq!(health(&v, "GPU-0/60"), HEALTHY);
        assert_eq!(health(&v, "GPU-0/61"), UNHEALTHY);
        assert_eq!(health(&v, "GPU-0/79"), UNHEALTHY);
        assert_eq!(v.healthy_units(), 65);
    }

    #[test]
    fn two_containers_naming_the_same_units_are_counted_once() {
        // Both markers name GPU-0/70..74 (the second copied the first's env): Kubernetes
        // granted 4 units, so only 4 GiB of the 8 reserved is its own.
        let v = view(
            vec![gpu(0, 80, 0)],
            vec![reservation("k8s-1", "GPU-0", 4), reservation("k8s-copy", "GPU-0", 4)],
            0,
        );
        assert_eq!((v.gpus[0].healthy, v.gpus[0].in_use.len()), (76, 4));
    }

    #[test]
    fn a_fractional_reservation_costs_a_whole_unit() {
        let mut r = reservation("podman-1", "GPU-0", 0);
        r.gpus[0].bytes = 1205 << 20;
        let v = view(vec![gpu(0, 24, 0)], vec![r], 0);
        assert_eq!(v.gpus[0].healthy, 22);
    }

    #[test]
    fn a_gpu_that_is_gone_stays_listed_unhealthy() {
        let before = view(vec![gpu(0, 8, 0), gpu(1, 8, 0)], vec![], 0);
        let snapshot = Snapshot {
            gpus: vec![gpu(0, 8, 0)],
            ..Default::default()
        };
        let after = on_empty_ledger(&snapshot, &BTreeSet::new(), &before.gpus);
        assert_eq!(after.devices.len(), 16);
        assert!(!after.gpus[1].present);
        assert_eq!(after.healthy_units(), 8);
        assert!(
            after.describe().contains("GPU 1 (gone): 0/8 healthy"),
            "{}",
            after.describe()
        );
        let failed = NodeView::failed(&after.gpus, rules(0), "the ledger is corrupt".into());
        assert_eq!(failed.healthy_units(), 0);
        assert_eq!(failed.devices.len(), 16);
    }

    #[test]
    fn granted_units_keep_their_health_before_their_container_reserves() {
        let snapshot = Snapshot {
            gpus: vec![gpu(0, 8, 4)],
            ..Default::default()
        };
        let granted: BTreeSet<DeviceId> = [DeviceId {
            uuid: "GPU-0".into(),
            n: 7,
        }]
        .into();
        let v = on_empty_ledger(&snapshot, &granted, &[]);
        assert_eq!(v.gpus[0].healthy, 4);
        assert_eq!(health(&v, "GPU-0/7"), HEALTHY);
        assert_eq!(health(&v, "GPU-0/3"), UNHEALTHY);
    }
}
