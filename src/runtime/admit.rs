//! Admission at `create`: the wrapper reserves (and, for `auto`, places) before the next
//! runtime runs, so that the GPU it chose can be written into the spec that runtime reads.
//!
//! The reservation is made under the ledger lock like any other, with `pending` set and the
//! wrapper's own process as its owner: the wrapper `exec`s the next runtime, which keeps the
//! pid and start time, so the reservation lives exactly as long as `runc create` (or `runc
//! run`) does until the container's `createRuntime` hook confirms it with the init pid. A
//! create that fails or is killed in between leaves a reservation whose process is gone, and
//! the next transaction reclaims it. Under policy `wait`, the wrapper waits in the queue
//! before runc starts; the engine's create call blocks meanwhile, as it does for a waiting hook.

use std::path::Path;

use crate::clock::SystemClock;
use crate::config::{Config, Policy};
use crate::inventory::{self, GpuMemory};
use crate::ledger::{GpuShare, StateDir};
use crate::placement::Placement;
use crate::procfs::{Life, Liveness, ProcLiveness, ProcessIdentity};
use crate::request::Request;
use crate::service::{self, Admission, AdmitRequest, Service, ServiceError};

use super::queue_guard::QueueGuard;
use super::RuntimeError;

/// What the wrapper reserved for a container at create.
#[derive(Debug)]
pub struct Reserved {
    /// What was reserved on each GPU.
    pub shares: Vec<GpuShare>,
    /// The GPUs reserved, as the inventory saw them.
    pub gpus: Vec<GpuMemory>,
    /// How they were chosen, when vramgate chose them: the spec must then be narrowed.
    pub placement: Option<Placement>,
}

/// Admits `container` (bundle `bundle`) for `request` at create. `Ok(None)`: started
/// unaccounted because vramgate's state is broken and the config says fail-open (the hook
/// will try again, and log, at createRuntime).
pub fn admit_at_create(
    container: &str,
    bundle: &Path,
    mut request: Request,
    config: &Config,
) -> Result<Option<Reserved>, RuntimeError> {
    if let Some(placed) = request.gpus.to_place() {
        request.gpus = placed;
    }
    let me = ProcessIdentity::current().ok_or(RuntimeError::NoSelf)?;
    // The hook's one capability, for attribution; emptied again when this returns.
    let _ptrace = crate::privilege::raise_for_admission().ok();
    let dir = match StateDir::open_or_create(&config.state_dir) {
        Ok(dir) => dir,
        Err(e) => return fail_open_or(config, container, ServiceError::Ledger(e)),
    };
    let inventory = inventory::OpenOnUse::new(config);
    let service = Service::new(dir, &inventory, &SystemClock, &ProcLiveness, config);
    // runc reports the bundle as an absolute path, and the hook matches on it.
    let bundle = std::path::absolute(bundle).unwrap_or_else(|_| bundle.to_path_buf());
    let policy = request.policy.unwrap_or(config.policy);
    // Started once the create holds a ticket and is about to wait, not before: a create
    // admitted at once (most) starts no extra process, which measured 11 ms on a 2-core VM
    // (bench/queue-guard.sh). Held until the wait is over. A kill in the moment between the
    // ticket's commit and the guard's start, or a guard that cannot be started, leaves the
    // ticket to the next transaction or the engine's `delete`, as before the guard.
    let mut guard: Option<QueueGuard> = None;
    let mut start_guard = || {
        if policy == Policy::Wait && guard.is_none() {
            guard = std::env::current_exe()
                .ok()
                .and_then(|exe| QueueGuard::start(&exe, container, me).ok());
        }
    };
    let admission = service.admit_then(
        &AdmitRequest {
            container,
            init: me,
            request: &request,
            bundle: Some(&bundle),
            policy,
            wait_for: service::wait_for(&request, config, None),
            waiter: me,
            // The engine cancels a create by killing this very process, which ends the wait (and
            // the guard drops the ticket).
            runtime: None,
            budget: None,
            pending: true,
            // Known only once the spec is edited; the hook records it when it confirms.
            enforcement: None,
            cgroup: None,
        },
        &mut start_guard,
    );
    drop(guard);
    match admission {
        Ok(Admission::Admitted {
            shares,
            gpus,
            placement,
            ..
        }) => Ok(Some(Reserved {
            shares,
            gpus,
            placement,
        })),
        Ok(Admission::Refused(refusal)) => Err(RuntimeError::Refused(refusal)),
        // A second create of the same container (a retry after a failed exec): the reservation
        // it already holds stands, and the hook confirms it.
        Ok(Admission::AlreadyAdmitted | Admission::Confirmed { .. }) => Ok(Some(Reserved {
            shares: Vec::new(),
            gpus: Vec::new(),
            placement: None,
        })),
        Err(e) => fail_open_or(config, container, e),
    }
}

/// vramgate's own state is broken: start unaccounted if the config says fail-open.
fn fail_open_or(config: &Config, container: &str, e: ServiceError) -> Result<Option<Reserved>, RuntimeError> {
    if e.is_state_error() && service::fails_open(config, container, &e) {
        return Ok(None);
    }
    Err(RuntimeError::Service(e))
}

/// Gives back what [`admit_at_create`] reserved, when the create cannot go on (the spec could
/// not be written). Best effort: a reservation left behind is reclaimed once this process is
/// gone anyway.
pub fn undo(container: &str, bundle: &Path, config: &Config) {
    let bundle = std::path::absolute(bundle).unwrap_or_else(|_| bundle.to_path_buf());
    // The reservation is in it, so it exists: never created here.
    if let Ok(Some(dir)) = StateDir::open_existing(&config.state_dir) {
        let inventory = inventory::NotNeeded;
        let service = Service::new(dir, &inventory, &SystemClock, &ProcLiveness, config);
        let _ = service.release(container, Some(&bundle), "create failed");
    }
}

/// The engine deletes a container: if it gave up on that container's create while the create
/// waited in the queue, its ticket is dropped now. containerd's CRI plugin does that when
/// kubelet's deadline passes during a queued StartContainer: the shim kills the waiting wrapper
/// (so the ticket's waiter is gone and no one behind it waits for it any more) and then runs
/// `delete --force` through this wrapper. Without this the dead ticket stays in the ledger, in
/// `status` and the metrics until some other transaction reclaims it.
///
/// Only a ticket whose waiter is gone is dropped (what any transaction's reclaim does), never a
/// live wait or a reservation: `delete` names no bundle, so it cannot tell a namesake in
/// another engine namespace apart. Every container an engine deletes comes through here, and
/// almost none ever waited: for a container the ledger does not name, the markers answer
/// (three `stat`s, see [`crate::ledger::marks`]) without reading the ledger or taking its lock;
/// one unlocked read where they cannot say; nothing when there is no state directory. The lock
/// is waited for at most [`DELETE_LOCK_TIMEOUT`]: this runs inside the engine's own delete.
/// Best effort: the next transaction reclaims what this misses.
pub fn drop_abandoned_wait(container: &str, config: &Config) {
    let Ok(Some(dir)) = StateDir::open_existing(&config.state_dir) else {
        return;
    };
    if dir.surely_not_held(container) {
        return;
    }
    let abandoned = dir.peek().is_ok_and(|peek| {
        peek.ledger()
            .queue
            .iter()
            .any(|t| t.container_id == container && ProcLiveness.life(&t.waiter) == Life::Gone)
    });
    if abandoned {
        let inventory = inventory::NotNeeded;
        let service = Service::new(dir, &inventory, &SystemClock, &ProcLiveness, config);
        let _ = service.gc_within(DELETE_LOCK_TIMEOUT);
    }
}

/// How long the wrapper's `delete` waits for the ledger's lock to drop an abandoned wait:
/// short, since the engine waits on the delete, and what it gives up on the next transaction
/// reclaims.
pub const DELETE_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Reserved {
    /// Each GPU reserved, with its total, as the enforcement tiers need them.
    pub fn placed_shares(&self) -> Vec<crate::enforce::PlacedShare> {
        self.shares
            .iter()
            .filter_map(|share| {
                let gpu = self.gpus.iter().find(|g| g.uuid == share.uuid)?;
                Some(crate::enforce::PlacedShare {
                    uuid: share.uuid.clone(),
                    index: gpu.index,
                    mig_index: gpu.mig_index,
                    bytes: share.bytes,
                    limit: share.limit_bytes(),
                    total: gpu.total,
                })
            })
            .collect()
    }
}
