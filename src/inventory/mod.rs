//! What the host has: each GPU's (or MIG device's) total and free memory.
//!
//! A trait with two backends, chosen by config: NVML on a GPU host, a static list (from the
//! config file, or one simulated card) on a host without one. Tests and the demo use the
//! static backend; the admission rule cannot tell them apart.

pub mod mig_caps;
mod nvml;
mod recorded;
pub mod settings;
mod static_list;

use std::path::{Path, PathBuf};

pub use nvml::candidate_paths as nvml_candidate_paths;
pub use nvml::NvmlInventory;
pub use recorded::{RecordedHost, RecordedInventory};
pub use static_list::StaticInventory;

use settings::Backend;
pub use settings::{Settings, StaticReader};

/// One memory domain that containers are admitted against: a whole GPU, or a MIG device
/// (which has memory of its own).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuMemory {
    /// The GPU's index (for a MIG device: its parent's).
    pub index: u32,
    /// For a MIG device, its index on the parent (`NVIDIA_VISIBLE_DEVICES=0:1`).
    pub mig_index: Option<u32>,
    pub uuid: String,
    /// Minor number of the `/dev/nvidiaN` node (the parent's, for a MIG device).
    pub minor: Option<u32>,
    pub total: u64,
    /// What the driver reports free now: memory used by anything (inside vramgate or not) is
    /// already taken out.
    pub free: u64,
    /// For a MIG device: the minors of the `/dev/nvidia-caps/nvidia-capN` nodes that grant
    /// access to it (its GPU instance's and compute instance's), from the driver's
    /// `/proc/driver/nvidia-caps/mig-minors`. A container given a MIG device through CDI gets
    /// its parent's `/dev/nvidiaN` and these nodes: they say which MIG device it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_caps: Vec<u32>,
}

impl GpuMemory {
    /// An 80 GiB GPU (or MIG device `mig` of GPU `index`) with all its memory free, minor =
    /// index: what unit tests build hosts from.
    #[cfg(test)]
    pub(crate) fn for_test(index: u32, mig: Option<u32>, uuid: &str) -> GpuMemory {
        GpuMemory {
            index,
            mig_index: mig,
            uuid: uuid.into(),
            minor: Some(index),
            total: 80 << 30,
            free: 80 << 30,
            mig_caps: Vec::new(),
        }
    }
}

/// A process that holds GPU memory, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuProcess {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub gpus: Vec<GpuMemory>,
    /// GPUs in MIG mode whose memory is admitted per MIG device, not as a whole.
    #[serde(default)]
    pub mig_parents: Vec<u32>,
    /// Filled only by backends that can see processes (NVML).
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
}

impl GpuMemory {
    /// The device nodes a container of this GPU needs, of those this host has: its
    /// `/dev/nvidiaN` (the parent's, for a MIG device, with the MIG device's capability nodes)
    /// and the driver's control nodes. The DRA driver's CDI spec and the device plugin's
    /// Allocate both list them, so that a node without NVIDIA's container toolkit still gives
    /// the container its GPU, and only that one. A host without them (no GPU: a simulated
    /// inventory) gets none, and the container only the environment.
    pub fn device_nodes(&self, dev: &std::path::Path) -> Vec<std::path::PathBuf> {
        let own = self.minor.map(|m| format!("nvidia{m}"));
        let caps = self.mig_caps.iter().map(|c| format!("nvidia-caps/nvidia-cap{c}"));
        own.into_iter()
            .chain(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"].map(String::from))
            .chain(caps)
            .map(|name| dev.join(name))
            .filter(|path| path.exists())
            .collect()
    }
}

impl Snapshot {
    pub fn by_uuid(&self, uuid: &str) -> Option<&GpuMemory> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot load the NVIDIA management library {library:?} (tried {tried}): install the NVIDIA driver's user-space library (Debian/Ubuntu: libnvidia-ml1 or nvidia-utils-<version>; RHEL: nvidia-driver-NVML), set inventory.nvml_library to the full path of libnvidia-ml.so.1 (`ldconfig -p | grep libnvidia-ml` finds it), or set inventory.backend = \"static\" on a host without an NVIDIA GPU")]
    NvmlLoad { library: String, tried: String },
    #[error(
        "NVML from {library} loaded but failed to start ({source}): {}",
        nvml_init_hint(source)
    )]
    NvmlInit {
        library: String,
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML failed while {what}: {source}")]
    Nvml {
        what: String,
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("this host has an NVIDIA GPU ({evidence} exists) but the NVIDIA management library {library:?} cannot be loaded (tried {tried}): vramgate will not admit against a simulated GPU here; install the driver's user-space library (Debian/Ubuntu: libnvidia-ml1 or nvidia-utils-<version>), or set inventory.nvml_library to the full path of libnvidia-ml.so.1 (`ldconfig -p | grep libnvidia-ml` finds it)")]
    NvmlMissingOnGpuHost {
        library: String,
        tried: String,
        evidence: PathBuf,
    },
    #[error("{config}: inventory.backend = \"auto\" with {count} [[inventory.gpus]] table(s), on a host with an NVIDIA GPU ({evidence} exists): vramgate will not admit against a simulated GPU here; remove the [[inventory.gpus]] tables to read the real GPUs through NVML, or set inventory.backend = \"static\" to simulate them on purpose")]
    StaticListOnGpuHost {
        config: String,
        count: usize,
        evidence: PathBuf,
    },
    #[error("cannot read the static GPU list from {path}: {message}")]
    Static { path: PathBuf, message: String },
    #[error("internal error: the GPU inventory was read by an operation that opened none")]
    NotOpened,
}

/// What to do about an NVML that loads but does not start.
fn nvml_init_hint(error: &nvml_wrapper::error::NvmlError) -> &'static str {
    use nvml_wrapper::error::NvmlError as E;
    match error {
        E::DriverNotLoaded => "the NVIDIA kernel driver is not loaded: load it (`modprobe nvidia`) and check with `nvidia-smi`",
        E::NoPermission => "no permission to use the GPU: run as root, or check the /dev/nvidia* permissions",
        E::LibRmVersionMismatch => "the library and the kernel driver are different versions (a driver upgrade without a reboot): reboot, or reload the nvidia kernel modules",
        _ => "check that `nvidia-smi` works on this host; set inventory.backend = \"static\" to run without NVML",
    }
}

pub trait Inventory {
    /// Gets the backend ready so that a snapshot costs only its reads (NVML: loads the library
    /// and starts it). The service calls it before it takes the ledger lock, so no container
    /// start waits behind a driver's initialisation. Backends with nothing to open are ready.
    fn open(&self) -> Result<(), InventoryError> {
        Ok(())
    }
    /// Whether [`Inventory::open`] has succeeded (or was never needed).
    fn is_open(&self) -> bool {
        true
    }
    /// Memory of every GPU, taken now. Called inside the ledger lock, so it must be bounded.
    fn snapshot(&self) -> Result<Snapshot, InventoryError>;
    /// Like `snapshot`, but lists the processes only of the devices (by UUID) for which
    /// `processes_on` is true: process lists cost extra driver calls, and a decision needs
    /// them only where live reservations are.
    fn snapshot_with_processes(&self, processes_on: &dyn Fn(&str) -> bool) -> Result<Snapshot, InventoryError> {
        let _ = processes_on;
        self.snapshot()
    }
    /// True when snapshots carry the processes holding memory (so "no process" means "none
    /// allocated", not "unknown").
    fn sees_processes(&self) -> bool {
        false
    }
    /// A few words for logs and `vramgate doctor` ("NVML 580.xx", "static (simulated)").
    fn describe(&self) -> String;
    /// Each GPU's product name and, for a MIG device, its profile (`1g.10gb`), by UUID: what
    /// the DRA driver publishes as attributes. Asked once, never on a decision's path; empty
    /// where the backend cannot tell (a static list).
    fn product_names(&self) -> std::collections::HashMap<String, (String, Option<String>)> {
        std::collections::HashMap::new()
    }
}

/// The inventory of operations that never read the GPUs (release, gc): opening NVML at every
/// container stop would cost driver calls for nothing. Reading it is an error, never numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct NotNeeded;

impl Inventory for NotNeeded {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        Err(InventoryError::NotOpened)
    }

    fn describe(&self) -> String {
        "not opened".into()
    }
}

/// The backend the config asks for, opened only when a decision needs it: the service opens
/// it (outside the ledger lock) before an attempt that reads the GPUs, and a hook that only
/// confirms a reservation `vramgate-runtime` made at create never loads NVML.
pub struct OpenOnUse<'c> {
    config: &'c dyn Settings,
    opened: std::cell::OnceCell<Box<dyn Inventory>>,
}

impl<'c> OpenOnUse<'c> {
    pub fn new(config: &'c dyn Settings) -> OpenOnUse<'c> {
        OpenOnUse {
            config,
            opened: std::cell::OnceCell::new(),
        }
    }

    fn get(&self) -> Result<&dyn Inventory, InventoryError> {
        if let Some(inventory) = self.opened.get() {
            return Ok(inventory.as_ref());
        }
        let inventory = open(self.config)?;
        Ok(self.opened.get_or_init(|| inventory).as_ref())
    }
}

impl Inventory for OpenOnUse<'_> {
    fn open(&self) -> Result<(), InventoryError> {
        self.get().map(|_| ())
    }

    fn is_open(&self) -> bool {
        self.opened.get().is_some()
    }

    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        self.get()?.snapshot()
    }

    fn snapshot_with_processes(&self, processes_on: &dyn Fn(&str) -> bool) -> Result<Snapshot, InventoryError> {
        self.get()?.snapshot_with_processes(processes_on)
    }

    fn sees_processes(&self) -> bool {
        self.get().is_ok_and(|i| i.sees_processes())
    }

    fn describe(&self) -> String {
        match self.get() {
            Ok(inventory) => inventory.describe(),
            Err(e) => format!("not opened ({e})"),
        }
    }

    fn product_names(&self) -> std::collections::HashMap<String, (String, Option<String>)> {
        self.get().map(|i| i.product_names()).unwrap_or_default()
    }
}

/// Opens the backend the config asks for. `auto` means NVML when its library loads and the
/// static list when the library is absent; a library that loads but fails is an error, never
/// a silent fall back to simulated numbers on a real GPU host. The same holds for a static
/// list under `auto` (the shipped config's commented example, uncommented): only on a host
/// without an NVIDIA GPU; where the driver shows one, it is an error naming the list.
pub fn open(config: &dyn Settings) -> Result<Box<dyn Inventory>, InventoryError> {
    open_at(config, Path::new("/"))
}

/// [`open`] on the host whose `/dev` and `/proc` are under `root`.
fn open_at(config: &dyn Settings, root: &Path) -> Result<Box<dyn Inventory>, InventoryError> {
    let settings = config.inventory();
    match settings.backend {
        Backend::Static => Ok(Box::new(StaticInventory::from_config(config))),
        Backend::Nvml => Ok(Box::new(NvmlInventory::open(&settings.nvml_library)?)),
        Backend::Auto => {
            if !settings.gpus.is_empty() {
                if let Some(evidence) = nvidia_gpu_evidence(root) {
                    return Err(InventoryError::StaticListOnGpuHost {
                        config: config
                            .source()
                            .map_or_else(|| "the config".to_string(), |p| p.display().to_string()),
                        count: settings.gpus.len(),
                        evidence,
                    });
                }
                return Ok(Box::new(StaticInventory::from_config(config)));
            }
            match NvmlInventory::open(&settings.nvml_library) {
                Ok(nvml) => Ok(Box::new(nvml)),
                // The simulated GPU is for hosts without one. Where the driver shows a GPU, a
                // library that does not load is a broken host, never a 24 GiB simulated card
                // that admission would trust.
                Err(InventoryError::NvmlLoad { library, tried }) => match nvidia_gpu_evidence(root) {
                    None => Ok(Box::new(StaticInventory::from_config(config))),
                    Some(evidence) => Err(InventoryError::NvmlMissingOnGpuHost {
                        library,
                        tried,
                        evidence,
                    }),
                },
                Err(e) => Err(e),
            }
        }
    }
}

/// What shows that the host under `root` has an NVIDIA GPU whatever NVML says: the driver's
/// `/proc/driver/nvidia`, or its device nodes (`/dev/nvidiactl`, `/dev/nvidia0`...). `None` on
/// a host with neither, where `backend = "auto"` may simulate one.
pub fn nvidia_gpu_evidence(root: &Path) -> Option<PathBuf> {
    let proc_entry = root.join("proc/driver/nvidia");
    if proc_entry.exists() {
        return Some(proc_entry);
    }
    let control = root.join("dev/nvidiactl");
    if control.exists() {
        return Some(control);
    }
    std::fs::read_dir(root.join("dev"))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|entry| {
            let name = entry.file_name();
            nvidia_minor(&format!("/dev/{}", name.to_string_lossy())).map(|_| entry.path())
        })
}

/// `/dev/nvidia-caps/nvidia-cap12` is MIG capability 12.
pub fn mig_cap_minor(path: &str) -> Option<u32> {
    device_number(path, "/dev/nvidia-caps/nvidia-cap")
}

/// `/dev/nvidia3` is GPU minor 3; `/dev/nvidiactl`, `/dev/nvidia-uvm` and the like are not GPUs.
pub fn nvidia_minor(path: &str) -> Option<u32> {
    device_number(path, "/dev/nvidia")
}

/// The number that follows `prefix` in a device node's path, when only digits follow.
fn device_number(path: &str, prefix: &str) -> Option<u32> {
    let digits = path.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn auto_takes_a_static_list_only_on_a_host_without_a_gpu() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        let mut config = Config::default();
        config.source = Some(PathBuf::from("/etc/vramgate/config.toml"));
        config.inventory.gpus.push(crate::config::StaticGpu {
            index: 0,
            uuid: "GPU-sim".into(),
            total: 80 << 30,
            used_outside: 0,
            minor: 0,
        });
        let inventory = open_at(&config, root.path()).unwrap();
        assert_eq!(inventory.snapshot().unwrap().gpus[0].uuid, "GPU-sim");
        std::fs::write(root.path().join("dev/nvidiactl"), "").unwrap();
        let err = open_at(&config, root.path()).err().unwrap().to_string();
        assert!(
            err.starts_with(
                "/etc/vramgate/config.toml: inventory.backend = \"auto\" with 1 [[inventory.gpus]] table(s)"
            ) && err.contains(&format!("({} exists)", root.path().join("dev/nvidiactl").display()))
                && err.contains("will not admit against a simulated GPU"),
            "{err}"
        );
        config.inventory.backend = Backend::Static;
        assert!(
            open_at(&config, root.path()).is_ok(),
            "static on purpose is the operator's word"
        );
    }

    #[test]
    fn a_gpu_host_is_told_by_the_driver_s_proc_entry_or_its_device_nodes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/null"), "").unwrap();
        std::fs::write(root.path().join("dev/nvidia-uvm"), "").unwrap();
        assert_eq!(nvidia_gpu_evidence(root.path()), None, "nvidia-uvm alone is no GPU");
        std::fs::write(root.path().join("dev/nvidia3"), "").unwrap();
        assert_eq!(nvidia_gpu_evidence(root.path()), Some(root.path().join("dev/nvidia3")));
        std::fs::write(root.path().join("dev/nvidiactl"), "").unwrap();
        assert_eq!(
            nvidia_gpu_evidence(root.path()),
            Some(root.path().join("dev/nvidiactl"))
        );
        std::fs::create_dir_all(root.path().join("proc/driver/nvidia")).unwrap();
        assert_eq!(
            nvidia_gpu_evidence(root.path()),
            Some(root.path().join("proc/driver/nvidia"))
        );
    }
}
