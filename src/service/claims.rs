//! A resource claim's own reservation: the scheduler's decision held on the node from the
//! claim's allocation, before any container of it exists ([`crate::ledger::ClaimOf`]). The DRA
//! driver asks for it when it sees the claim allocated to its node, and releases it when the
//! claim is deallocated or deleted; the claim's first container takes it over when it starts
//! (`decide`), so the memory is counted once throughout.

use super::{Refusal, Result, Service, Shortage};
use crate::admission::Decision;
use crate::events::{self, Kind};
use crate::ledger::{ClaimOf, GpuShare, Reservation, LOCK_TIMEOUT};

/// What [`Service::reserve_claim`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReserved {
    /// Reserved now.
    Reserved,
    /// Already held: its own reservation, or a container that took it over.
    AlreadyHeld,
    /// The GPUs cannot hold it now: vramgate's one line, which says why.
    Refused(String),
}

/// The line for a claim the node cannot hold now: what is short, and what happens next.
fn not_now(claim: &ClaimOf, shortage: Shortage) -> ClaimReserved {
    ClaimReserved::Refused(format!(
        "vramgate: this node cannot hold resource claim {}/{} now: {shortage}; its pod goes back to the scheduler, which places it again once memory frees",
        claim.namespace, claim.name
    ))
}

impl Service<'_> {
    /// Reserves `shares` for resource claim `claim` under the node's rule, now or never: a
    /// claim is not queued (the scheduler has other nodes and its own queue), so what does not
    /// fit now, for memory or behind the node's waiters, is refused with the reason. `name` is
    /// what it is shown as (`namespace/pod/claim:<name>`). One transaction, which reclaims
    /// as any does.
    pub fn reserve_claim(&self, claim: &ClaimOf, shares: &[GpuShare], name: Option<&str>) -> Result<ClaimReserved> {
        let id = claim.container_id();
        // The GPUs' numbers and their processes, read before the lock as an admission does.
        let peek = self.dir.peek()?;
        let snapshot = self
            .inventory
            .snapshot_with_processes(&|uuid: &str| peek.ledger().has_reservations_on(uuid))?;
        let (mut tx, reclaimed, _) =
            self.dir
                .begin_reclaiming_after(peek, self.liveness, self.clock.stamp(), LOCK_TIMEOUT)?;
        let mut log = Vec::new();
        self.reclaim_events(&reclaimed, &mut log);
        if tx.ledger.claim_is_held(&claim.uid) {
            drop(tx);
            events::append(&self.dir, &log);
            return Ok(ClaimReserved::AlreadyHeld);
        }
        let now = self.clock.stamp();
        let decision = self.rule_on(&tx.ledger, &snapshot, shares, None, None, None, now);
        let outcome = match decision {
            Decision::Admit { shares: chosen, .. } => {
                tx.ledger.reservations.push(Reservation {
                    claim_of: Some(claim.clone()),
                    name: name.map(str::to_string),
                    ..Reservation::new(&id, chosen.clone(), ClaimOf::NO_PROCESS, now.unix_ms)
                });
                tx.ledger.counters.record_admit(None);
                let detail = format!("resource claim {}/{}, at allocation", claim.namespace, claim.name);
                log.push(
                    self.event(Kind::Admit, &id, &chosen, detail)
                        .named(&name.map(str::to_string)),
                );
                ClaimReserved::Reserved
            }
            Decision::Never {
                request,
                account,
                among,
                bound,
            } => {
                let refusal = Refusal::NeverFits {
                    container: id.clone(),
                    request,
                    account,
                    among,
                    bound,
                };
                ClaimReserved::Refused(format!(
                    "vramgate: resource claim {}/{} can never be held on this node: {}",
                    claim.namespace,
                    claim.name,
                    refusal.to_string().trim_start_matches("vramgate: ")
                ))
            }
            Decision::NoRoom {
                request,
                account,
                among,
                bound,
            } => not_now(
                claim,
                Shortage::Memory {
                    request,
                    account,
                    among,
                    bound,
                },
            ),
            Decision::Queued { ahead } => not_now(claim, Shortage::Queue { ahead }),
        };
        if let ClaimReserved::Refused(refusal) = &outcome {
            tx.ledger.counters.record_refuse();
            log.push(
                self.event(Kind::Refuse, &id, shares, refusal.to_string())
                    .named(&name.map(str::to_string)),
            );
        }
        let _committed = tx.commit()?;
        events::append(&self.dir, &log);
        Ok(outcome)
    }

    /// Releases resource claim `uid`'s own reservation (deallocated, deleted, or gone while
    /// the driver was away); `why` goes into the event log. Whether there was one.
    pub fn release_claim(&self, uid: &str, why: &str) -> Result<bool> {
        let held = self.dir.peek()?.ledger().claim_reservation(uid).is_some();
        if !held {
            return Ok(false);
        }
        let mut tx = self.dir.begin()?;
        let Some(at) = tx.ledger.claim_reservation(uid) else {
            return Ok(false);
        };
        let r = tx.ledger.reservations.remove(at);
        tx.ledger.counters.record_release();
        let _committed = tx.commit()?;
        events::append(
            &self.dir,
            &[self.event(Kind::Release, &r.container_id, &r.gpus, why).named(&r.name)],
        );
        Ok(true)
    }

    /// The claims the ledger holds memory for, by uid: their own reservations and those a
    /// container took over. What a driver back from a restart compares with the claims
    /// allocated to its node.
    pub fn claims_held(&self) -> Result<Vec<(String, bool)>> {
        let peek = self.dir.peek()?;
        let ledger = peek.ledger();
        let own = ledger
            .reservations
            .iter()
            .filter_map(|r| r.claim_of.as_ref().map(|c| (c.uid.clone(), true)));
        let taken = ledger
            .reservations
            .iter()
            .filter_map(|r| r.took_over_claim.as_ref().map(|c| (c.uid.clone(), false)));
        Ok(own.chain(taken).collect())
    }
}
