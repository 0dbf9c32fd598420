//! The integration tests, one binary: each module is what used to be a test binary of its own
//! (tests/<name>.rs), and the support code under tests/support compiles once for all of them.
//! They drive the built binaries against the real runc, podman, dockerd, containerd, CRI-O,
//! Prometheus and NVIDIA's toolkit, as each module says. Run one module with
//! `cargo test --release --test it <module>::`. The real one-node Kubernetes scenarios stay
//! binaries of their own (tests/kube_node.rs, tests/kube_helm.rs): each owns a cluster for its
//! whole run and has its own harness.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod concurrency;
mod containerd;
mod crash;
mod cri;
mod crio;
mod default_config;
mod device_plugin;
mod docker;
mod dra_claims;
mod dra_driver;
mod dra_node;
mod enforce_binaries;
mod enforce_driver_limit;
mod fuzz_corpus;
mod helm;
mod hostile_state;
mod large_ledger;
mod layering;
mod ledger_edges;
mod ledger_format;
mod man_pages;
mod manifests;
mod manual;
mod node_image;
mod node_setup;
mod nvidia_toolkit;
mod nvml_abi;
mod nvml_fixtures;
mod packaging;
mod placement;
mod podman;
mod prometheus;
mod queue;
mod race;
mod removal;
mod replay;
mod runc_hook;
mod runtime_argv;
mod runtime_runc;
mod trust_edges;
mod watch_binaries;
