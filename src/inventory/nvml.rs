//! The NVML backend. The library is loaded at run time (`dlopen`), so the binaries build and
//! run on hosts without a driver; only choosing this backend there is an error.
//!
//! What one snapshot costs: per GPU a handle, its UUID, minor number, MIG mode and memory
//! info; per MIG device a handle, UUID and memory info. Process lists (two more calls per
//! device) are read only for the devices the caller asks about: the hook asks only for
//! devices that hold live reservations, because that is the only place where knowing who
//! allocated what changes a decision.

use std::ffi::OsStr;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{GpuMemory, GpuProcess, Inventory, InventoryError, Snapshot};

pub struct NvmlInventory {
    nvml: Nvml,
    /// The path the library was loaded from, for `vramgate doctor`.
    library: String,
}

/// Where distributions and the NVIDIA installers put the library, tried in this order after
/// the loader's own search when the config names a bare file name.
const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
];

fn nvml_err(what: impl Into<String>) -> impl FnOnce(NvmlError) -> InventoryError {
    let what = what.into();
    move |source| InventoryError::Nvml { what, source }
}

/// The library paths to try for the configured `nvml_library`: exactly that path when it
/// names a directory, else the loader's search and then the well-known directories.
pub fn candidate_paths(library: &str) -> Vec<String> {
    if library.contains('/') {
        return vec![library.to_string()];
    }
    let mut paths = vec![library.to_string()];
    paths.extend(WELL_KNOWN_DIRS.iter().map(|dir| format!("{dir}/{library}")));
    paths
}

impl NvmlInventory {
    pub fn open(library: &str) -> Result<NvmlInventory, InventoryError> {
        let mut load_errors = Vec::new();
        for path in candidate_paths(library) {
            // A well-known path that is not there is not worth a dlopen (nor a line in the error).
            if path.contains('/') && path != library && !std::path::Path::new(&path).exists() {
                continue;
            }
            match Nvml::builder().lib_path(OsStr::new(&path)).init() {
                Ok(nvml) => return Ok(NvmlInventory { nvml, library: path }),
                Err(NvmlError::LibloadingError(e)) => load_errors.push(e.to_string()),
                Err(source) => return Err(InventoryError::NvmlInit { library: path, source }),
            }
        }
        Err(InventoryError::NvmlLoad {
            library: library.to_string(),
            tried: load_errors.join("; "),
        })
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    /// The driver and NVML versions, for `vramgate doctor`.
    pub fn versions(&self) -> (Option<String>, Option<String>) {
        (self.nvml.sys_driver_version().ok(), self.nvml.sys_nvml_version().ok())
    }
}

/// The compute processes on one device (a GPU, or a MIG device through its own handle, which
/// lists only the processes in that MIG instance).
fn processes_of(device: &Device, uuid: &str) -> Result<Vec<GpuProcess>, InventoryError> {
    // nvmlDeviceGetComputeRunningProcesses_v3: drivers 510 and later.
    let listed = device.running_compute_processes().map_err(nvml_err(format!(
        "listing the processes on {uuid} (needs NVIDIA driver 510 or later)"
    )))?;
    Ok(listed
        .into_iter()
        .map(|p| GpuProcess {
            gpu_uuid: uuid.to_string(),
            pid: p.pid,
            // Unavailable (never on Linux as root) counts as nothing allocated: the
            // reservation then stays wholly unallocated, the safe direction.
            used: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => bytes,
                UsedGpuMemory::Unavailable => 0,
            },
        })
        .collect())
}

impl NvmlInventory {
    /// A MIG device's GPU instance and compute instance ids, which nvml-wrapper does not
    /// bind; `None` when the driver does not say.
    fn instance_ids(&self, mig: &Device) -> Option<(u32, u32)> {
        let lib = self.nvml.lib();
        let (mut gi, mut ci) = (0u32, 0u32);
        // SAFETY: `mig` is a live handle from this `Nvml`; each call writes one u32 through a
        // pointer to a local, and both functions are in every driver with MIG (R450 on).
        let ok = unsafe {
            let handle = mig.handle();
            let get_gi = lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
            let get_ci = lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?;
            get_gi(handle, &mut gi) == 0 && get_ci(handle, &mut ci) == 0
        };
        ok.then_some((gi, ci))
    }
}

impl Inventory for NvmlInventory {
    fn product_names(&self) -> std::collections::HashMap<String, (String, Option<String>)> {
        let mut names = std::collections::HashMap::new();
        let count = self.nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            let (Ok(uuid), Ok(product)) = (device.uuid(), device.name()) else {
                continue;
            };
            let slots = match device.mig_mode() {
                Ok(m) if m.current == 1 => device.mig_device_count().unwrap_or(0),
                _ => 0,
            };
            for mig_index in 0..slots {
                let Ok(mig) = device.mig_device_by_index(mig_index) else {
                    continue;
                };
                // A MIG device's name is its parent's with the profile after " MIG "
                // ("NVIDIA H100 80GB HBM3 MIG 1g.10gb").
                let (Ok(mig_uuid), Ok(mig_name)) = (mig.uuid(), mig.name()) else {
                    continue;
                };
                let profile = mig_name.rsplit_once(" MIG ").map(|(_, p)| p.to_string());
                names.insert(mig_uuid, (product.clone(), profile));
            }
            names.insert(uuid, (product, None));
        }
        names
    }

    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        self.snapshot_with_processes(&|_| true)
    }

    fn snapshot_with_processes(&self, processes_on: &dyn Fn(&str) -> bool) -> Result<Snapshot, InventoryError> {
        let count = self.nvml.device_count().map_err(nvml_err("counting GPUs"))?;
        let mut snapshot = Snapshot::default();
        // Read once, and only on a host with a GPU in MIG mode.
        let mut mig_minors: Option<super::mig_caps::MigMinors> = None;
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err(format!("opening GPU {index}")))?;
            let uuid = device
                .uuid()
                .map_err(nvml_err(format!("reading the UUID of GPU {index}")))?;
            let minor = device.minor_number().ok();
            // NotSupported (GPUs without MIG) and errors alike mean "not in MIG mode": such a
            // GPU is then admitted as a whole, which is what its memory info describes.
            let mig_enabled = device.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            if mig_enabled {
                snapshot.mig_parents.push(index);
                let caps = mig_minors.get_or_insert_with(super::mig_caps::MigMinors::read);
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
                    if processes_on(&mig_uuid) {
                        snapshot.processes.extend(processes_of(&mig, &mig_uuid)?);
                    }
                    let mig_caps = match (minor, self.instance_ids(&mig)) {
                        (Some(parent), Some((gi, ci))) => caps.of(parent, gi, ci),
                        _ => Vec::new(),
                    };
                    snapshot.gpus.push(GpuMemory {
                        index,
                        mig_index: Some(mig_index),
                        uuid: mig_uuid,
                        minor,
                        total: memory.total,
                        free: memory.free,
                        mig_caps,
                    });
                }
                continue;
            }
            let memory = device
                .memory_info()
                .map_err(nvml_err(format!("reading the memory of GPU {index}")))?;
            if processes_on(&uuid) {
                snapshot.processes.extend(processes_of(&device, &uuid)?);
            }
            snapshot.gpus.push(GpuMemory {
                index,
                mig_index: None,
                uuid,
                minor,
                total: memory.total,
                free: memory.free,
                mig_caps: Vec::new(),
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

    fn sees_processes(&self) -> bool {
        true
    }
}
