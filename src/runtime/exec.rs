//! Finding the next runtime and becoming it.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::RuntimeError;

/// The runtime to exec: the first of `runtimes` that exists, skipping this wrapper itself
/// (installed under a runtime's name, it would exec itself forever).
pub fn find_next_runtime(runtimes: &[String], path_var: Option<&OsStr>, myself: Option<&Path>) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = path_var.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
    let is_me = |candidate: &Path| myself.is_some_and(|me| candidate.canonicalize().is_ok_and(|c| c == me));
    let runnable =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) && !is_me(p);
    for name in runtimes {
        if name.contains('/') {
            if runnable(Path::new(name)) {
                return Some(PathBuf::from(name));
            }
            continue;
        }
        if let Some(found) = dirs.iter().map(|d| d.join(name)).find(|p| runnable(p)) {
            return Some(found);
        }
    }
    None
}

/// `exec`s `runtime` with `args` (argv[1..] as received) in place of this process. Returns
/// only on failure.
pub fn exec_runtime(runtime: &Path, args: &[OsString]) -> RuntimeError {
    let to_c = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| RuntimeError::NulInArgument);
    let program = match to_c(runtime.as_os_str()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    // argv[0] is the runtime's own path, as nvidia-container-runtime passes it; the rest is
    // byte-for-byte what the engine gave us.
    let mut argv = vec![program.clone()];
    for a in args {
        match to_c(a) {
            Ok(c) => argv.push(c),
            Err(e) => return e,
        }
    }
    match nix::unistd::execv(&program, &argv) {
        Err(source) => RuntimeError::Exec {
            path: runtime.to_path_buf(),
            source,
        },
        Ok(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_runtime_skips_missing_and_myself() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let make = |p: &Path, mode| {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        make(&a.join("runc"), 0o755);
        make(&b.join("runc"), 0o755);
        make(&a.join("noexec"), 0o644);
        let path = std::env::join_paths([&a, &b]).unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find_next_runtime(&names(&["nvidia-container-runtime", "runc"]), Some(&path), None),
            Some(a.join("runc"))
        );
        assert_eq!(find_next_runtime(&names(&["noexec"]), Some(&path), None), None);
        let me = a.join("runc").canonicalize().unwrap();
        assert_eq!(
            find_next_runtime(&names(&["runc"]), Some(&path), Some(&me)),
            Some(b.join("runc"))
        );
        let abs = b.join("runc").to_string_lossy().into_owned();
        assert_eq!(find_next_runtime(&[abs.clone()], None, None), Some(PathBuf::from(abs)));
    }
}
