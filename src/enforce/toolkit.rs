//! The hand-off to the NVIDIA container toolkit (`[enforce] limit = "toolkit"`).
//!
//! nvidia-container-toolkit's CDI hook `nvidia-cdi-hook apply-cuda-memory-limits`
//! (NVIDIA/nvidia-container-toolkit pull request 2075, cmd/nvidia-cdi-hook/apply-cuda-memory-limits)
//! reads `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` from the container spec, both
//! whole MiB and both required, and calls `nvmlDeviceSetMemoryLimits_v1` with soft = request,
//! hard = limit on every GPU of the container, on the cgroup of its init. It applies one pair
//! to all of the container's GPUs, does nothing when either variable is missing, and fails the
//! start when request > limit.
//!
//! The hook reads the spec, not the running process, so a container cannot lift the limit
//! from inside: vramgate's values replace any the container set.

use super::{driver_limit::SOFT_LIMIT, PlacedShare, SpecEdits, Tier, MIB};

pub const LIMIT_VAR: &str = crate::request::NVIDIA_LIMIT_ENV;
pub const REQUEST_VAR: &str = crate::request::NVIDIA_REQUEST_ENV;

/// The toolkit variables a container's own env sets (`None` when neither), named for a
/// message. They are a request ([`crate::request::nvidia_memory`]) and the container is
/// admitted on them; but under `limit = "driver"` vramgate sets the driver limit itself, and
/// the toolkit's hook, finding them, would set a second one on the same cgroup after it: the
/// wrapper removes them once it has admitted the container ([`super::spec_edits`]; it writes
/// the amount into the spec as `vramgate.dev/memory` for the hook), the hook alone, which
/// cannot edit the spec, refuses the container. Either variable counts: a later toolkit may
/// need only one.
pub fn conflicting_request(existing_env: &[String]) -> Option<String> {
    let set: Vec<&str> = [REQUEST_VAR, LIMIT_VAR]
        .into_iter()
        .filter(|v| super::env_has(existing_env, v))
        .collect();
    (!set.is_empty()).then(|| set.join(" and "))
}

/// The two variables for the toolkit's hook, or a note when they cannot apply. Returns the
/// tier it gives.
pub fn edits(placed: &[PlacedShare], edits: &mut SpecEdits) -> Option<Tier> {
    // The driver refuses MIG handles, and the toolkit's hook fails the container's start when
    // the driver refuses: a MIG container gets no variables rather than no start.
    if let Some(mig) = placed.iter().find(|s| s.mig_index.is_some()) {
        edits.notes.push(format!(
            "vramgate: no toolkit memory limit for this container: {} is a MIG device, which the driver's memory limits do not support",
            mig.uuid
        ));
        return None;
    }
    // One value for all GPUs: the smallest limit, rounded down to whole MiB, so that no GPU's
    // limit exceeds what was allowed on it; the request likewise, none (0) where no limit is
    // above it, as the driver tier sets it (PlacedShare::soft).
    let limit_mib = placed.iter().map(|s| s.hard() / MIB).min()?;
    let request_mib = placed.iter().map(|s| s.soft() / MIB).min().unwrap_or(SOFT_LIMIT / MIB);
    edits.env.push((REQUEST_VAR.to_string(), request_mib.to_string()));
    edits.env.push((LIMIT_VAR.to_string(), limit_mib.to_string()));
    Some(Tier::ToolkitLimit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::{spec_edits, EnforceConfig, LimitMechanism};

    fn share(index: u32, bytes: u64) -> PlacedShare {
        PlacedShare {
            uuid: format!("GPU-{index}"),
            index,
            mig_index: None,
            bytes,
            limit: bytes,
            total: 80 << 30,
        }
    }

    fn toolkit() -> EnforceConfig {
        EnforceConfig {
            limit: LimitMechanism::Toolkit,
            ..EnforceConfig::default()
        }
    }

    #[test]
    fn limit_in_whole_mib_the_smallest_share_and_the_containers_value_replaced() {
        let existing = ["NVIDIA_GPU_MEMORY_LIMIT=999999".to_string()];
        let edits = spec_edits(
            &toolkit(),
            &existing,
            &[share(0, (6 << 30) + 5), share(1, (4 << 30) + MIB - 1)],
            false,
        );
        assert_eq!(edits.tier, Tier::ToolkitLimit);
        let get = |k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get(LIMIT_VAR), Some("4096"));
        assert_eq!(get(REQUEST_VAR), Some("0"));
        assert!(edits.mounts.is_empty());
    }

    /// A limit above the request: the toolkit's hook gets the request as its soft value and
    /// the limit as its hard one, in whole MiB rounded down.
    #[test]
    fn a_limit_above_the_request_is_the_hard_value_and_the_request_the_soft() {
        let mut placed = share(0, 2 << 30);
        placed.limit = (6 << 30) + MIB - 1;
        let edits = spec_edits(&toolkit(), &[], &[placed], false);
        let get = |k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((get(REQUEST_VAR), get(LIMIT_VAR)), (Some("2048"), Some("6144")));
    }

    #[test]
    fn mig_devices_get_no_toolkit_limit() {
        let mut mig = share(0, 1 << 30);
        mig.mig_index = Some(1);
        mig.uuid = "MIG-abc".into();
        let edits = spec_edits(&toolkit(), &[], &[mig], false);
        assert_eq!(edits.tier, Tier::Guardrails);
        assert!(edits.env.iter().all(|(k, _)| k != LIMIT_VAR && k != REQUEST_VAR));
        assert_eq!(edits.notes.len(), 1);
        assert!(edits.notes[0].contains("MIG-abc"), "{:?}", edits.notes);
    }
}
