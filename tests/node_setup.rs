//! `vramgate setup-node`, the Helm chart's node set-up, run as the DaemonSet runs it: the
//! built binary against a host root (here a private directory standing for the host's `/`,
//! mounted at `/host` in the pod), with a real containerd 2.1 reading the config in it. It
//! copies the hook and the wrapper into the host, sets containerd up with the same plan as
//! `vramgate setup containerd`, restarts containerd (SIGHUP to the process serving its
//! socket; the test plays the service manager that starts it again), and on SIGTERM puts the
//! host back byte-for-byte and restarts containerd once more.

#[path = "support/cri.rs"]
mod cri_support;
mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use cri_support::*;
use support::*;

const REQUEST: &str = "1205Mi";
const REQUEST_BYTES: u64 = 1205 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// A running `vramgate setup-node` and its output, line by line.
struct Node {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Node {
    fn spawn(config: &Path, host: &Path, args: &[&str]) -> Node {
        let mut child = Command::new(VRAMGATE)
            .env("VRAMGATE_CONFIG", config)
            .arg("setup-node")
            .arg("--host-root")
            .arg(host)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                eprintln!("setup-node: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Node {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a line that starts with `prefix`.
    fn wait_for(&mut self, prefix: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.seen.iter().any(|l| l.starts_with(prefix)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(e) => panic!("no line {prefix:?} from setup-node ({e}); it printed {:#?}", self.seen),
            }
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(started.elapsed() < WAIT, "setup-node did not exit: {:#?}", self.seen);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file and directory under `dir`, relative, sorted (symlinks not followed).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(dir).unwrap().to_path_buf());
            if path.symlink_metadata().unwrap().is_dir() {
                todo.push(path);
            }
        }
    }
    out.sort();
    out
}

/// SIGTERM to a set-up: it restarts containerd (the test starting it again), exits 0, and
/// containerd's main config is `original` again.
fn undone(node: &mut Node, cri: &Cri, main: &Path, original: &str) {
    node.signal(nix::sys::signal::Signal::SIGTERM);
    restarted_on_sighup(cri);
    let status = node.wait_exit();
    assert!(status.success(), "{status:?}: {:#?}", node.seen);
    assert_eq!(std::fs::read_to_string(main).unwrap(), original);
}

/// Plays containerd's service manager once: containerd must end by setup-node's SIGHUP, and
/// is started again.
fn restarted_on_sighup(cri: &Cri) {
    let ended = cri.restart_after_exit(WAIT);
    assert_eq!(
        ended.signal(),
        Some(nix::libc::SIGHUP),
        "containerd ended with {ended:?}"
    );
}

fn hook_path_in(spec: &Path) -> String {
    let spec: Value = serde_json::from_slice(&std::fs::read(spec).unwrap()).unwrap();
    spec["hooks"]["createRuntime"][0]["path"].as_str().unwrap().to_string()
}

#[test]
fn setup_node_sets_up_a_real_containerd_and_on_sigterm_gives_the_host_back() {
    require("containerd");
    require("runc");
    let (tmp, tb) = runc_testbed("vramgate-setup-node", "[inventory]\nbackend = \"static\"");
    let containerd = Containerd::Two;
    // The testbed's directory is the host's root: containerd's own files in /containerd,
    // its main config where a distribution puts it.
    let host = tb.dir.clone();
    let dir = host.join("containerd");
    for sub in ["cni/bin", "cni/net.d", "cdi"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
    std::fs::create_dir_all(host.join("usr/local/lib")).unwrap();
    let main = host.join("etc/containerd/config.toml");
    let original = containerd.host_config(&dir);
    std::fs::write(&main, &original).unwrap();
    let before = tree(&host.join("etc"));
    let mut cri = Cri::start(tb, containerd, &dir, &main);
    cri.dir = Some(tmp);
    assert!(cri.runtimes().get("vramgate").is_none(), "{}", cri.runtimes());
    cri.import_images();

    let host_str = host.to_str().unwrap();
    // The undo waits 5 s for the containers still running through the wrapper.
    let args = [
        "--engine-root",
        host_str,
        "--engine-socket",
        "/containerd/containerd.sock",
        "--engine-tasks",
        "/containerd/ctd-state/io.containerd.runtime.v2.task",
        "--wait",
        "5",
    ];
    let mut node = Node::spawn(&cri.tb.config_path, &host, &args);
    // containerd ends on the SIGHUP; its service manager (here, the test) starts it again.
    restarted_on_sighup(&cri);
    node.wait_for("node set up");
    assert!(
        node.seen.iter().any(|l| l.starts_with("restarted the engine: SIGHUP")),
        "{:#?}",
        node.seen
    );

    let installed = host.join("usr/local/lib/vramgate");
    let runs_the_copied_wrapper = |cri: &Cri| {
        let runtimes = cri.runtimes();
        assert_eq!(
            runtimes["vramgate"]["options"]["BinaryName"],
            installed.join("vramgate-runtime").to_str().unwrap(),
            "{runtimes}"
        );
        assert!(runtimes["runc"].is_object(), "the default runtime is gone: {runtimes}");
    };
    runs_the_copied_wrapper(&cri);
    // A pod through the handler reserves, run by the copied wrapper and hook.
    let pods = run_all(&cri, vec![pod_config("trainer", &[("vramgate.dev/memory", REQUEST)])]);
    let gpu = cri.create(
        &pods[0],
        container_config("gpu", RUN_UNTIL_STOPPED, &[("NVIDIA_VISIBLE_DEVICES", "0")]),
    );
    cri.start_one(&gpu).unwrap();
    assert_eq!(reservations(&cri.tb), [(gpu.clone(), REQUEST_BYTES)]);
    assert_eq!(
        hook_path_in(&cri.bundle_spec(&gpu)),
        installed.join("vramgate-hook").to_str().unwrap()
    );

    // Undone while the pod still runs: the config goes back, containerd restarts without the
    // handler, and the binaries stay (the pod's shim execs the wrapper to stop it), the undo
    // saying which containers use them.
    undone(&mut node, &cri, &main, &original);
    assert!(cri.runtimes().get("vramgate").is_none(), "{}", cri.runtimes());
    let kept = node
        .seen
        .iter()
        .find(|l| l.starts_with("kept "))
        .unwrap_or_else(|| panic!("no kept line: {:#?}", node.seen));
    assert!(kept.contains(&gpu) && kept.contains(&pods[0].sandbox), "{kept}");
    assert!(installed.join("vramgate-runtime").is_file());
    // The pod stops and goes through the kept wrapper, releasing its memory.
    cri.delete_pods(&pods);
    assert!(reservations(&cri.tb).is_empty());

    // The next run removes what the last one kept, and sets the node up again.
    let mut node = Node::spawn(&cri.tb.config_path, &host, &args);
    restarted_on_sighup(&cri);
    node.wait_for("node set up");
    assert!(
        node.seen.iter().any(|l| l.contains("was left by an earlier run")),
        "{:#?}",
        node.seen
    );
    runs_the_copied_wrapper(&cri);
    undone(&mut node, &cri, &main, &original);
    assert_eq!(
        tree(&host.join("etc")),
        before,
        "setup-node left files in the host's /etc"
    );
    assert!(!installed.exists(), "{} is still there", installed.display());
    assert_eq!(tree(&host.join("usr/local")), [PathBuf::from("lib")]);
    let runtimes = cri.runtimes();
    assert!(
        runtimes.get("vramgate").is_none(),
        "containerd still has the handler: {runtimes}"
    );
}

/// A host root with containerd's config and nothing running (restart mode none).
fn quiet_host(name: &str) -> (tempfile::TempDir, PathBuf, String) {
    let tmp = tempfile::Builder::new().prefix(name).tempdir().unwrap();
    let host = tmp.path().join("host");
    std::fs::create_dir_all(host.join("etc/containerd")).unwrap();
    std::fs::create_dir_all(host.join("usr/local/lib")).unwrap();
    let original =
        "# the host's own\nversion = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = true\n".to_string();
    std::fs::write(host.join("etc/containerd/config.toml"), &original).unwrap();
    std::fs::write(tmp.path().join("config.toml"), "").unwrap();
    (tmp, host, original)
}

#[test]
fn setup_node_after_a_killed_run_undoes_it_first_and_a_second_run_waits_its_turn() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-crash");
    let config = tmp.path().join("config.toml");
    let main = host.join("etc/containerd/config.toml");
    let before = tree(&host);
    let mut first = Node::spawn(&config, &host, &["--restart", "none"]);
    first.wait_for("node set up");
    assert_ne!(std::fs::read_to_string(&main).unwrap(), original);
    // A second run while the first holds the node is refused, after its bounded wait.
    let second = Command::new(VRAMGATE)
        .env("VRAMGATE_CONFIG", &config)
        .args(["setup-node", "--restart", "none", "--wait", "1", "--host-root"])
        .arg(&host)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(stderr.contains("another `vramgate setup-node` holds"), "{stderr}");
    // Killed: no undo.
    first.signal(nix::sys::signal::Signal::SIGKILL);
    first.wait_exit();
    assert!(host.join("usr/local/lib/vramgate/vramgate-runtime").is_file());
    let mut next = Node::spawn(&config, &host, &["--restart", "none"]);
    next.wait_for("node set up");
    assert!(
        next.seen.iter().any(|l| l.contains("was left by an earlier run")),
        "{:#?}",
        next.seen
    );
    next.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(next.wait_exit().success(), "{:#?}", next.seen);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    // All it leaves is the ledger's directory (config.toml's default state_dir), which the
    // chart's pods mount and a node without the package lacks: root's alone, kept on undo
    // for the containers still running.
    let mut kept = before.clone();
    kept.extend([PathBuf::from("run"), PathBuf::from("run/vramgate")]);
    kept.sort();
    assert_eq!(tree(&host), kept);
    let state = std::fs::metadata(host.join("run/vramgate")).unwrap();
    assert_eq!(state.permissions().mode() & 0o7777, 0o700);
}

#[test]
fn setup_node_refuses_a_symlink_that_leads_out_of_the_host_root() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-link");
    let config = tmp.path().join("config.toml");
    // The host's /etc/containerd is a link to a directory outside the host root (an absolute
    // link means the host's own path, which is elsewhere in this view).
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("config.toml"), &original).unwrap();
    std::fs::remove_dir_all(host.join("etc/containerd")).unwrap();
    std::os::unix::fs::symlink(&outside, host.join("etc/containerd")).unwrap();
    let before = (tree(&host), tree(&outside));
    let out = Command::new(VRAMGATE)
        .env("VRAMGATE_CONFIG", &config)
        .args(["setup-node", "--restart", "none", "--host-root"])
        .arg(&host)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("/etc/containerd/config.toml leads out of the host root"),
        "{stderr}"
    );
    assert_eq!((tree(&host), tree(&outside)), before);
    assert_eq!(std::fs::read_to_string(outside.join("config.toml")).unwrap(), original);
}

/// With the chart's config (`--install-config`, the ConfigMap in the pod), the set-up writes it
/// where the host's hook and runtime read it and reads it itself (its state_dir is the one
/// made); the undo gives the host's file back byte-for-byte, or removes it and the directory it
/// made when the host had none. A link planted at the host's config path is refused.
#[test]
fn setup_node_installs_the_charts_config_on_the_host_and_gives_the_old_one_back() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-config");
    let empty = tmp.path().join("config.toml");
    let chart = tmp.path().join("chart-config.toml");
    let chart_text = "# rendered by the vramgate chart\nstate_dir = \"/var/lib/vg-chart-state\"\n[inventory]\nbackend = \"static\"\n";
    std::fs::write(&chart, chart_text).unwrap();
    let install = ["--restart", "none", "--install-config", chart.to_str().unwrap()];
    let host_config = host.join("etc/vramgate/config.toml");

    // A host without the package: no /etc/vramgate at all.
    let before = tree(&host);
    let mut node = Node::spawn(&empty, &host, &install);
    node.wait_for("node set up");
    assert_eq!(std::fs::read_to_string(&host_config).unwrap(), chart_text);
    assert_eq!(
        std::fs::metadata(&host_config).unwrap().permissions().mode() & 0o7777,
        0o644
    );
    // The ledger's directory the chart's config names, not the default one.
    assert!(host.join("var/lib/vg-chart-state").is_dir(), "{:#?}", node.seen);
    assert!(!host.join("run/vramgate").exists());
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    let mut kept = before.clone();
    kept.extend(["var", "var/lib", "var/lib/vg-chart-state"].map(PathBuf::from));
    kept.sort();
    assert_eq!(tree(&host), kept, "{:#?}", node.seen);

    // A host with its own file: given back byte-for-byte.
    std::fs::create_dir_all(host.join("etc/vramgate")).unwrap();
    let own = "# the host's own\npolicy = \"reject\"\n";
    std::fs::write(&host_config, own).unwrap();
    let mut node = Node::spawn(&empty, &host, &install);
    node.wait_for("node set up");
    assert_eq!(std::fs::read_to_string(&host_config).unwrap(), chart_text);
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    assert_eq!(std::fs::read_to_string(&host_config).unwrap(), own);

    // A link at the host's config path is not written through.
    std::fs::remove_file(&host_config).unwrap();
    let elsewhere = tmp.path().join("elsewhere.toml");
    std::fs::write(&elsewhere, own).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &host_config).unwrap();
    let out = Command::new(VRAMGATE)
        .env("VRAMGATE_CONFIG", &empty)
        .args(["setup-node", "--host-root"])
        .arg(&host)
        .args(install)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/etc/vramgate/config.toml"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), own);
    // Refused before anything changed.
    assert!(!host.join("usr/local/lib/vramgate").exists());
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        original
    );
}
