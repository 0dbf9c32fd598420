//! The node side of claims: prepare turns a claim's allocation into CDI devices, unprepare
//! removes them ([`Preparer`]); kubelet's gRPC services over it are in [`super::server`].
//!
//! After a prepare, the claim's `status.devices[]` says what the node did with each of its
//! devices ([`StatusDevice::entry`]): the tier that holds its containers, the request and
//! limit applied, and the memory they use, rewritten when the view's usage changes
//! ([`refresh_statuses`]). Unprepare leaves the entries, as upstream drivers do: they go
//! with the allocation, which the API server clears them with.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use tokio::sync::{watch, Notify};

use super::cdi_spec::{self, ClaimDevice, HookSpec};
use super::kube::ApiClient;
use super::resource_claim;
use super::slice_view::DraView;
use super::DRIVER;

/// One claim kubelet asks about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One device of a prepared claim, as kubelet is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
    pub share_id: Option<String>,
}

/// The `kind` of the `data` of this driver's entries in a claim's `status.devices[]`
/// (`apiVersion` [`resource_claim::CONFIG_API_VERSION`]).
pub const STATUS_KIND: &str = "GpuMemoryStatus";
/// How soon a status write that failed is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(5);
/// The least time between two writes of one claim's status after its prepare: the usage a
/// view measures changes as often as its containers allocate, and each write is an update
/// of the claim in the API server; the latest figure is written once this has passed.
pub const STATUS_EVERY: Duration = Duration::from_secs(2);

/// One device of a prepared claim, as its status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusDevice {
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    /// `<claim uid>-<device>`: what the view's usage is keyed by.
    pub cdi_name: String,
    pub gpu: crate::inventory::GpuMemory,
    /// The memory the claim consumed there: what its containers reserve.
    pub request: u64,
    /// The limit its configuration asks, else the request.
    pub limit: u64,
}

impl StatusDevice {
    /// The device's entry in `status.devices[]` under `view`: `data` is `{"apiVersion",
    /// "kind", "tier", "request", "limit", "used"}`, bytes as numbers, `used` only where
    /// measured.
    pub fn entry(&self, view: &DraView) -> serde_json::Value {
        let placed = [crate::enforce::PlacedShare {
            uuid: self.gpu.uuid.clone(),
            index: self.gpu.index,
            mig_index: self.gpu.mig_index,
            bytes: self.request,
            limit: self.limit,
            total: self.gpu.total,
        }];
        let tier = crate::enforce::planned_tier(&view.enforce, &placed);
        let mut data = json!({
            "apiVersion": resource_claim::CONFIG_API_VERSION,
            "kind": STATUS_KIND,
            "tier": tier.as_str(),
            "request": self.request,
            "limit": self.limit,
        });
        if let Some(used) = view.used.get(&self.cdi_name) {
            data["used"] = json!(used);
        }
        let mut entry = json!({"driver": DRIVER, "pool": self.pool, "device": self.device, "data": data});
        if let Some(id) = &self.share_id {
            entry["shareID"] = json!(id);
        }
        entry
    }
}

/// A claim this driver prepared and keeps the status of.
struct PreparedClaim {
    claim: ClaimRef,
    devices: Vec<StatusDevice>,
    /// The entries last written; `None` until a write succeeds.
    written: Option<Vec<serde_json::Value>>,
    /// When a write of them was last tried.
    tried: Option<std::time::Instant>,
}

/// What [`Preparer::write_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusWrite {
    /// The status is as the view says (written now, or already).
    Done,
    /// Not yet: the last try was less than [`STATUS_EVERY`] (or, failed, [`STATUS_RETRY`])
    /// ago; due after this.
    Later(Duration),
}

/// The node side of claims: prepares and unprepares them against the latest view.
pub struct Preparer {
    pub api: ApiClient,
    pub views: watch::Receiver<Arc<DraView>>,
    pub node: String,
    pub cdi_dir: PathBuf,
    pub dev_dir: PathBuf,
    /// vramgate's hook, which each claim's CDI device runs.
    pub hook: HookSpec,
    /// One prepare or unprepare at a time, as the Go helper does by default: a claim prepared
    /// and unprepared at once must end as the later call says.
    serial: tokio::sync::Mutex<()>,
    /// NVIDIA's specs as last read; only used under `serial`, from a blocking thread.
    nvidia_specs: Arc<std::sync::Mutex<cdi_spec::NvidiaSpecs>>,
    /// The claims prepared since this driver started, by uid, whose status it keeps; only
    /// changed under `serial`.
    claims: std::sync::Mutex<HashMap<String, PreparedClaim>>,
    /// Told when a status write after prepare failed, so that [`refresh_statuses`] tries it
    /// again without waiting for a new view.
    status_due: Notify,
}

impl Preparer {
    pub fn new(
        api: ApiClient,
        views: watch::Receiver<Arc<DraView>>,
        node: String,
        cdi_dir: PathBuf,
        dev_dir: PathBuf,
        hook: HookSpec,
    ) -> Preparer {
        Preparer {
            api,
            views,
            node,
            cdi_dir,
            dev_dir,
            hook,
            serial: tokio::sync::Mutex::new(()),
            nvidia_specs: Arc::default(),
            claims: std::sync::Mutex::default(),
            status_due: Notify::new(),
        }
    }

    /// Prepares each claim; the answer has an entry for every claim, keyed by uid, each its
    /// devices or one line saying why not (one bad claim fails alone).
    pub async fn prepare(&self, claims: &[ClaimRef]) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let _serial = self.serial.lock().await;
        let mut answers = HashMap::new();
        for c in claims {
            let answer = match self.prepare_one(c).await {
                Ok((devices, status)) => {
                    if !status.is_empty() {
                        self.lock_claims().insert(
                            c.uid.clone(),
                            PreparedClaim {
                                claim: c.clone(),
                                devices: status,
                                written: None,
                                tried: None,
                            },
                        );
                        // What the status says is not what kubelet waits for: a write that
                        // fails is logged and tried again, the prepare stands.
                        if self.write_status(&c.uid).await != StatusWrite::Done {
                            // Tried again by `refresh_statuses`, which is told now.
                            self.status_due.notify_one();
                        }
                    }
                    Ok(devices)
                }
                Err(e) => {
                    eprintln!(
                        "vramgate-dra: prepare of claim {}/{} ({}): {e}",
                        c.namespace, c.name, c.uid
                    );
                    Err(e)
                }
            };
            answers.insert(c.uid.clone(), answer);
        }
        answers
    }

    fn lock_claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, PreparedClaim>> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes claim `uid`'s status entries under the latest view, unless they are what was
    /// last written, or the last try was too recent ([`StatusWrite::Later`]). A failure is
    /// logged, and due again after [`STATUS_RETRY`]. Called under `serial`.
    async fn write_status(&self, uid: &str) -> StatusWrite {
        let view = self.views.borrow().clone();
        let (claim, entries) = {
            let mut claims = self.lock_claims();
            let Some(prepared) = claims.get_mut(uid) else {
                return StatusWrite::Done;
            };
            let entries: Vec<serde_json::Value> = prepared.devices.iter().map(|d| d.entry(&view)).collect();
            if prepared.written.as_ref() == Some(&entries) {
                return StatusWrite::Done;
            }
            let pause = if prepared.written.is_some() {
                STATUS_EVERY
            } else {
                STATUS_RETRY
            };
            // The first write after prepare is never held back.
            if let Some(since) = prepared.tried.map(|t| t.elapsed()) {
                if since < pause {
                    return StatusWrite::Later(pause - since);
                }
            }
            prepared.tried = Some(std::time::Instant::now());
            (prepared.claim.clone(), entries)
        };
        let written = self
            .api
            .write_device_status(&claim.namespace, &claim.name, &claim.uid, &entries)
            .await;
        let mut claims = self.lock_claims();
        match written {
            Ok(true) => {
                if let Some(prepared) = claims.get_mut(uid) {
                    prepared.written = Some(entries);
                }
                StatusWrite::Done
            }
            Ok(false) => {
                // Gone, replaced or deallocated: nothing of it to report any more.
                claims.remove(uid);
                StatusWrite::Done
            }
            Err(e) => {
                eprintln!(
                    "vramgate-dra: status of claim {}/{} ({}): {e}; tried again in {}s",
                    claim.namespace,
                    claim.name,
                    claim.uid,
                    STATUS_RETRY.as_secs()
                );
                if let Some(prepared) = claims.get_mut(uid) {
                    prepared.written = None;
                }
                StatusWrite::Later(STATUS_RETRY)
            }
        }
    }

    async fn prepare_one(&self, c: &ClaimRef) -> Result<(Vec<PreparedDevice>, Vec<StatusDevice>), String> {
        // They go into the API path: only what the API server could have named.
        if !is_dns_name(&c.namespace, 63, false) || !is_dns_name(&c.name, 253, true) {
            return Err(format!(
                "claim {:?}/{:?}: not a Kubernetes namespace and object name",
                c.namespace, c.name
            ));
        }
        let json = self
            .api
            .claim_json(&c.namespace, &c.name)
            .await
            .map_err(|e| e.to_string())?;
        let shares = resource_claim::shares(&json, &c.namespace, &c.name, &c.uid).map_err(|e| e.to_string())?;
        if shares.is_empty() {
            // Nothing of this driver's to prepare; a spec without devices would be one the
            // runtime's CDI loader complains about at every rescan.
            return Ok((Vec::new(), Vec::new()));
        }
        let view = self.views.borrow().clone();
        for share in &shares {
            if share.pool != self.node {
                return Err(format!(
                    "claim {}/{}: device {} was allocated from pool {:?}, and this node's pool is {:?}",
                    c.namespace, c.name, share.device, share.pool, self.node
                ));
            }
            if view.device(&share.device).is_none() {
                let names: Vec<&str> = view.devices.iter().map(|d| d.name.as_str()).collect();
                return Err(format!(
                    "claim {}/{}: this node has no device {:?} (it has {})",
                    c.namespace,
                    c.name,
                    share.device,
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
            }
        }
        // One CDI device per device of the slice: results on one device (two requests that
        // landed on one GPU) add up, as the scheduler added them up against its capacity.
        // Several devices (count, allocationMode: All, several requests) each keep their own
        // share; a container given several is reserved their amount on each of their GPUs
        // (see crate::request::claim_shares).
        let mut devices: Vec<(ClaimDevice, Option<String>)> = Vec::new();
        for share in &shares {
            let limit = share.limit.unwrap_or(share.bytes);
            if let Some((same, _)) = devices.iter_mut().find(|(d, _)| d.device == share.device) {
                let before = same.limit.unwrap_or(same.bytes);
                same.bytes = same.bytes.saturating_add(share.bytes);
                let summed = before.saturating_add(limit);
                same.limit = (summed > same.bytes).then_some(summed);
                continue;
            }
            let published = view.device(&share.device).expect("checked above");
            // NVIDIA's CDI device brings the GPU's nodes and the driver's libraries where the
            // node has the toolkit's spec; else ours lists the nodes (the image brings the rest).
            let nvidia = self.nvidia_device(&published.gpu).await?;
            let device_nodes = match nvidia {
                Some(_) => Vec::new(),
                None => published.gpu.device_nodes(&self.dev_dir),
            };
            devices.push((
                ClaimDevice {
                    device: share.device.clone(),
                    bytes: share.bytes,
                    limit: share.limit,
                    uuid: published.gpu.uuid.clone(),
                    device_nodes,
                },
                nvidia,
            ));
        }
        let ours: Vec<ClaimDevice> = devices.iter().map(|(d, _)| d.clone()).collect();
        let ids = cdi_spec::write_spec(&self.cdi_dir, &c.uid, &ours, &self.hook).map_err(|e| e.to_string())?;
        // What kubelet is told, and the claim's status, stay one entry per result (each
        // result's request and share ID), naming its device's CDI ids.
        let cdi_ids = |device: &str| -> Vec<String> {
            let at = devices
                .iter()
                .position(|(d, _)| d.device == device)
                .expect("one per device");
            std::iter::once(ids[at].clone()).chain(devices[at].1.clone()).collect()
        };
        let status = shares
            .iter()
            .map(|share| StatusDevice {
                pool: share.pool.clone(),
                device: share.device.clone(),
                share_id: share.share_id.clone(),
                cdi_name: format!("{}-{}", c.uid, share.device),
                gpu: view
                    .device(&share.device)
                    .map(|p| p.gpu.clone())
                    .expect("checked above"),
                request: share.bytes,
                limit: share.limit.unwrap_or(share.bytes),
            })
            .collect();
        let prepared = shares
            .into_iter()
            .map(|share| PreparedDevice {
                cdi_ids: cdi_ids(&share.device),
                request: share.request,
                pool: share.pool,
                device: share.device,
                share_id: share.share_id,
            })
            .collect();
        Ok((prepared, status))
    }

    /// NVIDIA's CDI device for `gpu`, looked for on a blocking thread: the runtime that runs
    /// this prepare also answers kubelet's registration and the next calls, and a CDI
    /// directory is a file system the driver does not own.
    async fn nvidia_device(&self, gpu: &crate::inventory::GpuMemory) -> Result<Option<String>, String> {
        let (specs, dirs, gpu) = (self.nvidia_specs.clone(), self.nvidia_cdi_dirs(), gpu.clone());
        let uuid = gpu.uuid.clone();
        tokio::task::spawn_blocking(move || specs.lock().unwrap_or_else(|e| e.into_inner()).device(&dirs, &gpu))
            .await
            .map_err(|e| format!("looking for NVIDIA's CDI device of GPU {uuid}: {e}"))
    }

    /// Where NVIDIA's CDI spec may be: the runtime's directory this driver writes to, and the
    /// standard ones.
    fn nvidia_cdi_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.cdi_dir.clone()];
        dirs.extend(
            cdi_spec::STATIC_DIRS
                .iter()
                .map(PathBuf::from)
                .filter(|d| *d != self.cdi_dir),
        );
        dirs
    }

    /// Removes each claim's CDI spec; a claim never prepared here is fine.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> HashMap<String, Result<(), String>> {
        let _serial = self.serial.lock().await;
        claims
            .iter()
            .map(|c| {
                // Its status is left as it was last written (see the module documentation).
                self.lock_claims().remove(&c.uid);
                let answer = cdi_spec::remove_spec(&self.cdi_dir, &c.uid).map_err(|e| e.to_string());
                if let Err(e) = &answer {
                    eprintln!(
                        "vramgate-dra: unprepare of claim {}/{} ({}): {e}",
                        c.namespace, c.name, c.uid
                    );
                }
                (c.uid.clone(), answer)
            })
            .collect()
    }
}

/// Keeps the prepared claims' status as the view says: rewritten when a new view changes
/// what it reports (the usage, the tier), at most every [`STATUS_EVERY`] per claim, the latest
/// figure once that has passed; a write that failed is tried again after [`STATUS_RETRY`].
/// Runs until the views end.
pub async fn refresh_statuses(preparer: Arc<Preparer>) {
    let mut views = preparer.views.clone();
    let mut due: Option<Duration> = None;
    loop {
        tokio::select! {
            changed = views.changed() => if changed.is_err() { return },
            _ = preparer.status_due.notified() => {}
            _ = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() => {}
        }
        let _serial = preparer.serial.lock().await;
        let uids: Vec<String> = preparer.lock_claims().keys().cloned().collect();
        due = None;
        for uid in uids {
            if let StatusWrite::Later(after) = preparer.write_status(&uid).await {
                due = Some(due.map_or(after, |d| d.min(after)));
            }
        }
    }
}

/// A DNS label (`a-z`, `0-9`, `-`, alphanumeric at both ends), or with `dots` a DNS
/// subdomain, of at most `max` characters: what namespaces and object names are.
fn is_dns_name(name: &str, max: usize, dots: bool) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= max
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-' || (dots && c == '.'))
}
