//! Enforcement: what keeps an admitted container within its reservation once it runs.
//!
//! Admission keeps the sum of reservations within each GPU, but a container that allocates
//! more than it reserved still takes memory its neighbours were promised. One hard limit per
//! host (`[enforce] limit`, so two mechanisms never act on one container), plus framework
//! guardrails that are on by default:
//!
//! | tier | who sets it | where it acts |
//! | --- | --- | --- |
//! | [`Tier::DriverLimit`] | the hook, at createRuntime ([`driver_limit`]) | the driver, per cgroup v2 (R615+) |
//! | [`Tier::ToolkitLimit`] | the wrapper writes env ([`toolkit`]) | the NVIDIA toolkit's CDI hook, with the same driver call |
//! | [`Tier::MpsLimit`] | the wrapper writes env and mounts ([`mps`]) | the MPS server, per client |
//! | [`Tier::Guardrails`] | the wrapper writes env ([`guardrails`]) | TensorFlow and JAX allocators, in the container |
//!
//! The wrapper calls [`spec_edits`] (pure) and [`apply_spec_edits`] (the JSON tree) at
//! `create`, once the container is placed; the hook ([`crate::hook::hook_only`]) sets the driver limit at
//! createRuntime when the limit is `driver`, and the limit is cleared when the container ends
//! ([`lifecycle`]).
//!
//! One limit per cgroup, whatever the node's toolkit has. Under `toolkit`, vramgate makes no
//! NVML call: NVIDIA's `apply-cuda-memory-limits` CDI hook applies the values the wrapper
//! writes, and the tier is [`Tier::ToolkitLimit`] only where a CDI spec of the node carries that
//! hook ([`toolkit::hook_on_node`]; otherwise the container starts with the guardrails and a
//! note). Under `driver`, vramgate keeps its own call even where the node's spec carries the
//! hook, and takes the hook's variables away (the wrapper removes them, the hook alone refuses
//! a container that sets them): vramgate's call is the one whose outcome it sees, records and
//! clears when the container ends, which the toolkit's hook does not; handing the limit to the
//! toolkit is what `toolkit` is for. `vramgate doctor` says which applies on the host.

pub mod apply;
pub mod driver_limit;
pub mod guardrails;
pub mod lifecycle;
pub mod mps;
pub mod toolkit;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::config::{EnforceConfig, LimitMechanism, MpsDeviceKey};
pub use crate::tier::Tier;
pub use apply::apply_spec_edits;
pub use driver_limit::{apply_driver_limit, driver_limit_available, AppliedLimit, Availability};
pub use mps::mps_control_running;

/// One GPU (or MIG device) a container was placed on, with what it reserved there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedShare {
    pub uuid: String,
    /// The GPU's host index (a MIG device's parent's).
    pub index: u32,
    pub mig_index: Option<u32>,
    /// The reservation on this GPU: the request.
    pub bytes: u64,
    /// What the container may use at most on this GPU: `bytes` when it asked for no more
    /// (0, where an older wrapper wrote none, reads as `bytes`: see [`PlacedShare::hard`]).
    #[serde(default)]
    pub limit: u64,
    /// The GPU's (or MIG device's) total memory.
    pub total: u64,
}

impl PlacedShare {
    /// The most the container may use on this GPU: its limit, never below its request.
    pub fn hard(&self) -> u64 {
        self.limit.max(self.bytes)
    }

    /// The guarantee the driver limit and the toolkit's hook set: the request where a limit is
    /// above it, else none ([`driver_limit::SOFT_LIMIT`], whose docs say why none is the rule).
    pub fn soft(&self) -> u64 {
        if self.hard() > self.bytes {
            self.bytes
        } else {
            driver_limit::SOFT_LIMIT
        }
    }
}

/// What the wrapper adds to a container's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecEdits {
    /// Variables to set in `process.env`, replacing an entry of the same name.
    pub env: Vec<(String, String)>,
    /// Variables to remove from `process.env` (every entry of that name).
    pub unset: Vec<String>,
    /// OCI mount objects to append to `mounts`.
    pub mounts: Vec<serde_json::Value>,
    /// What the spec gives the container. For `limit = "driver"` this is the tier without the
    /// driver limit (the hook sets that later): the hook reports [`Tier::DriverLimit`] when
    /// [`apply_driver_limit`] succeeds.
    pub tier: Tier,
    /// Why the configured limit does not apply to this container (no MPS daemon, a MIG
    /// device), one line each, for the wrapper's log: the container still starts.
    pub notes: Vec<String>,
}

pub const MIB: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("the container spec has {field:?} of JSON type {found}, not {expected}; fix the engine that wrote it")]
    SpecShape {
        field: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("cannot load the NVIDIA management library {library:?} for the driver memory limit: {message}")]
    LoadLibrary { library: PathBuf, message: String },
    #[error("{library:?} does not export {symbol}: the driver memory limit needs NVIDIA driver R615 or later (CUDA 13.4); set [enforce] limit to \"mps\" or \"none\" on this host")]
    MissingSymbol { library: PathBuf, symbol: &'static str },
    #[error("{function}({argument}) failed with NVML error {code} ({name}) from {library:?}")]
    Nvml {
        library: PathBuf,
        function: &'static str,
        argument: String,
        code: u32,
        name: &'static str,
    },
    #[error("nvmlDeviceSetMemoryLimits_v1({argument}) from {library:?} was refused with NVML_ERROR_NO_PERMISSION: setting a driver memory limit needs CAP_SYS_ADMIN, which the calling process does not hold; run the hook as root with its full capabilities (as runc, podman and CRI-O do), or set [enforce] limit to \"mps\" or \"none\"")]
    NoPermission { library: PathBuf, argument: String },
    #[error("cannot read the cgroup of the container's init from {path}: {source}")]
    ReadCgroup { path: PathBuf, source: std::io::Error },
    #[error("{path} has no cgroup v2 entry (\"0::/...\"): the host runs cgroup v1 only, and the driver memory limit needs cgroup v2 mounted at /sys/fs/cgroup")]
    CgroupV1Only { path: PathBuf },
    #[error("{path} names cgroup {value:?}: {reason}")]
    BadCgroup {
        path: PathBuf,
        value: String,
        reason: &'static str,
    },
    #[error("{dir} is not a cgroup v2 directory (it has no cgroup.controllers): the driver memory limit needs cgroup v2 mounted at /sys/fs/cgroup")]
    NotCgroupV2 { dir: PathBuf },
    #[error("GPU UUID {uuid:?} contains a NUL byte")]
    NulInUuid { uuid: String },
    /// A multi-GPU set failed and clearing what it had set on the earlier GPUs failed too.
    #[error("{source}; the limits already set on {} for cgroup {} could not be cleared, and are cleared when the container is deleted", left.join(", "), cgroup.display())]
    LeftSet {
        source: Box<EnforceError>,
        cgroup: PathBuf,
        left: Vec<String>,
    },
    #[error("cannot keep the driver limit's record of the container: {0}")]
    Record(#[from] crate::ledger::LedgerError),
    #[error("the driver limit's record {path} is unreadable ({reason}); remove it, and clear the limits it names by hand if its container is gone")]
    RecordCorrupt { path: PathBuf, reason: String },
}

pub(crate) use crate::spec::json_type;

/// The driver's per-container figures for attribution (see [`crate::attribution::CgroupUsage`]),
/// when `ledger` holds a container the driver limit holds; nothing is loaded otherwise, so
/// hosts on other tiers pay nothing. A tier changed in the config since does not matter: what
/// the ledger recorded does.
pub fn driver_usage_for(
    ledger: &crate::ledger::Ledger,
    nvml_library: &std::path::Path,
) -> Option<driver_limit::DriverUsage> {
    let limited = ledger
        .reservations
        .iter()
        .any(|r| r.enforcement == Some(Tier::DriverLimit));
    limited.then(|| driver_limit::DriverUsage::open(nvml_library)).flatten()
}

/// [`driver_usage_for`] as a [`crate::attribution::CgroupUsage`]: no figures where it has none.
pub fn cgroup_usage(
    ledger: &crate::ledger::Ledger,
    nvml_library: &std::path::Path,
) -> Box<dyn crate::attribution::CgroupUsage> {
    match driver_usage_for(ledger, nvml_library) {
        Some(usage) => Box::new(usage),
        None => Box::new(crate::attribution::NoCgroupUsage),
    }
}

/// The name of a `KEY=VALUE` entry (the whole entry when it has no `=`).
pub(crate) fn env_name(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(name, _)| name)
}

/// Whether the container's own env sets `name` (to anything, even empty).
pub(crate) fn env_has(existing_env: &[String], name: &str) -> bool {
    existing_env.iter().any(|e| env_name(e) == name)
}

/// What the wrapper adds to a placed container's spec: the configured hard limit's env and
/// mounts (vramgate's values win over the container's: a container must not raise its own
/// limit by presetting the variable), then the guardrails (the container's own values win:
/// they are advice, and the program may know better). Pure: `mps_running` is
/// [`mps_control_running`]'s answer and `toolkit_hook` [`toolkit::hook_on_node`]'s, asked by
/// the caller (each only under its own limit).
///
/// A container placed nowhere (`placed` empty) reserved nothing and gets nothing.
pub fn spec_edits(
    config: &EnforceConfig,
    existing_env: &[String],
    placed: &[PlacedShare],
    mps_running: bool,
    toolkit_hook: bool,
) -> SpecEdits {
    let mut edits = SpecEdits {
        env: Vec::new(),
        unset: Vec::new(),
        mounts: Vec::new(),
        tier: Tier::None,
        notes: Vec::new(),
    };
    if placed.is_empty() {
        return edits;
    }
    let hard = match config.limit {
        LimitMechanism::None => None,
        LimitMechanism::Driver => {
            // The hook sets the limit at createRuntime; NVIDIA's hook must not set a second,
            // whether or not the node's CDI spec carries it (see the module docs: vramgate's
            // own call is the one it can see succeed, record and clear).
            if let Some(set) = toolkit::conflicting_request(existing_env) {
                edits.unset = toolkit::ALL_VARS.iter().map(|v| v.to_string()).collect();
                edits.notes.push(format!(
                    "vramgate: removed {set} from the container's env: under [enforce] limit = \"driver\" vramgate sets the driver limit from the reservation, and nvidia-container-toolkit's hook would set a second one"
                ));
            }
            None
        }
        LimitMechanism::Toolkit => toolkit::edits(config, existing_env, placed, toolkit_hook, &mut edits),
        LimitMechanism::Mps => mps::edits(config, placed, mps_running, &mut edits),
    };
    let guarded = guardrails::edits(config, existing_env, placed, &mut edits.env);
    edits.tier = match (hard, guarded) {
        (Some(tier), _) => tier,
        (None, true) => Tier::Guardrails,
        (None, false) => Tier::None,
    };
    edits
}

/// The tier a container placed on `placed` gets on this host, as the node applies it: what
/// [`spec_edits`] gives it, except that under `limit = "driver"` the hook sets the driver limit
/// at createRuntime on a whole GPU (never on a MIG device: [`driver_limit::whole_gpus`]). For
/// callers that report the tier before the container exists (the DRA driver's claim status);
/// the wrapper and the hook keep deciding it where they apply it, with the same functions.
pub fn planned_tier(config: &EnforceConfig, placed: &[PlacedShare]) -> Tier {
    if config.limit == LimitMechanism::Driver && !driver_limit::whole_gpus(placed).is_empty() {
        return Tier::DriverLimit;
    }
    let (mps_running, toolkit_hook) = node_offers(config);
    spec_edits(config, &[], placed, mps_running, toolkit_hook).tier
}

/// What this host offers the configured limit, asked only under that limit (a node on another
/// tier pays no socket probe or YAML parse per create): whether an MPS control daemon runs on
/// the pipe directory, and whether a CDI spec in `cdi_spec_dirs` carries the toolkit's
/// memory-limit hook. The wrapper and [`planned_tier`] ask it the same way.
pub fn node_offers(config: &EnforceConfig) -> (bool, bool) {
    let mps_running = config.limit == LimitMechanism::Mps
        && mps_control_running(&config.mps_pipe_directory, std::path::Path::new("/proc"));
    let toolkit_hook =
        config.limit == LimitMechanism::Toolkit && toolkit::hook_on_node(&config.cdi_spec_dirs).is_some();
    (mps_running, toolkit_hook)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn share(index: u32, bytes: u64, total: u64) -> PlacedShare {
        PlacedShare {
            uuid: format!("GPU-{index:08}-0000-0000-0000-000000000000"),
            index,
            mig_index: None,
            bytes,
            limit: bytes,
            total,
        }
    }

    const H200: u64 = 143_771 * MIB;

    fn env_of(edits: &SpecEdits) -> Vec<String> {
        edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn the_planned_tier_is_the_wrappers_or_the_hooks_driver_limit() {
        let placed = [share(0, 4 << 30, H200)];
        assert_eq!(planned_tier(&EnforceConfig::default(), &placed), Tier::Guardrails);
        let driver = EnforceConfig {
            limit: LimitMechanism::Driver,
            ..EnforceConfig::default()
        };
        assert_eq!(planned_tier(&driver, &placed), Tier::DriverLimit);
        let mig = [PlacedShare {
            mig_index: Some(1),
            ..share(0, 1 << 30, H200)
        }];
        assert_eq!(
            planned_tier(&driver, &mig),
            Tier::Guardrails,
            "the hook sets none on a MIG device"
        );
        // The toolkit's tier only where the node's CDI spec carries its hook.
        let cdi = tempfile::tempdir().unwrap();
        let toolkit = EnforceConfig {
            limit: LimitMechanism::Toolkit,
            cdi_spec_dirs: vec![cdi.path().to_path_buf()],
            ..EnforceConfig::default()
        };
        assert_eq!(planned_tier(&toolkit, &placed), Tier::Guardrails);
        let spec = serde_json::json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0",
            "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
            "args": ["nvidia-cdi-hook", toolkit::HOOK_COMMAND, "--gpu-id", "GPU-x"]}]}}]});
        std::fs::write(cdi.path().join("nvidia.json"), spec.to_string()).unwrap();
        assert_eq!(planned_tier(&toolkit, &placed), Tier::ToolkitLimit);
        assert_eq!(planned_tier(&driver, &[]), Tier::None);
    }

    #[test]
    fn defaults_give_guardrails_only() {
        let edits = spec_edits(&EnforceConfig::default(), &[], &[share(0, 4 << 30, H200)], false, false);
        assert_eq!(edits.tier, Tier::Guardrails);
        assert_eq!(
            env_of(&edits),
            [
                "TF_FORCE_GPU_ALLOW_GROWTH=true",
                "XLA_PYTHON_CLIENT_PREALLOCATE=false",
                "XLA_CLIENT_MEM_FRACTION=0.028",
                "XLA_PYTHON_CLIENT_MEM_FRACTION=0.028",
            ]
        );
        assert!(edits.mounts.is_empty() && edits.notes.is_empty());
    }

    #[test]
    fn nothing_placed_nothing_added() {
        let config = EnforceConfig {
            limit: LimitMechanism::Mps,
            ..EnforceConfig::default()
        };
        let edits = spec_edits(&config, &[], &[], true, false);
        assert_eq!(edits.tier, Tier::None);
        assert!(edits.env.is_empty() && edits.mounts.is_empty());
    }

    #[test]
    fn all_guardrails_off_and_no_limit_is_tier_none() {
        let config = EnforceConfig {
            tensorflow_allow_growth: false,
            jax_disable_preallocation: false,
            jax_memory_fraction: false,
            ..EnforceConfig::default()
        };
        let edits = spec_edits(&config, &[], &[share(0, 1 << 30, H200)], false, false);
        assert_eq!(edits.tier, Tier::None);
        assert!(edits.env.is_empty());
    }

    #[test]
    fn driver_limit_leaves_the_spec_to_guardrails() {
        let config = EnforceConfig {
            limit: LimitMechanism::Driver,
            ..EnforceConfig::default()
        };
        let edits = spec_edits(&config, &[], &[share(0, 1 << 30, H200)], false, false);
        // The hook sets the limit and reports DriverLimit; the spec carries the guardrails.
        assert_eq!(edits.tier, Tier::Guardrails);
        assert!(edits.env.iter().all(|(k, _)| !k.starts_with("NVIDIA_GPU_MEMORY")));
    }

    #[test]
    fn driver_limit_removes_the_toolkits_variables_the_container_set() {
        let config = EnforceConfig {
            limit: LimitMechanism::Driver,
            ..EnforceConfig::default()
        };
        let existing = ["NVIDIA_GPU_MEMORY_LIMIT=999999".to_string(), "PATH=/bin".to_string()];
        let edits = spec_edits(&config, &existing, &[share(0, 1 << 30, H200)], false, false);
        // Both spellings: the toolkit's hook reads the plural one first.
        assert_eq!(
            edits.unset,
            [
                "NVIDIA_GPU_MEMORY_REQUEST",
                "NVIDIA_GPU_MEMORY_LIMIT",
                "NVIDIA_GPU_MEMORY_REQUESTS",
                "NVIDIA_GPU_MEMORY_LIMITS"
            ]
        );
        assert!(
            edits.notes[0].contains("removed NVIDIA_GPU_MEMORY_LIMIT"),
            "{:?}",
            edits.notes
        );
        let clean = spec_edits(&config, &existing[1..], &[share(0, 1 << 30, H200)], false, false);
        assert!(clean.unset.is_empty() && clean.notes.is_empty());
        let mut spec = serde_json::json!({"process": {"env": ["NVIDIA_GPU_MEMORY_LIMIT=999999", "PATH=/bin", "NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMITS=9"]}});
        assert!(apply_spec_edits(&mut spec, &edits).unwrap());
        let env: Vec<&str> = spec["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(env.iter().all(|e| !e.starts_with("NVIDIA_GPU_MEMORY")), "{env:?}");
        assert!(env.contains(&"PATH=/bin"));
    }

    #[test]
    fn tier_serializes_as_snake_case() {
        for tier in [
            Tier::DriverLimit,
            Tier::ToolkitLimit,
            Tier::MpsLimit,
            Tier::Guardrails,
            Tier::None,
        ] {
            let json = serde_json::to_string(&tier).unwrap();
            assert_eq!(json, format!("\"{tier}\""));
            assert_eq!(serde_json::from_str::<Tier>(&json).unwrap(), tier);
        }
    }
}
