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
//! A writer that may not read that link (one without ptrace access to the waiter: the queue
//! guard, which holds no capability, beside a waiting wrapper that keeps root's permitted set for
//! runc) asks the waiter's start time instead: a process started after the installed binaries
//! last changed (their ctime) cannot run an older release's ([`ProcBinaries`]). An unreadable
//! link is never by itself taken for an old waiter: it once made the guard's commit rewrite a
//! running container's limit into its reservation because of a waiter of this very release.
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
//! **Cgroups** ([`Reservation::cgroup`](super::Reservation::cgroup)) are refused by ed7e56d's
//! readers as an unknown field too, and left out the same way: such a reader finds a
//! container's processes by pid namespace, as it always did.
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
//! **Claims' own reservations** ([`Reservation::claim_of`](super::Reservation::claim_of),
//! format 3) have no older form: they stay, and the file is written as format 3, which every
//! older reader refuses as newer. [`Reservation::took_over_claim`](super::Reservation::took_over_claim)
//! is only a record, left out like a name.
//!
//! **Names** ([`Reservation::name`](super::Reservation::name), [`Ticket::name`](super::Ticket::name))
//! are refused by ed7e56d's readers as unknown fields, and kept (and ignored) by every later
//! one; they are only shown, so they are left out the same way and such a reader shows the id.
//!
//! The cost: nothing when every ticket carries the field (the common case, and an empty
//! queue); otherwise two `/proc` reads and two `stat`s per ticket without it, on writes only
//! (where the link cannot be read: one read of the waiter's command line and up to eight
//! `stat`s of the installed binaries instead).

use std::os::unix::fs::MetadataExt;

use nix::libc::{EACCES, EPERM};

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
    ///
    /// A writer without ptrace access to the process cannot read its `/proc/<pid>/exe`
    /// (EACCES): the queue guard holds no capability, while a waiting wrapper keeps root's
    /// permitted set for runc. Such a process is told by its start time instead
    /// ([`may_predate_install`]): one that started after the installed binaries last changed
    /// cannot run an older release's. Unreadable is never taken for replaced by itself.
    fn runs_replaced_binary(&self, process: &ProcessIdentity) -> bool {
        if process.life() == Life::Gone {
            return false;
        }
        let replaced = match exe_replaced(process.pid) {
            Ok(replaced) => replaced,
            Err(e) if matches!(e.raw_os_error(), Some(code) if code == EACCES || code == EPERM) => {
                may_predate_install(started_unix_ns(process), installed_ctime_ns(process.pid))
            }
            Err(_) => true,
        };
        // The pid may have gone (and been reused) between the reads: only the recorded process
        // counts.
        replaced && process.life() != Life::Gone
    }
}

/// Whether `pid` runs an executable that is no longer the file at its path; `Err` when its
/// `/proc/<pid>/exe` cannot be read (or the process went).
fn exe_replaced(pid: u32) -> std::io::Result<bool> {
    let exe = format!("/proc/{pid}/exe");
    let target = std::fs::read_link(&exe)?;
    // Linux appends this to the path of an executable that was unlinked.
    if target.to_str().is_some_and(|path| path.ends_with(" (deleted)")) {
        return Ok(true);
    }
    let running = std::fs::metadata(&exe)?;
    Ok(match std::fs::metadata(&target) {
        Ok(installed) => (running.dev(), running.ino()) != (installed.dev(), installed.ino()),
        Err(_) => true,
    })
}

/// Whether a process that started at `started` (ns since the epoch) may run an older release
/// than the binaries installed at `installed` (their latest ctime, ns since the epoch).
///
/// A binary of an older release runs only in a process started before the package replaced
/// it: replacing it (dpkg renames the new file over the old; a copy, `install` or a rebuild
/// writes it) sets the installed file's ctime, which nobody can set back (only the wall clock
/// could, stepped back by root). So a process started after that ctime runs the installed
/// file or one at another path, and neither is a replaced binary. Whatever cannot be read
/// counts as "may": leaving the limits out costs a reservation at its limit, writing them for
/// an old reader costs its container. What anyone else can do to the answer: change the
/// binaries' metadata (root; or a hard link to them where `fs.protected_hardlinks` is 0),
/// which only moves the ctime later, towards "may".
///
/// A process counts as started after only past [`INSTALL_MARGIN_NS`]: a ctime is taken from
/// the kernel's coarse clock, up to a tick behind, and the boot and wall clocks are read one
/// after the other. The wall clock stepped forward by NTP between the replacement and this
/// question, by more than the waiter had waited then, would make an old waiter look new: its
/// container is then refused by its own release (a newer ledger format), never over-committed.
fn may_predate_install(started: Option<i128>, installed: Option<i128>) -> bool {
    match (started, installed) {
        (Some(started), Some(installed)) => started <= installed.saturating_add(INSTALL_MARGIN_NS),
        _ => true,
    }
}

/// How long after the installed binaries' ctime a process must have started to count as
/// started after it (see [`may_predate_install`]).
const INSTALL_MARGIN_NS: i128 = 1_000_000_000;

/// When the process started, in ns since the epoch: its start time (clock ticks since boot,
/// as recorded in its identity) moved onto the wall clock by how long ago it was on the boot
/// clock. The wall clock is read first and the tick count truncates, so any error puts the
/// start earlier, towards "may predate".
fn started_unix_ns(process: &ProcessIdentity) -> Option<i128> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let ticks = i128::from(ticks).max(1);
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as i128;
    let boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let boot = i128::from(boot.tv_sec()) * 1_000_000_000 + i128::from(boot.tv_nsec());
    let started_boot = i128::from(process.start_time) * 1_000_000_000 / ticks;
    Some(unix - (boot - started_boot))
}

/// The latest ctime (ns since the epoch) of the binaries a waiter may have been started from:
/// the hook and the wrapper beside this process's own executable (the package installs them
/// together, and the wrapper looks for the hook there by default), this executable, and the
/// waiter's `argv[0]` when it is an absolute path (`/proc/<pid>/cmdline` is world-readable: a
/// hook installed elsewhere is named there by its engine). Each is taken through a symlink and
/// as the symlink itself; `None` when none can be read.
fn installed_ctime_ns(pid: u32) -> Option<i128> {
    let mut paths: Vec<std::path::PathBuf> = Vec::with_capacity(4);
    if let Ok(own) = std::fs::read_link("/proc/self/exe") {
        // A writer whose own binary was replaced reads the path with this appended: the
        // file now at the path is the one to ask.
        let own = match own.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
            Some(path) => std::path::PathBuf::from(path),
            None => own,
        };
        if let Some(dir) = own.parent() {
            paths.push(dir.join("vramgate-hook"));
            paths.push(dir.join("vramgate-runtime"));
        }
        paths.push(own);
    }
    if let Some(argv0) = argv0(pid) {
        paths.push(argv0);
    }
    let ctime = |m: std::fs::Metadata| i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
    paths
        .iter()
        .flat_map(|p| [std::fs::metadata(p), std::fs::symlink_metadata(p)])
        .filter_map(Result::ok)
        .map(ctime)
        .max()
}

/// The first argument of `pid`'s command line, when it is an absolute path.
fn argv0(pid: u32) -> Option<std::path::PathBuf> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let mut cmdline = Vec::new();
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    file.take(4096).read_to_end(&mut cmdline).ok()?;
    let first = cmdline.split(|&b| b == 0).next()?;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(first));
    path.is_absolute().then(|| path.to_path_buf())
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
    if ledger.queue.iter().all(|t| {
        t.enqueued_boot_ms.is_none() && t.expected_ms.is_none() && t.pod_container.is_none() && t.name.is_none()
    }) && ledger.kept_places.is_empty()
        && !ledger.has_limits()
        && ledger
            .reservations
            .iter()
            .all(|r| r.claim.is_none() && r.cgroup.is_none() && r.name.is_none() && r.took_over_claim.is_none())
    {
        return None;
    }
    let mut older = ledger.clone();
    // Each holder of a claim carries its whole share: without the hold, each is counted whole.
    // Without its cgroup, a container's processes are found by pid namespace, as such a
    // reader always did.
    older.reservations.iter_mut().for_each(|r| {
        r.claim = None;
        r.cgroup = None;
        // Only shown: such a reader shows the id.
        r.name = None;
        r.took_over_claim = None;
    });
    // Places kept for retries only spare a retry the back of the queue: without them a retry
    // queues as it did before they were kept.
    older.kept_places.clear();
    older.queue.iter_mut().for_each(|t: &mut Ticket| {
        t.enqueued_boot_ms = None;
        t.expected_ms = None;
        t.pod_container = None;
        t.name = None;
    });
    let shares = older.reservations.iter_mut().flat_map(|r| r.gpus.iter_mut());
    for share in shares.chain(older.queue.iter_mut().flat_map(|t| t.gpus.iter_mut())) {
        share.bytes = share.limit_bytes();
        share.limit = None;
    }
    // A claim's own reservation has no older form (such a reader would reclaim it, its process
    // being none): it stays, and the file says format 3, which such a reader refuses as newer
    // rather than count less.
    older.schema = if older.reservations.iter().any(|r| r.claim_of.is_some()) {
        super::model::FORMAT
    } else {
        super::model::FORMAT_WITHOUT_LIMITS
    };
    Some(older)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::path::Path;

    /// `sleep` as PATH finds it: a binary to copy and run as a waiter.
    fn sleep_on_path() -> std::path::PathBuf {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .map(|dir| dir.join("sleep"))
            .find(|p| p.is_file())
            .expect("sleep on PATH")
    }

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
            waiter: ProcessIdentity { pid, start_time: 1 },
            enqueued_unix_ms: 1,
            deadline_unix_ms: 2,
            enqueued_boot_ms: boot_ms,
            ..Ticket::for_test(&format!("c{pid}"), vec![])
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

    /// A recorded cgroup is an unknown field to ed7e56d's readers: left out for them.
    #[test]
    fn a_cgroup_is_left_out_for_a_reader_that_refuses_it() {
        let mut with_cgroup = ledger(vec![ticket(1, None)]);
        let mut r = crate::ledger::Reservation::for_test("app", "GPU-a", 4 << 30);
        r.cgroup = Some("0::/pod/app".into());
        with_cgroup.reservations.push(r);
        let older = for_older_readers(&with_cgroup).expect("the cgroup is left out");
        assert!(!serde_json::to_string(&older).unwrap().contains("\"cgroup\""));
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

    /// The start time against the installed binaries' ctime, with its margin; what cannot be
    /// read counts as "may be old".
    #[test]
    fn a_start_time_after_the_install_is_no_older_release() {
        let s = 1_000_000_000;
        assert!(!may_predate_install(Some(10 * s), Some(8 * s)));
        assert!(may_predate_install(Some(9 * s), Some(8 * s)), "within the margin");
        assert!(may_predate_install(Some(7 * s), Some(8 * s)));
        assert!(may_predate_install(None, Some(8 * s)));
        assert!(may_predate_install(Some(10 * s), None));
    }

    /// Issue 43 item 6: a writer without ptrace access to a waiter (the queue guard, with no
    /// capability, beside a waiter that keeps root's permitted set) cannot read its
    /// `/proc/<pid>/exe`, and took every such waiter for an old release's, rewriting every
    /// limit into its reservation. Now it asks the start time: a waiter started after the
    /// binary at its path was installed runs that binary; once the file is replaced under it,
    /// it may be an old one again.
    #[test]
    fn a_waiter_whose_exe_cannot_be_read_is_told_by_its_start_time() {
        let dir = tempfile::tempdir().unwrap();
        let sleep = sleep_on_path();
        let exe = dir.path().join("vramgate-waiter");
        std::fs::copy(&sleep, &exe).unwrap();
        // Past the margin after the copy's ctime (the process must start after it by that
        // much to count as started after it).
        std::thread::sleep(std::time::Duration::from_nanos(INSTALL_MARGIN_NS as u64 + 200_000_000));
        let mut child = std::process::Command::new(&exe).arg("30").spawn().unwrap();
        let waiter = ProcessIdentity::of(child.id()).unwrap();
        // As the guard asks: from a thread that holds no capability (capabilities are per
        // thread); `sleep` holds root's full permitted set.
        let ask_without_capabilities = move || {
            std::thread::spawn(move || {
                caps::clear(None, caps::CapSet::Effective).unwrap();
                caps::clear(None, caps::CapSet::Permitted).unwrap();
                let read = std::fs::read_link(format!("/proc/{}/exe", waiter.pid));
                let denied = read.err().and_then(|e| e.raw_os_error());
                (denied, ProcBinaries.runs_replaced_binary(&waiter))
            })
            .join()
            .unwrap()
        };
        assert_eq!(
            ask_without_capabilities(),
            (Some(EACCES), false),
            "unreadable, and started after its binary was installed: this release's"
        );
        assert!(!ProcBinaries.runs_replaced_binary(&waiter), "as the readable link says");
        // An upgrade renames a new file over the path: the waiter started before it.
        let new = dir.path().join("new");
        std::fs::copy(&sleep, &new).unwrap();
        std::fs::rename(&new, &exe).unwrap();
        assert_eq!(
            ask_without_capabilities(),
            (Some(EACCES), true),
            "may be an old release's"
        );
        assert!(ProcBinaries.runs_replaced_binary(&waiter), "as the readable link says");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn proc_tells_a_replaced_or_removed_binary_from_the_installed_one() {
        let me = ProcessIdentity::current().unwrap();
        assert!(!ProcBinaries.runs_replaced_binary(&me));
        let dir = tempfile::tempdir().unwrap();
        let sleep = sleep_on_path();
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

    /// A name is an unknown field to ed7e56d's readers: left out for them (they show the id).
    #[test]
    fn names_are_left_out_for_a_reader_that_refuses_them() {
        let mut named = ledger(vec![ticket(1, None)]);
        named.queue[0].name = Some("ns/pod/waiting".into());
        let mut r = crate::ledger::Reservation::for_test("c", "GPU-a", 1);
        r.name = Some("ns/pod/c".into());
        named.reservations.push(r);
        let older = for_older_readers(&named).expect("the names are left out");
        assert!(!serde_json::to_string(&older).unwrap().contains("\"name\""));
    }
}
