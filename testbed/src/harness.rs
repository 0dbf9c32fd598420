//! Driving `vramgate-hook` without a runtime: a scratch host (a config, a private state
//! directory, bundles), the OCI state a runtime writes on a hook's stdin, and a real process
//! standing in for a container's init. The reliability and input tests and the benches run
//! thousands of hooks this way, where starting runc for each would take minutes; the runc
//! path is [`Testbed`](super::Testbed)'s.
//!
//! Made for tests and benches, so a scratch host that cannot be set up (a full disk, a
//! missing binary) panics with what failed, at the caller's line: a test or a bench can do
//! nothing with such an error but stop.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Value};

use vramgate::config::CONFIG_ENV;
use vramgate::ledger::{Ledger, StateDir};

/// A scratch host for `vramgate-hook`: its own directory (removed on drop) holding
/// `config.toml`, the state directory that config names, and `bundles/<name>/config.json`.
pub struct HookHarness {
    dir: PathBuf,
    pub config: PathBuf,
    pub state_dir: PathBuf,
    hook: PathBuf,
    /// Extra environment for every hook and CLI run (the audit log, say).
    pub env: Vec<(String, String)>,
}

impl HookHarness {
    /// A scratch host on tmpfs (`/dev/shm`, as `/run` is on a real host; the temp dir where
    /// there is none) whose config is `state_dir = ...` followed by `config_extra`. `hook` is
    /// the `vramgate-hook` binary (a test's `env!("CARGO_BIN_EXE_vramgate-hook")`).
    #[track_caller]
    pub fn new(hook: impl AsRef<Path>, config_extra: &str) -> HookHarness {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        HookHarness::new_in(&base, hook, config_extra)
    }

    /// The same in a directory under `base`, for measuring on a given filesystem.
    #[track_caller]
    pub fn new_in(base: &Path, hook: impl AsRef<Path>, config_extra: &str) -> HookHarness {
        let hook = hook.as_ref().to_path_buf();
        assert!(
            hook.is_file(),
            "the hook binary {} does not exist: build it with `cargo build --release`",
            hook.display()
        );
        let dir = unique_dir(base);
        let harness = HookHarness {
            config: dir.join("config.toml"),
            state_dir: dir.join("state"),
            dir,
            hook,
            env: Vec::new(),
        };
        harness.write_config(config_extra);
        harness
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Replaces the config with `state_dir = ...` followed by `extra`.
    #[track_caller]
    pub fn write_config(&self, extra: &str) {
        write(&self.config, super::scratch_config(&self.state_dir, extra).as_bytes());
    }

    /// Where the bundle named `name` lives (written or not).
    pub fn bundle_path(&self, name: &str) -> PathBuf {
        self.dir.join("bundles").join(name)
    }

    /// A bundle whose spec carries these annotations and nothing else vramgate reads.
    #[track_caller]
    pub fn bundle(&self, name: &str, annotations: &[(&str, &str)]) -> PathBuf {
        let annotations: serde_json::Map<_, _> = annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let spec = json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sleep", "3600"], "env": ["PATH=/bin"]},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        });
        self.bundle_with_spec(name, &spec)
    }

    /// A bundle whose `config.json` is `spec`, indented as `runc spec` writes it.
    #[track_caller]
    pub fn bundle_with_spec(&self, name: &str, spec: &Value) -> PathBuf {
        let bundle = self.bundle_path(name);
        std::fs::create_dir_all(&bundle).unwrap_or_else(|e| panic!("creating {}: {e}", bundle.display()));
        let text = serde_json::to_vec_pretty(spec).expect("a JSON value serializes");
        write(&bundle.join("config.json"), &text);
        bundle
    }

    /// A command for `program` that sees this host's config and [`env`](Self::env).
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(program.as_ref());
        cmd.env(CONFIG_ENV, &self.config);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `vramgate-hook <stage>` as a runtime runs it: the state goes to the piped stdin, the
    /// one-line message comes on the piped stderr, stdout is not read. For a caller that
    /// spawns first and writes the state later (to start many hooks before any reads).
    pub fn hook_command(&self, stage: &str) -> Command {
        let mut cmd = self.command(&self.hook);
        cmd.arg(stage)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    /// Starts the hook at `stage` with `state` written to its stdin; the caller waits for it
    /// (or kills it).
    #[track_caller]
    pub fn spawn_hook(&self, stage: &str, state: &[u8]) -> Child {
        let mut child = self
            .hook_command(stage)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.hook.display()));
        feed(&mut child, state);
        child
    }

    /// Runs the hook at `stage` to the end.
    #[track_caller]
    pub fn hook(&self, stage: &str, state: &[u8]) -> Output {
        self.spawn_hook(stage, state)
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.hook.display()))
    }

    /// Runs the `vramgate` CLI with this host's config. It is the binary beside the hook:
    /// cargo builds both into one directory, and the packages install both in /usr/bin.
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> Output {
        let cli = self.hook.with_file_name("vramgate");
        self.command(&cli)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", cli.display()))
    }

    /// The state directory, created as the hook would create it.
    #[track_caller]
    pub fn open_state(&self) -> StateDir {
        StateDir::open_or_create(&self.state_dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The ledger as it is on disk now (read without the lock, as `vramgate status` does).
    #[track_caller]
    pub fn ledger(&self) -> Ledger {
        self.open_state().read().unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for HookHarness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `state` to a hook's stdin and closes it. A hook may exit before reading it all
/// (refused, or killed by the caller), so a broken pipe here is not an error.
pub fn feed(child: &mut Child, state: &[u8]) {
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(state);
    }
}

/// The OCI state a runtime writes on a hook's stdin: `creating` with the init's pid for the
/// admitting stages, `stopped` without one for poststop.
pub fn oci_state(id: &str, pid: Option<u32>, bundle: &Path) -> Vec<u8> {
    let mut state = json!({
        "ociVersion": "1.0.2",
        "id": id,
        "status": if pid.is_some() { "creating" } else { "stopped" },
        "bundle": bundle,
    });
    if let Some(pid) = pid {
        state["pid"] = json!(pid);
    }
    state.to_string().into_bytes()
}

/// A real process standing in for a container's init: the hook records its pid and start
/// time, and reclaims the reservation once it is gone. Killed and reaped on drop.
pub struct FakeContainer {
    child: Child,
}

impl FakeContainer {
    #[track_caller]
    pub fn start() -> FakeContainer {
        // Its stdio is not the caller's: one left behind (a test killed mid-run) must not hold
        // the caller's pipes open, or whatever reads them would wait for it.
        let child = Command::new("sleep")
            .arg("3600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting sleep: {e}"));
        FakeContainer { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills and reaps it, so it is gone for good (a zombie already counts as gone).
    pub fn kill(self) {
        drop(self); // the drop does it
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new directory under `base`, private to this process (0700, as `tempfile` makes them).
#[track_caller]
fn unique_dir(base: &Path) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("vramgate-scratch-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return dir,
            // Left by an earlier process with the same pid that was killed before its drop.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating {}: {e}", dir.display()),
        }
    }
}

#[track_caller]
fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
