//! The NVML backend. The library is loaded at run time (`dlopen`), so the binaries build and
//! run on hosts without a driver; only choosing this backend there is an error.

use std::ffi::OsStr;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::{GpuMemory, Inventory, InventoryError, Snapshot};

pub struct NvmlInventory {
    nvml: Nvml,
}

fn nvml_err(what: impl Into<String>) -> impl FnOnce(NvmlError) -> InventoryError {
    let what = what.into();
    move |source| InventoryError::Nvml { what, source }
}

impl NvmlInventory {
    pub fn open(library: &str) -> Result<NvmlInventory, InventoryError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
            .map_err(|source| InventoryError::NvmlLoad {
                library: library.to_string(),
                source,
            })?;
        Ok(NvmlInventory { nvml })
    }
}

impl Inventory for NvmlInventory {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        let count = self.nvml.device_count().map_err(nvml_err("counting GPUs"))?;
        let mut snapshot = Snapshot::default();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err(format!("opening GPU {index}")))?;
            let uuid = device
                .uuid()
                .map_err(nvml_err(format!("reading the UUID of GPU {index}")))?;
            let minor = device.minor_number().ok();
            let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            if mig_enabled {
                snapshot.mig_parents.push(index);
                let slots = device
                    .mig_device_count()
                    .map_err(nvml_err(format!("counting MIG devices of GPU {index}")))?;
                for mig_index in 0..slots {
                    // Empty slots answer NotFound; only created MIG devices are domains.
                    let Ok(mig) = device.mig_device_by_index(mig_index) else {
                        continue;
                    };
                    let mig_uuid = mig
                        .uuid()
                        .map_err(nvml_err(format!("reading the UUID of MIG device {index}:{mig_index}")))?;
                    let memory = mig
                        .memory_info()
                        .map_err(nvml_err(format!("reading the memory of MIG device {mig_uuid}")))?;
                    snapshot.gpus.push(GpuMemory {
                        index,
                        mig_index: Some(mig_index),
                        uuid: mig_uuid,
                        minor,
                        total: memory.total,
                        free: memory.free,
                    });
                }
                continue;
            }
            let memory = device
                .memory_info()
                .map_err(nvml_err(format!("reading the memory of GPU {index}")))?;
            snapshot.gpus.push(GpuMemory {
                index,
                mig_index: None,
                uuid,
                minor,
                total: memory.total,
                free: memory.free,
            });
        }
        Ok(snapshot)
    }

    fn describe(&self) -> String {
        match self.nvml.sys_driver_version() {
            Ok(v) => format!("NVML (driver {v})"),
            Err(_) => "NVML".to_string(),
        }
    }
}
