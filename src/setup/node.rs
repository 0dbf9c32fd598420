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

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::engine::{restart_by_signal, tasks_running, EngineError, Restarted};
use super::host_root::{io, read_plain, remove_file, replace_file, write_file, EngineView, HostPathError, HostRoot};
use super::*;

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

/// Takes the node's set-up lock in `dir` (this process's view of the ledger's directory),
/// waiting at most `wait` for a run of the same install directory (a rolling update's old pod
/// undoing); one of another install directory is refused at once. The lock file stays: a lock
/// on a file another run unlinked would lock nothing, so after taking it the path is checked
/// to still be that file. It holds the holder's install directory.
fn lock(dir: &Path, install_dir: &Path, wait: Duration) -> NodeResult<File> {
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

    /// Takes out what `state` records, each part by itself (see [`undo_part`]), and any copy of
    /// vramgate's runtime in containerd's files; removes the directories it made; restarts the
    /// engine when `restart` and an engine file changed; then removes the copied binaries
    /// once no container's shim runs the wrapper any more (waiting at most `wait`). Binaries
    /// still in use are kept: removing them would leave those containers impossible to stop
    /// or delete (their shim execs the wrapper for that), their memory reserved for ever. What
    /// is kept or could not be done is recorded in the state file for the next run.
    fn restore(&mut self, state: &NodeState, wait: Duration, restart: bool) -> Undone {
        let mut undone = Undone::default();
        let view = self.options.view();
        let runtime = match &state.runtime {
            Some(runtime) => Some(runtime.clone()),
            None => self.options.runtime().ok(),
        };
        let mut parts = state.parts.clone();
        parts.extend(legacy_parts(state, &self.options, &view));
        let default_before = parts.iter().find_map(|p| match p {
            Part::Keys {
                default_before: Some(before),
                ..
            } => Some(before.clone()),
            _ => None,
        });
        let keys_files: Vec<PathBuf> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Keys { config, .. } => Some(config.clone()),
                _ => None,
            })
            .collect();
        let own_files: Vec<PathBuf> = parts
            .iter()
            .filter_map(|p| match p {
                Part::File { path, .. } => Some(path.clone()),
                _ => None,
            })
            .collect();
        let mut engine_changed = false;
        let mut failed = Vec::new();
        match (runtime, load_chain(&self.options, &view)) {
            (Some(runtime), Ok(chain)) => {
                for file in &chain.files {
                    if own_files.contains(&self.host.host_path(&file.local)) {
                        continue;
                    }
                    let ours = keys_files.contains(&self.host.host_path(&file.local));
                    let before = default_before.as_ref().and_then(|d| d.as_deref());
                    match take_runtime_out(file, &runtime, before, ours) {
                        Ok(Some(line)) => {
                            engine_changed |= line.starts_with("took");
                            undone.report.push(line);
                        }
                        Ok(None) => {}
                        Err(e) => undone.left.push(e.to_string()),
                    }
                }
            }
            (_, Err(e)) => undone.left.push(format!(
                "did not look for vramgate's runtime in containerd's config: {e}"
            )),
            (None, _) => {}
        }
        let host_config = self.options.install_config.as_ref().map(|(_, target)| target.clone());
        for part in parts.iter().rev() {
            match undo_part(&self.host, part) {
                Ok(Some(line)) => {
                    let engine_file = !matches!(part, Part::File { path, .. } if Some(path) == host_config.as_ref());
                    engine_changed |= engine_file && !line.starts_with("left");
                    undone.report.push(line);
                }
                Ok(None) => {}
                Err(e) => {
                    undone.left.push(e.to_string());
                    failed.push(part.clone());
                }
            }
        }
        for dir in &state.dirs {
            let removed = self.host.resolve(dir).map(std::fs::remove_dir);
            match removed {
                Ok(Ok(())) => undone.report.push(format!("removed {}", dir.display())),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Something else was put there since: not ours to remove.
                Ok(Err(e)) => undone.report.push(format!("left {} ({e})", dir.display())),
                Err(e) => undone.left.push(e.to_string()),
            }
        }
        if restart && engine_changed && self.options.restart == RestartMode::Signal {
            match self.restart() {
                Ok(line) => undone.report.push(line),
                Err(e) => undone.left.push(format!("containerd was not restarted: {e}")),
            }
        }
        let users = self.wait_unused(wait).unwrap_or_else(|e| {
            undone.left.push(e.to_string());
            vec!["(unknown: the task directory could not be read)".into()]
        });
        if users.is_empty() {
            for binary in &state.binaries {
                match self.host.resolve(binary).map_err(NodeError::from).and_then(|p| {
                    remove_file(&p)?;
                    Ok(())
                }) {
                    Ok(()) => undone.report.push(format!("removed {}", binary.display())),
                    Err(e) => {
                        undone.left.push(e.to_string());
                        undone.kept.push(binary.clone());
                    }
                }
            }
        } else {
            undone.report.push(format!(
                "kept {}: {} container(s) still run through its vramgate-runtime ({})",
                self.options.install_dir.display(),
                users.len(),
                users.join(", ")
            ));
            undone.kept = state.binaries.clone();
        }
        let left = NodeState {
            parts: failed,
            files: Vec::new(),
            binaries: undone.kept.clone(),
            dirs: Vec::new(),
            created_dir: self.state.created_dir || state.created_dir,
            restarted: false,
            restart: state.restart,
            engine_socket: state.engine_socket.clone(),
            runtime: state.runtime.clone(),
        };
        let saved = self
            .host
            .resolve(&self.options.state_path())
            .map_err(NodeError::from)
            .and_then(|path| {
                if left.parts.is_empty() && left.binaries.is_empty() {
                    remove_file(&path)?;
                } else {
                    let bytes = serde_json::to_vec(&left).expect("the state serializes");
                    replace_file(&path, &bytes, 0o600)?;
                }
                Ok(())
            });
        if let Err(e) = saved {
            undone.left.push(e.to_string());
        }
        undone
    }

    /// The containers whose shim runs the copied wrapper, once there are none or `wait` has
    /// passed (polled every 200 ms).
    fn wait_unused(&self, wait: Duration) -> NodeResult<Vec<String>> {
        let tasks = self.host.resolve(&self.options.engine_tasks)?;
        let runtime = self.options.runtime()?;
        let started = Instant::now();
        loop {
            let users = tasks_running(&tasks, &runtime)?;
            if users.is_empty() || started.elapsed() >= wait {
                return Ok(users);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Undoes the set-up: each part taken out, the engine restarted once more when that
    /// changed its files, and the binaries and (when it made it) the install directory
    /// removed once no container runs through them (see [`NodeSetup::restore`]). A directory
    /// that was there before is left as it was found.
    pub fn undo(mut self) -> Undone {
        let state = self.state.clone();
        let mut undone = self.restore(&state, self.options.wait, true);
        if !undone.kept.is_empty() {
            undone.report.push(format!(
                "stop those containers, then run the node set-up again (it removes what it kept) or remove {} yourself",
                self.options.install_dir.display()
            ));
        }
        if state.created_dir && undone.kept.is_empty() && undone.left.is_empty() {
            match self.host.resolve(&self.options.install_dir).map(std::fs::remove_dir) {
                Ok(Ok(())) => undone
                    .report
                    .push(format!("removed {}", self.options.install_dir.display())),
                // Something else was put there since: it is not ours to remove.
                Ok(Err(e)) => undone
                    .report
                    .push(format!("left {} ({e})", self.options.install_dir.display())),
                Err(e) => undone.left.push(e.to_string()),
            }
        }
        undone
    }
}

/// The parts a state file of a release before [`Part`] stands for: its entry in the main
/// config's imports (whatever else is there now stays), and its own files as they were.
fn legacy_parts(state: &NodeState, options: &NodeOptions, view: &EngineView) -> Vec<Part> {
    let entry = view
        .engine(&options.drop_in())
        .map(|p| p.to_string_lossy().into_owned());
    state
        .files
        .iter()
        .map(|saved| match (&entry, saved.path == options.engine_config) {
            (Ok(entry), true) => Part::Import {
                config: saved.path.clone(),
                entry: entry.clone(),
                created: None,
            },
            _ => Part::File {
                path: saved.path.clone(),
                before: saved.before.clone(),
                written: None,
            },
        })
        .collect()
}

/// Takes vramgate's runtime (the one running `runtime`) out of one file of containerd's
/// config, in place; a line when it did, or when it left another's.
fn take_runtime_out(
    file: &ChainFile,
    runtime: &Path,
    default_before: Option<&str>,
    ours: bool,
) -> NodeResult<Option<String>> {
    let mut text = file.text.clone();
    let mut line = None;
    for plugin in [CRI_PLUGIN, CRI_RUNTIME_PLUGIN_V3] {
        match without_runtime(&text, &file.local, plugin, &[runtime], default_before, ours)? {
            RuntimeOut::Removed(new) => {
                text = new;
                line = Some(format!(
                    "took the runtime {RUNTIME_NAME} out of {}",
                    file.engine.display()
                ));
            }
            RuntimeOut::Foreign(binary) => {
                line = Some(format!(
                    "left the runtime {RUNTIME_NAME} in {}: its BinaryName is {binary:?}, not vramgate's {}",
                    file.engine.display(),
                    runtime.display()
                ))
            }
            RuntimeOut::Absent => {}
        }
    }
    if text != file.text {
        write_file(&file.local, text.as_bytes(), 0o644)?;
    }
    Ok(line)
}

/// Takes one part out (host paths resolved inside `host`); a line saying what it did or why it
/// left the part, `None` when there was nothing to do.
fn undo_part(host: &HostRoot, part: &Part) -> NodeResult<Option<String>> {
    match part {
        Part::Import { config, entry, created } => {
            let local = host.resolve(config)?;
            let Some(bytes) = read_plain(&local)? else {
                return Ok(None);
            };
            if created.as_ref() == Some(&bytes) {
                remove_file(&local)?;
                return Ok(Some(format!("removed {}", config.display())));
            }
            let text = String::from_utf8(bytes).map_err(|_| SetupError::Parse {
                path: config.clone(),
                format: "UTF-8 TOML",
                message: "it is not UTF-8".into(),
            })?;
            if !imports_of(&text, config)?.iter().any(|i| i == entry) {
                return Ok(Some(format!("left {}: it no longer imports {entry}", config.display())));
            }
            write_file(&local, without_import(&text, entry).as_bytes(), 0o644)?;
            Ok(Some(format!("took {entry} out of {}'s imports", config.display())))
        }
        Part::Keys { config, runc, .. } => {
            // The runtime itself and the default's name went with every other copy.
            let local = host.resolve(config)?;
            let Some(bytes) = read_plain(&local)?.filter(|_| *runc) else {
                return Ok(None);
            };
            match without_added_runc(&String::from_utf8_lossy(&bytes), config)? {
                Some(text) => {
                    write_file(&local, text.as_bytes(), 0o644)?;
                    Ok(Some(format!(
                        "took the runtime {CONTAINERD_DEFAULT_RUNTIME} vramgate added out of {}",
                        config.display()
                    )))
                }
                None => Ok(None),
            }
        }
        Part::File { path, before, written } => {
            let local = host.resolve(path)?;
            let current = read_plain(&local)?;
            if current.is_none() && before.is_none() {
                return Ok(None);
            }
            if written.is_some() && current != *written {
                return Ok(Some(format!(
                    "left {}: it changed since vramgate wrote it (another tool or the admin); look at it and remove it yourself if it is no longer wanted",
                    path.display()
                )));
            }
            match before {
                Some(bytes) => {
                    let mode = std::fs::symlink_metadata(&local).map_or(0o644, |m| m.mode());
                    replace_file(&local, bytes, mode)?;
                    Ok(Some(format!("restored {}", path.display())))
                }
                None => {
                    remove_file(&local)?;
                    Ok(Some(format!("removed {}", path.display())))
                }
            }
        }
    }
}
