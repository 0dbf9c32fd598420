//! The OCI hook: the adapter between a runtime's hook stages and the reservation service.
//!
//! It reads what the runtime hands over (the OCI state on stdin, the bundle's spec), turns it
//! into a request, calls [`crate::service::Service`], and turns the outcome into an exit code
//! and one line on stderr. Everything here runs as root on every container start of the
//! host, so the common paths are short: a container with no request costs one read of its
//! spec and no lock at all; an admission or release is one locked transaction.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::SystemClock;
use crate::config::{Config, ConfigError, LimitMechanism};
pub mod hook_only;

use crate::inventory::{self, InventoryError};
use crate::ledger::{LedgerError, StateDir};
use crate::procfs::{ProcLiveness, ProcessIdentity};
use crate::request::{self, Request, RequestError};
use crate::service::{self, Admission, AdmitRequest, Refusal, Service, ServiceError};
use crate::spec::{ContainerState, SpecError, SpecView};
use hook_only::HookOnlyError;

/// The margin is set beside the hook timeout the wrapper writes; the hook keeps to it.
pub use crate::runtime::spec_edit::HOOK_TIMEOUT_MARGIN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// runc, crun and youki run `createRuntime` after the container's namespaces exist, with
    /// the init pid in the state (runc reports status "creating", crun "created").
    CreateRuntime,
    /// The legacy stage podman and CRI-O's hooks.d use; same moment, same state.
    Prestart,
    CreateContainer,
    Poststop,
}

impl Stage {
    pub fn parse(name: &str) -> Option<Stage> {
        Some(match name {
            "createRuntime" => Stage::CreateRuntime,
            "prestart" => Stage::Prestart,
            "createContainer" => Stage::CreateContainer,
            "poststop" => Stage::Poststop,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("container {container}: {source}")]
    Request { container: String, source: RequestError },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    #[error("container {container}: the runtime passed no init pid in the OCI state (status {stage:?}); run the vramgate hook at createRuntime or prestart")]
    NoPid { container: String, stage: String },
    #[error("container {container}: its init process {pid} is already gone")]
    InitGone { container: String, pid: u32 },
    /// The request was decided and refused; the refusal's line is the whole story.
    #[error("{0}")]
    Refused(Refusal),
    /// A failed attempt whose queue ticket could not be removed: refused, never failed open.
    #[error("{0}")]
    TicketStands(ServiceError),
    /// Refused by the hook's own enforcement ([`hook_only`]).
    #[error("{0}")]
    HookOnly(HookOnlyError),
}

impl From<ServiceError> for HookError {
    fn from(e: ServiceError) -> HookError {
        match e {
            ServiceError::Ledger(e) => HookError::Ledger(e),
            ServiceError::Inventory(e) => HookError::Inventory(e),
            ServiceError::Request { container, source } => HookError::Request { container, source },
            e @ ServiceError::TicketStands { .. } => HookError::TicketStands(e),
        }
    }
}

impl From<HookOnlyError> for HookError {
    fn from(e: HookOnlyError) -> HookError {
        match e {
            HookOnlyError::Service(e) => e.into(),
            e => HookError::HookOnly(e),
        }
    }
}

impl HookError {
    /// Errors about vramgate's own state, where `on_state_error = "fail-open"` may let the
    /// container start anyway. The user's own mistakes are always refused.
    fn is_state_error(&self) -> bool {
        matches!(self, HookError::Inventory(_) | HookError::Ledger(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    NoRequest,
    Admitted {
        waited: Duration,
    },
    AlreadyAdmitted,
    /// The reservation `vramgate-runtime` made at create is bound to this container's init.
    Confirmed,
    Released {
        found: bool,
    },
    /// Admitted without accounting because vramgate's state is broken and config says fail-open.
    FailedOpen(String),
}

#[derive(Debug, Clone)]
pub struct HookOptions {
    /// The timeout the runtime gives this hook, when the hook entry says so (`--hook-timeout`).
    pub hook_timeout: Option<Duration>,
    /// The config file to read (the binary takes it from `$VRAMGATE_CONFIG`).
    pub config_path: PathBuf,
}

/// Runs one hook invocation: `state_json` is what the runtime wrote on stdin.
pub fn run(stage: Stage, state_json: impl std::io::Read, options: &HookOptions) -> Result<Outcome, HookError> {
    let state = ContainerState::read_from(state_json)?;
    match stage {
        Stage::Poststop => {
            let config = Config::load_from(&options.config_path)?;
            let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
                forgo_driver_limit();
                return Ok(Outcome::Released { found: false });
            };
            // Before the capability goes: clearing the driver limit needs it, as setting did.
            let library = Path::new(&config.inventory.nvml_library);
            hook_only::end_driver_limit(&dir, library, runtime_root().as_deref(), &state.id, &state.bundle);
            forgo_driver_limit();
            release(&state, dir, &config)
        }
        _ => {
            let spec = SpecView::read_bundle(&state.bundle)?;
            if !request::has_request(&spec) {
                forgo_driver_limit();
                if request::pod_memory_annotation_not_taken(&spec, Default::default()).is_some() {
                    // A config that cannot be read stops no start that has no request.
                    match Config::load_from(&options.config_path) {
                        Ok(config) => tell_the_pod(&spec, &config, &state.id),
                        Err(e) => eprintln!("vramgate-hook: container {}: no notice for the pod: {e}", state.id),
                    }
                }
                return Ok(Outcome::NoRequest);
            }
            // Read only for a container with a request: the claim devices are checked against
            // the DRA driver's spec files in its cdi_spec_dirs.
            let config = Config::load_from(&options.config_path)?;
            let request =
                Request::from_spec_on_node(&spec, &config.enforce.cdi_spec_dirs, config.runtime.nvidia_toolkit())
                    .map_err(|source| HookError::Request {
                        container: state.id.clone(),
                        source,
                    })?;
            let Some(request) = request else {
                forgo_driver_limit();
                tell_the_pod(&spec, &config, &state.id);
                return Ok(Outcome::NoRequest);
            };
            if config.enforce.limit != LimitMechanism::Driver {
                forgo_driver_limit();
            }
            // What vramgate-runtime wrote into the spec about holding the container to its
            // reservation (absent when only the hook runs).
            let enforcement = spec
                .annotations
                .get(ENFORCEMENT_ANNOTATION)
                .and_then(|t| serde_json::from_value(serde_json::Value::String(t.clone())).ok());
            let outcome = match admit(&state, &spec, &request, enforcement, &config, options) {
                Err(e) if e.is_state_error() && service::fails_open(&config, &state.id, &e) => {
                    Ok(Outcome::FailedOpen(e.to_string()))
                }
                other => other,
            };
            forgo_driver_limit();
            outcome
        }
    }
}

/// A pod's container given no GPU under the pod's memory annotation: the notice for the pod's
/// events ([`crate::pod_notice`]), at the stage that would have admitted it. One that cannot be
/// left is said on stderr (the runtime's log); the container starts as it would have.
fn tell_the_pod(spec: &SpecView, config: &Config, container: &str) {
    if let Err(e) = crate::pod_notice::leave_if_unreserved(spec, config) {
        eprintln!("vramgate-hook: container {container}: cannot leave the pod a notice: {e}");
    }
}

/// Gives up the capability the driver limit needs, once the hook knows it sets none (or has
/// set it): see [`crate::privilege`]. Dropping a capability cannot fail for a lack of one,
/// and a process that never held it has nothing to drop, so the result says nothing worth
/// stopping a container for.
fn forgo_driver_limit() {
    let _ = crate::privilege::forgo_driver_limit();
}

/// The `--root` of the runtime that runs this hook (its parent): what the driver limit's
/// record is keyed by, as the wrapper's `delete` sees it.
fn runtime_root() -> Option<PathBuf> {
    crate::runtime::argv::runtime_root_of(nix::unistd::getppid().as_raw() as u32)
}

/// Releases the container's reservation (and any ticket it still holds). Idempotent, and a
/// container vramgate never saw is no error. Decided from the ledger, not from the bundle's
/// spec: a spec rewritten after create must not leave a reservation behind.
fn release(state: &ContainerState, dir: StateDir, config: &Config) -> Result<Outcome, HookError> {
    // Releasing needs no GPU numbers: the inventory is never opened here.
    let inventory = inventory::NotNeeded;
    let service = Service::new(dir, &inventory, &SystemClock, &ProcLiveness, config);
    let released = service.release(&state.id, Some(&state.bundle), "poststop")?;
    Ok(Outcome::Released {
        found: released.reservation.is_some(),
    })
}

pub use crate::tier::ENFORCEMENT_ANNOTATION;

fn admit(
    state: &ContainerState,
    spec: &SpecView,
    request: &Request,
    enforcement: Option<crate::enforce::Tier>,
    config: &Config,
    options: &HookOptions,
) -> Result<Outcome, HookError> {
    let container = state.id.as_str();
    let pid = state.init_pid().ok_or_else(|| HookError::NoPid {
        container: container.to_string(),
        stage: state.status.clone(),
    })?;
    let init = ProcessIdentity::of(pid).ok_or(HookError::InitGone {
        container: container.to_string(),
        pid,
    })?;
    // The container's own cgroup, recorded with its reservation: what its GPU processes are
    // found by, in whatever pid namespace (runc has put the init in it before any hook runs).
    let cgroup = crate::procfs::cgroups(pid).and_then(|text| crate::procfs::own_cgroup(&text));
    let waiter = ProcessIdentity::current().ok_or(HookError::InitGone {
        container: container.to_string(),
        pid: std::process::id(),
    })?;
    // The runtime runs hooks as its children: `runc create` is our parent. If the engine
    // cancels the start and kills it, a waiting hook gives its place up.
    let runtime = ProcessIdentity::of(nix::unistd::getppid().as_raw() as u32).filter(|p| p.pid > 1);
    // The runtime kills a hook at its timeout; answering before that, with vramgate's own
    // message, is what the margin is for. Every wait (queue and lock) counts against it.
    let budget = options.hook_timeout.map(|t| t.saturating_sub(HOOK_TIMEOUT_MARGIN));
    let wait_for = service::wait_for(request, config, budget);
    let driver = config.enforce.limit == LimitMechanism::Driver;
    hook_only::refuse_before_admission(container, spec, request, driver)?;
    let dir = StateDir::open_or_create(&config.state_dir)?;
    let inventory = inventory::OpenOnUse::new(config);
    let service = Service::new(dir, &inventory, &SystemClock, &ProcLiveness, config);
    let admission = service.admit(&AdmitRequest {
        container,
        init,
        request,
        bundle: Some(&state.bundle),
        policy: request.policy.unwrap_or(config.policy),
        wait_for,
        waiter,
        runtime,
        budget,
        pending: false,
        enforcement,
        cgroup: cgroup.as_deref(),
    })?;
    let hold = |shares: &[crate::ledger::GpuShare]| {
        if !driver {
            return Ok(());
        }
        hook_only::driver_limit(
            &service,
            container,
            &state.bundle,
            runtime_root,
            init.pid,
            shares,
            config,
        )
    };
    match admission {
        // Admitted here (the hook alone, podman's and CRI-O's hooks.d) or by vramgate-runtime at
        // create and now bound to the init: either way the driver limit is set now, when the
        // init exists in its cgroup and has run nothing yet.
        Admission::Admitted {
            waited, shares, gpus, ..
        } => {
            hook_only::refuse_reaching(&service, container, &state.bundle, spec, request, &gpus)?;
            hold(&shares)?;
            Ok(Outcome::Admitted { waited })
        }
        Admission::Confirmed { shares } => {
            hold(&shares)?;
            Ok(Outcome::Confirmed)
        }
        Admission::AlreadyAdmitted => Ok(Outcome::AlreadyAdmitted),
        Admission::Refused(refusal) => Err(HookError::Refused(refusal)),
    }
}
