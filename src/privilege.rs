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
//! One tier needs more: with `[enforce] limit = "driver"` the hook sets the driver's memory
//! limit (`nvmlDeviceSetMemoryLimits_v1`), which NVML documents as needing root, and which
//! NVIDIA's kernel module grants by `capable(CAP_SYS_ADMIN)` on the calling thread. The hook
//! cannot know the tier before it reads the config, and reads no config at all for a
//! container without a request, so its first drop ([`drop_for_hook_stage`]) leaves
//! `CAP_SYS_ADMIN` in the *permitted* set only, never the effective one. The hook then gives
//! it up for good ([`forgo_driver_limit`]) as soon as it knows it will not set a limit (a
//! container without a request, another tier, the limit set) or clear one (a stop, once the
//! container's driver-limit record is handled: clearing is the same set call). Only around the
//! set calls themselves is it raised into the effective set ([`raise_for_driver_limit`], a
//! guard that lowers it again). The wrapper does the same at `delete`, where it clears a
//! container's limit before runc removes the cgroup: from root's permitted set, `CAP_SYS_ADMIN`
//! alone, around each call. The exporter and the device plugin never set limits and drop it at
//! once ([`drop_for_hook`]).
//!
//! Capabilities are per thread: call these before starting any thread (both binaries are
//! single-threaded at that point).

use caps::{CapSet, Capability, CapsHashSet};

/// What the hook keeps (see the module docs for the reason).
pub const HOOK_KEEPS: &[Capability] = &[Capability::CAP_SYS_PTRACE];
/// What setting the driver's memory limit needs, held in the permitted set only until the
/// hook knows whether it sets one (see the module docs).
pub const DRIVER_LIMIT_NEEDS: Capability = Capability::CAP_SYS_ADMIN;

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

/// Drops every capability the hook's snapshot work does not need, for good: what the exporter
/// and the device plugin keep. A process without capabilities (a rootless runtime) loses
/// nothing and gets no error.
pub fn drop_for_hook() -> Result<()> {
    drop_keeping(HOOK_KEEPS, &[])
}

/// What `vramgate watch` keeps: the hook's `CAP_SYS_PTRACE` (attribution, as above) and
/// `CAP_KILL`, since under `[enforce] over_use = "kill"` it stops a container whose processes
/// may run as any uid.
pub const WATCH_KEEPS: &[Capability] = &[Capability::CAP_SYS_PTRACE, Capability::CAP_KILL];

/// For `vramgate watch`: every capability but [`WATCH_KEEPS`] goes, for good.
pub fn drop_for_watch() -> Result<()> {
    drop_keeping(WATCH_KEEPS, &[])
}

/// For `vramgate-hook`, first thing in `main`: [`drop_for_hook`], except that
/// [`DRIVER_LIMIT_NEEDS`] stays in the permitted set (never the effective one) until the hook
/// knows whether it sets a driver limit; [`forgo_driver_limit`] then drops it for good.
pub fn drop_for_hook_stage() -> Result<()> {
    drop_keeping(HOOK_KEEPS, &[DRIVER_LIMIT_NEEDS])
}

/// For the queue guard a waiting `vramgate-runtime` create starts
/// ([`crate::runtime::queue_guard`]): every capability goes, for good. Its work needs none:
/// the waiter's liveness is its world-readable `/proc/<pid>/stat`, and the ledger it may
/// rewrite is root's own file.
pub fn drop_for_queue_guard() -> Result<()> {
    drop_keeping(&[], &[])
}

/// Effective set: `effective` (those of them permitted now); permitted set: those plus
/// `permitted_only`; inheritable and ambient sets empty; `no_new_privs` set.
fn drop_keeping(effective: &[Capability], permitted_only: &[Capability]) -> Result<()> {
    nix::sys::prctl::set_no_new_privs().map_err(PrivilegeError::NoNewPrivs)?;
    caps::clear(None, CapSet::Ambient).map_err(caps_step("clear the ambient capabilities"))?;
    caps::clear(None, CapSet::Inheritable).map_err(caps_step("clear the inheritable capabilities"))?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(caps_step("read the permitted capabilities"))?;
    let effective: CapsHashSet = effective.iter().copied().filter(|c| permitted.contains(c)).collect();
    let mut kept = effective.clone();
    kept.extend(permitted_only.iter().copied().filter(|c| permitted.contains(c)));
    // The effective set must stay a subset of the permitted one at every step.
    caps::set(None, CapSet::Effective, &effective).map_err(caps_step("lower the effective capabilities"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(caps_step("lower the permitted capabilities"))?;
    Ok(())
}

/// Gives up [`DRIVER_LIMIT_NEEDS`] for good (effective and permitted). Idempotent, and no
/// error where it was never held.
pub fn forgo_driver_limit() -> Result<()> {
    caps::drop(None, CapSet::Effective, DRIVER_LIMIT_NEEDS).map_err(caps_step("drop CAP_SYS_ADMIN"))?;
    caps::drop(None, CapSet::Permitted, DRIVER_LIMIT_NEEDS).map_err(caps_step("drop CAP_SYS_ADMIN"))?;
    Ok(())
}

/// Raises [`DRIVER_LIMIT_NEEDS`] into the effective set for the driver call that needs it;
/// the guard lowers it again. `Ok(None)` where it is not permitted (rootless, or already
/// forgone): the call goes ahead and the driver says no, with the reason in the error.
pub fn raise_for_driver_limit() -> Result<Option<AdminGuard>> {
    let permitted = caps::has_cap(None, CapSet::Permitted, DRIVER_LIMIT_NEEDS)
        .map_err(caps_step("read the permitted capabilities"))?;
    if !permitted {
        return Ok(None);
    }
    caps::raise(None, CapSet::Effective, DRIVER_LIMIT_NEEDS).map_err(caps_step("raise CAP_SYS_ADMIN"))?;
    Ok(Some(AdminGuard))
}

/// Lowers [`DRIVER_LIMIT_NEEDS`] from the effective set when dropped (see
/// [`raise_for_driver_limit`]).
pub struct AdminGuard;

impl Drop for AdminGuard {
    fn drop(&mut self) {
        let _ = caps::drop(None, CapSet::Effective, DRIVER_LIMIT_NEEDS);
    }
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
        crate::procfs::status_field(&status, name).unwrap().to_string()
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
    fn the_hook_holds_sys_admin_permitted_only_raised_around_the_driver_call() {
        require_root();
        let ptrace = 1u64 << 19;
        let admin = 1u64 << 21;
        let steps = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let look = || (status_field("CapEff"), status_field("CapPrm"));
            drop_for_hook_stage().unwrap();
            seen.push(look());
            {
                let guard = raise_for_driver_limit().unwrap();
                assert!(guard.is_some());
                seen.push(look());
            }
            seen.push(look());
            forgo_driver_limit().unwrap();
            seen.push(look());
            // Forgone: nothing left to raise, and forgoing again is no error.
            assert!(raise_for_driver_limit().unwrap().is_none());
            forgo_driver_limit().unwrap();
            seen
        })
        .join()
        .unwrap();
        let hex = |v: u64| format!("{v:016x}");
        assert_eq!(
            steps,
            [
                (hex(ptrace), hex(ptrace | admin)),
                (hex(ptrace | admin), hex(ptrace | admin)),
                (hex(ptrace), hex(ptrace | admin)),
                (hex(ptrace), hex(ptrace)),
            ]
        );
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
