//! The test node: the one-node Kubernetes 1.36.3 that vramgate's real-node tests
//! (tests/kube_node.rs, tests/kube_helm.rs) are clients of, started and stopped by the tool
//! `testnode` ([`cli`]); and the engines' process plumbing the integration tests share.
//!
//! - [`node`]: the node's supervisor (control plane, containerd, kubelet), its `node.json`,
//!   its control socket and its teardown.
//! - [`kube`]: the cluster as a client sees it (kubectl, waits that show the log at fault).
//! - [`containerd`]: containerd's host configs, private daemons and the node's images.
//! - [`host_before`] and [`host_dirs`]: what the node and the engines change on the host, put back.
//! - [`process`]: daemons started as a service manager starts them, stopped with a grace.
//!
//! Tests panic on failure; so does this crate, with a message that says what to fix. The tool
//! turns a panic into one line and a teardown.

pub mod cli;
pub mod containerd;
pub mod host_before;
pub mod host_dirs;
pub mod kube;
pub mod node;
pub mod process;
