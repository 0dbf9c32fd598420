//! Which GPUs a spec gives a container ([`GpuSelector`]): vramgate's own word, the device
//! nodes and CDI names the engine injected, `NVIDIA_VISIBLE_DEVICES`; parsed, then matched
//! against the host's GPUs ([`GpuSelector::resolve`], [`GpuSelector::candidates`]).

use std::path::Path;

use super::*;

/// One entry of a device list, before it is matched against the host's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    Index(u32),
    MigIndex(u32, u32),
    Uuid(String),
    /// `/dev/nvidiaN`: the device node's minor number.
    Minor(u32),
    /// `/dev/nvidia-caps/nvidia-capN`: a MIG capability node, which says which MIG device of
    /// a parent in MIG mode the container was given (see [`crate::inventory::mig_caps`]).
    MigCap(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    All,
    Devices(Vec<DeviceRef>),
    /// `none`, `void`, an empty list or no device at all.
    Nothing,
    /// vramgate chooses `count` GPUs (the amount on each) among `among`, the GPUs the container
    /// was otherwise given (`None`: every GPU of the host). Only `vramgate-runtime` can place;
    /// see [`crate::placement`].
    Auto {
        count: u32,
        among: Option<Vec<DeviceRef>>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSelector {
    pub selection: GpuSelection,
    /// `vramgate.dev/gpus`, `VRAMGATE_GPUS`, `linux.devices`, [`CDI_SOURCE`] or
    /// `NVIDIA_VISIBLE_DEVICES`.
    pub source_name: String,
    pub value: String,
    /// For vramgate's own word (`vramgate.dev/gpus`, `VRAMGATE_GPUS`) naming GPUs: the GPUs the
    /// engine gave the container, when it gave some and not all. What the container names must
    /// be among them ([`RequestError::OutsideGiven`]).
    pub within: Option<Box<GpuSelector>>,
}

impl GpuSelector {
    /// Which GPUs the spec gives the container, in this order (the first that is there wins):
    ///
    /// 1. the annotation `vramgate.dev/gpus`, then the env `VRAMGATE_GPUS`: vramgate's own
    ///    word, which may be `auto` / `auto:N` (vramgate chooses among the GPUs that the
    ///    sources below name, or among every GPU when they name all or none);
    /// 2. the NVIDIA device nodes in `linux.devices`: what CDI injected upstream is what the
    ///    container will really see, whatever the environment says (a CUDA image's
    ///    `ENV NVIDIA_VISIBLE_DEVICES=all` beside one injected GPU means that one GPU);
    /// 3. CDI device requests in `cdi.k8s.io/*` annotations (`nvidia.com/gpu=…`), which
    ///    nvidia-container-runtime injects in CDI mode;
    /// 4. the mounts of NVIDIA's device plugin's `volume-mounts` strategy (`/dev/null` at
    ///    `/var/run/nvidia-container-devices/<GPU>`), which the toolkit reads before the env;
    /// 5. `NVIDIA_VISIBLE_DEVICES` (indices, UUIDs, MIG pairs, CDI names, `all`), as NVIDIA's
    ///    toolkit on the node reads it ([`NvidiaToolkit`]).
    ///
    /// In a pod, `NVIDIA_VISIBLE_DEVICES=all` gives nothing: NVIDIA's device plugin never writes
    /// it (the image does: every CUDA image sets it); see [`GpuSelector::asks_for_every_gpu`].
    pub fn from_spec(spec: &SpecView, toolkit: NvidiaToolkit) -> Result<GpuSelector, RequestError> {
        let own = match spec.annotations.get(GPUS_ANNOTATION) {
            Some(value) => Some((GPUS_ANNOTATION, value.as_str())),
            None => spec.env(GPUS_ENV).map(|v| (GPUS_ENV, v)),
        };
        match own {
            Some((source, value)) => GpuSelector::own(spec, source, value, toolkit),
            None => GpuSelector::given(spec, toolkit),
        }
    }

    /// Nothing given, where the container's `NVIDIA_VISIBLE_DEVICES` (its image's, or the pod
    /// author's) asks for every GPU and NVIDIA's toolkit would give it them: a container of a
    /// pod that the scheduler gave no GPU. Reserving for it would take memory on GPUs it was
    /// never given; admitting it with nothing would leave its use of every GPU unaccounted.
    pub fn asks_for_every_gpu(&self) -> bool {
        self.selection == GpuSelection::Nothing
            && self.source_name == VISIBLE_DEVICES_ENV
            && matches!(self.value.trim(), "all" | "nvidia.com/gpu=all")
    }

    /// vramgate's own word `value` (from `source`) on the GPUs, within those the engine gave
    /// the container (see [`GpuSelector::within`]).
    pub(super) fn own(
        spec: &SpecView,
        source: &str,
        value: &str,
        toolkit: NvidiaToolkit,
    ) -> Result<GpuSelector, RequestError> {
        let mut selector = GpuSelector::parse(source, value, true)?;
        let given = GpuSelector::given(spec, toolkit)?;
        let scheduled_claim = claim_devices(spec).next().is_some();
        if given.asks_for_every_gpu() && !scheduled_claim {
            return Ok(given);
        }
        // A pod's containers get GPUs from the scheduler alone (the device plugin, a claim):
        // one given none has none, whatever the pod's annotation or its own env names, so a pod
        // author can neither reserve a GPU it was not given (every GPU of the node, in full)
        // nor have vramgate-runtime place it on one behind the scheduler's back. Outside a pod
        // the engine's user can add any device anyway; there, `all` and `auto` with nothing
        // given still span or choose among the host's GPUs. A claim's GPUs are the scheduler's
        // too: its devices' CDI edits write `VRAMGATE_GPUS` after the container's own env, and
        // the hook and wrapper check each claim marker against the driver's spec files.
        if given.selection == GpuSelection::Nothing && pod_role(spec) == PodRole::Container && !scheduled_claim {
            return Ok(GpuSelector {
                selection: GpuSelection::Nothing,
                ..selector
            });
        }
        match (&mut selector.selection, given.selection) {
            (_, GpuSelection::All | GpuSelection::Nothing | GpuSelection::Auto { .. }) => {}
            (GpuSelection::Auto { among, .. }, GpuSelection::Devices(devices)) => *among = Some(devices),
            (GpuSelection::Nothing, GpuSelection::Devices(_)) => {}
            (GpuSelection::All | GpuSelection::Devices(_), devices @ GpuSelection::Devices(_)) => {
                selector.within = Some(Box::new(GpuSelector {
                    selection: devices,
                    ..given
                }));
            }
        }
        Ok(selector)
    }

    /// The GPUs the engine gave the container (sources 2 to 5 of [`GpuSelector::from_spec`]).
    fn given(spec: &SpecView, toolkit: NvidiaToolkit) -> Result<GpuSelector, RequestError> {
        let nothing = |source_name: &str, value: &str| GpuSelector {
            selection: GpuSelection::Nothing,
            source_name: source_name.to_string(),
            value: value.to_string(),
            within: None,
        };
        let nodes: Vec<&str> = spec.device_paths().filter(|p| nvidia_minor(p).is_some()).collect();
        if !nodes.is_empty() {
            let mut minors = Vec::new();
            for minor in nodes.iter().filter_map(|p| nvidia_minor(p)) {
                if !minors.contains(&DeviceRef::Minor(minor)) {
                    minors.push(DeviceRef::Minor(minor));
                }
            }
            for cap in spec.device_paths().filter_map(mig_cap_minor) {
                if !minors.contains(&DeviceRef::MigCap(cap)) {
                    minors.push(DeviceRef::MigCap(cap));
                }
            }
            return Ok(GpuSelector {
                selection: GpuSelection::Devices(minors),
                source_name: "linux.devices".to_string(),
                value: nodes.join(","),
                within: None,
            });
        }
        let cdi: Vec<&str> = spec
            .annotations
            .iter()
            .filter(|(key, _)| key.starts_with(CDI_ANNOTATION_PREFIX))
            .flat_map(|(_, value)| value.split(','))
            .map(str::trim)
            .filter(|name| name.starts_with(CDI_GPU_PREFIX))
            .collect();
        if !cdi.is_empty() {
            return GpuSelector::parse(CDI_SOURCE, &cdi.join(","), false);
        }
        let mounted = volume_mounts(spec);
        if !mounted.is_empty() {
            return GpuSelector::parse(VOLUME_MOUNTS_SOURCE, &mounted.join(","), false);
        }
        let Some(value) = spec.env(VISIBLE_DEVICES_ENV) else {
            return Ok(nothing("linux.devices", ""));
        };
        // The volume-mounts strategy's own value: the GPUs are the mounts, and there are none.
        if Path::new(value.trim()) == Path::new(VOLUME_MOUNTS_ROOT) {
            return Ok(nothing(VISIBLE_DEVICES_ENV, value));
        }
        if !toolkit.envvar_when_unprivileged && !spec.is_privileged() {
            return Ok(GpuSelector {
                source_name: ENV_NOT_ACCEPTED_SOURCE.to_string(),
                ..nothing(VISIBLE_DEVICES_ENV, value)
            });
        }
        let selector = GpuSelector::parse(VISIBLE_DEVICES_ENV, value, false)?;
        if selector.selection == GpuSelection::All && pod_role(spec) == PodRole::Container {
            return Ok(nothing(VISIBLE_DEVICES_ENV, value));
        }
        Ok(selector)
    }

    /// What `vramgate-runtime` places: `auto`, and `all` as the engine wrote it (a CUDA image's
    /// `ENV NVIDIA_VISIBLE_DEVICES=all`, `--gpus all`, `nvidia.com/gpu=all`), which with a
    /// memory request means "any one GPU", since the wrapper can narrow the container to the
    /// GPU it chose. `vramgate.dev/gpus=all` is the user's explicit word for "the amount on
    /// every GPU" and is kept, as are lists. `None`: nothing to place.
    pub fn to_place(&self) -> Option<GpuSelector> {
        match &self.selection {
            GpuSelection::Auto { .. } => Some(self.clone()),
            GpuSelection::All if self.source_name == VISIBLE_DEVICES_ENV || self.source_name == CDI_SOURCE => {
                Some(GpuSelector {
                    selection: GpuSelection::Auto { count: 1, among: None },
                    ..self.clone()
                })
            }
            _ => None,
        }
    }

    /// Parses a device list as the public `parse_list` does; `auto` only from vramgate's own
    /// sources.
    pub fn parse_list(source_name: &str, value: &str) -> Result<GpuSelector, RequestError> {
        GpuSelector::parse(
            source_name,
            value,
            source_name == GPUS_ANNOTATION || source_name == GPUS_ENV,
        )
    }

    /// Parses an `NVIDIA_VISIBLE_DEVICES`-style list: `all`, `none`, `void`, or a comma list of
    /// indices, `GPU-`/`MIG-` UUIDs and `gpu:mig` pairs, each also as a CDI name
    /// (`nvidia.com/gpu=0`, `nvidia.com/gpu=all`); with `allow_auto`, `auto` or `auto:N`.
    fn parse(source_name: &str, value: &str, allow_auto: bool) -> Result<GpuSelector, RequestError> {
        let invalid = |reason: String| RequestError::Invalid {
            source_name: source_name.to_string(),
            value: value.chars().take(80).collect(),
            reason,
        };
        if value.len() > MAX_DEVICE_LIST_LEN {
            return Err(invalid(format!(
                "the device list is longer than {MAX_DEVICE_LIST_LEN} bytes"
            )));
        }
        let trimmed = value.trim();
        let auto_count = |word: &str| -> Option<Result<u32, RequestError>> {
            let count = match word.strip_prefix("auto")? {
                "" => return Some(Ok(1)),
                rest => rest.strip_prefix(':')?,
            };
            Some(match count.parse::<u32>() {
                Ok(n) if (1..=MAX_AUTO_GPUS).contains(&n) => Ok(n),
                _ => Err(invalid(format!(
                    "auto:N takes a number of GPUs from 1 to {MAX_AUTO_GPUS}, not {:?}",
                    count.chars().take(20).collect::<String>()
                ))),
            })
        };
        let all_cdi = trimmed.split(',').all(|i| i.trim().starts_with(CDI_GPU_PREFIX));
        let selection = match trimmed {
            "all" => GpuSelection::All,
            _ if all_cdi && trimmed.split(',').any(|i| i.trim() == "nvidia.com/gpu=all") => GpuSelection::All,
            "" | "none" | "void" => GpuSelection::Nothing,
            word if auto_count(word).is_some() => {
                if !allow_auto {
                    return Err(invalid(format!(
                        "auto belongs in {GPUS_ANNOTATION} or {GPUS_ENV}, where vramgate reads it; {source_name} is read by the NVIDIA runtime"
                    )));
                }
                GpuSelection::Auto {
                    count: auto_count(word).expect("checked above")?,
                    among: None,
                }
            }
            _ => {
                let mut devices = Vec::new();
                for item in trimmed.split(',').map(str::trim) {
                    let device = parse_device(item.strip_prefix(CDI_GPU_PREFIX).unwrap_or(item)).ok_or_else(|| {
                        invalid(format!(
                            "{:?} is not a GPU: use an index (0), a UUID (GPU-..., MIG-...), a MIG pair (0:1), a CDI name (nvidia.com/gpu=0), all, none{}",
                            item.chars().take(80).collect::<String>(),
                            if allow_auto { ", auto or auto:N" } else { "" }
                        ))
                    })?;
                    if !devices.contains(&device) {
                        devices.push(device);
                    }
                }
                GpuSelection::Devices(devices)
            }
        };
        Ok(GpuSelector {
            selection,
            source_name: source_name.to_string(),
            value: value.to_string(),
            within: None,
        })
    }

    /// The UUIDs of the memory domains this selection names on this host. A placement
    /// (`auto`) names none yet: it is an error here, whose message says that only
    /// `vramgate-runtime` can place; see [`GpuSelector::candidates`].
    pub fn resolve(&self, snapshot: &Snapshot) -> Result<Vec<String>, RequestError> {
        let uuids = match &self.selection {
            GpuSelection::Nothing => return Ok(Vec::new()),
            GpuSelection::All => snapshot.gpus.iter().map(|g| g.uuid.clone()).collect(),
            GpuSelection::Devices(devices) => self.resolve_devices(devices, snapshot, false)?,
            GpuSelection::Auto { .. } => {
                return Err(RequestError::PlacementNeedsRuntime {
                    source_name: self.source_name.clone(),
                    value: self.value.chars().take(80).collect(),
                })
            }
        };
        self.check_within(&uuids, snapshot)?;
        Ok(uuids)
    }

    /// What the container names must be among what its engine gave it ([`GpuSelector::within`]):
    /// a pod given GPU 0 by its device plugin that names GPU 1 would otherwise be reserved on,
    /// and narrowed to, a GPU that may be another pod's.
    fn check_within(&self, uuids: &[String], snapshot: &Snapshot) -> Result<(), RequestError> {
        let Some(given) = &self.within else { return Ok(()) };
        let GpuSelection::Devices(devices) = &given.selection else {
            return Ok(());
        };
        // A GPU in MIG mode given whole stands for its MIG devices.
        let allowed = given.resolve_devices(devices, snapshot, true)?;
        let outside: Vec<&str> = uuids
            .iter()
            .filter(|u| !allowed.iter().any(|a| a.eq_ignore_ascii_case(u)))
            .map(String::as_str)
            .collect();
        if outside.is_empty() {
            return Ok(());
        }
        let describe = |uuid: &str| match snapshot.by_uuid(uuid) {
            Some(g) => match g.mig_index {
                Some(m) => format!("GPU {}:{m} ({uuid})", g.index),
                None => format!("GPU {} ({uuid})", g.index),
            },
            None => uuid.to_string(),
        };
        Err(RequestError::OutsideGiven {
            source_name: self.source_name.clone(),
            value: self.value.chars().take(80).collect(),
            outside: outside.iter().map(|u| describe(u)).collect::<Vec<_>>().join(", "),
            given_source: given.source_name.clone(),
            given_value: given.value.chars().take(200).collect(),
        })
    }

    /// For a placement: how many GPUs to choose, and the UUIDs to choose among (every memory
    /// domain of the host, or those the container was given; a GPU in MIG mode stands for its
    /// MIG devices, never for itself). `None` when this is not a placement.
    pub fn candidates(&self, snapshot: &Snapshot) -> Option<Result<(u32, Vec<String>), RequestError>> {
        let GpuSelection::Auto { count, among } = &self.selection else {
            return None;
        };
        let uuids = match among {
            None => Ok(snapshot.gpus.iter().map(|g| g.uuid.clone()).collect()),
            Some(devices) => self.resolve_devices(devices, snapshot, true),
        };
        Some(uuids.and_then(|uuids| {
            if uuids.len() < *count as usize {
                return Err(RequestError::TooFewGpus {
                    source_name: self.source_name.clone(),
                    value: self.value.chars().take(80).collect(),
                    count: *count,
                    found: uuids.len(),
                    candidates: if uuids.is_empty() {
                        "none".to_string()
                    } else {
                        uuids.join(", ")
                    },
                });
            }
            Ok((*count, uuids))
        }))
    }

    /// `expand_mig`: a GPU in MIG mode stands for all its MIG devices (a placement among the
    /// devices given), where a request naming it is an error.
    fn resolve_devices(
        &self,
        devices: &[DeviceRef],
        snapshot: &Snapshot,
        expand_mig: bool,
    ) -> Result<Vec<String>, RequestError> {
        let mut uuids: Vec<String> = Vec::new();
        let caps: Vec<u32> = devices
            .iter()
            .filter_map(|d| match d {
                DeviceRef::MigCap(n) => Some(*n),
                _ => None,
            })
            .collect();
        for device in devices {
            // A MIG device given through CDI: its parent's node and its capability nodes name
            // it, whether or not vramgate then places among them.
            if let (DeviceRef::Minor(n), false) = (device, caps.is_empty()) {
                let named: Vec<&GpuMemory> = snapshot
                    .gpus
                    .iter()
                    .filter(|g| g.minor == Some(*n) && g.mig_index.is_some())
                    .filter(|g| !g.mig_caps.is_empty() && g.mig_caps.iter().all(|c| caps.contains(c)))
                    .collect();
                if !named.is_empty() {
                    for mig in named {
                        if !uuids.contains(&mig.uuid) {
                            uuids.push(mig.uuid.clone());
                        }
                    }
                    continue;
                }
            }
            let mig_parent = |index: u32| {
                snapshot.mig_parents.contains(&index).then(|| RequestError::MigParent {
                    source_name: self.source_name.clone(),
                    value: self.value.clone(),
                    index,
                })
            };
            let parent_index = match device {
                DeviceRef::Index(i) => Some(*i),
                DeviceRef::Minor(n) => snapshot.gpus.iter().find(|g| g.minor == Some(*n)).map(|g| g.index),
                _ => None,
            };
            if let Some(index) = parent_index.filter(|i| expand_mig && snapshot.mig_parents.contains(i)) {
                for mig in snapshot
                    .gpus
                    .iter()
                    .filter(|g| g.index == index && g.mig_index.is_some())
                {
                    if !uuids.contains(&mig.uuid) {
                        uuids.push(mig.uuid.clone());
                    }
                }
                continue;
            }
            let found = match device {
                DeviceRef::Index(i) => {
                    if let Some(e) = mig_parent(*i) {
                        return Err(e);
                    }
                    snapshot.gpus.iter().find(|g| g.index == *i && g.mig_index.is_none())
                }
                DeviceRef::MigIndex(i, m) => snapshot.gpus.iter().find(|g| g.index == *i && g.mig_index == Some(*m)),
                DeviceRef::Uuid(u) => snapshot.gpus.iter().find(|g| g.uuid.eq_ignore_ascii_case(u)),
                DeviceRef::Minor(n) => {
                    let parent = snapshot.gpus.iter().find(|g| g.minor == Some(*n));
                    if let Some(e) = parent.and_then(|g| mig_parent(g.index)) {
                        return Err(e);
                    }
                    parent
                }
                DeviceRef::MigCap(_) => continue,
            };
            let gpu = found.ok_or_else(|| RequestError::UnknownGpu {
                source_name: self.source_name.clone(),
                value: self.value.chars().take(80).collect(),
                device: describe_ref(device),
                available: describe_available(snapshot),
            })?;
            if !uuids.contains(&gpu.uuid) {
                uuids.push(gpu.uuid.clone());
            }
        }
        Ok(uuids)
    }
}

fn describe_ref(device: &DeviceRef) -> String {
    match device {
        DeviceRef::Index(i) => i.to_string(),
        DeviceRef::MigIndex(i, m) => format!("{i}:{m}"),
        DeviceRef::Uuid(u) => u.chars().take(80).collect(),
        DeviceRef::Minor(n) => format!("/dev/nvidia{n}"),
        DeviceRef::MigCap(n) => format!("/dev/nvidia-caps/nvidia-cap{n}"),
    }
}

fn describe_available(snapshot: &Snapshot) -> String {
    if snapshot.gpus.is_empty() {
        return "no GPU".to_string();
    }
    snapshot
        .gpus
        .iter()
        .map(|g| match g.mig_index {
            Some(m) => format!("{}:{m} {}", g.index, g.uuid),
            None => format!("{} {}", g.index, g.uuid),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The GPUs NVIDIA's device plugin gave under its `volume-mounts` strategy, read as NVIDIA's
/// toolkit reads them (`requestsFromMounts`): each mount of `/dev/null` at a path under
/// [`VOLUME_MOUNTS_ROOT`] names one device by the rest of its path (`imex/...` channels are not
/// GPUs; `cdi/<vendor>/<class>/<device>` is a CDI name). A `void` mount means none, and the
/// toolkit then reads the env. Counted whatever the toolkit's
/// `accept-nvidia-visible-devices-as-volume-mounts` says: where it is on, they are the GPUs the
/// container gets; where it is off, reserving for them errs on the safe side, never leaving a
/// GPU's use unaccounted.
pub fn volume_mounts(spec: &SpecView) -> Vec<String> {
    let mut seen = Vec::new();
    let mut devices = Vec::new();
    for mount in &spec.mounts {
        if crate::spec::clean(Path::new(&mount.source)) != Path::new("/dev/null") {
            continue;
        }
        let destination = crate::spec::clean(Path::new(&mount.destination));
        let destination = destination.to_string_lossy();
        if seen.contains(&destination.to_string()) {
            continue;
        }
        seen.push(destination.to_string());
        let Some(rest) = destination.strip_prefix(VOLUME_MOUNTS_ROOT) else {
            continue;
        };
        let device = rest.trim_matches('/');
        match device {
            "" => {}
            "void" => return Vec::new(),
            d if d.starts_with("imex/") => {}
            d => match d.strip_prefix("cdi/") {
                Some(cdi) => {
                    let mut parts = cdi.splitn(3, '/');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(vendor), Some(class), Some(name)) => devices.push(format!("{vendor}/{class}={name}")),
                        _ if cdi.contains('=') => devices.push(cdi.to_string()),
                        _ => {}
                    }
                    // Another kind of CDI device (an IMEX channel, a NIC) is not a GPU.
                    devices.retain(|d| !d.contains('=') || d.starts_with(CDI_GPU_PREFIX));
                }
                None => devices.push(d.to_string()),
            },
        }
    }
    devices
}

fn parse_device(item: &str) -> Option<DeviceRef> {
    if item.is_empty() {
        return None;
    }
    if item.bytes().all(|b| b.is_ascii_digit()) {
        return item.parse().ok().map(DeviceRef::Index);
    }
    if let Some((gpu, mig)) = item.split_once(':') {
        return Some(DeviceRef::MigIndex(gpu.parse().ok()?, mig.parse().ok()?));
    }
    let is_uuid = (item.starts_with("GPU-") || item.starts_with("MIG-"))
        && item.len() > 4
        && item.len() <= 128
        && item[4..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/');
    is_uuid.then(|| DeviceRef::Uuid(item.to_string()))
}

#[cfg(test)]
mod tests;
