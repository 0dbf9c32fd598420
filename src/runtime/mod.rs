//! `vramgate-runtime`: a runc-compatible wrapper, in the manner of `nvidia-container-runtime`.
//!
//! Engines that cannot be told to run an OCI hook (Docker, containerd) can be told to use
//! another runtime binary. On `create` (and `run`: `create` then `start`), this wrapper adds
//! the vramgate hooks to the bundle's `config.json` when the spec carries a VRAM request; then,
//! for every verb, it `exec`s the next runtime (from config: the first of an ordered list found
//! on PATH) with the argv it was given. Everything but the `hooks` entries it adds is left byte-for-byte alone: the spec is
//! edited as an order-preserving JSON tree, never through structs that drop unknown fields, and
//! a spec without a request is not even rewritten.
//!
//! Its own errors go to stderr and, when runc's `--log` is given, to that file in runc's log
//! format ([`runc_log`]). Nothing is ever printed on a successful path: containerd's go-runc
//! parses the combined output of verbs such as `state` as JSON.
//!
//! The parts: [`argv`] reads runc's command line, [`spec_edit`] adds the hooks to the bundle,
//! [`runc_log`] writes runc's log format, [`exec`] finds the next runtime and becomes it;
//! [`run`] here strings them together.

pub mod admit;
pub mod argv;
pub mod devices;
pub mod exec;
pub mod queue_guard;
pub mod runc_log;
pub mod spec_edit;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use argv::{parse_args, Invocation};
pub use exec::{exec_runtime, find_next_runtime};
pub use runc_log::Level;
pub use spec_edit::{
    add_hooks, hook_entry, hook_path, hook_timeout_secs, is_vramgate_hook, prepare_bundle, LazyConfig, ADMISSION_STAGE,
    DEFAULT_HOOK_PATH, HOOK_BINARY, HOOK_TIMEOUT_SLACK, RELEASE_STAGE,
};

use crate::config::{ConfigError, RuntimeConfig};
use crate::request::RequestError;
use crate::service::{Refusal, ServiceError};
use crate::spec::SpecError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("the container spec {path} has \"{field}\" of JSON type {found}, not an {expected}; fix the engine that wrote it")]
    SpecShape {
        path: PathBuf,
        field: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("cannot write the container spec {path}: {source}")]
    WriteSpec { path: PathBuf, source: std::io::Error },
    #[error("no runtime to run next: none of {tried:?} ([runtime] runtimes in {config}) is on PATH ({path}); install runc or fix the list")]
    NoRuntime {
        tried: Vec<String>,
        config: String,
        path: String,
    },
    #[error("cannot exec the runtime {path}: {source}")]
    Exec { path: PathBuf, source: nix::Error },
    #[error("an argument contains a NUL byte")]
    NulInArgument,
    #[error("container {container}: {source}")]
    Request { container: String, source: RequestError },
    /// Decided and refused; the refusal's line is the whole story.
    #[error("{0}")]
    Refused(Refusal),
    #[error("{0}")]
    Service(ServiceError),
    #[error("the {verb} command line names no container id; the engine must pass one")]
    NoContainerId { verb: String },
    #[error("cannot read this process's own /proc entry")]
    NoSelf,
    #[error("the container spec {path} has the device rule \"{rule}\", which lets it open every character device and so reach, through mknod, GPUs it holds no reservation on: vramgate cannot hold it to its GPUs; drop --privileged or the rule (name the devices it needs instead), or reserve on every GPU (vramgate.dev/gpus=all)")]
    WideDeviceRule { path: PathBuf, rule: String },
    #[error("the container spec {path}: its device rule linux.resources.devices[{index}] {why}; runc would read it otherwise than vramgate, which must judge what the container can open: write the rule as the OCI spec spells it")]
    MisreadDeviceRule { path: PathBuf, index: usize, why: String },
    #[error("the container spec {path}: {source}")]
    Enforce {
        path: PathBuf,
        source: crate::enforce::EnforceError,
    },
}

impl RuntimeError {
    /// The line for stderr and runc's log: a refusal already starts with "vramgate:".
    pub fn user_line(&self) -> String {
        match self {
            RuntimeError::Refused(refusal) => refusal.to_string(),
            other => format!("vramgate: {other}"),
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Reports an error where the engine looks: stderr and, with `--log`, runc's log file.
pub fn report_error(inv: &Invocation, message: &str) {
    eprintln!("{message}");
    if let Err(e) = runc_log::append(inv, Level::Error, message) {
        let log = inv.log.as_deref().unwrap_or(Path::new(""));
        eprintln!("vramgate: cannot append to the runtime log {}: {e}", log.display());
    }
}

/// Records a problem the wrapper works around, in runc's log only: never on stdout or
/// stderr, which the engine may parse (`state` output is JSON to containerd). A log that
/// cannot be written is not worth failing a container start over, so that is ignored.
pub(crate) fn warn(inv: &Invocation, message: &str) {
    let _ = runc_log::append(inv, Level::Warning, message);
}

/// The whole wrapper: `args` is argv without argv[0], `config_path` the config file in
/// effect (the binary reads `$VRAMGATE_CONFIG`). Returns only when it could not exec.
pub fn run(args: &[OsString], config_path: &Path) -> RuntimeError {
    let inv = parse_args(args);
    let mut config = LazyConfig::new(config_path.to_path_buf());
    // A container with a request needs the config (the hook timeout, its admission) and is
    // refused below with the config's error. Everything else must not be stopped by a broken
    // config: not `delete` or `kill` of running containers, and not `create` of containers
    // without a request (as Docker's default runtime, that would be every container of the
    // host). So: the default runtimes, and a warning in the log.
    let (runtimes, config_error) = match config.get() {
        Ok(config) => (config.runtime.runtimes.clone(), None),
        Err(e) => (RuntimeConfig::default().runtimes, Some(e)),
    };
    // The next runtime is found before anything is reserved: a create must not hold memory
    // for a container that no runtime will run.
    let path_var = std::env::var_os("PATH");
    let myself = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let Some(next) = find_next_runtime(&runtimes, path_var.as_deref(), myself.as_deref()) else {
        let e = RuntimeError::NoRuntime {
            tried: runtimes,
            config: config_path.display().to_string(),
            path: path_var.unwrap_or_default().to_string_lossy().into_owned(),
        };
        report_error(&inv, &format!("vramgate: {e}"));
        return e;
    };
    let mut reserved = false;
    if let Some(bundle) = &inv.bundle {
        match prepare_bundle(bundle, &inv, &mut config) {
            Ok(r) => reserved = r,
            Err(e) => {
                report_error(&inv, &e.user_line());
                return e;
            }
        }
    }
    if let Some(e) = config_error {
        warn(&inv, &format!("vramgate: {e}; using the default runtimes"));
    }
    if inv.verb.as_deref() == Some(argv::DELETE_VERB.as_ref()) {
        if let (Some(container), Ok(config)) = (&inv.container, config.get()) {
            let container = container.to_string_lossy();
            admit::drop_abandoned_wait(&container, config);
            // Now, not at poststop: the runtime's delete removes the cgroup before it runs
            // the poststop hooks, and a limit is cleared on the cgroup's path.
            end_driver_limit(&inv, &container, config);
        }
    }
    let e = exec_runtime(&next, args);
    report_error(&inv, &format!("vramgate: {e}"));
    // What the create reserved is given back: no runtime runs this container.
    if let (true, Some(bundle), Some(container), Ok(config)) = (reserved, &inv.bundle, &inv.container, config.get()) {
        admit::undo(&container.to_string_lossy(), bundle, config);
    }
    e
}

/// At `delete`: clears the driver limit the container's createRuntime hook set and recorded
/// ([`crate::enforce::lifecycle`]), before the runtime removes its cgroup. One failed `openat`
/// and no NVML load for a container without a record. Clearing needs CAP_SYS_ADMIN, which
/// the wrapper holds in its permitted set only (root's, emptied from the effective set at
/// start): raised around each driver call alone. A failure goes to the runtime's log and the
/// event log, keeps the record for the poststop hook, and never stops the delete.
fn end_driver_limit(inv: &Invocation, container: &str, config: &crate::config::Config) {
    let Ok(Some(dir)) = crate::ledger::StateDir::open_existing(&config.state_dir) else {
        return;
    };
    if let Err(e) = crate::enforce::lifecycle::end_driver_limit(
        &dir,
        Path::new(&config.inventory.nvml_library),
        inv.root.as_deref(),
        container,
        None,
        crate::enforce::lifecycle::EndedBy::Delete,
    ) {
        warn(
            inv,
            &format!("vramgate: container {container}: cannot clear its GPU memory limit: {e}"),
        );
    }
}
