//! The hook's own enforcement path, beside the wrapper's ([`crate::enforce::spec_edits`] and
//! [`crate::enforce::apply_spec_edits`] at `create`): what the OCI hook does to hold a container to its
//! reservation when it can no longer change the spec (runc has read it). Before anything is
//! reserved it refuses what would undo the reservation; once the container is placed, a
//! device rule that reaches GPUs it holds nothing on; at createRuntime it sets the driver limit
//! (`[enforce] limit = "driver"`), and at poststop clears it ([`crate::enforce::lifecycle`]).
//! A container the hook refuses after it was admitted gives its reservation back at once.
//! [`crate::hook`] only calls these in order and reports.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::device_rules::{self, DeviceRule};
use crate::enforce::driver_limit::{container_cgroup, whole_gpus, CGROUP_V2_ROOT};
use crate::enforce::{lifecycle, AppliedLimit, EnforceError, PlacedShare};
use crate::inventory::GpuMemory;
use crate::ledger::{GpuShare, StateDir};
use crate::request::{GpuSelection, Request};
use crate::service::{self, Service, ServiceError};
use crate::spec::SpecView;

/// What the hook alone refuses a container for, so that it cannot get around its reservation.
#[derive(Debug, thiserror::Error)]
pub enum HookOnlyError {
    #[error("container {container}: its device rule \"{rule}\" lets it open the nodes of GPUs it holds no reservation on (a container with CAP_MKNOD can make them); drop the rule or --privileged (name the devices it needs instead), reserve on every GPU it can reach, or start it through vramgate-runtime, which narrows a rule over NVIDIA's devices to the reserved GPUs")]
    DeviceRuleReachesOtherGpus { container: String, rule: String },
    #[error("container {container}: its device rule linux.resources.devices[{index}] {why}; runc would read it otherwise than vramgate, which must judge what the container can open: write the rule as the OCI spec spells it")]
    MisreadDeviceRule {
        container: String,
        index: usize,
        why: String,
    },
    #[error("container {container}: its env sets {variables}, which nvidia-container-toolkit's apply-cuda-memory-limits hook would apply as a second driver limit over vramgate's ([enforce] limit = \"driver\" sets it from the reservation); ask for the memory with VRAMGATE_MEMORY instead, or start the container through vramgate-runtime, which admits it on them and then removes them")]
    ToolkitConflict { container: String, variables: String },
    #[error("container {container}: cannot set its GPU memory limit ([enforce] limit = \"driver\"): {source}")]
    Enforce { container: String, source: EnforceError },
    /// Recording the tier in the ledger failed: the hook sorts it as it sorts the service's
    /// other errors (a broken state may fail open).
    #[error("{0}")]
    Service(#[from] ServiceError),
}

/// Whether `request` reserves on every GPU it could reach (`vramgate.dev/gpus=all`): then no
/// device rule reaches a GPU it holds nothing on.
fn holds_every_gpu(request: &Request) -> bool {
    request.gpus.selection == GpuSelection::All && request.gpus.within.is_none()
}

/// The checks made before anything is reserved or waited for. Under `driver` (`driver_limit`),
/// a container that sets the toolkit's limit variables is refused: NVIDIA's hook would set its
/// own limit later. The hook alone cannot narrow the spec (runc has read it): a rule that opens
/// every character device's nodes is refused unless the container reserves on every GPU.
pub fn refuse_before_admission(
    container: &str,
    spec: &SpecView,
    request: &Request,
    driver_limit: bool,
) -> Result<(), HookOnlyError> {
    if driver_limit {
        if let Some(conflict) = crate::enforce::toolkit::conflicting_request(spec.env_entries()) {
            return Err(HookOnlyError::ToolkitConflict {
                container: container.to_string(),
                variables: conflict,
            });
        }
    }
    if !holds_every_gpu(request) {
        if let Some((index, why)) = device_rules::misread_rule(spec.device_rules()) {
            return Err(HookOnlyError::MisreadDeviceRule {
                container: container.to_string(),
                index,
                why,
            });
        }
        // Any allow rule of type `a` is every device to runc, whatever its numbers.
        let every = spec
            .device_rules()
            .iter()
            .map(DeviceRule)
            .find(DeviceRule::opens_every_char_major);
        if let Some(rule) = every {
            return Err(HookOnlyError::DeviceRuleReachesOtherGpus {
                container: container.to_string(),
                rule: rule.describe(),
            });
        }
    }
    Ok(())
}

/// Once admitted on `gpus`: a device rule that opens the nodes of GPUs it holds nothing on,
/// which the hook cannot narrow as the wrapper does, refuses the container, and its
/// reservation goes back now.
pub fn refuse_reaching(
    service: &Service,
    container: &str,
    bundle: &Path,
    spec: &SpecView,
    request: &Request,
    gpus: &[GpuMemory],
) -> Result<(), HookOnlyError> {
    if holds_every_gpu(request) {
        return Ok(());
    }
    let minors: Vec<u32> = gpus.iter().filter_map(|g| g.minor).collect();
    let host = device_rules::HostPaths::default();
    // The MIG capabilities it keeps: its MIG devices' and the host-wide ones, as the wrapper
    // keeps them when it narrows.
    let caps = host
        .char_major(crate::inventory::mig_caps::NVIDIA_CAPS_DRIVER)
        .map(|major| {
            let host_wide = crate::inventory::mig_caps::MigMinors::read().host_wide_minors();
            let minors = gpus.iter().flat_map(|g| g.mig_caps.iter().copied()).chain(host_wide);
            (major, minors.map(u64::from).collect())
        });
    let kept = device_rules::Kept {
        gpu_minors: &minors,
        caps,
        host: &host,
    };
    let Some(rule) = device_rules::reaching_other_gpus(spec.device_rules(), &kept) else {
        return Ok(());
    };
    let _ = service.release(container, Some(bundle), "a device rule reaches other GPUs");
    Err(HookOnlyError::DeviceRuleReachesOtherGpus {
        container: container.to_string(),
        rule: rule.describe(),
    })
}

/// `[enforce] limit = "driver"`: the container's cgroup gets its reservation as the driver's
/// limit on each GPU, now that its init exists, and the ledger records the tier (an `enforce`
/// event says where). A failure refuses the container and gives its reservation back, unless
/// the config says fail-open (then it starts without the limit, and the event log says why).
pub fn driver_limit(
    service: &Service,
    container: &str,
    bundle: &Path,
    runtime_root: impl FnOnce() -> Option<PathBuf>,
    init_pid: u32,
    shares: &[GpuShare],
    config: &Config,
) -> Result<(), HookOnlyError> {
    let library = Path::new(&config.inventory.nvml_library);
    let set = set_driver_limit(
        service.state_dir(),
        library,
        container,
        bundle,
        runtime_root,
        init_pid,
        shares,
    );
    match set {
        Ok(applied) if applied.is_empty() => Ok(()),
        Ok(applied) => {
            service.set_enforcement(
                container,
                Some(bundle),
                crate::enforce::Tier::DriverLimit,
                &describe(&applied),
            )?;
            Ok(())
        }
        Err(source) => {
            let e = HookOnlyError::Enforce {
                container: container.to_string(),
                source,
            };
            if service::fails_open(config, container, &e) {
                return Ok(());
            }
            // Refused: the memory it reserved goes back now, not when a reclaim finds its
            // init gone.
            let _ = service.release(container, Some(bundle), "driver limit not set");
            Err(e)
        }
    }
}

/// Sets the driver limit on the cgroup of `init_pid` for each whole GPU of `shares`, recorded
/// first in `dir` for the clear at delete or poststop ([`lifecycle::set_and_record`]).
/// `runtime_root` is asked only when a limit is to be set. Empty: nothing to set (MIG only).
fn set_driver_limit(
    dir: &StateDir,
    nvml_library: &Path,
    container: &str,
    bundle: &Path,
    runtime_root: impl FnOnce() -> Option<PathBuf>,
    init_pid: u32,
    shares: &[GpuShare],
) -> Result<Vec<AppliedLimit>, EnforceError> {
    let placed: Vec<PlacedShare> = shares
        .iter()
        .map(|s| PlacedShare {
            uuid: s.uuid.clone(),
            index: 0,
            // The driver takes no MIG handle; a MIG device's memory is its own already.
            mig_index: s.uuid.starts_with("MIG-").then_some(0),
            bytes: s.bytes,
            limit: s.limit_bytes(),
            total: 0,
        })
        .collect();
    let gpus: Vec<String> = whole_gpus(&placed).iter().map(|s| s.uuid.clone()).collect();
    if gpus.is_empty() {
        return Ok(Vec::new());
    }
    let record = lifecycle::LimitRecord {
        container_id: container.to_string(),
        // What the wrapper's `delete` finds the record by: the root of the runtime that
        // runs this hook, its parent.
        runtime_root: runtime_root(),
        bundle: Some(bundle.to_path_buf()),
        cgroup: container_cgroup(init_pid, Path::new("/proc"), Path::new(CGROUP_V2_ROOT))?,
        gpus,
    };
    lifecycle::set_and_record(dir, nvml_library, &record, &placed)
}

/// The `enforce` event's detail for the limits [`set_driver_limit`] set.
fn describe(applied: &[AppliedLimit]) -> String {
    applied
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
        .join("; ")
}

/// Poststop: clears the driver limit this container's createRuntime recorded, if any (see
/// [`lifecycle`]: under the wrapper, its `delete` cleared it already and removed the record).
/// runc has removed the cgroup by now, so this is the best the hook alone can do. A failure is
/// in the event log and never fails the stop: the container is gone either way, and a failing
/// poststop would fail the runtime's `delete`.
pub fn end_driver_limit(
    dir: &StateDir,
    nvml_library: &Path,
    runtime_root: Option<&Path>,
    container: &str,
    bundle: &Path,
) {
    let _ = lifecycle::end_driver_limit(
        dir,
        nvml_library,
        runtime_root,
        container,
        Some(bundle),
        lifecycle::EndedBy::Poststop,
    );
}
