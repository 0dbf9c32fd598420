//! `/etc/vramgate/config.toml`: every key, its default, and the checks that turn a typo into
//! an error naming the key instead of a silently ignored setting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod parse;

/// The `[inventory]` table's types are the inventory's own; this file parses them.
pub use crate::inventory::settings::{Backend, InventoryConfig, StaticGpu, SIMULATED_GPU_TOTAL, SIMULATED_GPU_UUID};
use crate::quantity::Quantity;
/// The policy is the request's word (`vramgate.dev/policy`); the config gives its default.
pub use crate::request::Policy;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/vramgate/config.toml";
/// Overrides the config path (for tests, demos and hosts that keep config elsewhere).
pub const CONFIG_ENV: &str = "VRAMGATE_CONFIG";
/// Where the toolkit's spec is looked for besides the driver's own CDI directory: `[enforce]
/// cdi_spec_dirs`'s default, and where the DRA driver looks (`crate::dra::cdi_spec::STATIC_DIRS`).
pub const CDI_STATIC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
pub const DEFAULT_STATE_DIR: &str = "/run/vramgate";
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: key {key:?} = {value:?}: {reason}")]
    Value {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
}

/// What the hook does when its own state (the ledger) cannot be read or trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStateError {
    /// Refuse container starts that request VRAM until an admin repairs the state.
    FailClosed,
    /// Let containers start unaccounted, logging the error (keeps a host running, risks OOM).
    FailOpen,
}

/// The whole file: the top-level keys, and one struct per table.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from; `None` when no file exists and defaults apply.
    pub source: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub headroom: Quantity,
    pub policy: Policy,
    pub wait_timeout: Duration,
    pub max_wait_timeout: Duration,
    pub on_state_error: OnStateError,
    /// `[queue]`: how waiters (policy `wait`) are ordered and how often they look again.
    pub queue: QueueConfig,
    /// `[inventory]`: where the GPUs' memory figures come from.
    pub inventory: InventoryConfig,
    /// `[runtime]`: what `vramgate-runtime` runs next and which hook it injects.
    pub runtime: RuntimeConfig,
    /// `[placement]`: how `vramgate-runtime` chooses GPUs for requests that leave it the choice.
    pub placement: PlacementConfig,
    /// `[enforce]`: what keeps a container within its reservation once it runs.
    pub enforce: EnforceConfig,
}

/// The `[placement]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlacementConfig {
    pub strategy: crate::placement::Strategy,
}

/// The `[queue]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Let a request that fits pass older waiters...
    pub backfill: bool,
    /// ...but never one that has waited longer than this.
    pub backfill_bound: Duration,
    /// Which of the waiters that fit goes first (see [`crate::queue_order::BackfillOrder`]).
    pub backfill_order: crate::queue_order::BackfillOrder,
    /// How often a waiter re-reads GPU memory (ledger changes wake it at once).
    pub poll_interval: Duration,
    /// How far the sum of the limits on a GPU may exceed its memory, in parts per million of
    /// the GPU's memory (`"50%"` is 500,000; at most 100%). 0, the default, keeps today's
    /// rule: a container whose limit is above its request needs room for its limit.
    pub limit_overcommit_ppm: u32,
}

/// How a container is held to its reservation once admitted (`[enforce] limit`). One mechanism
/// per host, so two of them can never act on the same container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitMechanism {
    /// Admission only: nothing stops a container from allocating beyond its reservation.
    None,
    /// The hook sets the driver's per-cgroup limit (`nvmlDeviceSetMemoryLimits_v1`, R615+).
    Driver,
    /// The wrapper writes `NVIDIA_GPU_MEMORY_LIMIT`/`_REQUEST` for the NVIDIA toolkit's CDI hook.
    Toolkit,
    /// The wrapper gives each container `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` under an MPS daemon.
    Mps,
}

impl LimitMechanism {
    pub fn parse(value: &str) -> Option<LimitMechanism> {
        match value.trim() {
            "none" => Some(LimitMechanism::None),
            "driver" => Some(LimitMechanism::Driver),
            "toolkit" => Some(LimitMechanism::Toolkit),
            "mps" => Some(LimitMechanism::Mps),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            LimitMechanism::None => "none",
            LimitMechanism::Driver => "driver",
            LimitMechanism::Toolkit => "toolkit",
            LimitMechanism::Mps => "mps",
        }
    }
}

/// How an MPS client's pinned memory limit names a GPU (`[enforce] mps_device_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpsDeviceKey {
    /// The GPU's ordinal as the container enumerates it (`0=4096M`): the wrapper narrows the
    /// container to the GPUs it reserved, renumbered from 0 in host order, and sets
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA counts them that way too. A program that
    /// reorders its devices itself (`CUDA_VISIBLE_DEVICES=1,0`) still misnames them.
    Ordinal,
    /// The GPU's UUID (`GPU-...=4096M`), the default: names the GPU whatever the container's
    /// numbering (honoured by MPS on driver 580, `bench/gpu-enforce.sh`).
    Uuid,
}

/// The `[enforce]` table: the hard limit in use on this host, and the framework guardrails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnforceConfig {
    pub limit: LimitMechanism,
    /// The MPS control daemon's `CUDA_MPS_PIPE_DIRECTORY` (MPS's default: /tmp/nvidia-mps).
    pub mps_pipe_directory: PathBuf,
    /// The MPS control daemon's `CUDA_MPS_LOG_DIRECTORY` (MPS's default: /tmp/nvidia-log).
    pub mps_log_directory: PathBuf,
    /// The host directory the MPS daemon uses as /dev/shm; clients must share it.
    pub mps_shm_directory: PathBuf,
    pub mps_device_key: MpsDeviceKey,
    /// Where the node's CDI specs are (`[enforce] cdi_spec_dirs`): under `limit = "toolkit"`
    /// the wrapper looks in them for the toolkit's apply-cuda-memory-limits hook, and doctor
    /// says which of them carries it.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Add `TF_FORCE_GPU_ALLOW_GROWTH=true` unless the container sets it.
    pub tensorflow_allow_growth: bool,
    /// Add `XLA_PYTHON_CLIENT_PREALLOCATE=false` unless the container sets it.
    pub jax_disable_preallocation: bool,
    /// Add JAX's memory fraction (reservation / GPU total) unless the container sets it.
    pub jax_memory_fraction: bool,
    /// What `vramgate watch` does about a container whose GPU memory in use exceeds its
    /// reservation by more than [`EnforceConfig::over_use_margin`].
    pub over_use: OverUseAction,
    /// How far past its reservation a container may go before it counts as over-use: an
    /// amount, or a percentage of the reservation.
    pub over_use_margin: Quantity,
    /// How often `vramgate watch` measures.
    pub over_use_interval: Duration,
}

/// What `vramgate watch` does about over-use (`[enforce] over_use`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverUseAction {
    /// An `over_use` event; status and the metrics flag the container.
    Report,
    /// The same, and the container is stopped (its init and its GPU processes get SIGKILL),
    /// as the kernel's OOM killer stops the offender rather than its neighbours.
    Kill,
}

impl OverUseAction {
    pub fn as_str(self) -> &'static str {
        match self {
            OverUseAction::Report => "report",
            OverUseAction::Kill => "kill",
        }
    }
}

/// The `[runtime]` table, read by the `vramgate-runtime` wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Runtimes to exec after the spec is edited, in order; the first found on PATH (or, for an
    /// absolute path, existing) wins. `nvidia-container-runtime` first chains with the NVIDIA
    /// toolkit, which itself runs runc.
    pub runtimes: Vec<String>,
    /// The hook binary written into specs; `None` means the `vramgate-hook` next to the
    /// wrapper, else `/usr/bin/vramgate-hook`.
    pub hook_path: Option<PathBuf>,
    /// NVIDIA's toolkit's config files, the first that exists being the node's: how it reads
    /// a container's NVIDIA_VISIBLE_DEVICES is how vramgate reads it ([`RuntimeConfig::nvidia_toolkit`]).
    pub nvidia_toolkit_configs: Vec<PathBuf>,
}

/// Where NVIDIA's toolkit keeps its config: the package's path, then the GPU Operator's (its
/// installer writes the config there and points the runtime at it).
pub const NVIDIA_TOOLKIT_CONFIGS: [&str; 2] = [
    "/etc/nvidia-container-runtime/config.toml",
    "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
];

/// Where the GPU Operator's toolkit installer puts NVIDIA's runtime (a wrapper script that runs
/// the real one with the operator's config).
pub const NVIDIA_OPERATOR_RUNTIME: &str = "/usr/local/nvidia/toolkit/nvidia-container-runtime";

/// The most of the toolkit's config read: it is a few hundred bytes.
const MAX_TOOLKIT_CONFIG: u64 = 64 << 10;

impl RuntimeConfig {
    /// How NVIDIA's toolkit on this node reads NVIDIA_VISIBLE_DEVICES: its config's
    /// `accept-nvidia-visible-devices-envvar-when-unprivileged`, from the first of
    /// [`RuntimeConfig::nvidia_toolkit_configs`] that exists; the toolkit's own default (true)
    /// where none does, where the key is absent, or where the file cannot be read as TOML (the
    /// toolkit then fails itself). Read only for a container that asks for memory.
    pub fn nvidia_toolkit(&self) -> crate::request::NvidiaToolkit {
        let mut toolkit = crate::request::NvidiaToolkit::default();
        let found = self
            .nvidia_toolkit_configs
            .iter()
            .find_map(|path| crate::spec::read_limited(path, MAX_TOOLKIT_CONFIG).ok().flatten());
        let setting = found
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
            .and_then(|table| {
                table
                    .get("accept-nvidia-visible-devices-envvar-when-unprivileged")?
                    .as_bool()
            });
        if let Some(accepted) = setting {
            toolkit.envvar_when_unprivileged = accepted;
        }
        toolkit
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            headroom: Quantity::Bytes(0),
            policy: Policy::Reject,
            wait_timeout: Duration::from_secs(300),
            max_wait_timeout: Duration::from_secs(3600),
            on_state_error: OnStateError::FailClosed,
            queue: QueueConfig::default(),
            inventory: InventoryConfig::default(),
            runtime: RuntimeConfig::default(),
            placement: PlacementConfig::default(),
            enforce: EnforceConfig::default(),
        }
    }
}

impl Default for EnforceConfig {
    fn default() -> Self {
        EnforceConfig {
            limit: LimitMechanism::None,
            mps_pipe_directory: PathBuf::from("/tmp/nvidia-mps"),
            mps_log_directory: PathBuf::from("/tmp/nvidia-log"),
            mps_shm_directory: PathBuf::from("/dev/shm"),
            mps_device_key: MpsDeviceKey::Uuid,
            cdi_spec_dirs: CDI_STATIC_DIRS.iter().map(PathBuf::from).collect(),
            tensorflow_allow_growth: true,
            jax_disable_preallocation: true,
            jax_memory_fraction: true,
            over_use: OverUseAction::Report,
            over_use_margin: Quantity::Bytes(0),
            over_use_interval: Duration::from_millis(500),
        }
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            backfill: false,
            backfill_bound: Duration::from_secs(30),
            backfill_order: crate::queue_order::BackfillOrder::Arrival,
            poll_interval: Duration::from_secs(1),
            limit_overcommit_ppm: 0,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            // The GPU Operator installs NVIDIA's runtime off PATH, under its toolkit directory.
            runtimes: vec![
                "nvidia-container-runtime".to_string(),
                NVIDIA_OPERATOR_RUNTIME.to_string(),
                "runc".to_string(),
            ],
            hook_path: None,
            nvidia_toolkit_configs: NVIDIA_TOOLKIT_CONFIGS.iter().map(PathBuf::from).collect(),
        }
    }
}

/// The config path in effect: `$VRAMGATE_CONFIG`, else the default. Only the binaries call
/// this; the library takes the path as a parameter, so nothing below a binary reads the
/// environment to find its config.
pub fn path_from_env() -> PathBuf {
    std::env::var_os(CONFIG_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}

/// The inventory opens its backend from the config its caller read.
impl crate::inventory::Settings for Config {
    fn inventory(&self) -> &InventoryConfig {
        &self.inventory
    }
    fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }
    fn static_reader(&self) -> crate::inventory::StaticReader {
        |path| {
            Config::load_from(path)
                .map(|config| config.inventory.static_gpus_or_simulated())
                .map_err(|e| e.to_string())
        }
    }
}

impl Config {
    /// Loads the config at `path`. A missing file means defaults; anything else wrong is an error.
    pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
