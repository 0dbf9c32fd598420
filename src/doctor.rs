//! `vramgate doctor`: is this host set up so that the hook can do its job?
//!
//! Every check only reads (files, the driver through NVML, the ledger); nothing is created or
//! changed, so it is safe to run on a production host at any time. Each problem comes with
//! the one thing to do about it. The paths are parameters so the tests can point them at a
//! scratch directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::{Backend, Config, LimitMechanism};
use crate::enforce::driver_limit::{self, Availability, DRIVER_NEEDED, SET_LIMITS_SYMBOL};
use crate::enforce::{guardrails, mps, toolkit};
use crate::inventory::{self, Inventory, NvmlInventory};
use crate::ledger::StateDir;
use crate::quantity::{format_bytes, format_duration};

mod engines;
use engines::*;

/// Where doctor looks. `Paths::host(config)` is the real host; tests use `Paths::under(root, config)`.
#[derive(Debug, Clone)]
pub struct Paths {
    pub config: PathBuf,
    /// Prefix for the engines' config files (`/` on the host).
    pub root: PathBuf,
    /// Where the hook binary is expected when no engine config names it.
    pub hook_candidates: Vec<PathBuf>,
}

pub const HOOK_BINARY: &str = "vramgate-hook";

impl Paths {
    pub fn host(config: PathBuf) -> Paths {
        Paths::under(Path::new("/"), config)
    }

    pub fn under(root: &Path, config: PathBuf) -> Paths {
        let mut hook_candidates = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            hook_candidates.push(dir.join(HOOK_BINARY));
        }
        for dir in ["/usr/bin", "/usr/local/bin", "/usr/libexec/vramgate"] {
            hook_candidates.push(root.join(dir.trim_start_matches('/')).join(HOOK_BINARY));
        }
        Paths {
            config,
            root: root.to_path_buf(),
            hook_candidates,
        }
    }

    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    /// Worth knowing, not wrong (an engine that is not set up, on a host that does not use it).
    Info,
    Problem,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub area: &'static str,
    pub level: Level,
    pub message: String,
    /// What to do, for problems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn problems(&self) -> usize {
        self.checks.iter().filter(|c| c.level == Level::Problem).count()
    }
}

fn ok(area: &'static str, message: impl Into<String>) -> Check {
    Check {
        area,
        level: Level::Ok,
        message: message.into(),
        fix: None,
    }
}

fn info(area: &'static str, message: impl Into<String>) -> Check {
    Check {
        area,
        level: Level::Info,
        message: message.into(),
        fix: None,
    }
}

fn problem(area: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        area,
        level: Level::Problem,
        message: message.into(),
        fix: Some(fix.into()),
    }
}

pub fn run(paths: &Paths) -> Report {
    let mut checks = Vec::new();
    let config = match Config::load_from(&paths.config) {
        Ok(config) => {
            checks.push(ok(
                "config",
                if paths.config.exists() {
                    format!("{} parses", paths.config.display())
                } else {
                    format!("{} does not exist: using the defaults", paths.config.display())
                },
            ));
            Some(config)
        }
        Err(e) => {
            checks.push(problem(
                "config",
                e.to_string(),
                format!(
                    "edit {} (the manual's reference, /usr/share/doc/vramgate/book/reference.html, lists every key)",
                    paths.config.display()
                ),
            ));
            None
        }
    };
    if let Some(config) = &config {
        check_inventory(config, paths, &mut checks);
        check_state(config, &mut checks);
        check_enforcement(config, paths, &mut checks);
        check_watch(config, &mut checks);
    }
    let engine_hooks = check_engines(paths, &mut checks);
    check_hook_binary(paths, &engine_hooks, &mut checks);
    Report { checks }
}

fn check_inventory(config: &Config, paths: &Paths, checks: &mut Vec<Check>) {
    // The driver's own word that this host has a GPU, whatever NVML says (the same test
    // `backend = "auto"` makes before it would simulate one).
    let gpu_evidence = inventory::nvidia_gpu_evidence(&paths.at("/"));
    let device_nodes = gpu_evidence.is_some();
    // NVML is opened directly (not through `inventory::open`) so that doctor can say which
    // library it loaded and which driver answered.
    let nvml = match config.inventory.backend {
        Backend::Static => None,
        Backend::Auto if !config.inventory.gpus.is_empty() => None,
        Backend::Nvml | Backend::Auto => Some(NvmlInventory::open(&config.inventory.nvml_library)),
    };
    match nvml {
        None => {
            let inventory = inventory::StaticInventory::from_config(config);
            let message = format!("backend static: {}", inventory.describe());
            if device_nodes {
                checks.push(problem(
                    "inventory",
                    format!(
                        "{message}, but this host has an NVIDIA GPU ({} exists): admission uses configured numbers, not the driver's",
                        gpu_evidence.as_deref().unwrap_or(Path::new("/dev/nvidiactl")).display()
                    ),
                    format!("set inventory.backend = \"nvml\" in {}", paths.config.display()),
                ));
            } else {
                checks.push(ok("inventory", message));
            }
        }
        Some(Err(e @ inventory::InventoryError::NvmlLoad { .. }))
            if config.inventory.backend == Backend::Auto && !device_nodes =>
        {
            checks.push(ok(
                "inventory",
                format!(
                    "backend auto: no NVIDIA driver here ({e}), so the static list is used: {}",
                    inventory::StaticInventory::from_config(config).describe()
                ),
            ));
        }
        Some(Err(inventory::InventoryError::NvmlLoad { library, tried }))
            if config.inventory.backend == Backend::Auto && device_nodes =>
        {
            let e = inventory::InventoryError::NvmlMissingOnGpuHost {
                library,
                tried,
                evidence: gpu_evidence.clone().unwrap_or_default(),
            };
            checks.push(problem(
                "inventory",
                e.to_string(),
                "fix the driver as the message says, then run `vramgate doctor` again",
            ))
        }
        Some(Err(e)) => checks.push(problem(
            "inventory",
            e.to_string(),
            "fix the driver as the message says, then run `vramgate doctor` again",
        )),
        Some(Ok(nvml)) => {
            let (driver, version) = nvml.versions();
            let head = format!(
                "NVML {} from {}, driver {}",
                version.as_deref().unwrap_or("?"),
                nvml.library(),
                driver.as_deref().unwrap_or("?")
            );
            match nvml.snapshot() {
                Ok(snapshot) => {
                    let gpus: Vec<String> = snapshot
                        .gpus
                        .iter()
                        .map(|g| {
                            let name = match g.mig_index {
                                Some(m) => format!("MIG {}:{m}", g.index),
                                None => format!("GPU {}", g.index),
                            };
                            format!(
                                "{name} {} ({} total, {} free)",
                                g.uuid,
                                format_bytes(g.total),
                                format_bytes(g.free)
                            )
                        })
                        .collect();
                    if gpus.is_empty() {
                        checks.push(problem(
                            "inventory",
                            format!("{head}: no GPU (or, in MIG mode, no MIG device created)"),
                            "check `nvidia-smi -L`; in MIG mode create instances with `nvidia-smi mig -cgi ... -C`",
                        ));
                    } else {
                        checks.push(ok(
                            "inventory",
                            format!(
                                "{head}: {}; {} GPU process(es) visible",
                                gpus.join(", "),
                                snapshot.processes.len()
                            ),
                        ));
                    }
                }
                Err(e) => checks.push(problem(
                    "inventory",
                    format!("{head}, but a snapshot failed: {e}"),
                    "check that `nvidia-smi` works on this host",
                )),
            }
        }
    }
}

fn check_state(config: &Config, checks: &mut Vec<Check>) {
    let path = &config.state_dir;
    match StateDir::open_existing(path) {
        Ok(None) => checks.push(ok(
            "state",
            format!(
                "{} does not exist yet; the first hook run creates it (root, 0700)",
                path.display()
            ),
        )),
        Ok(Some(dir)) => match dir.read() {
            Ok(ledger) => checks.push(ok(
                "state",
                format!(
                    "{} is safe; ledger readable: {} reservation(s), {} waiting",
                    path.display(),
                    ledger.reservations.len(),
                    ledger.queue.len()
                ),
            )),
            Err(e) => checks.push(problem(
                "state",
                e.to_string(),
                "run `vramgate ledger repair` (it sets the old ledger aside)",
            )),
        },
        Err(e) => checks.push(problem(
            "state",
            e.to_string(),
            format!(
                "make {} a directory owned by root with mode 0700, or remove it",
                path.display()
            ),
        )),
    }
}

/// Whether `vramgate watch` runs (its heartbeat in the state directory, the one the service
/// reads: [`crate::service::watch_seen`]) and what that means here: under `over_use = "kill"`
/// it is what stops a container over its limit, and what lets a pod's holders of one DRA claim
/// count once; without it they count whole.
fn check_watch(config: &Config, checks: &mut Vec<Check>) {
    let interval = config.enforce.over_use_interval;
    let seen = match StateDir::open_existing(&config.state_dir) {
        Ok(Some(dir)) => crate::service::watch_seen(&dir, crate::clock::now_unix_ms(), interval),
        _ => crate::service::WatchSeen::Never,
    };
    let ago = |age_ms: u64| format_duration(std::time::Duration::from_millis(age_ms));
    let kill = config.enforce.over_use == crate::config::OverUseAction::Kill;
    let window = format_duration(crate::service::heartbeat_window(interval));
    let not_seen = match seen {
        crate::service::WatchSeen::Running { age_ms } if kill => {
            checks.push(ok(
                "watch",
                format!("`vramgate watch` runs (last measured {} ago) under [enforce] over_use = \"kill\": it stops a container over its limit, and a pod's containers that hold one DRA claim count it once", ago(age_ms)),
            ));
            return;
        }
        crate::service::WatchSeen::Running { age_ms } => {
            checks.push(ok(
                "watch",
                format!("`vramgate watch` runs (last measured {} ago) and reports over-use as events (over_use = \"{}\"); a pod's containers that hold one DRA claim each count it whole (only \"kill\" holds a claim once)", ago(age_ms), config.enforce.over_use.as_str()),
            ));
            return;
        }
        crate::service::WatchSeen::Stale { age_ms } => format!(
            "no `vramgate watch` has measured for {} (more than {window})",
            ago(age_ms)
        ),
        crate::service::WatchSeen::Never => "no `vramgate watch` has ever measured here".to_string(),
    };
    if kill {
        checks.push(problem(
            "watch",
            format!("[enforce] over_use = \"kill\", but {not_seen}: nothing stops a container over its limit, and a pod's containers that hold one DRA claim each count it whole until one runs"),
            "start it: systemctl enable --now vramgate-watch (or run `vramgate watch`)",
        ));
    } else {
        checks.push(info(
            "watch",
            format!("{not_seen}: over-use shows in `vramgate status` only; a pod's containers that hold one DRA claim each count it whole"),
        ));
    }
}

/// The `[enforce]` limit in effect and whether it can work here; the driver limit's
/// availability whatever the limit (it says which driver the host would need); the guardrails.
/// One line each.
fn check_enforcement(config: &Config, paths: &Paths, checks: &mut Vec<Check>) {
    let enforce = &config.enforce;
    let file = paths.config.display();
    // The host's library, unless the config names one by path (then that one, as the hook).
    let library = std::path::PathBuf::from(&config.inventory.nvml_library);
    let available = driver_limit::driver_limit_available(&library);
    let cgroup_v2 = paths
        .at(driver_limit::CGROUP_V2_ROOT)
        .join("cgroup.controllers")
        .exists();
    let limit = format!("limit = \"{}\"", enforce.limit.as_str());
    let use_another = format!("or set [enforce] limit = \"mps\" or \"none\" in {file}");
    match enforce.limit {
        LimitMechanism::None => checks.push(info(
            "enforce",
            format!("{limit}: admission only; nothing stops a container from allocating beyond its reservation (set [enforce] limit in {file} to hold containers to it)"),
        )),
        LimitMechanism::Driver | LimitMechanism::Toolkit if !available.is_available() => checks.push(problem(
            "enforce",
            format!(
                "{limit}, but {available}{}",
                if enforce.limit == LimitMechanism::Toolkit {
                    " (the toolkit's hook makes the same call)"
                } else {
                    ""
                }
            ),
            format!("install {DRIVER_NEEDED}, {use_another}"),
        )),
        LimitMechanism::Driver | LimitMechanism::Toolkit if !cgroup_v2 => checks.push(problem(
            "enforce",
            format!(
                "{limit}, but {} is not cgroup v2, which the driver's memory limits need",
                driver_limit::CGROUP_V2_ROOT
            ),
            format!("boot the host with cgroup v2 only (systemd.unified_cgroup_hierarchy=1), {use_another}"),
        )),
        LimitMechanism::Driver => checks.push(ok(
            "enforce",
            format!("{limit}: {available} and {} is cgroup v2: the hook sets each container's hard limit (its reservation) on its cgroup", driver_limit::CGROUP_V2_ROOT),
        )),
        LimitMechanism::Toolkit => checks.push(ok(
            "enforce",
            format!("{limit}: vramgate writes NVIDIA_GPU_MEMORY_LIMIT and NVIDIA_GPU_MEMORY_REQUEST; only nvidia-container-toolkit's CDI hook apply-cuda-memory-limits applies them, to GPUs injected from a spec that carries it (the limit-by line says whether one does)"),
        )),
        LimitMechanism::Mps => {
            let pipe = &enforce.mps_pipe_directory;
            if mps::mps_control_running(&paths.at(&pipe.to_string_lossy()), &paths.at("/proc")) {
                checks.push(ok(
                    "enforce",
                    format!("{limit}: an MPS control daemon serves {}: each container gets {} = its reservation (it stops accidents, not a container that changes its own environment)", pipe.display(), mps::PINNED_LIMIT_VAR),
                ));
            } else {
                checks.push(problem(
                    "enforce",
                    format!("{limit}, but no MPS control daemon serves {} (no live daemon behind {}/{}): containers start without a limit", pipe.display(), pipe.display(), mps::CONTROL_SOCKET),
                    format!(
                        "start it: CUDA_MPS_PIPE_DIRECTORY={} CUDA_MPS_LOG_DIRECTORY={} nvidia-cuda-mps-control -d",
                        pipe.display(),
                        enforce.mps_log_directory.display()
                    ),
                ));
            }
        }
    }
    check_limit_by(config, paths, checks);
    // What the driver limit would need, when it is not the limit in use (that line is above).
    if !matches!(enforce.limit, LimitMechanism::Driver | LimitMechanism::Toolkit) {
        checks.push(info(
            "driver-limit",
            match &available {
                Availability::Available { .. } => format!("{available}: [enforce] limit = \"driver\" would work here"),
                Availability::MissingSymbol { .. } => format!("unavailable: {available}"),
                Availability::NoLibrary { library, .. } => format!(
                    "unavailable: no NVML library loads ({}); it needs {DRIVER_NEEDED}, whose library exports {SET_LIMITS_SYMBOL}",
                    library.display()
                ),
            },
        ));
    }
    let mut set = Vec::new();
    if enforce.tensorflow_allow_growth {
        set.push(format!("{}=true", guardrails::TF_ALLOW_GROWTH));
    }
    if enforce.jax_disable_preallocation {
        set.push(format!("{}=false", guardrails::JAX_PREALLOCATE));
    }
    if enforce.jax_memory_fraction {
        set.push(format!(
            "{} and {} = reservation / GPU total",
            guardrails::JAX_MEM_FRACTION,
            guardrails::JAX_MEM_FRACTION_OLD
        ));
    }
    checks.push(if set.is_empty() {
        info("guardrails", "all off: containers get no TensorFlow or JAX settings")
    } else {
        ok(
            "guardrails",
            format!(
                "{}, unless a container sets them itself (PyTorch has no such variable)",
                set.join(", ")
            ),
        )
    });
}

/// One line: what applies a container's memory limit on this host (vramgate's driver call, the
/// toolkit's CDI hook and the spec it was found in, the MPS server, or nothing), so that two
/// mechanisms on one cgroup, or none where one was meant, show.
fn check_limit_by(config: &Config, paths: &Paths, checks: &mut Vec<Check>) {
    let enforce = &config.enforce;
    let file = paths.config.display();
    let dirs: Vec<PathBuf> = enforce
        .cdi_spec_dirs
        .iter()
        .map(|d| paths.at(&d.to_string_lossy()))
        .collect();
    let hook = toolkit::hook_on_node(&dirs);
    let hook_in = |path: &Path| {
        format!(
            "nvidia-container-toolkit's {} hook, found in {}",
            toolkit::HOOK_COMMAND,
            path.display()
        )
    };
    const AREA: &str = "limit-by";
    checks.push(match (enforce.limit, &hook) {
        (LimitMechanism::None, None) => info(AREA, "nothing: [enforce] limit = \"none\""),
        (LimitMechanism::None, Some(path)) => info(
            AREA,
            format!("nothing of vramgate's ([enforce] limit = \"none\"); {} applies the NVIDIA_GPU_MEMORY_* variables a container sets itself", hook_in(path)),
        ),
        (LimitMechanism::Driver, None) => ok(AREA, "vramgate's hook: nvmlDeviceSetMemoryLimits_v1 on each container's cgroup"),
        (LimitMechanism::Driver, Some(path)) => ok(
            AREA,
            format!("vramgate's hook: nvmlDeviceSetMemoryLimits_v1 on each container's cgroup; {} sets none: vramgate's wrapper removes the NVIDIA_GPU_MEMORY_* variables it would read, and vramgate's hook alone refuses a container that sets them", hook_in(path)),
        ),
        (LimitMechanism::Toolkit, Some(path)) => ok(
            AREA,
            format!("{}; vramgate writes the values and makes no NVML call of its own", hook_in(path)),
        ),
        (LimitMechanism::Toolkit, None) => problem(
            AREA,
            format!(
                "nothing: [enforce] limit = \"toolkit\", but no CDI spec in {} carries nvidia-container-toolkit's {} hook, so containers start without a limit (tier guardrails or none)",
                toolkit::dirs_named(&dirs),
                toolkit::HOOK_COMMAND
            ),
            format!("install an nvidia-container-toolkit that has the hook and regenerate its spec (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml), name the spec's directory in [enforce] cdi_spec_dirs, or set [enforce] limit = \"driver\" or \"mps\" in {file}"),
        ),
        (LimitMechanism::Mps, _) => {
            let pipe = &enforce.mps_pipe_directory;
            if mps::mps_control_running(&paths.at(&pipe.to_string_lossy()), &paths.at("/proc")) {
                ok(AREA, format!("the MPS server, from each container's {}", mps::PINNED_LIMIT_VAR))
            } else {
                info(AREA, "nothing: no MPS control daemon runs (see the enforce line)")
            }
        }
    });
}

/// One line per check; problems say what to do.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for c in &report.checks {
        let tag = match c.level {
            Level::Ok => "ok     ",
            Level::Info => "-      ",
            Level::Problem => "PROBLEM",
        };
        let _ = write!(out, "{tag} {:<13} {}", c.area, c.message);
        if let Some(fix) = &c.fix {
            let _ = write!(out, "; fix: {fix}");
        }
        out.push('\n');
    }
    let n = report.problems();
    let _ = writeln!(
        out,
        "{}",
        if n == 0 {
            "no problems found".to_string()
        } else {
            format!("{n} problem(s)")
        }
    );
    out
}
