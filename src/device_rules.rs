//! A spec's device-cgroup rules (`linux.resources.devices`) read as what they let a container
//! open, for the GPUs it holds a reservation on.
//!
//! A device node in `linux.devices` is not the only way to a GPU: a container that holds
//! `CAP_MKNOD` (Docker's default) can make `/dev/nvidia1` itself, and the device cgroup is then
//! all that stands between it and GPU 1. So narrowing a container to its reserved GPUs must
//! leave no rule that lets it open another GPU's node: not the node's own rule, not a wildcard
//! over NVIDIA's major (`c 195:* rwm`, `--device-cgroup-rule`), not one over every character
//! device (`c *:* rwm`, `a`: a privileged container). A rule that only allows `mknod` (`m`, as
//! every engine's default `c *:* m`) opens nothing.
//!
//! Rules are read conservatively: a later deny rule is not taken to undo an earlier allow (the
//! runtimes' emulators differ on partial overlaps), so what is judged to open a GPU may be a
//! little more than the kernel would allow, never less.

use serde_json::Value;

/// The major number of NVIDIA's GPU device nodes (`/dev/nvidiaN`, `/dev/nvidiactl`).
pub const NVIDIA_MAJOR: u64 = 195;
/// Minors of [`NVIDIA_MAJOR`] that are no GPU: `nvidia-modeset` and `nvidiactl`, which every
/// container with a GPU needs.
pub const NVIDIA_CONTROL_MINORS: [u64; 2] = [254, 255];
/// The major number of the DRM nodes (`/dev/dri/card*`, `/dev/dri/renderD*`), which newer
/// NVIDIA CDI specs add per GPU.
pub const DRM_MAJOR: u64 = 226;

/// One rule, as the OCI spec writes it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRule<'a>(pub &'a Value);

impl DeviceRule<'_> {
    pub fn allows(&self) -> bool {
        self.0.get("allow").and_then(Value::as_bool) == Some(true)
    }

    /// `a` (all), `b` or `c`; a rule without a type is `a`, as runc reads it.
    pub fn kind(&self) -> &str {
        match self.0.get("type").and_then(Value::as_str) {
            None | Some("") => "a",
            Some(kind) => kind,
        }
    }

    fn number(&self, key: &str) -> Option<u64> {
        // Missing, null and -1 are the wildcard `*`.
        self.0.get(key).and_then(Value::as_u64)
    }

    /// The major number, `None` for every major.
    pub fn major(&self) -> Option<u64> {
        self.number("major")
    }

    /// The minor number, `None` for every minor.
    pub fn minor(&self) -> Option<u64> {
        self.number("minor")
    }

    /// Whether it lets the container read or write a node (a rule without access is `rwm`).
    pub fn opens(&self) -> bool {
        match self.0.get("access").and_then(Value::as_str) {
            None | Some("") => true,
            Some(access) => access.contains(['r', 'w']),
        }
    }

    /// Whether it allows opening the character device `major:minor`.
    pub fn opens_char(&self, major: u64, minor: u64) -> bool {
        self.allows()
            && self.opens()
            && matches!(self.kind(), "a" | "c")
            && self.major().is_none_or(|m| m == major)
            && self.minor().is_none_or(|m| m == minor)
    }

    /// Whether it allows opening character devices of every major (`c *:* rw`, `a`).
    pub fn opens_every_char_major(&self) -> bool {
        self.allows() && self.opens() && matches!(self.kind(), "a" | "c") && self.major().is_none()
    }

    /// How the rule reads on a command line: `c 195:* rwm`, `a *:* rwm`.
    pub fn describe(&self) -> String {
        let number = |n: Option<u64>| n.map_or("*".to_string(), |n| n.to_string());
        let access = self.0.get("access").and_then(Value::as_str).unwrap_or("rwm");
        format!(
            "{} {} {}:{} {access}",
            if self.allows() { "allow" } else { "deny" },
            self.kind(),
            number(self.major()),
            number(self.minor())
        )
    }
}

/// The first allow rule of `rules` that lets a container holding a reservation on the GPUs of
/// minors `kept` open another GPU's node: a rule over every character major, or one over
/// NVIDIA's major that is a wildcard or names a GPU minor outside `kept`. `None` when the rules
/// keep the container to its GPUs. For a caller that cannot rewrite the spec (the hook alone).
pub fn reaching_other_gpus<'a>(rules: &'a [Value], kept: &[u32]) -> Option<DeviceRule<'a>> {
    rules.iter().map(DeviceRule).find(|rule| {
        if rule.opens_every_char_major() {
            return true;
        }
        if !(rule.allows() && rule.opens() && matches!(rule.kind(), "a" | "c")) || rule.major() != Some(NVIDIA_MAJOR) {
            return false;
        }
        match rule.minor() {
            None => true,
            Some(minor) => !NVIDIA_CONTROL_MINORS.contains(&minor) && !kept.iter().any(|k| u64::from(*k) == minor),
        }
    })
}

/// Whose a DRM node (`/dev/dri/card1`, `renderD129`) is, from the host's sysfs and NVIDIA's
/// proc files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrmNode {
    /// Another vendor's device (an integrated GPU): not vramgate's to take away.
    OtherVendor,
    /// The NVIDIA GPU whose `/dev/nvidiaN` has this minor.
    NvidiaGpu(u32),
    /// An NVIDIA device whose GPU cannot be told, or no device on this host: kept from a
    /// container that holds a reservation, since it may be another GPU's.
    Unknown,
}

/// Where the host's `/sys` and `/proc` are (the host's own, or a test's scratch copy).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub sys: std::path::PathBuf,
    pub proc: std::path::PathBuf,
}

impl Default for HostPaths {
    fn default() -> HostPaths {
        HostPaths {
            sys: "/sys".into(),
            proc: "/proc".into(),
        }
    }
}

/// NVIDIA's PCI vendor id, as sysfs writes it.
const NVIDIA_VENDOR: &str = "0x10de";

impl HostPaths {
    /// The major number the kernel gave the character driver `name` (`/proc/devices`), e.g.
    /// `nvidia-caps`, whose major is assigned at load.
    pub fn char_major(&self, name: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.proc.join("devices")).ok()?;
        text.lines()
            .skip_while(|l| !l.starts_with("Character devices:"))
            .take_while(|l| !l.starts_with("Block devices:"))
            .find_map(|line| {
                let (major, driver) = line.trim().split_once(' ')?;
                (driver.trim() == name).then(|| major.parse().ok()).flatten()
            })
    }

    /// Whose the DRM node `226:minor` is: the PCI device behind `/sys/dev/char/226:<minor>`,
    /// and for an NVIDIA one, the GPU minor the driver gives that PCI address in
    /// `/proc/driver/nvidia/gpus/<address>/information` ("Device Minor: N").
    pub fn drm_node(&self, minor: u64) -> DrmNode {
        let device = self.sys.join(format!("dev/char/{DRM_MAJOR}:{minor}/device"));
        let Ok(vendor) = std::fs::read_to_string(device.join("vendor")) else {
            return DrmNode::Unknown;
        };
        if vendor.trim() != NVIDIA_VENDOR {
            return DrmNode::OtherVendor;
        }
        let Some(address) = std::fs::read_link(&device)
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()))
        else {
            return DrmNode::Unknown;
        };
        let information = self.proc.join("driver/nvidia/gpus").join(address).join("information");
        std::fs::read_to_string(information)
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("Device Minor:"))
                    .and_then(|n| n.trim().parse().ok())
            })
            .map_or(DrmNode::Unknown, DrmNode::NvidiaGpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_a_rule_opens() {
        let docker_default = json!({"allow": true, "type": "c", "major": null, "minor": null, "access": "m"});
        assert!(
            !DeviceRule(&docker_default).opens_char(195, 1),
            "mknod alone opens nothing"
        );
        let privileged = json!({"allow": true, "access": "rwm"});
        assert!(DeviceRule(&privileged).opens_every_char_major());
        assert_eq!(DeviceRule(&privileged).describe(), "allow a *:* rwm");
        let nvidia = json!({"allow": true, "type": "c", "major": 195, "access": "rw"});
        assert!(DeviceRule(&nvidia).opens_char(195, 7) && !DeviceRule(&nvidia).opens_char(226, 7));
        let minus_one = json!({"allow": true, "type": "c", "major": 195, "minor": -1, "access": "r"});
        assert!(DeviceRule(&minus_one).opens_char(195, 3), "-1 is the wildcard");
        let deny = json!({"allow": false, "type": "c", "major": 195, "access": "rwm"});
        assert!(!DeviceRule(&deny).opens_char(195, 0));
        let block = json!({"allow": true, "type": "b", "access": "rwm"});
        assert!(!DeviceRule(&block).opens_char(195, 0));
    }

    #[test]
    fn a_drm_node_is_told_by_its_pci_device() {
        let root = tempfile::tempdir().unwrap();
        let host = HostPaths {
            sys: root.path().join("sys"),
            proc: root.path().join("proc"),
        };
        let device = |minor: u64, address: &str, vendor: &str| {
            let pci = root.path().join("sys/devices/pci0000:00").join(address);
            std::fs::create_dir_all(&pci).unwrap();
            std::fs::write(pci.join("vendor"), format!("{vendor}\n")).unwrap();
            let char_dir = root.path().join(format!("sys/dev/char/226:{minor}"));
            std::fs::create_dir_all(&char_dir).unwrap();
            std::os::unix::fs::symlink(&pci, char_dir.join("device")).unwrap();
        };
        device(0, "0000:00:02.0", "0x8086");
        device(1, "0000:3b:00.0", NVIDIA_VENDOR);
        device(2, "0000:5e:00.0", NVIDIA_VENDOR);
        let info = root.path().join("proc/driver/nvidia/gpus/0000:3b:00.0");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("information"),
            "Model: \t\t NVIDIA H100\nDevice Minor: \t 3\n",
        )
        .unwrap();
        assert_eq!(host.drm_node(0), DrmNode::OtherVendor);
        assert_eq!(host.drm_node(1), DrmNode::NvidiaGpu(3));
        assert_eq!(host.drm_node(2), DrmNode::Unknown, "NVIDIA, but no GPU minor for it");
        assert_eq!(host.drm_node(9), DrmNode::Unknown, "no such device");
        std::fs::create_dir_all(root.path().join("proc")).unwrap();
        std::fs::write(
            root.path().join("proc/devices"),
            "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps\n\nBlock devices:\n  8 sd\n",
        )
        .unwrap();
        assert_eq!(host.char_major("nvidia-caps"), Some(508));
        assert_eq!(host.char_major("nvidia"), Some(195));
        assert_eq!(host.char_major("sd"), None, "a block driver");
    }

    #[test]
    fn rules_that_reach_another_gpu() {
        let rule = |v: Value| vec![json!({"allow": false, "access": "rwm"}), v];
        let kept = [0];
        for (rules, reaches) in [
            (
                rule(json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"})),
                false,
            ),
            (
                rule(json!({"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rwm"})),
                false,
            ),
            (
                rule(json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"})),
                true,
            ),
            (
                rule(json!({"allow": true, "type": "c", "major": 195, "access": "rwm"})),
                true,
            ),
            (rule(json!({"allow": true, "type": "c", "access": "rw"})), true),
            (rule(json!({"allow": true, "access": "rwm"})), true),
            (rule(json!({"allow": true, "type": "c", "access": "m"})), false),
            (
                rule(json!({"allow": true, "type": "c", "major": 226, "access": "rwm"})),
                false,
            ),
        ] {
            assert_eq!(reaching_other_gpus(&rules, &kept).is_some(), reaches, "{rules:?}");
        }
    }
}
