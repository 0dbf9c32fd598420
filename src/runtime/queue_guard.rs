//! The queue guard: a small process that drops a waiting create's ticket as soon as the engine
//! kills that create.
//!
//! A create under policy `wait` holds its ticket in the wrapper's own process, which the
//! engine cancels by killing it: containerd's runc shim runs the runtime with a context and
//! SIGKILLs it when kubelet's deadline passes. A killed process runs no code, so its ticket
//! stays in the ledger (and in `vramgate status`, at the head of the queue) until some other
//! transaction reclaims it. containerd 1.6 and 1.7 run `delete --force` through the wrapper
//! after the kill, which drops it ([`super::admit::drop_abandoned_wait`]); containerd 2.x runs
//! nothing more, and on an idle GPU nothing else may touch the ledger for minutes.
//!
//! So once its create has queued (right after the ticket's commit, before the first sleep:
//! [`crate::service::Service::admit_then`]; a create admitted at once starts no guard), the
//! wrapper starts this guard (`vramgate-runtime` again, with
//! [`GUARD_FLAG`]) with the read end of a pipe as its stdin. The wrapper keeps the write end,
//! close-on-exec: it closes when the wrapper dies, however it dies, and when it `exec`s the
//! next runtime. At that end of file the guard looks at the ledger once: a ticket of the
//! wrapper that is still there means the wrapper died waiting, and one transaction drops it.
//! The guard runs in its own process group, so a kill of the wrapper's group spares it, holds
//! none of the engine's pipes or descriptors, and ends right after.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::ledger::StateDir;
use crate::procfs::{Life, ProcessIdentity};

/// The first argument that makes `vramgate-runtime` the guard. No runc command line has it.
pub const GUARD_FLAG: &str = "--vramgate-queue-guard";

/// How long the guard waits for a wrapper whose pipe closed to finish dying: the kernel closes
/// a killed process's files before it becomes a zombie, so the end of file can come first.
const EXIT_GRACE: Duration = Duration::from_secs(5);
const EXIT_POLL: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot start the queue guard {exe}: {source}")]
    Spawn { exe: String, source: std::io::Error },
    #[error("{GUARD_FLAG} takes a container id, a pid and a start time; got {got:?}")]
    Usage { got: Vec<String> },
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
}

/// The running guard, as the wrapper holds it: dropping it (or the wrapper's death, or its
/// `exec`) closes the pipe, and the guard looks at the ledger once and ends.
#[derive(Debug)]
pub struct QueueGuard {
    _pipe: std::io::PipeWriter,
}

impl QueueGuard {
    /// Starts `exe` (the running `vramgate-runtime`) as the guard of `container`'s wait, whose
    /// ticket `waiter` holds.
    pub fn start(exe: &Path, container: &str, waiter: ProcessIdentity) -> Result<QueueGuard, GuardError> {
        use std::os::unix::process::CommandExt;
        let spawn_error = |source| GuardError::Spawn {
            exe: exe.display().to_string(),
            source,
        };
        // Both ends close-on-exec: only the guard's stdin (a dup) survives into it.
        let (reader, writer) = std::io::pipe().map_err(spawn_error)?;
        Command::new(exe)
            .arg(GUARD_FLAG)
            .arg(container)
            .arg(waiter.pid.to_string())
            .arg(waiter.start_time.to_string())
            .stdin(Stdio::from(reader))
            // Not the engine's pipes: containerd waits for end of file on them.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the wrapper's process group, which an engine may kill whole.
            .process_group(0)
            .spawn()
            .map_err(spawn_error)?;
        // The guard is not waited for: when the wrapper dies it is reparented to the shim
        // (a subreaper) or init, which reap it; when the wrapper execs runc, to runc's parent.
        Ok(QueueGuard { _pipe: writer })
    }
}

/// The guard's whole life: `args` are those after [`GUARD_FLAG`], `config_path` the config the
/// wrapper read. Waits for end of file on stdin, then drops the ticket of a waiter that died
/// waiting.
pub fn run(args: &[OsString], config_path: &Path) -> Result<(), GuardError> {
    let (container, waiter) = parse(args)?;
    close_inherited_descriptors();
    let config = Config::load_from(config_path)?;
    // End of file (or an error, which means the same: nothing more will come).
    let mut sink = [0u8; 64];
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    drop_ticket_of_dead_waiter(&container, waiter, &config);
    Ok(())
}

fn parse(args: &[OsString]) -> Result<(String, ProcessIdentity), GuardError> {
    let usage = || GuardError::Usage {
        got: args.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
    };
    let [container, pid, start_time] = args else {
        return Err(usage());
    };
    let number = |s: &OsStr| s.to_str().and_then(|s| s.parse::<u64>().ok());
    let pid = number(pid).and_then(|p| u32::try_from(p).ok()).ok_or_else(usage)?;
    let start_time = number(start_time).ok_or_else(usage)?;
    let container = container.to_str().ok_or_else(usage)?.to_string();
    Ok((container, ProcessIdentity { pid, start_time }))
}

/// Whatever the engine passed the wrapper without close-on-exec (the container's stdio, extra
/// files) is closed, so the guard keeps no pipe or socket of the engine's open.
fn close_inherited_descriptors() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is among them, already closed: EBADF is fine.
        let _ = nix::unistd::close(fd);
    }
}

/// One unlocked look; a transaction only when the ledger still holds a ticket of `waiter`.
fn drop_ticket_of_dead_waiter(container: &str, waiter: ProcessIdentity, config: &Config) {
    let Ok(Some(dir)) = StateDir::open_existing(&config.state_dir) else {
        return;
    };
    let holds_ticket = || {
        dir.peek()
            .is_ok_and(|peek| peek.ledger().queue.iter().any(|t| t.waiter == waiter))
    };
    // The usual end: the wait ended (admitted, refused) and the wrapper took its ticket out.
    if !holds_ticket() {
        return;
    }
    let since = Instant::now();
    while waiter.life() == Life::Alive && since.elapsed() < EXIT_GRACE {
        std::thread::sleep(EXIT_POLL);
    }
    // A waiter still alive (its wait went on after all) keeps its ticket: the reclaim that
    // drop_abandoned_wait runs drops only tickets whose waiter is gone.
    super::admit::drop_abandoned_wait(container, config);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_its_arguments_and_refuses_anything_else() {
        let (c, w) = parse(&args(&["abc", "42", "987"])).unwrap();
        assert_eq!((c.as_str(), w.pid, w.start_time), ("abc", 42, 987));
        for bad in [
            &["abc"][..],
            &["abc", "x", "1"],
            &["abc", "1", "-1"],
            &["a", "1", "2", "3"],
        ] {
            let e = parse(&args(bad)).unwrap_err().to_string();
            assert!(e.contains(GUARD_FLAG) && e.contains(bad[0]), "{e}");
        }
    }
}
