//! One GPU's numbers as the admission rule sees them ([`GpuAccount`]): what is reserved, what
//! the reservations have not allocated yet, the headroom and the room for limits, and the
//! candidate a placement would offer. The rule itself is in [`super::decide`].

use std::collections::HashMap;

use super::Rules;
use crate::inventory::GpuMemory;
use crate::ledger::{GpuShare, Ledger};
use crate::placement::Candidate;
use crate::quantity::format_bytes;

/// Bytes that containers have already allocated, by (container id, GPU uuid), from NVML's
/// process list. Empty where it cannot be known.
pub type Allocated = HashMap<(String, String), u64>;

/// The numbers behind a decision on one GPU, for messages and `vramgate status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuAccount {
    pub uuid: String,
    pub index: u32,
    pub total: u64,
    pub free: u64,
    pub reserved: u64,
    pub unallocated: u64,
    pub headroom: u64,
    /// How many reservations hold memory on this GPU (status lists them under `reservations`).
    #[serde(rename = "reservation_count")]
    pub reservations: usize,
    /// The sum of the limits of those reservations (`reserved` where none asked for more).
    pub limits: u64,
    /// How far `limits` may pass `total - headroom` (`[queue] limit_overcommit`, rule 4).
    pub limit_overcommit: u64,
}

impl GpuAccount {
    /// This GPU as a placement candidate for a request of `request` bytes there.
    pub fn candidate(&self, request: u64) -> Candidate {
        Candidate {
            uuid: self.uuid.clone(),
            index: self.index,
            available: self.available(),
            reservations: self.reservations,
            request,
        }
    }

    /// What a new reservation may take on this GPU now: the smaller of rules 1 and 2.
    pub fn available(&self) -> u64 {
        let by_capacity = self.total.saturating_sub(self.headroom).saturating_sub(self.reserved);
        let by_free = self.free.saturating_sub(self.unallocated).saturating_sub(self.headroom);
        by_capacity.min(by_free)
    }

    /// The largest limit a new reservation may have on this GPU now (rule 4).
    pub fn limit_room(&self) -> u64 {
        self.limit_capacity().saturating_sub(self.limits)
    }

    /// Whether `share` fits on this GPU now: its request by rules 1 and 2, its limit by rule 4.
    pub fn has_room_for(&self, share: &GpuShare) -> bool {
        super::held_back(share, self.available(), self.limit_room()).is_none()
    }

    /// Whether `share` could fit on this GPU by the ledger alone: its request by rule 1 (the
    /// capacity less what is reserved), its limit by rule 4; the driver's free memory (rule 2)
    /// taken as no bound. At least [`GpuAccount::has_room_for`]: see
    /// [`super::ledger_has_room`].
    pub fn ledger_has_room_for(&self, share: &GpuShare) -> bool {
        super::held_back(share, self.capacity().saturating_sub(self.reserved), self.limit_room()).is_none()
    }

    /// What the reservations on this GPU may add up to (rule 1): the most a request can ever
    /// have here.
    pub fn capacity(&self) -> u64 {
        self.total.saturating_sub(self.headroom)
    }

    /// What the limits on this GPU may add up to (rule 4).
    pub fn limit_capacity(&self) -> u64 {
        self.capacity().saturating_add(self.limit_overcommit)
    }

    /// The numbers behind rule 4, for messages.
    pub fn describe_limits(&self) -> String {
        format!(
            "GPU {} ({}) has room for limits up to {} in all ({} total, {} headroom, {} [queue] limit_overcommit), and the limits of its {} container{} add up to {}",
            self.index,
            self.uuid,
            format_bytes(self.limit_capacity()),
            format_bytes(self.total),
            format_bytes(self.headroom),
            format_bytes(self.limit_overcommit),
            self.reservations,
            if self.reservations == 1 { "" } else { "s" },
            format_bytes(self.limits),
        )
    }

    /// Memory in use that no reservation accounts for (what the driver says is used, less
    /// what reserved containers have allocated).
    pub fn used_outside(&self) -> u64 {
        let used = self.total.saturating_sub(self.free);
        used.saturating_sub(self.reserved.saturating_sub(self.unallocated))
    }

    pub fn describe(&self) -> String {
        format!(
            "GPU {} ({}) has {} total, {} available to new requests ({} reserved by {} container{}, {} used outside vramgate, {} headroom)",
            self.index,
            self.uuid,
            format_bytes(self.total),
            format_bytes(self.available()),
            format_bytes(self.reserved),
            self.reservations,
            if self.reservations == 1 { "" } else { "s" },
            format_bytes(self.used_outside()),
            format_bytes(self.headroom),
        )
    }
}

pub fn account(ledger: &Ledger, gpu: &GpuMemory, allocated: &Allocated, rules: &Rules) -> GpuAccount {
    let mut reserved = 0u64;
    let mut unallocated = 0u64;
    let mut limits = 0u64;
    let mut reservations = 0;
    // A claim held by several containers of a pod is one share (Ledger::held_on), and what
    // its containers allocated together is what it has allocated.
    for held in ledger.held_on(&gpu.uuid) {
        reservations += held.holders.len();
        reserved = reserved.saturating_add(held.share.bytes);
        limits = limits.saturating_add(held.share.limit_bytes());
        let taken = held
            .holders
            .iter()
            .map(|r| {
                allocated
                    .get(&(r.container_id.clone(), gpu.uuid.clone()))
                    .copied()
                    .unwrap_or(0)
            })
            .fold(0u64, u64::saturating_add);
        unallocated = unallocated.saturating_add(held.share.bytes.saturating_sub(taken));
    }
    GpuAccount {
        uuid: gpu.uuid.clone(),
        index: gpu.index,
        total: gpu.total,
        free: gpu.free,
        reserved,
        unallocated,
        headroom: rules.headroom_on(gpu),
        reservations,
        limits,
        limit_overcommit: crate::quantity::Quantity::PartsPerMillion(rules.limit_overcommit_ppm).bytes_on(gpu.total),
    }
}

/// The account of a GPU that is no longer in the inventory: nothing fits on it.
pub(super) fn vanished(uuid: &str) -> GpuAccount {
    GpuAccount {
        uuid: uuid.to_string(),
        index: u32::MAX,
        total: 0,
        free: 0,
        reserved: 0,
        unallocated: 0,
        headroom: 0,
        reservations: 0,
        limits: 0,
        limit_overcommit: 0,
    }
}
