//! Command-line definitions of the binaries, kept in the library so that the man pages and
//! shell completions are generated from the same source the binaries parse with.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

const ABOUT: &str = "GPU memory (VRAM) admission control for containers";

/// Shown after `vramgate --help` and in vramgate(8): the commands an admin types first.
const CLI_EXAMPLES: &str = "\
Examples:
  vramgate status                  GPUs, reservations and the wait queue
  vramgate status --json           the same, for scripts
  vramgate status --watch          the same, redrawn every 2 s until Ctrl-C (-n SECONDS)
  vramgate status team-a/train/gpu one container, by name (namespace/pod/container) or id
  vramgate release 3f2a9c0d1e      release one container's reservation by hand (or by name)
  vramgate gc                      reclaim reservations of containers that are gone
  vramgate metrics                 the same numbers for Prometheus, on stdout
  vramgate exporter                serve them at http://127.0.0.1:9835/metrics
  vramgate replay events.jsonl --gpus 2x141Gi --compare strategy=best-fit,spread
                                   what-if on the host's own history";

/// Shown after `vramgate-hook --help` and in vramgate-hook(8).
const HOOK_EXAMPLES: &str = "\
Engines run it, admins do not. The package installs hooks.d entries for podman and CRI-O
(/usr/share/containers/oci/hooks.d/vramgate-*.json) that run it for containers with the
annotation vramgate.dev/memory; vramgate-runtime adds it to the specs of Docker and containerd.

Exit status: 0 admitted, released, or no request; 1 refused or failed (one line on stderr);
2 usage error.";

/// How often `vramgate status --watch` redraws when no -n is given (as watch(1)).
pub const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// `-n SECONDS`: a decimal number of seconds from 0.1 to 86400, as watch(1) takes it.
pub fn parse_interval(value: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{value:?} is not a number of seconds from 0.1 to 86400 (say -n 2 or -n 0.5)");
    let seconds: f64 = value.trim().parse().map_err(|_| bad())?;
    if !(0.1..=86400.0).contains(&seconds) {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// The administrator's tool.
#[derive(Debug, Parser)]
#[command(
    name = "vramgate",
    version,
    propagate_version = true,
    about = ABOUT,
    long_about = "vramgate reserves GPU memory for containers before they start, so that containers sharing a GPU cannot run each other out of memory. This tool shows and manages the reservations; the vramgate-hook OCI hook makes them.",
    after_help = CLI_EXAMPLES
)]
pub struct Cli {
    /// Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show each GPU's memory, its reservations and its queue
    Status {
        /// Show only this container: its name (`namespace/pod/container` for a pod's, else
        /// `vramgate.dev/name`), its id, or the start of its id (12 characters or more)
        #[arg(value_name = "NAME|ID")]
        container: Option<String>,
        /// Print JSON for scripts instead of a table
        #[arg(long)]
        json: bool,
        /// Redraw every 2 seconds (or every -n) until Ctrl-C: in place on a terminal, one
        /// table after another when piped
        #[arg(long, short = 'w')]
        watch: bool,
        /// Seconds between redraws, as watch(1) (0.1 to 86400; implies --watch)
        #[arg(short = 'n', long = "interval", value_name = "SECONDS", value_parser = parse_interval)]
        interval: Option<std::time::Duration>,
        /// Also write what the inventory answered (GPUs, processes, their pid namespaces) and
        /// the ledger to this file, for test fixtures
        #[arg(long, value_name = "FILE", hide = true)]
        record: Option<PathBuf>,
        /// A note stored in the recording (what was running)
        #[arg(long, requires = "record", hide = true, default_value = "")]
        note: String,
    },
    /// Check the config, the GPU driver (NVML), the state directory, the hook binary and which
    /// container engines are set up to run the hook; changes nothing
    Doctor {
        /// Print JSON for scripts instead of lines
        #[arg(long)]
        json: bool,
    },
    /// Release a container's reservation (and queue ticket) by name or container id
    Release {
        /// The container's name as `vramgate status` shows it, its id as the runtime knows
        /// it, or the start of its id (12 characters or more); a name several containers
        /// hold is refused: give the id
        #[arg(value_name = "NAME|ID")]
        container_id: String,
    },
    /// Reclaim reservations and tickets whose processes are gone
    Gc,
    /// Print Prometheus metrics (GPU memory, reservations, queue, outcome counters), or write
    /// them for node_exporter's textfile collector
    Metrics {
        /// Write DIR/vramgate.prom atomically instead of printing, for node_exporter's
        /// --collector.textfile.directory (run it from a timer)
        #[arg(long, value_name = "DIR")]
        textfile_dir: Option<PathBuf>,
    },
    /// Serve Prometheus metrics over HTTP at /metrics (what `vramgate metrics` prints, taken
    /// at each scrape)
    Exporter {
        /// The address and port to listen on; metrics name containers, so keep it on loopback
        /// or a network only Prometheus reaches
        #[arg(long, value_name = "ADDR", default_value = crate::exporter::DEFAULT_LISTEN)]
        listen: String,
    },
    /// Watch what each reserved container holds on its GPUs and act on one over its
    /// reservation, as [enforce] over_use says: report (an over_use event) or kill (stop the
    /// container). Runs until stopped; the package's vramgate-watch.service runs it
    Watch,
    /// Inspect or repair the ledger
    Ledger {
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// Wire vramgate into an engine: docker, containerd, podman or crio
    Setup(SetupArgs),
    /// Set up the node this runs on from a privileged container with the host's root mounted
    /// (the Helm chart's node set-up DaemonSet): copy vramgate-hook and vramgate-runtime into
    /// the host's /usr/local/lib/vramgate, run `setup containerd` on the host's config, restart
    /// containerd once; then wait, and on SIGTERM or SIGINT put every file back byte-for-byte,
    /// remove the binaries and restart containerd again. A run that finds what a killed one
    /// left undoes it first
    SetupNode(SetupNodeArgs),
    /// Replay a workload (a host's events.jsonl, or a job file) on vramgate's own decision
    /// code, on simulated GPUs and a virtual clock: what other GPUs, a strategy, backfill, a
    /// policy, headroom or exclusive GPUs (one job per GPU) would have done. Settings not given
    /// are the config's
    Replay(ReplayArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// A host's events.jsonl, or a job file: JSON lines with arrival (s), memory ("6Gi"),
    /// duration (s), and optionally gpus ("0", "auto", "auto:2"), policy, timeout (s or "90s"),
    /// expected_duration (what the job declares, s or "90s"), id
    #[arg(value_name = "WORKLOAD")]
    pub workload: PathBuf,
    /// The GPUs to replay on, COUNTxSIZE[,COUNTxSIZE...] (default: the config's
    /// [[inventory.gpus]]; an event log does not record GPU sizes)
    #[arg(long, value_name = "GPUS")]
    pub gpus: Option<String>,
    /// Placement strategy: best-fit or spread
    #[arg(long, value_name = "STRATEGY")]
    pub strategy: Option<String>,
    /// Let requests that fit pass older waiters: true or false
    #[arg(long, value_name = "BOOL")]
    pub backfill: Option<String>,
    /// ...but never one that has waited longer than this ("30s")
    #[arg(long, value_name = "DURATION")]
    pub backfill_bound: Option<String>,
    /// Which waiter that fits goes first: arrival, largest (memory) or longest (the job's
    /// expected_duration, then memory)
    #[arg(long, value_name = "ORDER")]
    pub backfill_order: Option<String>,
    /// Policy for jobs that do not set one: wait or reject
    #[arg(long, value_name = "POLICY")]
    pub policy: Option<String>,
    /// Memory kept free on every GPU ("2Gi", "5%")
    #[arg(long, value_name = "QUANTITY")]
    pub headroom: Option<String>,
    /// How jobs hold GPUs: shared (vramgate: jobs that fit share a GPU) or exclusive (the
    /// baseline without it: one job per whole GPU, as `nvidia.com/gpu: 1` hands them out)
    #[arg(long, value_name = "SHARING")]
    pub sharing: Option<String>,
    /// What jobs declare as their expected duration: given (the job file's expected_duration;
    /// an event log has none) or exact (each job its real duration), for backfill-order longest
    #[arg(long, value_name = "DECLARED")]
    pub declared: Option<String>,
    /// Replay once per value and show them side by side: KEY=V1,V2 with KEY one of gpus,
    /// strategy, backfill, backfill-bound, backfill-order, policy, headroom, sharing, declared (gpus values are separated
    /// by '|'); sharing=exclusive,shared also says how much shorter the shared makespan is
    #[arg(long, value_name = "KEY=V1,V2")]
    pub compare: Option<String>,
    /// Print JSON for scripts instead of a table
    #[arg(long)]
    pub json: bool,
    /// Write the timeline (reserved bytes per GPU and queue length at each event) as CSV
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Write a plot of the first setting's timeline as SVG
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SetupArgs {
    /// The engine to configure
    #[arg(value_enum)]
    pub engine: crate::setup::Engine,
    /// Print what would change, and the new content, without writing anything
    #[arg(long)]
    pub dry_run: bool,
    /// Undo what setup did
    #[arg(long)]
    pub remove: bool,
    /// Make vramgate the engine's default runtime (docker, containerd)
    #[arg(long)]
    pub set_as_default: bool,
    /// The file to edit (docker: daemon.json; containerd: the drop-in) or directory (podman,
    /// crio: hooks.d) instead of the engine's default
    #[arg(long, value_name = "PATH")]
    pub config_path: Option<PathBuf>,
    /// containerd's main config, which must import the drop-in
    #[arg(long, value_name = "PATH", default_value = crate::setup::CONTAINERD_CONFIG)]
    pub containerd_config: PathBuf,
    /// CRI-O's drop-in with the runtime handler vramgate (crio)
    #[arg(long, value_name = "PATH", default_value = crate::setup::CRIO_DROP_IN)]
    pub crio_drop_in: PathBuf,
    /// The vramgate-runtime binary the engine runs (default: next to this binary, else /usr/bin)
    #[arg(long, value_name = "PATH")]
    pub runtime_path: Option<PathBuf>,
    /// The vramgate-hook binary hooks.d points at (default: next to this binary, else /usr/bin)
    #[arg(long, value_name = "PATH")]
    pub hook_path: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SetupNodeArgs {
    /// Where the host's root file system is mounted
    #[arg(long, value_name = "PATH", default_value = "/host")]
    pub host_root: PathBuf,
    /// The engine to set up (containerd only, for now)
    #[arg(long, value_enum, default_value = "containerd")]
    pub engine: NodeEngine,
    /// The engine's main config, as a path on the host
    #[arg(long, value_name = "PATH", default_value = crate::setup::CONTAINERD_CONFIG)]
    pub engine_config: PathBuf,
    /// The engine's socket, as a path on the host: its server is the process signalled
    #[arg(long, value_name = "PATH", default_value = crate::setup::CONTAINERD_SOCKET)]
    pub engine_socket: PathBuf,
    /// containerd's task directory (its --state, then io.containerd.runtime.v2.task), as a path on
    /// the host: the undo keeps the binaries while a container there still runs through them
    #[arg(long, value_name = "PATH", default_value = crate::setup::CONTAINERD_TASKS)]
    pub engine_tasks: PathBuf,
    /// How the engine is restarted: signal (SIGHUP to the process serving its socket, which
    /// ends containerd, and its service manager starts it again; needs the host's PID
    /// namespace) or none (the admin restarts it)
    #[arg(long, value_enum, default_value = "signal")]
    pub restart: crate::setup::RestartMode,
    /// The host directory the binaries are copied to (vramgate's own: it is removed on undo)
    #[arg(long, value_name = "PATH", default_value = crate::setup::NODE_INSTALL_DIR)]
    pub install_dir: PathBuf,
    /// Where the engine sees the host's root (/ unless the engine itself runs in a chroot,
    /// as a test's may)
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub engine_root: PathBuf,
    /// Make vramgate containerd's default runtime
    #[arg(long)]
    pub set_as_default: bool,
    /// A config.toml in this container (the chart's ConfigMap) to install on the host at
    /// --host-config, given back as it was on undo; this set-up then reads it too
    #[arg(long, value_name = "PATH")]
    pub install_config: Option<PathBuf>,
    /// Where the host's hook and runtime read config.toml, as a path on the host
    #[arg(long, value_name = "PATH", default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub host_config: PathBuf,
    /// Seconds to wait for another run's lock, for the engine to come back, and, on undo, for
    /// the containers still running through the copied wrapper to stop
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub wait: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeEngine {
    Containerd,
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Print the raw ledger JSON
    Show,
    /// Set an unreadable ledger aside (renamed, never deleted) and start an empty one
    Repair,
}

/// The OCI hook. The runtime runs it with the container state on stdin.
#[derive(Debug, Parser)]
#[command(
    name = "vramgate-hook",
    version,
    about = "OCI hook that reserves GPU memory before a container starts and releases it after",
    long_about = "The runtime (runc, crun, podman, CRI-O) runs vramgate-hook at the named stage with the OCI state JSON on stdin. At createRuntime or prestart it reserves the container's VRAM request in the ledger, or refuses the start (exit 1, one line on stderr); at poststop it releases it. A container without a request is left alone.",
    after_help = HOOK_EXAMPLES
)]
pub struct HookCli {
    /// The hook stage: createRuntime, prestart, createContainer or poststop
    #[arg(value_name = "STAGE")]
    pub stage: String,
    /// The timeout, in seconds, that the runtime gives this hook; waits end before it
    #[arg(long, value_name = "SECONDS")]
    pub hook_timeout: Option<u64>,
}

/// Shown after `vramgate-device-plugin --help` and in vramgate-device-plugin(8).
const DEVICE_PLUGIN_EXAMPLES: &str = "\
Runs on each GPU node, as root, beside kubelet: the package's systemd unit
(systemctl enable --now vramgate-device-plugin) or the DaemonSet in k8s/device-plugin.yaml.
Pods then ask for GPU memory in units:
  resources: {limits: {vramgate.dev/gpu-memory-gib: 6}}
and the node's vramgate-runtime reserves exactly that on the GPU the plugin chose.

Examples:
  vramgate-device-plugin                    1 GiB units, kubelet's default directory
  vramgate-device-plugin --unit 512Mi       vramgate.dev/gpu-memory-512mib

Exit status: 0 stopped by SIGTERM or SIGINT; 1 failed (one line on stderr), including a
registration kubelet refused; 2 usage error.";

/// The Kubernetes device plugin.
#[derive(Debug, Parser)]
#[command(
    name = "vramgate-device-plugin",
    version,
    about = "Kubernetes device plugin that advertises GPU memory, as vramgate accounts it, to the scheduler",
    long_about = "Registers the resource vramgate.dev/gpu-memory-<unit> with kubelet, lists each GPU's memory in units (device IDs <GPU-uuid>/<n>), and reports as unhealthy the units that memory held outside Kubernetes takes (reservations of other containers, memory used outside vramgate, headroom, a GPU that is gone), within a second of the ledger or the inventory changing. Allocate gives each container VRAMGATE_MEMORY and the GPU's UUID, which vramgate-runtime reserves when the container starts.",
    after_help = DEVICE_PLUGIN_EXAMPLES
)]
pub struct DevicePluginCli {
    /// Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// kubelet's device plugin directory, where kubelet.sock is and the plugin's socket goes
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/device-plugins")]
    pub plugin_dir: PathBuf,
    /// The size of one unit of the resource, which names it: 1Gi is vramgate.dev/gpu-memory-gib,
    /// 512Mi vramgate.dev/gpu-memory-512mib (a whole number of MiB, at least 128Mi)
    #[arg(long, value_name = "SIZE", default_value = "1Gi")]
    pub unit: String,
    /// How often the view is recomputed without a file change (memory used outside vramgate
    /// on an NVML host shows only then); ledger and config changes are seen at once
    #[arg(long, value_name = "DURATION", default_value = "500ms")]
    pub poll_interval: String,
    /// How long the first view may take before the plugin ends with the reason: it opens NVML,
    /// which on a cold multi-GPU host without persistence mode can take minutes. Nothing is
    /// offered until it comes; after it, a view not recomputed for ten poll intervals offers
    /// nothing, whatever this says
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub startup_timeout: String,
}

/// Shown after `vramgate-dra --help` and in vramgate-dra(8).
const DRA_EXAMPLES: &str = "\
Runs on each GPU node, as root, beside kubelet: the DaemonSet in k8s/dra.yaml or the
package's systemd unit (systemctl enable --now vramgate-dra, with NODE_NAME and a kubeconfig
in /etc/default/vramgate-dra). Needs Kubernetes 1.34 or later with consumable capacity
(feature gate DRAConsumableCapacity: beta and on by default from 1.36). Pods then ask for
GPU memory through a ResourceClaim of device class gpu-memory.vramgate.dev:
  exactly: {deviceClassName: gpu-memory.vramgate.dev, capacity: {requests: {memory: 6Gi}}}
and the node's vramgate-runtime reserves exactly what the claim consumed, on its GPU.

Examples:
  vramgate-dra --node-name gpu-node-1       the node's name as the API server knows it
                                            (in a DaemonSet: NODE_NAME from spec.nodeName)
  vramgate-dra --step 1Gi --default-request 4Gi   claims in whole GiB, 4 GiB when they name none

Exit status: 0 stopped by SIGTERM or SIGINT; 1 failed (one line on stderr); 2 usage error.";

/// The Kubernetes DRA driver.
#[derive(Debug, Parser)]
#[command(
    name = "vramgate-dra",
    version,
    about = "Kubernetes DRA driver that publishes each GPU's memory, as vramgate accounts it, for claims to share",
    long_about = "Publishes the node's ResourceSlice for driver gpu-memory.vramgate.dev: one device per GPU (and MIG device) whose memory capacity many claims share (allowMultipleAllocations), lowered by memory held outside Kubernetes (reservations of other containers, memory used outside vramgate, headroom) and republished within a second of the ledger or the inventory changing. Registers with kubelet and prepares each claim as a CDI device that gives its container VRAMGATE_MEMORY (the consumed capacity) and the GPU, which vramgate-runtime reserves and enforces when the container starts.",
    after_help = DRA_EXAMPLES
)]
pub struct DraCli {
    /// Config file to use instead of /etc/vramgate/config.toml (also: VRAMGATE_CONFIG)
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// This node's name, as the API server knows it: the slice's pool and nodeName
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: String,
    /// kubeconfig to reach the API server with (default: $KUBECONFIG, ~/.kube/config, else the
    /// pod's service account)
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// kubelet's plugin registration directory, where the registration socket goes
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/plugins_registry")]
    pub registry_dir: PathBuf,
    /// The driver's directory, where the DRA socket kubelet dials goes
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/kubelet/plugins/gpu-memory.vramgate.dev"
    )]
    pub plugin_dir: PathBuf,
    /// Where the container runtime reads CDI specs; each prepared claim's spec goes here
    #[arg(long, value_name = "DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// vramgate's hook on this host, which each claim's CDI device runs (at createRuntime and
    /// poststop), so that a claim's container reserves whatever runtime handler its pod uses
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/vramgate-hook")]
    pub hook: PathBuf,
    /// Claims consume memory in whole steps from one step up (a whole number of MiB); the
    /// published capacity is rounded down to it
    #[arg(long, value_name = "SIZE", default_value = "256Mi")]
    pub step: String,
    /// What a claim that names no memory consumes (a whole number of steps)
    #[arg(long, value_name = "SIZE", default_value = "1Gi")]
    pub default_request: String,
    /// How often the view is recomputed without a ledger change (memory used outside vramgate
    /// on an NVML host shows only then); ledger and config changes are seen at once
    #[arg(long, value_name = "DURATION", default_value = "500ms")]
    pub poll_interval: String,
    /// How long the first view may take before the driver ends with the reason: it opens NVML,
    /// which on a cold multi-GPU host without persistence mode can take minutes. Nothing is
    /// offered until it comes; after it, a view not recomputed for ten poll intervals offers
    /// nothing, whatever this says
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub startup_timeout: String,
    /// Whether the slice's devices carry binding conditions, so that kube-scheduler binds a
    /// pod only once its claim's memory is reserved on this node, and sends it back to its
    /// queue when the node cannot hold it (Kubernetes 1.36: on by default). kube-scheduler
    /// looks every 5 s, so a pod is bound about 5 s after its allocation; with false it is
    /// bound at once, and the claim is still reserved at allocation (no condition is written
    /// then: nobody waits for one)
    #[arg(long, value_name = "BOOL", default_value = "true", action = clap::ArgAction::Set)]
    pub binding_conditions: bool,
}

/// The device plugin's and the DRA driver's `--poll-interval` and `--startup-timeout`, read
/// and checked. Below 10ms a plugin spends its time querying the driver; above 1s the
/// scheduler hears late of memory used outside vramgate. Below a second of startup even a
/// static inventory's first read could miss it on a loaded node.
pub fn plugin_timings(poll_interval: &str, startup_timeout: &str) -> anyhow::Result<(Duration, Duration)> {
    use anyhow::Context;
    let poll =
        crate::quantity::parse_duration(poll_interval).with_context(|| format!("--poll-interval {poll_interval:?}"))?;
    if poll < Duration::from_millis(10) || poll > Duration::from_secs(1) {
        anyhow::bail!("--poll-interval {poll_interval:?}: must be between 10ms and 1s");
    }
    let startup = crate::quantity::parse_duration(startup_timeout)
        .with_context(|| format!("--startup-timeout {startup_timeout:?}"))?;
    if startup < Duration::from_secs(1) {
        anyhow::bail!("--startup-timeout {startup_timeout:?}: must be at least 1s");
    }
    Ok((poll, startup))
}

/// The line a binary prints for an error that ended it: the error and each cause that its
/// message does not already hold. vramgate's errors carry their cause in their own message
/// (`cannot read config /x: Is a directory`) and also expose it as `source()`, so printing the
/// whole chain would say the cause twice; a context added at the binary edge (`writing /y`)
/// still gets its cause appended.
pub fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    crate::one_line(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_startup_timeout_defaults_to_the_watchdogs_allowance() {
        use crate::kubelet::watchdog::DEFAULT_STARTUP_TIMEOUT;
        let plugin = DevicePluginCli::try_parse_from(["vramgate-device-plugin"]).unwrap();
        let driver = DraCli::try_parse_from(["vramgate-dra", "--node-name", "n"]).unwrap();
        for value in [plugin.startup_timeout, driver.startup_timeout] {
            assert_eq!(
                crate::quantity::parse_duration(&value).unwrap(),
                DEFAULT_STARTUP_TIMEOUT
            );
        }
    }

    #[test]
    fn an_error_line_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::IsADirectory, "Is a directory");
        let config = crate::config::ConfigError::Read {
            path: "/root".into(),
            source: io,
        };
        let e = anyhow::Error::new(config);
        assert_eq!(error_line(&e), "cannot read config /root: Is a directory");
        let e = anyhow::Error::new(std::io::Error::other("disk full")).context("writing /y");
        assert_eq!(error_line(&e), "writing /y: disk full");
    }
}
