//! Counters of outcomes, kept in the ledger.
//!
//! The hook is a process that lives for one container start, and the exporter may restart at
//! any time, so neither can keep a counter in memory. The ledger is rewritten atomically by
//! every transaction anyway: a counter stored there costs no extra I/O, survives every
//! process, and is incremented in the same write as the outcome it counts, so a count never
//! disagrees with the reservations beside it (a hook killed before its commit counted
//! nothing, and changed nothing).
//!
//! Adds saturate: a counter stuck at `u64::MAX` reads as wrong on a graph, where a wrapped
//! one would read as a reset, and nothing can overflow whatever a damaged ledger holds.
//! A counter added by a later vramgate is kept as it is when this one rewrites the ledger
//! (`extra`, as everywhere in the ledger: see [`crate::ledger::FORMAT`]), so it does not go
//! back to zero across an upgrade or a downgrade.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds, in milliseconds, of the wait-time histogram's buckets. A wait is one
/// transaction's round trip (milliseconds) up to `max_wait_timeout` (an hour by default).
/// Changing them changes what the stored `buckets` mean: a vramgate that does so must convert
/// the ledger's counts or start them afresh.
pub const WAIT_BUCKETS_MS: [u64; 14] = [
    10, 50, 100, 250, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 1_800_000, 3_600_000,
];

#[derive(Serialize, Deserialize, Default, Clone, PartialEq, Eq, Debug)]
#[serde(default)]
pub struct Counters {
    /// Requests admitted at once.
    pub admitted: u64,
    /// Requests admitted after waiting in the queue (policy `wait`).
    pub admitted_after_wait: u64,
    /// Requests the admission rule refused: no room under policy `reject`, or larger than the
    /// GPU can ever hold. Malformed requests are refused before the ledger is read and are
    /// not counted here (the runtime's error and the event log show them).
    pub refused: u64,
    /// Waiters refused when their timeout passed.
    pub timed_out: u64,
    /// Waiters whose hook process died before a decision (killed at the runtime's hook
    /// timeout, an engine cancelling the start); their tickets were reclaimed.
    pub abandoned: u64,
    /// Reservations released at poststop or by `vramgate release`.
    pub released: u64,
    /// Reservations reclaimed because their container's init process was gone.
    pub reclaimed: u64,
    /// How long containers admitted after waiting spent in the queue.
    pub wait: WaitHistogram,
    /// Counters of a newer vramgate, kept on rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A histogram in the shape Prometheus exposes one, in milliseconds.
#[derive(Serialize, Deserialize, Default, Clone, PartialEq, Eq, Debug)]
#[serde(default)]
pub struct WaitHistogram {
    /// `buckets[i]`: waits longer than bound `i - 1` and at most bound `i` of
    /// [`WAIT_BUCKETS_MS`] (not cumulative, so that a short or damaged list can only lose
    /// counts, never make the exposed buckets decrease). Waits above the last bound are in
    /// `count` only.
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_ms: u64,
}

impl WaitHistogram {
    pub fn observe(&mut self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.count = self.count.saturating_add(1);
        self.sum_ms = self.sum_ms.saturating_add(ms);
        if let Some(i) = WAIT_BUCKETS_MS.iter().position(|&bound| ms <= bound) {
            if self.buckets.len() < WAIT_BUCKETS_MS.len() {
                self.buckets.resize(WAIT_BUCKETS_MS.len(), 0);
            }
            self.buckets[i] = self.buckets[i].saturating_add(1);
        }
    }

    /// `(bound in ms, waits at most that long)` for every bound, cumulative as Prometheus
    /// exposes buckets; the `+Inf` bucket is `count`.
    pub fn cumulative(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut sum = 0u64;
        WAIT_BUCKETS_MS.iter().enumerate().map(move |(i, &bound)| {
            sum = sum.saturating_add(self.buckets.get(i).copied().unwrap_or(0));
            // A damaged ledger could hold more in the buckets than in `count`; a bucket above
            // +Inf would be rejected by nothing but would make quantiles meaningless.
            (bound, sum.min(self.count))
        })
    }
}

impl Counters {
    /// A request admitted; `waited` is its time in the queue when it had to wait.
    pub fn record_admit(&mut self, waited: Option<Duration>) {
        match waited {
            None => self.admitted = self.admitted.saturating_add(1),
            Some(wait) => {
                self.admitted_after_wait = self.admitted_after_wait.saturating_add(1);
                self.wait.observe(wait);
            }
        }
    }

    pub fn record_refuse(&mut self) {
        self.refused = self.refused.saturating_add(1);
    }

    pub fn record_timeout(&mut self) {
        self.timed_out = self.timed_out.saturating_add(1);
    }

    /// A wait given up before a decision: its start was cancelled (`vramgate release`) or the
    /// engine gave up on its container.
    pub fn record_abandon(&mut self) {
        self.abandoned = self.abandoned.saturating_add(1);
    }

    pub fn record_release(&mut self) {
        self.released = self.released.saturating_add(1);
    }

    /// What a reclaim pass removed: `reservations` of dead containers and `tickets` of dead
    /// waiters (counts, so that the counters, which the ledger keeps, name nothing of it).
    pub fn record_reclaimed(&mut self, reservations: usize, tickets: usize) {
        self.reclaimed = self.reclaimed.saturating_add(reservations as u64);
        self.abandoned = self.abandoned.saturating_add(tickets as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use std::path::Path;

    #[test]
    fn histogram_buckets_are_cumulative_and_bounded_by_count() {
        let mut h = WaitHistogram::default();
        for ms in [0, 10, 11, 999, 1_000, 4_000_000] {
            h.observe(Duration::from_millis(ms));
        }
        assert_eq!(h.count, 6);
        assert_eq!(h.sum_ms, 10 + 11 + 999 + 1_000 + 4_000_000);
        let cumulative: Vec<(u64, u64)> = h.cumulative().collect();
        assert_eq!(cumulative[0], (10, 2), "0 and 10 ms are at most 10 ms");
        assert_eq!(cumulative[1], (50, 3));
        assert_eq!(cumulative[5], (1_000, 5));
        // The 4,000 s wait is above the last bound: only in +Inf (count).
        assert_eq!(cumulative.last(), Some(&(3_600_000, 5)));

        // A damaged list claims more than count: buckets never exceed +Inf.
        let damaged = WaitHistogram {
            buckets: vec![10],
            count: 3,
            sum_ms: 0,
        };
        assert!(damaged.cumulative().all(|(_, n)| n == 3));
    }

    #[test]
    fn adds_saturate() {
        let mut c = Counters {
            refused: u64::MAX,
            ..Default::default()
        };
        c.record_refuse();
        assert_eq!(c.refused, u64::MAX);
        c.wait.sum_ms = u64::MAX - 1;
        c.wait.count = u64::MAX;
        c.record_admit(Some(Duration::from_secs(5)));
        assert_eq!((c.wait.sum_ms, c.wait.count), (u64::MAX, u64::MAX));
        assert_eq!(c.admitted_after_wait, 1);
    }

    #[test]
    fn outcomes_land_in_their_counters() {
        let mut c = Counters::default();
        c.record_admit(None);
        c.record_admit(Some(Duration::from_millis(40)));
        c.record_refuse();
        c.record_timeout();
        c.record_release();
        c.record_reclaimed(0, 0);
        assert_eq!(
            (c.admitted, c.admitted_after_wait, c.refused, c.timed_out, c.released),
            (1, 1, 1, 1, 1)
        );
        assert_eq!((c.reclaimed, c.abandoned), (0, 0));
        assert_eq!(c.wait.cumulative().nth(1), Some((50, 1)));
    }

    /// Ledgers written before counters existed parse with every counter at zero, and a counter
    /// a later vramgate adds does not make this one refuse the ledger.
    #[test]
    fn old_and_newer_ledgers_parse() {
        let old = br#"{"schema":1,"generation":4,"next_ticket":2,"reservations":[],"queue":[]}"#;
        let ledger = Ledger::parse(old, Path::new("/l")).unwrap();
        assert_eq!(ledger.counters, Counters::default());

        let newer = br#"{"schema":1,"generation":4,"next_ticket":2,"reservations":[],"queue":[],
            "counters":{"admitted":3,"evicted":9,"wait":{"count":1,"sum_ms":20,"buckets":[0,1],"p99":5}}}"#;
        let ledger = Ledger::parse(newer, Path::new("/l")).unwrap();
        assert_eq!(ledger.counters.admitted, 3);
        assert_eq!(ledger.counters.wait.count, 1);

        // And what this vramgate writes, it reads back unchanged.
        let bytes = serde_json::to_vec(&ledger).unwrap();
        assert_eq!(Ledger::parse(&bytes, Path::new("/l")).unwrap(), ledger);
    }
}
