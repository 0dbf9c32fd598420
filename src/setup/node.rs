//! `vramgate setup-node`: set up the node it runs on from a privileged container that has the
//! host's root mounted (the Helm chart's optional node set-up DaemonSet), the way NVIDIA's GPU
//! operator installs its container toolkit: copy `vramgate-hook` and `vramgate-runtime` into
//! a host directory of vramgate's own, run the same containerd plan as `vramgate setup
//! containerd` against the host's config, restart the engine once, and, when stopped, undo
//! exactly that and restart it again.
//!
//! What it did is recorded before it does it, in a state file inside its install directory:
//! each file it changes with its bytes before (or that it did not exist) and each binary it
//! copies. The undo writes those bytes back (the engine config comes back byte-for-byte),
//! removes what did not exist, and removes the directory it created. A run that finds a state
//! file (its predecessor crashed, or was killed before undoing) undoes it first, so the next
//! start always begins from the host as it was.
//!
//! The host root is a mount of a file system vramgate does not own: every path written is
//! resolved inside it first and refused when a symlink leads out of it, so a link planted at
//! `/host/etc/containerd` cannot turn root's write into one on the container's own files or
//! anywhere else (the last component is then opened with `O_NOFOLLOW` by the atomic writer).
//! One lock file in the install directory keeps two runs (a rolling update's old and new pod)
//! from interleaving.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::*;

/// Where the binaries go on the host: `/usr/local` is the admin's, not the distribution's
/// package manager's, and a directory of vramgate's own is one it can remove whole.
pub const NODE_INSTALL_DIR: &str = "/usr/local/lib/vramgate";
pub const NODE_STATE_FILE: &str = "node-setup.json";
pub const NODE_LOCK_FILE: &str = "node-setup.lock";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
pub const CONTAINERD_TASKS: &str = "/run/containerd/io.containerd.runtime.v2.task";
/// The binaries the engine runs, copied from beside this one.
pub const NODE_BINARIES: [&str; 2] = [RUNTIME_BINARY, crate::runtime::HOOK_BINARY];

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("{path} must be an absolute path without `..` (a path on the host)")]
    NotHostPath { path: PathBuf },
    #[error("{path} leads out of the host root {root} (it resolves to {resolved}); a symlink there must point inside the host's own tree")]
    Escapes {
        path: PathBuf,
        root: PathBuf,
        resolved: PathBuf,
    },
    #[error("cannot use {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("another `vramgate setup-node` holds {path} (waited {waited:?}); stop it first")]
    Busy { path: PathBuf, waited: Duration },
    #[error("{path} exists and was not put there by `vramgate setup-node`; remove it or choose another --install-dir")]
    NotOurs { path: PathBuf },
    #[error("{path} is not a state file `vramgate setup-node` wrote ({message}); look at it, restore the files it names by hand, remove it, and start again")]
    State { path: PathBuf, message: String },
    #[error("{path} is a symbolic link on the host; setup-node writes only a file of its own there: replace the link with the file it points to")]
    Link { path: PathBuf },
    #[error("cannot find the engine's process through {path}: {message}")]
    Engine { path: PathBuf, message: String },
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
    /// containers still running.
    pub state_dir: PathBuf,
    pub restart: RestartMode,
    /// The binaries to copy (vramgate-runtime and vramgate-hook), from this container.
    pub binaries: Vec<PathBuf>,
    pub set_as_default: bool,
    /// A config.toml to install on the host (the chart's, from its ConfigMap in this
    /// container) and the host path the host's hook and runtime read it from: recorded and
    /// given back byte-for-byte on undo like the engine's config.
    pub install_config: Option<(PathBuf, PathBuf)>,
    pub hook_timeout_secs: u64,
    /// How long to wait for another run's lock, and for the engine to come back.
    pub wait: Duration,
}

/// One file the set-up changed, as a host path, with its bytes before (`None`: absent).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Saved {
    pub path: PathBuf,
    pub before: Option<Vec<u8>>,
}

/// What a set-up did, written before it does it: what its undo restores.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeState {
    pub files: Vec<Saved>,
    /// Binaries copied into the install directory (host paths).
    pub binaries: Vec<PathBuf>,
    /// Directories the engine's set-up created (containerd's `conf.d`), deepest first.
    pub dirs: Vec<PathBuf>,
    /// Whether the install directory was created by the set-up (then the undo removes it).
    pub created_dir: bool,
    /// Whether the engine was restarted (then the undo restarts it again).
    pub restarted: bool,
    pub restart: RestartMode,
    pub engine_socket: PathBuf,
}

/// A held set-up: the lock and where things are. Dropping it releases the lock.
#[derive(Debug)]
pub struct NodeSetup {
    options: NodeOptions,
    _lock: File,
    /// Binaries a previous run kept (containers still ran through them): this run's copies
    /// replace them rather than being refused as someone else's.
    kept: Vec<PathBuf>,
    pub state: NodeState,
    /// One line per thing done, for the log.
    pub report: Vec<String>,
}

/// `path` (a host path) as seen under `root`: refused unless absolute and free of `..`.
fn under(root: &Path, path: &Path) -> NodeResult<PathBuf> {
    let mut out = root.to_path_buf();
    if !path.is_absolute() {
        return Err(NodeError::NotHostPath { path: path.into() });
    }
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => return Err(NodeError::NotHostPath { path: path.into() }),
        }
    }
    Ok(out)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |source| NodeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl NodeOptions {
    /// Where the host path `path` is in this process's view, after checking that what exists
    /// of it (symlinks resolved) stays inside the host root. The last component is not
    /// resolved: the writers open it with `O_NOFOLLOW`, and the removers unlink the link itself.
    pub fn host(&self, path: &Path) -> NodeResult<PathBuf> {
        let inside = under(&self.host_root, path)?;
        let root = std::fs::canonicalize(&self.host_root).map_err(io(&self.host_root))?;
        let mut existing = inside.parent().map(Path::to_path_buf);
        while let Some(dir) = existing {
            match std::fs::canonicalize(&dir) {
                Ok(resolved) if resolved.starts_with(&root) => return Ok(inside),
                Ok(resolved) => {
                    return Err(NodeError::Escapes {
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

    /// The host path `path` as the engine names it.
    fn engine(&self, path: &Path) -> NodeResult<PathBuf> {
        under(&self.engine_root, path)
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
}

fn read_optional_host(path: &Path) -> NodeResult<Option<Vec<u8>>> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(NodeError::NotOurs { path: path.into() }),
        Ok(_) => std::fs::read(path).map(Some).map_err(io(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Takes the install directory's lock, waiting at most `wait`. The lock file stays (it is
/// removed with the directory by the undo): a lock on a file another run unlinked would lock
/// nothing, so after taking it the path is checked to still be that file.
fn lock(dir: &Path, wait: Duration) -> NodeResult<File> {
    let path = dir.join(NODE_LOCK_FILE);
    let started = Instant::now();
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {
                let held = file.metadata().map_err(io(&path))?;
                match std::fs::symlink_metadata(&path) {
                    Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(file),
                    _ => continue,
                }
            }
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(NodeError::Busy {
                    path,
                    waited: started.elapsed(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
    }
}

fn write_host(path: &Path, bytes: &[u8], mode: u32) -> NodeResult<()> {
    let dir = path
        .parent()
        .ok_or_else(|| NodeError::NotHostPath { path: path.into() })?;
    let name = path
        .file_name()
        .ok_or_else(|| NodeError::NotHostPath { path: path.into() })?;
    let dir_fd = atomic_file::open_dir(dir).map_err(io(dir))?;
    let mut temp = name.to_os_string();
    temp.push(".vramgate-tmp");
    atomic_file::replace_at(&dir_fd, name, &temp, bytes, mode, None).map_err(io(path))
}

fn remove_host(path: &Path) -> NodeResult<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(path)(e)),
    }
}

/// The pid of the process serving the Unix socket at `socket` (this process's view).
pub fn engine_pid(socket: &Path) -> NodeResult<i32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let err = |message: String| NodeError::Engine {
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

impl NodeSetup {
    /// Takes the lock, undoes what a previous run left, and sets the node up.
    pub fn install(options: NodeOptions) -> NodeResult<NodeSetup> {
        // Every path checked before anything is created, so a refused one leaves no trace.
        for path in [&options.engine_config, &options.drop_in(), &options.engine_socket] {
            options.host(path)?;
        }
        if let Some((source, target)) = &options.install_config {
            std::fs::metadata(source).map_err(io(source))?;
            let host = options.host(target)?;
            if std::fs::symlink_metadata(&host).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(NodeError::Link { path: target.clone() });
            }
        }
        let dir = options.host(&options.install_dir)?;
        let created_dir = match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => false,
            Ok(_) => return Err(NodeError::NotOurs { path: dir }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&dir).map_err(io(&dir))?;
                true
            }
            Err(e) => return Err(io(&dir)(e)),
        };
        // Checked again once it exists: a link swapped in since would show here.
        options.host(&options.install_dir.join(NODE_LOCK_FILE))?;
        let lock = lock(&dir, options.wait)?;
        let mut setup = NodeSetup {
            state: NodeState {
                files: Vec::new(),
                binaries: Vec::new(),
                dirs: Vec::new(),
                created_dir,
                restarted: false,
                restart: options.restart,
                engine_socket: options.engine_socket.clone(),
            },
            options,
            _lock: lock,
            kept: Vec::new(),
            report: Vec::new(),
        };
        let state_path = setup.options.host(&setup.options.state_path())?;
        if let Some(bytes) = read_optional_host(&state_path)? {
            let previous: NodeState = serde_json::from_slice(&bytes).map_err(|e| NodeError::State {
                path: state_path.clone(),
                message: e.to_string(),
            })?;
            setup.report.push(format!(
                "{} was left by an earlier run (killed before its undo, or keeping binaries still in use): undoing it first",
                state_path.display()
            ));
            // The directory stays (this run holds its lock); whether it was created before
            // carries over.
            setup.state.created_dir = previous.created_dir || created_dir;
            // Binaries still in use stay: this run's copies replace them in place.
            setup.kept = setup.restore(&previous, Duration::ZERO)?;
        }
        setup.apply()?;
        Ok(setup)
    }

    fn apply(&mut self) -> NodeResult<()> {
        let o = self.options.clone();
        let engine_bin = |name: &str| o.engine(&o.install_dir.join(name));
        let setup_options = SetupOptions {
            engine: Engine::Containerd,
            remove: false,
            set_as_default: o.set_as_default,
            config_path: Some(o.host(&o.drop_in())?),
            containerd_config: Some(o.host(&o.engine_config)?),
            containerd_import: Some(o.engine(&o.drop_in())?),
            crio_drop_in: None,
            runtime_path: engine_bin(RUNTIME_BINARY)?,
            hook_path: engine_bin(crate::runtime::HOOK_BINARY)?,
            hook_timeout_secs: o.hook_timeout_secs,
        };
        let plan = plan(&setup_options)?;
        // Every file the plan writes, and the backup it keeps, as host paths with their bytes.
        let host_of =
            |fs_path: &Path| -> PathBuf { Path::new("/").join(fs_path.strip_prefix(&o.host_root).unwrap_or(fs_path)) };
        let mut files = Vec::new();
        for change in &plan.changes {
            for path in std::iter::once(&change.path).chain(change.backup.as_ref()) {
                let host = host_of(path);
                o.host(&host)?;
                files.push(Saved {
                    before: read_optional_host(path)?,
                    path: host,
                });
            }
        }
        // The host's config.toml, when the chart gives one: read here, written after the
        // binaries, restored with the engine's files.
        let mut config_file = None;
        if let Some((source, target)) = &o.install_config {
            let bytes = std::fs::read(source).map_err(io(source))?;
            let host = o.host(target)?;
            files.push(Saved {
                before: read_optional_host(&host)?,
                path: target.clone(),
            });
            config_file = Some((host, bytes));
        }
        let mut dirs = Vec::new();
        let written = plan
            .changes
            .iter()
            .filter(|c| matches!(c.action, Action::Write(_)))
            .map(|c| c.path.clone())
            .chain(config_file.as_ref().map(|(host, _)| host.clone()));
        for path in written {
            let mut dir = path.parent();
            while let Some(d) = dir.filter(|d| !d.exists() && d.starts_with(&o.host_root)) {
                let host = host_of(d);
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
                .ok_or_else(|| NodeError::NotHostPath { path: source.clone() })?;
            let target = o.install_dir.join(name);
            if read_optional_host(&o.host(&target)?)?.is_some() && !self.kept.contains(&target) {
                return Err(NodeError::NotOurs { path: target });
            }
            sources.push((target, std::fs::read(source).map_err(io(source))?));
        }
        self.state.files = files;
        self.state.dirs = dirs;
        self.state.binaries = sources.iter().map(|(t, _)| t.clone()).collect();
        self.state.restarted = !plan.changes.is_empty() && o.restart != RestartMode::None;
        // Recorded before anything changes: a crash from here on leaves what the next run undoes.
        self.save()?;
        for (target, bytes) in &sources {
            write_host(&o.host(target)?, bytes, 0o755)?;
            self.report.push(format!("installed {}", target.display()));
        }
        if let Some((host, bytes)) = &config_file {
            for dir in self.state.dirs.iter().rev() {
                let made = o.host(dir)?;
                if host.starts_with(&made) && std::fs::symlink_metadata(&made).is_err() {
                    std::fs::create_dir(&made).map_err(io(&made))?;
                }
            }
            write_host(host, bytes, 0o644)?;
            if let Some((_, target)) = &o.install_config {
                self.report
                    .push(format!("installed {} (the chart's config)", target.display()));
            }
        }
        let state_dir = o.host(&o.state_dir)?;
        if std::fs::symlink_metadata(&state_dir).is_err() {
            crate::ledger::StateDir::open_or_create(&state_dir)?;
            self.report.push(format!(
                "made {} (the ledger's directory; kept on undo)",
                o.state_dir.display()
            ));
        }
        super::apply(&plan)?;
        self.report.extend(
            describe(&plan, false)
                .lines()
                .filter(|l| !l.starts_with("next:"))
                .map(str::to_string),
        );
        if self.state.restarted {
            self.restart()?;
        } else if !plan.changes.is_empty() {
            self.report
                .push("restart mode none: restart the engine to load vramgate's runtime".into());
        }
        Ok(())
    }

    fn save(&self) -> NodeResult<()> {
        let path = self.options.host(&self.options.state_path())?;
        let bytes = serde_json::to_vec(&self.state).expect("the state serializes");
        write_host(&path, &bytes, 0o600)
    }

    /// Puts back what `state` records: each file's bytes before, the directories it made
    /// removed, the engine restarted when the set-up restarted it, then the copied binaries
    /// removed once no container's shim runs the wrapper any more (waiting at most `wait`).
    /// Binaries still in use are kept, and returned: removing them would leave those containers
    /// impossible to stop or delete (their shim execs the wrapper for that), their memory
    /// reserved for ever. The state file then records only them, for the next run.
    fn restore(&mut self, state: &NodeState, wait: Duration) -> NodeResult<Vec<PathBuf>> {
        for saved in state.files.iter().rev() {
            let path = self.options.host(&saved.path)?;
            match &saved.before {
                Some(bytes) => {
                    let mode = std::fs::symlink_metadata(&path).map(|m| m.mode()).unwrap_or(0o644);
                    write_host(&path, bytes, mode)?;
                    self.report.push(format!("restored {}", saved.path.display()));
                }
                None => {
                    remove_host(&path)?;
                    self.report.push(format!("removed {}", saved.path.display()));
                }
            }
        }
        for dir in &state.dirs {
            match std::fs::remove_dir(self.options.host(dir)?) {
                Ok(()) => self.report.push(format!("removed {}", dir.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Something else was put there since: not ours to remove.
                Err(e) => self.report.push(format!("left {} ({e})", dir.display())),
            }
        }
        if state.restarted {
            self.restart()?;
        }
        let users = self.wait_unused(wait)?;
        let kept = if users.is_empty() {
            for binary in &state.binaries {
                remove_host(&self.options.host(binary)?)?;
                self.report.push(format!("removed {}", binary.display()));
            }
            Vec::new()
        } else {
            self.report.push(format!(
                "kept {}: {} container(s) still run through its vramgate-runtime ({})",
                self.options.install_dir.display(),
                users.len(),
                users.join(", ")
            ));
            state.binaries.clone()
        };
        let state_path = self.options.host(&self.options.state_path())?;
        if kept.is_empty() {
            remove_host(&state_path)?;
        } else {
            let left = NodeState {
                files: Vec::new(),
                binaries: kept.clone(),
                dirs: Vec::new(),
                created_dir: self.state.created_dir || state.created_dir,
                restarted: false,
                restart: state.restart,
                engine_socket: state.engine_socket.clone(),
            };
            let bytes = serde_json::to_vec(&left).expect("the state serializes");
            write_host(&state_path, &bytes, 0o600)?;
        }
        Ok(kept)
    }

    /// The containers whose shim runs the copied wrapper, once there are none or `wait` has
    /// passed (polled every 200 ms).
    fn wait_unused(&self, wait: Duration) -> NodeResult<Vec<String>> {
        let tasks = self.options.host(&self.options.engine_tasks)?;
        let runtime = self.options.engine(&self.options.install_dir.join(RUNTIME_BINARY))?;
        let started = Instant::now();
        loop {
            let users = tasks_running(&tasks, &runtime)?;
            if users.is_empty() || started.elapsed() >= wait {
                return Ok(users);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Restarts the engine as the options say, and waits (bounded) until it serves its
    /// socket again from a new process.
    fn restart(&mut self) -> NodeResult<()> {
        if self.options.restart == RestartMode::None {
            return Ok(());
        }
        let socket = self.options.host(&self.options.engine_socket)?;
        let pid = engine_pid(&socket)?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP).map_err(|e| {
            NodeError::Engine {
                path: socket.clone(),
                message: format!("cannot signal pid {pid}: {e}"),
            }
        })?;
        let started = Instant::now();
        loop {
            match engine_pid(&socket) {
                Ok(new) if new != pid => {
                    self.report.push(format!(
                        "restarted the engine: SIGHUP to pid {pid}, back as pid {new} after {:?}",
                        started.elapsed()
                    ));
                    return Ok(());
                }
                _ if started.elapsed() >= self.options.wait => {
                    // Not an error that undoes: the config is in place for when it comes back.
                    self.report.push(format!(
                        "sent SIGHUP to the engine (pid {pid}); it did not serve {} again within {:?}: check its service manager restarts it",
                        self.options.engine_socket.display(),
                        self.options.wait
                    ));
                    return Ok(());
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Undoes the set-up: files back byte-for-byte, the engine restarted once more when the
    /// set-up restarted it, and the binaries and (when it made it) the install directory
    /// removed once no container runs through them (see [`NodeSetup::restore`]).
    pub fn undo(mut self) -> NodeResult<Vec<String>> {
        self.report.clear();
        let state = self.state.clone();
        let kept = self.restore(&state, self.options.wait)?;
        if !kept.is_empty() {
            self.report.push(format!(
                "stop those containers, then run the node set-up again (it removes what it kept) or remove {} yourself",
                self.options.install_dir.display()
            ));
        }
        if state.created_dir && kept.is_empty() {
            let dir = self.options.host(&self.options.install_dir)?;
            remove_host(&dir.join(NODE_LOCK_FILE))?;
            match std::fs::remove_dir(&dir) {
                Ok(()) => self
                    .report
                    .push(format!("removed {}", self.options.install_dir.display())),
                // Something else was put there since: it is not ours to remove.
                Err(e) => self
                    .report
                    .push(format!("left {} ({e})", self.options.install_dir.display())),
            }
        }
        Ok(self.report)
    }
}

/// The ids of containerd's tasks whose runc shim runs `runtime` (a path as the engine sees
/// it), from its task directory (`tasks`, this process's view): containerd's runc shim keeps
/// its options in each task's bundle (`<namespace>/<id>/options.json`), whose `binary_name` is
/// the runtime it execs to stop and delete the container. A task being removed meanwhile, or
/// an options file that is not such JSON, is skipped; each is read at most 64 KiB.
pub fn tasks_running(tasks: &Path, runtime: &Path) -> NodeResult<Vec<String>> {
    let mut ids = Vec::new();
    let namespaces = match std::fs::read_dir(tasks) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(io(tasks)(e)),
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
