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
//! - the pod annotation `vramgate.dev/memory` is the request of each container of the pod its
//!   engine gave a GPU (the device plugin's `NVIDIA_VISIBLE_DEVICES`, a `/dev/nvidiaN` device,
//!   a claim's devices); the pod annotation `vramgate.dev/gpus` (or `VRAMGATE_GPUS`) only
//!   chooses among the GPUs a container was given, so a pod gets GPUs from its scheduler alone;
//!   a container of the pod given none (a sidecar) has no request, where outside a pod that is
//!   an error. A container's own `VRAMGATE_MEMORY` keeps the usual rule (refused without a GPU);
//! - which container is a sandbox is read from the keys of the runtime that wrote the spec: a
//!   container is one only when every runtime's key says so ([`pod_role`]).
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

mod claim_env;
mod gpus;
pub mod name;
mod nvidia;
pub mod prepared_claims;

use std::time::Duration;

use crate::inventory::{GpuMemory, Snapshot};
// The device node numbers are the inventory's vocabulary; the wrapper reads them from here too.
pub(crate) use crate::inventory::{mig_cap_minor, nvidia_minor};
use crate::quantity::{self, Quantity};
use crate::spec::SpecView;
pub use claim_env::{claim_devices, claim_marker_device, claim_markers, claim_shares, ClaimShares};
pub use gpus::{DeviceRef, GpuSelection, GpuSelector};
pub use name::{checked as checked_name, container_name, NAME_ANNOTATION};
use nvidia::nvidia_sources;
pub use nvidia::{nvidia_memory, NvidiaMemory};

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
/// Where NVIDIA's device plugin mounts `/dev/null` once per GPU under its `volume-mounts`
/// strategy, and what it then sets `NVIDIA_VISIBLE_DEVICES` to.
pub const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// Where a GPU list read from those mounts came from, as errors name it.
pub const VOLUME_MOUNTS_SOURCE: &str = "the mounts under /var/run/nvidia-container-devices";
/// The source of a selection whose `NVIDIA_VISIBLE_DEVICES` NVIDIA's toolkit does not accept
/// ([`NvidiaToolkit::envvar_when_unprivileged`]).
pub const ENV_NOT_ACCEPTED_SOURCE: &str = "NVIDIA_VISIBLE_DEVICES, not accepted by NVIDIA's toolkit here";

/// How NVIDIA's container toolkit on the node reads a container's `NVIDIA_VISIBLE_DEVICES`:
/// its config's `accept-nvidia-visible-devices-envvar-when-unprivileged` (default true). The
/// GPU Operator turns it off with the device plugin's `volume-mounts` strategy, so that an
/// image cannot pick GPUs; then the env of an unprivileged container gives it no GPU, and
/// vramgate counts none either. Read from the toolkit's own config by the callers
/// ([`crate::config::RuntimeConfig::nvidia_toolkit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvidiaToolkit {
    pub envvar_when_unprivileged: bool,
}

impl Default for NvidiaToolkit {
    fn default() -> NvidiaToolkit {
        NvidiaToolkit {
            envvar_when_unprivileged: true,
        }
    }
}
/// The most GPUs `auto:N` may ask for.
pub const MAX_AUTO_GPUS: u32 = 64;
/// Where the Kubernetes runtimes say what a container of a pod is: containerd's CRI plugin,
/// then CRI-O. Both write [`CRI_SANDBOX`] on the pod's sandbox and `container` on the others.
pub const CRI_CONTAINER_TYPE_ANNOTATIONS: [&str; 2] =
    ["io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"];
pub const CRI_SANDBOX: &str = "sandbox";
/// Where containerd's CRI plugin, then CRI-O, write the id of the pod sandbox a container runs
/// in: the same for every container of one pod.
pub const CRI_SANDBOX_ID_ANNOTATIONS: [&str; 2] = ["io.kubernetes.cri.sandbox-id", "io.kubernetes.cri-o.SandboxID"];
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

/// What a container gets when the spec says nothing about a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Refuse at once when the request does not fit now.
    Reject,
    /// Queue in the hook, in fair order, until it fits or the timeout passes.
    Wait,
}

impl Policy {
    pub fn parse(value: &str) -> Option<Policy> {
        match value.trim() {
            "reject" => Some(Policy::Reject),
            "wait" => Some(Policy::Wait),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Reject => "reject",
            Policy::Wait => "wait",
        }
    }
}

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
    #[error("the pod asks for GPU memory ({memory}), but Kubernetes gave this container no GPU, and its NVIDIA_VISIBLE_DEVICES={value} (from its image or the pod: NVIDIA's device plugin never writes it) would have NVIDIA's runtime give it every GPU, unaccounted: ask for a GPU in the container's resources (nvidia.com/gpu, vramgate.dev/gpu-memory-gib or a resource claim), or set NVIDIA_VISIBLE_DEVICES=void in a container that needs none")]
    PodAsksForEveryGpu { memory: String, value: String },
    #[error("the container requests VRAM ({memory}) and names its GPUs in NVIDIA_VISIBLE_DEVICES={value}, but NVIDIA's toolkit on this host does not accept NVIDIA_VISIBLE_DEVICES from unprivileged containers (accept-nvidia-visible-devices-envvar-when-unprivileged = false), so it gets no GPU that way: ask for GPUs the way the toolkit accepts them (a CDI device, --gpus, the device plugin's mounts)")]
    EnvNotAccepted { memory: String, value: String },
    #[error("the pod's container requests VRAM ({memory}) but Kubernetes gave it no GPU: a pod's containers get GPUs only from the scheduler (a device plugin's resource such as vramgate.dev/gpu-memory-gib, or a resource claim), and vramgate.dev/gpus or VRAMGATE_GPUS only choose among the GPUs a container was given; ask for a GPU in the container's resources, or remove VRAMGATE_MEMORY from a container that needs none")]
    PodGivenNoGpu { memory: String },
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
    #[error("the container carries the marker of the Kubernetes resource claim device {device}, which no claim this node's DRA driver prepared gives it (no spec of the driver in [enforce] cdi_spec_dirs = [{dirs}] sets that marker under that name): a container cannot name a claim device itself; remove its own VRAMGATE_DRA_DEVICE_* variable, or, if the driver runs with another --cdi-dir, name that directory in [enforce] cdi_spec_dirs")]
    ClaimDeviceNotPrepared { device: String, dirs: String },
    #[error("the container's VRAMGATE_DRA_SHARE_* of the Kubernetes resource claim device {device} is not the share this node's DRA driver prepared for it: a container cannot set a claim's share itself; remove its own VRAMGATE_DRA_SHARE_* variable")]
    ClaimShareNotPrepared { device: String },
    #[error("the container's environment has {count} {prefix}* variables, more than the {limit} Kubernetes resource claim devices vramgate reads (the DRA driver sets one per device): remove the container's own {prefix}* variables, or give it at most {limit} claim devices")]
    TooManyClaimVariables {
        prefix: &'static str,
        count: usize,
        limit: usize,
    },
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
    /// The DRA claim devices the container was given, sorted, as checked against the driver's
    /// record ([`Request::from_spec_on_node`]); empty from [`Request::from_spec`] alone, and for
    /// a container given none.
    pub claim_devices: Vec<String>,
    /// The pod sandbox a pod's container runs in, as its CRI runtime wrote it
    /// ([`CRI_SANDBOX_ID_ANNOTATIONS`]): the containers of one pod given the same claim
    /// devices hold them once ([`crate::ledger::ClaimHold`]).
    pub pod_sandbox: Option<String>,
    /// Which container of which pod this is ([`pod_container`]): what a retry of a start the
    /// engine gave up on keeps its first attempt's place in the queue by
    /// ([`crate::ledger::KeptPlace`]). `None` outside a pod.
    pub pod_container: Option<crate::ledger::PodContainer>,
    /// What the container is called where it is shown ([`container_name`]): never a key.
    pub name: Option<String>,
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

/// A container is a sandbox only when every runtime's container-type key in its spec says so.
/// CRI-O copies every pod annotation into each container's spec (it filters only its own
/// `io.kubernetes.cri-o.*` keys), and containerd those its `pod_annotations` let through, so the
/// other runtime's key may be the pod author's: a pod writing containerd's key `sandbox` under
/// CRI-O would otherwise make its GPU containers reserve nothing. Keys that disagree make the
/// container one of the pod's own, which reserves more, never less (a real sandbox names no
/// GPU, so it reserves nothing either way: [`has_request`]).
pub fn pod_role(spec: &SpecView) -> PodRole {
    let mut kinds = CRI_CONTAINER_TYPE_ANNOTATIONS
        .iter()
        .filter_map(|key| spec.annotations.get(*key))
        .peekable();
    if kinds.peek().is_none() {
        return PodRole::NotInPod;
    }
    if kinds.all(|kind| kind == CRI_SANDBOX) {
        PodRole::Sandbox
    } else {
        PodRole::Container
    }
}

/// The pod sandbox of a pod's container, as its CRI runtime wrote it: the sandbox id under the
/// key of the runtime whose container-type key marks it a container. `None` outside a pod, for
/// a sandbox, and where the two runtimes' keys are mixed or both present (a pod annotation
/// passed through under the other runtime's name), so that no hold is made from it.
fn pod_sandbox(spec: &SpecView) -> Option<String> {
    pod_sandbox_by(spec).map(|(_, id)| id)
}

/// [`pod_sandbox`], with which runtime wrote it: the index of its keys in the `CRI_*`
/// annotation lists, so that what else is read about the pod (the container's name) is read
/// under that runtime's keys only.
pub(crate) fn pod_sandbox_by(spec: &SpecView) -> Option<(usize, String)> {
    let by_runtime: Vec<(usize, Option<&String>, Option<&String>)> = CRI_CONTAINER_TYPE_ANNOTATIONS
        .iter()
        .zip(CRI_SANDBOX_ID_ANNOTATIONS)
        .enumerate()
        .map(|(runtime, (kind, id))| (runtime, spec.annotations.get(*kind), spec.annotations.get(id)))
        .filter(|(_, kind, id)| kind.is_some() || id.is_some())
        .collect();
    let [(runtime, Some(kind), Some(id))] = by_runtime.as_slice() else {
        return None;
    };
    (kind.as_str() != CRI_SANDBOX && plain_name(id)).then(|| (*runtime, id.to_string()))
}

/// A name fit to key the ledger by: not empty, short, one line.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && !name.chars().any(char::is_control)
}

/// Which container of which pod this is, as its CRI runtime wrote it: the pod sandbox
/// ([`pod_sandbox`]) and the container's name under the same runtime's key
/// ([`CRI_CONTAINER_NAME_ANNOTATIONS`]), never the other runtime's, which a pod annotation can
/// carry into the spec (CRI-O copies a pod's annotations whatever their keys). What a start's
/// retry is recognised by ([`crate::ledger::PodContainer`]). `None` outside a pod, for a
/// sandbox, and wherever [`pod_sandbox`] finds none.
pub fn pod_container(spec: &SpecView) -> Option<crate::ledger::PodContainer> {
    let (runtime, pod) = pod_sandbox_by(spec)?;
    let name = spec.annotations.get(CRI_CONTAINER_NAME_ANNOTATIONS[runtime])?;
    plain_name(name).then(|| crate::ledger::PodContainer {
        pod,
        name: name.to_string(),
    })
}

/// True when the spec asks for VRAM at all. This is the whole of the no-request fast path,
/// and the one place that decides which containers of a pod have a request (see the module
/// documentation): the hook admits, and the runtime wrapper adds hooks, only where it is true.
pub fn has_request(spec: &SpecView) -> bool {
    let annotated =
        spec.annotations.contains_key(MEMORY_ANNOTATION) || spec.annotations.contains_key(MEMORY_LIMIT_ANNOTATION);
    match pod_role(spec) {
        PodRole::NotInPod => annotated || own_request(spec),
        PodRole::Sandbox => false,
        // An annotation here is the pod's, copied into each of its containers: it applies to
        // those their engine gave a GPU (the pod's own `vramgate.dev/gpus` only chooses among
        // those, [`GpuSelector::from_spec`]). An unreadable device list counts as naming one,
        // so the request is read and refused with what is wrong with it; so does an
        // `NVIDIA_VISIBLE_DEVICES=all` of a container given nothing, which NVIDIA's toolkit may
        // turn into every GPU ([`GpuSelector::asks_for_every_gpu`]): whether it does is read
        // with the node's toolkit settings in [`Request::from_spec_on_node`].
        PodRole::Container => own_request(spec) || (annotated && !names_no_gpu(spec, NvidiaToolkit::default())),
    }
}

/// NVIDIA's variables and KAI's annotations name this container: its own request. A limit
/// alone is read too, to be refused: a container must not believe itself bounded and held to a
/// reservation when it has none.
fn own_request(spec: &SpecView) -> bool {
    spec.env(MEMORY_ENV).is_some() || spec.env(MEMORY_LIMIT_ENV).is_some() || nvidia_sources(spec).next().is_some()
}

/// The pod's `vramgate.dev/memory` (its value), in a pod's container that has no request of its
/// own and was given no GPU: what [`has_request`] leaves out as not this container's, and what
/// [`crate::pod_notice`] tells the pod about. Asked only after a start found no request.
pub fn pod_memory_annotation_not_taken(spec: &SpecView, toolkit: NvidiaToolkit) -> Option<String> {
    // The annotation first: absent from nearly every container, and the cheapest look.
    let asked = spec.annotations.get(MEMORY_ANNOTATION)?;
    (pod_role(spec) == PodRole::Container && !own_request(spec) && names_no_gpu(spec, toolkit)).then(|| asked.clone())
}

fn names_no_gpu(spec: &SpecView, toolkit: NvidiaToolkit) -> bool {
    GpuSelector::from_spec(spec, toolkit).is_ok_and(|s| s.selection == GpuSelection::Nothing && !s.asks_for_every_gpu())
}

impl Request {
    /// The request in `spec`, `Ok(None)` when it has none ([`has_request`] decides), with NVIDIA's
    /// toolkit at its defaults.
    pub fn from_spec(spec: &SpecView) -> Result<Option<Request>, RequestError> {
        Request::from_spec_with(spec, NvidiaToolkit::default())
    }

    /// [`Request::from_spec`] with the node's NVIDIA toolkit settings.
    pub fn from_spec_with(spec: &SpecView, toolkit: NvidiaToolkit) -> Result<Option<Request>, RequestError> {
        if !has_request(spec) {
            return Ok(None);
        }
        // Several devices: the amount on each GPU, from their shares (or refused, as more
        // markers or shares than any container is given are, before anything else is read).
        let claim = claim_shares(spec)?;
        let claim_devices: Vec<&str> = claim_devices(spec).collect();
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
            Some(c) => GpuSelector::own(spec, CLAIM_SHARE_SOURCE, &c.uuids.join(","), toolkit)?,
            None => GpuSelector::from_spec(spec, toolkit)?,
        };
        if gpus.selection == GpuSelection::Nothing {
            let memory = memory.to_string();
            let in_pod = pod_role(spec) == PodRole::Container;
            return match () {
                _ if gpus.asks_for_every_gpu() => Err(RequestError::PodAsksForEveryGpu {
                    memory,
                    value: gpus.value.chars().take(80).collect(),
                }),
                // The pod's annotation, in a container its engine gave no GPU (a sidecar, or one
                // whose NVIDIA_VISIBLE_DEVICES the toolkit here does not accept): not its request.
                _ if in_pod && !own_request(spec) => Ok(None),
                _ if gpus.source_name == ENV_NOT_ACCEPTED_SOURCE => Err(RequestError::EnvNotAccepted {
                    memory,
                    value: gpus.value.chars().take(80).collect(),
                }),
                _ if in_pod => Err(RequestError::PodGivenNoGpu { memory }),
                _ => Err(RequestError::NoGpu { memory }),
            };
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
            claim_devices: Vec::new(),
            pod_sandbox: pod_sandbox(spec),
            pod_container: pod_container(spec),
            name: container_name(spec),
        }))
    }

    /// [`Request::from_spec`] on a node: the claim devices the container carries are checked
    /// first against the DRA driver's record in `cdi_dirs` (`[enforce] cdi_spec_dirs`), so that
    /// a forged one is refused as such before its share is read, and kept in the request
    /// ([`prepared_claims::verified_claim_devices`]). What the hook and the runtime wrapper read; a
    /// container without claim markers reads no spec file.
    pub fn from_spec_on_node(
        spec: &SpecView,
        cdi_dirs: &[std::path::PathBuf],
        toolkit: NvidiaToolkit,
    ) -> Result<Option<Request>, RequestError> {
        if !has_request(spec) {
            return Ok(None);
        }
        let claim_devices = prepared_claims::verified_claim_devices(spec, cdi_dirs)?;
        Ok(Request::from_spec_with(spec, toolkit)?.map(|request| Request {
            claim_devices,
            ..request
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

#[cfg(test)]
mod tests;
