//! The driver memory limit's ABI, pinned to NVIDIA's own header: a C file compiled against
//! CUDA 13.4's `nvml.h` (the first to declare `nvmlDeviceSetMemoryLimits_v1`; fetched from the
//! PyPI wheel `nvidia-nvml-dev==13.4.92` by `scripts/fetch-nvml-header`, never vendored) checks
//! each function's signature at compile time and prints each struct's size and offsets, each
//! return code and the limit constant; the Rust definitions in
//! `src/enforce/driver_limit.rs` must match every figure.

use std::ffi::{c_uint, c_ulonglong, c_void};
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use vramgate::enforce::driver_limit::{
    nvml_error_name, GetLimitsFn, GetMemoryLimitsV1, NvmlDevice, NvmlReturn, SetLimitsFn, SetMemoryLimitsV1,
    NVML_ERRORS,
};

fn header_dir() -> PathBuf {
    let dir = std::env::var_os("VRAMGATE_NVML_HEADER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vramgate-tests/nvml-13.4.92"));
    assert!(
        dir.join("nvml.h").is_file(),
        "{} has no nvml.h: run scripts/install-deps (scripts/fetch-nvml-header fetches it)",
        dir.display()
    );
    dir
}

/// The C side: the functions' types as vramgate calls them (each Rust `fn` type below mirrors
/// one line), checked against the header's declarations by the compiler, then the layout.
const PROBE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include "nvml.h"

#define SAME(a, b) __builtin_types_compatible_p(a, b)
_Static_assert(SAME(__typeof__(&nvmlDeviceSetMemoryLimits_v1), nvmlReturn_t (*)(nvmlDevice_t, nvmlSetMemoryLimits_v1_t *)), "nvmlDeviceSetMemoryLimits_v1");
_Static_assert(SAME(__typeof__(&nvmlDeviceGetMemoryLimits_v1), nvmlReturn_t (*)(nvmlDevice_t, nvmlGetMemoryLimits_v1_t *)), "nvmlDeviceGetMemoryLimits_v1");
_Static_assert(SAME(__typeof__(&nvmlInit_v2), nvmlReturn_t (*)(void)), "nvmlInit_v2");
_Static_assert(SAME(__typeof__(&nvmlShutdown), nvmlReturn_t (*)(void)), "nvmlShutdown");
_Static_assert(SAME(__typeof__(&nvmlDeviceGetHandleByUUID), nvmlReturn_t (*)(const char *, nvmlDevice_t *)), "nvmlDeviceGetHandleByUUID");
#define FIELD(s, f, t) _Static_assert(SAME(__typeof__(((s *)0)->f), t), #s "." #f)
FIELD(nvmlSetMemoryLimits_v1_t, nameSpace, const char *);
FIELD(nvmlSetMemoryLimits_v1_t, softLimit, unsigned long long);
FIELD(nvmlSetMemoryLimits_v1_t, hardLimit, unsigned long long);
FIELD(nvmlGetMemoryLimits_v1_t, nameSpace, const char *);
FIELD(nvmlGetMemoryLimits_v1_t, softLimit, unsigned long long);
FIELD(nvmlGetMemoryLimits_v1_t, hardLimit, unsigned long long);
FIELD(nvmlGetMemoryLimits_v1_t, currentUsed, unsigned long long);

#define ERROR(name) printf(#name " %d\n", (int)name)
int main(void) {
    printf("set.size %zu\n", sizeof(nvmlSetMemoryLimits_v1_t));
    printf("set.nameSpace %zu\n", offsetof(nvmlSetMemoryLimits_v1_t, nameSpace));
    printf("set.softLimit %zu\n", offsetof(nvmlSetMemoryLimits_v1_t, softLimit));
    printf("set.hardLimit %zu\n", offsetof(nvmlSetMemoryLimits_v1_t, hardLimit));
    printf("get.size %zu\n", sizeof(nvmlGetMemoryLimits_v1_t));
    printf("get.nameSpace %zu\n", offsetof(nvmlGetMemoryLimits_v1_t, nameSpace));
    printf("get.softLimit %zu\n", offsetof(nvmlGetMemoryLimits_v1_t, softLimit));
    printf("get.hardLimit %zu\n", offsetof(nvmlGetMemoryLimits_v1_t, hardLimit));
    printf("get.currentUsed %zu\n", offsetof(nvmlGetMemoryLimits_v1_t, currentUsed));
    printf("nvmlReturn_t.size %zu\n", sizeof(nvmlReturn_t));
    printf("nvmlDevice_t.size %zu\n", sizeof(nvmlDevice_t));
    printf("NVML_DEVICE_MEMORY_LIMIT_MAX %llu\n", (unsigned long long)NVML_DEVICE_MEMORY_LIMIT_MAX);
    ERROR(NVML_SUCCESS);
    ERROR(NVML_ERROR_UNINITIALIZED);
    ERROR(NVML_ERROR_INVALID_ARGUMENT);
    ERROR(NVML_ERROR_NOT_SUPPORTED);
    ERROR(NVML_ERROR_NO_PERMISSION);
    ERROR(NVML_ERROR_NOT_FOUND);
    ERROR(NVML_ERROR_DRIVER_NOT_LOADED);
    ERROR(NVML_ERROR_FUNCTION_NOT_FOUND);
    ERROR(NVML_ERROR_GPU_IS_LOST);
    ERROR(NVML_ERROR_OPERATING_SYSTEM);
    ERROR(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    ERROR(NVML_ERROR_UNKNOWN);
    return 0;
}
"#;

/// What the header says, as `name value` pairs.
fn probe() -> Vec<(String, u64)> {
    let include = header_dir();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("probe.c");
    let binary = dir.path().join("probe");
    std::fs::write(&source, PROBE).unwrap();
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc (install gcc: scripts/install-deps does): {e}"));
    assert!(
        out.status.success(),
        "the declarations vramgate uses do not match {}/nvml.h:\n{}",
        include.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&binary).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// The Rust side of the probe's `_Static_assert`s: these coerce only if the Rust function
/// types are exactly the C ones as the probe writes them (`nvmlDevice_t` an opaque pointer,
/// `nvmlReturn_t` a C int-sized enum, the structs passed by pointer).
#[allow(dead_code)]
fn rust_signatures(set: SetLimitsFn, get: GetLimitsFn) {
    let _: unsafe extern "C" fn(*mut c_void, *mut SetMemoryLimitsV1) -> c_uint = set;
    let _: unsafe extern "C" fn(*mut c_void, *mut GetMemoryLimitsV1) -> c_uint = get;
}

#[test]
fn the_rust_definitions_match_nvidias_header() {
    let header = probe();
    let get = |name: &str| {
        header
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} not printed"))
            .1 as usize
    };
    let rust = [
        ("set.size", size_of::<SetMemoryLimitsV1>()),
        ("set.nameSpace", offset_of!(SetMemoryLimitsV1, name_space)),
        ("set.softLimit", offset_of!(SetMemoryLimitsV1, soft_limit)),
        ("set.hardLimit", offset_of!(SetMemoryLimitsV1, hard_limit)),
        ("get.size", size_of::<GetMemoryLimitsV1>()),
        ("get.nameSpace", offset_of!(GetMemoryLimitsV1, name_space)),
        ("get.softLimit", offset_of!(GetMemoryLimitsV1, soft_limit)),
        ("get.hardLimit", offset_of!(GetMemoryLimitsV1, hard_limit)),
        ("get.currentUsed", offset_of!(GetMemoryLimitsV1, current_used)),
        ("nvmlReturn_t.size", size_of::<NvmlReturn>()),
        ("nvmlDevice_t.size", size_of::<NvmlDevice>()),
    ];
    for (name, ours) in rust {
        assert_eq!(ours, get(name), "{name}: vramgate's definition vs nvml.h");
    }
    // The fields are C's unsigned long long, which is what `c_ulonglong` is.
    assert_eq!(size_of::<c_ulonglong>(), 8);
    assert_eq!(
        get("NVML_DEVICE_MEMORY_LIMIT_MAX") as u64,
        vramgate::enforce::driver_limit::NVML_DEVICE_MEMORY_LIMIT_MAX,
        "the hard limit vramgate clears with"
    );
    // Every return code vramgate names in its messages has that name in the header.
    for (code, name) in NVML_ERRORS {
        assert_eq!(get(name), *code as usize, "{name}");
        assert_eq!(nvml_error_name(*code), *name);
    }
    assert_eq!(get("NVML_SUCCESS"), 0);
}
