//! `vramgate setup-node`, the Helm chart's node set-up, run as the DaemonSet runs it: the
//! built binary against a host root (here a private directory standing for the host's `/`,
//! mounted at `/host` in the pod), with a real containerd 2.1 reading the config in it. It
//! copies the hook and the wrapper into the host, sets containerd up with the same plan as
//! `vramgate setup containerd`, restarts containerd (SIGHUP to the process serving its
//! socket; the test plays the service manager that starts it again), and on SIGTERM puts the
//! host back byte-for-byte and restarts containerd once more.

use crate::support;
use crate::support::cri as cri_support;
use crate::support::host;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use cri_support::*;
use host::*;
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

/// A set-up run on `host` after an earlier one was cut short: it says it finishes what that run
/// left, sets the node up, and exits 0 on SIGTERM, its undo done.
fn finishes_an_earlier_run_then_sets_up_and_undoes(config: &Path, host: &Path) {
    let mut node = Node::spawn(config, host, &["--restart", "none"]);
    node.wait_for("node set up");
    assert!(
        node.seen.iter().any(|l| l.contains("was left by an earlier run")),
        "{:#?}",
        node.seen
    );
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
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
    finishes_an_earlier_run_then_sets_up_and_undoes(&config, &host);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    // All it leaves is the ledger's directory (config.toml's default state_dir), which the
    // chart's pods mount and a node without the package lacks: root's alone, kept on undo
    // for the containers still running.
    let mut kept = before.clone();
    // The node's set-up lock lives there too.
    kept.extend(["run", "run/vramgate", "run/vramgate/node-setup.lock"].map(PathBuf::from));
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
    kept.extend(
        [
            "var",
            "var/lib",
            "var/lib/vg-chart-state",
            "var/lib/vg-chart-state/node-setup.lock",
        ]
        .map(PathBuf::from),
    );
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

fn stat(path: &Path) -> (u64, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.ino(), m.uid(), m.mode() & 0o7777)
}

/// A run of setup-node that is expected to end by itself (a refusal): one that sets up instead
/// would wait for SIGTERM, so it is killed after [`WAIT`] and the test fails saying so.
fn setup_node(config: &Path, host: &Path, args: &[&str]) -> std::process::Output {
    let child = Command::new(VRAMGATE)
        .env("VRAMGATE_CONFIG", config)
        .arg("setup-node")
        .arg("--host-root")
        .arg(host)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(WAIT) {
        Ok(out) => out,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let out = rx.recv().unwrap();
            panic!(
                "setup-node {args:?} did not end within {WAIT:?} (it set the node up?): {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

const V3_RUNC: &str = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]";

/// The host's config as containerd reads it, from the pod: imports and drop-ins resolved in
/// the host root (absolute and relative, globs, nested), never in the container's own /etc
/// (which here is this machine's, without any of them). The vramgate runtime takes the host
/// runc's options, SystemdCgroup above all, and `containerd config dump` of the host (the
/// host's containerd 2.1, chrooted, as setup-node itself runs it) shows both handlers.
#[test]
fn setup_node_reads_the_hosts_imports_and_drop_ins_in_the_host_root() {
    let (tmp, host, _) = quiet_host("vramgate-setup-node-imports");
    let config = tmp.path().join("config.toml");
    let etc = host.join("etc/containerd");
    for dir in ["conf.d", "site", "extra"] {
        std::fs::create_dir_all(etc.join(dir)).unwrap();
    }
    let main = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\", \"site/base.toml\"]\n";
    std::fs::write(etc.join("config.toml"), main).unwrap();
    std::fs::write(
        etc.join("conf.d/10-cgroup.toml"),
        format!("version = 3\n{V3_RUNC}\n  SystemdCgroup = true\n"),
    )
    .unwrap();
    std::fs::write(
        etc.join("site/base.toml"),
        "version = 3\nimports = [\"../extra/*.toml\"]\n",
    )
    .unwrap();
    std::fs::write(
        etc.join("extra/20-root.toml"),
        format!("version = 3\n{V3_RUNC}\n  Root = \"/run/host-runc\"\n"),
    )
    .unwrap();
    give_program(&host, &Containerd::Two.binary(), Path::new("/usr/bin/containerd"));
    let mut node = Node::spawn(&config, &host, &["--restart", "none"]);
    node.wait_for("node set up");
    assert!(
        node.seen
            .iter()
            .any(|l| l.contains("config dump`, run chrooted into the host root")),
        "{:#?}",
        node.seen
    );
    // The glob already covers the drop-in: the main config is not touched.
    assert_eq!(std::fs::read_to_string(etc.join("config.toml")).unwrap(), main);
    let dump = host_dump(&host);
    let runtimes = &dump["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"];
    let ours = &runtimes["vramgate"]["options"];
    assert_eq!(ours["SystemdCgroup"].as_bool(), Some(true), "{runtimes}");
    assert_eq!(ours["Root"].as_str(), Some("/run/host-runc"), "{runtimes}");
    assert_eq!(
        ours["BinaryName"].as_str(),
        Some("/usr/local/lib/vramgate/vramgate-runtime")
    );
    assert_eq!(runtimes["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    let dump = host_dump(&host);
    assert!(
        dump["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
            .get("vramgate")
            .is_none()
    );
    assert!(!etc.join("conf.d/vramgate.toml").exists());
}

/// While vramgate is installed, NVIDIA's toolkit (written here as its drop-in mode writes)
/// adds its runtime to the main config and a drop-in with a copy of the whole section,
/// vramgate's runtime included. The undo takes out vramgate's import entry, its drop-in and its
/// runtime in the toolkit's copy, and leaves every other byte: the toolkit's runtime, its
/// import, its file; the main config keeps its inode, owner and mode.
#[test]
fn setup_node_undo_takes_out_only_its_own_part() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-surgical");
    let config = tmp.path().join("config.toml");
    let main = host.join("etc/containerd/config.toml");
    nix::unistd::chown(
        &main,
        Some(nix::unistd::Uid::from_raw(1234)),
        Some(nix::unistd::Gid::from_raw(1234)),
    )
    .unwrap();
    std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o640)).unwrap();
    let before = stat(&main);
    let mut node = Node::spawn(&config, &host, &["--restart", "none"]);
    node.wait_for("node set up");
    assert_eq!(stat(&main), before, "set up in place");
    let set_up = std::fs::read_to_string(&main).unwrap();
    let nvidia_runtime = "\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n";
    let with_toolkit = set_up.replacen(
        "imports = [",
        "imports = [\"/etc/containerd/conf.d/99-nvidia.toml\", ",
        1,
    ) + nvidia_runtime;
    std::fs::write(&main, &with_toolkit).unwrap();
    let toolkit_part = "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\"\n";
    let copy = format!("{toolkit_part}\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.vramgate]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.vramgate.options]\n  BinaryName = \"/usr/local/lib/vramgate/vramgate-runtime\"\n");
    let toolkit = host.join("etc/containerd/conf.d/99-nvidia.toml");
    std::fs::write(&toolkit, &copy).unwrap();
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    assert_eq!(
        std::fs::read_to_string(&main).unwrap(),
        original.replacen(
            "version = 3\n",
            "version = 3\n# added by `vramgate setup containerd`; `--remove` takes this line and the next out\nimports = [\"/etc/containerd/conf.d/99-nvidia.toml\"]\n",
            1
        ) + nvidia_runtime,
        "{:#?}",
        node.seen
    );
    assert_eq!(stat(&main), before, "undone in place");
    assert_eq!(std::fs::read_to_string(&toolkit).unwrap(), toolkit_part);
    assert!(!host.join("etc/containerd/conf.d/vramgate.toml").exists());
    assert!(
        node.seen
            .iter()
            .any(|l| l.contains("took the runtime vramgate out of /etc/containerd/conf.d/99-nvidia.toml")),
        "{:#?}",
        node.seen
    );
}

/// A part of vramgate's that someone else changed is left, with a line; a step that fails does
/// not stop the others: the undo does the rest, ends non-zero naming what it left, and records
/// it for the next run.
#[test]
fn setup_node_leaves_what_others_changed_and_an_undo_that_fails_does_the_rest() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-left");
    let config = tmp.path().join("config.toml");
    let main = host.join("etc/containerd/config.toml");
    let drop_in = host.join("etc/containerd/conf.d/vramgate.toml");
    let backup = host.join("etc/containerd/config.toml.vramgate-backup");
    let installed = host.join("usr/local/lib/vramgate");

    let mut node = Node::spawn(&config, &host, &["--restart", "none"]);
    node.wait_for("node set up");
    let edited = std::fs::read_to_string(&drop_in).unwrap() + "# tuned by the admin\n";
    std::fs::write(&drop_in, &edited).unwrap();
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    assert_eq!(std::fs::read_to_string(&drop_in).unwrap(), edited);
    assert!(
        node.seen
            .iter()
            .any(|l| l.starts_with("left /etc/containerd/conf.d/vramgate.toml: it changed since vramgate wrote it")),
        "{:#?}",
        node.seen
    );
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    // The node now has a runtime vramgate the set-up did not put there: refused, one line,
    // nothing left behind but the set-up's lock in the ledger's directory.
    let before = tree(&host);
    let out = setup_node(&config, &host, &["--restart", "none"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("containerd already has vramgate's runtime in /etc/containerd/conf.d/vramgate.toml"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    assert_eq!(tree(&host), before);
    std::fs::remove_file(&drop_in).unwrap();

    // The backup made unreadable (a directory in its place): that step fails, the others run.
    let mut node = Node::spawn(&config, &host, &["--restart", "none"]);
    node.wait_for("node set up");
    std::fs::remove_file(&backup).unwrap();
    std::fs::create_dir(&backup).unwrap();
    node.signal(nix::sys::signal::Signal::SIGTERM);
    let status = node.wait_exit();
    assert!(!status.success(), "{:#?}", node.seen);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    assert!(!drop_in.exists());
    assert!(!installed.join("vramgate-runtime").exists());
    let state: Value = serde_json::from_slice(&std::fs::read(installed.join("node-setup.json")).unwrap()).unwrap();
    assert_eq!(state["parts"].as_array().unwrap().len(), 1, "{state}");
    assert_eq!(state["parts"][0]["path"], "/etc/containerd/config.toml.vramgate-backup");
    // Fixed by hand, the next run finishes it first, then sets up and undoes cleanly.
    std::fs::remove_dir(&backup).unwrap();
    finishes_an_earlier_run_then_sets_up_and_undoes(&config, &host);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
    assert!(!installed.exists());
}

/// An install directory that was there before is left as found (no lock, no state file); a
/// second set-up of another install directory on the node is refused at once, in one line.
#[test]
fn setup_node_leaves_a_pre_existing_install_dir_as_found_and_one_node_has_one_set_up() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-dir");
    let config = tmp.path().join("config.toml");
    let opt = host.join("opt/vramgate");
    std::fs::create_dir_all(&opt).unwrap();
    std::fs::write(opt.join("README"), "the admin's\n").unwrap();
    let mut node = Node::spawn(&config, &host, &["--restart", "none", "--install-dir", "/opt/vramgate"]);
    node.wait_for("node set up");
    assert!(opt.join("vramgate-runtime").is_file());
    // Another release's set-up (the default install dir) is refused without waiting.
    let started = Instant::now();
    let out = setup_node(&config, &host, &["--restart", "none", "--wait", "30"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("already set up by another `vramgate setup-node` (install dir /opt/vramgate"),
        "{stderr}"
    );
    assert!(!host.join("usr/local/lib/vramgate").exists());
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    assert_eq!(tree(&opt), [PathBuf::from("README")]);
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        original
    );
}

/// containerd 1.x's config (version 2, here 1.7's own default config): the runtime is added by
/// key to the main config in place, `containerd config dump` of the host's 1.7 shows it beside
/// runc, and the undo gives the file back byte for byte.
#[test]
fn setup_node_on_containerd_1_7_adds_its_runtime_by_key_and_gives_the_file_back() {
    let (tmp, host, _) = quiet_host("vramgate-setup-node-v2");
    let config = tmp.path().join("config.toml");
    give_program(&host, &Containerd::Seven.binary(), Path::new("/usr/bin/containerd"));
    let main = host.join("etc/containerd/config.toml");
    // As containerd prints it, its last line ended (run_ok trims).
    let default = run_ok(
        Command::new("chroot")
            .arg(&host)
            .args(["/usr/bin/containerd", "config", "default"]),
    ) + "\n";
    std::fs::write(&main, &default).unwrap();
    let before = stat(&main);
    let mut node = Node::spawn(&config, &host, &["--restart", "none"]);
    node.wait_for("node set up");
    assert_eq!(stat(&main), before);
    assert!(!host.join("etc/containerd/conf.d/vramgate.toml").exists());
    let dump = host_dump(&host);
    let runtimes = &dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    assert_eq!(
        runtimes["vramgate"]["options"]["BinaryName"].as_str(),
        Some("/usr/local/lib/vramgate/vramgate-runtime"),
        "{runtimes}"
    );
    assert!(runtimes["runc"].is_table(), "{runtimes}");
    node.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(node.wait_exit().success(), "{:#?}", node.seen);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), default);
    assert_eq!(stat(&main), before);
}

/// A state file an older release left (files with their bytes before, no parts): its undo
/// takes vramgate's import out of the main config and keeps what was added to it since.
#[test]
fn setup_node_finishes_an_older_releases_state_without_losing_what_others_added() {
    let (tmp, host, original) = quiet_host("vramgate-setup-node-legacy");
    let config = tmp.path().join("config.toml");
    let main = host.join("etc/containerd/config.toml");
    let installed = host.join("usr/local/lib/vramgate");
    std::fs::create_dir_all(host.join("etc/containerd/conf.d")).unwrap();
    std::fs::create_dir_all(&installed).unwrap();
    // What the older release did: the import and its drop-in, then the toolkit added a line.
    let import = "# added by `vramgate setup containerd`; `--remove` takes this line and the next out\nimports = [\"/etc/containerd/conf.d/vramgate.toml\"]\n";
    let later = "# added by NVIDIA's toolkit meanwhile\n";
    std::fs::write(
        &main,
        original.replacen("version = 3\n", &format!("version = 3\n{import}"), 1) + later,
    )
    .unwrap();
    std::fs::write(host.join("etc/containerd/conf.d/vramgate.toml"), "version = 3\n").unwrap();
    std::fs::write(installed.join("vramgate-runtime"), "old").unwrap();
    let state = serde_json::json!({
        "files": [
            {"path": "/etc/containerd/conf.d/vramgate.toml", "before": null},
            {"path": "/etc/containerd/config.toml", "before": original.as_bytes()},
        ],
        "binaries": ["/usr/local/lib/vramgate/vramgate-runtime"],
        "dirs": ["/etc/containerd/conf.d"],
        "created_dir": true,
        "restarted": false,
        "restart": "none",
        "engine_socket": "/run/containerd/containerd.sock",
    });
    std::fs::write(installed.join("node-setup.json"), state.to_string()).unwrap();
    finishes_an_earlier_run_then_sets_up_and_undoes(&config, &host);
    assert_eq!(std::fs::read_to_string(&main).unwrap(), original.clone() + later);
    assert!(!installed.exists());
}

/// A containerd started with SIGHUP ignored (under nohup) cannot be restarted by setup-node's
/// signal: refused at once, in one line, before anything changes.
#[test]
fn setup_node_refuses_at_once_an_engine_that_ignores_sighup() {
    use std::os::unix::process::CommandExt;
    require("containerd");
    let (tmp, host, original) = quiet_host("vramgate-setup-node-nohup");
    let config = tmp.path().join("config.toml");
    let dir = host.join("containerd");
    std::fs::create_dir_all(&dir).unwrap();
    let ctd_config = dir.join("config.toml");
    std::fs::write(
        &ctd_config,
        "version = 3\ndisabled_plugins = [\"io.containerd.nri.v1.nri\", \"io.containerd.grpc.v1.cri\"]\n",
    )
    .unwrap();
    let mut cmd = daemon(Containerd::Two.binary());
    // SAFETY: signal() is async-signal-safe; this runs after `daemon`'s reset, as nohup would.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::signal(nix::sys::signal::Signal::SIGHUP, nix::sys::signal::SigHandler::SigIgn)
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    let socket = dir.join("containerd.sock");
    let mut containerd = cmd
        .arg("--config")
        .arg(&ctd_config)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--address")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("containerd serves its socket", Duration::from_secs(30), || {
        (socket.exists(), ())
    });
    let before = tree(&host);
    let started = Instant::now();
    let out = setup_node(&config, &host, &["--engine-socket", "/containerd/containerd.sock"]);
    let _ = containerd.kill();
    let _ = containerd.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ignores SIGHUP"), "{stderr}");
    let mut after = tree(&host);
    after.retain(|p| !p.starts_with("containerd"));
    let mut expected = before;
    expected.retain(|p| !p.starts_with("containerd"));
    assert_eq!(after, expected);
    assert_eq!(
        std::fs::read_to_string(host.join("etc/containerd/config.toml")).unwrap(),
        original
    );
}
