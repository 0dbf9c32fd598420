//! What the ledger holds, and the invariants a file must meet before anything trusts it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{LedgerError, Result};
use crate::procfs::ProcessIdentity;

/// The ledger format this vramgate writes and the newest it reads, stored in the file's
/// `schema` field (the name older versions look for).
///
/// Fields a reader does not know are kept as they are when it rewrites the ledger (the
/// `extra` maps of [`Ledger`], [`Reservation`], [`Ticket`] and [`Counters`]), so a vramgate
/// that adds a field does not make an older one still running on the host (a hook waiting in
/// the queue during a package upgrade) refuse its container, nor lose the field when that
/// older one writes. That only holds for a field an older reader may ignore and still get every
/// decision right: something shown (a label, a timestamp, a counter) or a cache of what other
/// fields already say; or one whose only effect is to count less where it is understood, so
/// that an older reader ignoring it counts more, never less ([`Reservation::claim`]: a claim
/// held by a pod's containers, counted once; the older reader counts it per container and may
/// queue what would fit, but never admits what does not).
///
/// **The rule**: bump the format for a field an older reader would get wrong by ignoring it:
/// one that holds memory (bytes accounted anywhere but `gpus`), keeps or orders a place in
/// the queue, decides which container an entry belongs to or when it is released or
/// reclaimed, or changes what an existing field means (its unit, its type, a new value of an
/// enum); and for any field added to the closed types [`GpuShare`] and
/// [`ProcessIdentity`](crate::procfs::ProcessIdentity), which keep no unknown fields. A
/// reader refuses a ledger of a newer format with [`LedgerError::NewerFormat`] rather than
/// get it wrong. A writer should write the oldest format that describes what the ledger
/// holds (the newer one only once an entry uses what needs it), so that a bump alone does
/// not stop the older hooks of an upgrade in progress.
///
/// The same holds for the readers before this rule, which refuse every field they do not
/// know (the release of commit ed7e56d and older): the only field added since is
/// [`Ticket::enqueued_boot_ms`], and while a hook of such a release may still wait in the
/// queue, tickets are written without it (see `ledger/compat.rs`). Their daemons (exporter,
/// device plugin) are restarted by the package on upgrade instead. A field added from now on
/// is either one that older readers may ignore (kept in `extra`), or a format bump.
///
/// [`Ledger::kept_places`] and [`Ticket::pod_container`] (a retry of a start the engine gave up
/// on keeps its first attempt's place, [`KeptPlace`]) are of the kind older readers may ignore:
/// they decide only the number and the enqueue time that a retry's ticket is written with, in
/// the fields every reader reads alike, and never hold memory or reorder a ticket already in
/// the queue. A reader that ignores them queues a retry at the back with a fresh age, as every
/// release before them did.
///
/// Format 2 adds [`GpuShare::limit`]: a share whose limit is above its bytes. A ledger with no
/// such share is written as format 1, byte for byte what the releases before limits write and
/// read; while one of their hooks waits in the queue, limits are not written at all (see
/// `ledger/compat.rs`).
///
/// Format 3 adds [`Reservation::claim_of`]: a resource claim's own reservation, held from
/// the scheduler's allocation to the claim's deallocation with no process behind it. A ledger
/// without one is written as format 2 or 1, as before; an older hook that meets one refuses its
/// container with [`LedgerError::NewerFormat`] until the upgrade is done.
///
/// [`Counters`]: crate::counters::Counters
pub const FORMAT: u32 = 3;
/// The format of a ledger that holds limits but no claim's own reservation.
pub const FORMAT_WITH_LIMITS: u32 = 2;
/// The format of a ledger that holds no limit ([`Ledger::format_needed`]).
pub const FORMAT_WITHOUT_LIMITS: u32 = 1;
/// A ledger larger than this is refused as corrupt by every reader, and never written (see
/// [`LedgerError::TooLarge`]); 10,000 reservations take about 3 MiB.
pub const MAX_LEDGER_BYTES: u64 = 32 << 20;

/// Fields this vramgate does not know, kept as they were read so a rewrite does not drop what
/// a newer vramgate wrote (see [`FORMAT`]). A misspelt optional field lands here too and is
/// ignored, which is the price of reading a newer ledger.
pub type Extra = serde_json::Map<String, serde_json::Value>;

/// The bytes one container holds (or asks for) on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuShare {
    pub uuid: String,
    /// The request: what admission and placement count, and what the container is guaranteed.
    pub bytes: u64,
    /// What the container may use at most on this GPU, only where it is above `bytes` (absent:
    /// the limit is `bytes`, so a ledger without limits is written as before them). Counted
    /// against `[queue] limit_overcommit` (see [`crate::admission`]); format 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

impl GpuShare {
    /// A share of `bytes` with `limit`, which is recorded only where it is above `bytes`.
    pub fn new(uuid: impl Into<String>, bytes: u64, limit: u64) -> GpuShare {
        GpuShare {
            uuid: uuid.into(),
            bytes,
            limit: (limit > bytes).then_some(limit),
        }
    }

    /// The limit in bytes: `bytes` when none above it was asked.
    pub fn limit_bytes(&self) -> u64 {
        self.limit.unwrap_or(self.bytes).max(self.bytes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub container_id: String,
    pub gpus: Vec<GpuShare>,
    /// The container's init process; when it is gone the reservation is reclaimed.
    pub init: ProcessIdentity,
    pub created_unix_ms: u64,
    /// How long the container waited in the queue before it was admitted.
    #[serde(default)]
    pub waited_ms: u64,
    /// The container's bundle, with the id what names this container among others of the same
    /// id (another containerd namespace, another runc root): a stop releases only what this
    /// container reserved. Absent in ledgers written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<PathBuf>,
    /// Made by `vramgate-runtime` at `create`, before the container has an init process:
    /// `init` is then the runtime process that creates it (the wrapper `exec`s the next
    /// runtime, so the pid and start time carry over), and the container's `createRuntime`
    /// hook confirms it with the init pid. A create that fails or is killed in between leaves
    /// a reservation whose process is gone, reclaimed by the next transaction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// What holds the container to this reservation once it runs (see [`crate::enforce`]),
    /// as the hook recorded it when it confirmed; absent where nothing said (the hook alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<crate::tier::Tier>,
    /// The DRA claim devices this container holds with the other containers of its pod
    /// ([`ClaimHold`]); absent for any other container. An older reader that ignores it (it
    /// keeps it in `extra`) counts each holder whole: more, never less (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimHold>,
    /// The container's own cgroup, as its init's `/proc/<pid>/cgroup` names it when the hook
    /// confirms or admits it (one line, [`crate::procfs::own_cgroup`]): what its GPU processes
    /// are found by ([`crate::attribution`]), in whatever pid namespace they run, and what
    /// `vramgate watch` stops. Absent where the container has no cgroup of its own (or was
    /// admitted before it was recorded): its processes are found by pid namespace. An older
    /// reader that ignores it (it keeps it in `extra`) finds them by pid namespace, as it
    /// always did: a process in a nested namespace counts as outside any reservation, which
    /// holds its memory as much (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// What the container is called where it is shown ([`crate::request::container_name`]:
    /// `namespace/pod/container`, or the name its owner wrote), read once at admission; never a
    /// key (the id is: two containers may claim one name). Absent where the spec names none, and
    /// in ledgers written before it was recorded. Only shown, so no format bump: an older reader
    /// keeps it in `extra` and shows the id (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Set on a resource claim's own reservation, made by the DRA driver when the scheduler
    /// allocated the claim to this node, before any container of it exists ([`ClaimOf`]). Such
    /// a reservation has no process: reclaim never takes it for one (`init` is
    /// [`ClaimOf::NO_PROCESS`]), only once the driver itself has been gone for
    /// [`crate::ledger::DRA_ABSENT_LIMIT`]; the driver releases it when the claim is
    /// deallocated or deleted, and the
    /// claim's first container takes it over when it starts. Format 3: an older reader would
    /// reclaim it as a container whose init is gone, counting less (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_of: Option<ClaimOf>,
    /// The resource claim whose own reservation this container took over when it started
    /// ([`ClaimOf`]): what tells the DRA driver the claim is held, and what the memory goes
    /// back to when the container's entry leaves the ledger while the claim is still allocated
    /// ([`Ledger::hand_back_claims`]). Only a record (the memory is in `gpus`), so no format
    /// bump: an older reader keeps it in `extra`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_over_claim: Option<ClaimOf>,
    /// Fields of a newer vramgate, kept on rewrite (see [`FORMAT`]).
    #[serde(flatten)]
    pub extra: Extra,
}

/// The resource claim a claim's own reservation holds memory for ([`Reservation::claim_of`]):
/// the scheduler's decision, held on the node from allocation on, so that nothing started on
/// the node in between (a container outside Kubernetes, a RuntimeClass pod) takes the memory the
/// scheduler counted as the claim's. Its container id is [`ClaimOf::container_id`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimOf {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimOf {
    /// The process of a claim's own reservation: none (no `/proc/0`), so that nothing finds
    /// processes of it; reclaim never asks.
    pub const NO_PROCESS: ProcessIdentity = ProcessIdentity { pid: 0, start_time: 0 };

    /// The id its reservation is recorded under: never a container's (runc's ids are the
    /// engine's; `claim-` and a uid is what only the driver writes).
    pub fn container_id(&self) -> String {
        format!("claim-{}", self.uid)
    }
}

/// A Kubernetes resource claim's devices, as one container of a pod holds them: the containers
/// of one pod sandbox given the same claim devices (checked against the DRA driver's record,
/// [`crate::request::prepared_claims::verified_claim_devices`]) hold their memory once, as the
/// scheduler counted the claim once. Each holder's reservation carries the claim's whole share,
/// so a stop or a reclaim of any one of them leaves the others holding all of it, and nothing
/// needs moving from one entry to another ([`Ledger::held_on`] counts them once).
///
/// Only where `vramgate watch` stops a pod's holders together (`[enforce] over_use = "kill"`,
/// see the service): each tier holds a container alone to the claim's limit, so elsewhere K
/// holders could use K limits, and each is counted whole. Only within a pod: a container can be
/// handed another claim's CDI device by name (`docker --device vramgate.dev/gpu-memory=…`, a
/// CDI annotation), and one outside the claim's pod that joined its hold would run on memory it
/// never reserved. A claim shared by several pods is counted once per pod: more than the
/// scheduler counts, never less. The pod is what the CRI runtime's annotations say, which
/// someone allowed to start containers with annotations can also write (docs/src/dra.md).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimHold {
    /// The pod sandbox's id, as the container's CRI runtime wrote it.
    pub pod: String,
    /// The claim devices' CDI names (`<claim uid>-gpu-0`), sorted.
    pub devices: Vec<String>,
}

/// The memory held on one GPU by one reservation, or by the reservations of one pod that hold
/// the same claim devices with the same share ([`ClaimHold`]): one share, counted once.
#[derive(Debug, Clone)]
pub struct Held<'l> {
    pub share: &'l GpuShare,
    /// The reservations that hold it: one, or a pod's containers that share a claim.
    pub holders: Vec<&'l Reservation>,
}

impl Reservation {
    /// The bytes it holds over all its GPUs. Saturating: a ledger edited by hand may hold
    /// shares whose sum passes `u64::MAX`, and a wrapped sum would print as a few bytes.
    pub fn bytes(&self) -> u64 {
        self.gpus.iter().map(|g| g.bytes).fold(0u64, u64::saturating_add)
    }

    /// An admitted reservation of `gpus` for `container_id`, held by `init` since
    /// `created_unix_ms`: no wait, no bundle, not pending, no tier recorded, no newer fields.
    /// The one place a reservation is built field by field (admission, tests, benches); a
    /// caller sets what differs with `..Reservation::new(..)`.
    pub fn new(
        container_id: impl Into<String>,
        gpus: Vec<GpuShare>,
        init: ProcessIdentity,
        created_unix_ms: u64,
    ) -> Reservation {
        Reservation {
            container_id: container_id.into(),
            gpus,
            init,
            created_unix_ms,
            waited_ms: 0,
            bundle: None,
            pending: false,
            enforcement: None,
            claim: None,
            cgroup: None,
            name: None,
            claim_of: None,
            took_over_claim: None,
            extra: Extra::new(),
        }
    }

    /// `bytes` on GPU `uuid` for `container_id`, held by pid 1 (start time 1): what unit
    /// tests build ledgers from.
    #[cfg(test)]
    pub(crate) fn for_test(container_id: &str, uuid: &str, bytes: u64) -> Reservation {
        let init = ProcessIdentity { pid: 1, start_time: 1 };
        Reservation::new(container_id, vec![GpuShare::new(uuid, bytes, 0)], init, 1)
    }

    /// Whether a stop of the container `container_id` with `bundle` releases this reservation.
    pub fn belongs_to(&self, container_id: &str, bundle: Option<&Path>) -> bool {
        same_container(&self.container_id, self.bundle.as_deref(), container_id, bundle)
    }
}

/// Whether an entry recorded for (`id`, `recorded` bundle) is the container (`container_id`,
/// `bundle`). Without a bundle on either side (an old ledger, `vramgate release <id>`), the id
/// decides.
fn same_container(id: &str, recorded: Option<&Path>, container_id: &str, bundle: Option<&Path>) -> bool {
    id == container_id
        && match (recorded, bundle) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => true,
        }
}

/// A container waiting for room, held by its hook process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    pub ticket: u64,
    pub container_id: String,
    pub gpus: Vec<GpuShare>,
    /// The waiting hook process; when it is gone (killed at the runtime's hook timeout, say)
    /// the ticket is dropped so it never blocks the queue.
    pub waiter: ProcessIdentity,
    pub enqueued_unix_ms: u64,
    pub deadline_unix_ms: u64,
    /// When it was enqueued on the boot clock ([`crate::clock::Stamp`]): what its age is
    /// measured on. Absent in tickets of a vramgate that did not record it, whose age then
    /// falls back to `enqueued_unix_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_boot_ms: Option<u64>,
    /// The waiting container's bundle (see [`Reservation::bundle`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<PathBuf>,
    /// A placement: `gpus` are the candidates, of which this many will be chosen (see
    /// [`crate::placement`]). Absent for a request that names its GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choose: Option<u32>,
    /// How long the container said it would run (`vramgate.dev/expected-duration`), in
    /// milliseconds: what `[queue] backfill_order = "longest"` orders waiters that fit by
    /// ([`crate::queue_order::claim`]), and nothing else. Absent when it declared none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_ms: Option<u64>,
    /// Which container of which pod waits, as its CRI runtime wrote it: what a retry of this
    /// start is recognised by, should the engine give up on it ([`KeptPlace`]). Absent outside
    /// a pod. An older reader that ignores it (it keeps it in `extra`) only keeps no place for
    /// the retry: the queue as it was before places were kept (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_container: Option<PodContainer>,
    /// What the waiting container is called where it is shown ([`Reservation::name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Fields of a newer vramgate, kept on rewrite (see [`FORMAT`]).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A container of a pod, as its CRI runtime names it: the pod sandbox's id and the container's
/// name in the pod, both read under the keys of the runtime that marked the spec
/// ([`crate::request::pod_container`]). kubelet retries a start it gave up on as a new container
/// with the same two: what [`KeptPlace`] is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodContainer {
    pub pod: String,
    pub name: String,
}

/// The place in the queue of a start the engine gave up on while it waited (kubelet's deadline
/// passed: containerd's shim killed the waiting `vramgate-runtime create`, and its ticket was
/// dropped), kept for kubelet's retry of that start: the retry's ticket takes this number and
/// this age instead of the back of the queue and a fresh age, so `backfill_bound` protects it
/// across kubelet's deadline, as it would had the wait never been cancelled.
///
/// Never a way to jump the queue: the place is a ticket's that vramgate wrote (its number, its
/// enqueue time), never anything a container says; it goes only to a container of the same pod
/// sandbox with the same name, as the runtime that started it wrote them; it is used once
/// ([`Ledger::take_kept_place`]); and it lasts only as long as the dropped ticket could itself
/// have waited (its own deadline), so a retry never holds a place longer than the first attempt
/// could have. At most [`MAX_KEPT_PLACES`] are kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptPlace {
    pub container: PodContainer,
    /// The dropped ticket's number: the retry's, when no ticket holds it.
    pub ticket: u64,
    /// The dropped ticket's enqueue time (its first attempt's, when it was itself a retry).
    pub enqueued_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_boot_ms: Option<u64>,
    /// How long after `enqueued_*` the place is kept: until the dropped ticket's own deadline.
    pub kept_ms: u64,
    /// Fields of a newer vramgate, kept on rewrite (see [`FORMAT`]).
    #[serde(flatten)]
    pub extra: Extra,
}

/// The most places a ledger keeps ([`KeptPlace`]); past it the oldest goes. A node's pods
/// whose starts kubelet gave up on at once, with room to spare, and a bound on what they add
/// to every write of the ledger (about 250 bytes each).
pub const MAX_KEPT_PLACES: usize = 64;

impl KeptPlace {
    /// Whether the place still holds at `now`.
    pub fn holds_at(&self, now: crate::clock::Stamp) -> bool {
        now.ms_since(self.enqueued_unix_ms, self.enqueued_boot_ms) < self.kept_ms
    }
}

impl Ticket {
    /// A ticket of `container_id` for `gpus`, waited on by pid 1 (start time 1), enqueued and
    /// due at time 0, nothing else recorded: what unit tests build queues from.
    #[cfg(test)]
    pub(crate) fn for_test(container_id: &str, gpus: Vec<GpuShare>) -> Ticket {
        Ticket {
            ticket: 0,
            container_id: container_id.into(),
            gpus,
            waiter: ProcessIdentity { pid: 1, start_time: 1 },
            enqueued_unix_ms: 0,
            enqueued_boot_ms: None,
            deadline_unix_ms: 0,
            bundle: None,
            choose: None,
            expected_ms: None,
            pod_container: None,
            name: None,
            extra: Extra::new(),
        }
    }

    /// Whether a stop of the container `container_id` with `bundle` ends this wait.
    pub fn belongs_to(&self, container_id: &str, bundle: Option<&Path>) -> bool {
        same_container(&self.container_id, self.bundle.as_deref(), container_id, bundle)
    }

    /// Whether this ticket waits for any of `gpus`.
    pub fn shares_gpu_with(&self, gpus: &[GpuShare]) -> bool {
        self.gpus.iter().any(|g| gpus.iter().any(|s| s.uuid == g.uuid))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// The ledger's format (see [`FORMAT`]).
    pub schema: u32,
    /// Bumped by every write, so readers can tell whether anything changed.
    pub generation: u64,
    pub next_ticket: u64,
    pub reservations: Vec<Reservation>,
    /// Waiting containers in arrival order: in ticket order, where numbers only grow, except
    /// that a retry takes back the free number of its first attempt ([`KeptPlace`]).
    pub queue: Vec<Ticket>,
    /// Outcomes so far, for metrics (see `counters.rs`): kept here because the hook is a
    /// short-lived process and the ledger is rewritten by every transaction anyway. Absent
    /// from ledgers written before they existed.
    #[serde(default)]
    pub counters: crate::counters::Counters,
    /// Places in the queue of starts the engine gave up on, kept for their retries
    /// ([`KeptPlace`]), oldest first. An older reader that ignores them (it keeps them in
    /// `extra`) queues a retry at the back, as before they were kept (see [`FORMAT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_places: Vec<KeptPlace>,
    /// Fields of a newer vramgate, kept on rewrite (see [`FORMAT`]).
    #[serde(flatten)]
    pub extra: Extra,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            schema: FORMAT_WITHOUT_LIMITS,
            generation: 0,
            next_ticket: 1,
            reservations: Vec::new(),
            queue: Vec::new(),
            counters: Default::default(),
            kept_places: Vec::new(),
            extra: Extra::new(),
        }
    }
}

impl Ledger {
    pub fn reservation(&self, container_id: &str) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.container_id == container_id)
    }

    /// Removes the reservation of `container_id`; a resource claim it held gets its memory back
    /// ([`Ledger::hand_back_claims`]).
    pub fn remove_reservation(&mut self, container_id: &str) -> Option<Reservation> {
        let at = self.reservations.iter().position(|r| r.container_id == container_id)?;
        let removed = self.reservations.remove(at);
        self.hand_back_claims(std::slice::from_ref(&removed));
        Some(removed)
    }

    /// Removes the reservation that a stop of this container (id and bundle) releases; a
    /// resource claim it held gets its memory back ([`Ledger::hand_back_claims`]).
    pub fn remove_reservation_of(&mut self, container_id: &str, bundle: Option<&Path>) -> Option<Reservation> {
        let at = self
            .reservations
            .iter()
            .position(|r| r.belongs_to(container_id, bundle))?;
        let removed = self.reservations.remove(at);
        self.hand_back_claims(std::slice::from_ref(&removed));
        Some(removed)
    }

    pub fn ticket(&self, ticket: u64) -> Option<&Ticket> {
        self.queue.iter().find(|t| t.ticket == ticket)
    }

    pub fn remove_ticket(&mut self, ticket: u64) -> Option<Ticket> {
        let at = self.queue.iter().position(|t| t.ticket == ticket)?;
        Some(self.queue.remove(at))
    }

    /// Removes every ticket of a container (id, and bundle when given) and returns them.
    pub fn remove_tickets_of(&mut self, container_id: &str, bundle: Option<&Path>) -> Vec<Ticket> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|t| t.belongs_to(container_id, bundle));
        self.queue = kept;
        gone
    }

    /// Appends a ticket with the next number and returns the number. `parse` refuses a ledger
    /// whose counter is at its maximum, so the increment cannot overflow.
    pub fn enqueue(&mut self, mut ticket: Ticket) -> u64 {
        ticket.ticket = self.next_ticket;
        self.next_ticket += 1;
        let number = ticket.ticket;
        self.queue.push(ticket);
        number
    }

    /// Appends `ticket` at the place `kept` (a [`KeptPlace`] of its container: its number, when
    /// no ticket holds it, and its age), or at the back like [`Ledger::enqueue`] without one.
    /// The queue stays in ticket order. Returns the number.
    pub fn enqueue_at(&mut self, mut ticket: Ticket, kept: Option<&KeptPlace>) -> u64 {
        let Some(kept) = kept else {
            return self.enqueue(ticket);
        };
        ticket.enqueued_unix_ms = kept.enqueued_unix_ms;
        ticket.enqueued_boot_ms = kept.enqueued_boot_ms;
        // A number below next_ticket that no ticket holds: the place is free to take (the
        // number check keeps a hand-edited or older-written entry from breaking parse's rule).
        if kept.ticket >= self.next_ticket || self.ticket(kept.ticket).is_some() {
            return self.enqueue(ticket);
        }
        ticket.ticket = kept.ticket;
        let at = self.queue.partition_point(|t| t.ticket < kept.ticket);
        self.queue.insert(at, ticket);
        kept.ticket
    }

    /// Keeps the place of `ticket`, dropped because the engine gave up on its start, for a
    /// retry of the same container of the same pod ([`KeptPlace`]). Nothing for a ticket of no
    /// pod's container. One place per container, the earliest: a retry's ticket carries its
    /// first attempt's place anyway, and a later one of the same container (two of its starts
    /// given up on at once) must not push it back.
    pub fn keep_place_of(&mut self, ticket: &Ticket) {
        let Some(container) = &ticket.pod_container else {
            return;
        };
        if self
            .kept_places
            .iter()
            .any(|k| &k.container == container && k.ticket < ticket.ticket)
        {
            return;
        }
        self.kept_places.retain(|k| &k.container != container);
        if self.kept_places.len() >= MAX_KEPT_PLACES {
            self.kept_places.remove(0);
        }
        self.kept_places.push(KeptPlace {
            container: container.clone(),
            ticket: ticket.ticket,
            enqueued_unix_ms: ticket.enqueued_unix_ms,
            enqueued_boot_ms: ticket.enqueued_boot_ms,
            kept_ms: ticket.deadline_unix_ms.saturating_sub(ticket.enqueued_unix_ms),
            extra: Extra::new(),
        });
    }

    /// Takes the place kept for `container`, if one still holds at `now`: once, it leaves the
    /// ledger. Places that no longer hold leave too.
    pub fn take_kept_place(&mut self, container: &PodContainer, now: crate::clock::Stamp) -> Option<KeptPlace> {
        self.forget_kept_places(now);
        let at = self.kept_places.iter().position(|k| &k.container == container)?;
        Some(self.kept_places.remove(at))
    }

    /// Drops the kept places that no longer hold at `now`.
    pub fn forget_kept_places(&mut self, now: crate::clock::Stamp) {
        self.kept_places.retain(|k| k.holds_at(now));
    }

    /// Whether any reservation holds memory on this GPU.
    pub fn has_reservations_on(&self, uuid: &str) -> bool {
        self.reservations.iter().any(|r| r.gpus.iter().any(|g| g.uuid == uuid))
    }

    /// The memory held on GPU `uuid`, one entry per share as it is counted: each reservation's
    /// share, except that the shares of one pod's containers holding the same claim devices
    /// with the same amount and limit ([`ClaimHold`]) are one entry. What every sum over
    /// reservations counts from: admission's ([`crate::admission`]), status, the metrics and
    /// the kubelet plugins, through [`Ledger::reserved_on`] and [`Ledger::limits_on`].
    pub fn held_on(&self, uuid: &str) -> Vec<Held<'_>> {
        let mut held: Vec<Held<'_>> = Vec::new();
        let mut group_at: std::collections::HashMap<(&ClaimHold, &GpuShare), usize> = Default::default();
        for r in &self.reservations {
            for share in r.gpus.iter().filter(|s| s.uuid == uuid) {
                if let Some(hold) = &r.claim {
                    if let Some(&at) = group_at.get(&(hold, share)) {
                        held[at].holders.push(r);
                        continue;
                    }
                    group_at.insert((hold, share), held.len());
                }
                held.push(Held {
                    share,
                    holders: vec![r],
                });
            }
        }
        held
    }

    /// Whether a live reservation of the pod already holds these claim devices with exactly
    /// these shares: a container that joins it adds nothing to what the GPUs hold.
    pub fn holds_claim(&self, hold: &ClaimHold, shares: &[GpuShare]) -> bool {
        self.reservations
            .iter()
            .any(|r| r.claim.as_ref() == Some(hold) && r.gpus == shares)
    }

    /// Sum of reserved bytes on every GPU, saturating as [`Ledger::reserved_on`].
    pub fn reserved_total(&self) -> u64 {
        let mut uuids: Vec<&str> = self
            .reservations
            .iter()
            .flat_map(|r| r.gpus.iter().map(|s| s.uuid.as_str()))
            .collect();
        uuids.sort_unstable();
        uuids.dedup();
        uuids
            .into_iter()
            .map(|uuid| self.reserved_on(uuid))
            .fold(0u64, u64::saturating_add)
    }

    /// Sum of the limits on one GPU ([`Ledger::held_on`]), saturating as [`Ledger::reserved_on`].
    pub fn limits_on(&self, uuid: &str) -> u64 {
        self.held_on(uuid)
            .iter()
            .fold(0u64, |sum, h| sum.saturating_add(h.share.limit_bytes()))
    }

    /// Whether any share, reserved or waiting, carries a limit above its bytes.
    pub fn has_limits(&self) -> bool {
        let shares = self.reservations.iter().flat_map(|r| &r.gpus);
        shares
            .chain(self.queue.iter().flat_map(|t| &t.gpus))
            .any(|s| s.limit.is_some())
    }

    /// The oldest format that describes this ledger (see [`FORMAT`]): what a write records.
    pub fn format_needed(&self) -> u32 {
        if self.reservations.iter().any(|r| r.claim_of.is_some()) {
            FORMAT
        } else if self.has_limits() {
            FORMAT_WITH_LIMITS
        } else {
            FORMAT_WITHOUT_LIMITS
        }
    }

    /// Where the own reservation of resource claim `uid` is ([`Reservation::claim_of`]).
    pub fn claim_reservation(&self, uid: &str) -> Option<usize> {
        self.reservations
            .iter()
            .position(|r| r.claim_of.as_ref().is_some_and(|c| c.uid == uid))
    }

    /// Whether resource claim `uid` holds memory here: its own reservation, or a container that
    /// took it over ([`Reservation::took_over_claim`]).
    pub fn claim_is_held(&self, uid: &str) -> bool {
        self.claim_reservation(uid).is_some()
            || self
                .reservations
                .iter()
                .any(|r| r.took_over_claim.as_ref().is_some_and(|c| c.uid == uid))
    }

    /// Gives the memory of `removed` (entries that just left the ledger: a container's stop,
    /// a reclaim) that held a resource claim they took over back to that claim, which stays
    /// allocated to this node until the DRA driver sees it deallocated or deleted and releases
    /// it: held from allocation to deallocation, whatever its containers do (a container that
    /// restarts takes it over again). Where another holder of the same pod's claim devices
    /// remains ([`Reservation::claim`]), it carries the record on and nothing is put back.
    pub fn hand_back_claims(&mut self, removed: &[Reservation]) {
        for gone in removed {
            let Some(claim) = &gone.took_over_claim else {
                continue;
            };
            if let Some(sibling) = self
                .reservations
                .iter_mut()
                .find(|r| gone.claim.is_some() && r.claim == gone.claim && r.took_over_claim.is_none())
            {
                sibling.took_over_claim = Some(claim.clone());
                continue;
            }
            // Shown as the driver shows it: `<namespace>/<pod>/claim:<name>`, the pod's part
            // from the container's name (`<namespace>/<pod>/<container>`).
            let name = gone
                .name
                .as_deref()
                .and_then(|n| n.rsplit_once('/'))
                .map(|(pod, _)| format!("{pod}/claim:{}", claim.name));
            match self.claim_reservation(&claim.uid) {
                Some(at) => {
                    let own = &mut self.reservations[at];
                    for share in &gone.gpus {
                        match own.gpus.iter_mut().find(|h| h.uuid == share.uuid) {
                            Some(h) => {
                                *h = GpuShare::new(
                                    h.uuid.clone(),
                                    h.bytes.saturating_add(share.bytes),
                                    h.limit_bytes().saturating_add(share.limit_bytes()),
                                )
                            }
                            None => own.gpus.push(share.clone()),
                        }
                    }
                }
                None => self.reservations.push(Reservation {
                    claim_of: Some(claim.clone()),
                    name,
                    ..Reservation::new(
                        claim.container_id(),
                        gone.gpus.clone(),
                        ClaimOf::NO_PROCESS,
                        gone.created_unix_ms,
                    )
                }),
            }
        }
    }

    /// Sum of reserved bytes on one GPU ([`Ledger::held_on`]). Saturating: a ledger edited by
    /// hand can hold sums past `u64::MAX`, and a wrapped sum would read as a nearly empty GPU.
    pub fn reserved_on(&self, uuid: &str) -> u64 {
        self.held_on(uuid)
            .iter()
            .fold(0u64, |sum, h| sum.saturating_add(h.share.bytes))
    }

    pub fn parse(bytes: &[u8], path: &Path) -> Result<Ledger> {
        let corrupt = |reason: String| LedgerError::Corrupt {
            path: path.to_path_buf(),
            reason: crate::one_line(&reason),
        };
        let ledger: Ledger = match serde_json::from_slice(bytes) {
            Ok(ledger) => ledger,
            Err(e) => {
                // Only on failure look for the format, so a newer one is reported as such (its
                // fields may not parse here at all) and not as corruption, while the common
                // path parses once.
                #[derive(Deserialize)]
                struct Format {
                    schema: u32,
                }
                return Err(match serde_json::from_slice::<Format>(bytes) {
                    Ok(f) if f.schema > FORMAT => newer(f.schema, path),
                    _ => corrupt(e.to_string()),
                });
            }
        };
        if ledger.schema > FORMAT {
            return Err(newer(ledger.schema, path));
        }
        if ledger.schema == 0 {
            return Err(corrupt("its format (`schema`) is 0, which no vramgate writes".into()));
        }
        if let Some(r) = ledger.reservations.iter().find(|r| r.gpus.is_empty()) {
            return Err(corrupt(format!("reservation of {:?} names no GPU", r.container_id)));
        }
        // A limit below the request would count less against limit_overcommit than the
        // request itself holds: only a damaged or hand-edited file says that.
        let shares = ledger.reservations.iter().map(|r| (&r.container_id, &r.gpus));
        let waiting = ledger.queue.iter().map(|t| (&t.container_id, &t.gpus));
        if let Some((id, s)) = shares.chain(waiting).find_map(|(id, gpus)| {
            gpus.iter()
                .find(|s| s.limit.is_some_and(|l| l < s.bytes))
                .map(|s| (id, s))
        }) {
            return Err(corrupt(format!(
                "the share of {id:?} on {} has a limit ({}) below its bytes ({})",
                s.uuid,
                s.limit.unwrap_or_default(),
                s.bytes
            )));
        }
        // Counters at their limit could only come from a damaged or forged file; refusing it
        // here keeps every `+ 1` on them below overflow.
        if ledger.next_ticket == u64::MAX || ledger.generation == u64::MAX {
            return Err(corrupt(
                "a counter (next_ticket or generation) is at its maximum".into(),
            ));
        }
        if ledger.queue.iter().any(|t| t.ticket >= ledger.next_ticket) {
            return Err(corrupt("a ticket number is not below next_ticket".into()));
        }
        if let Some(t) = ledger
            .queue
            .iter()
            .find(|t| t.choose.is_some_and(|n| n == 0 || n as usize > t.gpus.len()))
        {
            return Err(corrupt(format!(
                "ticket {} chooses {:?} of {} GPUs",
                t.ticket,
                t.choose,
                t.gpus.len()
            )));
        }
        Ok(ledger)
    }

    /// The generation a file that cannot be parsed as a ledger still shows, if any: `ledger
    /// repair` starts the new ledger above it, so generations never go backwards for readers
    /// that compare them.
    pub fn salvage_generation(bytes: &[u8]) -> Option<u64> {
        let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        value.get("generation")?.as_u64()
    }
}

fn newer(found: u32, path: &Path) -> LedgerError {
    LedgerError::NewerFormat {
        path: path.to_path_buf(),
        found,
    }
}

#[cfg(test)]
mod tests;
