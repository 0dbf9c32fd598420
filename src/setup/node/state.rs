//! What a node set-up records before it changes the host (its [`Part`]s, in the state file in
//! its install directory), and the lock that makes it one set-up per node.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{io, NodeError, NodeResult, RestartMode, NODE_LOCK_FILE};

/// One file as a release before parts recorded it: its bytes before (`None`: absent).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Saved {
    pub path: PathBuf,
    pub before: Option<Vec<u8>>,
}

/// One thing the set-up added to the host (paths are host paths), taken out by itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Part {
    /// Its entry in a containerd config's `imports`; `created`: the file did not exist, and
    /// this is what the set-up created it with.
    Import {
        config: PathBuf,
        entry: String,
        created: Option<Vec<u8>>,
    },
    /// A file of its own (a drop-in, a backup, the host's config.toml it installed): what was
    /// there before, and what it wrote (`None`: not recorded by the release that wrote it).
    File {
        path: PathBuf,
        before: Option<Vec<u8>>,
        written: Option<Vec<u8>>,
    },
    /// Its keys in a version 2 config besides the runtime: `runc` where it added it, the
    /// default runtime's name where it set it (with the value before).
    Keys {
        config: PathBuf,
        runc: bool,
        default_before: Option<Option<String>>,
    },
}

/// What a set-up did, written before it does it: what its undo takes out.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeState {
    #[serde(default)]
    pub parts: Vec<Part>,
    /// What releases before [`Part`] recorded: each file with its bytes before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<Saved>,
    /// Binaries copied into the install directory (host paths).
    pub binaries: Vec<PathBuf>,
    /// Directories the set-up created (containerd's `conf.d`), deepest first.
    pub dirs: Vec<PathBuf>,
    /// Whether the install directory was created by the set-up (then the undo removes it).
    pub created_dir: bool,
    /// Whether the set-up restarted the engine.
    pub restarted: bool,
    pub restart: RestartMode,
    pub engine_socket: PathBuf,
    /// The wrapper's path as the engine names it: a runtime `vramgate` running it is vramgate's.
    #[serde(default)]
    pub runtime: Option<PathBuf>,
}

/// What an undo did.
#[derive(Debug, Default)]
pub struct Undone {
    /// One line per thing done or left on purpose, for the log.
    pub report: Vec<String>,
    /// What it could not do, one line each: the undo then ends non-zero.
    pub left: Vec<String>,
    /// Binaries kept because containers still run through them.
    pub kept: Vec<PathBuf>,
}

/// Takes the node's set-up lock in `dir` (this process's view of the ledger's directory),
/// waiting at most `wait` for a run of the same install directory (a rolling update's old pod
/// undoing); one of another install directory is refused at once. The lock file stays: a lock
/// on a file another run unlinked would lock nothing, so after taking it the path is checked
/// to still be that file. It holds the holder's install directory.
pub(super) fn lock(dir: &Path, install_dir: &Path, wait: Duration) -> NodeResult<File> {
    let path = dir.join(NODE_LOCK_FILE);
    let started = Instant::now();
    loop {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {
                let held = file.metadata().map_err(io(&path))?;
                match std::fs::symlink_metadata(&path) {
                    Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {}
                    _ => continue,
                }
                let holder = install_dir.to_string_lossy();
                file.set_len(0)
                    .and_then(|()| file.write_all(holder.as_bytes()))
                    .map_err(io(&path))?;
                return Ok(file);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&file, 4096), &mut holder);
                if !holder.is_empty() && Path::new(&holder) != install_dir {
                    return Err(NodeError::OtherRelease {
                        other: crate::one_line(&holder),
                        lock: path,
                    });
                }
                if started.elapsed() >= wait {
                    return Err(NodeError::Busy {
                        path,
                        waited: started.elapsed(),
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e).into()),
        }
    }
}
