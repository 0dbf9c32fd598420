//! Reading the file: the TOML as written (every size and duration a string vramgate parses
//! itself), then each table checked into its type in [`super`], with errors that name the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::*;
use crate::quantity::{self, Quantity};

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
    nvidia_toolkit_configs: Option<Vec<PathBuf>>,
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

impl Config {
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
            queue.backfill_order = crate::queue_order::BackfillOrder::parse(&v).ok_or_else(|| {
                keys.bad(
                    "queue.backfill_order",
                    &v,
                    &format!("must be {}", crate::queue_order::BackfillOrder::VALUES),
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
        if let Some(paths) = raw.nvidia_toolkit_configs {
            if let Some(bad) = paths.iter().find(|p| !p.is_absolute()) {
                return Err(keys.bad(
                    "runtime.nvidia_toolkit_configs",
                    &bad.display().to_string(),
                    "each entry must be an absolute path",
                ));
            }
            runtime.nvidia_toolkit_configs = paths;
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
