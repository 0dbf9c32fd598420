//! What the service decided, as data. Each refusal's `Display` is the one line the user sees
//! (on the hook's stderr, which runc puts into the error that `docker run`, `podman run` and
//! `ctr run` print), so the wording lives here and nowhere else.

use std::fmt;
use std::time::Duration;

use crate::admission::{Among, Bound, GpuAccount};
use crate::inventory::GpuMemory;
use crate::ledger::GpuShare;
use crate::placement::Placement;
use crate::quantity::{format_bytes, format_duration};
use crate::request::{MEMORY_ANNOTATION, MEMORY_LIMIT_ANNOTATION, POLICY_ANNOTATION, TIMEOUT_ANNOTATION};

/// How an admission ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Reserved; `waited` is zero unless it queued first. `shares` are what was reserved,
    /// `gpus` those GPUs as the inventory saw them, and `placement` how they were chosen when
    /// vramgate chose them.
    Admitted {
        waited: Duration,
        queued: bool,
        shares: Vec<GpuShare>,
        gpus: Vec<GpuMemory>,
        placement: Option<Placement>,
    },
    /// The reservation `vramgate-runtime` made at create is now bound to the container's init.
    Confirmed {
        shares: Vec<GpuShare>,
    },
    /// The same container (same init process) was already admitted: a second hook stage.
    AlreadyAdmitted,
    Refused(Refusal),
}

/// Why a request cannot be served now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortage {
    /// Not enough memory on one of its GPUs (for a placement: on enough of its candidates;
    /// `account` is the one with the most room); with `bound` = [`Bound::Limits`], not enough
    /// room for its limit (`request` is then the limit: see [`crate::admission`], rule 4).
    Memory {
        request: u64,
        account: GpuAccount,
        among: Option<Among>,
        bound: Bound,
    },
    /// Older waiters on its GPUs come first.
    Queue { ahead: usize },
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shortage::Memory {
                request,
                account,
                among: None,
                bound: Bound::Limits,
            } => write!(
                f,
                "its limit is {} and {}, which {} more would pass ([queue] limit_overcommit bounds the sum of limits)",
                format_bytes(*request),
                account.describe_limits(),
                format_bytes(*request)
            ),
            Shortage::Memory {
                request,
                account,
                among: Some(among),
                bound: Bound::Limits,
            } => write!(
                f,
                "its limit is {} on {} and the one with the most room for limits is {} ([queue] limit_overcommit bounds the sum of limits)",
                format_bytes(*request),
                among.describe(),
                account.describe_limits()
            ),
            Shortage::Memory {
                request,
                account,
                among: None,
                ..
            } => {
                write!(f, "it requests {} and {}", format_bytes(*request), account.describe())
            }
            Shortage::Memory {
                request,
                account,
                among: Some(among),
                ..
            } => write!(
                f,
                "it requests {} on {} and the one with the most room is {}",
                format_bytes(*request),
                among.describe(),
                account.describe()
            ),
            Shortage::Queue { ahead } => write!(
                f,
                "{ahead} container{} asked first and {} waiting for the same GPU",
                if *ahead == 1 { "" } else { "s" },
                if *ahead == 1 { "is" } else { "are" }
            ),
        }
    }
}

/// What shows that a waiting container will never start: a process of its that ended, or
/// (for a wait at create, before the container has processes) its bundle removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoneProcess {
    Init(u32),
    Runtime(u32),
    Bundle(std::path::PathBuf),
}

impl fmt::Display for GoneProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GoneProcess::Init(pid) => write!(f, "its init process {pid} is gone: the engine killed or deleted it"),
            GoneProcess::Bundle(path) => write!(
                f,
                "its bundle {} was removed: the engine gave up on the start and deleted it",
                path.display()
            ),
            GoneProcess::Runtime(pid) => write!(
                f,
                "the runtime process {pid} that was starting it is gone: the engine cancelled the start"
            ),
        }
    }
}

/// A decided refusal. The container does not start and nothing stays reserved for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Larger than the GPU less headroom: no wait can help.
    /// With `bound` = [`Bound::Limits`], `request` is its limit, more than the GPU's room
    /// for limits.
    NeverFits {
        container: String,
        request: u64,
        account: GpuAccount,
        among: Option<Among>,
        bound: Bound,
    },
    /// Policy `reject` and no room now.
    NoRoom { container: String, shortage: Shortage },
    /// Policy `wait`, and its timeout came first.
    TimedOut {
        container: String,
        waited: Duration,
        position: usize,
        shortage: Shortage,
    },
    /// Its wait was ended by `vramgate release` (or its ticket otherwise removed).
    Cancelled { container: String, waited: Duration },
    /// The container can no longer start while it waited: the engine cancelled or deleted it.
    ContainerGone {
        container: String,
        waited: Duration,
        process: GoneProcess,
    },
    /// Another live container already holds a reservation under the same id.
    SameIdLive { container: String, holder_pid: u32 },
    /// Policy `reject` and no room now, for a container whose pod's claim another of its
    /// containers already holds: the node counts each holder whole, because no watch stops a
    /// claim's holders together (see [`crate::ledger::ClaimHold`]).
    ClaimHeldTwice { container: String, shortage: Shortage },
}

impl Refusal {
    pub fn container(&self) -> &str {
        match self {
            Refusal::NeverFits { container, .. }
            | Refusal::NoRoom { container, .. }
            | Refusal::TimedOut { container, .. }
            | Refusal::Cancelled { container, .. }
            | Refusal::ContainerGone { container, .. }
            | Refusal::SameIdLive { container, .. }
            | Refusal::ClaimHeldTwice { container, .. } => container,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NeverFits {
                container,
                request,
                account,
                among,
                bound: Bound::Limits,
            } => write!(
                f,
                "vramgate: refused container {container}: its limit is {}{}, more than the limits on {} may ever add up to: {}; lower the limit (annotation {MEMORY_LIMIT_ANNOTATION}) or raise [queue] limit_overcommit",
                format_bytes(*request),
                among.map(|a| format!(" on {}", a.describe())).unwrap_or_default(),
                if among.is_some() { "the largest" } else { "the GPU" },
                account.describe_limits(),
            ),
            Refusal::NeverFits {
                container,
                request,
                account,
                among: Some(among),
                ..
            } => write!(
                f,
                "vramgate: refused container {container}: it requests {} on {}, more than enough of them can ever hold (the largest is {}); request less (annotation {MEMORY_ANNOTATION}) or run it on a host with larger GPUs",
                format_bytes(*request),
                among.describe(),
                account.describe(),
            ),
            Refusal::NeverFits {
                container,
                request,
                account,
                among: None,
                ..
            } => write!(
                f,
                "vramgate: refused container {container}: it requests {} on GPU {}, more than the GPU can ever hold: {}; request less (annotation {MEMORY_ANNOTATION}) or run it on a larger GPU",
                format_bytes(*request),
                account.index,
                account.describe(),
            ),
            Refusal::NoRoom { container, shortage } => write!(
                f,
                "vramgate: refused container {container}: {shortage}; retry when a container on that GPU stops, request less, or set {POLICY_ANNOTATION}=wait to queue"
            ),
            Refusal::ClaimHeldTwice { container, shortage } => write!(
                f,
                "vramgate: refused container {container}: {shortage}: another container of its pod already holds the pod's resource claim, and the node counts each of a claim's containers whole unless vramgate watch stops them together ([enforce] over_use = \"kill\" with `vramgate watch` running: the chart's watch.enabled=true); run the watch, or give each container its own claim"
            ),
            Refusal::TimedOut {
                container,
                waited,
                position,
                shortage,
            } => write!(
                f,
                "vramgate: refused container {container}: waited {} (its timeout) and was still number {position} in the queue: {shortage}; raise {TIMEOUT_ANNOTATION} or retry later",
                format_duration(*waited),
            ),
            Refusal::Cancelled { container, waited } => write!(
                f,
                "vramgate: refused container {container}: its wait was cancelled after {} (vramgate release {container}); nothing was reserved for it",
                format_duration(*waited),
            ),
            Refusal::ContainerGone {
                container,
                waited,
                process,
            } => write!(
                f,
                "vramgate: refused container {container}: it can no longer start ({process}) after waiting {}; its place in the queue was given up and nothing was reserved",
                format_duration(*waited),
            ),
            Refusal::SameIdLive { container, holder_pid } => write!(
                f,
                "vramgate: refused container {container}: a live container with the same id (init pid {holder_pid}) already holds a reservation"
            ),
        }
    }
}
