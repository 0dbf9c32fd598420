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
use crate::clock::Stamp;
use crate::procfs::{Life, Liveness, ProcessIdentity};

/// Reservations whose liveness one transaction checks when the ledger holds more: reading
/// `/proc/<pid>/stat` costs about 10 us of system time each, which at 1,000 reservations
/// would be most of a container start's hook time.
pub const RECLAIM_WINDOW: usize = 64;

/// The file in the state directory that holds the DRA driver's last sign of life
/// ([`dra_heartbeat_text`]), written anew every [`DRA_BEAT`].
pub const DRA_HEARTBEAT_FILE: &str = "dra.heartbeat";

/// How often a running DRA driver writes [`DRA_HEARTBEAT_FILE`].
pub const DRA_BEAT: Duration = Duration::from_secs(30);

/// The DRA driver's heartbeat as it writes it: its pid and the instant of the beat on both
/// clocks, `<pid> <unix_ms> <boot_ms>` (`-` for a boot clock it could not read). The instant is
/// in the text, not the file's modification time, so that its age is taken on the boot clock
/// (a wall clock stepped forward must not make a live driver look gone).
pub fn dra_heartbeat_text(pid: u32, at: Stamp) -> String {
    let boot = at.boot_ms.map_or_else(|| "-".to_string(), |b| b.to_string());
    format!("{pid} {} {boot}\n", at.unix_ms)
}

/// The instant a heartbeat's text says it was written; None for a text that is not one.
pub fn dra_heartbeat_stamp(text: &str) -> Option<Stamp> {
    let mut words = text.split_whitespace();
    let _pid: u32 = words.next()?.parse().ok()?;
    let unix_ms = words.next()?.parse().ok()?;
    let boot_ms = match words.next()? {
        "-" => None,
        boot => Some(boot.parse().ok()?),
    };
    words.next().is_none().then_some(Stamp { unix_ms, boot_ms })
}

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
    /// containers, never a container's) once the DRA driver's last sign of life
    /// (`driver_seen`, its heartbeat) is older than [`DRA_ABSENT_LIMIT`]. Without a heartbeat
    /// nothing is dropped: a driver of a vramgate that wrote none may be running. The age is
    /// taken on the boot clock where both instants have it and no reboot came between (the
    /// boot clock then starts below the beat), else on the wall clock; a clock set back keeps
    /// them (the age reads as none). The claims' containers, when they start, are then
    /// admitted as any request is.
    pub fn release_claims_of_absent_driver(&mut self, now: Stamp, driver_seen: Option<Stamp>) -> Vec<Reservation> {
        let Some(seen) = driver_seen else {
            return Vec::new();
        };
        let age = match (now.boot_ms, seen.boot_ms) {
            (Some(now_boot), Some(seen_boot)) if now_boot >= seen_boot => now_boot - seen_boot,
            _ => now.unix_ms.saturating_sub(seen.unix_ms),
        };
        if age <= DRA_ABSENT_LIMIT.as_millis() as u64 {
            return Vec::new();
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reservations)
            .into_iter()
            .partition(|r| r.claim_of.is_some());
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
            // A claim's own reservation has no process to check: the DRA driver releases it, or
            // its absence does (Ledger::release_claims_of_absent_driver).
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
        let at = |unix_ms: u64, boot_ms: u64| Stamp {
            unix_ms,
            boot_ms: Some(boot_ms),
        };
        let day = 86_400_000;
        let now = at(10 * day, day);
        let kept =
            |ledger: &mut Ledger, seen: Option<Stamp>| ledger.release_claims_of_absent_driver(now, seen).is_empty();
        // No heartbeat (a driver that writes none may run): kept.
        assert!(kept(&mut ledger, None));
        // Seen within the limit: kept.
        assert!(kept(&mut ledger, Some(at(10 * day - limit, day - limit))));
        // The wall clock stepped forward past the limit, the boot clock says the driver beat
        // a moment ago: kept.
        assert!(kept(&mut ledger, Some(at(10 * day - 2 * limit, day - 1_000))));
        // A clock set back (the beat reads as in the future): kept.
        assert!(kept(&mut ledger, Some(Stamp::wall(11 * day))));
        assert_eq!(ledger.reservations.len(), 3);
        // Gone past the limit on the boot clock, whatever the wall clock says: the claim's own
        // reservation leaves; the containers' stay, the one holding another claim included (its
        // memory is its container's).
        let released = ledger.release_claims_of_absent_driver(now, Some(at(10 * day, day - limit - 1)));
        let ids = |rs: &[Reservation]| rs.iter().map(|r| r.container_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&released), ["claim-a"]);
        assert_eq!(ids(&ledger.reservations), ["container", "holder-of-b"]);
        // A beat from before a reboot (its boot instant past now's): judged on the wall clock.
        ledger.reservations.push(claims_own("c", 1_000));
        assert!(kept(&mut ledger, Some(at(10 * day - 1_000, 2 * day))));
        let released = ledger.release_claims_of_absent_driver(now, Some(at(10 * day - limit - 1, 2 * day)));
        assert_eq!(ids(&released), ["claim-c"]);
    }

    #[test]
    fn a_heartbeat_reads_back_as_written_and_anything_else_as_none() {
        let at = Stamp {
            unix_ms: 1_764_000_000_000,
            boot_ms: Some(123_456),
        };
        assert_eq!(dra_heartbeat_stamp(&dra_heartbeat_text(42, at)), Some(at));
        let wall = Stamp::wall(5);
        assert_eq!(dra_heartbeat_stamp(&dra_heartbeat_text(42, wall)), Some(wall));
        for text in ["", "42\n", "42 5", "42 5 x", "x 5 6", "42 5 6 7", "42 -5 6", "1234\n"] {
            assert_eq!(dra_heartbeat_stamp(text), None, "{text:?}");
        }
    }
}
