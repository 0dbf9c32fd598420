//! The tool's command line: `testnode up | down | status | kubelet stop|start`. A test binary
//! that starts the node itself re-runs itself as this tool ([`run_if_requested`]), so the node
//! it starts is the one a developer's `testnode up` starts, built from the same commit.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};

use crate::node::{self, NodeFile, Options, Supervisor, NODE_FILE};
use crate::process::tail;

/// The first argument a test binary is re-run with to act as this tool.
pub const AS_TOOL: &str = "__testnode";
/// Where `testnode up` puts the node without `--dir`: /var/tmp survives between a GPU
/// machine's calls.
pub const DEFAULT_DIR: &str = "/var/tmp/vramgate-testnode";
/// The supervisor's pid, written first thing, for `down` while it is still starting.
pub const SUPERVISOR_PID: &str = "supervisor.pid";
/// How long `up` waits for the node to be Ready (each component has its own, shorter, limit).
const UP_LIMIT: Duration = Duration::from_secs(600);
/// How long `down` waits for the supervisor's teardown.
const DOWN_LIMIT: Duration = Duration::from_secs(300);

#[derive(Parser)]
#[command(
    name = "testnode",
    about = "Start, show and stop the one-node Kubernetes 1.36.3 vramgate's real-node tests use",
    long_about = "Start, show and stop the one-node Kubernetes 1.36.3 (etcd, kube-apiserver, \
                  kube-controller-manager, kube-scheduler, kubelet, containerd 2.1 with vramgate's \
                  runtime handler) that vramgate's real-node tests use. Root only; one node per host. \
                  Point the tests at a running node with VRAMGATE_TESTNODE=<dir>."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the node and return once it is Ready; prints its kubeconfig.
    Up {
        /// The node's directory (made here; removed by `down`).
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// A file with the node's vramgate config beyond its state directory (its inventory);
        /// without it, one simulated 8 GiB GPU. `[inventory]\nbackend = "nvml"` on a GPU host.
        #[arg(long)]
        config_extra: Option<PathBuf>,
        /// Where vramgate, vramgate-hook and vramgate-runtime are [default: beside testnode].
        #[arg(long)]
        vramgate_bin: Option<PathBuf>,
        /// Stay in the foreground as the node's supervisor until SIGTERM or `down`.
        #[arg(long)]
        foreground: bool,
    },
    /// Stop the node and put the host back as it was.
    Down {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
    /// Show the node's paths and state.
    Status {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
    /// Stop or start the node's kubelet (its pods keep running), as a service restart does.
    Kubelet {
        action: KubeletAction,
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum KubeletAction {
    Stop,
    Start,
}

/// In a test binary's `main`: when it was re-run as the tool (`<binary> __testnode ...`), acts
/// as the tool and exits; otherwise returns.
pub fn run_if_requested() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(AS_TOOL.as_ref()) {
        std::process::exit(main(args.collect()));
    }
}

/// The tool, on `args` (without the program name); returns the exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(std::iter::once(OsString::from("testnode")).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("testnode: runs as root (it starts kubelet and containerd)");
        return 1;
    }
    let result = match cli.command {
        Cmd::Up {
            dir,
            config_extra,
            vramgate_bin,
            foreground,
        } => up(&dir, config_extra.as_deref(), vramgate_bin, foreground),
        Cmd::Down { dir } => down(&dir),
        Cmd::Status { dir } => status(&dir),
        Cmd::Kubelet { action, dir } => kubelet(&dir, action),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("testnode: {e}");
            1
        }
    }
}

fn up(dir: &Path, config_extra: Option<&Path>, vramgate_bin: Option<PathBuf>, foreground: bool) -> Result<(), String> {
    let vramgate_bin = match vramgate_bin {
        Some(dir) => dir,
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf))
            .ok_or("cannot tell where testnode is: pass --vramgate-bin")?,
    };
    node::check_vramgate_bin(&vramgate_bin)?;
    let config_extra = match config_extra {
        Some(file) => std::fs::read_to_string(file).map_err(|e| format!("--config-extra {}: {e}", file.display()))?,
        None => node::default_config_extra(),
    };
    if foreground {
        return supervise(Options {
            dir: dir.to_path_buf(),
            config_extra,
            vramgate_bin,
        });
    }
    if dir.exists() {
        return Err(format!(
            "{} exists: a node is up there (`testnode down --dir {0}`), or remove it",
            dir.display()
        ));
    }
    let log = dir.with_extension("log");
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let extra_file = dir.with_extension("config-extra.toml");
    std::fs::write(&extra_file, &config_extra).map_err(|e| format!("{}: {e}", extra_file.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find testnode itself: {e}"))?;
    let mut cmd = Command::new(exe);
    if std::env::args_os().nth(1).as_deref() == Some(AS_TOOL.as_ref()) {
        cmd.arg(AS_TOOL);
    }
    cmd.args(["up", "--foreground", "--dir"])
        .arg(dir)
        .arg("--config-extra")
        .arg(&extra_file)
        .arg("--vramgate-bin")
        .arg(&vramgate_bin)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file);
    // SAFETY: setsid is async-signal-safe: the supervisor outlives this shell's session.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting the supervisor: {e}"))?;
    let started = Instant::now();
    loop {
        if let Ok(info) = NodeFile::read(dir) {
            println!("node {} is Ready ({:?})", info.node, started.elapsed());
            println!("export KUBECONFIG={}", info.kubeconfig.display());
            println!("export VRAMGATE_TESTNODE={}", dir.display());
            println!("kubectl:  {}", info.kubernetes_bin.join("kubectl").display());
            println!("log:      {}", log.display());
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the node did not come up ({status})\n{}", tail(&log, 30)));
        }
        if started.elapsed() > UP_LIMIT {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            return Err(format!(
                "the node was not Ready within {UP_LIMIT:?}: stopping it\n{}",
                tail(&log, 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The supervisor: a panic anywhere (a component that does not come up) but in a `second up`
/// (which stops the second node alone and answers why) tears down what
/// started and ends the process with one line.
fn supervise(options: Options) -> Result<(), String> {
    std::fs::create_dir_all(&options.dir).map_err(|e| format!("{}: {e}", options.dir.display()))?;
    if options.dir.join(NODE_FILE).exists() {
        return Err(format!("{} holds a node already", options.dir.display()));
    }
    std::fs::write(options.dir.join(SUPERVISOR_PID), std::process::id().to_string())
        .map_err(|e| format!("{}: {e}", options.dir.display()))?;
    node::catch_stop_signals();
    let dir = options.dir.clone();
    std::panic::set_hook(Box::new(move |panic| {
        let message = panic
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.payload().downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        eprintln!("testnode: {message}");
        if node::panic_is_caught() {
            return;
        }
        eprintln!("testnode: stopping what started");
        node::teardown(&dir, None, false);
        std::process::exit(1);
    }));
    Supervisor::up(&options).serve();
    Ok(())
}

fn supervisor_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(SUPERVISOR_PID))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let dir = dir.display().to_string();
    String::from_utf8_lossy(&cmdline)
        .split('\0')
        .any(|a| a == dir)
        .then_some(pid)
}

fn down(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Err(format!("no node in {}", dir.display()));
    }
    match supervisor_pid(dir) {
        Some(pid) => {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let started = Instant::now();
            while nix::sys::signal::kill(pid, None).is_ok() {
                if started.elapsed() > DOWN_LIMIT {
                    return Err(format!("the supervisor ({pid}) did not stop within {DOWN_LIMIT:?}"));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        None => {
            // Its supervisor is gone: the node's files say what to stop and put back.
            let _lock = crate::host_before::take_host_lock();
            node::teardown(dir, None, false);
        }
    }
    if dir.exists() {
        return Err(format!("{} is still there", dir.display()));
    }
    let _ = std::fs::remove_file(dir.with_extension("config-extra.toml"));
    println!("node in {} stopped", dir.display());
    Ok(())
}

fn status(dir: &Path) -> Result<(), String> {
    let info = NodeFile::read(dir)?;
    let alive = supervisor_pid(dir).is_some();
    println!(
        "node:            {} (Kubernetes {})",
        info.node, info.kubernetes_version
    );
    println!(
        "supervisor:      {} {}",
        info.supervisor_pid,
        if alive {
            "running"
        } else {
            "gone (testnode down cleans up)"
        }
    );
    println!("kubeconfig:      {}", info.kubeconfig.display());
    println!("api server:      {}", info.api_server);
    println!("kubectl:         {}", info.kubernetes_bin.join("kubectl").display());
    println!("vramgate config: {}", info.vramgate_config.display());
    println!("containerd:      {}", info.containerd.address.display());
    println!("logs:            {}", info.logs.display());
    let out = info
        .kube()
        .kubectl(&["get", "nodes", "-o", "wide", "--request-timeout=10s"])
        .output()
        .map_err(|e| e.to_string())?;
    print!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn kubelet(dir: &Path, action: KubeletAction) -> Result<(), String> {
    let info = NodeFile::read(dir)?;
    let request = match action {
        KubeletAction::Stop => "kubelet stop",
        KubeletAction::Start => "kubelet start",
    };
    node::control(&info.control_socket, request, Duration::from_secs(60)).map(|_| ())
}
