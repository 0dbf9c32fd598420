//! vramgate: GPU memory (VRAM) admission control for containers.
//!
//! A container declares the VRAM it needs; an OCI hook reserves it in a file-locked ledger
//! before the container starts, and refuses (or queues) the start when the GPU cannot hold it.
//! The modules follow that path: [`spec`] reads what the runtime hands over, [`request`] turns
//! it into a request, [`inventory`] says what the GPUs hold, [`ledger`] keeps the
//! reservations, [`admission`] decides, and [`hook`] ties them together at each stage.

pub mod admission;
pub mod atomic_file;
pub mod attribution;
pub mod config;
pub mod counters;
pub mod doctor;
pub mod events;
pub mod exporter;
pub mod hook;
pub mod inventory;
pub mod ledger;
pub mod metrics;
pub mod privilege;
pub mod procfs;
pub mod quantity;
pub mod request;
pub mod runtime;
pub mod setup;
pub mod spec;
pub mod status;

// Used by the binaries and the tests; they depend on clap and anyhow, which the hook's
// decision logic above never does.
pub mod cli;
pub mod demo;
pub mod testbed;

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
