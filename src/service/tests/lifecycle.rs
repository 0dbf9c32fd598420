//! Through the ledger file: release, stop and gc, what ends a wait after queueing, when the
//! inventory opens, and what a confirmation records.

use super::*;

#[test]
fn admit_release_and_gc_through_the_ledger_file() {
    let w = World::new(1, CARD);
    let service = w.service();
    let r = request(1205 * MI, "0");
    let outcome = service.admit(&admit_req("a", 1, &r, Policy::Reject)).unwrap();
    assert!(
        matches!(
            &outcome,
            Admission::Admitted { waited: Duration::ZERO, queued: false, shares, gpus, placement: None }
                if shares.len() == 1 && shares[0].bytes == 1205 * MI && gpus.len() == 1 && gpus[0].uuid == shares[0].uuid
        ),
        "{outcome:?}"
    );
    service.admit(&admit_req("b", 2, &r, Policy::Reject)).unwrap();
    assert_eq!(w.state.read().unwrap().reservations.len(), 2);
    let released = service.release("a", None, "test").unwrap();
    assert_eq!(released.reservation.unwrap().container_id, "a");
    assert!(
        service.release("a", None, "test").unwrap().reservation.is_none(),
        "idempotent"
    );
    w.liveness.unknown.borrow_mut().insert(3);
    service.admit(&admit_req("c", 3, &r, Policy::Reject)).unwrap();
    w.liveness.gone.borrow_mut().insert(2);
    let reclaimed = service.gc().unwrap();
    assert_eq!(reclaimed.reservations[0].container_id, "b");
    assert_eq!(
        reclaimed.undecided[0].container_id, "c",
        "kept: its liveness is unknown"
    );
    let report = service.snapshot().unwrap();
    assert_eq!(report.gpus[0].reservations.len(), 1);
    let events = std::fs::read_to_string(w.state.path().join(crate::events::EVENTS_FILE)).unwrap();
    let kinds: Vec<&str> = events
        .lines()
        .map(|l| l.split("\"event\":\"").nth(1).unwrap().split('"').next().unwrap())
        .collect();
    assert_eq!(kinds, ["admit", "admit", "release", "admit", "reclaim", "note"]);
}

#[test]
fn a_stop_releases_its_own_reservation_never_a_namesakes() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let r = request(GI, "0");
    let mine = Path::new("/run/containerd/io.containerd.runtime.v2.task/ns-a/c");
    let theirs = Path::new("/run/containerd/io.containerd.runtime.v2.task/ns-b/c");
    let mut req = admit_req("c", 1, &r, Policy::Reject);
    req.bundle = Some(mine);
    service.admit(&req).unwrap();
    // A refused container of the same id elsewhere runs its poststop: nothing is released.
    let released = service.release("c", Some(theirs), "poststop").unwrap();
    assert!(released.reservation.is_none());
    assert_eq!(w.state.read().unwrap().reservations.len(), 1);
    let released = service.release("c", Some(mine), "poststop").unwrap();
    assert_eq!(released.reservation.unwrap().bundle.as_deref(), Some(mine));
    assert!(w.state.read().unwrap().reservations.is_empty());
}

#[test]
fn a_stop_is_logged_as_a_release_even_when_its_init_is_already_gone() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let r = request(GI, "0");
    service.admit(&admit_req("stopped", 1, &r, Policy::Reject)).unwrap();
    service.admit(&admit_req("crashed", 2, &r, Policy::Reject)).unwrap();
    // Both inits are gone at poststop time; only one stop is seen.
    w.liveness.gone.borrow_mut().extend([1, 2]);
    let released = service.release("stopped", None, "poststop").unwrap();
    assert_eq!(released.reservation.unwrap().container_id, "stopped");
    let events = std::fs::read_to_string(w.state.path().join(crate::events::EVENTS_FILE)).unwrap();
    let last_two: Vec<&str> = events.lines().rev().take(2).collect();
    assert!(
        last_two
            .iter()
            .any(|l| l.contains("\"release\"") && l.contains("\"stopped\"")),
        "{events}"
    );
    assert!(
        last_two
            .iter()
            .any(|l| l.contains("\"reclaim\"") && l.contains("\"crashed\"")),
        "{events}"
    );
}

#[test]
fn a_stop_after_the_waiting_hook_was_killed_logs_an_abandoned_ticket() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let big = request(8 * GI, "0");
    service.admit(&admit_req("holder", 1, &big, Policy::Reject)).unwrap();
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let mut progress = Progress::default();
    assert!(matches!(service.attempt(&req, &mut progress), Ok(Step::Wait)));
    // The runtime kills the waiting hook (its pid is 10_002), then runs poststop.
    w.liveness.gone.borrow_mut().insert(10_002);
    let released = service.release("waiter", None, "poststop").unwrap();
    assert!(released.cancelled.is_empty() && released.reservation.is_none());
    let events = std::fs::read_to_string(w.state.path().join(crate::events::EVENTS_FILE)).unwrap();
    let last = events.lines().last().unwrap();
    assert!(
        last.contains("\"abandon_ticket\"") && last.contains("\"waiter\""),
        "{events}"
    );
    assert_eq!(w.state.read().unwrap().counters.abandoned, 1);
}

/// An inventory that works once and then fails, as a driver that falls over mid-wait.
struct FailsAfterFirst {
    inner: FakeInventory,
    snapshots: Cell<u32>,
}

impl Inventory for FailsAfterFirst {
    fn snapshot(&self) -> std::result::Result<Snapshot, InventoryError> {
        self.snapshots.set(self.snapshots.get() + 1);
        if self.snapshots.get() > 1 {
            return Err(InventoryError::Nvml {
                what: "reading memory".into(),
                source: nvml_wrapper::error::NvmlError::GpuLost,
            });
        }
        self.inner.snapshot()
    }

    fn describe(&self) -> String {
        "fails after the first snapshot".into()
    }
}

/// A waiter queues on the first attempt; what ends its second attempt must take its ticket.
fn queued_through_the_file<'w>(
    w: &'w World,
    inventory: &'w dyn Inventory,
    req: &AdmitRequest,
) -> (Service<'w>, Progress) {
    let service = Service::new(w.state.clone(), inventory, &w.clock, &w.liveness, &w.config);
    let big = request(8 * GI, "0");
    w.service()
        .admit(&admit_req("holder", 1, &big, Policy::Reject))
        .unwrap();
    let mut progress = Progress::start(&w.clock);
    assert!(matches!(service.attempt(req, &mut progress), Ok(Step::Wait)));
    assert!(progress.ticket().is_some());
    assert_eq!(w.state.read().unwrap().queue.len(), 1);
    (service, progress)
}

#[test]
fn an_inventory_error_after_queueing_leaves_no_ticket() {
    let w = World::new(1, 10 * GI);
    let inventory = FailsAfterFirst {
        inner: FakeInventory::gpus(1, 10 * GI),
        snapshots: Cell::new(0),
    };
    let big = request(8 * GI, "0");
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let (service, mut progress) = queued_through_the_file(&w, &inventory, &req);
    let err = service
        .attempt(&req, &mut progress)
        .err()
        .expect("the second snapshot fails");
    assert!(
        matches!(err, ServiceError::Inventory(_)) && err.is_state_error(),
        "{err}"
    );
    assert!(progress.ticket().is_none());
    assert!(
        w.state.read().unwrap().queue.is_empty(),
        "the ticket went with the error"
    );
}

#[test]
fn a_lock_timeout_after_queueing_leaves_no_ticket_or_says_it_stands() {
    let w = World::new(1, 10 * GI);
    let big = request(8 * GI, "0");
    let mut req = admit_req("waiter", 2, &big, Policy::Wait);
    req.budget = Some(Duration::from_millis(50));
    // Held for less than the removal may wait: the ticket is removed after the lock timeout.
    let (service, mut progress) = queued_through_the_file(&w, &w.inventory, &req);
    let state = w.state.clone();
    let tx = state.begin().unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(tx);
    });
    let err = service.attempt(&req, &mut progress).err().expect("the lock is held");
    holder.join().unwrap();
    assert!(
        matches!(err, ServiceError::Ledger(LedgerError::LockTimeout { .. })) && err.is_state_error(),
        "{err}"
    );
    assert!(progress.ticket().is_none());
    let ledger = w.state.read().unwrap();
    assert!(ledger.queue.is_empty(), "removed in a transaction of its own");
    drop(ledger);
    let events = std::fs::read_to_string(w.state.path().join(crate::events::EVENTS_FILE)).unwrap();
    assert!(events.lines().last().unwrap().contains("\"cancel\""), "{events}");

    // Held past the removal's own timeout: the error says the ticket stands, and that is no
    // state error, so no caller starts the container unaccounted behind its own ticket.
    let w = World::new(1, 10 * GI);
    let (service, mut progress) = queued_through_the_file(&w, &w.inventory, &req);
    let _held = w.state.begin().unwrap();
    let err = service.attempt(&req, &mut progress).err().expect("the lock is held");
    assert!(matches!(err, ServiceError::TicketStands { .. }), "{err}");
    assert!(!err.is_state_error());
    assert!(err.to_string().contains("could not be removed"), "{err}");
}

/// An inventory that must be opened before it reads, and records whether the ledger's lock
/// was free when it opened and each time it read (a slow nvmlInit, or a driver slow to answer
/// under load, must not hold every other start back).
struct RecordsOpen<'w> {
    inner: &'w FakeInventory,
    state: StateDir,
    opened: Cell<bool>,
    lock_free_at_open: RefCell<Vec<bool>>,
    lock_free_at_read: RefCell<Vec<bool>>,
}

impl RecordsOpen<'_> {
    fn lock_free(&self) -> bool {
        self.state
            .begin_reclaiming(
                &FakeLiveness::default(),
                crate::clock::Stamp::wall(0),
                Duration::from_millis(20),
            )
            .is_ok()
    }
}

impl Inventory for RecordsOpen<'_> {
    fn open(&self) -> std::result::Result<(), InventoryError> {
        if !self.opened.get() {
            self.lock_free_at_open.borrow_mut().push(self.lock_free());
            self.opened.set(true);
        }
        Ok(())
    }

    fn is_open(&self) -> bool {
        self.opened.get()
    }

    fn snapshot(&self) -> std::result::Result<Snapshot, InventoryError> {
        // Like inventory::OpenOnUse: whoever reads first opens.
        self.open()?;
        self.lock_free_at_read.borrow_mut().push(self.lock_free());
        self.inner.snapshot()
    }

    fn describe(&self) -> String {
        "records its opening".into()
    }
}

fn records_open<'w>(w: &'w World) -> RecordsOpen<'w> {
    RecordsOpen {
        inner: &w.inventory,
        state: w.state.clone(),
        opened: Cell::new(false),
        lock_free_at_open: RefCell::new(Vec::new()),
        lock_free_at_read: RefCell::new(Vec::new()),
    }
}

/// The GPUs' memory and processes are read before the lock, on every attempt of a waiter too:
/// on a 4-GPU H200 host with 160 waiters (bench/gpu-placement.sh, backfill), reading them
/// inside held the lock so long that starts failed on the lock's timeout.
#[test]
fn every_attempt_reads_the_gpus_before_it_takes_the_lock() {
    let w = World::new(1, 10 * GI);
    let inventory = records_open(&w);
    let big = request(8 * GI, "0");
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let (service, mut progress) = queued_through_the_file(&w, &inventory, &req);
    assert!(matches!(service.attempt(&req, &mut progress), Ok(Step::Wait)));
    w.service().release("holder", None, "test").unwrap();
    let admitted = service.attempt(&req, &mut progress).unwrap();
    assert!(
        matches!(admitted, Step::Done(Admission::Admitted { .. })),
        "{admitted:?}"
    );
    assert_eq!(
        *inventory.lock_free_at_read.borrow(),
        [true, true, true],
        "each of the three attempts read the GPUs with the lock free"
    );
}

#[test]
fn the_inventory_opens_before_the_lock_and_a_confirmation_never_opens_it() {
    let w = World::new(2, 80 * GI);
    let wrapper_inventory = records_open(&w);
    let service = Service::new(w.state.clone(), &wrapper_inventory, &w.clock, &w.liveness, &w.config);
    let auto = request(10 * GI, "auto");
    let admitted = service.admit(&placing("c", 7, &auto, Policy::Reject)).unwrap();
    assert!(matches!(admitted, Admission::Admitted { .. }), "{admitted:?}");
    assert_eq!(
        *wrapper_inventory.lock_free_at_open.borrow(),
        [true],
        "opened once, outside the lock"
    );
    assert_eq!(
        *wrapper_inventory.lock_free_at_read.borrow(),
        [true],
        "read outside the lock"
    );

    let hook_inventory = records_open(&w);
    let service = Service::new(w.state.clone(), &hook_inventory, &w.clock, &w.liveness, &w.config);
    let explicit = request(10 * GI, "0");
    let hook = AdmitRequest {
        runtime: Some(pid(7)),
        ..admit_req("c", 500, &explicit, Policy::Reject)
    };
    let confirmed = service.admit(&hook).unwrap();
    assert!(matches!(confirmed, Admission::Confirmed { .. }), "{confirmed:?}");
    assert!(hook_inventory.lock_free_at_open.borrow().is_empty(), "never opened");
    // A second stage of the same container neither.
    assert!(matches!(service.admit(&hook).unwrap(), Admission::AlreadyAdmitted));
    assert!(hook_inventory.lock_free_at_open.borrow().is_empty());
}

#[test]
fn a_confirmation_stores_the_bundle_the_hook_was_given_so_the_stop_releases_it() {
    let w = World::new(1, 80 * GI);
    let service = w.service();
    let auto = request(10 * GI, "auto");
    // The engine handed the wrapper a path through a symlink; runc reports the resolved one.
    let mut wrapper = placing("c", 7, &auto, Policy::Reject);
    wrapper.bundle = Some(Path::new("/run/engine/link/../c"));
    service.admit(&wrapper).unwrap();
    let hook = AdmitRequest {
        runtime: Some(pid(7)),
        bundle: Some(Path::new("/var/lib/engine/c")),
        ..admit_req("c", 500, &auto, Policy::Reject)
    };
    assert!(matches!(service.admit(&hook).unwrap(), Admission::Confirmed { .. }));
    let ledger = w.state.read().unwrap();
    assert_eq!(
        ledger.reservations[0].bundle.as_deref(),
        Some(Path::new("/var/lib/engine/c"))
    );
    drop(ledger);
    let released = service
        .release("c", Some(Path::new("/var/lib/engine/c")), "poststop")
        .unwrap();
    assert!(released.reservation.is_some());
}

/// `vramgate.dev/enforcement` in a spec is the wrapper's word only when the hook confirms the
/// wrapper's own admission; a container that sets it itself and is admitted by the hook alone
/// (podman `--annotation`, a pod annotation) records no tier.
#[test]
fn a_tier_from_the_spec_is_recorded_only_when_confirming_the_wrappers_admission() {
    use crate::enforce::Tier;
    let w = World::new(1, 80 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let r = request(GI, "0");
    let claimed = AdmitRequest {
        enforcement: Some(Tier::DriverLimit),
        ..admit_req("forger", 1, &r, Policy::Reject)
    };
    assert!(admitted(&first_step(&service, &mut ledger, &claimed).0));
    assert_eq!(ledger.reservation("forger").unwrap().enforcement, None);

    assert!(admitted(
        &step(
            &service,
            &mut ledger,
            &placing("wrapped", 7, &r, Policy::Reject),
            &mut Progress::default()
        )
        .0
    ));
    let hook = AdmitRequest {
        runtime: Some(pid(7)),
        enforcement: Some(Tier::DriverLimit),
        ..admit_req("wrapped", 500, &r, Policy::Reject)
    };
    let (s, _) = first_step(&service, &mut ledger, &hook);
    assert!(matches!(s, Ok(Step::Done(Admission::Confirmed { .. }))), "{s:?}");
    assert_eq!(
        ledger.reservation("wrapped").unwrap().enforcement,
        Some(Tier::DriverLimit)
    );
}
