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
use crate::config::{Config, ConfigError, LimitMechanism, OnStateError};
use crate::enforce::driver_limit::{container_cgroup, whole_gpus, CGROUP_V2_ROOT};
use crate::enforce::lifecycle;
use crate::inventory::{self, InventoryError};
use crate::ledger::{LedgerError, StateDir};
use crate::procfs::{ProcLiveness, ProcessIdentity};
use crate::request::{self, Request, RequestError};
use crate::service::{self, Admission, AdmitRequest, Refusal, Service, ServiceError};
use crate::spec::{ContainerState, SpecError, SpecView};

/// Time kept between the end of the longest wait and the runtime's hook timeout, so the hook
/// always answers with a clear refusal before the runtime kills it.
pub const HOOK_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

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
    #[error("container {container}: cannot set its GPU memory limit ([enforce] limit = \"driver\"): {source}")]
    Enforce {
        container: String,
        source: crate::enforce::EnforceError,
    },
    #[error("container {container}: its device rule \"{rule}\" lets it open the nodes of GPUs it holds no reservation on (a container with CAP_MKNOD can make them); drop the rule or --privileged (name the devices it needs instead), reserve on every GPU it can reach, or start it through vramgate-runtime, which narrows a rule over NVIDIA's devices to the reserved GPUs")]
    DeviceRuleReachesOtherGpus { container: String, rule: String },
    #[error("container {container}: its env sets {variables}, which nvidia-container-toolkit's apply-cuda-memory-limits hook would apply as a second driver limit over vramgate's ([enforce] limit = \"driver\" sets it from the reservation); ask for the memory with VRAMGATE_MEMORY instead, or start the container through vramgate-runtime, which admits it on them and then removes them")]
    ToolkitConflict { container: String, variables: String },
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
            end_driver_limit(&state, &dir, &config);
            forgo_driver_limit();
            release(&state, dir, &config)
        }
        _ => {
            let spec = SpecView::read_bundle(&state.bundle)?;
            if !request::has_request(&spec) {
                forgo_driver_limit();
                return Ok(Outcome::NoRequest);
            }
            let request = Request::from_spec(&spec).map_err(|source| HookError::Request {
                container: state.id.clone(),
                source,
            })?;
            let Some(request) = request else {
                forgo_driver_limit();
                return Ok(Outcome::NoRequest);
            };
            let config = Config::load_from(&options.config_path)?;
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
                Err(e) if e.is_state_error() && config.on_state_error == OnStateError::FailOpen => {
                    let message = e.to_string();
                    service::log_fail_open(&config, &SystemClock, &state.id, &message);
                    Ok(Outcome::FailedOpen(message))
                }
                other => other,
            };
            forgo_driver_limit();
            outcome
        }
    }
}

/// Gives up the capability the driver limit needs, once the hook knows it sets none (or has
/// set it): see [`crate::privilege`]. Dropping a capability cannot fail for a lack of one,
/// and a process that never held it has nothing to drop, so the result says nothing worth
/// stopping a container for.
fn forgo_driver_limit() {
    let _ = crate::privilege::forgo_driver_limit();
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

/// Poststop: clears the driver limit this container's createRuntime recorded, if any (see
/// [`crate::enforce::lifecycle`]: under the wrapper, its `delete` cleared it already and
/// removed the record). runc has removed the cgroup by now, so this is the best the hook
/// alone can do. A failure is in the event log and never fails the stop: the container is
/// gone either way, and a failing poststop would fail the runtime's `delete`.
fn end_driver_limit(state: &ContainerState, dir: &StateDir, config: &Config) {
    let runtime_root = crate::runtime::argv::runtime_root_of(nix::unistd::getppid().as_raw() as u32);
    let _ = lifecycle::end_driver_limit(
        dir,
        Path::new(&config.inventory.nvml_library),
        runtime_root.as_deref(),
        &state.id,
        Some(&state.bundle),
        lifecycle::EndedBy::Poststop,
    );
}

/// Where vramgate-runtime records, in the spec, what holds the container to its reservation
/// ([`crate::enforce::Tier`]); the hook records it in the ledger when it confirms.
pub const ENFORCEMENT_ANNOTATION: &str = "vramgate.dev/enforcement";

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
    if driver {
        // Refused before anything is reserved: NVIDIA's hook would set its own limit later.
        if let Some(conflict) = crate::enforce::toolkit::conflicting_request(spec.env_entries()) {
            return Err(HookError::ToolkitConflict {
                container: container.to_string(),
                variables: conflict,
            });
        }
    }
    // The hook alone cannot narrow the spec (runc has read it): a rule that opens other GPUs'
    // nodes is refused, one over every device before anything is reserved or waited for.
    // `vramgate.dev/gpus=all` reserves on every GPU it could reach.
    let holds_every_gpu = request.gpus.selection == request::GpuSelection::All && request.gpus.within.is_none();
    let reaching = |kept: &[u32]| {
        let rule = crate::device_rules::reaching_other_gpus(spec.device_rules(), kept)?;
        Some(HookError::DeviceRuleReachesOtherGpus {
            container: container.to_string(),
            rule: rule.describe(),
        })
    };
    if !holds_every_gpu {
        let every = spec
            .device_rules()
            .iter()
            .map(crate::device_rules::DeviceRule)
            .find(crate::device_rules::DeviceRule::opens_every_char_major);
        if let Some(rule) = every {
            return Err(HookError::DeviceRuleReachesOtherGpus {
                container: container.to_string(),
                rule: rule.describe(),
            });
        }
    }
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
    })?;
    match admission {
        // Admitted here (the hook alone, podman's and CRI-O's hooks.d) or by vramgate-runtime at
        // create and now bound to the init: either way the driver limit is set now, when the
        // init exists in its cgroup and has run nothing yet.
        Admission::Admitted {
            waited, shares, gpus, ..
        } => {
            let kept: Vec<u32> = gpus.iter().filter_map(|g| g.minor).collect();
            if let Some(e) = reaching(&kept).filter(|_| !holds_every_gpu) {
                let _ = service.release(container, Some(&state.bundle), "a device rule reaches other GPUs");
                return Err(e);
            }
            if driver {
                driver_limit(&service, state, init.pid, &shares, config)?;
            }
            Ok(Outcome::Admitted { waited })
        }
        Admission::Confirmed { shares } => {
            if driver {
                driver_limit(&service, state, init.pid, &shares, config)?;
            }
            Ok(Outcome::Confirmed)
        }
        Admission::AlreadyAdmitted => Ok(Outcome::AlreadyAdmitted),
        Admission::Refused(refusal) => Err(HookError::Refused(refusal)),
    }
}

/// `[enforce] limit = "driver"`: the container's cgroup gets its reservation as the driver's
/// limit on each GPU, now that its init exists, and the ledger records the tier (an `enforce`
/// event says where). A failure refuses the container and gives its reservation back, unless
/// the config says fail-open (then it starts without the limit, and the event log says why).
fn driver_limit(
    service: &Service,
    state: &ContainerState,
    init_pid: u32,
    shares: &[crate::ledger::GpuShare],
    config: &Config,
) -> Result<(), HookError> {
    let placed: Vec<crate::enforce::PlacedShare> = shares
        .iter()
        .map(|s| crate::enforce::PlacedShare {
            uuid: s.uuid.clone(),
            index: 0,
            // The driver takes no MIG handle; a MIG device's memory is its own already.
            mig_index: s.uuid.starts_with("MIG-").then_some(0),
            bytes: s.bytes,
            limit: s.limit_bytes(),
            total: 0,
        })
        .collect();
    let library = Path::new(&config.inventory.nvml_library);
    let set = || -> Result<Vec<crate::enforce::AppliedLimit>, crate::enforce::EnforceError> {
        let gpus: Vec<String> = whole_gpus(&placed).iter().map(|s| s.uuid.clone()).collect();
        if gpus.is_empty() {
            return Ok(Vec::new());
        }
        let record = lifecycle::LimitRecord {
            container_id: state.id.clone(),
            // What the wrapper's `delete` finds the record by: the root of the runtime that
            // runs this hook, its parent.
            runtime_root: crate::runtime::argv::runtime_root_of(nix::unistd::getppid().as_raw() as u32),
            bundle: Some(state.bundle.clone()),
            cgroup: container_cgroup(init_pid, Path::new("/proc"), Path::new(CGROUP_V2_ROOT))?,
            gpus,
        };
        lifecycle::set_and_record(service.state_dir(), library, &record, &placed)
    };
    match set() {
        Ok(applied) if applied.is_empty() => Ok(()),
        Ok(applied) => {
            let detail = applied
                .iter()
                .map(|a| {
                    format!(
                        "driver limit {} bytes on {} for cgroup {}",
                        a.hard,
                        a.uuid,
                        a.cgroup.display()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            service.set_enforcement(
                &state.id,
                Some(&state.bundle),
                crate::enforce::Tier::DriverLimit,
                &detail,
            )?;
            Ok(())
        }
        Err(source) => {
            let e = HookError::Enforce {
                container: state.id.clone(),
                source,
            };
            if config.on_state_error == OnStateError::FailOpen {
                service::log_fail_open(config, &SystemClock, &state.id, &e.to_string());
                return Ok(());
            }
            // Refused: the memory it reserved goes back now, not when a reclaim finds its
            // init gone.
            let _ = service.release(&state.id, Some(&state.bundle), "driver limit not set");
            Err(e)
        }
    }
}
