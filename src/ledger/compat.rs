//! Writing the oldest format that describes the ledger while an older reader may still run
//! (the writer's half of the rule in [`FORMAT`](super::FORMAT)).
//!
//! The fields added since the last release whose readers refuse unknown fields (before
//! readers kept them in `extra`) are [`Ticket::enqueued_boot_ms`] and [`Ticket::expected_ms`]
//! (a declared duration, which only orders backfill). Such a reader that can still
//! run after a package upgrade is a hook or wrapper of the old release waiting in the queue: it
//! re-reads the ledger until it is admitted, and would call a ledger with that field corrupt
//! and fail its container. So while one waits, every ticket is written without the field
//! (those tickets' ages fall back to the wall clock, as for any ticket without it), and with
//! it again once none does.
//!
//! How an old waiter is told apart: its ticket lacks the field (every ticket of this release
//! carries it) and its process runs a binary that is no longer the file at the path it was
//! started from (a package upgrade replaced it: `/proc/<pid>/exe` then reads `... (deleted)`).
//! A ticket this release wrote without the field, because an old waiter was there, has a
//! waiter running the installed binary, so it does not count: the mode ends with the last old
//! waiter instead of feeding itself. The exporter, device plugin and DRA driver of an older
//! release are readers too, but they never appear in the ledger: the package restarts them on
//! upgrade (packaging/debian/postinst), and finding them here would take a scan of all of
//! `/proc` on every write.
//!
//! **Limits** ([`GpuShare::limit`](super::GpuShare::limit), format 2) are refused by every
//! release before them: ed7e56d's readers refuse the unknown field, the later ones refuse format
//! 2 as newer. So while any ticket is held by a process running a replaced binary (a hook of
//! such a release waiting out a package upgrade, whether or not its ticket has the boot
//! stamp), a ledger with limits is written with each limit taken as the share's bytes: the
//! limit is reserved whole, as the older release would have, which can over-reserve but never
//! over-commit the GPU, and the file is format 1. The service decides such an admission on the
//! limit from the start ([`limits_must_be_reserved`]), so a GPU that holds the request but not
//! the limit is not filled past its memory by this rewrite. The limit itself is lost from that
//! file: the reservation stays at its limit until it is released (its enforcement, set at
//! start, keeps the limit it was given). The check costs one `/proc` read per ticket, and only
//! on writes of a ledger with limits and on admissions that ask for one.
//!
//! **Kept places** ([`Ledger::kept_places`](super::Ledger::kept_places) and
//! [`Ticket::pod_container`](super::Ticket::pod_container), what a retry of a start the engine
//! gave up on keeps its first attempt's place by) are refused by ed7e56d's readers as unknown
//! fields, and kept (and ignored) by every later one: they are left out of what such a reader
//! may read, and a retry then queues at the back, as before places were kept.
//!
//! **Claim holds** ([`Reservation::claim`](super::Reservation::claim)) are refused by ed7e56d's
//! readers as an unknown field, and kept (and ignored) by every later one. Every holder's entry
//! carries the claim's whole share, so the hold is simply left out of what such a reader may
//! read: each holder is then counted whole, more than the claim holds, never less.
//!
//! The cost: nothing when every ticket carries the field (the common case, and an empty
//! queue); otherwise two `/proc` reads and two `stat`s per ticket without it, on writes only.

use std::os::unix::fs::MetadataExt;

use super::model::{Ledger, Ticket};
use crate::procfs::{Life, ProcessIdentity};

/// How the writer asks whether a waiting process may be a reader of an older release; `/proc`
/// on a host, a table in unit tests.
pub trait Binaries {
    fn runs_replaced_binary(&self, process: &ProcessIdentity) -> bool;
}

/// Answers from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcBinaries;

impl Binaries for ProcBinaries {
    /// True when the process runs and its executable is not the file now at its path (replaced
    /// or removed), or when that cannot be told while it runs: leaving the field out costs a
    /// wall-clock age, writing it for an old reader costs its container.
    fn runs_replaced_binary(&self, process: &ProcessIdentity) -> bool {
        if process.life() == Life::Gone {
            return false;
        }
        let exe = format!("/proc/{}/exe", process.pid);
        let replaced = match std::fs::read_link(&exe) {
            Ok(target) => match target.to_str() {
                // Linux appends this to the path of an executable that was unlinked.
                Some(path) if path.ends_with(" (deleted)") => true,
                _ => {
                    let running = std::fs::metadata(&exe);
                    let installed = std::fs::metadata(&target);
                    match (running, installed) {
                        (Ok(r), Ok(i)) => (r.dev(), r.ino()) != (i.dev(), i.ino()),
                        _ => true,
                    }
                }
            },
            Err(_) => true,
        };
        // The pid may have gone (and been reused) between the reads: only the recorded process
        // counts.
        replaced && process.life() != Life::Gone
    }
}

/// Whether the next write must leave out what an older reader refuses: some ticket without
/// `enqueued_boot_ms` is held by a process running a replaced binary.
pub fn older_reader_waits(ledger: &Ledger, binaries: &dyn Binaries) -> bool {
    ledger
        .queue
        .iter()
        .filter(|t| t.enqueued_boot_ms.is_none())
        .any(|t| binaries.runs_replaced_binary(&t.waiter))
}

/// Whether a reader of a release without limits may read the next write: some ticket is held
/// by a process running a replaced binary. Then a limit is reserved whole (see the module docs).
pub fn limits_must_be_reserved(ledger: &Ledger, binaries: &dyn Binaries) -> bool {
    ledger.queue.iter().any(|t| binaries.runs_replaced_binary(&t.waiter))
}

/// Whether the next write must leave out what an older reader refuses: the boot stamp
/// ([`older_reader_waits`]), or limits ([`limits_must_be_reserved`], asked only of a ledger
/// that has some).
pub fn write_for_older_readers(ledger: &Ledger, binaries: &dyn Binaries) -> bool {
    older_reader_waits(ledger, binaries) || (ledger.has_limits() && limits_must_be_reserved(ledger, binaries))
}

/// The ledger as the older format describes it, when it differs from `ledger`: every ticket
/// without `enqueued_boot_ms` and `expected_ms` (a declared duration only orders backfill:
/// without it a waiter counts as undeclared), and every limit taken as its share's bytes
/// (format 1). `None` when there is nothing to leave out.
pub fn for_older_readers(ledger: &Ledger) -> Option<Ledger> {
    if ledger
        .queue
        .iter()
        .all(|t| t.enqueued_boot_ms.is_none() && t.expected_ms.is_none() && t.pod_container.is_none())
        && ledger.kept_places.is_empty()
        && !ledger.has_limits()
        && ledger.reservations.iter().all(|r| r.claim.is_none())
    {
        return None;
    }
    let mut older = ledger.clone();
    // Each holder of a claim carries its whole share: without the hold, each is counted whole.
    older.reservations.iter_mut().for_each(|r| r.claim = None);
    // Places kept for retries only spare a retry the back of the queue: without them a retry
    // queues as it did before they were kept.
    older.kept_places.clear();
    older.queue.iter_mut().for_each(|t: &mut Ticket| {
        t.enqueued_boot_ms = None;
        t.expected_ms = None;
        t.pod_container = None;
    });
    let shares = older.reservations.iter_mut().flat_map(|r| r.gpus.iter_mut());
    for share in shares.chain(older.queue.iter_mut().flat_map(|t| t.gpus.iter_mut())) {
        share.bytes = share.limit_bytes();
        share.limit = None;
    }
    older.schema = super::model::FORMAT_WITHOUT_LIMITS;
    Some(older)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::path::Path;

    /// Pids in `replaced` run a replaced binary; counts the questions asked.
    struct Table {
        replaced: Vec<u32>,
        asked: Cell<usize>,
    }

    impl Binaries for Table {
        fn runs_replaced_binary(&self, process: &ProcessIdentity) -> bool {
            self.asked.set(self.asked.get() + 1);
            self.replaced.contains(&process.pid)
        }
    }

    fn table(replaced: &[u32]) -> Table {
        Table {
            replaced: replaced.to_vec(),
            asked: Cell::new(0),
        }
    }

    fn ticket(pid: u32, boot_ms: Option<u64>) -> Ticket {
        Ticket {
            ticket: 0,
            container_id: format!("c{pid}"),
            gpus: vec![],
            waiter: ProcessIdentity { pid, start_time: 1 },
            enqueued_unix_ms: 1,
            deadline_unix_ms: 2,
            enqueued_boot_ms: boot_ms,
            bundle: None,
            choose: None,
            expected_ms: None,
            pod_container: None,
            extra: Default::default(),
        }
    }

    fn ledger(tickets: Vec<Ticket>) -> Ledger {
        let mut ledger = Ledger::default();
        for t in tickets {
            ledger.enqueue(t);
        }
        ledger
    }

    #[test]
    fn a_queue_whose_tickets_all_carry_the_field_asks_nothing() {
        let binaries = table(&[1, 2]);
        let all_new = ledger(vec![ticket(1, Some(10)), ticket(2, Some(20))]);
        assert!(!older_reader_waits(&all_new, &binaries));
        assert!(!older_reader_waits(&Ledger::default(), &binaries));
        assert_eq!(
            binaries.asked.get(),
            0,
            "no /proc read without a ticket lacking the field"
        );
    }

    #[test]
    fn an_old_ticket_whose_waiter_runs_a_replaced_binary_is_an_older_reader() {
        let old_waiter = ledger(vec![ticket(7, None), ticket(8, Some(20))]);
        assert!(older_reader_waits(&old_waiter, &table(&[7])));
        let binaries = table(&[8]);
        assert!(
            !older_reader_waits(&old_waiter, &binaries),
            "a replaced binary behind a ticket with the field is this release's"
        );
        assert_eq!(
            binaries.asked.get(),
            1,
            "only the ticket without the field is looked at"
        );
    }

    /// Tickets this release wrote without the field while an old waiter was there are held by
    /// processes of the installed binary: once the old waiter is gone, the mode ends.
    #[test]
    fn tickets_written_for_older_readers_do_not_keep_the_mode() {
        let written_in_mode = ledger(vec![ticket(7, None), ticket(9, None)]);
        assert!(older_reader_waits(&written_in_mode, &table(&[7])));
        let mut after = written_in_mode.clone();
        after.remove_ticket(1);
        assert!(!older_reader_waits(&after, &table(&[7])));
    }

    #[test]
    fn the_older_format_leaves_out_only_the_boot_stamp_and_the_declared_duration() {
        let mut declared = ticket(9, None);
        declared.expected_ms = Some(600_000);
        let mixed = ledger(vec![ticket(7, None), ticket(8, Some(20)), declared]);
        let older = for_older_readers(&mixed).expect("a ticket carries the field");
        let json = serde_json::to_value(&older).unwrap();
        for t in json["queue"].as_array().unwrap() {
            assert!(t.get("enqueued_boot_ms").is_none(), "{t}");
            assert!(t.get("expected_ms").is_none(), "{t}");
        }
        let mut back = Ledger::parse(&serde_json::to_vec(&older).unwrap(), Path::new("/l")).unwrap();
        back.queue[1].enqueued_boot_ms = Some(20);
        back.queue[2].expected_ms = Some(600_000);
        assert_eq!(back, mixed, "nothing else differs");
        assert!(for_older_readers(&ledger(vec![ticket(7, None)])).is_none());
    }

    /// A ticket's pod container and the places kept for retries are unknown fields to ed7e56d's
    /// readers: left out, a retry queues at the back, as before places were kept.
    #[test]
    fn the_older_format_leaves_out_kept_places_and_pod_containers() {
        let mut waiting = ticket(7, None);
        waiting.pod_container = Some(crate::ledger::PodContainer {
            pod: "p".into(),
            name: "app".into(),
        });
        let mut with_place = ledger(vec![waiting.clone()]);
        with_place.keep_place_of(&Ticket { ticket: 9, ..waiting });
        assert_eq!(with_place.kept_places.len(), 1);
        let older = for_older_readers(&with_place).expect("there is something to leave out");
        let json = serde_json::to_value(&older).unwrap();
        assert!(json.get("kept_places").is_none(), "{json}");
        assert!(json["queue"][0].get("pod_container").is_none(), "{json}");
    }

    /// While a waiter of a release without limits may read the ledger, a limit is written as
    /// the share's bytes (reserved whole: never over-committed) in format 1, which such a
    /// release reads; a waiter of this release (the installed binary) changes nothing.
    #[test]
    fn limits_are_reserved_whole_while_a_release_without_them_waits() {
        let mut with_limit = ledger(vec![ticket(7, Some(10))]);
        let mut r = crate::ledger::Reservation::for_test("a", "GPU-a", 2 << 30);
        r.gpus = vec![crate::ledger::GpuShare::new("GPU-a", 2 << 30, 6 << 30)];
        with_limit.reservations.push(r);
        assert!(
            !older_reader_waits(&with_limit, &table(&[7])),
            "its ticket has the boot stamp"
        );
        assert!(
            write_for_older_readers(&with_limit, &table(&[7])),
            "yet it cannot read a limit"
        );
        assert!(!write_for_older_readers(&with_limit, &table(&[])));
        let mut no_limit = with_limit.clone();
        no_limit.reservations.clear();
        let binaries = table(&[7]);
        assert!(!write_for_older_readers(&no_limit, &binaries));
        let older = for_older_readers(&with_limit).expect("a limit to leave out");
        let json = serde_json::to_string(&older).unwrap();
        assert!(
            json.contains(r#""gpus":[{"uuid":"GPU-a","bytes":6442450944}]"#),
            "{json}"
        );
        assert!(json.starts_with(r#"{"schema":1,"#), "{json}");
        assert_eq!(older.reserved_on("GPU-a"), 6 << 30, "the limit is reserved whole");
    }

    /// The `/proc` answer on real processes: this test's own binary is the one at its path; a
    /// copy of `sleep` run and then replaced by another file, or removed, is not.
    #[test]
    fn a_claim_hold_is_left_out_for_a_reader_that_refuses_it_and_each_holder_counts_whole() {
        let hold = crate::ledger::ClaimHold {
            pod: "pod-1".into(),
            devices: vec!["u-gpu-0".into()],
        };
        let mut with_hold = ledger(vec![ticket(1, None)]);
        for id in ["app", "sidecar"] {
            let mut r = crate::ledger::Reservation::for_test(id, "GPU-a", 4 << 30);
            r.claim = Some(hold.clone());
            with_hold.reservations.push(r);
        }
        assert_eq!(with_hold.reserved_on("GPU-a"), 4 << 30);
        assert!(older_reader_waits(&with_hold, &table(&[1])));
        let older = for_older_readers(&with_hold).expect("the hold is left out");
        assert!(older.reservations.iter().all(|r| r.claim.is_none()));
        assert!(!serde_json::to_string(&older).unwrap().contains("\"claim\""));
        assert_eq!(older.reserved_on("GPU-a"), 8 << 30, "more, never less");
    }

    #[test]
    fn proc_tells_a_replaced_or_removed_binary_from_the_installed_one() {
        let me = ProcessIdentity::current().unwrap();
        assert!(!ProcBinaries.runs_replaced_binary(&me));
        let dir = tempfile::tempdir().unwrap();
        let sleep = crate::testbed::which("sleep").expect("sleep on PATH");
        for how in ["replaced", "removed"] {
            let exe = dir.path().join(format!("sleep-{how}"));
            std::fs::copy(&sleep, &exe).unwrap();
            let mut child = std::process::Command::new(&exe).arg("30").spawn().unwrap();
            let waiter = crate::procfs::ProcessIdentity::of(child.id()).unwrap();
            assert!(!ProcBinaries.runs_replaced_binary(&waiter), "{how}: not yet");
            // What dpkg does: a new file renamed over the path (rename keeps the old inode
            // alive for the running process).
            if how == "replaced" {
                let new = dir.path().join("new");
                std::fs::copy(&sleep, &new).unwrap();
                std::fs::rename(&new, &exe).unwrap();
            } else {
                std::fs::remove_file(&exe).unwrap();
            }
            assert!(ProcBinaries.runs_replaced_binary(&waiter), "{how}");
            child.kill().unwrap();
            child.wait().unwrap();
            assert!(
                !ProcBinaries.runs_replaced_binary(&waiter),
                "{how}: a gone process is no reader"
            );
        }
    }
}
