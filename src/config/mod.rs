//! `/etc/vramgate/config.toml`: every key, its default, and the checks that turn a typo into
//! an error naming the key instead of a silently ignored setting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The `[inventory]` table's types are the inventory's own; this file parses them.
pub use crate::inventory::settings::{Backend, InventoryConfig, StaticGpu, SIMULATED_GPU_TOTAL, SIMULATED_GPU_UUID};
use crate::quantity::{self, Quantity};
/// The policy is the request's word (`vramgate.dev/policy`); the config gives its default.
pub use crate::request::Policy;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/vramgate/config.toml";
/// Overrides the config path (for tests, demos and hosts that keep config elsewhere).
pub const CONFIG_ENV: &str = "VRAMGATE_CONFIG";
/// Where the toolkit's spec is looked for besides the driver's own CDI directory: `[enforce]
/// cdi_spec_dirs`'s default, and where the DRA driver looks (`crate::dra::cdi::STATIC_DIRS`).
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
    /// Which of the waiters that fit goes first (see [`crate::queue::BackfillOrder`]).
    pub backfill_order: crate::queue::BackfillOrder,
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
            backfill_order: crate::queue::BackfillOrder::Arrival,
            poll_interval: Duration::from_secs(1),
            limit_overcommit_ppm: 0,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            runtimes: vec!["nvidia-container-runtime".to_string(), "runc".to_string()],
            hook_path: None,
        }
    }
}

// The file as TOML has it: every value a string where vramgate parses it itself (sizes,
// durations), so its own one-line errors name the key. `deny_unknown_fields` turns a typo
// into an error instead of a silently ignored setting.

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    state_dir: Option<PathBuf>,
    headroom: Option<String>,
    policy: Option<String>,
    wait_timeout: Option<String>,
    max_wait_timeout: Option<String>,
    on_state_error: Option<OnStateError>,
    #[serde(default)]
    queue: RawQueue,
    #[serde(default)]
    inventory: RawInventory,
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default)]
    placement: RawPlacement,
    #[serde(default)]
    enforce: RawEnforce,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    strategy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEnforce {
    limit: Option<String>,
    mps_pipe_directory: Option<PathBuf>,
    mps_log_directory: Option<PathBuf>,
    mps_shm_directory: Option<PathBuf>,
    mps_device_key: Option<String>,
    cdi_spec_dirs: Option<Vec<PathBuf>>,
    // Switches are read as any TOML value so that `= "yes"` gets vramgate's error, which
    // names the key, rather than toml's, which does not.
    tensorflow_allow_growth: Option<toml::Value>,
    jax_disable_preallocation: Option<toml::Value>,
    jax_memory_fraction: Option<toml::Value>,
    over_use: Option<String>,
    over_use_margin: Option<String>,
    over_use_interval: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    runtimes: Option<Vec<String>>,
    hook_path: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    backfill: Option<bool>,
    backfill_bound: Option<String>,
    backfill_order: Option<String>,
    poll_interval: Option<String>,
    limit_overcommit: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawInventory {
    backend: Option<Backend>,
    nvml_library: Option<String>,
    #[serde(default)]
    gpus: Vec<RawGpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    index: u32,
    uuid: String,
    total: String,
    used_outside: Option<String>,
    minor: Option<u32>,
}

/// Makes the errors of one file: each names the file, the key and the value.
struct Keys<'a> {
    path: &'a Path,
}

impl Keys<'_> {
    fn bad(&self, key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Value {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    fn duration(&self, key: &str, value: &str) -> Result<Duration, ConfigError> {
        quantity::parse_duration(value).map_err(|e| self.bad(key, value, e.to_string()))
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

    /// Parses a config file's text. The tables are checked in file order (top-level keys,
    /// `[queue]`, `[inventory]`, `[runtime]`, `[enforce]`), so a file with several mistakes always reports
    /// the same, first one.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            // toml's message spans lines (a snippet of the file); one line is what a hook can print.
            // And a key or value quoted in the message may itself hold a newline.
            message: crate::one_line(e.message())
                + &e.span().map(|s| format!(" (at byte {})", s.start)).unwrap_or_default(),
        })?;
        let keys = Keys { path };
        let mut config = Config::top_level(&raw, &keys)?;
        config.source = Some(path.to_path_buf());
        config.queue = QueueConfig::parse(raw.queue, &keys)?;
        config.inventory = parse_inventory(raw.inventory, &keys)?;
        config.runtime = RuntimeConfig::parse(raw.runtime, &keys)?;
        config.placement = PlacementConfig::parse(raw.placement, &keys)?;
        config.enforce = EnforceConfig::parse(raw.enforce, &keys)?;
        Ok(config)
    }

    /// The keys outside any table; the tables keep their defaults.
    fn top_level(raw: &RawConfig, keys: &Keys) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        if let Some(dir) = &raw.state_dir {
            if !dir.is_absolute() {
                return Err(keys.bad("state_dir", &dir.display().to_string(), "must be an absolute path"));
            }
            config.state_dir = dir.clone();
        }
        if let Some(v) = &raw.headroom {
            config.headroom = if v.trim() == "0" {
                Quantity::Bytes(0)
            } else {
                quantity::parse_quantity(v).map_err(|e| keys.bad("headroom", v, e.to_string()))?
            };
        }
        if let Some(v) = &raw.policy {
            config.policy = Policy::parse(v).ok_or_else(|| keys.bad("policy", v, "must be \"reject\" or \"wait\""))?;
        }
        if let Some(v) = &raw.wait_timeout {
            config.wait_timeout = keys.duration("wait_timeout", v)?;
        }
        if let Some(v) = &raw.max_wait_timeout {
            config.max_wait_timeout = keys.duration("max_wait_timeout", v)?;
        }
        if config.wait_timeout > config.max_wait_timeout {
            return Err(keys.bad(
                "wait_timeout",
                &quantity::format_duration(config.wait_timeout),
                format!(
                    "is longer than max_wait_timeout ({})",
                    quantity::format_duration(config.max_wait_timeout)
                ),
            ));
        }
        if let Some(v) = raw.on_state_error {
            config.on_state_error = v;
        }
        Ok(config)
    }
}

impl PlacementConfig {
    fn parse(raw: RawPlacement, keys: &Keys) -> Result<PlacementConfig, ConfigError> {
        let mut placement = PlacementConfig::default();
        if let Some(v) = raw.strategy {
            placement.strategy = crate::placement::Strategy::parse(&v)
                .ok_or_else(|| keys.bad("placement.strategy", &v, "must be \"best-fit\" or \"spread\""))?;
        }
        Ok(placement)
    }
}

impl QueueConfig {
    fn parse(raw: RawQueue, keys: &Keys) -> Result<QueueConfig, ConfigError> {
        let mut queue = QueueConfig::default();
        if let Some(v) = raw.backfill {
            queue.backfill = v;
        }
        if let Some(v) = raw.backfill_bound {
            queue.backfill_bound = keys.duration("queue.backfill_bound", &v)?;
        }
        if let Some(v) = raw.backfill_order {
            queue.backfill_order = crate::queue::BackfillOrder::parse(&v).ok_or_else(|| {
                keys.bad(
                    "queue.backfill_order",
                    &v,
                    &format!("must be {}", crate::queue::BackfillOrder::VALUES),
                )
            })?;
        }
        if let Some(v) = raw.poll_interval {
            let interval = keys.duration("queue.poll_interval", &v)?;
            // Below 10ms a waiter spends its time querying the driver; above 60s it sees memory
            // freed outside vramgate a minute late.
            if interval < Duration::from_millis(10) || interval > Duration::from_secs(60) {
                return Err(keys.bad("queue.poll_interval", &v, "must be between 10ms and 60s"));
            }
            queue.poll_interval = interval;
        }
        if let Some(v) = raw.limit_overcommit {
            const HOW: &str = "must be a percentage of the GPU's memory from \"0%\" to \"100%\" (how far the sum of limits on a GPU may exceed its memory)";
            queue.limit_overcommit_ppm = match v.trim() {
                "0" | "0%" => 0,
                t => match quantity::parse_quantity(t) {
                    Ok(Quantity::PartsPerMillion(ppm)) if t.ends_with('%') => ppm,
                    _ => return Err(keys.bad("queue.limit_overcommit", &v, HOW)),
                },
            };
        }
        Ok(queue)
    }
}

/// The `[inventory]` table (its types are the inventory's: [`crate::inventory::settings`]).
fn parse_inventory(raw: RawInventory, keys: &Keys) -> Result<InventoryConfig, ConfigError> {
    let mut inventory = InventoryConfig::default();
    if let Some(v) = raw.backend {
        inventory.backend = v;
    }
    if let Some(v) = raw.nvml_library {
        inventory.nvml_library = v;
    }
    for (n, gpu) in raw.gpus.into_iter().enumerate() {
        let gpu = parse_static_gpu(gpu, n, keys)?;
        if inventory
            .gpus
            .iter()
            .any(|g| g.index == gpu.index || g.uuid == gpu.uuid)
        {
            return Err(keys.bad(
                &format!("inventory.gpus[{n}].index"),
                &gpu.index.to_string(),
                "another GPU has the same index or uuid",
            ));
        }
        inventory.gpus.push(gpu);
    }
    Ok(inventory)
}

/// One `[[inventory.gpus]]` entry, the `n`th of the file.
fn parse_static_gpu(gpu: RawGpu, n: usize, keys: &Keys) -> Result<StaticGpu, ConfigError> {
    let key = |field: &str| format!("inventory.gpus[{n}].{field}");
    let total = match quantity::parse_quantity(&gpu.total) {
        Ok(Quantity::Bytes(b)) => b,
        Ok(Quantity::PartsPerMillion(_)) => {
            return Err(keys.bad(
                &key("total"),
                &gpu.total,
                "must be an absolute amount, not a percentage",
            ))
        }
        Err(e) => return Err(keys.bad(&key("total"), &gpu.total, e.to_string())),
    };
    let used_outside = match gpu.used_outside.as_deref().map(str::trim) {
        None | Some("0") => 0,
        Some(v) => quantity::parse_quantity(v)
            .map_err(|e| keys.bad(&key("used_outside"), v, e.to_string()))?
            .bytes_on(total),
    };
    if gpu.uuid.trim().is_empty() || gpu.uuid.len() > 128 {
        return Err(keys.bad(&key("uuid"), &gpu.uuid, "must be a non-empty GPU UUID"));
    }
    Ok(StaticGpu {
        index: gpu.index,
        uuid: gpu.uuid,
        total,
        used_outside,
        minor: gpu.minor.unwrap_or(gpu.index),
    })
}

impl RuntimeConfig {
    fn parse(raw: RawRuntime, keys: &Keys) -> Result<RuntimeConfig, ConfigError> {
        let mut runtime = RuntimeConfig::default();
        if let Some(runtimes) = raw.runtimes {
            if runtimes.is_empty() {
                return Err(keys.bad(
                    "runtime.runtimes",
                    &format!("{runtimes:?}"),
                    "must name at least one runtime, e.g. [\"runc\"]",
                ));
            }
            // A relative path with a slash would resolve against whatever directory the engine
            // started the wrapper in.
            if let Some(name) = runtimes
                .iter()
                .find(|r| r.trim().is_empty() || r.contains('\0') || (r.contains('/') && !r.starts_with('/')))
            {
                return Err(keys.bad(
                    "runtime.runtimes",
                    name,
                    "each entry must be a command name found on PATH or an absolute path",
                ));
            }
            runtime.runtimes = runtimes;
        }
        if let Some(hook) = raw.hook_path {
            if !hook.is_absolute() {
                return Err(keys.bad(
                    "runtime.hook_path",
                    &hook.display().to_string(),
                    "must be an absolute path",
                ));
            }
            runtime.hook_path = Some(hook);
        }
        Ok(runtime)
    }
}

impl EnforceConfig {
    fn parse(raw: RawEnforce, keys: &Keys) -> Result<EnforceConfig, ConfigError> {
        let mut enforce = EnforceConfig::default();
        if let Some(v) = raw.limit {
            enforce.limit = LimitMechanism::parse(&v).ok_or_else(|| {
                keys.bad(
                    "enforce.limit",
                    &v,
                    "must be \"none\", \"driver\", \"toolkit\" or \"mps\"",
                )
            })?;
        }
        // The directories become bind mounts in container specs: a relative path would resolve
        // against whatever directory runc runs in.
        let dir = |key: &str, value: Option<PathBuf>, default: PathBuf| match value {
            None => Ok(default),
            Some(d) if d.is_absolute() && !d.as_os_str().is_empty() => Ok(d),
            Some(d) => Err(keys.bad(key, &d.display().to_string(), "must be an absolute path")),
        };
        enforce.mps_pipe_directory = dir(
            "enforce.mps_pipe_directory",
            raw.mps_pipe_directory,
            enforce.mps_pipe_directory,
        )?;
        enforce.mps_log_directory = dir(
            "enforce.mps_log_directory",
            raw.mps_log_directory,
            enforce.mps_log_directory,
        )?;
        enforce.mps_shm_directory = dir(
            "enforce.mps_shm_directory",
            raw.mps_shm_directory,
            enforce.mps_shm_directory,
        )?;
        if let Some(v) = raw.mps_device_key {
            enforce.mps_device_key = match v.trim() {
                "ordinal" => MpsDeviceKey::Ordinal,
                "uuid" => MpsDeviceKey::Uuid,
                _ => return Err(keys.bad("enforce.mps_device_key", &v, "must be \"ordinal\" or \"uuid\"")),
            };
        }
        if let Some(dirs) = raw.cdi_spec_dirs {
            let named = format!("{dirs:?}");
            if dirs.is_empty() {
                return Err(keys.bad(
                    "enforce.cdi_spec_dirs",
                    &named,
                    "must name at least one directory (the toolkit writes its spec to /etc/cdi or /var/run/cdi)",
                ));
            }
            if let Some(bad) = dirs.iter().find(|d| !d.is_absolute()) {
                return Err(keys.bad(
                    "enforce.cdi_spec_dirs",
                    &bad.display().to_string(),
                    "must be absolute paths",
                ));
            }
            enforce.cdi_spec_dirs = dirs;
        }
        let switch = |key: &str, value: Option<toml::Value>, default: bool| match value {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(b),
            Some(toml::Value::String(text)) => Err(keys.bad(key, &text, "must be true or false")),
            Some(other) => Err(keys.bad(key, &other.to_string(), "must be true or false")),
        };
        enforce.tensorflow_allow_growth = switch(
            "enforce.tensorflow_allow_growth",
            raw.tensorflow_allow_growth,
            enforce.tensorflow_allow_growth,
        )?;
        enforce.jax_disable_preallocation = switch(
            "enforce.jax_disable_preallocation",
            raw.jax_disable_preallocation,
            enforce.jax_disable_preallocation,
        )?;
        enforce.jax_memory_fraction = switch(
            "enforce.jax_memory_fraction",
            raw.jax_memory_fraction,
            enforce.jax_memory_fraction,
        )?;
        if let Some(v) = raw.over_use {
            enforce.over_use = match v.trim() {
                "report" => OverUseAction::Report,
                "kill" => OverUseAction::Kill,
                _ => return Err(keys.bad("enforce.over_use", &v, "must be \"report\" or \"kill\"")),
            };
        }
        if let Some(v) = raw.over_use_margin {
            enforce.over_use_margin = if v.trim() == "0" {
                Quantity::Bytes(0)
            } else {
                quantity::parse_quantity(&v).map_err(|e| keys.bad("enforce.over_use_margin", &v, e.to_string()))?
            };
        }
        if let Some(v) = raw.over_use_interval {
            let interval = keys.duration("enforce.over_use_interval", &v)?;
            if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&interval) {
                return Err(keys.bad("enforce.over_use_interval", &v, "must be between 50ms and 60s"));
            }
            enforce.over_use_interval = interval;
        }
        Ok(enforce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/vramgate/config.toml"))
    }

    #[test]
    fn empty_file_means_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/run/vramgate"));
        assert_eq!(c.policy, Policy::Reject);
        assert_eq!(c.inventory.backend, Backend::Auto);
        assert_eq!(c.inventory.static_gpus_or_simulated()[0].total, 24_265 << 20);
    }

    #[test]
    fn missing_file_means_defaults() {
        let c = Config::load_from(Path::new("/nonexistent/vramgate.toml")).unwrap();
        assert!(c.source.is_none());
    }

    #[test]
    fn full_file() {
        let c = parse(
            r#"
state_dir = "/var/run/vg"
headroom = "512Mi"
policy = "wait"
wait_timeout = "90s"
on_state_error = "fail-open"
[queue]
backfill = true
backfill_bound = "10s"
poll_interval = "200ms"
[inventory]
backend = "static"
[[inventory.gpus]]
index = 0
uuid = "GPU-a"
total = "80Gi"
used_outside = "1Gi"
[[inventory.gpus]]
index = 1
uuid = "GPU-b"
total = "80Gi"
minor = 5
"#,
        )
        .unwrap();
        assert_eq!(c.headroom, Quantity::Bytes(512 << 20));
        assert_eq!(c.policy, Policy::Wait);
        assert_eq!(c.wait_timeout, Duration::from_secs(90));
        assert_eq!(c.on_state_error, OnStateError::FailOpen);
        assert!(c.queue.backfill);
        assert_eq!(c.queue.limit_overcommit_ppm, 0, "the default");
        assert_eq!(c.inventory.gpus.len(), 2);
        assert_eq!(c.inventory.gpus[0].used_outside, 1 << 30);
        assert_eq!(c.inventory.gpus[1].minor, 5);
        assert_eq!(c.runtime, RuntimeConfig::default());
    }

    #[test]
    fn limit_overcommit_is_a_percentage_up_to_100() {
        for (v, ppm) in [
            ("0%", 0),
            ("0", 0),
            ("50%", 500_000),
            ("12.5%", 125_000),
            ("100%", 1_000_000),
        ] {
            let c = parse(&format!("[queue]\nlimit_overcommit = \"{v}\"")).unwrap();
            assert_eq!(c.queue.limit_overcommit_ppm, ppm, "{v}");
        }
        for v in ["150%", "-5%", "50", "2Gi", "lots", ""] {
            let err = parse(&format!("[queue]\nlimit_overcommit = \"{v}\""))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("queue.limit_overcommit") && err.contains("from \"0%\" to \"100%\""),
                "{v}: {err}"
            );
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn each_table_has_its_own_struct() {
        let c = parse("[queue]\nbackfill = true\n[inventory]\nbackend = \"static\"").unwrap();
        assert_eq!(
            c.queue,
            QueueConfig {
                backfill: true,
                ..QueueConfig::default()
            }
        );
        assert_eq!(
            c.inventory,
            InventoryConfig {
                backend: Backend::Static,
                ..InventoryConfig::default()
            }
        );
        assert_eq!(c.runtime, RuntimeConfig::default());
    }

    #[test]
    fn runtime_table() {
        let c = parse("[runtime]\nruntimes = [\"/opt/bin/crun\", \"runc\"]\nhook_path = \"/opt/bin/vramgate-hook\"")
            .unwrap();
        assert_eq!(c.runtime.runtimes, ["/opt/bin/crun", "runc"]);
        assert_eq!(c.runtime.hook_path, Some(PathBuf::from("/opt/bin/vramgate-hook")));
        assert_eq!(
            parse("").unwrap().runtime.runtimes,
            ["nvidia-container-runtime", "runc"]
        );
    }

    #[test]
    fn enforce_table() {
        let c = parse("").unwrap();
        assert_eq!(c.enforce, EnforceConfig::default());
        assert_eq!(c.enforce.limit, LimitMechanism::None);
        assert!(
            c.enforce.tensorflow_allow_growth && c.enforce.jax_disable_preallocation && c.enforce.jax_memory_fraction
        );
        let c = parse(
            "[enforce]\nlimit = \"mps\"\nmps_pipe_directory = \"/run/mps\"\nmps_device_key = \"uuid\"\njax_memory_fraction = false",
        )
        .unwrap();
        assert_eq!(c.enforce.limit, LimitMechanism::Mps);
        assert_eq!(c.enforce.mps_pipe_directory, PathBuf::from("/run/mps"));
        assert_eq!(c.enforce.mps_log_directory, PathBuf::from("/tmp/nvidia-log"));
        assert_eq!(c.enforce.mps_device_key, MpsDeviceKey::Uuid);
        assert!(!c.enforce.jax_memory_fraction && c.enforce.tensorflow_allow_growth);
        assert_eq!(
            c.enforce.cdi_spec_dirs,
            [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        let c = parse("[enforce]\ncdi_spec_dirs = [\"/opt/cdi\"]").unwrap();
        assert_eq!(c.enforce.cdi_spec_dirs, [PathBuf::from("/opt/cdi")]);
        for name in ["none", "driver", "toolkit", "mps"] {
            assert_eq!(LimitMechanism::parse(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("stat_dir = \"/x\"", "stat_dir"),
            ("policy = \"later\"", "policy"),
            ("headroom = \"lots\"", "headroom"),
            ("wait_timeout = \"5 days\"", "wait_timeout"),
            ("state_dir = \"relative\"", "state_dir"),
            ("[queue]\npoll_interval = \"1ms\"", "poll_interval"),
            ("[inventory]\nbackend = \"cuda\"", "cuda"),
            (
                "[[inventory.gpus]]\nindex = 0\nuuid = \"a\"\ntotal = \"50%\"",
                "inventory.gpus[0].total",
            ),
            (
                "[[inventory.gpus]]\nindex = 0\nuuid = \"a\"\ntotal = \"1Gi\"\ncolour = 1",
                "colour",
            ),
            ("wait_timeout = \"2h\"", "max_wait_timeout"),
            ("[runtime]\nruntimes = []", "runtime.runtimes"),
            ("[runtime]\nruntimes = [\"bin/runc\"]", "runtime.runtimes"),
            ("[runtime]\nhook_path = \"vramgate-hook\"", "runtime.hook_path"),
            ("[runtime]\nruntime = [\"runc\"]", "runtime"),
            ("[enforce]\nlimit = \"cgroup\"", "enforce.limit"),
            (
                "[enforce]\nmps_pipe_directory = \"nvidia-mps\"",
                "enforce.mps_pipe_directory",
            ),
            ("[enforce]\nmps_device_key = \"index\"", "enforce.mps_device_key"),
            ("[enforce]\ncdi_spec_dirs = []", "enforce.cdi_spec_dirs"),
            ("[enforce]\ncdi_spec_dirs = [\"etc/cdi\"]", "enforce.cdi_spec_dirs"),
            (
                "[enforce]\ntensorflow_allow_growth = \"yes\"",
                "tensorflow_allow_growth",
            ),
            ("[enforce]\njax_preallocate = false", "jax_preallocate"),
            ("this is not toml", "config.toml"),
            ("\"a\\nb\" = 1", "unknown field"),
        ];
        for (text, needle) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(needle), "{text:?} -> {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }
}
