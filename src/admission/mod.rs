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
//!    Among the requests that fit, `backfill_order` chooses
//!    ([`crate::queue_order::BackfillOrder`]): under `largest` or `longest`, a request that
//!    fits also lets go first every other waiter on its GPUs that fits now, would be admitted
//!    itself, and claims more ([`crate::queue_order::claim`]). Only a request that has not
//!    waited past the bound defers so; the best of those that fit never defers, so memory
//!    that frees is always taken.
//!
//! 4. **Limits**: with `L` the container's limit on `g` (its request when it asked for no
//!    more), `limits(g) + L <= total(g) - headroom + limit_overcommit(g)`, where `limits(g)` is
//!    the sum of the limits of the reservations on `g` and `limit_overcommit` is `[queue]
//!    limit_overcommit` of the GPU's memory. Rules 1 and 2 take the request, what the container
//!    is guaranteed; this one bounds what the containers may use together. At the default, 0%,
//!    a container needs room for its limit, as before limits were kept apart; without limits
//!    it is rule 1 again.
//!
//! **A claim a pod already holds** ([`joins_claim`]): a container of a pod given the same
//! Kubernetes claim devices, with the same shares, as a container of that pod that holds them
//! now adds nothing to any GPU (the scheduler counted the claim once, and the ledger counts the
//! hold once: [`crate::ledger::ClaimHold`]). It is admitted before the rules, which have nothing
//! to check, and passes no one in the queue, since it takes nothing.
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

mod account;

use crate::clock::Stamp;
use crate::inventory::{GpuMemory, Snapshot};
use crate::ledger::{ClaimHold, GpuShare, Ledger};
use crate::placement::{self, Candidate, Placement, Strategy};
use account::vanished;
pub use account::{account, Allocated, GpuAccount};

#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub headroom: crate::quantity::Quantity,
    pub backfill: bool,
    pub backfill_bound: Duration,
    pub backfill_order: crate::queue_order::BackfillOrder,
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
    let Some(mine) = crate::queue_order::claim(
        rules.backfill_order,
        crate::queue_order::request_bytes(shares, choose),
        expected_ms,
    ) else {
        return decision;
    };
    match better_waiters_that_fit(ledger, snapshot, allocated, rules, shares, ticket, mine, now) {
        0 => decision,
        ahead => Decision::Queued { ahead },
    }
}

/// A container joining the claim hold of its pod (see the module docs): admitted as it is,
/// with no placement, when a reservation in `ledger` holds `hold` with exactly `shares`;
/// `None` for every other request, which the rules decide.
pub fn joins_claim(
    ledger: &Ledger,
    hold: Option<&ClaimHold>,
    shares: &[GpuShare],
    choose: Option<u32>,
) -> Option<Decision> {
    let hold = hold?;
    (choose.is_none() && ledger.holds_claim(hold, shares)).then(|| Decision::Admit {
        shares: shares.to_vec(),
        placement: None,
    })
}

/// [`decide`] for a request that names its GPUs (no placement, no expected duration) at wall
/// time `now_unix_ms`: how the rule's own tests and the NVML fixtures' replays ask it.
pub fn decide_named(
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
        if let Some((request, bound)) = held_back(share, account.capacity(), account.limit_capacity()) {
            return Decision::Never {
                request,
                account,
                among: None,
                bound,
            };
        }
        accounts.push((share, account));
    }
    let ahead = tickets_ahead(ledger, rules, shares, ticket, now);
    for (share, account) in accounts {
        if let Some((request, bound)) = held_back(share, account.available(), account.limit_room()) {
            return Decision::NoRoom {
                request,
                account,
                among: None,
                bound,
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

/// The rule `share` breaks on a GPU that gives its request `memory` (rules 1 and 2) and its
/// limit `limits` (rule 4), memory first: what it asks there and the bound, for the message;
/// `None` when it passes both. With the GPU's capacities it says "never", with its room now
/// "not now" ([`GpuAccount::has_room_for`]).
fn held_back(share: &GpuShare, memory: u64, limits: u64) -> Option<(u64, Bound)> {
    if share.bytes > memory {
        Some((share.bytes, Bound::Memory))
    } else if share.limit_bytes() > limits {
        Some((share.limit_bytes(), Bound::Limits))
    } else {
        None
    }
}

/// Older tickets on any of `shares`' GPUs that this request must let go first. Backfill may
/// pass an older ticket only while it has not waited past the bound.
/// A ticket's age is taken on the boot clock ([`Stamp::ms_since`]): a wall clock stepped back
/// would otherwise let backfill pass an old waiter for as long as the step, and one stepped
/// forward would end backfill for every waiter at once.
fn tickets_ahead(ledger: &Ledger, rules: &Rules, shares: &[GpuShare], ticket: Option<u64>, now: Stamp) -> usize {
    holding_back(ledger, rules, shares, ticket, now).count()
}

/// The tickets that rule 3 puts ahead of `ticket` (`None`: a new arrival) on `shares`' GPUs,
/// oldest first: every older one without backfill, only those that have waited the bound with
/// it. What [`decide`] counts, and what a waiter looks at before it takes the lock: while one
/// of them is alive, nothing but its leaving (a ledger change) can let this one in, and time
/// only adds to them.
pub fn holding_back<'a>(
    ledger: &'a Ledger,
    rules: &Rules,
    shares: &'a [GpuShare],
    ticket: Option<u64>,
    now: Stamp,
) -> impl Iterator<Item = &'a crate::ledger::Ticket> + 'a {
    let bound = u64::try_from(rules.backfill_bound.as_millis()).unwrap_or(u64::MAX);
    let backfill = rules.backfill;
    crate::queue_order::ahead_of(ledger, ticket, shares)
        .filter(move |t| !backfill || now.ms_since(t.enqueued_unix_ms, t.enqueued_boot_ms) >= bound)
}

/// Whether `shares` (`choose` of them, for a placement) could have room by the rules that the
/// ledger alone decides, capacity (rule 1) and limits (rule 4), on the GPUs as last seen
/// (`gpus`). What a waiter asks of an unlocked read of the ledger before it takes the lock
/// (see `service/queue_wait.rs`). Rule 2 (the driver's free memory) is left to the attempt: it
/// can only hold a request back further, so `false` here is `NoRoom` from [`decide`] on this
/// ledger whatever the GPUs' free memory is; memory freed outside vramgate never makes the
/// room that rule 1 denies. A GPU missing from `gpus` counts as having room: the attempt
/// reads the inventory and says.
pub fn ledger_has_room(
    ledger: &Ledger,
    gpus: &[GpuMemory],
    rules: &Rules,
    shares: &[GpuShare],
    choose: Option<u32>,
) -> bool {
    let no_usage = Allocated::new();
    let room = |share: &&GpuShare| {
        gpus.iter()
            .find(|g| g.uuid == share.uuid)
            .is_none_or(|g| account(ledger, g, &no_usage, rules).ledger_has_room_for(share))
    };
    match choose {
        None => shares.iter().all(|s| room(&s)),
        Some(n) => shares.iter().filter(room).count() >= n as usize,
    }
}

/// The waiters that a request which fits (claiming `mine`, see [`crate::queue_order::claim`]) lets
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
        let claim = crate::queue_order::claim(
            rules.backfill_order,
            crate::queue_order::request_bytes(&t.gpus, t.choose),
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
    let could_hold: Vec<&(&GpuShare, GpuAccount)> = accounts.iter().filter(|(s, a)| s.bytes <= a.capacity()).collect();
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

#[cfg(test)]
mod tests;
