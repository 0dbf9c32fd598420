//! What the node publishes: each GPU's `memory` capacity for Kubernetes, computed from the
//! service snapshot (the report `vramgate status` and the metrics show) and the claims this
//! node prepared. The rule is in the documentation of [`super`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::cdi_spec::PreparedDevice;
use super::device_name;
use crate::inventory::GpuMemory;
use crate::ledger::{Ledger, Reservation};
use crate::quantity::format_bytes;
use crate::status::StatusReport;

/// The smallest step: quantities the slice publishes stay in whole MiB, which the API server
/// keeps as written (`79Gi`, `1536Mi`), so what was published reads back the same.
pub const MIN_STEP: u64 = 1 << 20;

/// How claims may ask for memory (`capacity.memory.requestPolicy`): in multiples of `step`
/// from `step` up, `default` for a claim that names no amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestPolicy {
    pub step: u64,
    pub default: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("step {0}: must be a whole number of MiB, at least 1Mi")]
    Step(String),
    #[error("default request {default}: must be a multiple of the step {step}, at least one step")]
    Default { default: String, step: String },
}

impl RequestPolicy {
    pub fn new(step: u64, default: u64) -> Result<RequestPolicy, PolicyError> {
        if step < MIN_STEP || !step.is_multiple_of(MIN_STEP) {
            return Err(PolicyError::Step(format_bytes(step)));
        }
        if default < step || !default.is_multiple_of(step) {
            return Err(PolicyError::Default {
                default: format_bytes(default),
                step: format_bytes(step),
            });
        }
        Ok(RequestPolicy { step, default })
    }

    /// `bytes` rounded down to a whole number of steps: what the slice publishes, so that the
    /// scheduler's sums, made of steps, never pass what is there.
    pub fn floor(&self, bytes: u64) -> u64 {
        bytes - bytes % self.step
    }
}

/// One device of the slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The device's name in the slice (`gpu-0`).
    pub name: String,
    /// The inventory's entry (UUID, index, MIG index, device nodes).
    pub gpu: GpuMemory,
    /// What claims may consume on it in all, in bytes, a whole number of steps.
    pub capacity: u64,
    /// The product name (`NVIDIA H100 80GB HBM3`) and a MIG device's profile (`1g.10gb`),
    /// where the inventory can tell.
    pub product: Option<String>,
    pub mig_profile: Option<String>,
}

/// The node's devices at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraView {
    pub devices: Vec<Published>,
    pub policy: RequestPolicy,
    /// Why every capacity is 0, when the inventory or the ledger could not be read.
    pub error: Option<String>,
    /// What the containers of each prepared claim device hold on its GPU now, by CDI device
    /// name (`<claim uid>-<device>`), where it can be measured ([`used_by_claims`]); a device
    /// with nothing measured is absent. Not published in the slice: the claims' status says it.
    pub used: BTreeMap<String, u64>,
    /// The node's `[enforce]` table as this view read it: the tier each claim's status reports
    /// ([`crate::enforce::planned_tier`]).
    pub enforce: crate::config::EnforceConfig,
    /// Whether the slice's devices carry the binding conditions the driver answers
    /// ([`super::claim_watch`]): on unless the driver was started with
    /// `--binding-conditions=false`.
    pub binding_conditions: bool,
}

/// Product names and MIG profiles by GPU UUID (see [`crate::inventory::Inventory::product_names`]).
pub type ProductNames = HashMap<String, (String, Option<String>)>;

impl DraView {
    /// The view of `report` (the service snapshot), with `held` the bytes this driver's claims
    /// hold per GPU UUID ([`held_by_claims`]).
    pub fn compute(
        report: &StatusReport,
        held: &BTreeMap<String, u64>,
        policy: RequestPolicy,
        products: &ProductNames,
    ) -> DraView {
        let mut devices: Vec<Published> = report
            .gpus
            .iter()
            .map(|status| {
                let held = held.get(&status.gpu.uuid).copied().unwrap_or(0);
                let (product, mig_profile) = products.get(&status.gpu.uuid).cloned().unzip();
                Published {
                    name: device_name(&status.gpu),
                    gpu: status.gpu.clone(),
                    capacity: policy.floor(status.available.saturating_add(held).min(status.gpu.total)),
                    product,
                    mig_profile: mig_profile.flatten(),
                }
            })
            .collect();
        // The scheduler's allocator takes the first device in the slice's order that has room
        // (first fit); in ascending order of capacity that is the device with the least room
        // that fits, which is the node's own best fit (crate::placement), so that memory
        // taken outside Kubernetes on one GPU steers claims onto it, not onto the GPU that is
        // still whole. The index breaks ties, so equal views list the devices alike: the order
        // changes only when a capacity does, which republishes the slice anyway.
        devices.sort_by_key(|d| (d.capacity, d.gpu.index, d.gpu.mig_index));
        DraView {
            devices,
            policy,
            error: None,
            used: BTreeMap::new(),
            enforce: crate::config::EnforceConfig::default(),
            binding_conditions: true,
        }
    }

    /// The view when the facts cannot be read: the devices known so far with no capacity (so
    /// none is published: see [`super::slice::build`]), so that the scheduler sends nothing
    /// more here while vramgate cannot account for it.
    pub fn failed(earlier: &DraView, error: String) -> DraView {
        DraView {
            devices: earlier
                .devices
                .iter()
                .map(|d| Published {
                    capacity: 0,
                    ..d.clone()
                })
                .collect(),
            policy: earlier.policy,
            error: Some(error),
            // Not measured now.
            used: BTreeMap::new(),
            enforce: earlier.enforce.clone(),
            binding_conditions: earlier.binding_conditions,
        }
    }

    /// Whether the slice of `self` would differ from that of `other` (the inventory's free
    /// memory changes all the time and is not published).
    pub fn publishes_as(&self, other: &DraView) -> bool {
        let key = |v: &DraView| {
            v.devices
                .iter()
                .map(|d| {
                    (
                        d.name.clone(),
                        d.gpu.uuid.clone(),
                        d.capacity,
                        d.product.clone(),
                        d.mig_profile.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        self.policy == other.policy && key(self) == key(other)
    }

    pub fn device(&self, name: &str) -> Option<&Published> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// One line for the log: "gpu-0 (GPU-...) 70 GiB, gpu-1 (...) 0 B".
    pub fn describe(&self) -> String {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| format!("{} ({}) {}", d.name, d.gpu.uuid, format_bytes(d.capacity)))
            .collect();
        let devices = if devices.is_empty() {
            "no GPU".to_string()
        } else {
            devices.join(", ")
        };
        match &self.error {
            Some(e) => format!("{devices}; no capacity: {e}"),
            None => devices,
        }
    }
}

/// The claim devices a reservation's container was started for: the
/// [`super::claim_device_env`]s in its bundle's spec (several where the container was given
/// several devices, of one claim or more; see [`crate::request::claim_shares`]). `Err`: the
/// spec cannot be read (yet).
pub fn read_marker(bundle: &Path) -> Result<Vec<String>, crate::spec::SpecError> {
    let spec = crate::spec::SpecView::read_bundle(bundle)?;
    Ok(crate::request::claim_markers(&spec).map(str::to_string).collect())
}

/// How a reservation's markers are read: [`read_marker`], or the tests' own.
pub type ReadMarkers<'a> = &'a dyn Fn(&Path) -> Result<Vec<String>, crate::spec::SpecError>;

/// The markers of each reservation, by (container id, created time): a reservation never
/// changes what it holds, so its bundle is read once.
#[derive(Debug, Default)]
pub struct Markers {
    known: HashMap<(String, u64), Vec<String>>,
}

impl Markers {
    fn of(&mut self, r: &Reservation, read: ReadMarkers) -> Vec<String> {
        let key = (r.container_id.clone(), r.created_unix_ms);
        if let Some(markers) = self.known.get(&key) {
            return markers.clone();
        }
        // A bundle that cannot be read now (being written) is asked again next time.
        let Some(Ok(markers)) = r.bundle.as_deref().map(read) else {
            return Vec::new();
        };
        self.known.insert(key, markers.clone());
        markers
    }

    /// Forgets reservations that are no longer in `ledger`.
    fn retain(&mut self, ledger: &Ledger) {
        if self.known.len() <= ledger.reservations.len() {
            return;
        }
        let live: HashSet<(&str, u64)> = ledger
            .reservations
            .iter()
            .map(|r| (r.container_id.as_str(), r.created_unix_ms))
            .collect();
        self.known.retain(|(id, at), _| live.contains(&(id.as_str(), *at)));
    }
}

/// Each reservation held for a prepared claim device, with the device's CDI name and its
/// marker, once per device its container was given: the reservation's marker is the device's
/// own (its name and the secret only its spec file holds, see [`super::cdi_spec`]). A marker that
/// names a device without its secret (forged from the claim's name) matches nothing. The one
/// matching that both the published capacity ([`held_by_claims`]) and the claims' usage
/// ([`used_by_claims`]) use.
fn claimed<'l>(
    ledger: &'l Ledger,
    prepared: &'l HashMap<String, PreparedDevice>,
    markers: &mut Markers,
    read: ReadMarkers,
) -> Vec<(&'l Reservation, &'l str, &'l PreparedDevice, String)> {
    markers.retain(ledger);
    let mut found = Vec::new();
    for r in &ledger.reservations {
        for marker in markers.of(r, read) {
            let Some((name, device)) = prepared.get_key_value(crate::request::claim_marker_device(&marker)) else {
                continue;
            };
            if device.marker != marker {
                continue;
            }
            found.push((r, name.as_str(), device, marker));
        }
    }
    found
}

/// The bytes held for this node's claims, per GPU UUID: each reservation held for a prepared
/// claim device ([`claimed`]) on the GPU it reserved on counts for what it holds there, at
/// most what the claim consumed; each claim device counts once; and each claim's own
/// reservation counts whole.
pub fn held_by_claims(
    ledger: &Ledger,
    prepared: &HashMap<String, PreparedDevice>,
    markers: &mut Markers,
    read: ReadMarkers,
) -> BTreeMap<String, u64> {
    let mut counted = HashSet::new();
    // What each reservation's share on a GPU has left to count: two devices on one GPU given
    // to one container count, together, at most what it holds there.
    let mut left: HashMap<(&str, u64, &str), u64> = HashMap::new();
    let mut held: BTreeMap<String, u64> = BTreeMap::new();
    for (r, _, device, marker) in claimed(ledger, prepared, markers, read) {
        let Some(share) = r.gpus.iter().find(|s| s.uuid == device.uuid) else {
            continue;
        };
        if counted.insert(marker) {
            let left = left
                .entry((r.container_id.as_str(), r.created_unix_ms, share.uuid.as_str()))
                .or_insert(share.bytes);
            let counts = (*left).min(device.bytes);
            *left -= counts;
            *held.entry(device.uuid.clone()).or_default() += counts;
        }
    }
    // A claim's own reservation, made at its allocation before any container of it exists
    // (crate::ledger::ClaimOf): the scheduler already counts that claim against the slice.
    for r in ledger.reservations.iter().filter(|r| r.claim_of.is_some()) {
        for share in &r.gpus {
            *held.entry(share.uuid.clone()).or_default() += share.bytes;
        }
    }
    held
}

/// What the containers of each prepared claim device use on its GPU, by CDI device name: the
/// sum, over the reservations held for it ([`claimed`]), of what the service snapshot
/// `report` (the one the capacity is computed from) measured for them on that GPU. A device
/// none of whose containers could be measured is left out: not measured is not 0.
pub fn used_by_claims(
    ledger: &Ledger,
    report: &StatusReport,
    prepared: &HashMap<String, PreparedDevice>,
    markers: &mut Markers,
    read: ReadMarkers,
) -> BTreeMap<String, u64> {
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    for (r, name, device, _) in claimed(ledger, prepared, markers, read) {
        let measured = report
            .gpus
            .iter()
            .filter(|g| g.gpu.uuid == device.uuid)
            .flat_map(|g| &g.reservations)
            .find(|s| s.container_id == r.container_id)
            .and_then(|s| s.used);
        if let Some(bytes) = measured {
            *used.entry(name.to_string()).or_default() += bytes;
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::GpuShare;
    use crate::procfs::ProcessIdentity;
    use std::path::PathBuf;

    const GI: u64 = 1 << 30;

    fn reservation(id: &str, uuid: &str, bytes: u64) -> Reservation {
        Reservation {
            bundle: Some(PathBuf::from(format!("/bundles/{id}"))),
            ..Reservation::new(
                id,
                vec![GpuShare::new(uuid, bytes, 0)],
                ProcessIdentity { pid: 1, start_time: 1 },
                1,
            )
        }
    }

    #[test]
    fn a_policy_is_whole_mib_and_its_default_whole_steps() {
        assert!(RequestPolicy::new(256 << 20, GI).is_ok());
        assert_eq!(RequestPolicy::new(1000, GI), Err(PolicyError::Step("1000 B".into())));
        assert!(matches!(
            RequestPolicy::new(256 << 20, 300 << 20),
            Err(PolicyError::Default { .. })
        ));
        let policy = RequestPolicy::new(256 << 20, GI).unwrap();
        assert_eq!(policy.floor(GI + 255 * (1 << 20)), GI);
    }

    /// A container given several claim devices carries several markers: each counts on its
    /// own GPU, and devices on one GPU count together at most what it holds there.
    #[test]
    fn a_container_of_several_claim_devices_counts_for_each_on_its_gpu() {
        let device = |uuid: &str, bytes: u64, marker: &str| PreparedDevice {
            uuid: uuid.into(),
            bytes,
            marker: marker.into(),
            share: None,
        };
        let prepared = HashMap::from([
            ("uid-a-gpu-0".to_string(), device("GPU-0", 4 * GI, "uid-a-gpu-0:s")),
            ("uid-a-gpu-1".to_string(), device("GPU-1", 4 * GI, "uid-a-gpu-1:s")),
            ("uid-b-gpu-1".to_string(), device("GPU-1", 3 * GI, "uid-b-gpu-1:s")),
        ]);
        let mut pair = reservation("pair", "GPU-0", 4 * GI);
        pair.gpus.push(GpuShare {
            uuid: "GPU-1".into(),
            bytes: 5 * GI,
            limit: None,
        });
        let mut ledger = Ledger::default();
        ledger.reservations = vec![pair];
        let read = |_: &Path| -> Result<Vec<String>, crate::spec::SpecError> {
            Ok(vec![
                "uid-a-gpu-0:s".into(),
                "uid-a-gpu-1:s".into(),
                "uid-b-gpu-1:s".into(),
            ])
        };
        let held = held_by_claims(&ledger, &prepared, &mut Markers::default(), &read);
        // GPU-1: 4 + 3 GiB of devices, but the container holds 5 GiB there.
        assert_eq!(
            held,
            BTreeMap::from([("GPU-0".into(), 4 * GI), ("GPU-1".into(), 5 * GI)])
        );
    }

    #[test]
    fn claims_count_only_for_prepared_devices_on_their_gpu_at_most_what_they_consumed() {
        let mut ledger = Ledger::default();
        ledger.reservations = vec![
            reservation("claimed", "GPU-0", 6 * GI),
            // Name a prepared device with the wrong secret, or none: had they counted, GPU-1
            // would hold 2 GiB for the claim where its container holds 4.
            reservation("guessed", "GPU-1", 2 * GI),
            reservation("bare", "GPU-1", 2 * GI),
            // Names a prepared device but reserved more than the claim consumed.
            reservation("greedy", "GPU-1", 9 * GI),
            // Names a device no claim of this node has.
            reservation("forged", "GPU-0", 2 * GI),
            // Names the same device as "claimed": counts once.
            reservation("copy", "GPU-0", 6 * GI),
            reservation("plain", "GPU-0", 3 * GI),
        ];
        let prepared = HashMap::from([
            (
                "uid-a-gpu-0".to_string(),
                PreparedDevice {
                    uuid: "GPU-0".into(),
                    bytes: 6 * GI,
                    marker: "uid-a-gpu-0:s3cret".into(),
                    share: None,
                },
            ),
            (
                "uid-b-gpu-1".to_string(),
                PreparedDevice {
                    uuid: "GPU-1".into(),
                    bytes: 4 * GI,
                    marker: "uid-b-gpu-1:0ther".into(),
                    share: None,
                },
            ),
        ]);
        let read = |bundle: &Path| -> Result<Vec<String>, crate::spec::SpecError> {
            Ok(match bundle.file_name().unwrap().to_str().unwrap() {
                "claimed" | "copy" => vec!["uid-a-gpu-0:s3cret".into()],
                "greedy" => vec!["uid-b-gpu-1:0ther".into()],
                "forged" => vec!["uid-x-gpu-0:s3cret".into()],
                "guessed" => vec!["uid-b-gpu-1:s3cret".into()],
                "bare" => vec!["uid-b-gpu-1".into()],
                _ => Vec::new(),
            })
        };
        let held = held_by_claims(&ledger, &prepared, &mut Markers::default(), &read);
        assert_eq!(
            held,
            BTreeMap::from([("GPU-0".into(), 6 * GI), ("GPU-1".into(), 4 * GI)])
        );
    }
}
