//! `vramgate setup <engine>`: wire vramgate into Docker, containerd, podman or CRI-O the way
//! each engine expects, like `nvidia-ctk runtime configure`.
//!
//! Every engine is planned first (what each file would become) and applied second, so
//! `--dry-run` prints exactly what a real run writes. A file already in the wanted state is not
//! rewritten; a file that is changed keeps every key vramgate does not own, and its previous
//! content is kept as `<file>.vramgate-backup`. `--remove` undoes what setup did.
//!
//! - Docker: the `vramgate` runtime in `/etc/docker/daemon.json` (edited as an order-preserving
//!   JSON tree). dockerd re-reads runtimes on SIGHUP.
//! - containerd: a drop-in with a runc-v2 runtime whose `BinaryName` is `vramgate-runtime`, and
//!   the CRI annotation pass-lists (containerd passes no pod annotations to the spec unless a
//!   runtime allows them), imported from the main config.
//! - podman and CRI-O: the hooks.d JSON in `/usr/share/containers/oci/hooks.d`, the directory
//!   both read by default (podman reads `/etc/containers/oci/hooks.d` only when configured).
//! - CRI-O also: a drop-in in `/etc/crio/crio.conf.d` with the runtime handler `vramgate`
//!   (`runtime_path` = `vramgate-runtime`), for what needs the wrapper (placement, narrowing,
//!   the enforcement tiers it sets up). CRI-O passes every annotation but its own
//!   `io.kubernetes.cri-o.*` ones to the spec, so no `allowed_annotations` are needed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::atomic_file;

mod chain;
mod containerd;
mod crio;
mod docker;
pub mod engine;
pub mod host_root;
mod imports;
mod node;
pub use chain::*;
pub use containerd::*;
pub use crio::*;
use docker::*;
pub use host_root::{EngineView, HostRoot};
use imports::*;
pub use node::*;

pub const DOCKER_DAEMON_JSON: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CONTAINERD_DROP_IN: &str = "/etc/containerd/conf.d/vramgate.toml";
pub const HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
/// CRI-O reads its drop-ins in name order; 10- goes before the ones an admin numbers higher.
pub const CRIO_DROP_IN: &str = "/etc/crio/crio.conf.d/10-vramgate.conf";
/// The runc state directory of the `vramgate` handler: runc's own (CRI-O's default for its
/// `runc` handler), so `runc list` shows every container whichever handler ran it.
pub const CRIO_RUNTIME_ROOT: &str = "/run/runc";
pub const RUNTIME_NAME: &str = "vramgate";
pub const RUNTIME_BINARY: &str = "vramgate-runtime";
pub const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/vramgate-runtime";
pub const BACKUP_SUFFIX: &str = ".vramgate-backup";
/// Annotations the CRI plugin copies from pods and containers into the OCI spec.
pub const ANNOTATION_PATTERN: &str = "vramgate.dev/*";
/// KAI's per-container memory annotations (`nvidia.com/container.<name>.gpu-memory.*`), which
/// are a request ([`crate::request::nvidia_memory`]) and reach the spec only when allowed.
pub const NVIDIA_ANNOTATION_PATTERN: &str = "nvidia.com/container.*";
/// CDI device requests a device plugin writes on a container (NVIDIA's `cdi-annotations`
/// strategy), passed to the runtime from container annotations only.
pub const CDI_ANNOTATION_PATTERN: &str = "cdi.k8s.io/*";
const PRESTART_JSON: &str = include_str!("../../hooks/vramgate-prestart.json");
const POSTSTOP_JSON: &str = include_str!("../../hooks/vramgate-poststop.json");
pub const PRESTART_FILE: &str = "vramgate-prestart.json";
pub const POSTSTOP_FILE: &str = "vramgate-poststop.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Engine {
    Docker,
    Containerd,
    Podman,
    Crio,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid {format}: {message}; fix it by hand, then run setup again")]
    Parse {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error("{path}: {what}; fix it by hand, then run setup again")]
    Shape { path: PathBuf, what: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot remove {path}: {source}")]
    Remove { path: PathBuf, source: std::io::Error },
    /// A path on the host that cannot be used as it is (see [`host_root::HostPathError`]).
    #[error("{0}")]
    Host(String),
}

pub type Result<T, E = SetupError> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct SetupOptions {
    pub engine: Engine,
    pub remove: bool,
    pub set_as_default: bool,
    /// The file (Docker: daemon.json; containerd: the drop-in) or directory (podman, CRI-O:
    /// hooks.d) to edit instead of the engine's default.
    pub config_path: Option<PathBuf>,
    /// containerd's main config, which must import the drop-in.
    pub containerd_config: Option<PathBuf>,
    /// The drop-in's path as containerd sees it, for the import line: `config_path` unless
    /// setup edits the host's files through a mount (`vramgate setup-node`).
    pub containerd_import: Option<PathBuf>,
    /// CRI-O's drop-in with the `vramgate` runtime handler.
    pub crio_drop_in: Option<PathBuf>,
    pub runtime_path: PathBuf,
    pub hook_path: PathBuf,
    /// Seconds the engine gives the admission hook (hooks.d only; the wrapper computes its own).
    pub hook_timeout_secs: u64,
    /// Where the engine's files are, for a set-up that edits them through a mount of the
    /// host's root (`vramgate setup-node`): the paths the engine's config names (imports) are
    /// read there, and `containerd config dump` runs chrooted into it. `None`: on the host.
    pub engine_view: Option<EngineView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Write(Vec<u8>),
    Remove,
}

/// What of a changed file is vramgate's: what an undo may take out again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// The whole file (a drop-in, a hooks.d file, a backup).
    File,
    /// Another's file in which vramgate added only its entry to `imports`.
    Import { entry: String },
    /// Another's containerd config (version 2) in which vramgate added only its runtime by key,
    /// and where it did, containerd's built-in `runc` and the default runtime's name (with its
    /// value before).
    Keys {
        runc: bool,
        default_before: Option<Option<String>>,
    },
    /// Another's file from which vramgate took out a part of its own (`--remove`).
    Removal,
    /// Another's file whose keys vramgate sets (Docker's daemon.json).
    Settings,
}

#[derive(Debug, Clone)]
pub struct Change {
    pub path: PathBuf,
    pub action: Action,
    pub owned: Owned,
    /// Where the previous content goes (files that exist and hold more than vramgate's part).
    pub backup: Option<PathBuf>,
    /// The previous content, written to `backup`.
    pub previous: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Files that are already as wanted.
    pub unchanged: Vec<PathBuf>,
    /// What the operator does next (reload the engine, how to use it).
    pub next_steps: Vec<String>,
    /// What setup read to decide, and what it could not read: printed whatever changes.
    pub notes: Vec<String>,
}

/// A binary next to the running one, else its packaged path.
pub fn sibling_or(name: &str, packaged: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(packaged))
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SetupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl Plan {
    /// Adds a change that makes `path` hold `wanted` (`None`: not exist), when it does not;
    /// `owned` says what of it is vramgate's.
    fn want(&mut self, path: &Path, current: Option<Vec<u8>>, wanted: Option<Vec<u8>>, backup: bool, owned: Owned) {
        if current == wanted {
            self.unchanged.push(path.to_path_buf());
            return;
        }
        let backup = (backup && current.is_some()).then(|| host_root::backup_of(path));
        self.changes.push(Change {
            path: path.to_path_buf(),
            action: match wanted {
                Some(bytes) => Action::Write(bytes),
                None => Action::Remove,
            },
            owned,
            backup,
            previous: current,
        });
    }
}

pub fn plan(options: &SetupOptions) -> Result<Plan> {
    match options.engine {
        Engine::Docker => plan_docker(options),
        Engine::Containerd => plan_containerd(options),
        Engine::Podman | Engine::Crio => plan_hooks_d(options),
    }
}

/// `path` with its directory resolved: an engine's config directory may be a symlink (a
/// distribution or an admin moving `/etc/docker` elsewhere), and the writers open the
/// directory they write in with `O_NOFOLLOW`.
fn resolved(path: &Path) -> std::io::Result<PathBuf> {
    Ok(
        match (path.parent().filter(|d| !d.as_os_str().is_empty()), path.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir)?.join(name),
            _ => path.to_path_buf(),
        },
    )
}

/// Writes the plan: backups first (atomically), then each file: one that exists is rewritten
/// in place, keeping its inode, owner and mode (an engine's config is the admin's file); a new
/// one is created atomically.
pub fn apply(plan: &Plan) -> Result<()> {
    for change in &plan.changes {
        let write_err = |e: host_root::HostPathError| SetupError::Write {
            path: change.path.clone(),
            source: std::io::Error::other(e.to_string()),
        };
        if let (Some(backup), Some(previous)) = (&change.backup, &change.previous) {
            let target = resolved(backup).map_err(|source| SetupError::Write {
                path: backup.clone(),
                source,
            })?;
            atomic_file::replace(&target, previous, 0o600, None).map_err(|source| SetupError::Write {
                path: backup.clone(),
                source,
            })?;
        }
        match &change.action {
            Action::Write(bytes) => {
                if let Some(dir) = change.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|source| SetupError::Write {
                        path: change.path.clone(),
                        source,
                    })?;
                }
                let target = resolved(&change.path).map_err(|source| SetupError::Write {
                    path: change.path.clone(),
                    source,
                })?;
                host_root::write_file(&target, bytes, 0o644).map_err(write_err)?;
            }
            Action::Remove => match std::fs::remove_file(&change.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(SetupError::Remove {
                        path: change.path.clone(),
                        source,
                    })
                }
            },
        }
    }
    Ok(())
}

/// What a plan does, for people: one line per file, and the new content on `--dry-run`.
pub fn describe(plan: &Plan, dry_run: bool) -> String {
    let mut out = String::new();
    let verb = |now: &'static str, would: &'static str| if dry_run { would } else { now };
    for change in &plan.changes {
        match &change.action {
            Action::Write(bytes) => {
                out += &format!("{} {}", verb("wrote", "would write"), change.path.display());
                if let Some(b) = &change.backup {
                    out += &format!(" (previous content {} {})", verb("kept in", "kept in"), b.display());
                }
                out += "\n";
                if dry_run {
                    out += &String::from_utf8_lossy(bytes);
                    if !bytes.ends_with(b"\n") {
                        out += "\n";
                    }
                }
            }
            Action::Remove => out += &format!("{} {}\n", verb("removed", "would remove"), change.path.display()),
        }
    }
    for path in &plan.unchanged {
        out += &format!("{} is already as wanted; left alone\n", path.display());
    }
    for note in &plan.notes {
        out += &format!("note: {note}\n");
    }
    if !plan.changes.is_empty() {
        for step in &plan.next_steps {
            out += &format!("next: {step}\n");
        }
    }
    out
}

/// Mode bits of an existing file, for tests and callers that check setup kept them.
pub fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

#[cfg(test)]
mod tests;
