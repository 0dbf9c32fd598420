//! The cluster as a client sees it: the real kubectl with a kubeconfig, and waits that name what
//! they waited for and show the log of the component at fault. The node's supervisor uses it to
//! wait for its own start; the tests use it for everything they ask the cluster.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::{run_ok, stderr, stdout, tail};

/// A wait that takes longer than this is printed with its time.
pub const SLOW_WAIT: Duration = Duration::from_secs(5);

/// kubectl against one API server, and where the node's component logs are.
#[derive(Debug, Clone)]
pub struct Kube {
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    /// The directory of `<component>.log`.
    pub logs: PathBuf,
}

impl Kube {
    /// The log of component `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// Polls `check` every 200 ms for at most `limit`; fails with `what`, the last state and
    /// the tail of `component`'s log. A wait longer than [`SLOW_WAIT`] prints its time.
    pub fn wait<T: std::fmt::Debug>(
        &self,
        what: &str,
        limit: Duration,
        component: &str,
        mut check: impl FnMut() -> (bool, T),
    ) -> T {
        let start = Instant::now();
        loop {
            let (done, state) = check();
            if done {
                // A slow step is named in the output, so that a run's time can be read back
                // to the wait that spent it (the limits are sized for a loaded machine).
                if start.elapsed() > SLOW_WAIT {
                    eprintln!("waited {:?} until {what}", start.elapsed());
                }
                return state;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting until {what}; last: {state:?}\n{}",
                    tail(&self.log(component), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The real kubectl, with this kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// kubectl with `input` on its stdin.
    pub fn kubectl_in(&self, args: &[&str], input: &str) -> Output {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.kubectl.display()));
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `kubectl <args>`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        run_ok(&mut self.kubectl(args))
    }

    /// `kubectl get <args> -o json`; None when kubectl fails (not found, API down).
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let out = self
            .kubectl(&[&["get"], args, &["-o", "json"]].concat())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.kubectl.display()));
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// Server-side apply of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_in(
            &["apply", "--server-side", "--field-manager=vramgate-tests", "-f", "-"],
            yaml,
        );
        assert!(out.status.success(), "kubectl apply: {}\n{yaml}", stderr(&out));
        stdout(&out)
    }

    pub fn apply_file(&self, file: &Path) -> String {
        let out = self
            .kubectl(&["apply", "--server-side", "--field-manager=vramgate-tests", "-f"])
            .arg(file)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.kubectl.display()));
        assert!(
            out.status.success(),
            "kubectl apply {}: {}",
            file.display(),
            stderr(&out)
        );
        stdout(&out)
    }

    /// Deletes every pod and waits (at most 90 s) until they are gone: kubelet stopped their
    /// containers. Cleanup: a failure is not one.
    pub fn delete_all_pods(&self) {
        let _ = self
            .kubectl(&[
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--wait=true",
                "--timeout=90s",
            ])
            .output();
    }

    /// Whether node `name` reports Ready, and its conditions.
    pub fn node_ready(&self, name: &str) -> (bool, Value) {
        let node = self.get_json(&["node", name]);
        let conditions = node
            .as_ref()
            .map(|n| n["status"]["conditions"].clone())
            .unwrap_or(Value::Null);
        let ready = conditions
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (ready, conditions)
    }
}
