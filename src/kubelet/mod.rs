//! What both kubelet plugins stand on: the device plugin ([`crate::deviceplugin`]) and the DRA
//! driver ([`crate::dra`]) each keep only their own API and their own view of the node; the
//! plumbing around them is here, once, so a hung NVML call, a kubelet restart or a signal is
//! handled the same way whichever plugin a cluster runs.
//!
//! - [`view_thread`]: the view thread, recomputing a plugin's view when the ledger or the config
//!   changes ([`file_watch`]) and every poll interval, and handing it to the gRPC side;
//! - [`watchdog`]: a view that stops being recomputed offers nothing, and the first view has
//!   a bounded wait;
//! - [`socket`]: the plugin's unix sockets (replacing a stale one, noticing a removed one,
//!   dialing kubelet's), a gRPC server on each, and the signals that end it;
//! - [`authority`]: the HTTP/2 front of the DRA driver's registration socket, which turns the
//!   socket path kubelet's plugin watcher sends as `:authority` into one h2 takes.

#[cfg(feature = "dra")]
pub mod authority;
pub mod file_watch;
pub mod socket;
pub mod view_thread;
pub mod watchdog;

pub use file_watch::{FileWatch, WatchError};
pub use socket::connect;
