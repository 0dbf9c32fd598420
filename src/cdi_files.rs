//! The node's CDI spec files, read as a CDI runtime finds them and with care for what else a
//! writable CDI directory may hold (a FIFO, a device node, a huge file). At the bottom: the
//! toolkit's hook probe ([`crate::enforce::toolkit`]) and the DRA driver ([`crate::dra::cdi_spec`])
//! both read through it, and neither reaches the other.

use std::path::{Path, PathBuf};

/// What tells one version of a spec file from another without reading it: a file replaced
/// (renamed into place) has another inode, one rewritten in place another mtime or size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The stamp of the regular file at `path` (a link is followed), or `None` for anything else
/// or what cannot be looked at.
pub fn regular_stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    meta.is_file().then(|| Stamp::of(&meta))
}

/// The bytes of the regular file at `path`, at most `limit` of them, with the stamp of what
/// was read; `None` for anything else. Anyone who can write a CDI directory can put a FIFO, a
/// device node or a link to one there under a spec's name: opening a FIFO for reading waits
/// for a writer, a device may never end. Such files are looked at (stat), never read, and
/// the open does not wait (`O_NONBLOCK`), in case one was swapped in after the look.
pub fn read_regular(path: &Path, limit: u64) -> Option<(Stamp, Vec<u8>)> {
    use std::os::unix::fs::OpenOptionsExt;
    let seen = regular_stamp(path)?;
    if seen.size > limit {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let bytes = crate::spec::read_open_limited(file, limit).ok()??;
    Some((Stamp::of(&meta), bytes))
}

/// The largest spec file read for NVIDIA's devices: the toolkit's spec lists each GPU's files,
/// tens of KiB.
pub const NVIDIA_SPEC_LIMIT: u64 = 4 << 20;

/// The directories, for a message.
pub fn dirs_named(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The spec files in `dirs` as a CDI runtime would read them (`*.yaml`, `*.yml`, `*.json`),
/// sorted within each directory, each once; a directory that cannot be listed has none.
pub fn spec_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|f| f.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
            .collect();
        files.sort();
        for file in files {
            if !all.contains(&file) {
                all.push(file);
            }
        }
    }
    all
}

/// One spec file of the node, parsed (YAML or JSON); `None` when it is not a regular file,
/// larger than [`NVIDIA_SPEC_LIMIT`] or does not parse. Read with [`read_regular`]'s care: a
/// FIFO or device node under a spec's name is never opened for a wait.
pub fn read_node_spec(path: &Path) -> Option<serde_json::Value> {
    let (_, bytes) = read_regular(path, NVIDIA_SPEC_LIMIT)?;
    parse_spec(&bytes)
}

/// A spec file's bytes as JSON values; `None` when they do not parse. JSON is YAML: one
/// parser for both forms.
pub fn parse_spec(bytes: &[u8]) -> Option<serde_json::Value> {
    let text = std::str::from_utf8(bytes).ok()?;
    serde_saphyr::from_str::<serde_json::Value>(text).ok()
}
