//! A container's VRAM request, read from its spec: how much, on which GPUs, and what to do
//! when it does not fit.
//!
//! Annotations win over environment variables (Docker before 24 and some orchestrators pass no
//! annotations, so `VRAMGATE_*` in `process.env` is the fallback); when both are set the
//! annotation is used and the request carries a note saying so.
//!
//! **Kubernetes pods.** containerd's CRI plugin (through the runtime's `pod_annotations`) and
//! CRI-O copy a pod's annotations into the spec of every container of the pod, the sandbox
//! ("pause") container included, and mark each with its kind ([`CRI_CONTAINER_TYPE_ANNOTATIONS`]).
//! So, for the hook and the runtime wrapper alike (both ask [`has_request`]):
//! - a sandbox container never has a request: it runs no GPU work, and reserving for it would
//!   hold every pod's request twice;
//! - the pod annotation `vramgate.dev/memory` is the request of each container of the pod that
//!   names a GPU (the device plugin's `NVIDIA_VISIBLE_DEVICES`, a `/dev/nvidiaN` device, or the
//!   pod annotation `vramgate.dev/gpus`, which names it for every container of the pod); a
//!   container of the pod that names none (a sidecar) has no request, where outside a pod that
//!   is an error. A container's own `VRAMGATE_MEMORY` keeps the usual rule.
//!
//! **NVIDIA's vocabulary.** `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` (whole MiB,
//! what nvidia-container-toolkit's CDI hook `apply-cuda-memory-limits` reads) and, in a pod,
//! KAI's annotations `nvidia.com/container.<container name>.gpu-memory.request` / `.limit` are
//! a request too ([`nvidia_memory`]): a container that says only that is admitted on NVIDIA's
//! request (its limit when it gives no request) with NVIDIA's limit (its request when it gives
//! no limit). vramgate's own word comes first; where both are set they must name the same
//! request and the same limit, or the container is refused with one line.
//!
//! **Request and limit.** `vramgate.dev/memory-limit` / `VRAMGATE_MEMORY_LIMIT` (same syntax
//! and precedence as the request) is what the container may use at most; the request is what
//! it is guaranteed. Admission and placement use the request, the enforcement tiers that can
//! hold a container to two numbers apply the limit, and `[queue] limit_overcommit` bounds the
//! sum of limits on a GPU (see [`crate::admission`]). No limit means limit = request; a limit
//! below the request is refused.

use std::time::Duration;

use crate::config::Policy;
use crate::inventory::{GpuMemory, Snapshot};
use crate::quantity::{self, Quantity};
use crate::spec::SpecView;

pub const MEMORY_ANNOTATION: &str = "vramgate.dev/memory";
pub const POLICY_ANNOTATION: &str = "vramgate.dev/policy";
pub const TIMEOUT_ANNOTATION: &str = "vramgate.dev/timeout";
pub const EXPECTED_DURATION_ANNOTATION: &str = "vramgate.dev/expected-duration";
pub const GPUS_ANNOTATION: &str = "vramgate.dev/gpus";
pub const MEMORY_ENV: &str = "VRAMGATE_MEMORY";
/// What the container may use at most, when more than its request (see the module docs).
pub const MEMORY_LIMIT_ANNOTATION: &str = "vramgate.dev/memory-limit";
/// The limit in the environment; also what the DRA driver writes for every claim device (the
/// claim's configured limit, else its request), so that a claim's container cannot bring one
/// of its own.
pub const MEMORY_LIMIT_ENV: &str = "VRAMGATE_MEMORY_LIMIT";
/// What a prepared DRA claim's CDI edits set, one variable per claim device
/// (`VRAMGATE_DRA_DEVICE_<device>=<device>:<secret>`, see [`crate::dra`]): a name of its own for each
/// device, so that two devices given to one container leave two variables (CDI merges
/// environments by name, the last one winning) and the request is refused, never half counted.
pub const CLAIM_DEVICE_ENV_PREFIX: &str = "VRAMGATE_DRA_DEVICE_";
/// What a prepared claim device's CDI edits set beside its marker, under the marker's own
/// suffix: `VRAMGATE_DRA_SHARE_<device>=<GPU UUID>,<bytes>,<limit bytes>`. A container given
/// several claim devices (a claim of `count: 2` or `allocationMode: All`, two requests, two
/// claims) gets one of each, where `VRAMGATE_MEMORY` and `VRAMGATE_GPUS`, one name for all
/// devices, keep only the last device's values: the request is read from these
/// ([`claim_shares`]).
pub const CLAIM_SHARE_ENV_PREFIX: &str = "VRAMGATE_DRA_SHARE_";
/// Where a request read from several claim devices came from, as messages name it.
pub const CLAIM_SHARE_SOURCE: &str = "the claim devices' VRAMGATE_DRA_SHARE_*";
pub const POLICY_ENV: &str = "VRAMGATE_POLICY";
pub const TIMEOUT_ENV: &str = "VRAMGATE_TIMEOUT";
pub const EXPECTED_DURATION_ENV: &str = "VRAMGATE_EXPECTED_DURATION";
pub const VISIBLE_DEVICES_ENV: &str = "NVIDIA_VISIBLE_DEVICES";
pub const GPUS_ENV: &str = "VRAMGATE_GPUS";
/// The device kind of NVIDIA's CDI spec (`nvidia-ctk cdi generate`): `nvidia.com/gpu=0`,
/// `=GPU-…`, `=0:1`, `=MIG-…`, `=all`.
pub const CDI_GPU_PREFIX: &str = "nvidia.com/gpu=";
/// Annotations through which device plugins and engines ask the runtime for CDI devices
/// (`cdi.k8s.io/<plugin>_<id>` = `nvidia.com/gpu=…,…`).
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// Where a CDI device request came from, as errors name it.
pub const CDI_SOURCE: &str = "cdi.k8s.io annotations";
/// The most GPUs `auto:N` may ask for.
pub const MAX_AUTO_GPUS: u32 = 64;
/// Where the Kubernetes runtimes say what a container of a pod is: containerd's CRI plugin,
/// then CRI-O. Both write [`CRI_SANDBOX`] on the pod's sandbox and `container` on the others.
pub const CRI_CONTAINER_TYPE_ANNOTATIONS: [&str; 2] =
    ["io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"];
pub const CRI_SANDBOX: &str = "sandbox";
/// Where containerd's CRI plugin, then CRI-O, write the name of a pod's container, which KAI's
/// annotations ([`NVIDIA_ANNOTATION_PREFIX`]) are keyed by.
pub const CRI_CONTAINER_NAME_ANNOTATIONS: [&str; 2] =
    ["io.kubernetes.cri.container-name", "io.kubernetes.container.name"];
/// NVIDIA's request variables, read by nvidia-container-toolkit's `apply-cuda-memory-limits`.
pub const NVIDIA_REQUEST_ENV: &str = "NVIDIA_GPU_MEMORY_REQUEST";
pub const NVIDIA_LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// KAI's per-container annotations: `nvidia.com/container.<name>.gpu-memory.request` / `.limit`.
pub const NVIDIA_ANNOTATION_PREFIX: &str = "nvidia.com/container.";
/// The largest whole-MiB amount whose bytes fit in a u64.
const MAX_NVIDIA_MIB: u64 = u64::MAX >> 20;

/// Longest device list we parse; 64 GPUs written as UUIDs fit in well under this.
const MAX_DEVICE_LIST_LEN: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("{source_name} = {value:?}: {reason}")]
    Invalid {
        source_name: String,
        value: String,
        reason: String,
    },
    #[error("{source_name} = {value:?} is a limit without a request: a limit bounds what the container may use beyond the memory it reserves; set vramgate.dev/memory (or VRAMGATE_MEMORY) as well, or remove the limit")]
    LimitWithoutRequest { source_name: String, value: String },
    #[error("the container requests VRAM ({memory}) but names no GPU: set NVIDIA_VISIBLE_DEVICES, pass an NVIDIA device, or set the annotation vramgate.dev/gpus")]
    NoGpu { memory: String },
    #[error("{source_name} = {value:?} names GPU {device:?}, which this host does not have (it has {available})")]
    UnknownGpu {
        source_name: String,
        value: String,
        device: String,
        available: String,
    },
    #[error("{source_name} = {value:?} names GPU {index}, which is in MIG mode: name one of its MIG devices instead ({index}:N or a MIG- UUID)")]
    MigParent {
        source_name: String,
        value: String,
        index: u32,
    },
    #[error("{source_name} = {value:?} leaves the choice of GPU to vramgate, which only vramgate-runtime can make (it rewrites the container's devices before it starts; a hook cannot): run the container with the vramgate runtime (docker run --runtime vramgate, podman run --runtime /usr/bin/vramgate-runtime, RuntimeClass vramgate) or name the GPU")]
    PlacementNeedsRuntime { source_name: String, value: String },
    #[error("the container was given {count} devices of Kubernetes resource claims ({devices}): vramgate holds a container to one amount on its GPUs, and their environments would overwrite each other's, leaving all but one unaccounted; give each container one claim with one request of driver gpu-memory.vramgate.dev")]
    SeveralClaimDevices { count: usize, devices: String },
    #[error("the container was given Kubernetes resource claim devices that hold different amounts on different GPUs ({shares}): vramgate holds a container to one amount on each of its GPUs (the MPS and toolkit limits are one number per container); ask for the same amount in each request (count or allocationMode: All do), or give each container the devices of one amount (resources.claims[].request)")]
    UnequalClaimShares { shares: String },
    #[error("the container was given a Kubernetes resource claim's device ({device}), whose memory and GPU the scheduler decided, and the annotation {annotation} would override them: remove the annotation from the pod")]
    ClaimAndAnnotation { device: String, annotation: String },
    #[error("{source_name} = {value:?} names {outside}, which the container's engine did not give it ({given_source} = {given_value:?}): vramgate only takes away what the engine gave, never adds a GPU (it may be another container's); name GPUs among those the engine gave, or give the container the GPU it names")]
    OutsideGiven {
        source_name: String,
        value: String,
        outside: String,
        given_source: String,
        given_value: String,
    },
    #[error("{vramgate} and {nvidia} ask for different amounts ({vramgate_amount} and {nvidia_amount}), and vramgate keeps one request and one limit: set one of them, or give both the same amounts (NVIDIA's in whole MiB)")]
    VocabulariesDisagree {
        vramgate: String,
        vramgate_amount: String,
        nvidia: String,
        nvidia_amount: String,
    },
    #[error("{limit_source} = {limit_value:?} ({limit}) is less than the request {request_source} ({request}): a limit is what the container may use at most, so it must be at least its request; raise the limit or leave it out (no limit means limit = request)")]
    LimitBelowRequest {
        limit_source: String,
        limit_value: String,
        limit: String,
        request_source: String,
        request: String,
    },
    #[error("{source_name} = {value:?} asks for {count} GPUs, but only {found} can take it here ({candidates})")]
    TooFewGpus {
        source_name: String,
        value: String,
        count: u32,
        found: usize,
        candidates: String,
    },
}

/// The DRA claim markers the container was given ([`CLAIM_DEVICE_ENV_PREFIX`]): each value
/// whole, the device's secret included (see [`crate::dra::cdi`]).
pub fn claim_markers(spec: &SpecView) -> impl Iterator<Item = &str> {
    spec.env_entries()
        .iter()
        .filter_map(|e| e.strip_prefix(CLAIM_DEVICE_ENV_PREFIX)?.split_once('=').map(|(_, v)| v))
}

/// The CDI device a claim marker's value names: what precedes its secret (`<uid>-gpu-0` of
/// `<uid>-gpu-0:<secret>`). What messages show; the secret never goes into a log.
pub fn claim_marker_device(value: &str) -> &str {
    value.split_once(':').map_or(value, |(name, _)| name)
}

/// The DRA claim devices the container was given, by name.
pub fn claim_devices(spec: &SpecView) -> impl Iterator<Item = &str> {
    claim_markers(spec).map(claim_marker_device)
}

/// The memory a container's claim devices give it, when it was given several: the same
/// amount (and limit) on each GPU they name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimShares {
    pub bytes: u64,
    pub limit: u64,
    /// Each GPU once, in the order the devices came.
    pub uuids: Vec<String>,
}

/// What several claim devices give the container ([`CLAIM_SHARE_ENV_PREFIX`]): devices on one
/// GPU add up (two requests of one claim on one device are one CDI device already; two
/// claims' devices on one GPU are two), and every GPU must then hold the same amount and the
/// same limit, which is what `count` and `allocationMode: All` give; other amounts are refused
/// ([`RequestError::UnequalClaimShares`]). `Ok(None)`: fewer than two devices (the one
/// device's `VRAMGATE_MEMORY` and `VRAMGATE_GPUS` say it). Devices whose spec has no share
/// (written by a driver before them) cannot be added up and are refused as before
/// ([`RequestError::SeveralClaimDevices`]).
pub fn claim_shares(spec: &SpecView) -> Result<Option<ClaimShares>, RequestError> {
    let markers: Vec<(&str, &str)> = spec
        .env_entries()
        .iter()
        .filter_map(|e| e.strip_prefix(CLAIM_DEVICE_ENV_PREFIX)?.split_once('='))
        .collect();
    if markers.len() < 2 {
        return Ok(None);
    }
    let several = || RequestError::SeveralClaimDevices {
        count: markers.len(),
        devices: markers
            .iter()
            .map(|(_, v)| claim_marker_device(v))
            .collect::<Vec<_>>()
            .join(", ")
            .chars()
            .take(200)
            .collect(),
    };
    // Per GPU: (UUID, bytes, limit), in the order the devices came.
    let mut per_gpu: Vec<(String, u64, u64)> = Vec::new();
    for (suffix, _) in &markers {
        let key = format!("{CLAIM_SHARE_ENV_PREFIX}{suffix}");
        let value = spec.env(&key).ok_or_else(several)?;
        let invalid = |reason: &str| RequestError::Invalid {
            source_name: key.clone(),
            value: value.chars().take(80).collect(),
            reason: reason.to_string(),
        };
        let mut fields = value.split(',');
        let (Some(uuid), Some(bytes), Some(limit), None) = (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(invalid(
                "must be <GPU UUID>,<bytes>,<limit bytes>, as the DRA driver writes it",
            ));
        };
        let (Ok(bytes), Ok(limit)) = (bytes.parse::<u64>(), limit.parse::<u64>()) else {
            return Err(invalid("bytes and limit must be whole numbers of bytes"));
        };
        if uuid.is_empty() || bytes == 0 || limit < bytes {
            return Err(invalid(
                "needs a GPU, at least one byte, and a limit of at least the bytes",
            ));
        }
        match per_gpu.iter_mut().find(|(u, _, _)| u == uuid) {
            Some((_, b, l)) => {
                *b = b.saturating_add(bytes);
                *l = l.saturating_add(limit);
            }
            None => per_gpu.push((uuid.to_string(), bytes, limit)),
        }
    }
    let (_, bytes, limit) = per_gpu[0].clone();
    if per_gpu.iter().any(|(_, b, l)| (*b, *l) != (bytes, limit)) {
        let shares = per_gpu
            .iter()
            .map(|(uuid, b, l)| {
                let mut said = format!("{} on {uuid}", quantity::format_bytes(*b));
                if l > b {
                    said += &format!(" (limit {})", quantity::format_bytes(*l));
                }
                said
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(RequestError::UnequalClaimShares {
            shares: shares.chars().take(300).collect(),
        });
    }
    Ok(Some(ClaimShares {
        bytes,
        limit,
        uuids: per_gpu.into_iter().map(|(uuid, _, _)| uuid).collect(),
    }))
}

/// Where a value came from, so that errors and logs name the place the user must edit.
fn annotation_or_env<'a>(
    spec: &'a SpecView,
    annotation: &'static str,
    env: &'static str,
) -> Option<(&'static str, &'a str)> {
    match spec.annotations.get(annotation) {
        Some(v) => Some((annotation, v.as_str())),
        None => spec.env(env).map(|v| (env, v)),
    }
}

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub memory: Quantity,
    /// Where the amount came from, as messages name it: a key, or NVIDIA's variables or
    /// annotations with their values.
    pub memory_source: String,
    /// True when the amount came from NVIDIA's vocabulary alone ([`nvidia_memory`]): the
    /// runtime wrapper then writes it into the spec as `vramgate.dev/memory`, since its
    /// enforcement may replace or remove NVIDIA's variables before the hook reads the spec.
    pub from_nvidia: bool,
    /// What the container may use at most, when it asked for more than its request (`None`:
    /// limit = request). Never below `memory` where both are in the same unit; a percentage
    /// beside bytes is compared on the GPU ([`Request::limit_on`]).
    pub limit: Option<Quantity>,
    /// Where the limit came from, as messages name it (empty without a limit).
    pub limit_source: String,
    /// True when the limit came from NVIDIA's vocabulary alone: the runtime wrapper pins it as
    /// `vramgate.dev/memory-limit`, as it pins the request (see `from_nvidia`).
    pub limit_from_nvidia: bool,
    pub policy: Option<Policy>,
    pub timeout: Option<Duration>,
    /// How long the container says it will run: only ever used to order waiters that all fit
    /// (`[queue] backfill_order = "longest"`), never to admit, place or end anything.
    pub expected_duration: Option<Duration>,
    pub gpus: GpuSelector,
    /// Things worth a line in the event log (an annotation overriding an env var).
    pub notes: Vec<String>,
}

/// What a container is to Kubernetes, from the annotation its CRI runtime writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRole {
    /// Not started by a CRI runtime (Docker, podman, `ctr`, plain runc).
    NotInPod,
    /// A pod's sandbox ("pause") container, which holds the pod's namespaces.
    Sandbox,
    /// One of a pod's own containers (an app, init or ephemeral container).
    Container,
}

pub fn pod_role(spec: &SpecView) -> PodRole {
    let kind = CRI_CONTAINER_TYPE_ANNOTATIONS
        .iter()
        .find_map(|key| spec.annotations.get(*key));
    match kind.map(String::as_str) {
        None => PodRole::NotInPod,
        Some(CRI_SANDBOX) => PodRole::Sandbox,
        Some(_) => PodRole::Container,
    }
}

/// True when the spec asks for VRAM at all. This is the whole of the no-request fast path,
/// and the one place that decides which containers of a pod have a request (see the module
/// documentation): the hook admits, and the runtime wrapper adds hooks, only where it is true.
pub fn has_request(spec: &SpecView) -> bool {
    // NVIDIA's variables and KAI's annotations name this container: its own request. A limit
    // alone is read too, to be refused: a container must not believe itself bounded and held
    // to a reservation when it has none.
    let own =
        spec.env(MEMORY_ENV).is_some() || spec.env(MEMORY_LIMIT_ENV).is_some() || nvidia_sources(spec).next().is_some();
    let annotated =
        spec.annotations.contains_key(MEMORY_ANNOTATION) || spec.annotations.contains_key(MEMORY_LIMIT_ANNOTATION);
    match pod_role(spec) {
        PodRole::NotInPod => annotated || own,
        PodRole::Sandbox => false,
        // An annotation here is the pod's, copied into each of its containers: it applies to
        // those that name a GPU. An unreadable device list counts as naming one, so the
        // request is read and refused with what is wrong with it.
        PodRole::Container => own || (annotated && !names_no_gpu(spec)),
    }
}

fn names_no_gpu(spec: &SpecView) -> bool {
    GpuSelector::from_spec(spec).is_ok_and(|s| s.selection == GpuSelection::Nothing)
}

impl Request {
    /// The request in `spec`, `Ok(None)` when it has none ([`has_request`] decides).
    pub fn from_spec(spec: &SpecView) -> Result<Option<Request>, RequestError> {
        if !has_request(spec) {
            return Ok(None);
        }
        let claim_devices: Vec<&str> = claim_devices(spec).collect();
        // Several devices: the amount on each GPU, from their shares (or refused).
        let claim = claim_shares(spec)?;
        if let Some(device) = claim_devices.first() {
            // The claim's env says what the scheduler counted; an annotation (the pod's,
            // copied into each container) would reserve something else.
            for annotation in [MEMORY_ANNOTATION, MEMORY_LIMIT_ANNOTATION, GPUS_ANNOTATION] {
                if spec.annotations.contains_key(annotation) {
                    return Err(RequestError::ClaimAndAnnotation {
                        device: device.chars().take(100).collect(),
                        annotation: annotation.to_string(),
                    });
                }
            }
        }
        let invalid = |source_name: &str, value: &str, reason: String| RequestError::Invalid {
            source_name: source_name.to_string(),
            value: value.chars().take(80).collect(),
            reason,
        };
        let mut notes = Vec::new();
        let nvidia = nvidia_memory(spec, &mut notes)?;
        // Several claim devices' amount stands for VRAMGATE_MEMORY and VRAMGATE_MEMORY_LIMIT,
        // which hold only the last device's (and the container's own limit, as one device's
        // appended limit does).
        let claim_amounts = claim.as_ref().map(|c| (c.bytes.to_string(), c.limit.to_string()));
        let own = match &claim_amounts {
            Some((bytes, _)) => Some((CLAIM_SHARE_SOURCE, bytes.as_str())),
            None => annotation_or_env(spec, MEMORY_ANNOTATION, MEMORY_ENV),
        };
        let claim_limit = claim
            .as_ref()
            .zip(claim_amounts.as_ref())
            .map(|(c, (_, limit))| (CLAIM_SHARE_SOURCE, limit.as_str(), Quantity::Bytes(c.limit)));
        let own_limit = match annotation_or_env(spec, MEMORY_LIMIT_ANNOTATION, MEMORY_LIMIT_ENV) {
            _ if claim_limit.is_some() => claim_limit,
            None => None,
            Some((source, value)) => Some((
                source,
                value,
                quantity::parse_quantity(value).map_err(|e| invalid(source, value, e.to_string()))?,
            )),
        };
        let quoted = |source: &str, value: &str| format!("{source} = {:?}", value.chars().take(80).collect::<String>());
        // (amount, where it came from, from NVIDIA alone) for the request and for the limit.
        let (memory, memory_source, memory_value, limit) = match (own, nvidia) {
            (None, None) => {
                return match own_limit {
                    Some((source, value, _)) => Err(RequestError::LimitWithoutRequest {
                        source_name: source.to_string(),
                        value: value.chars().take(80).collect(),
                    }),
                    None => Ok(None),
                }
            }
            (None, Some(n)) => {
                let limit = match own_limit {
                    // vramgate's limit beside NVIDIA's pair: the same limit, or refused.
                    Some((source, value, q)) if q != n.limit => {
                        return Err(RequestError::VocabulariesDisagree {
                            vramgate: quoted(source, value),
                            vramgate_amount: format!("limit {q}"),
                            nvidia: n.described,
                            nvidia_amount: format!("limit {}", n.limit),
                        })
                    }
                    Some((source, _, q)) => (q, source.to_string(), false),
                    None => (n.limit, n.described.clone(), true),
                };
                (n.request, n.described, None, limit)
            }
            (Some((source, value)), nvidia) => {
                let memory = quantity::parse_quantity(value).map_err(|e| invalid(source, value, e.to_string()))?;
                let limit = match own_limit {
                    Some((limit_source, _, q)) => (q, limit_source.to_string(), false),
                    None => (memory, source.to_string(), false),
                };
                if let Some(n) = nvidia {
                    // Comparable only in bytes: a share of the GPU beside NVIDIA's MiB is two
                    // different requests until the GPU is known, so it is refused as one. Both
                    // spellings of the pair, each with its limit defaulted to its request.
                    if memory != n.request || limit.0 != n.limit {
                        let mut vramgate = quoted(source, value);
                        if let Some((limit_source, limit_value, _)) = own_limit {
                            vramgate += &format!(" with {}", quoted(limit_source, limit_value));
                        }
                        let pair = |r: Quantity, l: Quantity| {
                            if r == l {
                                r.to_string()
                            } else {
                                format!("request {r}, limit {l}")
                            }
                        };
                        return Err(RequestError::VocabulariesDisagree {
                            vramgate,
                            vramgate_amount: pair(memory, limit.0),
                            nvidia: n.described,
                            nvidia_amount: pair(n.request, n.limit),
                        });
                    }
                }
                (memory, source.to_string(), Some(value), limit)
            }
        };
        let (limit, limit_source, limit_from_nvidia) = limit;
        let below = match (memory, limit) {
            (Quantity::Bytes(r), Quantity::Bytes(l)) => l < r,
            (Quantity::PartsPerMillion(r), Quantity::PartsPerMillion(l)) => l < r,
            // A share of the GPU beside bytes: compared once the GPU is known (limit_on).
            _ => false,
        };
        if below {
            let limit_value = own_limit.map_or_else(|| limit.to_string(), |(_, v, _)| v.chars().take(80).collect());
            return Err(RequestError::LimitBelowRequest {
                limit_source,
                limit_value,
                limit: limit.to_string(),
                request_source: memory_source,
                request: memory.to_string(),
            });
        }
        let (limit, limit_source) = if limit == memory {
            (None, String::new())
        } else {
            (Some(limit), limit_source)
        };
        let from_nvidia = memory_value.is_none();
        let memory_value = memory_value.unwrap_or_default();
        if memory_source == MEMORY_ANNOTATION {
            if let Some(env_value) = spec.env(MEMORY_ENV) {
                notes.push(format!(
                    "annotation {MEMORY_ANNOTATION}={memory_value:?} overrides env {MEMORY_ENV}={:?}",
                    env_value.chars().take(80).collect::<String>()
                ));
            }
        }
        if limit_source == MEMORY_LIMIT_ANNOTATION {
            if let Some(env_value) = spec.env(MEMORY_LIMIT_ENV) {
                notes.push(format!(
                    "annotation {MEMORY_LIMIT_ANNOTATION} overrides env {MEMORY_LIMIT_ENV}={:?}",
                    env_value.chars().take(80).collect::<String>()
                ));
            }
        }
        let policy = match annotation_or_env(spec, POLICY_ANNOTATION, POLICY_ENV) {
            None => None,
            Some((source, value)) => Some(
                Policy::parse(value)
                    .ok_or_else(|| invalid(source, value, "the policy must be \"reject\" or \"wait\"".into()))?,
            ),
        };
        let timeout = match annotation_or_env(spec, TIMEOUT_ANNOTATION, TIMEOUT_ENV) {
            None => None,
            Some((source, value)) => {
                Some(quantity::parse_duration(value).map_err(|e| invalid(source, value, e.to_string()))?)
            }
        };
        let expected_duration = match annotation_or_env(spec, EXPECTED_DURATION_ANNOTATION, EXPECTED_DURATION_ENV) {
            None => None,
            Some((source, value)) => {
                Some(quantity::parse_duration(value).map_err(|e| invalid(source, value, e.to_string()))?)
            }
        };
        let gpus = match &claim {
            Some(c) => GpuSelector::own(spec, CLAIM_SHARE_SOURCE, &c.uuids.join(","))?,
            None => GpuSelector::from_spec(spec)?,
        };
        if gpus.selection == GpuSelection::Nothing {
            return Err(RequestError::NoGpu {
                memory: memory.to_string(),
            });
        }
        Ok(Some(Request {
            memory,
            memory_source,
            from_nvidia,
            limit,
            limit_source,
            limit_from_nvidia: limit_from_nvidia && limit.is_some(),
            policy,
            timeout,
            expected_duration,
            gpus,
            notes,
        }))
    }
}

impl Request {
    /// The limit in bytes on a GPU of `total` bytes: the request's bytes when no limit was
    /// asked. A limit below the request on this GPU (a percentage beside bytes, which only the
    /// GPU's size can compare) is refused with the same line as one found in the spec.
    pub fn limit_on(&self, total: u64) -> Result<u64, RequestError> {
        let request = self.memory.bytes_on(total);
        let Some(limit) = self.limit else {
            return Ok(request);
        };
        let bytes = limit.bytes_on(total);
        if bytes < request {
            return Err(RequestError::LimitBelowRequest {
                limit_source: self.limit_source.clone(),
                limit_value: limit.to_string(),
                limit: crate::quantity::format_bytes(bytes),
                request_source: self.memory_source.clone(),
                request: crate::quantity::format_bytes(request),
            });
        }
        Ok(bytes)
    }
}

/// NVIDIA's spelling of a container's request, read and checked ([`nvidia_memory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaMemory {
    /// The request in bytes: NVIDIA's request, or its limit when it gives no request.
    pub request: Quantity,
    /// The limit in bytes: NVIDIA's limit, or its request when it gives no limit.
    pub limit: Quantity,
    /// The keys and values it came from, as messages show them
    /// (`NVIDIA_GPU_MEMORY_LIMIT = "2048"`).
    pub described: String,
}

/// The name this container has in its pod, from its CRI runtime's annotation.
fn container_name(spec: &SpecView) -> Option<&str> {
    CRI_CONTAINER_NAME_ANNOTATIONS
        .iter()
        .find_map(|key| spec.annotations.get(*key))
        .map(String::as_str)
}

/// True when the spec's NVIDIA variables are vramgate-runtime's own: under `limit = "toolkit"`
/// it replaces them with the reservation's values for the toolkit's hook (and records the tier
/// in [`crate::hook::ENFORCEMENT_ANNOTATION`], which it removes from any spec that brings it),
/// so the hook that confirms must not read them back as the container's request.
fn nvidia_env_written_by_vramgate(spec: &SpecView) -> bool {
    // The wrapper writes the toolkit's variables only for a container it admitted on a request
    // in vramgate's words (its own, or NVIDIA's pinned as `vramgate.dev/memory`). A container
    // on the hook's path that brings the annotation itself but asks only in NVIDIA's words
    // still has its variables read as its request: the annotation never takes a request away.
    spec.annotations
        .get(crate::hook::ENFORCEMENT_ANNOTATION)
        .map(String::as_str)
        == Some(crate::enforce::Tier::ToolkitLimit.as_str())
        && annotation_or_env(spec, MEMORY_ANNOTATION, MEMORY_ENV).is_some()
}

/// NVIDIA's request keys the spec sets for this container, `(key, value)`: KAI's annotations for
/// the container's name when there is one, else the two variables. Annotations win over the
/// environment as vramgate's own do (KAI injects the variables from the annotations, so a pod
/// normally carries both, with the same values).
fn nvidia_sources(spec: &SpecView) -> impl Iterator<Item = (String, &str)> {
    let annotated: Vec<(String, &str)> = container_name(spec)
        .into_iter()
        .flat_map(|name| ["request", "limit"].map(|kind| format!("{NVIDIA_ANNOTATION_PREFIX}{name}.gpu-memory.{kind}")))
        .filter_map(|key| spec.annotations.get(&key).map(|v| (key, v.as_str())))
        .collect();
    let env: Vec<(String, &str)> = if nvidia_env_written_by_vramgate(spec) {
        Vec::new()
    } else {
        [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV]
            .into_iter()
            .filter_map(|key| spec.env(key).map(|v| (key.to_string(), v)))
            .collect()
    };
    if annotated.is_empty() { env } else { annotated }.into_iter()
}

/// One NVIDIA amount: whole MiB, a decimal integer, as the toolkit's hook parses it (Go's
/// `strconv.ParseUint(value, 10, 64)`: digits only, no sign, no unit, no spaces), and small
/// enough that its bytes fit in 64 bits.
fn parse_mib(key: &str, value: &str) -> Result<u64, RequestError> {
    let invalid = |reason: String| RequestError::Invalid {
        source_name: key.to_string(),
        value: value.chars().take(80).collect(),
        reason,
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            "NVIDIA's memory amounts are whole MiB, written as a decimal integer with no unit (1024 is 1 GiB)".into(),
        ));
    }
    match value.parse::<u64>() {
        Ok(mib) if mib <= MAX_NVIDIA_MIB => Ok(mib),
        _ => Err(invalid(format!(
            "is too large to be a memory amount (at most {MAX_NVIDIA_MIB} MiB)"
        ))),
    }
}

/// The request and limit NVIDIA's vocabulary makes for this container, `None` when it says
/// nothing. Either alone stands for both (a lone limit is reserved whole, which never
/// over-commits). A request above the limit is refused, as the toolkit's hook refuses it. A note is added when KAI's annotations
/// override variables that say something else.
pub fn nvidia_memory(spec: &SpecView, notes: &mut Vec<String>) -> Result<Option<NvidiaMemory>, RequestError> {
    let sources: Vec<(String, &str)> = nvidia_sources(spec).collect();
    if sources.is_empty() {
        return Ok(None);
    }
    let mut request = None;
    let mut limit = None;
    for (key, value) in &sources {
        let mib = parse_mib(key, value)?;
        if key.ends_with("request") || key == NVIDIA_REQUEST_ENV {
            request = Some((key.as_str(), *value, mib));
        } else {
            limit = Some((key.as_str(), *value, mib));
        }
    }
    if let (Some((req_key, req_value, req)), Some((lim_key, lim_value, lim))) = (request, limit) {
        if req > lim {
            return Err(RequestError::Invalid {
                source_name: req_key.to_string(),
                value: req_value.chars().take(80).collect(),
                reason: format!(
                    "is more than {lim_key} = {lim_value:?}: a request cannot exceed the limit (NVIDIA's hook refuses it too)"
                ),
            });
        }
    }
    let request_mib = request.or(limit).map_or(0, |(_, _, mib)| mib);
    let limit_mib = limit.or(request).map_or(0, |(_, _, mib)| mib);
    let mib = request_mib.max(limit_mib);
    let described = sources
        .iter()
        .map(|(key, value)| format!("{key} = {:?}", value.chars().take(40).collect::<String>()))
        .collect::<Vec<_>>()
        .join(", ");
    if mib == 0 {
        return Err(RequestError::Invalid {
            source_name: sources
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(" and "),
            value: sources.iter().map(|(_, v)| *v).collect::<Vec<_>>().join(", "),
            reason: "is zero: a request must be at least 1 MiB".into(),
        });
    }
    if sources[0].0.starts_with(NVIDIA_ANNOTATION_PREFIX) && !nvidia_env_written_by_vramgate(spec) {
        let env: Vec<String> = [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV]
            .into_iter()
            .filter_map(|key| {
                spec.env(key)
                    .map(|v| format!("{key}={:?}", v.chars().take(40).collect::<String>()))
            })
            .collect();
        let same = [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV].into_iter().all(|key| {
            let kind = if key == NVIDIA_REQUEST_ENV { "request" } else { "limit" };
            let from_annotation = sources.iter().find(|(k, _)| k.ends_with(kind)).map(|(_, v)| *v);
            spec.env(key).is_none() || spec.env(key) == from_annotation
        });
        if !env.is_empty() && !same {
            notes.push(format!("annotations {described} override env {}", env.join(", ")));
        }
    }
    // A zero request beside a non-zero limit: the limit alone says anything, so it stands for
    // both rather than admit a container that reserves nothing.
    let request_mib = if request_mib == 0 { limit_mib } else { request_mib };
    Ok(Some(NvidiaMemory {
        request: Quantity::Bytes(request_mib << 20),
        limit: Quantity::Bytes(limit_mib << 20),
        described,
    }))
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
    /// 4. `NVIDIA_VISIBLE_DEVICES` (indices, UUIDs, MIG pairs, CDI names, `all`).
    pub fn from_spec(spec: &SpecView) -> Result<GpuSelector, RequestError> {
        let own = match spec.annotations.get(GPUS_ANNOTATION) {
            Some(value) => Some((GPUS_ANNOTATION, value.as_str())),
            None => spec.env(GPUS_ENV).map(|v| (GPUS_ENV, v)),
        };
        match own {
            Some((source, value)) => GpuSelector::own(spec, source, value),
            None => GpuSelector::given(spec),
        }
    }

    /// vramgate's own word `value` (from `source`) on the GPUs, within those the engine gave
    /// the container (see [`GpuSelector::within`]).
    fn own(spec: &SpecView, source: &str, value: &str) -> Result<GpuSelector, RequestError> {
        let mut selector = GpuSelector::parse(source, value, true)?;
        let given = GpuSelector::given(spec)?;
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

    /// The GPUs the engine gave the container (sources 2 to 4 of [`GpuSelector::from_spec`]).
    fn given(spec: &SpecView) -> Result<GpuSelector, RequestError> {
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
        if let Some(value) = spec.env(VISIBLE_DEVICES_ENV) {
            return GpuSelector::parse(VISIBLE_DEVICES_ENV, value, false);
        }
        Ok(GpuSelector {
            selection: GpuSelection::Nothing,
            source_name: "linux.devices".to_string(),
            value: String::new(),
            within: None,
        })
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

/// `/dev/nvidia-caps/nvidia-cap12` is MIG capability 12.
pub(crate) fn mig_cap_minor(path: &str) -> Option<u32> {
    device_number(path, "/dev/nvidia-caps/nvidia-cap")
}

/// `/dev/nvidia3` is GPU minor 3; `/dev/nvidiactl`, `/dev/nvidia-uvm` and the like are not GPUs.
pub(crate) fn nvidia_minor(path: &str) -> Option<u32> {
    device_number(path, "/dev/nvidia")
}

/// The number that follows `prefix` in a device node's path, when only digits follow.
fn device_number(path: &str, prefix: &str) -> Option<u32> {
    let digits = path.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::GpuMemory;
    use std::path::Path;

    fn spec(json: &str) -> SpecView {
        SpecView::parse(json.as_bytes(), Path::new("/b/config.json")).unwrap()
    }

    #[test]
    fn a_claims_container_takes_the_claims_amount_or_is_refused() {
        let one = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
            "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]}}"#;
        let request = Request::from_spec(&spec(one)).unwrap().expect("a request");
        assert_eq!(request.memory, Quantity::Bytes(6 << 30));
        let two = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
            "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0:5ecret1","VRAMGATE_DRA_DEVICE_u2_gpu_1=u2-gpu-1:5ecret2"]}}"#;
        let err = Request::from_spec(&spec(two)).unwrap_err();
        assert!(
            matches!(err, RequestError::SeveralClaimDevices { count: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("u1-gpu-0, u2-gpu-1"), "{err}");
        assert!(
            !err.to_string().contains("5ecret"),
            "a marker's secret never goes into a message: {err}"
        );
        let annotated = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
            "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]},"annotations":{"vramgate.dev/memory":"1Gi"}}"#;
        let err = Request::from_spec(&spec(annotated)).unwrap_err();
        assert!(matches!(err, RequestError::ClaimAndAnnotation { .. }), "{err}");
        assert!(err.to_string().contains("remove the annotation"), "{err}");
        // A limit of its own beside the claim: by annotation refused; by env (before the
        // claim's, as CDI appends its edits) the claim's wins.
        let widened = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
            "VRAMGATE_MEMORY_LIMIT=6Gi","VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]},
            "annotations":{"vramgate.dev/memory-limit":"60Gi"}}"#;
        let err = Request::from_spec(&spec(widened)).unwrap_err();
        assert!(
            matches!(&err, RequestError::ClaimAndAnnotation { annotation, .. } if annotation == MEMORY_LIMIT_ANNOTATION),
            "{err}"
        );
        let own_env = r#"{"process":{"env":["VRAMGATE_MEMORY_LIMIT=60Gi","VRAMGATE_MEMORY=6Gi",
            "VRAMGATE_GPUS=GPU-aaaa","VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0","VRAMGATE_MEMORY_LIMIT=6442450944"]}}"#;
        let request = Request::from_spec(&spec(own_env)).unwrap().expect("a request");
        // The claim's limit, equal to its request, is no limit above it: not the 60Gi.
        assert_eq!(request.limit.unwrap_or(request.memory), Quantity::Bytes(6 << 30));
    }

    /// Several claim devices, each with its share (as the driver writes them since shares):
    /// the amount on each of their GPUs, devices on one GPU added up, other amounts refused.
    #[test]
    fn several_claim_devices_reserve_their_amount_on_each_of_their_gpus() {
        // CDI applies each device's edits in turn: VRAMGATE_MEMORY and VRAMGATE_GPUS hold the
        // last device's, the shares and markers one each.
        let devices = |shares: &[(&str, &str)]| {
            let mut env = vec![r#""VRAMGATE_MEMORY_LIMIT=99Gi""#.to_string()];
            for (n, (device, share)) in shares.iter().enumerate() {
                let (uuid, bytes) = share.split_once(',').unwrap();
                env.push(format!(r#""VRAMGATE_MEMORY={bytes}""#));
                env.push(format!(r#""VRAMGATE_GPUS={uuid}""#));
                env.push(format!(
                    r#""VRAMGATE_DRA_DEVICE_u1_{device}=u1-{}:5ecret{n}""#,
                    device.replace('_', "-")
                ));
                env.push(format!(r#""VRAMGATE_DRA_SHARE_u1_{device}={share}""#));
                let limit = share.rsplit(',').next().unwrap();
                env.push(format!(r#""VRAMGATE_MEMORY_LIMIT={limit}""#));
            }
            spec(&format!(r#"{{"process":{{"env":[{}]}}}}"#, env.join(",")))
        };
        let gi = |n: u64| n << 30;
        let both = devices(&[
            ("gpu_0", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
            ("gpu_1", &format!("GPU-bbbb,{},{}", gi(4), gi(4))),
        ]);
        let request = Request::from_spec(&both).unwrap().expect("a request");
        assert_eq!(request.memory, Quantity::Bytes(gi(4)));
        assert_eq!(
            request.limit, None,
            "the claim's limit is its request, not the container's 99Gi"
        );
        assert_eq!(
            request.gpus.selection,
            GpuSelection::Devices(vec![
                DeviceRef::Uuid("GPU-aaaa".into()),
                DeviceRef::Uuid("GPU-bbbb".into())
            ])
        );
        assert_eq!(request.memory_source, CLAIM_SHARE_SOURCE);
        // Two devices on one GPU (two claims there) add up, limits too.
        let one_gpu = devices(&[
            ("gpu_0", &format!("GPU-aaaa,{},{}", gi(2), gi(3))),
            ("gpu_0_x", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
        ]);
        let request = Request::from_spec(&one_gpu).unwrap().expect("a request");
        assert_eq!(request.memory, Quantity::Bytes(gi(6)));
        assert_eq!(request.limit, Some(Quantity::Bytes(gi(7))));
        assert_eq!(
            request.gpus.selection,
            GpuSelection::Devices(vec![DeviceRef::Uuid("GPU-aaaa".into())])
        );
        // Different amounts on different GPUs: one line, the amounts said, no secret.
        let unequal = devices(&[
            ("gpu_0", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
            ("gpu_1", &format!("GPU-bbbb,{},{}", gi(6), gi(6))),
        ]);
        let err = Request::from_spec(&unequal).unwrap_err();
        assert!(matches!(err, RequestError::UnequalClaimShares { .. }), "{err}");
        assert!(
            err.to_string().contains("4096 MiB on GPU-aaaa, 6144 MiB on GPU-bbbb"),
            "{err}"
        );
        assert!(!err.to_string().contains("5ecret"), "{err}");
        assert_eq!(err.to_string().lines().count(), 1);
        // A share the driver did not write.
        let odd = devices(&[("gpu_0", "GPU-aaaa,4Gi,4Gi"), ("gpu_1", "GPU-bbbb,1,1")]);
        let err = Request::from_spec(&odd).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("VRAMGATE_DRA_SHARE_u1_gpu_0 = \"GPU-aaaa,4Gi,4Gi\""),
            "{err}"
        );
    }

    fn gpu(index: u32, mig: Option<u32>, uuid: &str) -> GpuMemory {
        GpuMemory::for_test(index, mig, uuid)
    }

    fn host() -> Snapshot {
        Snapshot {
            gpus: vec![gpu(0, None, "GPU-aaaa"), gpu(1, None, "GPU-bbbb")],
            ..Snapshot::default()
        }
    }

    #[test]
    fn no_request_is_none() {
        assert_eq!(
            Request::from_spec(&spec(r#"{"process":{"env":["PATH=/bin"]}}"#)),
            Ok(None)
        );
        assert!(!has_request(&spec("{}")));
    }

    #[test]
    fn annotation_wins_over_env_with_a_note() {
        let r = Request::from_spec(&spec(
            r#"{"annotations":{"vramgate.dev/memory":"2Gi"},"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0"]}}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(r.memory, Quantity::Bytes(2 << 30));
        assert_eq!(r.memory_source, MEMORY_ANNOTATION);
        assert_eq!(r.notes.len(), 1);
        assert!(r.notes[0].contains("overrides"));
    }

    #[test]
    fn env_only_request_with_policy_and_timeout() {
        let r = Request::from_spec(&spec(
            r#"{"process":{"env":["VRAMGATE_MEMORY=1205Mi","VRAMGATE_POLICY=wait","VRAMGATE_TIMEOUT=90s","NVIDIA_VISIBLE_DEVICES=all"]}}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(r.policy, Some(Policy::Wait));
        assert_eq!(r.timeout, Some(Duration::from_secs(90)));
        assert_eq!(r.gpus.selection, GpuSelection::All);
    }

    #[test]
    fn bad_values_name_their_source() {
        let cases = [
            (
                r#"{"annotations":{"vramgate.dev/memory":"lots"}}"#,
                "vramgate.dev/memory",
            ),
            (
                r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/policy":"maybe","vramgate.dev/gpus":"0"}}"#,
                "vramgate.dev/policy",
            ),
            (
                r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","VRAMGATE_TIMEOUT=soon","NVIDIA_VISIBLE_DEVICES=0"]}}"#,
                "VRAMGATE_TIMEOUT",
            ),
            (
                r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0,gpu7"]}}"#,
                "NVIDIA_VISIBLE_DEVICES",
            ),
            (
                r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=none"]}}"#,
                "names no GPU",
            ),
            (r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi"]}}"#, "names no GPU"),
        ];
        for (json, needle) in cases {
            let err = Request::from_spec(&spec(json)).expect_err(json).to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn a_pod_sandbox_never_has_a_request() {
        // What containerd's CRI plugin and CRI-O write into a sandbox's spec: the pod's
        // annotations and the marker.
        for marker in CRI_CONTAINER_TYPE_ANNOTATIONS {
            let s = spec(&format!(
                r#"{{"annotations":{{"vramgate.dev/memory":"1205Mi","vramgate.dev/gpus":"0","{marker}":"sandbox"}},"process":{{"env":["VRAMGATE_MEMORY=1Gi"]}}}}"#
            ));
            assert_eq!(pod_role(&s), PodRole::Sandbox, "{marker}");
            assert!(!has_request(&s), "{marker}");
            assert_eq!(Request::from_spec(&s), Ok(None), "{marker}");
        }
    }

    #[test]
    fn a_pod_annotation_applies_to_the_containers_that_name_a_gpu() {
        let container = |extra: &str, env: &str| {
            spec(&format!(
                r#"{{"annotations":{{"vramgate.dev/memory":"1205Mi","io.kubernetes.cri.container-type":"container"{extra}}},"process":{{"env":["PATH=/bin"{env}]}}}}"#
            ))
        };
        // The pod names the GPU for all its containers, or the device plugin for one.
        for s in [
            container(r#","vramgate.dev/gpus":"0""#, ""),
            container("", r#","NVIDIA_VISIBLE_DEVICES=0""#),
        ] {
            assert_eq!(pod_role(&s), PodRole::Container);
            let r = Request::from_spec(&s).unwrap().unwrap();
            assert_eq!(r.memory, Quantity::Bytes(1205 << 20));
            assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa"]);
        }
        // A sidecar with no GPU: no request, where outside a pod the same spec is refused.
        for env in ["", r#","NVIDIA_VISIBLE_DEVICES=none""#] {
            let sidecar = container("", env);
            assert!(!has_request(&sidecar));
            assert_eq!(Request::from_spec(&sidecar), Ok(None));
        }
        let outside = spec(r#"{"annotations":{"vramgate.dev/memory":"1205Mi"}}"#);
        assert_eq!(pod_role(&outside), PodRole::NotInPod);
        assert!(matches!(Request::from_spec(&outside), Err(RequestError::NoGpu { .. })));
        // A bad device list is still reported, and a container's own env request keeps the rule.
        let bad = container("", r#","NVIDIA_VISIBLE_DEVICES=gpu7""#);
        assert!(matches!(Request::from_spec(&bad), Err(RequestError::Invalid { .. })));
        let own = container("", r#","VRAMGATE_MEMORY=1Gi""#);
        assert!(matches!(Request::from_spec(&own), Err(RequestError::NoGpu { .. })));
    }

    /// NVIDIA's variables and KAI's annotations are a request: the request with the limit beside
    /// it (either alone stands for both), parsed as strictly as the toolkit's hook, and refused
    /// where vramgate's word disagrees.
    #[test]
    fn nvidia_vocabulary_is_a_request() {
        let env = |vars: &str| {
            spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{vars}]}}}}"#
            ))
        };
        let memory = |s: &SpecView| Request::from_spec(s).map(|r| r.map(|r| (r.memory, r.from_nvidia)));
        assert!(has_request(&env(r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#)));
        assert_eq!(
            memory(&env(r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#)),
            Ok(Some((Quantity::Bytes(2 << 30), true)))
        );
        assert_eq!(
            memory(&env(r#","NVIDIA_GPU_MEMORY_REQUEST=1024""#)),
            Ok(Some((Quantity::Bytes(1 << 30), true)))
        );
        // Both: the request is reserved, the limit kept beside it.
        let both = Request::from_spec(&env(
            r#","NVIDIA_GPU_MEMORY_REQUEST=0512","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (both.memory, both.from_nvidia, both.limit, both.limit_from_nvidia),
            (Quantity::Bytes(512 << 20), true, Some(Quantity::Bytes(3 << 30)), true)
        );
        // vramgate's word beside the same amount: one request, vramgate's.
        assert_eq!(
            memory(&env(r#","VRAMGATE_MEMORY=3Gi","NVIDIA_GPU_MEMORY_LIMIT=3072""#)),
            Ok(Some((Quantity::Bytes(3 << 30), false)))
        );
        // Disagreeing: one line naming both.
        for vars in [
            r#","VRAMGATE_MEMORY=2Gi","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
            r#","VRAMGATE_MEMORY=25%","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
        ] {
            let err = Request::from_spec(&env(vars)).unwrap_err();
            assert!(
                matches!(err, RequestError::VocabulariesDisagree { .. }),
                "{vars}: {err}"
            );
            let line = err.to_string();
            assert!(
                line.contains("VRAMGATE_MEMORY = ") && line.contains("NVIDIA_GPU_MEMORY_LIMIT = \"3072\""),
                "{line}"
            );
        }
        // As strict as Go's strconv.ParseUint(v, 10, 64), and the bytes must fit.
        for bad in [
            "",
            "1Gi",
            "1024Mi",
            "+5",
            "-1",
            " 5",
            "5 ",
            "1.5",
            "0x10",
            "1_000",
            "18446744073709551616",
            "17592186044416",
        ] {
            let err = Request::from_spec(&env(&format!(r#","NVIDIA_GPU_MEMORY_LIMIT={bad}""#))).unwrap_err();
            assert!(
                matches!(&err, RequestError::Invalid { source_name, .. } if source_name == NVIDIA_LIMIT_ENV),
                "{bad:?}: {err}"
            );
        }
        // Request above the limit, and zero, refused as the toolkit's hook and VRAMGATE_MEMORY do.
        let err = Request::from_spec(&env(
            r#","NVIDIA_GPU_MEMORY_REQUEST=4096","NVIDIA_GPU_MEMORY_LIMIT=1024""#,
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot exceed the limit"), "{err}");
        let err = Request::from_spec(&env(r#","NVIDIA_GPU_MEMORY_REQUEST=0""#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is zero"), "{err}");
        // NVIDIA's variables with no GPU: refused like VRAMGATE_MEMORY.
        let s = spec(r#"{"process":{"env":["NVIDIA_GPU_MEMORY_LIMIT=1024"]}}"#);
        assert!(matches!(Request::from_spec(&s), Err(RequestError::NoGpu { .. })));
        // The variables vramgate-runtime wrote for the toolkit's hook are not read back.
        let written = spec(
            r#"{"annotations":{"vramgate.dev/enforcement":"toolkit_limit","vramgate.dev/memory":"3221225472"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_GPU_MEMORY_REQUEST=0","NVIDIA_GPU_MEMORY_LIMIT=3071"]}}"#,
        );
        assert_eq!(memory(&written), Ok(Some((Quantity::Bytes(3 << 30), false))));
        // A container that brings the annotation itself, asking only in NVIDIA's words (the
        // hook's path: no wrapper wrote anything), is still a request: the annotation never
        // takes one away.
        let brought = spec(
            r#"{"annotations":{"vramgate.dev/enforcement":"toolkit_limit"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_GPU_MEMORY_LIMIT=40960"]}}"#,
        );
        assert_eq!(memory(&brought), Ok(Some((Quantity::Bytes(40 << 30), true))));
    }

    #[test]
    fn a_limit_beside_the_request() {
        let with = |annotations: &str, env: &str| {
            Request::from_spec(&spec(&format!(
                r#"{{"annotations":{{{annotations}}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{env}]}}}}"#
            )))
        };
        let r = with(r#""vramgate.dev/memory":"2Gi","vramgate.dev/memory-limit":"6Gi""#, "")
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.memory, r.limit),
            (Quantity::Bytes(2 << 30), Some(Quantity::Bytes(6 << 30)))
        );
        assert_eq!(r.limit_source, MEMORY_LIMIT_ANNOTATION);
        assert_eq!(
            (r.limit_on(8 << 30), r.from_nvidia, r.limit_from_nvidia),
            (Ok(6 << 30), false, false)
        );
        // The env, and the annotation over it with a note.
        let r = with("", r#","VRAMGATE_MEMORY=1Gi","VRAMGATE_MEMORY_LIMIT=50%""#)
            .unwrap()
            .unwrap();
        assert_eq!(r.limit, Some(Quantity::PartsPerMillion(500_000)));
        assert_eq!(r.limit_on(8 << 30), Ok(4 << 30));
        let err = r.limit_on(1 << 30).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "VRAMGATE_MEMORY_LIMIT = \"50%\" (512 MiB) is less than the request VRAMGATE_MEMORY (1024 MiB)"
            ),
            "{err}"
        );
        let r = with(
            r#""vramgate.dev/memory-limit":"3Gi""#,
            r#","VRAMGATE_MEMORY=1Gi","VRAMGATE_MEMORY_LIMIT=2Gi""#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.limit, Some(Quantity::Bytes(3 << 30)));
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        // No limit, or one equal to the request: limit = request.
        let r = with(
            r#""vramgate.dev/memory":"2Gi","vramgate.dev/memory-limit":"2048Mi""#,
            "",
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.limit, r.limit_on(8 << 30)), (None, Ok(2 << 30)));
        // Below the request: one line naming both.
        let err = with(r#""vramgate.dev/memory":"6Gi","vramgate.dev/memory-limit":"2Gi""#, "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "vramgate.dev/memory-limit = \"2Gi\" (2048 MiB) is less than the request vramgate.dev/memory (6144 MiB): a limit is what the container may use at most, so it must be at least its request; raise the limit or leave it out (no limit means limit = request)"
        );
        // A bad quantity names its key.
        let err = with(r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"lots""#, "").unwrap_err();
        assert!(
            matches!(&err, RequestError::Invalid { source_name, .. } if source_name == MEMORY_LIMIT_ANNOTATION),
            "{err}"
        );
        // vramgate's limit and NVIDIA's disagreeing: refused; agreeing: one request and limit.
        let err = with(
            r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"4Gi""#,
            r#","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
        )
        .unwrap_err();
        assert!(matches!(err, RequestError::VocabulariesDisagree { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("(request 1024 MiB, limit 4096 MiB and request 1024 MiB, limit 2048 MiB)"),
            "{err}"
        );
        let err = with("", r#","VRAMGATE_MEMORY_LIMIT=4Gi","NVIDIA_GPU_MEMORY_LIMIT=2048""#).unwrap_err();
        assert!(matches!(err, RequestError::VocabulariesDisagree { .. }), "{err}");
        let r = with(
            r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"2Gi""#,
            r#","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.memory, r.limit, r.from_nvidia),
            (Quantity::Bytes(1 << 30), Some(Quantity::Bytes(2 << 30)), false)
        );
        // NVIDIA's request beside vramgate's limit: the limit is vramgate's.
        let r = with(
            "",
            r#","VRAMGATE_MEMORY_LIMIT=2Gi","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.from_nvidia, r.limit_from_nvidia), (true, false));
    }

    #[test]
    fn kai_annotations_name_one_container_of_the_pod() {
        let pod = |name: &str, env: &str| {
            spec(&format!(
                r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.container-name":"{name}","nvidia.com/container.trainer.gpu-memory.request":"1024","nvidia.com/container.trainer.gpu-memory.limit":"2048"}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{env}]}}}}"#
            ))
        };
        let r = Request::from_spec(&pod("trainer", "")).unwrap().unwrap();
        assert_eq!(
            (r.memory, r.from_nvidia, r.limit),
            (Quantity::Bytes(1 << 30), true, Some(Quantity::Bytes(2 << 30)))
        );
        assert!(
            r.memory_source
                .contains("nvidia.com/container.trainer.gpu-memory.limit = \"2048\""),
            "{}",
            r.memory_source
        );
        // Another container of the pod: not its request.
        assert!(!has_request(&pod("sidecar", "")));
        assert_eq!(Request::from_spec(&pod("sidecar", "")), Ok(None));
        // KAI's injected variables beside them, the same: no note; different: a note.
        let r = Request::from_spec(&pod("trainer", r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#))
            .unwrap()
            .unwrap();
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        let r = Request::from_spec(&pod("trainer", r#","NVIDIA_GPU_MEMORY_LIMIT=9999""#))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.memory, r.limit),
            (Quantity::Bytes(1 << 30), Some(Quantity::Bytes(2 << 30)))
        );
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        // The pod's vramgate.dev/memory disagreeing: refused.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","io.kubernetes.cri.container-type":"container","io.kubernetes.container.name":"trainer","nvidia.com/container.trainer.gpu-memory.limit":"2048"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
        );
        assert!(matches!(
            Request::from_spec(&s),
            Err(RequestError::VocabulariesDisagree { .. })
        ));
        // A DRA claim's container: NVIDIA's word may not override the claim's amount.
        let claim = spec(
            r#"{"process":{"env":["VRAMGATE_DRA_DEVICE_x=uid-gpu-0:s","VRAMGATE_MEMORY=1073741824","VRAMGATE_GPUS=GPU-aaaa","NVIDIA_GPU_MEMORY_LIMIT=2048"]}}"#,
        );
        assert!(matches!(
            Request::from_spec(&claim),
            Err(RequestError::VocabulariesDisagree { .. })
        ));
    }

    #[test]
    fn device_lists() {
        let p = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).map(|s| s.selection);
        assert_eq!(p("all"), Ok(GpuSelection::All));
        assert_eq!(p("void"), Ok(GpuSelection::Nothing));
        assert_eq!(p(""), Ok(GpuSelection::Nothing));
        assert_eq!(
            p("0, 1,0"),
            Ok(GpuSelection::Devices(vec![DeviceRef::Index(0), DeviceRef::Index(1)]))
        );
        assert_eq!(p("0:2"), Ok(GpuSelection::Devices(vec![DeviceRef::MigIndex(0, 2)])));
        assert_eq!(
            p("GPU-1a2b,MIG-GPU-1a2b/1/0"),
            Ok(GpuSelection::Devices(vec![
                DeviceRef::Uuid("GPU-1a2b".into()),
                DeviceRef::Uuid("MIG-GPU-1a2b/1/0".into())
            ]))
        );
        for bad in ["0,", "-1", "GPU-", "gpu0", "0:x", "99999999999", "GPU-../../etc", "1 2"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p(&"0,".repeat(5000)).is_err());
    }

    #[test]
    fn resolution_against_the_host() {
        let sel = |v| GpuSelector::parse_list(GPUS_ANNOTATION, v).unwrap();
        assert_eq!(sel("all").resolve(&host()).unwrap(), ["GPU-aaaa", "GPU-bbbb"]);
        assert_eq!(sel("1,GPU-AAAA").resolve(&host()).unwrap(), ["GPU-bbbb", "GPU-aaaa"]);
        let err = sel("2").resolve(&host()).unwrap_err().to_string();
        assert!(
            err.contains("GPU \"2\"") && err.contains("0 GPU-aaaa, 1 GPU-bbbb"),
            "{err}"
        );
    }

    #[test]
    fn linux_devices_and_override() {
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia-uvm"},{"path":"/dev/nvidia1"}]}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.gpus.source_name, "linux.devices");
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
        // vramgate's own word narrows what the engine gave, and never names another GPU.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"1"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0,1"]}}"#,
        );
        assert_eq!(
            Request::from_spec(&s).unwrap().unwrap().gpus.resolve(&host()).unwrap(),
            ["GPU-bbbb"]
        );
    }

    /// Given GPU 0 by its engine (the NVIDIA device plugin's UUID, Docker's `--gpus device=0`,
    /// a CDI annotation, an injected `/dev/nvidia0`), a container that names GPU 1 is refused
    /// with one line naming both; given all or none, it may name any.
    #[test]
    fn named_gpus_must_be_among_those_the_engine_gave() {
        for (given, source) in [
            (
                r#""process":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-aaaa"]}"#,
                "NVIDIA_VISIBLE_DEVICES = \"GPU-aaaa\"",
            ),
            (
                r#""process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}"#,
                "NVIDIA_VISIBLE_DEVICES = \"0\"",
            ),
            (
                r#""annotations":{"cdi.k8s.io/nvidia-device-plugin_x":"nvidia.com/gpu=0"}"#,
                "cdi.k8s.io annotations = \"nvidia.com/gpu=0\"",
            ),
            (
                r#""linux":{"devices":[{"path":"/dev/nvidia0"}]}"#,
                "linux.devices = \"/dev/nvidia0\"",
            ),
        ] {
            for own in [
                r#""VRAMGATE_GPUS=1""#,
                r#""VRAMGATE_GPUS=GPU-bbbb""#,
                r#""VRAMGATE_GPUS=0,1""#,
                r#""VRAMGATE_GPUS=all""#,
            ] {
                // The engine's word and the container's in one spec (annotations merged).
                let text = format!(r#"{{{given},"x":{{"env":[{own}]}}}}"#);
                let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
                let own_env = json["x"]["env"][0].clone();
                json.as_object_mut().unwrap().remove("x");
                let env = json["process"]["env"].as_array().cloned().unwrap_or_default();
                json["process"]["env"] =
                    serde_json::Value::Array(env.into_iter().chain([own_env, "VRAMGATE_MEMORY=1Gi".into()]).collect());
                let s = spec(&json.to_string());
                let err = Request::from_spec(&s)
                    .unwrap()
                    .unwrap()
                    .gpus
                    .resolve(&host())
                    .unwrap_err();
                assert!(matches!(err, RequestError::OutsideGiven { .. }), "{given} {own}: {err}");
                let line = err.to_string();
                assert!(
                    line.contains("GPU 1 (GPU-bbbb), which the container's engine did not give it")
                        && line.contains(source)
                        && !line.contains('\n'),
                    "{line}"
                );
            }
            // Naming what was given, in any form, is a narrowing.
            let text = format!(r#"{{{given}}}"#);
            let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
            let env = json["process"]["env"].as_array().cloned().unwrap_or_default();
            json["process"]["env"] = serde_json::Value::Array(
                env.into_iter()
                    .chain(["VRAMGATE_GPUS=GPU-aaaa".into(), "VRAMGATE_MEMORY=1Gi".into()])
                    .collect(),
            );
            let r = Request::from_spec(&spec(&json.to_string())).unwrap().unwrap();
            assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa"], "{given}");
        }
        for given in ["all", "none", "void", "nvidia.com/gpu=all"] {
            let s = spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES={given}","VRAMGATE_GPUS=1","VRAMGATE_MEMORY=1Gi"]}}}}"#
            ));
            assert_eq!(
                Request::from_spec(&s).unwrap().unwrap().gpus.resolve(&host()).unwrap(),
                ["GPU-bbbb"],
                "{given}"
            );
        }
    }

    #[test]
    fn mig() {
        let snap = Snapshot {
            gpus: vec![
                gpu(0, Some(0), "MIG-x0"),
                gpu(0, Some(1), "MIG-x1"),
                gpu(1, None, "GPU-bbbb"),
            ],
            mig_parents: vec![0],
            processes: vec![],
        };
        let sel = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).unwrap();
        assert_eq!(sel("0:1").resolve(&snap).unwrap(), ["MIG-x1"]);
        assert_eq!(sel("MIG-x0").resolve(&snap).unwrap(), ["MIG-x0"]);
        assert!(sel("0").resolve(&snap).unwrap_err().to_string().contains("MIG mode"));
    }

    #[test]
    fn auto_and_its_candidates() {
        let p = |v| GpuSelector::parse_list(GPUS_ANNOTATION, v).map(|s| s.selection);
        assert_eq!(p("auto"), Ok(GpuSelection::Auto { count: 1, among: None }));
        assert_eq!(p("auto:2"), Ok(GpuSelection::Auto { count: 2, among: None }));
        for bad in ["auto:0", "auto:65", "auto:x", "auto:", "autox"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        // Only vramgate's own keys may say auto.
        let err = GpuSelector::parse_list(VISIBLE_DEVICES_ENV, "auto")
            .unwrap_err()
            .to_string();
        assert!(err.contains("vramgate.dev/gpus or VRAMGATE_GPUS"), "{err}");
        // The env form, and candidates from what the engine gave.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["VRAMGATE_GPUS=auto","NVIDIA_VISIBLE_DEVICES=1,GPU-aaaa"]}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.gpus.source_name, GPUS_ENV);
        let (count, uuids) = r.gpus.candidates(&host()).unwrap().unwrap();
        assert_eq!(
            (count, uuids),
            (1, vec!["GPU-bbbb".to_string(), "GPU-aaaa".to_string()])
        );
        assert!(r
            .gpus
            .resolve(&host())
            .unwrap_err()
            .to_string()
            .contains("vramgate-runtime"));
        let three = GpuSelector::parse_list(GPUS_ANNOTATION, "auto:3").unwrap();
        let err = three.candidates(&host()).unwrap().unwrap_err().to_string();
        assert!(err.contains("asks for 3 GPUs, but only 2 can take it"), "{err}");
    }

    #[test]
    fn engine_all_is_placed_by_the_wrapper_but_vramgate_all_spans() {
        let env_all = spec(r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=all"]}}"#);
        let r = Request::from_spec(&env_all).unwrap().unwrap();
        assert_eq!(
            r.gpus.to_place().unwrap().selection,
            GpuSelection::Auto { count: 1, among: None }
        );
        let own_all = spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"all"}}"#);
        let r = Request::from_spec(&own_all).unwrap().unwrap();
        assert_eq!(r.gpus.to_place(), None);
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa", "GPU-bbbb"]);
        let list = spec(r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0,1"]}}"#);
        assert_eq!(Request::from_spec(&list).unwrap().unwrap().gpus.to_place(), None);
    }

    #[test]
    fn cdi_names_and_device_nodes_as_the_truth() {
        let p = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).map(|s| s.selection);
        assert_eq!(p("nvidia.com/gpu=all"), Ok(GpuSelection::All));
        assert_eq!(
            p("nvidia.com/gpu=1,nvidia.com/gpu=GPU-aaaa,nvidia.com/gpu=0:2"),
            Ok(GpuSelection::Devices(vec![
                DeviceRef::Index(1),
                DeviceRef::Uuid("GPU-aaaa".into()),
                DeviceRef::MigIndex(0, 2)
            ]))
        );
        assert!(p("vendor.com/gpu=0").is_err());
        // A CUDA image's ENV NVIDIA_VISIBLE_DEVICES=all beside one injected GPU: that GPU.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia1"}]}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.gpus.to_place(), None);
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
        // CDI requests in annotations, as device plugins write them.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","cdi.k8s.io/nvidia-device-plugin_abc":"nvidia.com/gpu=GPU-bbbb,vendor.com/nic=0"}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.gpus.source_name, CDI_SOURCE);
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
    }

    #[test]
    fn a_mig_device_through_cdi_is_placed_among_its_parents_mig_devices() {
        let snap = Snapshot {
            gpus: vec![
                gpu(0, Some(0), "MIG-x0"),
                gpu(0, Some(1), "MIG-x1"),
                gpu(1, None, "GPU-bbbb"),
            ],
            mig_parents: vec![0],
            processes: vec![],
        };
        // CDI injects the parent's /dev/nvidia0 (and nvidia-caps nodes) for a MIG device.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"auto"},"linux":{"devices":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap21"}]}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        let (_, uuids) = r.gpus.candidates(&snap).unwrap().unwrap();
        assert_eq!(uuids, ["MIG-x0", "MIG-x1"]);
        // Named as a whole, it is still refused.
        let whole =
            spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidia0"}]}}"#);
        let r = Request::from_spec(&whole).unwrap().unwrap();
        assert!(r.gpus.resolve(&snap).unwrap_err().to_string().contains("MIG mode"));
    }

    #[test]
    fn a_mig_device_given_through_cdi_is_admitted_on_that_mig_device() {
        let mig = |m: u32, uuid: &str, caps: [u32; 2]| GpuMemory {
            mig_caps: caps.to_vec(),
            ..gpu(0, Some(m), uuid)
        };
        let snap = Snapshot {
            gpus: vec![
                mig(0, "MIG-x0", [12, 13]),
                mig(1, "MIG-x1", [21, 22]),
                gpu(1, None, "GPU-bbbb"),
            ],
            mig_parents: vec![0],
            processes: vec![],
        };
        // What nvidia-ctk's CDI spec injects for MIG device 0:1: the parent and its two caps.
        let s = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap21"},{"path":"/dev/nvidia-caps/nvidia-cap22"}]}}"#,
        );
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.gpus.resolve(&snap).unwrap(), ["MIG-x1"]);
        // Placing among what was given: only that MIG device.
        let auto = spec(
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"auto"},"linux":{"devices":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap12"},{"path":"/dev/nvidia-caps/nvidia-cap13"}]}}"#,
        );
        let r = Request::from_spec(&auto).unwrap().unwrap();
        assert_eq!(r.gpus.candidates(&snap).unwrap().unwrap().1, ["MIG-x0"]);
    }
}
