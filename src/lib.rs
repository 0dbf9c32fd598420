//! vramgate: GPU memory (VRAM) admission control for containers.
//!
//! A container declares the VRAM it needs; vramgate reserves it in a file-locked ledger before
//! the container starts, and refuses (or queues) the start when the GPU cannot hold it.
//!
//! At the centre is the reservation [`service`], the one place that decides: it admits a
//! request (the admission rule, the queue, and placement on the GPUs for `auto`), releases,
//! cancels and reclaims, each as one locked transaction on the ledger, and its snapshot is the
//! one view of the node that `vramgate status`, the metrics, the device plugin and the DRA
//! driver read. It is given the inventory, a clock and a liveness check as traits, so its
//! decisions run in unit tests on fakes, and it returns outcomes as data
//! ([`service::Admission`], [`service::Refusal`]); every way in (the OCI hook, the runtime
//! wrapper, the CLI, the kubelet plugins, replay) only turns its input into a request and the
//! outcome into its output.
//!
//! A request takes this path: [`spec`] reads what the runtime hands over, [`request`] turns it
//! into a request, [`inventory`] says what the GPUs hold, [`ledger`] keeps the reservations,
//! [`admission`] decides on the GPUs' numbers; [`hook`] (at each stage of the container) and
//! [`runtime`] (the runc wrapper, at `create`) put the request to the service and act on its
//! answer.

pub mod admission;
pub mod atomic_file;
pub mod attribution;
pub mod cdi_files;
pub mod clock;
pub mod config;
pub mod counters;
// The Kubernetes device plugin, behind the `device-plugin` feature (on by default): it brings
// tokio and tonic, which the hook and the runtime wrapper never link.
pub mod device_rules;
#[cfg(feature = "device-plugin")]
pub mod deviceplugin;
pub mod doctor;
pub mod dra;
pub mod enforce;
pub mod events;
pub mod hook;
pub mod inventory;
// What the two kubelet plugins share (sockets, the view thread, its watchdog), behind the
// same feature as the device plugin, which the DRA driver's feature includes.
#[cfg(feature = "device-plugin")]
pub mod kubelet;
pub mod ledger;
pub mod metrics;
pub mod over_use;
pub mod placement;
pub mod pod_notice;
pub mod privilege;
pub mod procfs;
pub mod quantity;
pub mod queue_order;
pub mod replay;
pub mod request;
pub mod runtime;
pub mod service;
pub mod setup;
pub mod spec;
pub mod status;
pub mod tier;

// The edge, behind the `cli` feature (on by default): the binaries' argument definitions and
// the exporter. They bring clap, anyhow and an HTTP server; nothing above uses them, so a crate
// that embeds the decisions builds without them (`--no-default-features`). The demo and the
// scratch hosts the tests and the benches run on are not here: they are the crate
// `vramgate-testbed` (testbed/), which the shipped binaries never link.
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod exporter;

/// Makes a message from a parser one line: control characters (a newline inside an unknown
/// key that serde or toml quotes verbatim) are escaped. A hook's error is one line on the
/// runtime's output, and a raw newline there could forge a second, fake message.
pub(crate) fn one_line(message: &str) -> String {
    message
        .chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
}
