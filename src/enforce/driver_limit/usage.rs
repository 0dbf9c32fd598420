//! Reading what a container's cgroup holds on a GPU under the driver limit (the exporter and
//! `vramgate watch`), apart from the set and clear calls: it needs no privilege and a
//! library without the get symbol only means no figures.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libloading::Library;

use super::{
    container_cgroup, open_library, GetLimitsFn, GetMemoryLimitsV1, HandleByUuidFn, InitFn, NvmlDevice, ShutdownFn,
    CGROUP_V2_ROOT, GET_LIMITS_SYMBOL,
};

/// Reads what a container's cgroup holds on a GPU under the driver limit:
/// `nvmlDeviceGetMemoryLimits_v1`'s `currentUsed`, which counts every process of the cgroup.
/// Opened once per process (dlopen and `nvmlInit`, before any lock is taken), read per
/// reservation; a library without the symbol (drivers before R615, such as 580) gives no
/// figures, and attribution falls back to processes by pid namespace.
pub struct DriverUsage {
    // The library stays loaded while the function pointers below are used: they are copied
    // out of it, and `lib` is dropped after `Drop::drop` has shut NVML down.
    by_uuid: HandleByUuidFn,
    get_limits: GetLimitsFn,
    shutdown: ShutdownFn,
    cgroup_root: PathBuf,
    proc_root: PathBuf,
    _lib: Library,
}

impl DriverUsage {
    /// Loads `nvml_library` and starts NVML; `None` where the library, one of its symbols, or
    /// NVML's start is missing (then there is nothing to read).
    pub fn open(nvml_library: &Path) -> Option<DriverUsage> {
        DriverUsage::open_at(nvml_library, Path::new("/proc"), Path::new(CGROUP_V2_ROOT))
    }

    /// [`DriverUsage::open`] with the /proc and cgroup v2 mounts given (tests).
    pub fn open_at(nvml_library: &Path, proc_root: &Path, cgroup_root: &Path) -> Option<DriverUsage> {
        let (lib, _) = open_library(nvml_library).ok()?;
        // SAFETY: nvml.h's signatures (`tests/it/nvml_abi.rs` checks them against the header);
        // the pointers are used only while `lib` is loaded (see the struct).
        let (init, shutdown, by_uuid, get_limits) = unsafe {
            (
                *lib.get::<InitFn>(b"nvmlInit_v2").ok()?,
                *lib.get::<ShutdownFn>(b"nvmlShutdown").ok()?,
                *lib.get::<HandleByUuidFn>(b"nvmlDeviceGetHandleByUUID").ok()?,
                *lib.get::<GetLimitsFn>(GET_LIMITS_SYMBOL.as_bytes()).ok()?,
            )
        };
        // SAFETY: takes nothing; paired with the shutdown in Drop.
        if unsafe { init() } != 0 {
            return None;
        }
        Some(DriverUsage {
            by_uuid,
            get_limits,
            shutdown,
            cgroup_root: cgroup_root.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            _lib: lib,
        })
    }

    /// What the cgroup directory `cgroup` holds on GPU `uuid` now, as the driver counts it.
    pub fn used_by_cgroup(&self, uuid: &str, cgroup: &Path) -> Option<u64> {
        let uuid = CString::new(uuid).ok()?;
        let name_space = CString::new(cgroup.as_os_str().as_bytes()).ok()?;
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a pointer to a handle, as nvml.h declares.
        if unsafe { (self.by_uuid)(uuid.as_ptr(), &mut device) } != 0 {
            return None;
        }
        let mut limits = GetMemoryLimitsV1 {
            name_space: name_space.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: a handle NVML just returned and the struct above, whose nameSpace outlives
        // the call.
        let code = unsafe { (self.get_limits)(device, &mut limits) };
        (code == 0).then_some(limits.current_used)
    }
}

impl crate::attribution::CgroupUsage for DriverUsage {
    /// Only containers the driver limit holds have a figure: the cgroup of their init, read
    /// now (a pending reservation's process is the runtime, not the container).
    fn used(&self, reservation: &crate::ledger::Reservation, uuid: &str) -> Option<u64> {
        if reservation.pending || reservation.enforcement != Some(crate::enforce::Tier::DriverLimit) {
            return None;
        }
        let cgroup = container_cgroup(reservation.init.pid, &self.proc_root, &self.cgroup_root).ok()?;
        self.used_by_cgroup(uuid, &cgroup)
    }
}

impl Drop for DriverUsage {
    fn drop(&mut self) {
        // SAFETY: pairs with the successful init in `open_at`.
        let _ = unsafe { (self.shutdown)() };
    }
}
