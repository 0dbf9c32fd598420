//! The engines' side: which engine configs name vramgate, and whether the hook they name is
//! there to run.

use super::*;

/// Checks each engine's config for vramgate; returns the hook (or runtime) paths they name.
pub(super) fn check_engines(paths: &Paths, checks: &mut Vec<Check>) -> Vec<PathBuf> {
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
            "add runtimes.vramgate to /etc/docker/daemon.json, a vramgate runtime to containerd, or a hooks.d file for podman/CRI-O (see `vramgate setup --help` and the manual's engines chapter)",
        ));
    }
    named
}

pub(super) fn check_hook_binary(paths: &Paths, named: &[PathBuf], checks: &mut Vec<Check>) {
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

pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(super) fn list_dir(dir: &Path, ext: &str) -> Vec<PathBuf> {
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
