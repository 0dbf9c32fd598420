//! `vramgate doctor`: is this host set up so that the hook can do its job?
//!
//! Every check only reads (files, the driver through NVML, the ledger); nothing is created or
//! changed, so it is safe to run on a production host at any time. Each problem comes with
//! the one thing to do about it. The paths are parameters so the tests can point them at a
//! scratch directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::{Backend, Config};
use crate::inventory::{self, Inventory, NvmlInventory};
use crate::ledger::StateDir;
use crate::quantity::format_bytes;

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
                format!("edit {} (the README lists every key)", paths.config.display()),
            ));
            None
        }
    };
    if let Some(config) = &config {
        check_inventory(config, paths, &mut checks);
        check_state(config, &mut checks);
    }
    let engine_hooks = check_engines(paths, &mut checks);
    check_hook_binary(paths, &engine_hooks, &mut checks);
    Report { checks }
}

fn check_inventory(config: &Config, paths: &Paths, checks: &mut Vec<Check>) {
    let device_nodes = paths.at("/dev/nvidiactl").exists();
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
                    format!("{message}, but this host has NVIDIA devices (/dev/nvidiactl): admission uses configured numbers, not the driver's"),
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

/// Checks each engine's config for vramgate; returns the hook (or runtime) paths they name.
fn check_engines(paths: &Paths, checks: &mut Vec<Check>) -> Vec<PathBuf> {
    let mut named = Vec::new();
    let mut configured = 0;

    // Docker: a runtime named "vramgate" in daemon.json.
    let daemon_json = paths.at("/etc/docker/daemon.json");
    match std::fs::read_to_string(&daemon_json) {
        Err(_) => checks.push(info("docker", format!("not set up ({} absent)", daemon_json.display()))),
        Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Err(e) => checks.push(problem(
                "docker",
                format!(
                    "{} is not valid JSON ({e}); dockerd will not start",
                    daemon_json.display()
                ),
                format!("fix the JSON in {}", daemon_json.display()),
            )),
            Ok(value) => match value["runtimes"]["vramgate"]["path"].as_str() {
                Some(path) => {
                    configured += 1;
                    named.push(PathBuf::from(path));
                    let default = value["default-runtime"].as_str() == Some("vramgate");
                    checks.push(ok(
                        "docker",
                        format!(
                            "runtime vramgate -> {path}{}",
                            if default {
                                " (the default runtime)"
                            } else {
                                " (use `docker run --runtime vramgate`)"
                            }
                        ),
                    ));
                }
                None => checks.push(info(
                    "docker",
                    format!("{} has no runtimes.vramgate", daemon_json.display()),
                )),
            },
        },
    }

    // containerd: the main config or a drop-in that mentions vramgate.
    let mut containerd_files = vec![paths.at("/etc/containerd/config.toml")];
    containerd_files.extend(list_dir(&paths.at("/etc/containerd/conf.d"), "toml"));
    let containerd: Vec<&PathBuf> = containerd_files
        .iter()
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("vramgate")))
        .collect();
    if containerd.is_empty() {
        checks.push(info("containerd", "no containerd config mentions vramgate"));
    } else {
        configured += 1;
        checks.push(ok(
            "containerd",
            format!(
                "configured in {}",
                containerd
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }

    // podman and CRI-O: OCI hooks.d JSON files whose hook path is the vramgate hook.
    let mut hook_files = Vec::new();
    for dir in ["/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d"] {
        for file in list_dir(&paths.at(dir), "json") {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            if !text.contains("vramgate") {
                continue;
            }
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) => {
                    if let Some(p) = v["hook"]["path"].as_str() {
                        named.push(PathBuf::from(p));
                    }
                    hook_files.push(file);
                }
                Err(e) => checks.push(problem(
                    "podman/cri-o",
                    format!("{} is not valid JSON ({e}); podman and CRI-O skip it", file.display()),
                    format!("fix or remove {}", file.display()),
                )),
            }
        }
    }
    if hook_files.is_empty() {
        checks.push(info("podman/cri-o", "no hooks.d file names vramgate"));
    } else {
        configured += 1;
        checks.push(ok(
            "podman/cri-o",
            format!(
                "hooks.d: {}",
                hook_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }

    if configured == 0 {
        checks.push(problem(
            "engines",
            "no container engine is set up to run vramgate, so no container is admitted or refused",
            "add runtimes.vramgate to /etc/docker/daemon.json, a vramgate runtime to containerd, or a hooks.d file for podman/CRI-O (see the README)",
        ));
    }
    named
}

fn check_hook_binary(paths: &Paths, named: &[PathBuf], checks: &mut Vec<Check>) {
    for path in named {
        let path = if path.is_absolute() {
            paths.at(&path.to_string_lossy())
        } else {
            path.clone()
        };
        if !is_executable(&path) {
            checks.push(problem(
                "hook",
                format!(
                    "{} is named by an engine config but is not an executable file",
                    path.display()
                ),
                "install the vramgate package again, or fix the path in the engine config",
            ));
        }
    }
    match paths.hook_candidates.iter().find(|p| is_executable(p)) {
        Some(p) => checks.push(ok("hook", format!("{} present", p.display()))),
        None => checks.push(problem(
            "hook",
            format!(
                "{HOOK_BINARY} not found (looked at {})",
                paths
                    .hook_candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "install the vramgate package, or put vramgate-hook next to vramgate",
        )),
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn list_dir(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
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
