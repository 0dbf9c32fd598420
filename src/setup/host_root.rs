//! The host's root file system seen from a container (`vramgate setup-node`'s `/host`), and
//! the engine's view of the same files.
//!
//! The host root is a mount of a file system vramgate does not own: every path read or written
//! through it is resolved inside it first and refused when a symlink leads out of it, so a
//! link planted at `/host/etc/containerd` cannot turn root's write into one on the container's
//! own files or anywhere else (the last component is then opened with `O_NOFOLLOW`). Paths the
//! engine's config names (an `imports` entry, a drop-in) are the engine's: they are turned
//! into host paths here and never opened as they are, which would read the container's own
//! `/etc` instead of the host's.

use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use super::{SetupError, BACKUP_SUFFIX};
use crate::atomic_file;

#[derive(Debug, thiserror::Error)]
pub enum HostPathError {
    #[error("{path} must be an absolute path without `..` (a path on the host)")]
    NotHostPath { path: PathBuf },
    #[error("{path} leads out of the host root {root} (it resolves to {resolved}); a symlink there must point inside the host's own tree")]
    Escapes {
        path: PathBuf,
        root: PathBuf,
        resolved: PathBuf,
    },
    #[error("{path} is a symbolic link on the host; vramgate writes only a file of its own there: replace the link with the file it points to")]
    Link { path: PathBuf },
    #[error("cannot use {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl From<HostPathError> for SetupError {
    fn from(e: HostPathError) -> SetupError {
        SetupError::Host(e.to_string())
    }
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HostPathError + '_ {
    move |source| HostPathError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `path` (absolute, free of `..`) as seen under `root`.
pub fn under(root: &Path, path: &Path) -> Result<PathBuf, HostPathError> {
    let mut out = root.to_path_buf();
    if !path.is_absolute() {
        return Err(HostPathError::NotHostPath { path: path.into() });
    }
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(HostPathError::NotHostPath { path: path.into() })
            }
        }
    }
    Ok(out)
}

/// Where the host's root is mounted in this process's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    pub root: PathBuf,
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> HostRoot {
        HostRoot { root: root.into() }
    }

    /// Where the host path `path` is in this process's view, after checking that what exists
    /// of it (symlinks resolved) stays inside the host root. The last component is not
    /// resolved: the writers open it with `O_NOFOLLOW`, and the removers unlink the link itself.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, HostPathError> {
        let inside = under(&self.root, path)?;
        let root = std::fs::canonicalize(&self.root).map_err(io(&self.root))?;
        let mut existing = inside.parent().map(Path::to_path_buf);
        while let Some(dir) = existing {
            match std::fs::canonicalize(&dir) {
                Ok(resolved) if resolved.starts_with(&root) => return Ok(inside),
                Ok(resolved) => {
                    return Err(HostPathError::Escapes {
                        path: path.into(),
                        root,
                        resolved,
                    })
                }
                // Not there yet (it will be created): check the directory above it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => existing = dir.parent().map(Path::to_path_buf),
                Err(e) => return Err(io(&dir)(e)),
            }
        }
        Ok(inside)
    }

    /// The host path of `local`, a path in this process's view under the host root.
    pub fn host_path(&self, local: &Path) -> PathBuf {
        Path::new("/").join(local.strip_prefix(&self.root).unwrap_or(local))
    }
}

/// The bytes of `path` (this process's view), `None` when there is no such file; a symlink
/// there is refused: vramgate's files on the host are plain files it wrote.
pub fn read_plain(path: &Path) -> Result<Option<Vec<u8>>, HostPathError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(HostPathError::Link { path: path.into() }),
        Ok(_) => std::fs::read(path).map(Some).map_err(io(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Makes `path` hold `bytes`: a file that exists is rewritten in place, keeping its inode,
/// owner and mode (the engine's config is the admin's file, and may be bind-mounted or
/// watched by inode); a new one is created atomically with `mode`. The directory is opened
/// with `O_NOFOLLOW` and the file relative to it, never through a link.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), HostPathError> {
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => (dir, name),
        _ => return Err(HostPathError::NotHostPath { path: path.into() }),
    };
    let dir_fd = atomic_file::open_dir(dir).map_err(io(dir))?;
    match rewrite_in_place(&dir_fd, name, bytes) {
        Ok(true) => Ok(()),
        Ok(false) => {
            let mut temp = name.to_os_string();
            temp.push(".vramgate-tmp");
            atomic_file::replace_at(&dir_fd, name, &temp, bytes, mode, None).map_err(io(path))
        }
        Err(e) => Err(io(path)(e)),
    }
}

/// Replaces `path` atomically (a new inode: temp file, fsync, rename), with `mode`: vramgate's
/// own files (the binaries, which a shim may be executing, its state, its config, its
/// drop-in), which readers must see whole.
pub fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), HostPathError> {
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => (dir, name),
        _ => return Err(HostPathError::NotHostPath { path: path.into() }),
    };
    let dir_fd = atomic_file::open_dir(dir).map_err(io(dir))?;
    let mut temp = name.to_os_string();
    temp.push(".vramgate-tmp");
    atomic_file::replace_at(&dir_fd, name, &temp, bytes, mode, None).map_err(io(path))
}

/// Rewrites the file `name` in the open directory `dir` in place: the same inode, owner and
/// mode, its content `bytes` (written from the start, then cut to their length, then synced).
/// `Ok(false)` when there is no such file. Not atomic: a reader in between sees a torn file,
/// which is why only an engine's config, read when the engine starts, is written so, and why
/// what it held is kept first (the backup, the set-up's state file).
pub fn rewrite_in_place(dir: &File, name: &std::ffi::OsStr, bytes: &[u8]) -> std::io::Result<bool> {
    use nix::fcntl::{openat, OFlag};
    use std::os::fd::AsFd;
    let fd = match openat(
        dir.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let mut file = File::from(fd);
    // O_NONBLOCK above: a FIFO planted there must not hang the open; only a file is written.
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    file.write_all(bytes)?;
    file.set_len(bytes.len() as u64)?;
    file.sync_all()?;
    Ok(true)
}

/// Removes the file at `path`; one already gone is fine.
pub fn remove_file(path: &Path) -> Result<(), HostPathError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path)(e)),
    }
}

/// The backup setup keeps of a file it changes: `<file>.vramgate-backup`.
pub fn backup_of(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(BACKUP_SUFFIX);
    PathBuf::from(p)
}

/// The engine's view of the host's files: the host root in this process's view, and where the
/// engine sees that root (`/` for an engine on the host; a test's containerd may run with its
/// files under a directory of its own). Paths in the engine's config are the engine's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineView {
    pub host: HostRoot,
    pub engine_root: PathBuf,
}

impl EngineView {
    /// The file the engine names `engine_path` (absolute), in this process's view, confined
    /// to the host root.
    pub fn local(&self, engine_path: &Path) -> Result<PathBuf, HostPathError> {
        let host = engine_path
            .strip_prefix(&self.engine_root)
            .map(|rest| Path::new("/").join(rest))
            .map_err(|_| HostPathError::Escapes {
                path: engine_path.into(),
                root: self.engine_root.clone(),
                resolved: engine_path.into(),
            })?;
        self.host.resolve(&host)
    }

    /// The host path `host_path` as the engine names it.
    pub fn engine(&self, host_path: &Path) -> Result<PathBuf, HostPathError> {
        under(&self.engine_root, host_path)
    }

    /// The engine sees the host's `/` as its own: a program of the host's, run chrooted into
    /// the host root, reads the same files the engine does.
    pub fn engine_is_on_the_host(&self) -> bool {
        self.engine_root == Path::new("/")
    }
}
