//! The Kubernetes device plugin: kubelet's scheduler-facing view of vramgate's GPU memory.
//!
//! Without it the scheduler places pods by `nvidia.com/gpu` and knows nothing of memory; a
//! node then admits or queues what it was sent. With it, each GPU node advertises its GPU
//! memory as an extended resource, and the scheduler places a pod where its memory is free.
//!
//! **Resource and units.** One resource per node, `vramgate.dev/gpu-memory-<unit>`, counted
//! in units whose size is in the name: `vramgate.dev/gpu-memory-gib` for 1 GiB (the default),
//! `vramgate.dev/gpu-memory-512mib` for 512 MiB (`--unit`, see [`Unit`]). Each GPU (or MIG
//! device: each memory domain the inventory lists) has `floor(total / unit)` units, whose
//! device IDs name it: `<GPU-uuid>/<n>`, n from 0. So a node's capacity is its GPU memory.
//!
//! **Health is what is really free.** Kubelet counts a unit allocated to a running pod as
//! healthy and in use; a unit is reported unhealthy only when memory is held by someone
//! kubelet does not know: reservations of containers started outside Kubernetes (or inside
//! it without this plugin), memory used outside vramgate (the driver, a process without a
//! reservation), the headroom, or a GPU that is gone. Per GPU:
//!
//! ```text
//! healthy units = floor((available + held by this plugin's containers) / unit)
//!               = floor((total - headroom - used outside vramgate - reserved by others) / unit)
//! ```
//!
//! where `available` is [`crate::admission::GpuAccount::available`], the admission rule's own
//! limit on the live ledger, so the scheduler and the node's admission never disagree on a
//! GPU's numbers. The rest of the GPU's units are unhealthy, and allocatable drops. Which
//! units carry the health: those in use by the plugin's containers first (so kubelet never
//! sees its own allocations fall sick for someone else's memory), then the lowest numbers.
//! The view is recomputed when the ledger is replaced or the config file changes (inotify:
//! a static inventory's `used_outside` is in the config) and at least every poll interval
//! (memory used outside vramgate on an NVML host shows only there), and streamed to kubelet
//! at once when it changed. A refresh that has not returned for
//! [`crate::kubelet::watchdog::stale_after`] the poll interval makes every unit unhealthy until one does.
//!
//! **Telling the plugin's containers apart.** `Allocate` gives each container the env
//! [`DEVICE_IDS_ENV`] with the IDs it was granted. A reservation in the ledger is this
//! plugin's when the spec in its bundle (`<bundle>/config.json`, which the ledger records and
//! which exists while the container does) carries that env, every ID names the GPU the
//! reservation is on, their units add up to exactly what it reserved there, and every ID was
//! handed out: listed in kubelet's checkpoint ([`checkpoint`]) or granted by this process.
//! Any container can set the env; anything else counts as memory held by others, and a unit
//! two markers name counts once. A positive answer is cached per reservation, so a bundle
//! is read once. IDs granted by `Allocate` whose container has not reserved yet (an image
//! still pulling) count as in use for [`GRANT_GRACE`], so their health is kept for them.
//!
//! **Allocate** returns, for a container's units (all on one GPU; units on several GPUs are
//! refused with `InvalidArgument` naming them): the envs `VRAMGATE_MEMORY` (units × unit,
//! e.g. `4Gi`), `VRAMGATE_GPUS` and `NVIDIA_VISIBLE_DEVICES` (the GPU's UUID), and
//! [`DEVICE_IDS_ENV`]; and the container annotations `vramgate.dev/memory` and
//! `vramgate.dev/gpus` with the same values, which containerd passes through (`vramgate setup
//! containerd` lets `vramgate.dev/*` through) and which win over a pod annotation of the same
//! name. The node's runtime wrapper or hook then reserves exactly that on that GPU.
//!
//! **GetPreferredAllocation** takes all of a container's units from one GPU: among the GPUs
//! where kubelet has enough free units, the one [`crate::placement::choose`] picks on the
//! live ledger ([`crate::admission::account`]), as `vramgate-runtime` would place `auto`.
//!
//! **Registration.** The plugin serves `DevicePlugin` on `<dir>/vramgate-gpu-memory-<unit>.sock`
//! and registers with kubelet's `Registration` service on `<dir>/kubelet.sock`. A restarted
//! kubelet removes the sockets in the directory and creates a new `kubelet.sock`: the plugin
//! watches the directory (inotify) and then serves on a new socket and registers again.
//!
//! **DRA.** With Kubernetes 1.34 or later, [`crate::dra`] lets a claim ask for an amount of
//! memory on one GPU directly, chosen by the scheduler from the published ResourceSlices. It
//! computes each GPU's capacity by the same rule as the healthy units here (what the
//! admission rule leaves available, plus what its own claims hold), from the service snapshot
//! `vramgate status` reads. Run one or the other on a node.

pub mod allocate;
pub mod api;
pub mod checkpoint;
pub mod origin;
pub mod refresh;
pub mod server;
pub mod unit;
pub mod unit_view;

use std::path::PathBuf;
use std::time::Duration;

pub use allocate::{AllocateError, Grants};
pub use unit::{DeviceId, Unit, UnitError};
pub use unit_view::NodeView;

/// The device plugin API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// Where kubelet looks for device plugins' sockets, and keeps its own registration socket.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// kubelet's registration socket in that directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The env that marks a container as allocated through this plugin: the granted device IDs,
/// comma-separated.
pub const DEVICE_IDS_ENV: &str = "VRAMGATE_DEVICE_IDS";
/// The domain of the resource name.
pub const RESOURCE_DOMAIN: &str = "vramgate.dev";
/// Device health as kubelet spells it (pkg/kubelet/apis/deviceplugin constants).
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// Default of `--poll-interval`: how often the view is recomputed when no file changed.
/// Ledger and config changes are seen at once; memory used outside vramgate on an NVML host
/// only at a poll, so this bounds how late the scheduler hears of it.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How long units granted by `Allocate` count as in use before their container reserves.
pub const GRANT_GRACE: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    #[error(transparent)]
    Unit(#[from] UnitError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error(transparent)]
    Service(#[from] crate::service::ServiceError),
    #[error(transparent)]
    CgroupView(#[from] crate::attribution::ForeignCgroupView),
    #[error("device plugin directory {path}: {source}")]
    PluginDir { path: PathBuf, source: std::io::Error },
    #[error("cannot serve the device plugin on {socket}: {message}")]
    Serve { socket: PathBuf, message: String },
    #[error("kubelet at {socket} refused the registration of {resource}: {message}")]
    Register {
        socket: PathBuf,
        resource: String,
        message: String,
    },
    #[error("state directory {path} does not exist: run the plugin where vramgate's hook keeps its ledger (the package creates /run/vramgate at boot; a DaemonSet must mount the host's state_dir at the same path)")]
    NoStateDir { path: PathBuf },
    #[error(transparent)]
    Watch(#[from] crate::kubelet::WatchError),
    #[error("cannot start the device plugin's async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    FirstView(#[from] crate::kubelet::watchdog::FirstViewError),
}

pub type Result<T> = std::result::Result<T, DevicePluginError>;

impl From<crate::kubelet::view_thread::StartError<DevicePluginError>> for DevicePluginError {
    fn from(e: crate::kubelet::view_thread::StartError<DevicePluginError>) -> Self {
        use crate::kubelet::view_thread::StartError;
        match e {
            StartError::Open(e) => e,
            StartError::Thread(e) => DevicePluginError::Runtime(e),
            StartError::FirstView(e) => DevicePluginError::FirstView(e),
        }
    }
}

/// How the plugin runs: what the binary's flags say.
#[derive(Debug, Clone)]
pub struct Options {
    pub config_path: PathBuf,
    /// kubelet's device plugin directory (its socket and ours).
    pub plugin_dir: PathBuf,
    pub unit: Unit,
    pub poll_interval: Duration,
    /// How long to wait for the first view before ending (`--startup-timeout`).
    pub startup_timeout: Duration,
    /// Where the GPUs' device nodes are (`/dev`): Allocate hands a container its GPU's.
    pub dev_dir: PathBuf,
}
