//! Running the node's processes and the engines the tests drive: found on a PATH with sbin,
//! started as a service manager starts daemons, stopped with a grace period, waited for with a
//! bound.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The engines and runc live in sbin on Debian; cargo's PATH may not have it.
pub fn path_with_sbin() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    format!("{path}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}

/// Fails (never skips) when a tool the test drives is missing: CI installs them.
pub fn require(tool: &str) {
    let found = std::env::split_paths(&path_with_sbin()).any(|d| d.join(tool).is_file());
    assert!(found, "{tool} is not installed: run scripts/install-deps (as root)");
    assert!(
        nix::unistd::geteuid().is_root(),
        "the engine tests run as root: sudo scripts/test"
    );
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// SIGTERM, up to `grace` to exit, then SIGKILL. `pid` is a child of this process or not.
pub fn stop_pid(pid: i32, grace: Duration) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let pid = Pid::from_raw(pid);
    if kill(pid, Signal::SIGTERM).is_err() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < grace {
        // Reaps it if it is our child; a non-child disappears from /proc by itself.
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        if kill(pid, None).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = kill(pid, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

/// Unmounts whatever a daemon left mounted under `dir` (deepest first), so it can be removed.
pub fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(p).status();
    }
}

/// `program` as a daemon the test starts: with every signal's disposition at its default and
/// none blocked, whatever the test runner inherited (under `nohup`, SIGHUP is ignored, and a Go
/// daemon such as containerd keeps an ignored signal ignored: a SIGHUP meant to restart it would
/// do nothing). A service manager starts daemons this way.
pub fn daemon(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: sigaction and sigprocmask are async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            use nix::sys::signal::{signal, sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
            for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
                let _ = signal(sig, SigHandler::SigDfl);
            }
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None).map_err(std::io::Error::from)
        });
    }
    cmd
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Polls `check` every 100 ms for at most `limit`; panics with `what` and the last state.
pub fn wait_until<T: std::fmt::Debug>(what: &str, limit: Duration, check: impl FnMut() -> (bool, T)) -> T {
    poll(what, limit, Duration::from_millis(100), check).0
}

pub fn poll<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    period: Duration,
    mut check: impl FnMut() -> (bool, T),
) -> (T, Duration) {
    let start = Instant::now();
    loop {
        let (done, state) = check();
        if done {
            return (state, start.elapsed());
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting until {what}; last: {state:?}");
        }
        std::thread::sleep(period);
    }
}

/// The last `lines` lines of a log, for a failure message.
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("({}: {e})", log.display()));
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!(
        "--- last {} lines of {} ---\n{}",
        all.len() - from,
        log.display(),
        all[from..].join("\n")
    )
}

/// Removes a cgroup and those below it, deepest first; rmdir removes only cgroups with no
/// process left. A pod's own containers' cgroups are normally gone already (runc removes
/// them); one whose `runc create` was killed (a cancelled start) is not.
pub fn remove_cgroup(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}
