//! Queue order: the one answer to "who is ahead of this request on these GPUs".
//!
//! Waiting containers are served first come, first served per GPU: a ticket is ahead of
//! another when its number is lower (numbers only grow) and it waits for at least one of the
//! same GPUs. A new arrival has no ticket yet and so comes after every waiter; one that
//! queues takes the next number, except kubelet's retry of a start it gave up on while it
//! waited, which takes back its first attempt's number and age ([`crate::ledger::KeptPlace`]),
//! so that `backfill_bound` counts from that attempt. The admission
//! decision, the refusal and queue messages, a waiter deciding whether to try again and
//! `vramgate status` all ask this function, so they cannot disagree.
//!
//! Backfill (`[queue] backfill`) lets a request that fits pass older waiters that do not, for
//! at most `backfill_bound`. Which of the waiters that fit goes first when memory frees is
//! [`BackfillOrder`]: by arrival (the first that tries), or by the one that fills the freed
//! memory best ([`claim`]). The order of the queue itself, its numbers and positions, stays
//! arrival: a strategy only chooses among those that fit, never past the bound.

use crate::ledger::{GpuShare, Ledger, Ticket};

/// `[queue] backfill_order`: which waiter that fits is served first when the head of its
/// GPUs' queue does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackfillOrder {
    /// The first that tries: waiters wake together and race for the ledger's lock.
    #[default]
    Arrival,
    /// The largest request that fits: big requests, which fit least often, take the memory
    /// when it is there, and small ones fill what is left.
    Largest,
    /// The longest declared duration (`vramgate.dev/expected-duration`) that fits, the largest
    /// request among equals: long jobs start first, so none is left running alone at the end
    /// (longest processing time first, the classic rule against a long makespan). A waiter
    /// without a declared duration counts as [`UNDECLARED_DURATION_MS`].
    Longest,
}

/// What a waiter without a declared duration counts as under [`BackfillOrder::Longest`]:
/// a minute, the scale of the jobs the queue is for. The declaration is only ever used to
/// order waiters that all fit; a wrong one costs packing, never a reservation.
pub const UNDECLARED_DURATION_MS: u64 = 60_000;

impl BackfillOrder {
    pub const VALUES: &'static str = "\"arrival\", \"largest\" or \"longest\"";

    pub fn parse(value: &str) -> Option<BackfillOrder> {
        match value {
            "arrival" => Some(BackfillOrder::Arrival),
            "largest" => Some(BackfillOrder::Largest),
            "longest" => Some(BackfillOrder::Longest),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackfillOrder::Arrival => "arrival",
            BackfillOrder::Largest => "largest",
            BackfillOrder::Longest => "longest",
        }
    }
}

impl std::fmt::Display for BackfillOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How strongly a request that fits claims freed memory under `order`: of two that fit, the
/// higher claim goes first and the older breaks a tie. `bytes` is the whole request (every
/// GPU's share); `expected_ms` its declared duration. `None` under [`BackfillOrder::Arrival`],
/// where only age counts.
pub fn claim(order: BackfillOrder, bytes: u64, expected_ms: Option<u64>) -> Option<u128> {
    match order {
        BackfillOrder::Arrival => None,
        BackfillOrder::Largest => Some(u128::from(bytes)),
        BackfillOrder::Longest => {
            Some(u128::from(expected_ms.unwrap_or(UNDECLARED_DURATION_MS)) << 64 | u128::from(bytes))
        }
    }
}

/// The whole of a request's bytes: every share, or `choose` of its candidates for a placement
/// (whose candidates all carry the same amount).
pub fn request_bytes(gpus: &[GpuShare], choose: Option<u32>) -> u64 {
    match choose {
        Some(n) => gpus.first().map_or(0, |s| s.bytes).saturating_mul(u64::from(n)),
        None => gpus.iter().fold(0u64, |sum, s| sum.saturating_add(s.bytes)),
    }
}

/// The tickets ahead of `ticket` (`None`: a new arrival) that share a GPU with `gpus`, oldest
/// first.
pub fn ahead_of<'a>(
    ledger: &'a Ledger,
    ticket: Option<u64>,
    gpus: &'a [GpuShare],
) -> impl Iterator<Item = &'a Ticket> + 'a {
    ledger
        .queue
        .iter()
        .filter(move |t| ticket.is_none_or(|mine| t.ticket < mine))
        .filter(move |t| t.shares_gpu_with(gpus))
}

/// The 1-based place in the queue that `ticket` has (or a new arrival would have) on `gpus`.
pub fn position(ledger: &Ledger, ticket: Option<u64>, gpus: &[GpuShare]) -> usize {
    1 + ahead_of(ledger, ticket, gpus).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(uuid: &str) -> GpuShare {
        GpuShare {
            uuid: uuid.into(),
            bytes: 1,
            limit: None,
        }
    }

    fn ledger_with(tickets: &[(&str, &[&str])]) -> Ledger {
        let mut ledger = Ledger::default();
        for (id, gpus) in tickets {
            ledger.enqueue(Ticket::for_test(id, gpus.iter().map(|g| share(g)).collect()));
        }
        ledger
    }

    #[test]
    fn only_older_tickets_on_a_shared_gpu_are_ahead() {
        // Tickets 1..=4: a on G0, b on G1, c on G0+G1, d on G0.
        let ledger = ledger_with(&[("a", &["G0"]), ("b", &["G1"]), ("c", &["G0", "G1"]), ("d", &["G0"])]);
        let ids = |t: Option<u64>, g: &[GpuShare]| {
            ahead_of(&ledger, t, g)
                .map(|t| t.container_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(Some(4), &[share("G0")]), ["a", "c"]);
        assert_eq!(ids(Some(3), &[share("G1")]), ["b"]);
        assert_eq!(ids(Some(1), &[share("G0")]), Vec::<String>::new());
        // A new arrival is behind everyone on its GPUs.
        assert_eq!(ids(None, &[share("G1")]), ["b", "c"]);
        assert_eq!(position(&ledger, None, &[share("G0"), share("G1")]), 5);
        assert_eq!(position(&ledger, Some(2), &[share("G1")]), 1);
        assert_eq!(position(&ledger, None, &[share("G9")]), 1);
    }
}
