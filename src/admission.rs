//! The admission rule: a pure function of the ledger, the GPUs' memory now, and the request.
//!
//! For each GPU `g` the request names, with `R` the bytes asked for on `g`:
//!
//! 1. **Capacity**: `reserved(g) + R <= total(g) - headroom`. Reservations are promises; their
//!    sum never exceeds what the card has, whatever the containers have allocated so far.
//! 2. **Memory free now**: `R <= free(g) - unallocated(g) - headroom`, where `free(g)` is what
//!    the driver reports free (it already excludes memory that any process, inside vramgate
//!    or not, has allocated) and `unallocated(g)` is the part of live reservations that their
//!    containers have not allocated yet (a container that started a second ago has taken
//!    nothing yet but will). Without per-container usage (a host without NVML), every
//!    reservation counts as wholly unallocated, which is the safe direction. This is how
//!    memory used outside vramgate (a display, a daemon, an unannotated container) keeps new
//!    containers out.
//! 3. **Fairness**: waiting containers are served first-come first-served per GPU. A request
//!    is not admitted while an older live ticket shares one of its GPUs. With `backfill` on,
//!    a request that fits may pass older tickets, but never one that has waited longer than
//!    `backfill_bound`, so a large request cannot be starved by a stream of small ones.
//!    Among the requests that fit, `backfill_order` chooses ([`crate::queue::BackfillOrder`]):
//!    under `largest` or `longest`, a request that fits also lets go first every other
//!    waiter on its GPUs that fits now, would be admitted itself, and claims more
//!    ([`crate::queue::claim`]). Only a request that has not waited past the bound defers so;
//!    the best of those that fit never defers, so memory that frees is always taken.
//!
//! 4. **Limits**: with `L` the container's limit on `g` (its request when it asked for no
//!    more), `limits(g) + L <= total(g) - headroom + limit_overcommit(g)`, where `limits(g)` is
//!    the sum of the limits of the reservations on `g` and `limit_overcommit` is `[queue]
//!    limit_overcommit` of the GPU's memory. Rules 1 and 2 take the request, what the container
//!    is guaranteed; this one bounds what the containers may use together. At the default, 0%,
//!    a container needs room for its limit, as before limits were kept apart; without limits
//!    it is rule 1 again.
//!
//! A request larger than `total(g) - headroom` can never fit, nor a limit larger than
//! `total(g) - headroom + limit_overcommit(g)` and is refused at once, even
//! under the `wait` policy. A request on several GPUs must pass on every one (all or nothing).
//!
//! **Placement** (`auto`, see [`crate::placement`]): the request lists candidate GPUs and a
//! count. It can never fit when fewer than `count` candidates could ever hold it; it has room
//! when at least `count` candidates pass rules 1 and 2, and then the strategy picks among
//! those. Fairness is the same rule over all its candidates: a waiting placement is ahead of
//! every later request on any of its candidate GPUs, so a large request is served by the
//! first GPU that frees enough, and is not starved by small requests that keep landing on the
//! others (with `backfill`, they may pass it only until it has waited `backfill_bound`).

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Stamp;
use crate::inventory::{GpuMemory, Snapshot};
use crate::ledger::{GpuShare, Ledger};
use crate::placement::{self, Candidate, Placement, Strategy};
use crate::quantity::format_bytes;

/// Bytes that containers have already allocated, by (container id, GPU uuid), from NVML's
/// process list. Empty where it cannot be known.
pub type Allocated = HashMap<(String, String), u64>;

#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub headroom: crate::quantity::Quantity,
    pub backfill: bool,
    pub backfill_bound: Duration,
    pub backfill_order: crate::queue::BackfillOrder,
    pub strategy: Strategy,
    /// `[queue] limit_overcommit`, in parts per million of a GPU's memory (rule 4).
    pub limit_overcommit_ppm: u32,
}

impl Rules {
    pub fn from_config(config: &crate::config::Config) -> Rules {
        Rules {
            headroom: config.headroom,
            backfill: config.queue.backfill,
            backfill_bound: config.queue.backfill_bound,
            backfill_order: config.queue.backfill_order,
            strategy: config.placement.strategy,
            limit_overcommit_ppm: config.queue.limit_overcommit_ppm,
        }
    }

    fn headroom_on(&self, gpu: &GpuMemory) -> u64 {
        self.headroom.bytes_on(gpu.total).min(gpu.total)
    }
}

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
        share.bytes <= self.available() && share.limit_bytes() <= self.limit_room()
    }

    /// What the limits on this GPU may add up to (rule 4).
    pub fn limit_capacity(&self) -> u64 {
        self.total
            .saturating_sub(self.headroom)
            .saturating_add(self.limit_overcommit)
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
    for r in &ledger.reservations {
        for share in r.gpus.iter().filter(|s| s.uuid == gpu.uuid) {
            reservations += 1;
            reserved = reserved.saturating_add(share.bytes);
            limits = limits.saturating_add(share.limit_bytes());
            let taken = allocated
                .get(&(r.container_id.clone(), gpu.uuid.clone()))
                .copied()
                .unwrap_or(0);
            unallocated = unallocated.saturating_add(share.bytes.saturating_sub(taken));
        }
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

/// Which rule held a request back: the request against the memory (rules 1 and 2), or its
/// limit against the other limits on the GPU (rule 4). Messages say which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bound {
    #[default]
    Memory,
    Limits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Reserve `shares`: the request's own, or for a placement those chosen (`placement`).
    Admit {
        shares: Vec<GpuShare>,
        placement: Option<Placement>,
    },
    /// It can never fit: larger than the GPU less headroom (for a placement: than all but
    /// fewer than `count` candidates; `account` is then the largest one).
    /// With `bound` = [`Bound::Limits`], `request` is the limit, larger than the GPU's room
    /// for limits.
    Never {
        request: u64,
        account: GpuAccount,
        among: Option<Among>,
        bound: Bound,
    },
    /// Not now: not enough memory on a GPU (for a placement: on enough candidates; `account`
    /// is then the one with the most room), or, with `bound` = [`Bound::Limits`], not enough
    /// room for its limit (`request` is then the limit).
    NoRoom {
        request: u64,
        account: GpuAccount,
        among: Option<Among>,
        bound: Bound,
    },
    /// Not now: older waiters come first.
    Queued { ahead: usize },
}

/// What a placement chose among, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Among {
    pub count: u32,
    pub candidates: usize,
}

impl Among {
    /// "any one of 8 GPUs", "each of any 2 of 8 GPUs".
    pub fn describe(&self) -> String {
        let gpus = format!("{} GPU{}", self.candidates, if self.candidates == 1 { "" } else { "s" });
        if self.count == 1 {
            format!("any one of {gpus}")
        } else {
            format!("each of any {} of {gpus}", self.count)
        }
    }
}

/// Decides a request for `shares`. With `choose` = `Some(n)`, `shares` are candidates, of
/// which `n` are to be chosen. `ticket` is the request's own queue ticket, if it has one (a
/// new arrival has none and so comes after every waiter); `expected_ms` its declared duration.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    ledger: &Ledger,
    snapshot: &Snapshot,
    allocated: &Allocated,
    rules: &Rules,
    shares: &[GpuShare],
    choose: Option<u32>,
    ticket: Option<u64>,
    expected_ms: Option<u64>,
    now: Stamp,
) -> Decision {
    let decision = decide_in_arrival_order(ledger, snapshot, allocated, rules, shares, choose, ticket, now);
    if !matches!(decision, Decision::Admit { .. }) {
        return decision;
    }
    let Some(mine) = crate::queue::claim(
        rules.backfill_order,
        crate::queue::request_bytes(shares, choose),
        expected_ms,
    ) else {
        return decision;
    };
    match better_waiters_that_fit(ledger, snapshot, allocated, rules, shares, ticket, mine, now) {
        0 => decision,
        ahead => Decision::Queued { ahead },
    }
}

/// [`decide`] with waiters served by arrival alone (rules 1 to 3).
#[allow(clippy::too_many_arguments)]
fn decide_in_arrival_order(
    ledger: &Ledger,
    snapshot: &Snapshot,
    allocated: &Allocated,
    rules: &Rules,
    shares: &[GpuShare],
    choose: Option<u32>,
    ticket: Option<u64>,
    now: Stamp,
) -> Decision {
    if let Some(count) = choose {
        return decide_placement(ledger, snapshot, allocated, rules, shares, count, ticket, now);
    }
    let mut accounts = Vec::with_capacity(shares.len());
    for share in shares {
        let Some(gpu) = snapshot.by_uuid(&share.uuid) else {
            // The GPU vanished from the inventory (unplugged, MIG reconfigured): nothing fits.
            let account = vanished(&share.uuid);
            return Decision::Never {
                request: share.bytes,
                account,
                among: None,
                bound: Bound::Memory,
            };
        };
        let account = account(ledger, gpu, allocated, rules);
        if share.bytes > account.total.saturating_sub(account.headroom) {
            return Decision::Never {
                request: share.bytes,
                account,
                among: None,
                bound: Bound::Memory,
            };
        }
        if share.limit_bytes() > account.limit_capacity() {
            return Decision::Never {
                request: share.limit_bytes(),
                account,
                among: None,
                bound: Bound::Limits,
            };
        }
        accounts.push((share, account));
    }
    let ahead = tickets_ahead(ledger, rules, shares, ticket, now);
    for (share, account) in accounts {
        if share.bytes > account.available() {
            return Decision::NoRoom {
                request: share.bytes,
                account,
                among: None,
                bound: Bound::Memory,
            };
        }
        if share.limit_bytes() > account.limit_room() {
            return Decision::NoRoom {
                request: share.limit_bytes(),
                account,
                among: None,
                bound: Bound::Limits,
            };
        }
    }
    if ahead > 0 {
        return Decision::Queued { ahead };
    }
    Decision::Admit {
        shares: shares.to_vec(),
        placement: None,
    }
}

/// Older tickets on any of `shares`' GPUs that this request must let go first. Backfill may
/// pass an older ticket only while it has not waited past the bound.
/// A ticket's age is taken on the boot clock ([`Stamp::ms_since`]): a wall clock stepped back
/// would otherwise let backfill pass an old waiter for as long as the step, and one stepped
/// forward would end backfill for every waiter at once.
fn tickets_ahead(ledger: &Ledger, rules: &Rules, shares: &[GpuShare], ticket: Option<u64>, now: Stamp) -> usize {
    let bound = u64::try_from(rules.backfill_bound.as_millis()).unwrap_or(u64::MAX);
    crate::queue::ahead_of(ledger, ticket, shares)
        .filter(|t| !rules.backfill || now.ms_since(t.enqueued_unix_ms, t.enqueued_boot_ms) >= bound)
        .count()
}

/// The waiters that a request which fits (claiming `mine`, see [`crate::queue::claim`]) lets
/// go first under a backfill order: each other ticket on one of its GPUs that claims more (or
/// as much and is older), fits now and would itself be admitted by arrival order. None once the
/// request has waited past the bound: from then on nothing passes it, and it passes nothing.
/// The best such waiter defers to no one, so memory that frees is always taken.
#[allow(clippy::too_many_arguments)]
fn better_waiters_that_fit(
    ledger: &Ledger,
    snapshot: &Snapshot,
    allocated: &Allocated,
    rules: &Rules,
    shares: &[GpuShare],
    ticket: Option<u64>,
    mine: u128,
    now: Stamp,
) -> usize {
    if !rules.backfill {
        return 0;
    }
    let bound = u64::try_from(rules.backfill_bound.as_millis()).unwrap_or(u64::MAX);
    let own = ticket.and_then(|t| ledger.ticket(t));
    if own.is_some_and(|t| now.ms_since(t.enqueued_unix_ms, t.enqueued_boot_ms) >= bound) {
        return 0;
    }
    // A newer ticket with the same claim is behind; an older one, or any ticket against a new
    // arrival (which has none), is ahead.
    let outranks = |t: &crate::ledger::Ticket, claim: u128| match own {
        Some(own) => claim > mine || (claim == mine && t.ticket < own.ticket),
        None => claim >= mine,
    };
    // Each GPU's account once: a decision looks at every waiter on its GPUs.
    let mut accounts: HashMap<String, Option<GpuAccount>> = HashMap::new();
    let mut room = |share: &GpuShare| {
        accounts
            .entry(share.uuid.clone())
            .or_insert_with(|| {
                snapshot
                    .by_uuid(&share.uuid)
                    .map(|g| account(ledger, g, allocated, rules))
            })
            .as_ref()
            .is_some_and(|a| a.has_room_for(share))
    };
    let mut better = 0;
    for t in ledger.queue.iter() {
        if Some(t.ticket) == ticket || !t.shares_gpu_with(shares) {
            continue;
        }
        let claim = crate::queue::claim(
            rules.backfill_order,
            crate::queue::request_bytes(&t.gpus, t.choose),
            t.expected_ms,
        );
        if !claim.is_some_and(|c| outranks(t, c)) {
            continue;
        }
        // It fits now (rules 1, 2 and 4: every GPU, or enough of a placement's candidates)...
        let fits = match t.choose {
            None => t.gpus.iter().all(&mut room),
            Some(n) => t.gpus.iter().filter(|s| room(s)).count() >= n as usize,
        };
        // ...and no waiter past the bound holds it back (rule 3).
        if fits && tickets_ahead(ledger, rules, &t.gpus, Some(t.ticket), now) == 0 {
            better += 1;
        }
    }
    better
}

/// [`decide`] for a placement: `count` of the `candidates` (see the module documentation).
#[allow(clippy::too_many_arguments)]
fn decide_placement(
    ledger: &Ledger,
    snapshot: &Snapshot,
    allocated: &Allocated,
    rules: &Rules,
    candidates: &[GpuShare],
    count: u32,
    ticket: Option<u64>,
    now: Stamp,
) -> Decision {
    let among = Some(Among {
        count,
        candidates: candidates.len(),
    });
    let accounts: Vec<(&GpuShare, GpuAccount)> = candidates
        .iter()
        .filter_map(|share| Some((share, account(ledger, snapshot.by_uuid(&share.uuid)?, allocated, rules))))
        .collect();
    let largest = |list: &[&(&GpuShare, GpuAccount)], key: fn(&GpuAccount) -> u64, bound: Bound| {
        list.iter()
            .max_by_key(|(_, a)| (key(a), std::cmp::Reverse(a.index)))
            .map(|(s, a)| {
                let asked = if bound == Bound::Limits {
                    s.limit_bytes()
                } else {
                    s.bytes
                };
                (asked, a.clone())
            })
    };
    let all: Vec<&(&GpuShare, GpuAccount)> = accounts.iter().collect();
    let could_hold: Vec<&(&GpuShare, GpuAccount)> = accounts
        .iter()
        .filter(|(s, a)| s.bytes <= a.total.saturating_sub(a.headroom))
        .collect();
    let could: Vec<&(&GpuShare, GpuAccount)> = could_hold
        .iter()
        .copied()
        .filter(|(s, a)| s.limit_bytes() <= a.limit_capacity())
        .collect();
    if could.len() < count as usize {
        // Held back by the limit only when enough GPUs could ever hold the request.
        let (list, key, bound): (&[&(&GpuShare, GpuAccount)], fn(&GpuAccount) -> u64, Bound) =
            if could_hold.len() >= count as usize {
                (&could_hold, GpuAccount::limit_capacity, Bound::Limits)
            } else {
                (&all, |a: &GpuAccount| a.total, Bound::Memory)
            };
        let Some((request, account)) = largest(list, key, bound) else {
            // No candidate left in the inventory at all.
            let request = candidates.first().map_or(0, |s| s.bytes);
            return Decision::Never {
                request,
                account: vanished(candidates.first().map_or("", |s| s.uuid.as_str())),
                among,
                bound: Bound::Memory,
            };
        };
        return Decision::Never {
            request,
            account,
            among,
            bound,
        };
    }
    let ahead = tickets_ahead(ledger, rules, candidates, ticket, now);
    let with_memory: Vec<&(&GpuShare, GpuAccount)> = could
        .iter()
        .copied()
        .filter(|(s, a)| s.bytes <= a.available())
        .collect();
    let fitting: Vec<&(&GpuShare, GpuAccount)> =
        with_memory.iter().copied().filter(|(s, a)| a.has_room_for(s)).collect();
    if fitting.len() < count as usize {
        let (list, key, bound): (&[&(&GpuShare, GpuAccount)], fn(&GpuAccount) -> u64, Bound) =
            if with_memory.len() >= count as usize {
                (&with_memory, GpuAccount::limit_room, Bound::Limits)
            } else {
                (&could, GpuAccount::available, Bound::Memory)
            };
        let (request, account) = largest(list, key, bound).expect("at least count >= 1 could fit");
        return Decision::NoRoom {
            request,
            account,
            among,
            bound,
        };
    }
    if ahead > 0 {
        return Decision::Queued { ahead };
    }
    let bytes = fitting[0].0.bytes;
    let offered: Vec<Candidate> = fitting.iter().map(|(s, a)| a.candidate(s.bytes)).collect();
    let chosen = placement::choose(rules.strategy, &offered, count as usize).expect("enough fit");
    let shares = chosen
        .iter()
        .filter_map(|uuid| candidates.iter().find(|s| &s.uuid == uuid).cloned())
        .collect();
    Decision::Admit {
        shares,
        placement: Some(Placement {
            strategy: rules.strategy,
            bytes,
            candidates: offered,
            chosen,
        }),
    }
}

/// The account of a GPU that is no longer in the inventory: nothing fits on it.
fn vanished(uuid: &str) -> GpuAccount {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Reservation, Ticket};
    use crate::procfs::ProcessIdentity;
    use crate::quantity::Quantity;

    const MI: u64 = 1 << 20;
    const CARD: u64 = 24_265 * MI;

    /// A request without placement, as most tests make.
    fn decide_one(
        ledger: &Ledger,
        snapshot: &Snapshot,
        allocated: &Allocated,
        rules: &Rules,
        shares: &[GpuShare],
        ticket: Option<u64>,
        now_unix_ms: u64,
    ) -> Decision {
        decide(
            ledger,
            snapshot,
            allocated,
            rules,
            shares,
            None,
            ticket,
            None,
            Stamp::wall(now_unix_ms),
        )
    }

    fn admit(shares: &[GpuShare]) -> Decision {
        Decision::Admit {
            shares: shares.to_vec(),
            placement: None,
        }
    }

    fn rules() -> Rules {
        Rules {
            strategy: Strategy::BestFit,
            limit_overcommit_ppm: 0,
            headroom: Quantity::Bytes(0),
            backfill: false,
            backfill_bound: Duration::from_secs(30),
            backfill_order: crate::queue::BackfillOrder::Arrival,
        }
    }

    fn gpu(uuid: &str, total: u64, free: u64) -> GpuMemory {
        GpuMemory {
            index: 0,
            mig_index: None,
            uuid: uuid.into(),
            minor: Some(0),
            total,
            free,
            mig_caps: Vec::new(),
        }
    }

    fn snap(free: u64) -> Snapshot {
        Snapshot {
            gpus: vec![gpu("G", CARD, free)],
            ..Default::default()
        }
    }

    fn share(bytes: u64) -> Vec<GpuShare> {
        vec![GpuShare {
            uuid: "G".into(),
            bytes,
            limit: None,
        }]
    }

    fn reserve(ledger: &mut Ledger, id: &str, bytes: u64) {
        ledger.reservations.push(Reservation {
            container_id: id.into(),
            gpus: share(bytes),
            init: ProcessIdentity { pid: 1, start_time: 1 },
            created_unix_ms: 0,
            waited_ms: 0,
            bundle: None,
            pending: false,
            enforcement: None,
            extra: Default::default(),
        });
    }

    fn enqueue(ledger: &mut Ledger, bytes: u64, at_ms: u64) -> u64 {
        let ticket = ledger.next_ticket;
        ledger.next_ticket += 1;
        ledger.queue.push(Ticket {
            ticket,
            container_id: format!("t{ticket}"),
            gpus: share(bytes),
            waiter: ProcessIdentity { pid: 1, start_time: 1 },
            enqueued_unix_ms: at_ms,
            enqueued_boot_ms: None,
            deadline_unix_ms: u64::MAX,
            bundle: None,
            choose: None,
            expected_ms: None,
            extra: Default::default(),
        });
        ticket
    }

    #[test]
    fn paper_card_holds_twenty_of_1205_mib() {
        let mut ledger = Ledger::default();
        let mut admitted = 0;
        for n in 0..25 {
            match decide_one(
                &ledger,
                &snap(CARD),
                &Allocated::new(),
                &rules(),
                &share(1205 * MI),
                None,
                0,
            ) {
                Decision::Admit { .. } => {
                    reserve(&mut ledger, &format!("c{n}"), 1205 * MI);
                    admitted += 1;
                }
                Decision::NoRoom { account, .. } => assert!(account.available() < 1205 * MI),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(admitted, 20);
        assert!(ledger.reserved_on("G") <= CARD);
    }

    #[test]
    fn never_fits_is_refused_even_when_empty() {
        let d = decide_one(
            &Ledger::default(),
            &snap(CARD),
            &Allocated::new(),
            &rules(),
            &share(CARD + 1),
            None,
            0,
        );
        assert!(matches!(d, Decision::Never { .. }));
        let mut r = rules();
        r.headroom = Quantity::Bytes(MI);
        assert!(matches!(
            decide_one(
                &Ledger::default(),
                &snap(CARD),
                &Allocated::new(),
                &r,
                &share(CARD),
                None,
                0
            ),
            Decision::Never { .. }
        ));
    }

    #[test]
    fn outside_usage_blocks_and_allocation_is_not_counted_twice() {
        // 20 GiB used by something outside vramgate: only ~3.7 GiB can be promised.
        let s = snap(CARD - (20 << 30));
        assert!(matches!(
            decide_one(
                &Ledger::default(),
                &s,
                &Allocated::new(),
                &rules(),
                &share(4 << 30),
                None,
                0
            ),
            Decision::NoRoom { .. }
        ));
        assert_eq!(
            decide_one(
                &Ledger::default(),
                &s,
                &Allocated::new(),
                &rules(),
                &share(3 << 30),
                None,
                0
            ),
            admit(&share(3 << 30))
        );

        // A container reserved 10 GiB and has allocated 8 of it: free already excludes the 8.
        let mut ledger = Ledger::default();
        reserve(&mut ledger, "c", 10 << 30);
        let s = snap(CARD - (8 << 30));
        let mut allocated = Allocated::new();
        let account_without = account(&ledger, &s.gpus[0], &allocated, &rules());
        allocated.insert(("c".into(), "G".into()), 8 << 30);
        let account_with = account(&ledger, &s.gpus[0], &allocated, &rules());
        assert_eq!(account_with.available(), CARD - (10 << 30));
        assert_eq!(
            account_without.available(),
            CARD - (18 << 30),
            "unknown usage is counted as unallocated"
        );
        assert_eq!(account_with.used_outside(), 0);
    }

    #[test]
    fn fifo_and_bounded_backfill() {
        let mut ledger = Ledger::default();
        reserve(&mut ledger, "big", CARD - (2 << 30));
        let old = enqueue(&mut ledger, 10 << 30, 0);
        let small = share(1 << 30);
        // Fits, but an older waiter shares the GPU: strict FIFO holds it back.
        assert_eq!(
            decide_one(&ledger, &snap(CARD), &Allocated::new(), &rules(), &small, None, 1_000),
            Decision::Queued { ahead: 1 }
        );
        // The head itself is judged on memory only.
        assert!(matches!(
            decide_one(
                &ledger,
                &snap(CARD),
                &Allocated::new(),
                &rules(),
                &share(10 << 30),
                Some(old),
                1_000
            ),
            Decision::NoRoom { .. }
        ));
        // Backfill lets it pass a young waiter, but not one older than the bound.
        let mut r = rules();
        r.backfill = true;
        assert_eq!(
            decide_one(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 1_000),
            admit(&small)
        );
        assert_eq!(
            decide_one(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 31_000),
            Decision::Queued { ahead: 1 }
        );
    }

    /// The bound is measured on the boot clock: the wall clock stepped back an hour does not
    /// let backfill pass a waiter that has waited past the bound, and stepped forward an hour
    /// it does not hold small requests behind a waiter that has just arrived.
    #[test]
    fn the_backfill_bound_ignores_wall_clock_steps() {
        let mut ledger = Ledger::default();
        reserve(&mut ledger, "big", CARD - (2 << 30));
        let t = enqueue(&mut ledger, 10 << 30, 10_000_000);
        ledger
            .queue
            .iter_mut()
            .find(|q| q.ticket == t)
            .unwrap()
            .enqueued_boot_ms = Some(50_000);
        let small = share(1 << 30);
        let mut r = rules();
        r.backfill = true;
        let at = |unix_ms, boot_ms| {
            decide(
                &ledger,
                &snap(CARD),
                &Allocated::new(),
                &r,
                &small,
                None,
                None,
                None,
                Stamp {
                    unix_ms,
                    boot_ms: Some(boot_ms),
                },
            )
        };
        // 40 s waited (past the 30 s bound) while the wall clock went back an hour.
        assert_eq!(
            at(10_000_000 - 3_600_000 + 40_000, 90_000),
            Decision::Queued { ahead: 1 }
        );
        // 1 s waited while the wall clock went forward an hour: backfill may still pass it.
        assert_eq!(at(10_000_000 + 3_600_000, 51_000), admit(&small));
        // A ticket without a boot time (an older vramgate's) is aged on the wall clock.
        ledger.queue.iter_mut().for_each(|q| q.enqueued_boot_ms = None);
        assert_eq!(
            decide_one(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 10_031_000),
            Decision::Queued { ahead: 1 }
        );
    }

    #[test]
    fn multi_gpu_is_all_or_nothing() {
        let s = Snapshot {
            gpus: vec![gpu("A", CARD, CARD), gpu("B", CARD, 1 << 30)],
            ..Default::default()
        };
        let both = vec![
            GpuShare {
                uuid: "A".into(),
                bytes: 2 << 30,
                limit: None,
            },
            GpuShare {
                uuid: "B".into(),
                bytes: 2 << 30,
                limit: None,
            },
        ];
        match decide_one(&Ledger::default(), &s, &Allocated::new(), &rules(), &both, None, 0) {
            Decision::NoRoom { account, .. } => assert_eq!(account.uuid, "B"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn vanished_gpu_never_fits() {
        let d = decide_one(
            &Ledger::default(),
            &snap(CARD),
            &Allocated::new(),
            &rules(),
            &[GpuShare {
                uuid: "gone".into(),
                bytes: 1,
                limit: None,
            }],
            None,
            0,
        );
        assert!(matches!(d, Decision::Never { .. }));
    }

    /// Rule 4: requests of 2 GiB with limits of 6 GiB on an 8 GiB card. The first fits; the
    /// second has room for its request but not its limit at the default 0%, and fits at 50%
    /// (limits may add up to 12 GiB). A limit past the card plus the bound never fits.
    #[test]
    fn the_sum_of_limits_is_bounded_by_limit_overcommit() {
        const GI: u64 = 1 << 30;
        let card = Snapshot {
            gpus: vec![gpu("G", 8 * GI, 8 * GI)],
            ..Default::default()
        };
        let asked = [GpuShare::new("G", 2 * GI, 6 * GI)];
        let mut ledger = Ledger::default();
        assert_eq!(
            decide_one(&ledger, &card, &Allocated::new(), &rules(), &asked, None, 0),
            admit(&asked)
        );
        ledger.reservations.push(Reservation {
            gpus: asked.to_vec(),
            ..Reservation::for_test("a", "G", 0)
        });
        match decide_one(&ledger, &card, &Allocated::new(), &rules(), &asked, None, 0) {
            Decision::NoRoom {
                request,
                account,
                bound: Bound::Limits,
                ..
            } => {
                assert_eq!(
                    (request, account.limits, account.limit_room()),
                    (6 * GI, 6 * GI, 2 * GI)
                );
                assert!(
                    account
                        .describe_limits()
                        .contains("room for limits up to 8192 MiB in all"),
                    "{}",
                    account.describe_limits()
                );
            }
            other => panic!("{other:?}"),
        }
        let half = Rules {
            limit_overcommit_ppm: 500_000,
            ..rules()
        };
        assert_eq!(
            decide_one(&ledger, &card, &Allocated::new(), &half, &asked, None, 0),
            admit(&asked)
        );
        // The request itself is still rule 1's: 2 GiB reserved, 7 asked, does not fit.
        let big = [GpuShare::new("G", 7 * GI, 7 * GI)];
        assert!(matches!(
            decide_one(&ledger, &card, &Allocated::new(), &half, &big, None, 0),
            Decision::NoRoom {
                bound: Bound::Memory,
                ..
            }
        ));
        let huge = [GpuShare::new("G", 2 * GI, 13 * GI)];
        assert!(matches!(
            decide_one(&Ledger::default(), &card, &Allocated::new(), &half, &huge, None, 0),
            Decision::Never { request, bound: Bound::Limits, .. } if request == 13 * GI
        ));
    }
}
