//! The driver limit (`[enforce] limit = "driver"`): NVML's `nvmlDeviceSetMemoryLimits_v1`
//! caps what the processes of one cgroup v2 may allocate on one GPU. The hook calls it at
//! createRuntime, when the container's init exists in its cgroup and has run nothing yet.
//!
//! What is known of the call, and from where (nothing here has run against a real driver
//! that has it; see the README's "Enforcement"):
//! - NVML API reference, `nvmlSetMemoryLimits_v1_t`
//!   (docs.nvidia.com/deploy/nvml-api/api/structnvmlSetMemoryLimits__v1__t.html): members
//!   `const char *nameSpace` ("full path to sysfs cgroup file name"), `unsigned long long
//!   softLimit`, `unsigned long long hardLimit`, in bytes, and no version field; clearing is
//!   soft 0, hard `NVML_DEVICE_MEMORY_LIMIT_MAX`.
//! - The function takes the device handle and a pointer to that struct (cuda-python's
//!   `cuda.bindings.nvml.device_set_memory_limits_v1(device, limits)`); MIG handles are not
//!   supported; setting needs root.
//! - NVIDIA's "MPS v3 Memory Partitioning" page: CUDA 13.4 or newer, cgroup v2 mounted at
//!   /sys/fs/cgroup, the namespace is the cgroup directory (`/sys/fs/cgroup/mygroup`), and a
//!   limit must be set on the container's own leaf cgroup. NVIDIA Dynamo's "Per-GPU Compute and
//!   Memory Limits with MPS" names the driver: R615 or newer.
//! - nvidia-container-toolkit's `apply-cuda-memory-limits` CDI hook does the same: the cgroup
//!   of the init from `/proc/<pid>/cgroup` under /sys/fs/cgroup, `nvmlInit`,
//!   `DeviceGetHandleByUUID`, `SetMemoryLimits_v1(cgroupPath, soft, hard)` per GPU.
//!
//! The ABI below ([`SetMemoryLimitsV1`], [`GetMemoryLimitsV1`], [`SetLimitsFn`],
//! [`GetLimitsFn`]) is NVIDIA's: CUDA 13.4's `nvml.h` (PyPI wheel `nvidia-nvml-dev==13.4.92`)
//! declares both structs without a version field, and `tests/it/nvml_abi.rs` compiles a C file
//! against that header and compares every size, offset and signature with these definitions.
//!
//! Privilege: NVML documents the set call as "Requires root/admin permissions", and NVIDIA's
//! kernel module checks `CAP_SYS_ADMIN` on the calling thread. The hook holds it in its
//! permitted set only (see [`crate::privilege`]); [`apply_driver_limit`] and
//! [`clear_driver_limit`] raise it around the set calls alone (a clear is a set call). Reading
//! a limit and its usage ([`DriverUsage`]) needs no privilege.
//!
//! Clearing: nvml.h (CUDA 13.4) says "To clear the limits, set softLimit to 0, and hardLimit to
//! NVML_DEVICE_MEMORY_LIMIT_MAX" ([`CLEAR_SOFT_LIMIT`], [`NVML_DEVICE_MEMORY_LIMIT_MAX`]) and
//! "Removing the cgroup will also clear any limits"; the set call answers
//! `NVML_ERROR_OPERATING_SYSTEM` when "the cgroup path cannot be opened". When and by whom a
//! limit is cleared is [`super::lifecycle`]'s.
//!
//! Soft and hard: hard = the limit (the reservation where the container asked for no more),
//! soft = 0 ([`SOFT_LIMIT`]) unless the container asked for a limit above its request, whose
//! soft is then the request ([`PlacedShare::soft`]): the driver's guarantee is what lets a
//! container that passes its request be held back before one that is within its own. The
//! hard limit is what refuses an allocation beyond the limit. The soft limit is a guarantee (`dmem.min`)
//! that the driver adds into every ancestor cgroup and takes back only when it is lowered
//! through NVML; runc deletes a container's cgroup without that, so a soft limit per container
//! would pile up in the ancestors of a long-running host (NVIDIA's page says so). vramgate's
//! admission is the guarantee instead: reservations never sum past the card. A container with
//! a limit above its request takes that risk for the sake of its guarantee; the clear when it
//! ends lowers its soft limit too. The hard limit is
//! the cgroup path's, and would outlive the container on it: it is cleared when the container
//! ends ([`super::lifecycle`]), soft and hard, so that holds whatever soft a later version sets.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use libloading::Library;

use super::{EnforceError, PlacedShare};

mod usage;
pub use usage::DriverUsage;

pub const SET_LIMITS_SYMBOL: &str = "nvmlDeviceSetMemoryLimits_v1";
/// What a host needs for the driver limit, in the words of doctor and the errors.
pub const DRIVER_NEEDED: &str = "NVIDIA driver R615 or later (CUDA 13.4)";
/// Where the driver expects cgroup v2.
pub const CGROUP_V2_ROOT: &str = "/sys/fs/cgroup";
/// The soft limit vramgate sets (and asks the toolkit to set): none; see the module docs.
pub const SOFT_LIMIT: u64 = 0;

/// The symbol that reads a cgroup's limit and what that cgroup uses now.
pub const GET_LIMITS_SYMBOL: &str = "nvmlDeviceGetMemoryLimits_v1";

/// `nvmlSetMemoryLimits_v1_t` (nvml.h, CUDA 13.4): 24 bytes on x86_64 and aarch64.
#[repr(C)]
pub struct SetMemoryLimitsV1 {
    /// `[in]` Full path to the cgroup's sysfs directory.
    pub name_space: *const c_char,
    pub soft_limit: c_ulonglong,
    pub hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t` (nvml.h, CUDA 13.4): the set struct plus `currentUsed`, 32 bytes.
#[repr(C)]
pub struct GetMemoryLimitsV1 {
    /// `[in]` Full path to the cgroup's sysfs directory.
    pub name_space: *const c_char,
    /// `[out]`
    pub soft_limit: c_ulonglong,
    /// `[out]`
    pub hard_limit: c_ulonglong,
    /// `[out]` What the cgroup's processes hold on the device now, in bytes.
    pub current_used: c_ulonglong,
}

/// `nvmlReturn_t` is a C enum: an int-sized value, 0 for success.
pub type NvmlReturn = c_uint;
/// `nvmlDevice_t` is an opaque pointer (`struct nvmlDevice_st *`).
pub type NvmlDevice = *mut c_void;
type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type ShutdownFn = unsafe extern "C" fn() -> NvmlReturn;
type HandleByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> NvmlReturn;
/// `nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t, nvmlSetMemoryLimits_v1_t *)`.
pub type SetLimitsFn = unsafe extern "C" fn(NvmlDevice, *mut SetMemoryLimitsV1) -> NvmlReturn;
/// `nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t, nvmlGetMemoryLimits_v1_t *)`.
pub type GetLimitsFn = unsafe extern "C" fn(NvmlDevice, *mut GetMemoryLimitsV1) -> NvmlReturn;
/// `NVML_ERROR_NO_PERMISSION`.
pub const NVML_ERROR_NO_PERMISSION: NvmlReturn = 4;
/// `NVML_ERROR_NOT_FOUND`: the get call's answer for a GPU and cgroup without a limit.
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
/// `NVML_ERROR_OPERATING_SYSTEM`: the set call's answer when "the cgroup path cannot be
/// opened" (nvml.h).
pub const NVML_ERROR_OPERATING_SYSTEM: NvmlReturn = 17;
/// `NVML_DEVICE_MEMORY_LIMIT_MAX` (nvml.h: `0xFFFFFFFFFFFFFFFF`): the hard limit that, with a
/// soft limit of 0 ([`CLEAR_SOFT_LIMIT`]), clears a cgroup's limits.
pub const NVML_DEVICE_MEMORY_LIMIT_MAX: u64 = u64::MAX;
/// The soft limit of a clear (nvml.h: "To clear the limits, set softLimit to 0, and
/// hardLimit to NVML_DEVICE_MEMORY_LIMIT_MAX").
pub const CLEAR_SOFT_LIMIT: u64 = 0;

/// Whether the driver limit can work with this NVML library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// The library loads and exports the symbol.
    Available { library: PathBuf },
    /// The library loads but is too old (drivers before R615, such as 580).
    MissingSymbol { library: PathBuf },
    /// No library loads (no NVIDIA driver here).
    NoLibrary { library: PathBuf, error: String },
}

impl Availability {
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available { .. })
    }
}

impl std::fmt::Display for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Availability::Available { library } => {
                write!(f, "{} exports {SET_LIMITS_SYMBOL}", library.display())
            }
            Availability::MissingSymbol { library } => write!(
                f,
                "{} does not export {SET_LIMITS_SYMBOL}: the driver limit needs {DRIVER_NEEDED}",
                library.display()
            ),
            Availability::NoLibrary { library, error } => {
                write!(f, "cannot load {}: {error}", library.display())
            }
        }
    }
}

/// A limit set on one GPU for one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    pub uuid: String,
    /// The cgroup v2 directory the limit was set on (NVML's `nameSpace`).
    pub cgroup: PathBuf,
    pub soft: u64,
    pub hard: u64,
}

/// Loads the configured NVML library: a path as given, a bare name through the loader's
/// search and then the directories the inventory also tries.
fn open_library(nvml_library: &Path) -> Result<(Library, PathBuf), (PathBuf, String)> {
    let name = nvml_library.to_string_lossy();
    let mut errors = Vec::new();
    for candidate in crate::inventory::nvml_candidate_paths(&name) {
        if candidate.contains('/') && candidate != name && !Path::new(&candidate).exists() {
            continue;
        }
        // SAFETY: loading the NVIDIA management library runs its initialisers, as nvml-wrapper
        // does for the inventory; it is the configured driver library, trusted like the driver.
        match unsafe { Library::new(&candidate) } {
            Ok(lib) => return Ok((lib, PathBuf::from(candidate))),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err((nvml_library.to_path_buf(), errors.join("; ")))
}

/// Whether `nvml_library` loads and exports `nvmlDeviceSetMemoryLimits_v1`. Only loads and
/// looks up: no NVML call, so it is cheap and safe on any host.
pub fn driver_limit_available(nvml_library: &Path) -> Availability {
    match open_library(nvml_library) {
        Err((library, error)) => Availability::NoLibrary { library, error },
        Ok((lib, library)) => {
            // SAFETY: only the symbol's presence is checked; it is never called through this type.
            match unsafe { lib.get::<SetLimitsFn>(SET_LIMITS_SYMBOL.as_bytes()) } {
                Ok(_) => Availability::Available { library },
                Err(_) => Availability::MissingSymbol { library },
            }
        }
    }
}

/// The cgroup v2 directory of process `init_pid`: its `0::/path` line of
/// `<proc_root>/<pid>/cgroup`, under `cgroup_root`. Refused: a host without cgroup v2, the
/// root cgroup (a limit there would hold every process of the host), a path that climbs
/// (`..`, what a process in another cgroup namespace sees), and a directory that is not
/// cgroup v2 (a hybrid host, whose v2 tree is not at /sys/fs/cgroup).
pub fn container_cgroup(init_pid: u32, proc_root: &Path, cgroup_root: &Path) -> Result<PathBuf, EnforceError> {
    let path = proc_root.join(init_pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| EnforceError::ReadCgroup {
        path: path.clone(),
        source,
    })?;
    let Some(value) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Err(EnforceError::CgroupV1Only { path });
    };
    let bad = |reason| EnforceError::BadCgroup {
        path: path.clone(),
        value: value.to_string(),
        reason,
    };
    let relative = Path::new(value);
    if !relative.is_absolute() {
        return Err(bad("not an absolute cgroup path"));
    }
    if relative.components().any(|c| c == Component::ParentDir) {
        return Err(bad(
            "it lies outside the reader's cgroup namespace; run the hook in the host's",
        ));
    }
    if relative.components().all(|c| c == Component::RootDir) {
        return Err(bad(
            "the root cgroup: a limit there would hold every process of the host; run the container in a cgroup of its own",
        ));
    }
    let dir = cgroup_root.join(value.trim_start_matches('/'));
    if !dir.join("cgroup.controllers").exists() {
        return Err(EnforceError::NotCgroupV2 { dir });
    }
    Ok(dir)
}

/// The `nvmlReturn_t` values the driver limit's calls document, with nvml.h's names
/// (`tests/it/nvml_abi.rs` checks each against the header).
pub const NVML_ERRORS: &[(NvmlReturn, &str)] = &[
    (1, "NVML_ERROR_UNINITIALIZED"),
    (2, "NVML_ERROR_INVALID_ARGUMENT"),
    (3, "NVML_ERROR_NOT_SUPPORTED"),
    (NVML_ERROR_NO_PERMISSION, "NVML_ERROR_NO_PERMISSION"),
    (NVML_ERROR_NOT_FOUND, "NVML_ERROR_NOT_FOUND"),
    (9, "NVML_ERROR_DRIVER_NOT_LOADED"),
    (13, "NVML_ERROR_FUNCTION_NOT_FOUND"),
    (15, "NVML_ERROR_GPU_IS_LOST"),
    (NVML_ERROR_OPERATING_SYSTEM, "NVML_ERROR_OPERATING_SYSTEM"),
    (25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"),
    (999, "NVML_ERROR_UNKNOWN"),
];

/// NVML's name for a return code, for messages (the library's own `nvmlErrorString` is not
/// called: a library too old or broken to set limits is the case worth explaining).
pub fn nvml_error_name(code: NvmlReturn) -> &'static str {
    NVML_ERRORS
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("see nvml.h", |(_, name)| name)
}

/// Sets each GPU's hard limit to the container's reservation on it, for the cgroup of its
/// init (`init_pid`, read from `proc_root`, under /sys/fs/cgroup). MIG shares are skipped (the
/// driver refuses MIG handles; a MIG device's memory is its own already), so the result may
/// be shorter than `shares`; with no other share nothing is loaded. All or nothing: when one
/// GPU fails, the limits already set on the others are cleared before the error returns (see
/// [`apply_driver_limit_to`]); the caller decides whether a container without its limit may
/// start.
pub fn apply_driver_limit(
    nvml_library: &Path,
    init_pid: u32,
    shares: &[PlacedShare],
    proc_root: &Path,
) -> Result<Vec<AppliedLimit>, EnforceError> {
    apply_driver_limit_at(nvml_library, init_pid, shares, proc_root, Path::new(CGROUP_V2_ROOT))
}

/// [`apply_driver_limit`] with the cgroup v2 mount given (tests on a hybrid host use its
/// `unified` mount).
pub fn apply_driver_limit_at(
    nvml_library: &Path,
    init_pid: u32,
    shares: &[PlacedShare],
    proc_root: &Path,
    cgroup_root: &Path,
) -> Result<Vec<AppliedLimit>, EnforceError> {
    if whole_gpus(shares).is_empty() {
        return Ok(Vec::new());
    }
    let cgroup = container_cgroup(init_pid, proc_root, cgroup_root)?;
    apply_driver_limit_to(nvml_library, &cgroup, shares)
}

/// The shares the driver can limit: whole GPUs, not MIG devices.
pub fn whole_gpus(shares: &[PlacedShare]) -> Vec<&PlacedShare> {
    shares.iter().filter(|s| s.mig_index.is_none()).collect()
}

/// The cgroup directory as NVML's `nameSpace`.
fn name_space(cgroup: &Path) -> Result<CString, EnforceError> {
    CString::new(cgroup.as_os_str().as_bytes()).map_err(|_| EnforceError::BadCgroup {
        path: cgroup.to_path_buf(),
        value: cgroup.display().to_string(),
        reason: "it contains a NUL byte",
    })
}

/// [`apply_driver_limit`] on a cgroup directory already found ([`container_cgroup`]). A
/// failure on one GPU clears what was set on the GPUs before it (a limit left on the cgroup
/// would outlive the refused container: a container made again with the same cgroup path
/// would start under it); should that clear fail too, the error is
/// [`EnforceError::LeftSet`], naming the GPUs whose limit stands.
pub fn apply_driver_limit_to(
    nvml_library: &Path,
    cgroup: &Path,
    shares: &[PlacedShare],
) -> Result<Vec<AppliedLimit>, EnforceError> {
    let whole = whole_gpus(shares);
    if whole.is_empty() {
        return Ok(Vec::new());
    }
    let name_space = name_space(cgroup)?;
    let nvml = Session::open(nvml_library)?;
    let mut applied = Vec::new();
    for share in whole {
        if let Err(e) = nvml.set(&share.uuid, &name_space, cgroup, share.soft(), share.hard()) {
            // Clears every GPU set so far; `left` keeps those whose clear failed.
            let left: Vec<String> = applied
                .iter()
                .filter(|a: &&AppliedLimit| nvml.clear(&a.uuid, &name_space, cgroup).is_err())
                .map(|a| a.uuid.clone())
                .collect();
            if left.is_empty() {
                return Err(e);
            }
            return Err(EnforceError::LeftSet {
                source: Box::new(e),
                cgroup: cgroup.to_path_buf(),
                left,
            });
        }
        applied.push(AppliedLimit {
            uuid: share.uuid.clone(),
            cgroup: cgroup.to_path_buf(),
            soft: share.soft(),
            hard: share.hard(),
        });
    }
    Ok(applied)
}

/// What clearing one GPU's limit for a cgroup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleared {
    /// The driver took the clearing values.
    Cleared,
    /// The driver holds no limit for this GPU and cgroup (`NVML_ERROR_NOT_FOUND`).
    NoLimit,
    /// The cgroup directory is gone and the driver cannot open it
    /// (`NVML_ERROR_OPERATING_SYSTEM`): nvml.h says removing the cgroup clears its limits.
    CgroupGone,
}

impl Cleared {
    pub fn as_str(self) -> &'static str {
        match self {
            Cleared::Cleared => "cleared",
            Cleared::NoLimit => "no limit held",
            Cleared::CgroupGone => "cgroup gone",
        }
    }
}

/// Clears the driver limit of cgroup directory `cgroup` on each GPU of `uuids` (soft 0, hard
/// [`NVML_DEVICE_MEMORY_LIMIT_MAX`], nvml.h's clearing values), with CAP_SYS_ADMIN raised
/// around each call as for setting. Every GPU is tried; the first error is returned once all
/// were. Nothing to clear is no error: see [`Cleared`].
pub fn clear_driver_limit(
    nvml_library: &Path,
    cgroup: &Path,
    uuids: &[String],
) -> Result<Vec<(String, Cleared)>, EnforceError> {
    if uuids.is_empty() {
        return Ok(Vec::new());
    }
    let name_space = name_space(cgroup)?;
    let nvml = Session::open(nvml_library)?;
    let mut cleared = Vec::new();
    let mut first_error = None;
    for uuid in uuids {
        match nvml.clear(uuid, &name_space, cgroup) {
            Ok(outcome) => cleared.push((uuid.clone(), outcome)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(cleared),
    }
}

/// NVML loaded and started for the set call, shut down when dropped.
struct Session {
    // The function pointers are copied out of `_lib`, which is dropped after `Drop::drop`
    // has shut NVML down (fields drop after the struct's own `drop`).
    by_uuid: HandleByUuidFn,
    set_limits: SetLimitsFn,
    shutdown: ShutdownFn,
    library: PathBuf,
    _lib: Library,
}

impl Session {
    /// Loads the library, finds every symbol the set call needs (before any call: a library
    /// without one is left uncalled) and starts NVML.
    fn open(nvml_library: &Path) -> Result<Session, EnforceError> {
        let (lib, library) =
            open_library(nvml_library).map_err(|(library, message)| EnforceError::LoadLibrary { library, message })?;
        let symbol = |name: &'static str| EnforceError::MissingSymbol {
            library: library.clone(),
            symbol: name,
        };
        // SAFETY: nvml.h's signatures (`tests/it/nvml_abi.rs` checks them against the header);
        // the pointers are used only while `lib` is loaded (see the struct).
        let (init, shutdown, by_uuid, set_limits) = unsafe {
            (
                *lib.get::<InitFn>(b"nvmlInit_v2").map_err(|_| symbol("nvmlInit_v2"))?,
                *lib.get::<ShutdownFn>(b"nvmlShutdown")
                    .map_err(|_| symbol("nvmlShutdown"))?,
                *lib.get::<HandleByUuidFn>(b"nvmlDeviceGetHandleByUUID")
                    .map_err(|_| symbol("nvmlDeviceGetHandleByUUID"))?,
                *lib.get::<SetLimitsFn>(SET_LIMITS_SYMBOL.as_bytes())
                    .map_err(|_| symbol(SET_LIMITS_SYMBOL))?,
            )
        };
        // SAFETY: nvmlInit_v2 takes nothing; NVML counts inits, so this pairs with the
        // shutdown in Drop whatever else in the process uses NVML.
        let code = unsafe { init() };
        if code != 0 {
            return Err(EnforceError::Nvml {
                library,
                function: "nvmlInit_v2",
                argument: String::new(),
                code,
                name: nvml_error_name(code),
            });
        }
        Ok(Session {
            by_uuid,
            set_limits,
            shutdown,
            library,
            _lib: lib,
        })
    }

    fn error(&self, function: &'static str, argument: String, code: NvmlReturn) -> EnforceError {
        EnforceError::Nvml {
            library: self.library.clone(),
            function,
            argument,
            code,
            name: nvml_error_name(code),
        }
    }

    /// `nvmlDeviceSetMemoryLimits_v1(uuid's device, {cgroup, soft, hard})`; `Err` is the
    /// driver's code, `Ok` success.
    fn call(
        &self,
        uuid: &str,
        name_space: &CString,
        soft: u64,
        hard: u64,
    ) -> Result<Result<(), NvmlReturn>, EnforceError> {
        let Ok(uuid_c) = CString::new(uuid.as_bytes()) else {
            return Err(EnforceError::NulInUuid { uuid: uuid.to_string() });
        };
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a pointer to a handle, as nvml.h declares.
        let code = unsafe { (self.by_uuid)(uuid_c.as_ptr(), &mut device) };
        if code != 0 {
            return Err(self.error("nvmlDeviceGetHandleByUUID", uuid.to_string(), code));
        }
        let mut limits = SetMemoryLimitsV1 {
            name_space: name_space.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // The one call that needs CAP_SYS_ADMIN, held effective for it alone. A process that
        // cannot raise it (rootless, or a caller that gave it up) still makes the call: the
        // driver's answer, explained by the caller, is the error.
        let admin = crate::privilege::raise_for_driver_limit().ok().flatten();
        // SAFETY: a handle NVML just returned and the struct above, whose nameSpace outlives
        // the call.
        let code = unsafe { (self.set_limits)(device, &mut limits) };
        drop(admin);
        Ok(if code == 0 { Ok(()) } else { Err(code) })
    }

    fn set(&self, uuid: &str, name_space: &CString, cgroup: &Path, soft: u64, hard: u64) -> Result<(), EnforceError> {
        let argument = || format!("{uuid}, {}", cgroup.display());
        match self.call(uuid, name_space, soft, hard)? {
            Ok(()) => Ok(()),
            Err(NVML_ERROR_NO_PERMISSION) => Err(EnforceError::NoPermission {
                library: self.library.clone(),
                argument: argument(),
            }),
            Err(code) => Err(self.error(SET_LIMITS_SYMBOL, argument(), code)),
        }
    }

    fn clear(&self, uuid: &str, name_space: &CString, cgroup: &Path) -> Result<Cleared, EnforceError> {
        match self.call(uuid, name_space, CLEAR_SOFT_LIMIT, NVML_DEVICE_MEMORY_LIMIT_MAX)? {
            Ok(()) => Ok(Cleared::Cleared),
            Err(code) => match clear_outcome(code, cgroup.is_dir()) {
                Some(outcome) => Ok(outcome),
                None if code == NVML_ERROR_NO_PERMISSION => Err(EnforceError::NoPermission {
                    library: self.library.clone(),
                    argument: format!("{uuid}, {}, clear", cgroup.display()),
                }),
                None => Err(self.error(SET_LIMITS_SYMBOL, format!("{uuid}, {}, clear", cgroup.display()), code)),
            },
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: pairs with the successful init in `open`. Its result changes nothing: the
        // calls are made, and their errors say what happened.
        let _ = unsafe { (self.shutdown)() };
    }
}

/// Which driver answers to a clear mean there is nothing to clear: no limit for this GPU and
/// cgroup, or a cgroup that is gone (nvml.h: "Removing the cgroup will also clear any
/// limits"; a cgroup that still exists but cannot be opened is an error).
pub fn clear_outcome(code: NvmlReturn, cgroup_exists: bool) -> Option<Cleared> {
    match code {
        0 => Some(Cleared::Cleared),
        NVML_ERROR_NOT_FOUND => Some(Cleared::NoLimit),
        NVML_ERROR_OPERATING_SYSTEM if !cgroup_exists => Some(Cleared::CgroupGone),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
