//! Queue order: the one answer to "who is ahead of this request on these GPUs".
//!
//! Waiting containers are served first come, first served per GPU: a ticket is ahead of
//! another when its number is lower (numbers only grow) and it waits for at least one of the
//! same GPUs. A new arrival has no ticket yet and so comes after every waiter. The admission
//! decision, the refusal and queue messages, a waiter deciding whether to try again and
//! `vramgate status` all ask this function, so they cannot disagree.

use crate::ledger::{GpuShare, Ledger, Ticket};

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
    use crate::procfs::ProcessIdentity;

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
            ledger.enqueue(Ticket {
                ticket: 0,
                container_id: id.to_string(),
                gpus: gpus.iter().map(|g| share(g)).collect(),
                waiter: ProcessIdentity { pid: 1, start_time: 1 },
                enqueued_unix_ms: 0,
                enqueued_boot_ms: None,
                deadline_unix_ms: 0,
                bundle: None,
                choose: None,
                extra: Default::default(),
            });
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
