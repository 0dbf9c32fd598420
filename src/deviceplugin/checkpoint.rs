//! What kubelet says it allocated: its device manager's checkpoint,
//! `<plugin-dir>/kubelet_internal_checkpoint`, which it rewrites (atomically) after every
//! Allocate and reads back when it restarts.
//!
//! The plugin believes a container's [`super::DEVICE_IDS_ENV`] only for IDs that kubelet (this
//! file) or the plugin's own `Allocate` handed out: any container can set that env, and one
//! that named units it was never granted would otherwise hide its memory from the scheduler.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::DeviceId;

/// The checkpoint's file name in kubelet's device plugin directory.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// Larger than any node's checkpoint (a few hundred bytes a container).
const MAX_CHECKPOINT_BYTES: u64 = 16 << 20;

/// The device IDs of `resource` that kubelet's checkpoint in `plugin_dir` lists as allocated to
/// containers. No file, or one that cannot be read or parsed, vouches for nothing: the
/// containers it would have named then count as others' (fewer healthy units, never more).
pub fn allocated_ids(plugin_dir: &Path, resource: &str) -> BTreeSet<DeviceId> {
    match crate::spec::read_limited(&plugin_dir.join(KUBELET_CHECKPOINT), MAX_CHECKPOINT_BYTES) {
        Ok(Some(bytes)) => parse(&bytes, resource),
        _ => BTreeSet::new(),
    }
}

/// The IDs of `resource` in a checkpoint's JSON. `DeviceIDs` is a map from NUMA node to IDs
/// since Kubernetes 1.20 and a plain list before; both are read.
pub fn parse(bytes: &[u8], resource: &str) -> BTreeSet<DeviceId> {
    let Ok(json) = serde_json::from_slice::<Value>(bytes) else {
        return BTreeSet::new();
    };
    let entries = json
        .pointer("/Data/PodDeviceEntries")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut ids = BTreeSet::new();
    for entry in entries.iter().filter(|e| e["ResourceName"] == resource) {
        let lists: Vec<&Value> = match &entry["DeviceIDs"] {
            Value::Object(by_numa) => by_numa.values().collect(),
            list @ Value::Array(_) => vec![list],
            _ => Vec::new(),
        };
        ids.extend(
            lists
                .into_iter()
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(Value::as_str)
                .filter_map(DeviceId::parse),
        );
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESOURCE: &str = "vramgate.dev/gpu-memory-gib";

    fn ids(list: &[&str]) -> BTreeSet<DeviceId> {
        list.iter().map(|id| DeviceId::parse(id).unwrap()).collect()
    }

    #[test]
    fn reads_both_layouts_and_only_this_resource() {
        let current = r#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"p1","ContainerName":"app","ResourceName":"vramgate.dev/gpu-memory-gib","DeviceIDs":{"-1":["GPU-a/0","GPU-a/1"]},"AllocResp":"Cg=="},
            {"PodUID":"p2","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-a/7"]},"AllocResp":""},
            {"PodUID":"p3","ContainerName":"app","ResourceName":"vramgate.dev/gpu-memory-gib","DeviceIDs":{"0":["GPU-b/3"],"1":["GPU-b/4","not an id"]},"AllocResp":""}
          ],"RegisteredDevices":{"vramgate.dev/gpu-memory-gib":["GPU-a/0","GPU-a/1","GPU-a/2"]}},"Checksum":1}"#;
        assert_eq!(
            parse(current.as_bytes(), RESOURCE),
            ids(&["GPU-a/0", "GPU-a/1", "GPU-b/3", "GPU-b/4"])
        );
        let before_1_20 = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"vramgate.dev/gpu-memory-gib","DeviceIDs":["GPU-a/5"],"AllocResp":""}]},"Checksum":2}"#;
        assert_eq!(parse(before_1_20.as_bytes(), RESOURCE), ids(&["GPU-a/5"]));
        // Registered but unallocated devices vouch for nothing.
        assert!(parse(
            br#"{"Data":{"RegisteredDevices":{"vramgate.dev/gpu-memory-gib":["GPU-a/0"]}}}"#,
            RESOURCE
        )
        .is_empty());
    }

    #[test]
    fn a_missing_or_broken_checkpoint_vouches_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(allocated_ids(dir.path(), RESOURCE).is_empty());
        std::fs::write(dir.path().join(KUBELET_CHECKPOINT), b"{\"Data\": [").unwrap();
        assert!(allocated_ids(dir.path(), RESOURCE).is_empty());
        std::fs::write(
            dir.path().join(KUBELET_CHECKPOINT),
            br#"{"Data":{"PodDeviceEntries":[{"ResourceName":"vramgate.dev/gpu-memory-gib","DeviceIDs":{"-1":["GPU-a/2"]}}]}}"#,
        )
        .unwrap();
        assert_eq!(allocated_ids(dir.path(), RESOURCE), ids(&["GPU-a/2"]));
    }
}
