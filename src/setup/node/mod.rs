//! `vramgate setup-node`: set up the node it runs on from a privileged container that has the
//! host's root mounted (the Helm chart's optional node set-up DaemonSet), the way NVIDIA's GPU
//! operator installs its container toolkit: copy `vramgate-hook` and `vramgate-runtime` into
//! a host directory of vramgate's own, run the same containerd plan as `vramgate setup
//! containerd` against the host's config as containerd reads it ([`EngineView`]), restart the
//! engine once, and, when stopped, take out exactly what it added and restart it again.
//!
//! What it adds is recorded before it adds it, in a state file inside its install directory,
//! part by part ([`Part`]): its entry in the main config's `imports`, its drop-in, its keys in
//! a version 2 config, the host's `config.toml` it installs, the binaries it copies. The undo
//! takes each part out by itself and leaves every other byte: a runtime NVIDIA's toolkit (or an
//! admin) added meanwhile stays, and a file it changes keeps its inode, owner and mode. A part
//! someone else changed since is left, with a line saying so. A step that fails does not stop
//! the others; the undo then ends non-zero naming what it left, and records it for the next
//! run, which finishes it before setting up (its predecessor crashed, or was killed).
//!
//! One node, one set-up: the lock lives in the ledger's directory, which every set-up of the
//! node shares whatever its install directory, and a node whose containerd already has a
//! runtime `vramgate` (the package's `vramgate setup containerd`, another release) is refused.
//!
//! Here: the options, the install and its refusals; [`state`]: what is recorded and the lock;
//! [`undo`]: taking each part out.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::engine::{restart_by_signal, tasks_running, EngineError, Restarted};
use super::host_root::{io, read_plain, remove_file, replace_file, write_file, EngineView, HostPathError, HostRoot};
use super::*;

mod state;
mod undo;

use state::lock;
pub use state::{NodeState, Part, Saved, Undone};

/// Where the binaries go on the host: `/usr/local` is the admin's, not the distribution's
/// package manager's, and a directory of vramgate's own is one it can remove whole.
pub const NODE_INSTALL_DIR: &str = "/usr/local/lib/vramgate";
pub const NODE_STATE_FILE: &str = "node-setup.json";
/// In the ledger's directory: one per node, whatever the install directory.
pub const NODE_LOCK_FILE: &str = "node-setup.lock";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
pub const CONTAINERD_TASKS: &str = "/run/containerd/io.containerd.runtime.v2.task";
/// The binaries the engine runs, copied from beside this one.
pub const NODE_BINARIES: [&str; 2] = [RUNTIME_BINARY, crate::runtime::HOOK_BINARY];

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Host(#[from] HostPathError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("another `vramgate setup-node` holds {path} (waited {waited:?}); stop it first")]
    Busy { path: PathBuf, waited: Duration },
    #[error("this node is already set up by another `vramgate setup-node` (install dir {other}, holding {lock}): two set-ups would edit the same containerd config; uninstall the other release, or keep this one's nodeSelector off the node")]
    OtherRelease { other: String, lock: PathBuf },
    #[error("containerd already has vramgate's runtime in {path} (BinaryName {binary:?}): this node is set up without the chart (the package's `vramgate setup containerd`, or by hand); run `vramgate setup containerd --remove` on it first, or keep the node out of nodeSetup's nodeSelector")]
    AlreadySetUp { path: PathBuf, binary: String },
    #[error("{path} exists and was not put there by `vramgate setup-node`; remove it or choose another --install-dir")]
    NotOurs { path: PathBuf },
    #[error("{path} is not a state file `vramgate setup-node` wrote ({message}); look at it, restore the files it names by hand, remove it, and start again")]
    State { path: PathBuf, message: String },
    #[error("the undo an earlier run left could not finish: {}; fix that, then start again", .left.join("; "))]
    Unfinished { left: Vec<String> },
    #[error(transparent)]
    StateDir(#[from] crate::ledger::LedgerError),
}

pub type NodeResult<T> = std::result::Result<T, NodeError>;

/// How the engine is made to read its new config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// SIGHUP to the process that serves the engine's socket (found with SO_PEERCRED; the
    /// container needs the host's PID namespace). containerd does not handle SIGHUP, so it
    /// exits and its service manager starts it again (systemd's containerd.service has
    /// `Restart=always`); running containers keep running. NVIDIA's toolkit does the same.
    Signal,
    /// Nothing: the admin restarts the engine.
    None,
}

#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Where the host's root is mounted in this process's view (`/host`).
    pub host_root: PathBuf,
    /// Where the engine sees the host's root: `/` for an engine on the host. The paths written
    /// into the engine's config (the import, the wrapper's path) are this plus the host path.
    pub engine_root: PathBuf,
    /// containerd's main config, as a host path.
    pub engine_config: PathBuf,
    /// The engine's API socket, as a host path (for `signal`).
    pub engine_socket: PathBuf,
    /// containerd's task directory (`<state>/io.containerd.runtime.v2.task`), as a host path:
    /// where the undo finds the containers whose shim still runs the copied wrapper.
    pub engine_tasks: PathBuf,
    pub install_dir: PathBuf,
    /// The ledger's directory (config.toml's `state_dir`), as a host path: made when missing,
    /// as the package's tmpfiles entry makes it at boot, since the chart's pods mount it and a
    /// node set up from the chart has no package. Kept on undo: it holds the reservations of
    /// containers still running. The set-up's lock lives there.
    pub state_dir: PathBuf,
    pub restart: RestartMode,
    /// The binaries to copy (vramgate-runtime and vramgate-hook), from this container.
    pub binaries: Vec<PathBuf>,
    pub set_as_default: bool,
    /// A config.toml to install on the host (the chart's, from its ConfigMap in this
    /// container) and the host path the host's hook and runtime read it from.
    pub install_config: Option<(PathBuf, PathBuf)>,
    pub hook_timeout_secs: u64,
    /// How long to wait for another run's lock, and for the engine to come back.
    pub wait: Duration,
}

/// A held set-up: the lock and where things are. Dropping it releases the lock.
#[derive(Debug)]
pub struct NodeSetup {
    options: NodeOptions,
    host: HostRoot,
    _lock: File,
    /// Binaries a previous run kept (containers still ran through them): this run's copies
    /// replace them rather than being refused as someone else's.
    kept: Vec<PathBuf>,
    pub state: NodeState,
    /// One line per thing done, for the log.
    pub report: Vec<String>,
}

impl NodeOptions {
    fn view(&self) -> EngineView {
        EngineView {
            host: HostRoot::new(&self.host_root),
            engine_root: self.engine_root.clone(),
        }
    }

    fn drop_in(&self) -> PathBuf {
        self.engine_config
            .parent()
            .unwrap_or(Path::new("/"))
            .join("conf.d/vramgate.toml")
    }

    fn state_path(&self) -> PathBuf {
        self.install_dir.join(NODE_STATE_FILE)
    }

    /// The wrapper's path as the engine names it.
    fn runtime(&self) -> NodeResult<PathBuf> {
        Ok(self.view().engine(&self.install_dir.join(RUNTIME_BINARY))?)
    }
}

/// The runtime `vramgate` containerd would read from any file of its config, with its
/// `BinaryName`; or a file at the path of vramgate's drop-in (`drop_in`, this process's view, as
/// containerd names it), which the set-up would otherwise overwrite.
fn runtime_configured(chain: &ConfigChain, drop_in: (&Path, &Path)) -> NodeResult<Option<(PathBuf, String)>> {
    if let Some(bytes) = read_plain(drop_in.0)? {
        let binary = toml::from_str::<toml::Table>(&String::from_utf8_lossy(&bytes))
            .ok()
            .and_then(|t| {
                let binary = [CRI_PLUGIN, CRI_RUNTIME_PLUGIN_V3].iter().find_map(|plugin| {
                    runtime_binary(
                        plugin_section(&t, plugin)?
                            .get("containerd")?
                            .get("runtimes")?
                            .get(RUNTIME_NAME)?,
                    )
                });
                binary
            })
            .unwrap_or_else(|| "none: it is not vramgate's".into());
        return Ok(Some((drop_in.1.to_path_buf(), binary)));
    }
    Ok(chain.files.iter().find_map(|file| {
        [CRI_PLUGIN, CRI_RUNTIME_PLUGIN_V3].iter().find_map(|plugin| {
            let runtime = plugin_section(&file.table, plugin)?
                .get("containerd")?
                .get("runtimes")?
                .get(RUNTIME_NAME)?;
            Some((file.engine.clone(), runtime_binary(runtime).unwrap_or_default()))
        })
    }))
}

fn runtime_binary(runtime: &toml::Value) -> Option<String> {
    Some(runtime.get("options")?.get("BinaryName")?.as_str()?.to_string())
}

/// containerd's config as it stands, read through the host root (for the undo's and the
/// refusal's look at every file).
fn load_chain(options: &NodeOptions, view: &EngineView) -> NodeResult<ConfigChain> {
    let local = view.host.resolve(&options.engine_config)?;
    let text = match read_plain(&local)? {
        Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        None => String::new(),
    };
    let table = toml::from_str::<toml::Table>(&text).map_err(|e| SetupError::Parse {
        path: local.clone(),
        format: "TOML",
        message: crate::one_line(e.message()),
    })?;
    Ok(ConfigChain::load(
        &view.engine(&options.engine_config)?,
        &text,
        &table,
        Some(view),
    ))
}

impl NodeSetup {
    /// Takes the lock, finishes what a previous run left, and sets the node up.
    pub fn install(options: NodeOptions) -> NodeResult<NodeSetup> {
        let host = HostRoot::new(&options.host_root);
        // Every path checked before anything is created, so a refused one leaves no trace.
        for path in [&options.engine_config, &options.drop_in(), &options.engine_socket] {
            host.resolve(path)?;
        }
        if let Some((source, target)) = &options.install_config {
            std::fs::metadata(source).map_err(io(source))?;
            let local = host.resolve(target)?;
            if std::fs::symlink_metadata(&local).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(HostPathError::Link { path: target.clone() }.into());
            }
        }
        // A containerd that ignores SIGHUP cannot be restarted by it: said now, before any
        // change, rather than after the wait for a restart that never comes.
        if options.restart == RestartMode::Signal {
            let socket = host.resolve(&options.engine_socket)?;
            let pid = super::engine::engine_pid(&socket)?;
            if super::engine::ignores(pid, nix::sys::signal::Signal::SIGHUP)? {
                return Err(EngineError::IgnoresSignal {
                    pid,
                    socket: options.engine_socket.clone(),
                    signal: nix::sys::signal::Signal::SIGHUP,
                }
                .into());
            }
        }
        let mut report = Vec::new();
        let state_dir = host.resolve(&options.state_dir)?;
        if std::fs::symlink_metadata(&state_dir).is_err() {
            crate::ledger::StateDir::open_or_create(&state_dir)?;
            report.push(format!(
                "made {} (the ledger's directory; kept on undo)",
                options.state_dir.display()
            ));
        }
        let lock = lock(&host.resolve(&options.state_dir)?, &options.install_dir, options.wait)?;
        // Made (by [`NodeSetup::apply`]) only once nothing refuses the set-up: a refused run
        // leaves no install directory behind.
        let dir = host.resolve(&options.install_dir)?;
        let created_dir = match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => false,
            Ok(_) => return Err(NodeError::NotOurs { path: dir }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(io(&dir)(e).into()),
        };
        let mut setup = NodeSetup {
            state: NodeState {
                parts: Vec::new(),
                files: Vec::new(),
                binaries: Vec::new(),
                dirs: Vec::new(),
                created_dir,
                restarted: false,
                restart: options.restart,
                engine_socket: options.engine_socket.clone(),
                runtime: Some(options.runtime()?),
            },
            options,
            host,
            _lock: lock,
            kept: Vec::new(),
            report,
        };
        let state_path = setup.host.resolve(&setup.options.state_path())?;
        if let Some(bytes) = read_plain(&state_path)? {
            let previous: NodeState = serde_json::from_slice(&bytes).map_err(|e| NodeError::State {
                path: state_path.clone(),
                message: e.to_string(),
            })?;
            setup.report.push(format!(
                "{} was left by an earlier run (killed before its undo, or keeping binaries still in use): undoing it first",
                state_path.display()
            ));
            // The directory stays (this run holds its lock); whether it was created before
            // carries over. No restart: the set-up below restarts the engine once.
            setup.state.created_dir = previous.created_dir || created_dir;
            let undone = setup.restore(&previous, Duration::ZERO, false);
            setup.report.extend(undone.report);
            if !undone.left.is_empty() {
                return Err(NodeError::Unfinished { left: undone.left });
            }
            // Binaries still in use stay: this run's copies replace them in place.
            setup.kept = undone.kept;
        }
        setup.apply()?;
        Ok(setup)
    }

    fn apply(&mut self) -> NodeResult<()> {
        let o = self.options.clone();
        let view = o.view();
        let chain = load_chain(&o, &view)?;
        let drop_in = (self.host.resolve(&o.drop_in())?, view.engine(&o.drop_in())?);
        if let Some((path, binary)) = runtime_configured(&chain, (&drop_in.0, &drop_in.1))? {
            return Err(NodeError::AlreadySetUp { path, binary });
        }
        let setup_options = SetupOptions {
            engine: Engine::Containerd,
            remove: false,
            set_as_default: o.set_as_default,
            config_path: Some(self.host.resolve(&o.drop_in())?),
            containerd_config: Some(self.host.resolve(&o.engine_config)?),
            containerd_import: Some(view.engine(&o.drop_in())?),
            crio_drop_in: None,
            runtime_path: o.runtime()?,
            hook_path: view.engine(&o.install_dir.join(crate::runtime::HOOK_BINARY))?,
            hook_timeout_secs: o.hook_timeout_secs,
            engine_view: Some(view.clone()),
        };
        let plan = plan(&setup_options)?;
        let mut parts = Vec::new();
        for change in &plan.changes {
            let path = self.host.host_path(&change.path);
            if let (Some(backup), Some(previous)) = (&change.backup, &change.previous) {
                parts.push(Part::File {
                    path: self.host.host_path(backup),
                    before: read_plain(backup)?,
                    written: Some(previous.clone()),
                });
            }
            let Action::Write(bytes) = &change.action else {
                // Only a drop-in of an earlier release is removed by a set-up, and a node that
                // has one is refused above.
                continue;
            };
            parts.push(match &change.owned {
                Owned::Import { entry } => Part::Import {
                    config: path,
                    entry: entry.clone(),
                    created: change.previous.is_none().then(|| bytes.clone()),
                },
                Owned::Keys { runc, default_before } => Part::Keys {
                    config: path,
                    runc: *runc,
                    default_before: default_before.clone(),
                },
                _ => Part::File {
                    path,
                    before: change.previous.clone(),
                    written: Some(bytes.clone()),
                },
            });
        }
        // The host's config.toml, when the chart gives one: written after the binaries.
        let mut config_file = None;
        if let Some((source, target)) = &o.install_config {
            let bytes = std::fs::read(source).map_err(io(source))?;
            let local = self.host.resolve(target)?;
            parts.push(Part::File {
                path: target.clone(),
                before: read_plain(&local)?,
                written: Some(bytes.clone()),
            });
            config_file = Some((local, bytes));
        }
        let mut dirs = Vec::new();
        let written = plan
            .changes
            .iter()
            .filter(|c| matches!(c.action, Action::Write(_)))
            .map(|c| c.path.clone())
            .chain(config_file.as_ref().map(|(local, _)| local.clone()));
        for path in written {
            let mut dir = path.parent();
            while let Some(d) = dir.filter(|d| !d.exists() && d.starts_with(&o.host_root)) {
                let host = self.host.host_path(d);
                if !dirs.contains(&host) {
                    dirs.push(host);
                }
                dir = d.parent();
            }
        }
        let mut sources = Vec::new();
        for source in &o.binaries {
            let name = source
                .file_name()
                .ok_or_else(|| HostPathError::NotHostPath { path: source.clone() })?;
            let target = o.install_dir.join(name);
            if read_plain(&self.host.resolve(&target)?)?.is_some() && !self.kept.contains(&target) {
                return Err(NodeError::NotOurs { path: target });
            }
            sources.push((target, std::fs::read(source).map_err(io(source))?));
        }
        self.state.parts = parts;
        self.state.dirs = dirs;
        self.state.binaries = sources.iter().map(|(t, _)| t.clone()).collect();
        self.state.restarted = !plan.changes.is_empty() && o.restart != RestartMode::None;
        let dir = self.host.resolve(&o.install_dir)?;
        if self.state.created_dir && std::fs::symlink_metadata(&dir).is_err() {
            std::fs::create_dir(&dir).map_err(io(&dir))?;
        }
        // Recorded before anything changes: a crash from here on leaves what the next run undoes.
        self.save()?;
        for (target, bytes) in &sources {
            // A new inode: a kept binary may be executing (a shim stopping a container).
            replace_file(&self.host.resolve(target)?, bytes, 0o755)?;
            self.report.push(format!("installed {}", target.display()));
        }
        for dir in self.state.dirs.iter().rev() {
            let made = self.host.resolve(dir)?;
            if std::fs::symlink_metadata(&made).is_err() {
                std::fs::create_dir(&made).map_err(io(&made))?;
            }
        }
        if let Some((local, bytes)) = &config_file {
            // Read by the host's hook at every container start: seen whole, old or new.
            replace_file(local, bytes, 0o644)?;
            self.report.push(format!(
                "installed {} (the chart's config)",
                self.host.host_path(local).display()
            ));
        }
        for change in &plan.changes {
            if let (Some(backup), Some(previous)) = (&change.backup, &change.previous) {
                replace_file(backup, previous, 0o600)?;
            }
            if let Action::Write(bytes) = &change.action {
                match change.owned {
                    // vramgate's own file, new: whole or not at all.
                    Owned::File => replace_file(&change.path, bytes, 0o644)?,
                    // Another's file: in place, its inode, owner and mode kept.
                    _ => write_file(&change.path, bytes, 0o644)?,
                }
            }
        }
        self.report.extend(
            describe(&plan, false)
                .lines()
                .filter(|l| !l.starts_with("next:"))
                .map(str::to_string),
        );
        if self.state.restarted {
            let line = self.restart()?;
            self.report.push(line);
        } else if !plan.changes.is_empty() {
            self.report
                .push("restart mode none: restart the engine to load vramgate's runtime".into());
        }
        Ok(())
    }

    fn save(&self) -> NodeResult<()> {
        let path = self.host.resolve(&self.options.state_path())?;
        let bytes = serde_json::to_vec(&self.state).expect("the state serializes");
        Ok(replace_file(&path, &bytes, 0o600)?)
    }

    /// Restarts the engine by signal and waits (bounded) until it serves its socket again; the
    /// line says how it went. Not coming back in time is not an error that undoes: the config
    /// is in place for when it does.
    fn restart(&self) -> NodeResult<String> {
        let socket = self.host.resolve(&self.options.engine_socket)?;
        Ok(match restart_by_signal(&socket, self.options.wait)? {
            Restarted::Back { old, new, after } => {
                format!("restarted the engine: SIGHUP to pid {old}, back as pid {new} after {after:?}")
            }
            Restarted::NotBack { old, waited } => format!(
                "sent SIGHUP to the engine (pid {old}); it did not serve {} again within {waited:?}: check its service manager restarts it",
                self.options.engine_socket.display()
            ),
        })
    }
}
