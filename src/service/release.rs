//! Ending what an admission left: a container's release, the tier recorded after it was
//! admitted, and the reclaim-only transaction (`vramgate gc`).

use std::path::Path;
use std::time::Duration;

use super::{Result, Service};
use crate::events::{self, Kind};
use crate::ledger::{Ledger, Reclaimed, Reservation, Ticket, LOCK_TIMEOUT};

/// What a release found.
#[derive(Debug, Default)]
pub struct Released {
    pub reservation: Option<Reservation>,
    /// Waits that were ended (their hooks refuse their containers).
    pub cancelled: Vec<Ticket>,
}

impl Service<'_> {
    /// Removes a container's reservation and ends its waits, in one transaction that also
    /// reclaims what is gone. With a `bundle` (a stop seen by the hook), only entries of that
    /// container match, never a namesake's; without (`vramgate release <id>`), the id decides.
    /// What is released is decided from the ledger alone: a container's spec may have changed
    /// since it was admitted. A container the ledger does not hold costs three `stat`s (the
    /// markers of [`crate::ledger::marks`]), or one unlocked read where they cannot say.
    /// `why` goes into the event log ("poststop", "vramgate release").
    pub fn release(&self, container: &str, bundle: Option<&Path>, why: &str) -> Result<Released> {
        let held = |ledger: &Ledger| {
            ledger.reservations.iter().any(|r| r.belongs_to(container, bundle))
                || ledger.queue.iter().any(|t| t.belongs_to(container, bundle))
        };
        // The stop of a container vramgate never held (every container, under podman's and
        // CRI-O's hooks.d) costs three `stat`s, not a read of the ledger.
        if self.dir.surely_not_held(container) {
            return Ok(Released::default());
        }
        let peek = self.dir.peek()?;
        if !held(peek.ledger()) {
            return Ok(Released::default());
        }
        let (mut tx, mut reclaimed, _) =
            self.dir
                .begin_reclaiming_after(peek, self.liveness, self.clock.stamp(), LOCK_TIMEOUT)?;
        let mut released = Released {
            reservation: tx.ledger.remove_reservation_of(container, bundle),
            cancelled: tx.ledger.remove_tickets_of(container, bundle),
        };
        // At poststop the container's init is already gone, so the routine reclaim that opens
        // the transaction may have taken its reservation first: it is this stop's release, and
        // logged as one (a reclaim means a stop that was never seen).
        if released.reservation.is_none() {
            if let Some(at) = reclaimed
                .reservations
                .iter()
                .position(|r| r.belongs_to(container, bundle))
            {
                released.reservation = Some(reclaimed.reservations.remove(at));
            }
        }
        // A ticket whose waiting hook is already gone (killed at the runtime's hook timeout)
        // stays an abandoned ticket in the log: this stop did not end a live wait.
        tx.ledger
            .counters
            .record_reclaimed(reclaimed.reservations.len(), reclaimed.tickets.len());
        if released.reservation.is_some() {
            tx.ledger.counters.record_release();
        }
        let _committed = tx.commit()?;
        let mut log = Vec::new();
        self.reclaim_events(&reclaimed, &mut log);
        if let Some(r) = &released.reservation {
            log.push(self.event(Kind::Release, &r.container_id, &r.gpus, why).named(&r.name));
        }
        for t in &released.cancelled {
            log.push(
                self.event(
                    Kind::Cancel,
                    &t.container_id,
                    &t.gpus,
                    format!("ticket {} ({why})", t.ticket),
                )
                .named(&t.name),
            );
        }
        events::append(&self.dir, &log);
        Ok(released)
    }

    /// Records what holds a container to its reservation, found after it was admitted (the
    /// hook setting the driver limit), with an `enforce` event whose `detail` says how.
    /// Returns whether the reservation was there.
    pub fn set_enforcement(
        &self,
        container: &str,
        bundle: Option<&Path>,
        tier: crate::enforce::Tier,
        detail: &str,
    ) -> Result<bool> {
        let mut tx = self.dir.begin()?;
        let Some(r) = tx
            .ledger
            .reservations
            .iter_mut()
            .find(|r| r.belongs_to(container, bundle))
        else {
            return Ok(false);
        };
        r.enforcement = Some(tier);
        let event = self
            .event(Kind::Enforce, container, &r.gpus, format!("{tier}: {detail}"))
            .named(&r.name);
        let _committed = tx.commit()?;
        events::append(&self.dir, &[event]);
        Ok(true)
    }

    /// One transaction that only reclaims, checking every entry.
    pub fn gc(&self) -> Result<Reclaimed> {
        self.gc_within(LOCK_TIMEOUT)
    }

    /// [`Service::gc`], waiting at most `lock_timeout` for the ledger's lock: for a caller
    /// inside someone else's deadline (the wrapper's `delete`, inside the engine's).
    pub fn gc_within(&self, lock_timeout: Duration) -> Result<Reclaimed> {
        let mut tx = self.dir.begin_within(lock_timeout)?;
        let reclaimed = tx.ledger.reclaim_all(self.liveness);
        tx.ledger
            .counters
            .record_reclaimed(reclaimed.reservations.len(), reclaimed.tickets.len());
        let _committed = tx.commit()?;
        let mut log = Vec::new();
        self.reclaim_events(&reclaimed, &mut log);
        events::append(&self.dir, &log);
        Ok(reclaimed)
    }
}
