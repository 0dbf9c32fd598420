//! Controlling the engine from a node set-up: finding the process that serves its socket,
//! restarting it by signal as NVIDIA's toolkit installer does, and telling which of its
//! containers still run through a runtime binary.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot find the engine's process through {path}: {message}")]
    Process { path: PathBuf, message: String },
    #[error("the engine (pid {pid}, serving {socket}) ignores {signal}, so a signal cannot restart it: it was started with {signal} ignored (under nohup, or by a parent that ignored it); start it with default signal handling (its service manager does), or restart it yourself after the set-up (--restart none)")]
    IgnoresSignal { pid: i32, socket: PathBuf, signal: Signal },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The pid of the process serving the Unix socket at `socket` (this process's view).
pub fn engine_pid(socket: &Path) -> Result<i32, EngineError> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let err = |message: String| EngineError::Process {
        path: socket.into(),
        message,
    };
    let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| err(e.to_string()))?;
    let pid = getsockopt(&stream, PeerCredentials)
        .map_err(|e| err(e.to_string()))?
        .pid();
    if pid <= 0 {
        return Err(err(
            "its process is in another PID namespace (run with the host's: hostPID)".into(),
        ));
    }
    Ok(pid)
}

/// Whether process `pid` ignores `signal`, from the `SigIgn` mask of `/proc/<pid>/status`. A
/// daemon inherits ignored signals from whoever started it (nohup ignores SIGHUP), and Go's
/// runtime keeps a signal ignored that was ignored at start unless the program asks for it:
/// containerd never does for SIGHUP, so such a containerd outlives every SIGHUP.
pub fn ignores(pid: i32, signal: Signal) -> Result<bool, EngineError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let mut text = String::new();
    File::open(&path)
        .and_then(|f| f.take(64 << 10).read_to_string(&mut text))
        .map_err(|source| EngineError::Io {
            path: path.clone(),
            source,
        })?;
    let mask = text
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| EngineError::Io {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no SigIgn line"),
        })?;
    Ok(mask & (1 << (signal as u32 - 1)) != 0)
}

/// How a restart by signal went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restarted {
    /// A new process serves the socket: (the old pid, the new one, how long it took).
    Back { old: i32, new: i32, after: Duration },
    /// The signal was sent; nothing served the socket again within the wait.
    NotBack { old: i32, waited: Duration },
}

/// Restarts the engine serving `socket` with SIGHUP, as NVIDIA's toolkit installer does:
/// containerd does not handle SIGHUP, so it exits, and its service manager (systemd's
/// `Restart=always`) starts it again; running containers keep running. Refused at once when
/// the engine ignores SIGHUP. Waits (bounded by `wait`) until a new process serves the socket.
pub fn restart_by_signal(socket: &Path, wait: Duration) -> Result<Restarted, EngineError> {
    let pid = engine_pid(socket)?;
    if ignores(pid, Signal::SIGHUP)? {
        return Err(EngineError::IgnoresSignal {
            pid,
            socket: socket.into(),
            signal: Signal::SIGHUP,
        });
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGHUP).map_err(|e| EngineError::Process {
        path: socket.into(),
        message: format!("cannot signal pid {pid}: {e}"),
    })?;
    let started = Instant::now();
    loop {
        match engine_pid(socket) {
            Ok(new) if new != pid => {
                return Ok(Restarted::Back {
                    old: pid,
                    new,
                    after: started.elapsed(),
                })
            }
            _ if started.elapsed() >= wait => {
                return Ok(Restarted::NotBack {
                    old: pid,
                    waited: started.elapsed(),
                })
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The ids of containerd's tasks whose runc shim runs `runtime` (a path as the engine sees
/// it), from its task directory (`tasks`, this process's view): containerd's runc shim keeps
/// its options in each task's bundle (`<namespace>/<id>/options.json`), whose `binary_name` is
/// the runtime it execs to stop and delete the container. A task being removed meanwhile, or
/// an options file that is not such JSON, is skipped; each is read at most 64 KiB.
pub fn tasks_running(tasks: &Path, runtime: &Path) -> Result<Vec<String>, EngineError> {
    let mut ids = Vec::new();
    let namespaces = match std::fs::read_dir(tasks) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        Err(source) => {
            return Err(EngineError::Io {
                path: tasks.into(),
                source,
            })
        }
    };
    for namespace in namespaces.flatten() {
        let Ok(entries) = std::fs::read_dir(namespace.path()) else {
            continue;
        };
        for task in entries.flatten() {
            let mut text = String::new();
            let read =
                File::open(task.path().join("options.json")).and_then(|f| f.take(64 << 10).read_to_string(&mut text));
            if read.is_err() {
                continue;
            }
            let Ok(options) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            if options["binary_name"].as_str().map(Path::new) == Some(runtime) {
                ids.push(task.file_name().to_string_lossy().into_owned());
            }
        }
    }
    ids.sort();
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child started with SIGHUP ignored is seen as ignoring it; one with the default is not.
    #[test]
    fn ignored_signals_are_read_from_the_process_status() {
        use std::os::unix::process::CommandExt;
        let with = |handler: nix::sys::signal::SigHandler| {
            let mut command = std::process::Command::new("sleep");
            command.arg("30");
            // SAFETY: signal() is async-signal-safe; the child only sets a disposition before
            // exec (the default one too: the test itself may run under nohup).
            unsafe {
                command.pre_exec(move || {
                    nix::sys::signal::signal(Signal::SIGHUP, handler)
                        .map(|_| ())
                        .map_err(std::io::Error::from)
                });
            }
            command.spawn().unwrap()
        };
        let mut ignoring = with(nix::sys::signal::SigHandler::SigIgn);
        let mut plain = with(nix::sys::signal::SigHandler::SigDfl);
        let results = (
            ignores(ignoring.id() as i32, Signal::SIGHUP),
            ignores(plain.id() as i32, Signal::SIGHUP),
        );
        for child in [&mut ignoring, &mut plain] {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(results.0.unwrap());
        assert!(!results.1.unwrap());
    }
}
