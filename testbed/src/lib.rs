//! Scratch hosts for the demo, the integration tests and the benches. Nothing here touches
//! the host's own `/etc/vramgate` or `/run/vramgate`. A crate beside the library, not in it:
//! the library and the binaries it ships use none of this.
//!
//! - [`Testbed`]: for real runc: a config with a simulated GPU, a private state directory, a
//!   busybox root filesystem, and runc bundles whose `config.json` runs the vramgate hooks.
//! - [`HookHarness`]: for `vramgate-hook` run directly, with the OCI state on its stdin, and
//!   [`FakeContainer`] as the container's init.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use vramgate::config::CONFIG_ENV;

pub mod bench;
pub mod demo;
mod harness;
// The kubelet side of the device plugin API, for tests/it/device_plugin.rs and its bench.
pub mod kubelet;
pub mod stalled;
pub use harness::{feed, oci_state, FakeContainer, HookHarness};

pub struct Testbed {
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub state_dir: PathBuf,
    pub rootfs: PathBuf,
    /// runc's own state (`runc --root`), private so tests never see the host's containers.
    pub runc_root: PathBuf,
    pub runc: PathBuf,
    pub hook: PathBuf,
    template: Value,
}

/// A scratch config: `state_dir` (so nothing touches `/run/vramgate`), then `extra` as given.
pub fn scratch_config(state_dir: &Path, extra: &str) -> String {
    format!("state_dir = {:?}\n{extra}\n", state_dir.display().to_string())
}

/// Where a binary is on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A statically linked busybox (Debian's busybox-static), which runs in an empty rootfs.
fn find_static_busybox() -> Result<PathBuf> {
    for candidate in ["/bin/busybox", "/usr/bin/busybox"] {
        let path = Path::new(candidate);
        if path.is_file() {
            let out = Command::new("file").arg("-L").arg(path).output();
            let is_dynamic = out
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("dynamically"))
                .unwrap_or(false);
            if !is_dynamic {
                return Ok(path.to_path_buf());
            }
        }
    }
    bail!("no statically linked busybox found: install it with `apt-get install busybox-static`")
}

impl Testbed {
    /// Sets up a testbed in `dir` (created if missing), with `config_toml` as the config file
    /// (its `state_dir` should point inside `dir`; see [`Testbed::default_config`]).
    pub fn create(dir: &Path, runc: &str, hook: &Path, config_toml: &str) -> Result<Testbed> {
        let runc =
            which(runc).with_context(|| format!("{runc} not found on PATH: install it with `apt-get install runc`"))?;
        if !hook.is_file() {
            bail!(
                "the hook binary {} does not exist: build it with `cargo build --release`",
                hook.display()
            );
        }
        let hook = hook
            .canonicalize()
            .with_context(|| format!("resolving {}", hook.display()))?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config_toml).with_context(|| format!("writing {}", config_path.display()))?;
        let config = vramgate::config::Config::load_from(&config_path)?;

        let rootfs = dir.join("rootfs");
        let bin = rootfs.join("bin");
        std::fs::create_dir_all(&bin)?;
        let busybox = find_static_busybox()?;
        std::fs::copy(&busybox, bin.join("busybox")).with_context(|| format!("copying {}", busybox.display()))?;
        for applet in ["sh", "sleep", "true", "false", "cat", "echo", "env", "ls"] {
            let link = bin.join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link)?;
            }
        }
        for d in ["proc", "dev", "sys", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d))?;
        }

        // runc's own default spec is the template, so the bundles match what this runc expects.
        let template_dir = dir.join("template");
        std::fs::create_dir_all(&template_dir)?;
        let _ = std::fs::remove_file(template_dir.join("config.json"));
        let out = Command::new(&runc)
            .arg("spec")
            .arg("--bundle")
            .arg(&template_dir)
            .output()?;
        if !out.status.success() {
            bail!("`runc spec` failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let template: Value = serde_json::from_slice(&std::fs::read(template_dir.join("config.json"))?)?;
        let runc_root = dir.join("runc");
        std::fs::create_dir_all(&runc_root)?;
        Ok(Testbed {
            dir,
            config_path,
            state_dir: config.state_dir,
            rootfs,
            runc_root,
            runc,
            hook,
            template,
        })
    }

    /// The testbed [`Testbed::create`] set up in `dir` earlier (another process's, which may be
    /// using it): its config is read, nothing is written.
    pub fn open(dir: &Path, runc: &str, hook: &Path) -> Result<Testbed> {
        let runc =
            which(runc).with_context(|| format!("{runc} not found on PATH: install it with `apt-get install runc`"))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let config_path = dir.join("config.toml");
        let config = vramgate::config::Config::load_from(&config_path)?;
        let template_json = dir.join("template/config.json");
        let template: Value = serde_json::from_slice(
            &std::fs::read(&template_json).with_context(|| format!("reading {}", template_json.display()))?,
        )?;
        Ok(Testbed {
            rootfs: dir.join("rootfs"),
            runc_root: dir.join("runc"),
            hook: hook.to_path_buf(),
            state_dir: config.state_dir,
            config_path,
            dir,
            runc,
            template,
        })
    }

    /// A config for a testbed in `dir`: a private state dir and the given static GPUs section.
    pub fn default_config(dir: &Path, extra: &str) -> String {
        scratch_config(&dir.join("state"), extra)
    }

    /// The hooks entry vramgate adds to a spec, for `hook` run with this testbed's config.
    pub fn hooks(&self, timeout_seconds: u64) -> Value {
        // The same entries vramgate-runtime injects, so the demo and tests run exactly those.
        let entry = |stage| vramgate::runtime::hook_entry(&self.hook, stage, timeout_seconds, Some(&self.config_path));
        json!({ "createRuntime": [entry("createRuntime")], "poststop": [entry("poststop")] })
    }

    /// Writes a bundle named `name` that runs `args`, with these annotations and env vars,
    /// and (when `with_hooks`) the vramgate hooks. Returns the bundle directory.
    pub fn bundle(
        &self,
        name: &str,
        args: &[&str],
        annotations: &[(&str, &str)],
        env: &[&str],
        with_hooks: bool,
    ) -> Result<PathBuf> {
        let bundle = self.dir.join("bundles").join(name);
        std::fs::create_dir_all(&bundle)?;
        let mut spec = self.template.clone();
        spec["root"] = json!({ "path": self.rootfs, "readonly": true });
        spec["process"]["terminal"] = json!(false);
        spec["process"]["args"] = json!(args);
        let mut all_env = vec!["PATH=/bin".to_string()];
        all_env.extend(env.iter().map(|e| e.to_string()));
        spec["process"]["env"] = json!(all_env);
        // runc names the cgroup after the container id unless told otherwise; a path under this
        // testbed's own name keeps two testbeds (parallel tests, two demos) from colliding.
        let tag = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        spec["linux"]["cgroupsPath"] = json!(format!("/vramgate-testbed/{tag}/{name}"));
        spec["annotations"] = Value::Object(annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect());
        if with_hooks {
            spec["hooks"] = self.hooks(600);
        }
        std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec)?)?;
        Ok(bundle)
    }

    /// `runc run` for a bundle, ready to spawn: stdio detached, private runc root.
    pub fn runc_run(&self, bundle: &Path, id: &str) -> Command {
        let mut cmd = Command::new(&self.runc);
        cmd.arg("--root")
            .arg(&self.runc_root)
            .arg("run")
            .arg("--bundle")
            .arg(bundle)
            .arg(id);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Any other runc verb against this testbed's runc root.
    pub fn runc(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.runc);
        cmd.arg("--root").arg(&self.runc_root).args(args);
        cmd
    }

    /// `vramgate`-style environment for commands run against this testbed.
    pub fn env(&self) -> (&'static str, PathBuf) {
        (CONFIG_ENV, self.config_path.clone())
    }

    /// Removes every container runc still knows in this testbed.
    pub fn cleanup_containers(&self) {
        let Ok(out) = self.runc(&["list", "-q"]).output() else {
            return;
        };
        for id in String::from_utf8_lossy(&out.stdout).lines() {
            let _ = self.runc(&["delete", "--force", id]).stderr(Stdio::null()).status();
        }
    }
}
