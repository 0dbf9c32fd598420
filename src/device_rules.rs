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

/// The keys of a rule object, as the OCI spec spells them. runc decodes the spec with Go's
/// `encoding/json`, which matches keys without regard to case (and folds `ſ` into `s`), so a
/// rule written `{"Allow": true}` is an allow rule to runc and no rule at all to a reader that
/// matches keys exactly: a rule with any other key is refused ([`misread_rule`]).
pub const RULE_KEYS: [&str; 5] = ["allow", "type", "major", "minor", "access"];

/// One rule, as the OCI spec writes it, read as runc reads it: a rule of type `a` (or with no
/// type, or an empty one) is runc's wildcard device, every block and character device with
/// every access, whatever major, minor and access it names (cgroup v1, the v2 eBPF filter and
/// the systemd driver alike); so `a 195:0 rwm` and `a *:* m` are `--privileged`'s rule.
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

    fn every_device(&self) -> bool {
        self.kind() == "a"
    }

    fn written_number(&self, key: &str) -> Option<u64> {
        // Missing, null and -1 are the wildcard `*`.
        self.0.get(key).and_then(Value::as_u64)
    }

    /// The major number, `None` for every major (always, for a rule of type `a`).
    pub fn major(&self) -> Option<u64> {
        self.written_number("major").filter(|_| !self.every_device())
    }

    /// The minor number, `None` for every minor (always, for a rule of type `a`).
    pub fn minor(&self) -> Option<u64> {
        self.written_number("minor").filter(|_| !self.every_device())
    }

    /// Whether it lets the container read or write a node (a rule without access is `rwm`,
    /// and one of type `a` is every access).
    pub fn opens(&self) -> bool {
        match self.0.get("access").and_then(Value::as_str) {
            _ if self.every_device() => true,
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

    /// Whether it allows opening character devices of every major (`c *:* rw`, and any allow
    /// rule of type `a`).
    pub fn opens_every_char_major(&self) -> bool {
        self.allows() && self.opens() && matches!(self.kind(), "a" | "c") && self.major().is_none()
    }

    /// How the rule reads on a command line, as written: `allow c 195:* rwm`, `allow a 195:0 rwm`.
    pub fn describe(&self) -> String {
        let number = |n: Option<u64>| n.map_or("*".to_string(), |n| n.to_string());
        let access = self.0.get("access").and_then(Value::as_str).unwrap_or("rwm");
        let access: String = access.chars().filter(|c| !c.is_control()).take(8).collect();
        let kind: String = self.kind().chars().filter(|c| !c.is_control()).take(8).collect();
        format!(
            "{} {kind} {}:{} {access}",
            if self.allows() { "allow" } else { "deny" },
            number(self.written_number("major")),
            number(self.written_number("minor"))
        )
    }
}

/// The first rule of `rules` that runc would read otherwise than [`DeviceRule`] does, with
/// why: not an object, a key other than [`RULE_KEYS`] (`"Allow"`, `"ALLOW"`: Go matches keys
/// without case), a value of another type than the OCI spec's, a type other than `a`, `b` and
/// `c`, or an access other than letters of `rwm`. A caller that judges what the rules open
/// refuses such a spec, so that what it judged is what runc applies.
pub fn misread_rule(rules: &[Value]) -> Option<(usize, String)> {
    rules.iter().enumerate().find_map(|(index, rule)| {
        let why = |reason: String| Some((index, reason));
        let Some(object) = rule.as_object() else {
            return why(format!("is a {}, not an object", crate::spec::json_type(rule)));
        };
        if let Some(key) = object.keys().find(|k| !RULE_KEYS.contains(&k.as_str())) {
            return why(format!(
                "has the key {:?}, which the OCI spec does not name (runc reads keys without regard to case; write only {})",
                key.chars().take(40).collect::<String>(),
                RULE_KEYS.join(", ")
            ));
        }
        let wrong_type = |key: &str, expected: &str| why(format!("has {key} of another type than {expected}"));
        for (key, value) in object {
            let fits = match key.as_str() {
                "allow" => value.is_boolean(),
                "type" | "access" => value.is_string(),
                _ => value.is_null() || value.is_i64() || value.is_u64(),
            };
            if !fits {
                let expected = match key.as_str() {
                    "allow" => "a boolean",
                    "type" | "access" => "a string",
                    _ => "an integer",
                };
                return wrong_type(key, expected);
            }
        }
        let kind = object.get("type").and_then(Value::as_str).unwrap_or_default();
        if !matches!(kind, "" | "a" | "b" | "c") {
            return why(format!(
                "has the type {:?}; a device rule's type is a, b or c",
                kind.chars().take(8).collect::<String>()
            ));
        }
        let access = object.get("access").and_then(Value::as_str).unwrap_or_default();
        if !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return why(format!(
                "has the access {:?}; a device rule's access is made of r, w and m",
                access.chars().take(8).collect::<String>()
            ));
        }
        None
    })
}

/// What a container holding a reservation may keep open: the nodes of its GPUs, and through
/// `host` the DRM and MIG capability nodes that are theirs (or no GPU's).
#[derive(Debug, Clone)]
pub struct Kept<'a> {
    /// The minors of its GPUs' `/dev/nvidiaN` (the control nodes are always kept).
    pub gpu_minors: &'a [u32],
    /// The MIG capabilities' major (assigned at load, from `/proc/devices`) and the minors it
    /// keeps there: its MIG devices' and the host-wide ones. `None` where the driver has none.
    pub caps: Option<(u64, Vec<u64>)>,
    pub host: &'a HostPaths,
}

impl Kept<'_> {
    fn keeps_gpu_minor(&self, minor: u64) -> bool {
        NVIDIA_CONTROL_MINORS.contains(&minor) || self.gpu_minors.iter().any(|k| u64::from(*k) == minor)
    }

    /// Whether the DRM node `226:minor` may stay open: another vendor's, or one of its GPUs'.
    /// An NVIDIA node whose GPU cannot be told, or a minor with no device, may be another
    /// GPU's (a driver loaded later): not kept.
    pub fn keeps_drm_minor(&self, minor: u64) -> bool {
        match self.host.drm_node(minor) {
            DrmNode::OtherVendor => true,
            DrmNode::NvidiaGpu(gpu) => self.gpu_minors.contains(&gpu),
            DrmNode::Unknown => false,
        }
    }
}

/// The first allow rule of `rules` that lets a container holding a reservation on the GPUs
/// `kept` open another GPU's node: a rule over every character major (any allow rule of type
/// `a`), one over NVIDIA's major that is a wildcard or names a GPU minor it does not keep, one
/// over the DRM major that reaches an NVIDIA DRM node of the host it does not keep, or one over
/// the MIG capabilities' major that is a wildcard or names a capability it does not keep.
/// `None` when the rules keep the container to its GPUs. For a caller that cannot rewrite the
/// spec (the hook alone); the wrapper narrows the same rules instead.
pub fn reaching_other_gpus<'a>(rules: &'a [Value], kept: &Kept) -> Option<DeviceRule<'a>> {
    rules.iter().map(DeviceRule).find(|rule| {
        if rule.opens_every_char_major() {
            return true;
        }
        if !(rule.allows() && rule.opens() && rule.kind() == "c") {
            return false;
        }
        match (rule.major(), rule.minor()) {
            (Some(NVIDIA_MAJOR), None) => true,
            (Some(NVIDIA_MAJOR), Some(minor)) => !kept.keeps_gpu_minor(minor),
            (Some(DRM_MAJOR), Some(minor)) => !kept.keeps_drm_minor(minor),
            (Some(DRM_MAJOR), None) => kept.host.drm_minors().iter().any(|m| !kept.keeps_drm_minor(*m)),
            (Some(major), minor) => match &kept.caps {
                Some((caps_major, minors)) if *caps_major == major => minor.is_none_or(|m| !minors.contains(&m)),
                _ => false,
            },
            // Every major: answered by opens_every_char_major above.
            (None, _) => true,
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

    /// The minors of the host's DRM nodes (`/sys/dev/char/226:*`), sorted.
    pub fn drm_minors(&self) -> Vec<u64> {
        let prefix = format!("{DRM_MAJOR}:");
        let mut minors: Vec<u64> = std::fs::read_dir(self.sys.join("dev/char"))
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok())
            .collect();
        minors.sort_unstable();
        minors
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

/// A scratch `/sys` and `/proc` laid out as the kernel lays out a host's DRM nodes and the
/// NVIDIA driver its GPUs, for the tests of this module and of the wrapper's narrowing.
#[cfg(test)]
pub(crate) struct ScratchHost {
    _root: tempfile::TempDir,
    pub paths: HostPaths,
}

#[cfg(test)]
impl ScratchHost {
    pub(crate) fn new() -> ScratchHost {
        let root = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            sys: root.path().join("sys"),
            proc: root.path().join("proc"),
        };
        ScratchHost { _root: root, paths }
    }

    /// The DRM node `226:minor`, behind the PCI device `address` of `vendor`.
    pub(crate) fn drm_node(&self, minor: u64, address: &str, vendor: &str) {
        let pci = self.paths.sys.join("devices/pci0000:00").join(address);
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("vendor"), format!("{vendor}\n")).unwrap();
        let char_dir = self.paths.sys.join(format!("dev/char/{DRM_MAJOR}:{minor}"));
        std::fs::create_dir_all(&char_dir).unwrap();
        std::os::unix::fs::symlink(&pci, char_dir.join("device")).unwrap();
    }

    /// The NVIDIA driver's information file of the GPU at `address`, giving it `gpu_minor`.
    pub(crate) fn nvidia_gpu(&self, address: &str, gpu_minor: u32) {
        let info = self.paths.proc.join("driver/nvidia/gpus").join(address);
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("information"),
            format!("Model: \t\t NVIDIA H100\nDevice Minor: \t {gpu_minor}\n"),
        )
        .unwrap();
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
        let scratch = ScratchHost::new();
        let host = &scratch.paths;
        scratch.drm_node(0, "0000:00:02.0", "0x8086");
        scratch.drm_node(1, "0000:3b:00.0", NVIDIA_VENDOR);
        scratch.drm_node(2, "0000:5e:00.0", NVIDIA_VENDOR);
        scratch.nvidia_gpu("0000:3b:00.0", 3);
        assert_eq!(host.drm_node(0), DrmNode::OtherVendor);
        assert_eq!(host.drm_node(1), DrmNode::NvidiaGpu(3));
        assert_eq!(host.drm_node(2), DrmNode::Unknown, "NVIDIA, but no GPU minor for it");
        assert_eq!(host.drm_node(9), DrmNode::Unknown, "no such device");
        std::fs::create_dir_all(&host.proc).unwrap();
        std::fs::write(
            host.proc.join("devices"),
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
        let scratch = ScratchHost::new();
        let kept = Kept {
            gpu_minors: &[0],
            caps: None,
            host: &scratch.paths,
        };
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
            // Type `a` is every device to runc, whatever its numbers and access.
            (
                rule(json!({"allow": true, "type": "a", "major": 195, "minor": 0, "access": "rwm"})),
                true,
            ),
            (rule(json!({"allow": true, "type": "a", "access": "m"})), true),
            (
                rule(json!({"allow": true, "type": "a", "major": 1, "minor": 3, "access": "rwm"})),
                true,
            ),
            (
                rule(json!({"allow": true, "type": "", "major": 1, "minor": 3, "access": "r"})),
                true,
            ),
            (rule(json!({"allow": true, "type": "c", "access": "m"})), false),
            (
                rule(json!({"allow": true, "type": "c", "major": 226, "access": "rwm"})),
                false,
            ),
        ] {
            assert_eq!(reaching_other_gpus(&rules, &kept).is_some(), reaches, "{rules:?}");
        }
    }

    #[test]
    fn drm_and_mig_capability_rules_reach_other_gpus_as_the_gpu_major_does() {
        let scratch = ScratchHost::new();
        let host = &scratch.paths;
        // DRM 226:0 is an integrated GPU's, 226:128 GPU 0's render node, 226:129 GPU 1's.
        scratch.drm_node(0, "0000:00:02.0", "0x8086");
        scratch.drm_node(128, "0000:3b:00.0", NVIDIA_VENDOR);
        scratch.drm_node(129, "0000:5e:00.0", NVIDIA_VENDOR);
        scratch.nvidia_gpu("0000:3b:00.0", 0);
        scratch.nvidia_gpu("0000:5e:00.0", 1);
        assert_eq!(host.drm_minors(), [0, 128, 129]);
        let kept = Kept {
            gpu_minors: &[0],
            caps: Some((508, vec![12, 13, 1])),
            host,
        };
        let allow = |major: Option<u64>, minor: Option<u64>| {
            vec![json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rw"})]
        };
        for (rules, reaches, why) in [
            (allow(Some(226), Some(128)), false, "its own GPU's render node"),
            (allow(Some(226), Some(0)), false, "another vendor's card"),
            (
                allow(Some(226), Some(129)),
                true,
                "GPU 1's render node, with no node in the spec",
            ),
            (allow(Some(226), Some(200)), true, "a DRM minor no device has yet"),
            (allow(Some(226), None), true, "every DRM node, GPU 1's among them"),
            (allow(Some(508), Some(12)), false, "its MIG device's capability"),
            (allow(Some(508), Some(1)), false, "a host-wide capability"),
            (allow(Some(508), Some(21)), true, "another MIG device's capability"),
            (allow(Some(508), None), true, "every MIG capability"),
        ] {
            assert_eq!(reaching_other_gpus(&rules, &kept).is_some(), reaches, "{why}");
        }
        let one_gpu = Kept {
            gpu_minors: &[0, 1],
            ..kept
        };
        assert!(
            reaching_other_gpus(&allow(Some(226), None), &one_gpu).is_none(),
            "every DRM node of the host is its GPUs' or another vendor's"
        );
    }

    #[test]
    fn a_rule_runc_would_read_otherwise_is_named() {
        for (rule, said) in [
            (
                json!({"Allow": true, "type": "c", "major": 195, "access": "rwm"}),
                "\"Allow\"",
            ),
            (json!({"allow": false, "ALLOW": true}), "\"ALLOW\""),
            (json!({"allow": true, "type": "c", "acce\u{17f}s": "rwm"}), "acce"),
            (json!({"allow": "true", "type": "c"}), "allow of another type"),
            (
                json!({"allow": true, "type": "c", "major": 195.0}),
                "major of another type",
            ),
            (json!({"allow": true, "type": "C", "major": 195}), "type \"C\""),
            (json!({"allow": true, "type": "c", "access": "RW"}), "access \"RW\""),
            (json!("a *:* rwm"), "a string, not an object"),
        ] {
            let rules = vec![json!({"allow": false, "access": "rwm"}), rule.clone()];
            let (index, why) = misread_rule(&rules).unwrap_or_else(|| panic!("{rule} passed"));
            assert_eq!(index, 1, "{rule}");
            assert!(why.contains(said), "{rule}: {why}");
        }
        let fine = [
            json!({"allow": false, "access": "rwm"}),
            json!({"allow": true, "type": "c", "major": 195, "minor": -1, "access": "rw"}),
            json!({"allow": true, "type": "c", "major": null, "minor": null, "access": "m"}),
        ];
        assert_eq!(misread_rule(&fine), None);
        let written = json!({"allow": true, "type": "a", "major": 195, "minor": 0, "access": "rwm"});
        assert_eq!(DeviceRule(&written).describe(), "allow a 195:0 rwm");
    }
}
