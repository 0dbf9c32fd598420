//! Atomic replacement of a file: the one writer that the ledger, the runtime wrapper (a
//! bundle's `config.json`) and `vramgate setup` (engine configs) share.
//!
//! A temporary file is created next to the target inside an open directory, given its mode
//! and owner, written, fsynced, renamed over the target, and then the directory is fsynced so
//! the rename itself is durable. A reader sees the old file or the new one, never a torn one,
//! and a crash at any point leaves one of the two. Every name is opened relative to the
//! directory's file descriptor with `O_NOFOLLOW`, so swapping a path component (or planting a
//! symlink at the temporary name) cannot redirect root's write elsewhere.
//!
//! Root writes these files on every container start: the module holds no `unsafe`, and the
//! compiler keeps it so.
#![forbid(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fchmod, Mode};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};

/// Opens a directory for use with [`replace_at`], refusing a symlink in its place.
pub fn open_dir(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

fn c_name(name: &OsStr) -> std::io::Result<CString> {
    if name.is_empty() || name.as_bytes().contains(&b'/') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a file name holds a NUL byte"))
}

/// Replaces `name` inside the open directory `dir` with `bytes`, through the temporary name
/// `temp_name` in the same directory. `mode` and `owner` are set on the new file before it
/// becomes visible. The caller must own `temp_name` exclusively (hold a lock, or make it
/// unique): whatever stands there already (a leftover of a writer killed mid-write, or a
/// planted symlink) is unlinked, never followed.
pub fn replace_at(
    dir: &File,
    name: &OsStr,
    temp_name: &OsStr,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let name_c = c_name(name)?;
    let temp_c = c_name(temp_name)?;
    let dirfd = dir.as_fd();
    match unlinkat(dirfd, temp_c.as_c_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let mode = mode & 0o7777;
    let fd = openat(
        dirfd,
        temp_c.as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )?;
    let mut file = File::from(fd);
    let written = (|| -> std::io::Result<()> {
        // The umask narrowed the mode at creation; the requested one is what readers expect.
        fchmod(file.as_fd(), Mode::from_bits_truncate(mode))?;
        if let Some((uid, gid)) = owner {
            fchown(file.as_fd(), Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        renameat(dirfd, temp_c.as_c_str(), dirfd, name_c.as_c_str())?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = unlinkat(dirfd, temp_c.as_c_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    // The rename is durable only once the directory entry is.
    dir.sync_all()
}

/// Replaces the file at `path` (see [`replace_at`]), through a temporary name unique to this
/// process: `.<name>.vramgate-<pid>.tmp`.
pub fn replace(path: &Path, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(format!(".vramgate-{}.tmp", std::process::id()));
    let dir = open_dir(parent)?;
    replace_at(&dir, name, &temp, bytes, mode, owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn replaces_with_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("config.json");
        std::fs::write(&target, b"old").unwrap();
        replace(&target, b"new", 0o640, None).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777, 0o640);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsStr::new("config.json")]);
    }

    #[test]
    fn a_symlink_at_the_temp_name_is_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("ledger.json.tmp")).unwrap();
        let d = open_dir(dir.path()).unwrap();
        replace_at(
            &d,
            OsStr::new("ledger.json"),
            OsStr::new("ledger.json.tmp"),
            b"{}",
            0o600,
            None,
        )
        .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.path().join("ledger.json")).unwrap(), b"{}");
        assert!(!dir.path().join("ledger.json.tmp").exists());
        let uid = std::fs::metadata(dir.path().join("ledger.json")).unwrap().uid();
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
    }

    #[test]
    fn names_with_a_slash_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = open_dir(dir.path()).unwrap();
        let err = replace_at(&d, OsStr::new("../x"), OsStr::new("t"), b"", 0o600, None).unwrap_err();
        assert!(err.to_string().contains("not a plain file name"), "{err}");
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        assert!(open_dir(&dir.path().join("link")).is_err());
    }
}
