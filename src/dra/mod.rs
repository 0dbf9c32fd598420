//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`) for GPU memory: the node
//! side of a claim (issue 21, in progress).
//!
//! With consumable capacity the scheduler shares a GPU among claims and records what each
//! consumed (`status.allocation.devices.results[].consumedCapacity.memory`). The node must then
//! hold each container to exactly that, on exactly that GPU: the driver's prepare turns each
//! of this driver's allocation results into a CDI device whose edits set `VRAMGATE_MEMORY` (the
//! consumed bytes) and `VRAMGATE_GPUS` (the GPU's UUID), kubelet hands the CDI ids to the
//! runtime (CRI `cdi_devices`), and the container goes through `vramgate-runtime`, which
//! reserves, places nothing (the GPU is named) and enforces as for any other request. So a
//! claim that no longer fits (memory taken outside Kubernetes since scheduling) is queued or
//! refused by the node's policy like any container, with its line in the start error.
//!
//! Built so far: reading a claim as the scheduler leaves it ([`claim`]) and the claim's CDI
//! spec ([`cdi`]), tested end to end through containerd 2.1's CRI plugin
//! (`tests/dra_node.rs`). Still to build: the kubelet plugin (registration and the DRA v1
//! gRPC service), the ResourceSlice publisher on the shared service snapshot, the manifests
//! and the node image; `docs/design/dra.md` has the research for them.

pub mod cdi;
pub mod claim;

/// The driver name: `spec.driver` of the slices, `results[].driver` of the claims, the DRA
/// plugin's registration name.
pub const DRIVER: &str = "gpu-memory.vramgate.dev";
/// The capacity the slices publish and claims consume.
pub const MEMORY_CAPACITY: &str = "memory";

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

/// The device nodes a container of `gpu` needs, of those this host has: its `/dev/nvidiaN`
/// and the driver's control nodes. A host without them (no GPU: a simulated inventory) gets
/// none, and the container only the environment.
pub fn device_nodes(gpu: &GpuMemory, dev: &std::path::Path) -> Vec<std::path::PathBuf> {
    let own = gpu.minor.map(|m| format!("nvidia{m}"));
    own.into_iter()
        .chain(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"].map(String::from))
        .map(|name| dev.join(name))
        .filter(|path| path.exists())
        .collect()
}
