//! Which `/dev/nvidia-caps/nvidia-capN` nodes grant access to which MIG device.
//!
//! A container given a MIG device through CDI gets its parent GPU's `/dev/nvidiaN` and two
//! capability nodes: one for the MIG device's GPU instance, one for its compute instance. The
//! driver lists every such capability and its minor number in
//! `/proc/driver/nvidia-caps/mig-minors`, one a line:
//!
//! ```text
//! gpu0/gi1/access 12
//! gpu0/gi1/ci0/access 13
//! ```
//!
//! where `gpu0` is the parent's minor number. With each MIG device's GPU and compute instance
//! ids (from NVML), these say which MIG device a spec's capability nodes name.

use std::collections::{HashMap, HashSet};

pub const MIG_MINORS_PATH: &str = "/proc/driver/nvidia-caps/mig-minors";
/// The character driver of the MIG capability nodes, in `/proc/devices`: its major is
/// assigned at load.
pub const NVIDIA_CAPS_DRIVER: &str = "nvidia-caps";

/// The capability minors, by (parent minor, GPU instance id, compute instance id): `None`
/// for the GPU instance's own access capability.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigMinors {
    access: HashMap<(u32, u32, Option<u32>), u32>,
    /// The host-wide capabilities (`config`, `monitor`), which grant no MIG device.
    host_wide: HashSet<u32>,
}

impl MigMinors {
    /// Parses the file's text; lines that do not parse are skipped: the file is the driver's,
    /// and a line we do not know must not stop admission.
    pub fn parse(text: &str) -> MigMinors {
        let mut map = HashMap::new();
        let mut host_wide = HashSet::new();
        for line in text.lines() {
            let Some((name, minor)) = line.trim().split_once(char::is_whitespace) else {
                continue;
            };
            let Ok(minor) = minor.trim().parse::<u32>() else {
                continue;
            };
            if matches!(name, "config" | "monitor") {
                host_wide.insert(minor);
                continue;
            }
            let parts: Vec<&str> = name.split('/').collect();
            let number = |part: &str, prefix: &str| part.strip_prefix(prefix)?.parse::<u32>().ok();
            let key = match parts.as_slice() {
                [gpu, gi, "access"] => (|| Some((number(gpu, "gpu")?, number(gi, "gi")?, None)))(),
                [gpu, gi, ci, "access"] => {
                    (|| Some((number(gpu, "gpu")?, number(gi, "gi")?, Some(number(ci, "ci")?))))()
                }
                _ => None,
            };
            if let Some(key) = key {
                map.insert(key, minor);
            }
        }
        MigMinors { access: map, host_wide }
    }

    /// Whether capability `minor` is host-wide (`config`, `monitor`), granting no MIG device:
    /// narrowing a container to its MIG devices keeps such a node.
    pub fn is_host_wide(&self, minor: u32) -> bool {
        self.host_wide.contains(&minor)
    }

    /// The host-wide capabilities' minors, in order.
    pub fn host_wide_minors(&self) -> Vec<u32> {
        let mut minors: Vec<u32> = self.host_wide.iter().copied().collect();
        minors.sort_unstable();
        minors
    }

    /// Reads the driver's file; empty when it cannot (no MIG, no driver).
    pub fn read() -> MigMinors {
        std::fs::read_to_string(MIG_MINORS_PATH)
            .map(|t| MigMinors::parse(&t))
            .unwrap_or_default()
    }

    /// The capability minors that grant access to the MIG device with these ids on the GPU
    /// whose device minor is `parent_minor`: its GPU instance's, then its compute instance's.
    /// Empty unless both are known.
    pub fn of(&self, parent_minor: u32, gpu_instance: u32, compute_instance: u32) -> Vec<u32> {
        match (
            self.access.get(&(parent_minor, gpu_instance, None)),
            self.access.get(&(parent_minor, gpu_instance, Some(compute_instance))),
        ) {
            (Some(gi), Some(ci)) => vec![*gi, *ci],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drivers_file() {
        let text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu1/gi1/access 30\nbogus line\ngpu0/gix/access 9\n";
        let m = MigMinors::parse(text);
        assert_eq!(m.of(0, 1, 0), [12, 13]);
        assert_eq!(m.of(0, 2, 0), [21, 22]);
        assert_eq!(m.of(1, 1, 0), Vec::<u32>::new(), "no compute instance listed");
        assert_eq!(m.of(3, 1, 0), Vec::<u32>::new());
        assert!(m.is_host_wide(1) && m.is_host_wide(2) && !m.is_host_wide(12));
    }
}
