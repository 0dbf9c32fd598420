//! The `[inventory]` table as the inventory reads it: which backend, and the static list.
//! [`crate::config`] parses the file into these types and hands them over through [`Settings`],
//! so the inventory, below the config, never reads the config file itself.

use std::path::Path;

/// The card of the published experiment (an RTX 3090): the simulated GPU of a host without NVML.
pub const SIMULATED_GPU_TOTAL: u64 = 24_265 << 20;
pub const SIMULATED_GPU_UUID: &str = "GPU-00000000-0000-0000-0000-000000003090";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// NVML when the driver library loads, else the static list (the simulated GPU by default).
    Auto,
    Nvml,
    Static,
}

/// One GPU of the static inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticGpu {
    pub index: u32,
    pub uuid: String,
    pub total: u64,
    /// Memory used by things vramgate does not account (display, daemons, other tenants).
    pub used_outside: u64,
    /// Minor number of `/dev/nvidiaN`; defaults to the index.
    pub minor: u32,
}

/// The `[inventory]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryConfig {
    pub backend: Backend,
    pub nvml_library: String,
    /// `[[inventory.gpus]]`: the static backend's GPUs; empty means the simulated one.
    pub gpus: Vec<StaticGpu>,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        InventoryConfig {
            backend: Backend::Auto,
            nvml_library: "libnvidia-ml.so.1".to_string(),
            gpus: Vec::new(),
        }
    }
}

impl InventoryConfig {
    /// The static GPU list in effect: the configured one, else the built-in simulated card.
    pub fn static_gpus_or_simulated(&self) -> Vec<StaticGpu> {
        if self.gpus.is_empty() {
            vec![StaticGpu {
                index: 0,
                uuid: SIMULATED_GPU_UUID.to_string(),
                total: SIMULATED_GPU_TOTAL,
                used_outside: 0,
                minor: 0,
            }]
        } else {
            self.gpus.clone()
        }
    }
}

/// Reads the static list again from the config file at a path: an admin (or a test) editing
/// `used_outside` is seen by waiting containers without restarting anything. The message of
/// its error is the config's one line.
pub type StaticReader = fn(&Path) -> Result<Vec<StaticGpu>, String>;

/// What opening an inventory needs from the config file: the `[inventory]` table, the file it
/// came from (`None` for a config made in code) and how to read that file's static list again.
/// `crate::config::Config` implements it; the callers pass their config in.
pub trait Settings {
    fn inventory(&self) -> &InventoryConfig;
    fn source(&self) -> Option<&Path>;
    fn static_reader(&self) -> StaticReader;
}

impl<T: Settings + ?Sized> Settings for &T {
    fn inventory(&self) -> &InventoryConfig {
        (**self).inventory()
    }
    fn source(&self) -> Option<&Path> {
        (**self).source()
    }
    fn static_reader(&self) -> StaticReader {
        (**self).static_reader()
    }
}
