//! Least privilege: the capabilities the hook and the runtime wrapper keep, and why.
//!
//! The hook runs as root on every container start. Its euid stays 0 (the state directory must
//! be owned by the euid, and root-owned files, the config, the bundle and the ledger, are read
//! and written through ordinary owner permissions), but of root's capabilities it needs one:
//!
//! - `CAP_SYS_PTRACE`: reading `/proc/<pid>/ns/pid` of a container's init and of the
//!   processes NVML lists (to tell which container holds which GPU memory) needs ptrace
//!   read access to that process. Root has it through the uid match only for processes that
//!   run as uid 0 *and* are dumpable; a container running as another uid, or one whose init
//!   is not dumpable (runc makes `runc init` non-dumpable), needs the capability. Without it
//!   attribution fails safe (the memory counts as used outside vramgate *and* the reservation
//!   as unallocated), so a host without it admits less than it could.
//!
//! Everything else goes: `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` (every file the hook
//! touches is root's own; a bundle a root-run runtime created is readable by root as owner),
//! `CAP_CHOWN`/`CAP_FOWNER` (it never changes ownership or modes), `CAP_SYS_ADMIN`,
//! `CAP_NET_*`, `CAP_SETUID`, `CAP_KILL` (liveness is read from `/proc`, never probed with
//! signals) and the rest. `/proc/<pid>/stat` (the start time that identifies a process) is
//! world-readable and needs none. The inheritable and ambient sets are emptied too, and
//! `no_new_privs` is set: the hook executes nothing, and whatever it might be tricked into
//! executing could not get the capabilities back, not even as uid 0 or through a setuid
//! binary (with `no_new_privs` an `execve` never grants more than the permitted set). That is
//! also why the bounding set is left alone: lowering it would add nothing, and costs a
//! `prctl` per capability (80 system calls, a third of a millisecond on a VM, on every
//! container start).
//!
//! The runtime wrapper is different: it ends by `exec`ing the real runtime (runc), which needs
//! all of root's capabilities to build containers, and `no_new_privs` would be inherited by
//! every container process (breaking `sudo` inside containers). So the wrapper only empties
//! its *effective* set while it parses and edits `config.json`: a bug there cannot use a
//! capability, and `execve` as uid 0 gives runc root's full set again (the permitted and
//! bounding sets are left as they were, which is what makes that work). While it admits a
//! container at create (the hook's work, moved before runc so that a GPU can be placed), its
//! effective set is the hook's, `CAP_SYS_PTRACE`, and nothing else.
//!
//! Capabilities are per thread: call these before starting any thread (both binaries are
//! single-threaded at that point).

use caps::{CapSet, Capability, CapsHashSet};

/// What the hook keeps (see the module docs for the reason).
pub const HOOK_KEEPS: &[Capability] = &[Capability::CAP_SYS_PTRACE];

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("cannot {step}: {source}")]
    Caps {
        step: &'static str,
        source: caps::errors::CapsError,
    },
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
}

type Result<T> = std::result::Result<T, PrivilegeError>;

fn caps_step(step: &'static str) -> impl FnOnce(caps::errors::CapsError) -> PrivilegeError {
    move |source| PrivilegeError::Caps { step, source }
}

/// Drops every capability the hook does not need, for good. A process without capabilities
/// (a rootless runtime) loses nothing and gets no error.
pub fn drop_for_hook() -> Result<()> {
    let keep: CapsHashSet = HOOK_KEEPS.iter().copied().collect();
    nix::sys::prctl::set_no_new_privs().map_err(PrivilegeError::NoNewPrivs)?;
    caps::clear(None, CapSet::Ambient).map_err(caps_step("clear the ambient capabilities"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_step("clear the inheritable capabilities"))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(caps_step("read the permitted capabilities"))?;
    let kept: CapsHashSet = permitted.intersection(&keep).copied().collect();
    // The effective set must stay a subset of the permitted one at every step.
    caps::set(None, CapSet::Effective, &kept).map_err(caps_step("lower the effective capabilities"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(caps_step("lower the permitted capabilities"))?;
    Ok(())
}

/// For `vramgate-runtime` while it admits a container at create (the hook's work, done before
/// runc runs): the effective set becomes what the hook keeps ([`HOOK_KEEPS`], from the
/// permitted set), and is emptied again when the returned guard drops. A process without the
/// capability (rootless) gets an empty set and attribution fails safe, as in the hook.
pub fn raise_for_admission() -> Result<EffectiveGuard> {
    let keep: CapsHashSet = HOOK_KEEPS.iter().copied().collect();
    let permitted = caps::read(None, CapSet::Permitted).map_err(caps_step("read the permitted capabilities"))?;
    let kept: CapsHashSet = permitted.intersection(&keep).copied().collect();
    caps::set(None, CapSet::Effective, &kept).map_err(caps_step("raise the effective capabilities"))?;
    Ok(EffectiveGuard)
}

/// Empties the effective set again when dropped (see [`raise_for_admission`]).
pub struct EffectiveGuard;

impl Drop for EffectiveGuard {
    fn drop(&mut self) {
        let _ = caps::clear(None, CapSet::Effective);
    }
}

/// For `vramgate-runtime`: call first thing in `main`. Empties the effective set only; the
/// real runtime it `exec`s at the end gets root's full set back from the kernel (see the
/// module docs). Must not be used where the process goes on to need a capability itself.
pub fn drop_for_runtime_wrapper() -> Result<()> {
    caps::clear(None, CapSet::Effective).map_err(caps_step("clear the effective capabilities"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A line of `/proc/thread-self/status`, such as `CapEff`.
    fn status_field(name: &str) -> String {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap()
            .trim()
            .to_string()
    }

    /// These tests drop and raise capabilities, which only root has: without it they fail
    /// (a skip would report `ok` for a check that never ran). `scripts/test` runs as root.
    fn require_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (its capabilities): run it as root (sudo scripts/test)"
        );
    }

    /// A process of another user, as a container running as a non-root uid is.
    fn nobody_process() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap()
    }

    #[test]
    fn hook_keeps_only_sys_ptrace_and_still_reads_other_users_namespaces() {
        require_root();
        let mut other = nobody_process();
        let pid = other.id();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Capabilities are per thread: the test thread's own are untouched.
        let (kept, ns, nnp, exec_gets) = std::thread::spawn(move || {
            drop_for_hook().unwrap();
            // What anything the hook could be tricked into executing would get, as uid 0.
            let out = std::process::Command::new("grep")
                .args(["^CapPrm", "/proc/self/status"])
                .output()
                .unwrap();
            (
                caps::read(None, CapSet::Effective).unwrap(),
                crate::procfs::pid_namespace(pid),
                status_field("NoNewPrivs"),
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            )
        })
        .join()
        .unwrap();
        let only: CapsHashSet = HOOK_KEEPS.iter().copied().collect();
        assert_eq!(kept, only);
        assert_eq!(
            exec_gets,
            format!("CapPrm:\t{:016x}", 1u64 << 19),
            "an exec regains nothing beyond what was kept"
        );
        assert_eq!(nnp, "1");
        assert!(
            ns.is_some(),
            "CAP_SYS_PTRACE is enough to read another user's pid namespace"
        );

        // And it is needed: without it, the same read is refused.
        let without = std::thread::spawn(move || {
            drop_for_hook().unwrap();
            caps::clear(None, CapSet::Effective).unwrap();
            crate::procfs::pid_namespace(pid)
        })
        .join()
        .unwrap();
        assert_eq!(
            without, None,
            "reading another user's pid namespace needs CAP_SYS_PTRACE"
        );
        // /proc/<pid>/stat, which identifies a process, needs no capability at all.
        let stat_readable = std::thread::spawn(move || {
            caps::clear(None, CapSet::Effective).unwrap();
            crate::procfs::ProcessIdentity::of(pid).is_some()
        })
        .join()
        .unwrap();
        assert!(stat_readable);
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[test]
    fn runtime_wrapper_runs_without_effective_caps_and_runc_gets_them_back() {
        require_root();
        let (own, child) = std::thread::spawn(|| {
            drop_for_runtime_wrapper().unwrap();
            let own = status_field("CapEff");
            // What an exec'd runtime gets: a fresh process image as uid 0.
            let out = std::process::Command::new("grep")
                .args(["^CapEff", "/proc/self/status"])
                .output()
                .unwrap();
            (own, String::from_utf8_lossy(&out.stdout).to_string())
        })
        .join()
        .unwrap();
        assert_eq!(own, "0000000000000000");
        let bounding = status_field("CapBnd");
        assert!(
            child.contains(&bounding),
            "exec restores the full set: {child} vs {bounding}"
        );
        // And a wrapper bug cannot, say, read a file only DAC_OVERRIDE would open.
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        nix::unistd::chown(&secret, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let read = std::thread::spawn(move || {
            drop_for_runtime_wrapper().unwrap();
            std::fs::read(&secret).map_err(|e| e.kind())
        })
        .join()
        .unwrap();
        assert_eq!(read, Err(std::io::ErrorKind::PermissionDenied));
    }
}
