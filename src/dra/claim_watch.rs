//! One book between the scheduler and the node: the driver holds a claim's memory in the ledger
//! from the moment the scheduler allocates it to this node, and tells the scheduler through the
//! claim's binding conditions whether it could.
//!
//! The driver watches the resource claims. For one allocated from this node's pool that its
//! status does not yet answer, it reserves the claim's consumed memory at once
//! ([`crate::service::Service::reserve_claim`], a reservation of the claim and no container),
//! then sets its device's [`super::RESERVED_CONDITION`] True in the claim's `status.devices`;
//! kube-scheduler, which waits in PreBind for the binding conditions the slice's devices carry
//! ([`super::slice`]), binds the pod then. Where the node cannot hold the claim now (memory
//! taken outside Kubernetes since the slice was published, or waiters ahead on the node's
//! queue), it sets [`super::UNAVAILABLE_CONDITION`] True with vramgate's one-line reason: the
//! scheduler takes the allocation back and the pod returns to its queue, Pending with that
//! reason, never left in ContainerCreating for memory. The claim's first container takes the
//! reservation over when it starts (counted once), and gives it back to the claim when it
//! leaves the ledger ([`crate::ledger::Ledger::hand_back_claims`]); a claim deallocated or
//! deleted (its pod deleted, before binding or after) has its reservation released. A driver
//! back from a restart, and each watch's end, releases the reservations of claims no longer
//! allocated here.
//!
//! On an API server without binding conditions (DRADeviceBindingConditions, beta and on by
//! default from Kubernetes 1.36) the slice's conditions are dropped, nothing waits, and the
//! reservation at allocation still closes most of the gap between the scheduler's decision and
//! the container's start.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ListParams, WatchEvent, WatchParams};
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};
use tokio_stream::StreamExt;

use super::kube::ApiClient;
use super::resource_claim;
use super::slice_view::DraView;
use super::{DRIVER, RESERVED_CONDITION, UNAVAILABLE_CONDITION};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::ledger::{ClaimOf, GpuShare, StateDir};
use crate::procfs::ProcLiveness;
use crate::service::{ClaimReserved, Service};

/// How long one watch of the claims lasts before it is made again from where it ended: under
/// the client's read timeout ([`super::kube::CALL_TIMEOUT`]), which a quiet watch would pass.
const WATCH_SECONDS: u32 = 8;
/// How soon a failed list or watch is tried again.
const RETRY: Duration = Duration::from_secs(2);

/// What the keeper thread is asked.
enum Ask {
    Reserve {
        claim: ClaimOf,
        shares: Vec<GpuShare>,
        name: Option<String>,
        answer: oneshot::Sender<Result<ClaimReserved, String>>,
    },
    Release {
        uid: String,
        why: String,
    },
    Held {
        answer: oneshot::Sender<Result<Vec<(String, bool)>, String>>,
    },
}

/// The ledger's side, on a thread of its own: the service takes the ledger's lock and reads the
/// GPUs, which must not hold up the driver's runtime (kubelet's calls, the slice).
#[derive(Clone)]
pub struct Keeper {
    asks: mpsc::Sender<Ask>,
}

impl Keeper {
    /// Starts the thread, with the inventory it opens from `config`.
    pub fn start(config: Config) -> Result<Keeper, crate::inventory::InventoryError> {
        let (asks, received) = mpsc::channel::<Ask>();
        let (opened, open) = mpsc::channel();
        std::thread::Builder::new()
            .name("claim-keeper".into())
            .spawn(move || {
                // Opened here: an inventory (NVML's handle) stays on the thread that opened it.
                let inventory = match crate::inventory::open(&config) {
                    Ok(inventory) => {
                        let _ = opened.send(Ok(()));
                        inventory
                    }
                    Err(e) => {
                        let _ = opened.send(Err(e));
                        return;
                    }
                };
                for ask in received {
                    let service = StateDir::open_existing(&config.state_dir)
                        .map_err(|e| e.to_string())
                        .and_then(|d| d.ok_or_else(|| format!("{}: no state directory", config.state_dir.display())))
                        .map(|dir| Service::new(dir, inventory.as_ref(), &SystemClock, &ProcLiveness, &config));
                    match ask {
                        Ask::Reserve {
                            claim,
                            shares,
                            name,
                            answer,
                        } => {
                            let done = service.and_then(|s| {
                                s.reserve_claim(&claim, &shares, name.as_deref())
                                    .map_err(|e| e.to_string())
                            });
                            let _ = answer.send(done);
                        }
                        Ask::Release { uid, why } => {
                            if let Err(e) = service.and_then(|s| s.release_claim(&uid, &why).map_err(|e| e.to_string()))
                            {
                                eprintln!("vramgate-dra: releasing the reservation of claim {uid}: {e}");
                            }
                        }
                        Ask::Held { answer } => {
                            let _ = answer.send(service.and_then(|s| s.claims_held().map_err(|e| e.to_string())));
                        }
                    }
                }
            })
            .expect("a thread starts");
        open.recv().expect("the keeper answers once")?;
        Ok(Keeper { asks })
    }

    async fn reserve(
        &self,
        claim: ClaimOf,
        shares: Vec<GpuShare>,
        name: Option<String>,
    ) -> Result<ClaimReserved, String> {
        let (answer, answered) = oneshot::channel();
        self.asks
            .send(Ask::Reserve {
                claim,
                shares,
                name,
                answer,
            })
            .map_err(|_| "the claim keeper has stopped".to_string())?;
        answered.await.map_err(|_| "the claim keeper has stopped".to_string())?
    }

    fn release(&self, uid: &str, why: &str) {
        let _ = self.asks.send(Ask::Release {
            uid: uid.to_string(),
            why: why.to_string(),
        });
    }

    async fn held(&self) -> Result<Vec<(String, bool)>, String> {
        let (answer, answered) = oneshot::channel();
        self.asks
            .send(Ask::Held { answer })
            .map_err(|_| "the claim keeper has stopped".to_string())?;
        answered.await.map_err(|_| "the claim keeper has stopped".to_string())?
    }
}

/// What this driver's results of an allocated claim ask of this node: the shares by GPU, and
/// the status entries that answer them. `None` where the claim is not allocated here.
struct Allocated {
    claim: ClaimOf,
    shares: Vec<GpuShare>,
    /// (pool, device, shareID) of each of this driver's results.
    results: Vec<(String, String, Option<String>)>,
    /// Whether this driver's status entries already carry one of its conditions.
    answered: bool,
    /// `namespace/pod/claim:<name>`, the pod being the one the claim is reserved for.
    name: Option<String>,
}

fn allocated_here(claim: &Value, node: &str, view: &DraView) -> Result<Option<Allocated>, String> {
    let meta = &claim["metadata"];
    let (Some(namespace), Some(name), Some(uid)) =
        (meta["namespace"].as_str(), meta["name"].as_str(), meta["uid"].as_str())
    else {
        return Ok(None);
    };
    let bytes = serde_json::to_vec(claim).expect("JSON serializes");
    let shares = resource_claim::shares(&bytes, namespace, name, uid).map_err(|e| e.to_string())?;
    let ours: Vec<_> = shares.into_iter().filter(|s| s.pool == node).collect();
    if ours.is_empty() {
        return Ok(None);
    }
    let mut by_gpu: Vec<GpuShare> = Vec::new();
    for share in &ours {
        let Some(published) = view.device(&share.device) else {
            return Err(format!(
                "claim {namespace}/{name}: this node has no device {:?}",
                share.device
            ));
        };
        let limit = share.limit.unwrap_or(share.bytes);
        match by_gpu.iter_mut().find(|g| g.uuid == published.gpu.uuid) {
            Some(same) => {
                let summed = same.limit_bytes().saturating_add(limit);
                *same = GpuShare::new(same.uuid.clone(), same.bytes.saturating_add(share.bytes), summed);
            }
            None => by_gpu.push(GpuShare::new(published.gpu.uuid.clone(), share.bytes, limit)),
        }
    }
    let answered = claim["status"]["devices"].as_array().into_iter().flatten().any(|d| {
        d["driver"] == DRIVER
            && d["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == RESERVED_CONDITION || c["type"] == UNAVAILABLE_CONDITION)
    });
    let pod = claim["status"]["reservedFor"]
        .as_array()
        .and_then(|r| r.iter().find(|c| c["resource"] == "pods"))
        .and_then(|c| c["name"].as_str());
    let shown = |part: &str| crate::request::name::clean_part(part);
    let name_shown = match (shown(namespace), pod.and_then(shown), shown(&format!("claim:{name}"))) {
        (Some(ns), Some(pod), Some(claim)) => Some(format!("{ns}/{pod}/{claim}")),
        (Some(ns), None, Some(claim)) => Some(format!("{ns}/{claim}")),
        _ => None,
    };
    Ok(Some(Allocated {
        claim: ClaimOf {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        },
        shares: by_gpu,
        results: ours.into_iter().map(|s| (s.pool, s.device, s.share_id)).collect(),
        answered,
        name: name_shown,
    }))
}

/// The status entries that answer an allocation: one per result, each with the one condition
/// that says how it went.
fn answer_entries(allocated: &Allocated, outcome: &Result<(), String>) -> Vec<Value> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = match outcome {
        Ok(()) => json!({
            "type": RESERVED_CONDITION,
            "status": "True",
            "reason": "MemoryReserved",
            "message": "vramgate reserved the claim's memory on this node",
            "lastTransitionTime": now,
        }),
        Err(message) => json!({
            "type": UNAVAILABLE_CONDITION,
            "status": "True",
            "reason": "MemoryUnavailable",
            "message": message,
            "lastTransitionTime": now,
        }),
    };
    let mut results = allocated.results.clone();
    // One entry a device: the API server refuses two with the same driver, pool, device and
    // share (two results without a share id on one device).
    results.sort();
    results.dedup();
    results
        .iter()
        .map(|(pool, device, share_id)| {
            let mut entry = json!({"driver": DRIVER, "pool": pool, "device": device, "conditions": [condition]});
            if let Some(id) = share_id {
                entry["shareID"] = json!(id);
            }
            entry
        })
        .collect()
}

/// Answers one claim as it is now (see the module docs); `seen` is the claims allocated here.
async fn on_claim(
    api: &ApiClient,
    keeper: &Keeper,
    node: &str,
    views: &watch::Receiver<Arc<DraView>>,
    claim: &Value,
    seen: &mut HashMap<String, bool>,
) {
    let uid = claim["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let view = views.borrow().clone();
    let allocated = match allocated_here(claim, node, &view) {
        Ok(Some(a)) => a,
        Ok(None) => {
            if seen.remove(&uid).is_some() {
                keeper.release(&uid, "resource claim deallocated");
            }
            return;
        }
        Err(e) => {
            eprintln!("vramgate-dra: {e}");
            return;
        }
    };
    // Without binding conditions nothing in the claim says it was answered: this driver's
    // own memory of the allocation does (a restarted driver reserves again, which finds the
    // claim AlreadyHeld where its container took the reservation over).
    let binding_conditions = view.binding_conditions;
    let known = seen.insert(uid.clone(), true).is_some();
    if allocated.answered || (known && !binding_conditions) {
        return;
    }
    let outcome = match keeper
        .reserve(
            allocated.claim.clone(),
            allocated.shares.clone(),
            allocated.name.clone(),
        )
        .await
    {
        Ok(ClaimReserved::Reserved | ClaimReserved::AlreadyHeld) => Ok(()),
        Ok(ClaimReserved::Refused(line)) => Err(line),
        // The ledger could not be read: the claim cannot be held here now, and says why.
        Err(e) => Err(format!("vramgate: {e}")),
    };
    let c = &allocated.claim;
    if !binding_conditions {
        // Nobody waits for an answer: the pod is bound anyway, and its container's start
        // queues or is refused on the node as without the reservation.
        if let Err(line) = &outcome {
            eprintln!(
                "vramgate-dra: claim {}/{} not held at its allocation: {line}",
                c.namespace, c.name
            );
        }
        return;
    }
    let entries = answer_entries(&allocated, &outcome);
    match api.write_device_status(&c.namespace, &c.name, &c.uid, &entries).await {
        Ok(true) => {}
        Ok(false) => {
            // Gone or deallocated meanwhile: nothing holds it.
            seen.remove(&uid);
            keeper.release(&uid, "resource claim gone before its binding");
        }
        Err(e) => {
            // Not answered: the watch brings the claim again (a relist at the latest) and the
            // reservation, already made, answers AlreadyHeld then.
            eprintln!("vramgate-dra: answering claim {}/{}: {e}", c.namespace, c.name);
        }
    }
}

/// Watches the claims for as long as the driver runs (see the module docs).
pub async fn keep_claims(api: ApiClient, node: String, views: watch::Receiver<Arc<DraView>>, keeper: Keeper) {
    let mut seen: HashMap<String, bool> = HashMap::new();
    loop {
        // A list, then watches from its resource version until one fails; then a list again.
        let listed = match api.list_claims(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                eprintln!(
                    "vramgate-dra: listing resource claims: {e}; tried again in {}s",
                    RETRY.as_secs()
                );
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let mut version = listed.metadata.resource_version.clone().unwrap_or_default();
        let mut present = HashSet::new();
        for claim in &listed.items {
            let value = serde_json::to_value(claim).expect("JSON serializes");
            present.insert(claim.metadata.uid.clone().unwrap_or_default());
            on_claim(&api, &keeper, &node, &views, &value, &mut seen).await;
        }
        // What the ledger holds for claims no longer here, allocated elsewhere, or deallocated
        // while the driver was away.
        release_unseen(&keeper, &seen).await;
        seen.retain(|uid, _| present.contains(uid));
        loop {
            let params = WatchParams::default().timeout(WATCH_SECONDS);
            let mut events = match api.watch_claims(&params, &version).await {
                Ok(events) => Box::pin(events),
                Err(e) => {
                    eprintln!("vramgate-dra: watching resource claims: {e}");
                    tokio::time::sleep(RETRY).await;
                    break;
                }
            };
            let mut failed = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(claim) | WatchEvent::Modified(claim)) => {
                        version = claim.metadata.resource_version.clone().unwrap_or(version);
                        let value = serde_json::to_value(&claim).expect("JSON serializes");
                        on_claim(&api, &keeper, &node, &views, &value, &mut seen).await;
                    }
                    Ok(WatchEvent::Deleted(claim)) => {
                        version = claim.metadata.resource_version.clone().unwrap_or(version);
                        let uid = claim.metadata.uid.clone().unwrap_or_default();
                        if seen.remove(&uid).is_some() {
                            keeper.release(&uid, "resource claim deleted");
                        }
                    }
                    Ok(WatchEvent::Bookmark(mark)) => version = mark.metadata.resource_version,
                    // 410 Gone (the version is too old): list again at once.
                    Ok(WatchEvent::Error(_)) => {
                        failed = true;
                        break;
                    }
                    // A stream that cannot be read: list again after a pause, so that a server
                    // that answers a watch with something else is not asked in a busy loop.
                    Err(e) => {
                        eprintln!("vramgate-dra: watching resource claims: {e}");
                        tokio::time::sleep(RETRY).await;
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                break;
            }
            // A claim's memory handed back by its last container after the driver saw the
            // claim deallocated (kubelet stopped the container late) is released here, at the
            // end of each watch, rather than at the next list.
            release_unseen(&keeper, &seen).await;
        }
    }
}

/// Releases the claims' own reservations in the ledger whose claim is not allocated here by
/// what the watch has seen (`seen`).
async fn release_unseen(keeper: &Keeper, seen: &HashMap<String, bool>) {
    match keeper.held().await {
        Ok(held) => {
            for (uid, own) in held {
                if own && !seen.contains_key(&uid) {
                    keeper.release(&uid, "resource claim no longer allocated here");
                }
            }
        }
        Err(e) => eprintln!("vramgate-dra: {e}"),
    }
}
