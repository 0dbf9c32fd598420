//! The static backend: GPUs listed in the config file, or the built-in simulated card.

use std::path::PathBuf;

use super::settings::{Settings, StaticGpu, StaticReader, SIMULATED_GPU_UUID};
use super::{GpuMemory, Inventory, InventoryError, Snapshot};

pub struct StaticInventory {
    /// The config file to re-read on later snapshots, so that an admin (or a test) editing
    /// `used_outside` is seen by waiting containers without restarting anything.
    source: Option<PathBuf>,
    gpus: Vec<StaticGpu>,
    /// How to read `source`'s list again (the config's parser, handed in by the caller).
    reader: Option<StaticReader>,
    /// The first snapshot uses the config just loaded instead of parsing the file again: a
    /// plain admission takes one snapshot, and only a waiter takes more.
    loaded_now: std::cell::Cell<bool>,
}

impl StaticInventory {
    pub fn from_config(config: &dyn Settings) -> StaticInventory {
        StaticInventory {
            source: config.source().map(PathBuf::from),
            gpus: config.inventory().static_gpus_or_simulated(),
            reader: Some(config.static_reader()),
            loaded_now: std::cell::Cell::new(true),
        }
    }

    pub fn from_gpus(gpus: Vec<StaticGpu>) -> StaticInventory {
        StaticInventory {
            source: None,
            gpus,
            reader: None,
            loaded_now: std::cell::Cell::new(true),
        }
    }
}

fn to_snapshot(gpus: &[StaticGpu]) -> Snapshot {
    Snapshot {
        gpus: gpus
            .iter()
            .map(|g| GpuMemory {
                index: g.index,
                mig_index: None,
                uuid: g.uuid.clone(),
                minor: Some(g.minor),
                total: g.total,
                free: g.total.saturating_sub(g.used_outside),
                mig_caps: Vec::new(),
            })
            .collect(),
        mig_parents: Vec::new(),
        processes: Vec::new(),
    }
}

impl Inventory for StaticInventory {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        let (Some(path), Some(reader)) = (
            self.source.as_ref().filter(|_| !self.loaded_now.replace(false)),
            self.reader,
        ) else {
            return Ok(to_snapshot(&self.gpus));
        };
        let gpus = reader(path).map_err(|message| InventoryError::Static {
            path: path.clone(),
            message,
        })?;
        Ok(to_snapshot(&gpus))
    }

    fn describe(&self) -> String {
        if self.gpus.len() == 1 && self.gpus[0].uuid == SIMULATED_GPU_UUID {
            "static (one simulated 24,265 MiB GPU)".to_string()
        } else {
            format!("static ({} GPUs from the config file)", self.gpus.len())
        }
    }
}
