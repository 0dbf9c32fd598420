//! Shared by the reliability tests (crash, concurrency, hostile state): a scratch host with a
//! config of simulated GPUs, bundles whose `config.json` carries a request, real `sleep`
//! processes standing in for container init processes, and real `vramgate-hook` invocations
//! with a crafted OCI state on stdin (exactly what runc writes to a hook).
//!
//! No runc here: what these tests prove is about the hook and its ledger, and thousands of
//! invocations must fit in a few minutes on a small machine. The runc path is covered by the
//! engine tests.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::json;

pub const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");
pub const CLI: &str = env!("CARGO_BIN_EXE_vramgate");
pub const GIB: u64 = 1 << 30;

/// A small deterministic generator (xorshift64*): reproducible runs from a printed seed,
/// without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    /// A seed from `VRAMGATE_TEST_SEED` if set (to replay a failure), else the clock.
    pub fn seed_from_env() -> u64 {
        std::env::var("VRAMGATE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            })
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A scratch host: a config file, a state directory on tmpfs (as `/run` is on a real host),
/// and a folder of bundles.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state: PathBuf,
    /// Extra environment for every hook and CLI run (the audit log, say).
    pub env: Vec<(String, String)>,
}

impl Scratch {
    /// `extra` is appended to a config that names the state dir.
    pub fn new(extra: &str) -> Scratch {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let dir = tempfile::Builder::new()
            .prefix("vramgate-rel-")
            .tempdir_in(base)
            .unwrap();
        let state = dir.path().join("state");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("state_dir = {:?}\n{extra}\n", state.display().to_string()),
        )
        .unwrap();
        Scratch {
            dir,
            config,
            state,
            env: Vec::new(),
        }
    }

    pub fn rewrite_config(&self, extra: &str) {
        std::fs::write(
            &self.config,
            format!("state_dir = {:?}\n{extra}\n", self.state.display().to_string()),
        )
        .unwrap();
    }

    /// A bundle whose spec carries these annotations (and nothing else vramgate reads).
    pub fn bundle(&self, name: &str, annotations: &[(&str, &str)]) -> PathBuf {
        let bundle = self.dir.path().join("bundles").join(name);
        std::fs::create_dir_all(&bundle).unwrap();
        let annotations: serde_json::Map<_, _> = annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let spec = json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sleep", "3600"], "env": ["PATH=/bin"]},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        });
        std::fs::write(bundle.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
        bundle
    }

    /// The OCI state runc writes on a hook's stdin.
    pub fn state_json(id: &str, pid: Option<u32>, bundle: &Path) -> Vec<u8> {
        let mut state = json!({
            "ociVersion": "1.0.2",
            "id": id,
            "status": if pid.is_some() { "creating" } else { "stopped" },
            "bundle": bundle,
        });
        if let Some(pid) = pid {
            state["pid"] = json!(pid);
        }
        serde_json::to_vec(&state).unwrap()
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("VRAMGATE_CONFIG", &self.config);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts a hook at `stage` with the state on stdin; the caller waits (or kills) it.
    pub fn spawn_hook(&self, stage: &str, state: &[u8]) -> Child {
        let mut child = self
            .command(HOOK)
            .arg(stage)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A hook killed before it read stdin makes this a broken pipe, which is fine.
        let _ = child.stdin.take().unwrap().write_all(state);
        child
    }

    pub fn hook(&self, stage: &str, state: &[u8]) -> Output {
        self.spawn_hook(stage, state).wait_with_output().unwrap()
    }

    /// Runs the `vramgate` CLI with this scratch config.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command(CLI).args(args).output().unwrap()
    }

    pub fn state_dir(&self) -> vramgate::ledger::StateDir {
        vramgate::ledger::StateDir::open_or_create(&self.state).unwrap()
    }

    pub fn ledger(&self) -> vramgate::ledger::Ledger {
        self.state_dir().read().unwrap()
    }
}

/// A real process standing in for a container's init: the hook records its pid and start time,
/// and reclaims the reservation once it is gone.
pub struct FakeContainer {
    pub child: Child,
}

impl FakeContainer {
    pub fn start() -> FakeContainer {
        let child = Command::new("sleep").arg("3600").stdin(Stdio::null()).spawn().unwrap();
        FakeContainer { child }
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Kills and reaps it, so it is gone for good (a zombie already counts as gone).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
