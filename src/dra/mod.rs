//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`) for GPU memory: the
//! `vramgate-dra` kubelet plugin.
//!
//! **Publishing.** Each node publishes one ResourceSlice ([`slice`]), pool = node name: one
//! device per GPU (and per MIG device), named `gpu-<index>` (`gpu-<index>-mig-<n>`), with
//! `allowMultipleAllocations: true` and a `memory` capacity that many claims share. With
//! consumable capacity (KEP-5075, beta and on by default in 1.36) the scheduler keeps each
//! GPU's sum of claims within that capacity and records what each claim consumed. The
//! capacity is what Kubernetes may hold on the GPU, from the same service snapshot `vramgate
//! status` and the metrics read ([`slice_view`]):
//!
//! ```text
//! capacity = floor_step(available + held by this driver's claims)
//!          = floor_step(total - headroom - used outside vramgate - reserved by others)
//! ```
//!
//! as the device plugin computes its healthy units, so memory held outside Kubernetes
//! (containers started outside it, processes without a reservation, the headroom) lowers it.
//! It is recomputed when the ledger is replaced (inotify) and every poll interval, and
//! republished when it changed, with the pool's generation one higher.
//!
//! **Preparing.** kubelet registers the plugin through `pluginregistration.Registration`
//! and calls `NodePrepareResources` ([`plugin`]). For each claim the driver reads it from the
//! API server (uid checked), takes this driver's allocation results ([`resource_claim`]) and
//! writes a CDI spec for it ([`cdi_spec`]), one CDI device per device of the slice (results on
//! one device added up), whose edits set `VRAMGATE_MEMORY` (the consumed capacity, never the request),
//! `VRAMGATE_GPUS` (the device's GPU), the device's marker ([`claim_device_env`]) and share
//! ([`claim_share_env`]), and give the GPU's device nodes. A container given several devices
//! (`count`, `allocationMode: All`, several requests) is reserved from their shares: the same
//! amount on each of their GPUs ([`crate::request::claim_shares`]). kubelet hands the CDI ids to the runtime (CRI `cdi_devices`), and the
//! container goes through `vramgate-runtime`, which reserves exactly that on exactly that GPU
//! and enforces it like any other request: a claim that no longer fits (memory taken outside
//! Kubernetes since scheduling) queues or is refused by the node's policy, with the reason in
//! the start error kubelet records on the pod.
//!
//! **Telling claims' containers apart.** A reservation is held for a claim when its bundle's
//! spec carries a [`claim_device_env`] naming a device of a claim this node prepared (the CDI
//! spec files are the driver's record) on the GPU it reserved on; it counts for at most what
//! the claim consumed, and a device two markers name counts once; a container given several
//! devices carries several markers, each counted on its own GPU. Any container can set the
//! env; one that names no prepared claim counts as held by others.
//!
//! **Checking and holding.** Before they reserve, the hook and `vramgate-runtime` check every
//! marker and share a container carries against the claim's spec file in `[enforce]
//! cdi_spec_dirs` ([`crate::request::prepared_claims`]), and refuse one the driver did not
//! write; so the driver refuses a `--cdi-dir` not listed there. The containers of one pod given the same
//! checked devices hold the claim once ([`crate::ledger::ClaimHold`]), as the scheduler counts
//! it.

pub mod cdi_spec;
pub mod resource_claim;
pub mod slice_view;

#[cfg(feature = "dra")]
pub mod api;
#[cfg(feature = "dra")]
pub mod claim_watch;
#[cfg(feature = "dra")]
pub mod driver;
#[cfg(feature = "dra")]
pub mod kube;
#[cfg(feature = "dra")]
pub mod notices;
#[cfg(feature = "dra")]
pub mod plugin;
#[cfg(feature = "dra")]
pub mod server;
#[cfg(feature = "dra")]
pub mod slice;

/// The driver name: `spec.driver` of the slices, `results[].driver` of the claims, the DRA
/// plugin's registration name.
pub const DRIVER: &str = "gpu-memory.vramgate.dev";
/// The binding condition of every published device: True once the driver has reserved the
/// claim's memory on this node ([`claim_watch`]); kube-scheduler binds the pod only then.
pub const RESERVED_CONDITION: &str = "gpu-memory.vramgate.dev/reserved";
/// The binding failure condition: True where the node cannot hold the claim now; the scheduler
/// then takes the allocation back and the pod returns to its queue with the message.
pub const UNAVAILABLE_CONDITION: &str = "gpu-memory.vramgate.dev/unavailable";
/// The capacity the slices publish and claims consume.
pub const MEMORY_CAPACITY: &str = "memory";
pub use crate::request::prepared_claims::{claim_device_env, claim_share_env};

use crate::inventory::GpuMemory;

/// The name a GPU is published under in the node's ResourceSlice, and prepared by: `gpu-<index>`,
/// and `gpu-<index>-mig-<n>` for a MIG device (device names are DNS labels: lowercase
/// alphanumerics and `-`).
pub fn device_name(gpu: &GpuMemory) -> String {
    match gpu.mig_index {
        None => format!("gpu-{}", gpu.index),
        Some(mig) => format!("gpu-{}-mig-{mig}", gpu.index),
    }
}

/// The GPU published as `device` among `gpus`.
pub fn gpu_named<'g>(device: &str, gpus: &'g [GpuMemory]) -> Option<&'g GpuMemory> {
    gpus.iter().find(|g| device_name(g) == device)
}
