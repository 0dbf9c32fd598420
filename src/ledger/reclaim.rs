//! Reclaim: entries whose process is gone leave the ledger.
//!
//! A reservation is held by its container's init process and a ticket by its waiting hook;
//! when that process is gone (its pid gone, or reused by a process with another start time),
//! the entry is removed by the next transaction. A process whose liveness cannot be read
//! (`/proc` unreadable for lack of file descriptors, say) keeps its entry: handing a live
//! container's memory to someone else is the one mistake reclaim must never make.

use std::collections::HashSet;
use std::time::Duration;

use super::model::{Ledger, Reservation, Ticket};
use crate::procfs::{Life, Liveness, ProcessIdentity};

/// Reservations whose liveness one transaction checks when the ledger holds more: reading
/// `/proc/<pid>/stat` costs about 10 us of system time each, which at 1,000 reservations
/// would be most of a container start's hook time.
pub const RECLAIM_WINDOW: usize = 64;

/// The file in the state directory whose modification time is the DRA driver's last sign of
/// life (`vramgate-dra` touches it every [`DRA_BEAT`]).
pub const DRA_HEARTBEAT_FILE: &str = "dra.heartbeat";

/// How often a running DRA driver touches [`DRA_HEARTBEAT_FILE`].
pub const DRA_BEAT: Duration = Duration::from_secs(30);

/// How long the DRA driver may be gone before the claims' own reservations it kept leave the
/// ledger ([`Ledger::release_claims_of_absent_driver`]). Only the driver sees a claim
/// deallocated; one removed for good (the chart uninstalled, the node taken out of its
/// DaemonSet) would leave them held forever. Longer than a driver's restart, an upgrade's
/// image pull and kubelet's longest crash-loop back-off (5 minutes), and as long as
/// kube-scheduler's default wait for binding conditions: a pod whose driver is gone that long
/// cannot have its claim prepared on this node anyway.
pub const DRA_ABSENT_LIMIT: Duration = Duration::from_secs(600);

/// Which recorded processes a look at `/proc` found alive, gone, or could not tell. A process
/// found gone stays gone (its identity includes its start time), so verdicts taken outside the
/// lock may be applied inside it.
#[derive(Debug, Default)]
pub struct Verdicts {
    dead: HashSet<ProcessIdentity>,
    live: HashSet<ProcessIdentity>,
    unknown: HashSet<ProcessIdentity>,
}

impl Verdicts {
    fn record(&mut self, process: ProcessIdentity, life: Life) {
        match life {
            Life::Alive => self.live.insert(process),
            Life::Gone => self.dead.insert(process),
            Life::Unknown => self.unknown.insert(process),
        };
    }
}

/// What a reclaim pass removed, and what it kept because it could not tell.
#[derive(Debug, Default)]
pub struct Reclaimed {
    pub reservations: Vec<Reservation>,
    pub tickets: Vec<Ticket>,
    /// Reservations kept although their process could not be checked.
    pub undecided: Vec<Reservation>,
}

impl Reclaimed {
    pub fn extend(&mut self, more: Reclaimed) {
        self.reservations.extend(more.reservations);
        self.tickets.extend(more.tickets);
        for r in more.undecided {
            if !self.undecided.contains(&r) {
                self.undecided.push(r);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.tickets.is_empty()
    }
}

impl Ledger {
    /// Drops the claims' own reservations (a claim's memory held before or between its
    /// containers, never a container's) once the DRA driver has given no sign of life
    /// (`driver_seen_unix_ms`, its heartbeat; None when it never beat here) for longer than
    /// [`DRA_ABSENT_LIMIT`], counted from the later of that sign and the reservation's own
    /// making. A clock set back keeps them (the age reads as none). The claims' containers,
    /// when they start, are then admitted as any request is.
    pub fn release_claims_of_absent_driver(
        &mut self,
        now_unix_ms: u64,
        driver_seen_unix_ms: Option<u64>,
    ) -> Vec<Reservation> {
        let limit = DRA_ABSENT_LIMIT.as_millis() as u64;
        let seen = driver_seen_unix_ms.unwrap_or(0);
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| r.claim_of.is_some() && now_unix_ms.saturating_sub(seen.max(r.created_unix_ms)) > limit);
        self.reservations = kept;
        gone
    }

    /// Checks every reservation and ticket and drops those whose process is gone.
    pub fn reclaim_all(&mut self, liveness: &dyn Liveness) -> Reclaimed {
        let mut verdicts = Verdicts::default();
        for r in self.reservations.iter().filter(|r| r.claim_of.is_none()) {
            verdicts.record(r.init, liveness.life(&r.init));
        }
        self.reclaim_known(&verdicts, liveness).0
    }

    /// [`Ledger::reclaim_all`] with a plain predicate (tests and the fuzzer).
    pub fn reclaim_with(&mut self, is_alive: impl Fn(&ProcessIdentity) -> bool) -> Reclaimed {
        struct Predicate<F>(F);
        impl<F: Fn(&ProcessIdentity) -> bool> Liveness for Predicate<F> {
            fn life(&self, process: &ProcessIdentity) -> Life {
                if (self.0)(process) {
                    Life::Alive
                } else {
                    Life::Gone
                }
            }
        }
        self.reclaim_all(&Predicate(is_alive))
    }

    /// The `/proc` half of the reclaim every transaction starts with: the liveness of a window
    /// of at most [`RECLAIM_WINDOW`] reservations that moves on with each write (all of them
    /// in a ledger no larger than that). A transaction whose request does not fit checks the
    /// rest before it refuses or queues anyone, so the window changes only how soon a dead
    /// entry leaves the file, never a decision.
    pub fn check_window(&self, liveness: &dyn Liveness) -> Verdicts {
        let mut verdicts = Verdicts::default();
        let n = self.reservations.len();
        let start = if n <= RECLAIM_WINDOW {
            0
        } else {
            (self.generation as usize).wrapping_mul(RECLAIM_WINDOW) % n
        };
        for r in self.reservations.iter().cycle().skip(start).take(n.min(RECLAIM_WINDOW)) {
            // A claim's own reservation has no process: only the DRA driver releases it.
            if r.claim_of.is_none() {
                verdicts.record(r.init, liveness.life(&r.init));
            }
        }
        verdicts
    }

    /// The ledger half, under the lock: drops the reservations `verdicts` found gone, checks
    /// every ticket (the queue is short), and returns whether every remaining reservation is
    /// known to be alive.
    pub fn reclaim_known(&mut self, verdicts: &Verdicts, liveness: &dyn Liveness) -> (Reclaimed, bool) {
        let mut reclaimed = Reclaimed::default();
        let (dead, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| r.claim_of.is_none() && verdicts.dead.contains(&r.init));
        self.reservations = live;
        // A gone container's resource claim, still allocated here, keeps its memory.
        self.hand_back_claims(&dead);
        reclaimed.reservations = dead;
        reclaimed.undecided = self
            .reservations
            .iter()
            .filter(|r| r.claim_of.is_none() && verdicts.unknown.contains(&r.init))
            .cloned()
            .collect();
        let (dead, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|t| liveness.life(&t.waiter) == Life::Gone);
        self.queue = live;
        // A waiter gone is, most often, a start the engine gave up on (kubelet's deadline: the
        // shim killed the waiting create): its place is kept for the retry. This is the one
        // place a dead waiter's ticket leaves the ledger, whoever runs the transaction (the
        // queue guard, the wrapper's `delete`, any other start).
        for t in &dead {
            self.keep_place_of(t);
        }
        reclaimed.tickets = dead;
        let complete = self
            .reservations
            .iter()
            .all(|r| r.claim_of.is_some() || verdicts.live.contains(&r.init));
        (reclaimed, complete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::GpuShare;
    use std::cell::Cell;

    fn id(pid: u32) -> ProcessIdentity {
        ProcessIdentity { pid, start_time: 7 }
    }

    fn reservation(container: &str, pid: u32) -> Reservation {
        Reservation::new(container, vec![GpuShare::new("GPU-a", 1, 0)], id(pid), 1)
    }

    /// Liveness by pid: `dead` are gone, `unknown` unreadable, the rest alive; counts checks.
    struct Table {
        dead: Vec<u32>,
        unknown: Vec<u32>,
        checked: Cell<usize>,
    }

    impl Liveness for Table {
        fn life(&self, p: &ProcessIdentity) -> Life {
            self.checked.set(self.checked.get() + 1);
            if self.dead.contains(&p.pid) {
                Life::Gone
            } else if self.unknown.contains(&p.pid) {
                Life::Unknown
            } else {
                Life::Alive
            }
        }
    }

    fn table(dead: &[u32], unknown: &[u32]) -> Table {
        Table {
            dead: dead.to_vec(),
            unknown: unknown.to_vec(),
            checked: Cell::new(0),
        }
    }

    #[test]
    fn routine_reclaim_covers_a_large_ledger_in_windows() {
        let mut ledger = Ledger {
            reservations: (0..200).map(|n| reservation(&format!("c{n}"), n + 1)).collect(),
            ..Ledger::default()
        };
        let probe = table(&[150], &[]);
        let mut found_after = None;
        for write in 0..4 {
            let verdicts = ledger.check_window(&probe);
            let (reclaimed, complete) = ledger.reclaim_known(&verdicts, &probe);
            assert!(!complete);
            assert!(
                probe.checked.get() <= RECLAIM_WINDOW * (write + 1),
                "bounded work per transaction"
            );
            if !reclaimed.reservations.is_empty() {
                found_after = Some(write);
                break;
            }
            ledger.generation += 1;
        }
        assert!(found_after.is_some(), "found within ceil(200 / 64) = 4 writes");
        assert_eq!(ledger.reservations.len(), 199);
        // A small ledger is checked whole, every time.
        let mut small = Ledger {
            reservations: (0..10).map(|n| reservation(&format!("c{n}"), n + 1)).collect(),
            ..Ledger::default()
        };
        let probe = table(&[3], &[]);
        let (reclaimed, complete) = small.reclaim_known(&small.check_window(&probe), &probe);
        assert!(complete && reclaimed.reservations.len() == 1);
    }

    #[test]
    fn reclaims_dead_and_keeps_live() {
        let mut ledger = Ledger {
            reservations: vec![reservation("live", 1), reservation("dead", 2)],
            ..Ledger::default()
        };
        let reclaimed = ledger.reclaim_with(|p| p.pid == 1);
        assert_eq!(ledger.reservations.len(), 1);
        assert_eq!(reclaimed.reservations[0].container_id, "dead");
    }

    #[test]
    fn a_process_that_cannot_be_checked_keeps_its_reservation() {
        let mut ledger = Ledger {
            reservations: vec![reservation("unreadable", 1), reservation("dead", 2)],
            ..Ledger::default()
        };
        let probe = table(&[2], &[1]);
        let (reclaimed, complete) = ledger.reclaim_known(&ledger.check_window(&probe), &probe);
        assert_eq!(ledger.reservations.len(), 1, "kept");
        assert_eq!(reclaimed.undecided[0].container_id, "unreadable");
        assert!(!complete, "not known to be alive either");
        let reclaimed = ledger.reclaim_all(&probe);
        assert!(reclaimed.reservations.is_empty() && reclaimed.undecided.len() == 1);
    }

    fn claims_own(uid: &str, created_unix_ms: u64) -> Reservation {
        use crate::ledger::ClaimOf;
        let claim = ClaimOf {
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
        };
        Reservation {
            claim_of: Some(claim.clone()),
            ..Reservation::new(
                claim.container_id(),
                vec![GpuShare::new("GPU-a", 1, 0)],
                ClaimOf::NO_PROCESS,
                created_unix_ms,
            )
        }
    }

    #[test]
    fn a_claims_own_reservation_outlives_an_absent_driver_by_the_limit_only() {
        use crate::ledger::ClaimOf;
        let limit = DRA_ABSENT_LIMIT.as_millis() as u64;
        let taken_over = Reservation {
            took_over_claim: Some(ClaimOf {
                namespace: "default".into(),
                name: "pod-b".into(),
                uid: "b".into(),
            }),
            ..reservation("holder-of-b", 8)
        };
        let mut ledger = Ledger {
            reservations: vec![claims_own("a", 1_000), reservation("container", 7), taken_over],
            ..Ledger::default()
        };
        let now = 1_000 + 2 * limit;
        // Seen within the limit: kept.
        assert!(ledger
            .release_claims_of_absent_driver(now, Some(now - limit))
            .is_empty());
        // Never seen here, but made within the limit: kept.
        assert!(ledger.release_claims_of_absent_driver(1_000 + limit, None).is_empty());
        // A clock set back (the sign of life reads as in the future): kept.
        assert!(ledger.release_claims_of_absent_driver(5_000, Some(now)).is_empty());
        assert_eq!(ledger.reservations.len(), 3);
        // Gone past the limit: the claim's own reservation leaves; the containers' stay, the
        // one holding another claim included (its memory is its container's).
        let released = ledger.release_claims_of_absent_driver(now, Some(now - limit - 1));
        let ids = |rs: &[Reservation]| rs.iter().map(|r| r.container_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&released), ["claim-a"]);
        assert_eq!(ids(&ledger.reservations), ["container", "holder-of-b"]);
        // Never seen and made past the limit: leaves too.
        ledger.reservations.push(claims_own("c", 1_000));
        assert_eq!(ids(&ledger.release_claims_of_absent_driver(now, None)), ["claim-c"]);
    }
}
