//! Command-line definitions of the binaries, kept in the library so that the man pages and
//! shell completions are generated from the same source the binaries parse with.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

const ABOUT: &str = "GPU memory (VRAM) admission control for containers";

/// The administrator's tool.
#[derive(Debug, Parser)]
#[command(name = "vramgate", version, about = ABOUT, long_about = "vramgate reserves GPU memory for containers before they start, so that containers sharing a GPU cannot run each other out of memory. This tool shows and manages the reservations; the vramgate-hook OCI hook makes them.")]
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
        /// Print JSON for scripts instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Release a container's reservation (and queue ticket) by container id
    Release {
        /// The container id, as the runtime knows it
        container_id: String,
    },
    /// Reclaim reservations and tickets whose processes are gone
    Gc,
    /// Inspect or repair the ledger
    Ledger {
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// Replay the published failure on a simulated GPU with real runc containers
    Demo(DemoArgs),
    /// Wire vramgate into an engine: docker, containerd, podman or crio
    Setup(SetupArgs),
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
    /// The vramgate-runtime binary the engine runs (default: next to this binary, else /usr/bin)
    #[arg(long, value_name = "PATH")]
    pub runtime_path: Option<PathBuf>,
    /// The vramgate-hook binary hooks.d points at (default: next to this binary, else /usr/bin)
    #[arg(long, value_name = "PATH")]
    pub hook_path: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Print the raw ledger JSON
    Show,
    /// Set an unreadable ledger aside (renamed, never deleted) and start an empty one
    Repair,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoPolicy {
    /// Queue containers that do not fit until memory frees up
    Wait,
    /// Refuse containers that do not fit
    Reject,
    /// Run both, one after the other
    Both,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Which policy to demonstrate
    #[arg(long, value_enum, default_value_t = DemoPolicy::Both)]
    pub policy: DemoPolicy,
    /// How many containers start at once
    #[arg(long, default_value_t = 25)]
    pub containers: u32,
    /// What each container requests
    #[arg(long, default_value = "1205Mi")]
    pub memory: String,
    /// How long each container runs, in seconds
    #[arg(long, default_value_t = 3)]
    pub seconds: u32,
    /// The runc binary to use
    #[arg(long, default_value = "runc")]
    pub runc: String,
    /// Directory holding vramgate-hook (default: next to this binary)
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Print the summary as JSON (for tests and scripts)
    #[arg(long)]
    pub json: bool,
    /// Keep the demo's work directory instead of deleting it
    #[arg(long)]
    pub keep: bool,
}

/// The OCI hook. The runtime runs it with the container state on stdin.
#[derive(Debug, Parser)]
#[command(
    name = "vramgate-hook",
    version,
    about = "OCI hook that reserves GPU memory before a container starts and releases it after",
    long_about = "The runtime (runc, crun, podman, CRI-O) runs vramgate-hook at the named stage with the OCI state JSON on stdin. At createRuntime or prestart it reserves the container's VRAM request in the ledger, or refuses the start (exit 1, one line on stderr); at poststop it releases it. A container without a request is left alone."
)]
pub struct HookCli {
    /// The hook stage: createRuntime, prestart, createContainer or poststop
    pub stage: String,
    /// The timeout, in seconds, that the runtime gives this hook; waits end before it
    #[arg(long, value_name = "SECONDS")]
    pub hook_timeout: Option<u64>,
}
