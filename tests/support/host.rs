//! A scratch host root: a private directory standing for a node's `/` (the host's root that the
//! node set-up's pod mounts at `/host`), given the host's own programs, so that what runs
//! chrooted into a real node's root runs the same way here: `containerd config dump` (which
//! `vramgate setup-node` and NVIDIA's toolkit both run to read the host's config as containerd
//! reads it), `nvidia-ctk`, NVIDIA's toolkit installer.
//!
//! `crate::support::host`; it uses `crate::support`.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::run_ok;

/// `host` given the program `binary` at `at` (a path inside the host) and the shared libraries
/// `ldd` lists for it (the C library, the loader) at their own paths, so that `chroot host
/// <at>` runs it as on a real node. A statically linked program needs nothing more.
pub fn give_program(host: &Path, binary: &Path, at: &Path) {
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ldd (libc-bin): {e}"));
    let text = String::from_utf8_lossy(&ldd.stdout);
    // ldd fails, saying so, for a program without dynamic sections.
    let static_program = !ldd.status.success()
        && (text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&ldd.stderr).contains("not a dynamic executable"));
    assert!(
        ldd.status.success() || static_program,
        "ldd {}: {}{}",
        binary.display(),
        text,
        String::from_utf8_lossy(&ldd.stderr)
    );
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`;
    // the vDSO has no file.
    let libs = text
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from);
    let files = std::iter::once((binary.to_path_buf(), at.to_path_buf())).chain(libs.map(|l| (l.clone(), l)));
    for (from, to) in files {
        let target = host.join(to.strip_prefix("/").unwrap_or(&to));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        // A copy, not a link: whatever runs in the host root may replace its files.
        std::fs::copy(&from, &target).unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), target.display()));
    }
}

/// `/dev/null` in the host root, as every real root has it: Go's os/exec opens it for a child
/// it gives no stdin (NVIDIA's toolkit running `containerd config dump` chrooted fails without
/// it, and silently falls back to reading the file alone).
pub fn give_dev_null(host: &Path) {
    use nix::sys::stat::{makedev, mknod, Mode, SFlag};
    let dev = host.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let null = dev.join("null");
    if !null.exists() {
        mknod(&null, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(1, 3))
            .unwrap_or_else(|e| panic!("mknod {}: {e}", null.display()));
        // mknod's mode is masked by the umask.
        std::fs::set_permissions(&null, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    }
}

/// `containerd config dump` of the host root's config, as the host's containerd (at
/// /usr/bin/containerd in it: [`give_program`]) reads it, chrooted: imports resolved in the host.
pub fn host_dump(host: &Path) -> toml::Table {
    let out = host_dump_text(host);
    toml::from_str(&out).unwrap_or_else(|e| panic!("containerd config dump printed no TOML ({e}):\n{out}"))
}

/// [`host_dump`] as containerd prints it.
pub fn host_dump_text(host: &Path) -> String {
    run_ok(Command::new("chroot").arg(host).args([
        "/usr/bin/containerd",
        "--config",
        "/etc/containerd/config.toml",
        "config",
        "dump",
    ]))
}
