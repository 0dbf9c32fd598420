//! The service's decisions against a fake inventory, clock and liveness: no processes, no
//! GPUs, and (for single attempts) no files touched.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::path::Path;

use super::*;
use crate::inventory::{GpuMemory, Snapshot};
use crate::procfs::Life;
use crate::quantity::Quantity;
use crate::queue::BackfillOrder;
use crate::request::GpuSelector;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
/// The paper's card: 24,265 MiB.
const CARD: u64 = 24_265 * MI;

struct FakeInventory {
    snapshot: RefCell<Snapshot>,
}

impl FakeInventory {
    fn gpus(n: u32, total: u64) -> FakeInventory {
        let gpus = (0..n)
            .map(|i| GpuMemory {
                index: i,
                mig_index: None,
                uuid: format!("GPU-{i}"),
                minor: Some(i),
                total,
                free: total,
                mig_caps: Vec::new(),
            })
            .collect();
        FakeInventory {
            snapshot: RefCell::new(Snapshot {
                gpus,
                ..Snapshot::default()
            }),
        }
    }

    /// Memory taken by something outside vramgate.
    fn use_outside(&self, gpu: usize, bytes: u64) {
        let mut snapshot = self.snapshot.borrow_mut();
        let g = &mut snapshot.gpus[gpu];
        g.free = g.total - bytes;
    }
}

impl Inventory for FakeInventory {
    fn snapshot(&self) -> std::result::Result<Snapshot, InventoryError> {
        Ok(self.snapshot.borrow().clone())
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

#[derive(Default)]
struct FakeClock {
    unix_ms: Cell<u64>,
    mono: Cell<Duration>,
}

impl FakeClock {
    fn advance(&self, by: Duration) {
        self.unix_ms.set(self.unix_ms.get() + by.as_millis() as u64);
        self.mono.set(self.mono.get() + by);
    }
}

impl Clock for FakeClock {
    fn now_unix_ms(&self) -> u64 {
        self.unix_ms.get()
    }

    fn monotonic(&self) -> Duration {
        self.mono.get()
    }
}

/// Every process is alive unless listed as gone or unreadable.
#[derive(Default)]
struct FakeLiveness {
    gone: RefCell<HashSet<u32>>,
    unknown: RefCell<HashSet<u32>>,
}

impl Liveness for FakeLiveness {
    fn life(&self, p: &ProcessIdentity) -> Life {
        if self.gone.borrow().contains(&p.pid) {
            Life::Gone
        } else if self.unknown.borrow().contains(&p.pid) {
            Life::Unknown
        } else {
            Life::Alive
        }
    }
}

struct World {
    _dir: tempfile::TempDir,
    state: StateDir,
    inventory: FakeInventory,
    clock: FakeClock,
    liveness: FakeLiveness,
    config: Config,
}

impl World {
    fn new(gpus: u32, total: u64) -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open_or_create(&dir.path().join("state")).unwrap();
        let clock = FakeClock::default();
        clock.unix_ms.set(1_000_000);
        World {
            _dir: dir,
            state,
            inventory: FakeInventory::gpus(gpus, total),
            clock,
            liveness: FakeLiveness::default(),
            config: Config::default(),
        }
    }

    fn service(&self) -> Service<'_> {
        Service::new(
            self.state.clone(),
            &self.inventory,
            &self.clock,
            &self.liveness,
            &self.config,
        )
    }
}

fn request(bytes: u64, gpus: &str) -> Request {
    Request {
        memory: Quantity::Bytes(bytes),
        memory_source: crate::request::MEMORY_ANNOTATION.to_string(),
        from_nvidia: false,
        limit: None,
        limit_source: String::new(),
        limit_from_nvidia: false,
        policy: None,
        timeout: None,
        expected_duration: None,
        gpus: GpuSelector::parse_list(crate::request::GPUS_ANNOTATION, gpus).unwrap(),
        notes: vec![],
    }
}

fn pid(n: u32) -> ProcessIdentity {
    ProcessIdentity { pid: n, start_time: 1 }
}

fn admit_req<'r>(id: &'r str, n: u32, request: &'r Request, policy: Policy) -> AdmitRequest<'r> {
    AdmitRequest {
        container: id,
        init: pid(n),
        request,
        bundle: None,
        policy,
        wait_for: Duration::from_secs(60),
        waiter: pid(10_000 + n),
        runtime: Some(pid(20_000 + n)),
        budget: None,
        pending: false,
        enforcement: None,
    }
}

/// One attempt on an in-memory ledger, as a transaction would run it.
fn step(
    service: &Service,
    ledger: &mut Ledger,
    req: &AdmitRequest,
    progress: &mut Progress,
) -> (Result<Step>, Vec<Event>) {
    let mut reclaimed = Reclaimed::default();
    let mut log = Vec::new();
    let step = service.decide_on(ledger, true, &mut reclaimed, req, progress, &mut log);
    (step, log)
}

fn refusal(step: Result<Step>) -> Refusal {
    match step {
        Ok(Step::Done(Admission::Refused(r))) => r,
        Ok(Step::Done(other)) => panic!("expected a refusal, got {other:?}"),
        Ok(Step::Wait) => panic!("expected a refusal, got a wait"),
        Err(e) => panic!("expected a refusal, got {e}"),
    }
}

fn admitted(step: &Result<Step>) -> bool {
    matches!(step, Ok(Step::Done(Admission::Admitted { .. })))
}

/// A ledger in which "holder" (init pid 1) was admitted with `request`.
fn held(service: &Service, request: &Request) -> Ledger {
    let mut ledger = Ledger::default();
    let holder = admit_req("holder", 1, request, Policy::Wait);
    assert!(admitted(
        &step(service, &mut ledger, &holder, &mut Progress::default()).0
    ));
    ledger
}

/// One attempt of `req` that must queue; returns its progress for the next attempt.
fn queued(service: &Service, ledger: &mut Ledger, req: &AdmitRequest) -> Progress {
    let mut progress = Progress::default();
    assert!(matches!(step(service, ledger, req, &mut progress).0, Ok(Step::Wait)));
    progress
}

#[test]
fn the_paper_card_admits_twenty_of_1205_mib_and_refuses_the_rest() {
    let w = World::new(1, CARD);
    let service = w.service();
    let mut ledger = Ledger::default();
    let r = request(1205 * MI, "0");
    let mut outcomes = Vec::new();
    for n in 0..25 {
        let id = format!("c{n}");
        let req = admit_req(&id, n + 1, &r, Policy::Reject);
        outcomes.push(step(&service, &mut ledger, &req, &mut Progress::default()).0);
    }
    assert_eq!(outcomes.iter().filter(|s| admitted(s)).count(), 20);
    assert_eq!(ledger.reservations.len(), 20);
    let last = refusal(outcomes.pop().unwrap());
    let line = last.to_string();
    assert!(
        line.starts_with("vramgate: refused container c24: it requests 1205 MiB and GPU 0 (GPU-0) has 23.7 GiB total, 165 MiB available to new requests (23.5 GiB reserved by 20 containers,")
            && line.ends_with("; retry when a container on that GPU stops, request less, or set vramgate.dev/policy=wait to queue"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

#[test]
fn a_request_larger_than_the_gpu_is_refused_even_under_wait() {
    let w = World::new(1, CARD);
    let service = w.service();
    let r = request(30 * GI, "0");
    let req = admit_req("huge", 1, &r, Policy::Wait);
    let (step, log) = step(&service, &mut Ledger::default(), &req, &mut Progress::default());
    let refusal = refusal(step);
    assert!(matches!(refusal, Refusal::NeverFits { .. }));
    assert!(
        refusal.to_string().contains("more than the GPU can ever hold"),
        "{refusal}"
    );
    assert_eq!(log[0].event, Kind::Refuse);
}

#[test]
fn a_waiter_queues_then_is_admitted_when_memory_is_released() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let big = request(8 * GI, "0");
    let mut ledger = held(&service, &big);
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let mut progress = Progress::default();
    let (first, log) = step(&service, &mut ledger, &req, &mut progress);
    assert!(matches!(first, Ok(Step::Wait)));
    assert_eq!(ledger.queue.len(), 1);
    assert_eq!(log[0].event, Kind::Enqueue);
    assert!(
        log[0].detail.starts_with(
            "ticket 1, number 1: it requests 8192 MiB and GPU 0 (GPU-0) has 10.0 GiB total, 2048 MiB available"
        ),
        "{}",
        log[0].detail
    );
    // Nothing changed: it waits again, and does not take a second ticket.
    w.clock.advance(Duration::from_secs(3));
    let (again, log) = step(&service, &mut ledger, &req, &mut progress);
    assert!(matches!(again, Ok(Step::Wait)) && log.is_empty() && ledger.queue.len() == 1);
    ledger.remove_reservation("holder");
    let (done, log) = step(&service, &mut ledger, &req, &mut progress);
    assert!(matches!(
        done,
        Ok(Step::Done(Admission::Admitted { queued: true, waited, .. })) if waited == Duration::from_secs(3)
    ));
    assert!(ledger.queue.is_empty());
    assert_eq!(ledger.reservations[0].waited_ms, 3000);
    assert_eq!(log[0].event, Kind::AdmitAfterWait);
}

#[test]
fn queue_order_is_first_come_first_served_per_gpu() {
    let w = World::new(2, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let (big, small) = (request(8 * GI, "0"), request(GI, "0"));
    let other_gpu = request(GI, "1");
    let _ = step(
        &service,
        &mut ledger,
        &admit_req("holder", 1, &big, Policy::Wait),
        &mut Progress::default(),
    );
    let mut first = Progress::default();
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("first", 2, &big, Policy::Wait),
        &mut first,
    );
    assert!(matches!(s, Ok(Step::Wait)));
    // The small one would fit, but the big one asked first on the same GPU.
    let mut second = Progress::default();
    let (s, log) = step(
        &service,
        &mut ledger,
        &admit_req("second", 3, &small, Policy::Wait),
        &mut second,
    );
    assert!(matches!(s, Ok(Step::Wait)));
    assert_eq!(
        log[0].detail,
        "ticket 2, number 2: 1 container asked first and is waiting for the same GPU"
    );
    // A request for the other GPU is not behind either of them.
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("elsewhere", 4, &other_gpu, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(admitted(&s));
    // Under reject, the queue is the reason given.
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("rejected", 5, &small, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(refusal(s)
        .to_string()
        .contains("2 containers asked first and are waiting for the same GPU"));
}

#[test]
fn backfill_passes_an_older_waiter_only_within_the_bound() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    w.config.queue.backfill_bound = Duration::from_secs(30);
    let service = w.service();
    let mut ledger = Ledger::default();
    let (big, small) = (request(8 * GI, "0"), request(GI, "0"));
    let _ = step(
        &service,
        &mut ledger,
        &admit_req("holder", 1, &big, Policy::Wait),
        &mut Progress::default(),
    );
    let _ = step(
        &service,
        &mut ledger,
        &admit_req("big", 2, &big, Policy::Wait),
        &mut Progress::default(),
    );
    w.clock.advance(Duration::from_secs(10));
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("early", 3, &small, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(admitted(&s), "within the bound a small request may pass");
    w.clock.advance(Duration::from_secs(25));
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("late", 4, &small, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(matches!(
        refusal(s),
        Refusal::NoRoom {
            shortage: Shortage::Queue { ahead: 1 },
            ..
        }
    ));
}

#[test]
fn a_timed_out_waiter_is_refused_with_its_place_and_leaves_no_ticket() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let big = request(8 * GI, "0");
    let mut ledger = held(&service, &big);
    let mut req = admit_req("late", 2, &big, Policy::Wait);
    req.wait_for = Duration::from_secs(5);
    let mut progress = queued(&service, &mut ledger, &req);
    w.clock.advance(Duration::from_secs(5));
    let (s, log) = step(&service, &mut ledger, &req, &mut progress);
    let line = refusal(s).to_string();
    assert!(line.starts_with("vramgate: refused container late: waited 5s (its timeout) and was still number 1 in the queue: it requests 8192 MiB"), "{line}");
    assert!(ledger.queue.is_empty());
    assert_eq!(log[0].event, Kind::Timeout);
}

#[test]
fn a_cancelled_waiter_is_refused_and_never_admitted() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let big = request(8 * GI, "0");
    let mut ledger = held(&service, &big);
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let mut progress = Progress::default();
    let _ = step(&service, &mut ledger, &req, &mut progress);
    // `vramgate release waiter` removes the ticket; then the memory frees up.
    ledger.remove_tickets_of("waiter", None);
    ledger.remove_reservation("holder");
    let (s, _) = step(&service, &mut ledger, &req, &mut progress);
    assert!(matches!(refusal(s), Refusal::Cancelled { .. }));
    assert!(ledger.reservations.is_empty());
}

#[test]
fn the_same_container_twice_is_idempotent_and_a_live_namesake_is_refused() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let r = request(GI, "0");
    let _ = step(
        &service,
        &mut ledger,
        &admit_req("c", 1, &r, Policy::Reject),
        &mut Progress::default(),
    );
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("c", 1, &r, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(matches!(s, Ok(Step::Done(Admission::AlreadyAdmitted))));
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("c", 2, &r, Policy::Reject),
        &mut Progress::default(),
    );
    assert_eq!(
        refusal(s).to_string(),
        "vramgate: refused container c: a live container with the same id (init pid 1) already holds a reservation"
    );
    // Once the first one is gone, its namesake is admitted in its place.
    w.liveness.gone.borrow_mut().insert(1);
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("c", 2, &r, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(admitted(&s));
    assert_eq!(ledger.reservations[0].init, pid(2));
}

#[test]
fn before_refusing_for_lack_of_room_every_reservation_is_checked() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let big = request(8 * GI, "0");
    let _ = step(
        &service,
        &mut ledger,
        &admit_req("dead", 1, &big, Policy::Reject),
        &mut Progress::default(),
    );
    w.liveness.gone.borrow_mut().insert(1);
    // The routine window did not cover it (checked_all = false): the full check finds it.
    let mut reclaimed = Reclaimed::default();
    let req = admit_req("new", 2, &big, Policy::Reject);
    let s = service.decide_on(
        &mut ledger,
        false,
        &mut reclaimed,
        &req,
        &mut Progress::default(),
        &mut Vec::new(),
    );
    assert!(admitted(&s));
    assert_eq!(reclaimed.reservations[0].container_id, "dead");
}

#[test]
fn memory_used_outside_vramgate_holds_new_requests_back() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    w.inventory.use_outside(0, 5 * GI);
    let r = request(6 * GI, "0");
    let (s, _) = step(
        &service,
        &mut Ledger::default(),
        &admit_req("c", 1, &r, Policy::Reject),
        &mut Progress::default(),
    );
    let line = refusal(s).to_string();
    assert!(line.contains("5120 MiB used outside vramgate"), "{line}");
    w.inventory.use_outside(0, 0);
    let (s, _) = step(
        &service,
        &mut Ledger::default(),
        &admit_req("c", 1, &r, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(admitted(&s));
}

#[test]
fn a_gpu_the_host_lacks_is_a_request_error_that_drops_the_ticket() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let r = request(GI, "3");
    let err = step(
        &service,
        &mut Ledger::default(),
        &admit_req("c", 1, &r, Policy::Reject),
        &mut Progress::default(),
    )
    .0
    .err()
    .expect("no GPU 3");
    assert!(
        matches!(err, ServiceError::Request { .. }) && !err.is_state_error(),
        "{err}"
    );
}

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
fn a_release_ends_a_wait_and_the_waiter_is_refused() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let big = request(8 * GI, "0");
    service.admit(&admit_req("holder", 1, &big, Policy::Reject)).unwrap();
    let req = admit_req("waiter", 2, &big, Policy::Wait);
    let mut progress = Progress {
        started: w.clock.monotonic(),
        ..Progress::default()
    };
    assert!(matches!(service.attempt(&req, &mut progress), Ok(Step::Wait)));
    let released = service.release("waiter", None, "vramgate release").unwrap();
    assert!(released.reservation.is_none() && released.cancelled.len() == 1);
    service.release("holder", None, "test").unwrap();
    assert!(service.may_be_served(&progress), "a cancelled waiter wakes up");
    let step = service.attempt(&req, &mut progress);
    assert!(matches!(refusal(step), Refusal::Cancelled { .. }));
    assert!(w.state.read().unwrap().reservations.is_empty());
}

#[test]
fn the_lock_wait_counts_against_the_callers_budget() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let r = request(GI, "0");
    let mut req = admit_req("c", 1, &r, Policy::Reject);
    req.budget = Some(Duration::from_millis(40));
    let _held = w.state.begin().unwrap();
    let started = std::time::Instant::now();
    let err = service.admit(&req).unwrap_err();
    assert!(
        matches!(err, ServiceError::Ledger(LedgerError::LockTimeout { .. })),
        "{err}"
    );
    assert!(err.is_state_error());
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A clock whose monotonic time jumps ahead on every reading, as on a host so loaded that a
/// waiter wakes up long after its poll time.
struct LaggingClock {
    mono: Cell<Duration>,
    step: Duration,
}

impl Clock for LaggingClock {
    fn now_unix_ms(&self) -> u64 {
        1_000_000
    }

    fn monotonic(&self) -> Duration {
        self.mono.set(self.mono.get() + self.step);
        self.mono.get()
    }
}

#[test]
fn a_waiter_that_wakes_after_its_poll_time_does_not_panic() {
    // Wake-ups 2 s apart with a 1 s poll interval: the time to the next poll is already
    // negative when it is computed. It once underflowed a Duration, and the hook aborted,
    // dropping its ticket as "gone".
    let w = World::new(1, GI);
    let clock = LaggingClock {
        mono: Cell::new(Duration::ZERO),
        step: Duration::from_secs(2),
    };
    let service = Service::new(w.state.clone(), &w.inventory, &clock, &w.liveness, &w.config);
    let r = request(GI, "0");
    let req = admit_req("c", 1, &r, Policy::Wait);
    let mut watcher = wait::LedgerWatcher::new(w.state.path(), None);
    let started = std::time::Instant::now();
    service.sleep_until_worth_trying(&req, &Progress::default(), &mut watcher);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_waiter_whose_container_can_no_longer_start_gives_up_its_place() {
    for (gone, expected) in [(2, "its init process 2 is gone"), (20_002, "the runtime process 20002")] {
        let mut w = World::new(1, 10 * GI);
        w.config.queue.poll_interval = Duration::from_secs(10);
        let service = w.service();
        let big = request(8 * GI, "0");
        let mut ledger = held(&service, &big);
        let req = admit_req("waiter", 2, &big, Policy::Wait);
        let mut progress = queued(&service, &mut ledger, &req);
        w.liveness.gone.borrow_mut().insert(gone);
        // The sleeping waiter notices within a second, whatever the poll interval.
        let mut watcher = wait::LedgerWatcher::new(w.state.path(), None);
        let started = std::time::Instant::now();
        service.sleep_until_worth_trying(&req, &progress, &mut watcher);
        assert!(started.elapsed() < CONTAINER_CHECK + Duration::from_millis(500));
        ledger.remove_reservation("holder");
        let (s, log) = step(&service, &mut ledger, &req, &mut progress);
        let line = refusal(s).to_string();
        assert!(
            line.contains(expected) && line.contains("nothing was reserved"),
            "{line}"
        );
        assert!(
            ledger.queue.is_empty() && ledger.reservations.is_empty(),
            "never admitted"
        );
        assert_eq!(log[0].event, Kind::Cancel);
    }
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

/// A request that leaves the choice of GPU to vramgate, as the runtime wrapper makes it at
/// create (`pending`, owned by the runtime process `n`).
fn placing<'r>(id: &'r str, n: u32, request: &'r Request, policy: Policy) -> AdmitRequest<'r> {
    AdmitRequest {
        pending: true,
        runtime: None,
        waiter: pid(n),
        ..admit_req(id, n, request, policy)
    }
}

fn placed_on(step: &Result<Step>) -> Vec<String> {
    match step {
        Ok(Step::Done(Admission::Admitted {
            shares,
            placement: Some(_),
            ..
        })) => shares.iter().map(|s| s.uuid.clone()).collect(),
        other => panic!("expected a placement, got {other:?}"),
    }
}

#[test]
fn best_fit_places_on_the_fullest_gpu_that_holds_it_and_the_hook_confirms() {
    let w = World::new(4, 80 * GI);
    w.inventory.use_outside(1, 60 * GI);
    w.inventory.use_outside(2, 30 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let auto = request(10 * GI, "auto");
    let (s, log) = step(
        &service,
        &mut ledger,
        &placing("a", 7, &auto, Policy::Reject),
        &mut Progress::default(),
    );
    assert_eq!(placed_on(&s), ["GPU-1"], "20 GiB free: the tightest hole that holds 10");
    let placement = log[0].placement.as_ref().expect("the event records the placement");
    assert_eq!(placement.chosen, ["GPU-1"]);
    assert_eq!(placement.candidates.len(), 4);
    assert!(log[0].detail.contains("placed best-fit on GPU 1"), "{}", log[0].detail);
    assert!(ledger.reservations[0].pending && ledger.reservations[0].init == pid(7));

    // The container's hook (its parent is the runtime process that reserved) confirms it,
    // without a second reservation, whatever its spec says now.
    let explicit = request(10 * GI, "1");
    let hook = AdmitRequest {
        runtime: Some(pid(7)),
        ..admit_req("a", 500, &explicit, Policy::Reject)
    };
    let (s, log) = step(&service, &mut ledger, &hook, &mut Progress::default());
    assert!(matches!(s, Ok(Step::Done(Admission::Confirmed { .. }))), "{s:?}");
    assert_eq!(log[0].event, Kind::Confirm);
    assert_eq!(ledger.reservations.len(), 1);
    assert!(!ledger.reservations[0].pending && ledger.reservations[0].init == pid(500));

    // Fill: the next 10 GiB goes to GPU 1 again (10 left), then GPU 2 (50 → 40).
    let (s, _) = step(
        &service,
        &mut ledger,
        &placing("b", 8, &auto, Policy::Reject),
        &mut Progress::default(),
    );
    assert_eq!(placed_on(&s), ["GPU-1"]);
    let (s, _) = step(
        &service,
        &mut ledger,
        &placing("c", 9, &auto, Policy::Reject),
        &mut Progress::default(),
    );
    assert_eq!(placed_on(&s), ["GPU-2"]);
}

#[test]
fn spread_places_on_the_emptiest_gpu_and_ties_go_to_fewer_reservations() {
    let mut w = World::new(3, 80 * GI);
    w.config.placement.strategy = crate::placement::Strategy::Spread;
    w.inventory.use_outside(0, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let auto = request(5 * GI, "auto");
    let mut chosen = Vec::new();
    for (n, id) in ["a", "b", "c", "d"].iter().enumerate() {
        let (s, _) = step(
            &service,
            &mut ledger,
            &placing(id, n as u32 + 1, &auto, Policy::Reject),
            &mut Progress::default(),
        );
        chosen.extend(placed_on(&s));
    }
    assert_eq!(chosen, ["GPU-1", "GPU-2", "GPU-1", "GPU-2"]);
    // Two GPUs for one job: both at once, the amount on each.
    let two = request(5 * GI, "auto:2");
    let (s, _) = step(
        &service,
        &mut ledger,
        &placing("e", 9, &two, Policy::Reject),
        &mut Progress::default(),
    );
    assert_eq!(placed_on(&s), ["GPU-0", "GPU-1"]);
}

#[test]
fn a_placement_no_gpu_can_hold_names_the_largest_gpu() {
    let w = World::new(2, 10 * GI);
    let service = w.service();
    let auto = request(12 * GI, "auto");
    let (s, _) = step(
        &service,
        &mut Ledger::default(),
        &placing("huge", 1, &auto, Policy::Wait),
        &mut Progress::default(),
    );
    let line = refusal(s).to_string();
    assert!(
        line.contains("it requests 12.0 GiB on any one of 2 GPUs, more than enough of them can ever hold (the largest is GPU 0 (GPU-0) has 10.0 GiB total"),
        "{line}"
    );
    // Room on none now: refused under reject with the GPU that has the most room.
    let mut ledger = Ledger::default();
    w.inventory.use_outside(0, 6 * GI);
    w.inventory.use_outside(1, 8 * GI);
    let fits_later = request(5 * GI, "auto");
    let (s, _) = step(
        &service,
        &mut ledger,
        &placing("later", 2, &fits_later, Policy::Reject),
        &mut Progress::default(),
    );
    let line = refusal(s).to_string();
    assert!(
        line.contains("it requests 5120 MiB on any one of 2 GPUs and the one with the most room is GPU 0 (GPU-0) has 10.0 GiB total, 4096 MiB available"),
        "{line}"
    );
}

#[test]
fn a_waiting_placement_takes_the_first_gpu_that_frees_and_holds_back_later_requests_on_its_gpus() {
    let w = World::new(2, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let eight = |g: &str| request(8 * GI, g);
    let (on0, on1) = (eight("0"), eight("1"));
    for (id, n, r) in [("h0", 1, &on0), ("h1", 2, &on1)] {
        assert!(admitted(
            &step(
                &service,
                &mut ledger,
                &admit_req(id, n, r, Policy::Wait),
                &mut Progress::default()
            )
            .0
        ));
    }
    let auto = request(4 * GI, "auto");
    let waiter = placing("w", 3, &auto, Policy::Wait);
    let mut progress = queued(&service, &mut ledger, &waiter);
    assert_eq!(ledger.queue[0].choose, Some(1));
    assert_eq!(ledger.queue[0].gpus.len(), 2, "it waits on both GPUs");
    // A later small request on GPU 1 fits, but the older placement comes first there.
    let small = request(GI, "1");
    let mut later = queued(&service, &mut ledger, &admit_req("later", 4, &small, Policy::Wait));
    // GPU 1 frees first: the placement takes it.
    ledger.remove_reservation("h1");
    let (s, _) = step(&service, &mut ledger, &waiter, &mut progress);
    assert_eq!(placed_on(&s), ["GPU-1"]);
    assert!(admitted(
        &step(
            &service,
            &mut ledger,
            &admit_req("later", 4, &small, Policy::Wait),
            &mut later
        )
        .0
    ));
    assert!(ledger.queue.is_empty());
}

#[test]
fn only_the_runtime_wrapper_can_place() {
    let w = World::new(2, 10 * GI);
    let service = w.service();
    let auto = request(GI, "auto");
    let err = match step(
        &service,
        &mut Ledger::default(),
        &admit_req("x", 1, &auto, Policy::Reject),
        &mut Progress::default(),
    )
    .0
    {
        Err(e) => e.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(err.contains("only vramgate-runtime can make"), "{err}");
}

#[test]
fn a_pending_reservation_whose_create_died_is_reclaimed() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let auto = request(6 * GI, "auto");
    service.admit(&placing("dies", 77, &auto, Policy::Reject)).unwrap();
    assert!(w.state.read().unwrap().reservations[0].pending);
    // runc create (this pid, after the wrapper's exec) is killed before the hook ran.
    w.liveness.gone.borrow_mut().insert(77);
    let next = request(6 * GI, "0");
    let outcome = service.admit(&admit_req("next", 2, &next, Policy::Reject)).unwrap();
    assert!(matches!(outcome, Admission::Admitted { .. }), "{outcome:?}");
    let ledger = w.state.read().unwrap();
    assert_eq!(ledger.reservations.len(), 1);
    assert_eq!(ledger.reservations[0].container_id, "next");
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
/// was free when it opened (a slow nvmlInit must not hold every other start back).
struct RecordsOpen<'w> {
    inner: &'w FakeInventory,
    state: StateDir,
    opened: Cell<bool>,
    lock_free_at_open: RefCell<Vec<bool>>,
}

impl Inventory for RecordsOpen<'_> {
    fn open(&self) -> std::result::Result<(), InventoryError> {
        if !self.opened.get() {
            let free = self
                .state
                .begin_reclaiming(&FakeLiveness::default(), Duration::from_millis(20))
                .is_ok();
            self.lock_free_at_open.borrow_mut().push(free);
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
    }
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
    assert!(admitted(
        &step(&service, &mut ledger, &claimed, &mut Progress::default()).0
    ));
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
    let (s, _) = step(&service, &mut ledger, &hook, &mut Progress::default());
    assert!(matches!(s, Ok(Step::Done(Admission::Confirmed { .. }))), "{s:?}");
    assert_eq!(
        ledger.reservation("wrapped").unwrap().enforcement,
        Some(Tier::DriverLimit)
    );
}

/// `request` with a limit above it.
fn request_with_limit(bytes: u64, limit: u64, gpus: &str) -> Request {
    Request {
        limit: Some(Quantity::Bytes(limit)),
        limit_source: crate::request::MEMORY_LIMIT_ANNOTATION.to_string(),
        ..request(bytes, gpus)
    }
}

/// Request 2 GiB, limit 6 GiB, on an 8 GiB GPU: the first is admitted with both recorded; a
/// second has room for its request but not its limit at the default bound, and its line says
/// that the limits held it back; with `limit_overcommit = 50%` it is admitted. The admission
/// event carries the limit.
#[test]
fn the_sum_of_limits_holds_a_request_back_and_limit_overcommit_lets_it_in() {
    let mut w = World::new(1, 8 * GI);
    let r = request_with_limit(2 * GI, 6 * GI, "0");
    let service = w.service();
    let mut ledger = Ledger::default();
    let (first, log) = step(
        &service,
        &mut ledger,
        &admit_req("a", 1, &r, Policy::Reject),
        &mut Progress::default(),
    );
    assert!(admitted(&first));
    assert_eq!(
        ledger.reservations[0].gpus,
        vec![GpuShare::new("GPU-0", 2 * GI, 6 * GI)]
    );
    assert_eq!(ledger.format_needed(), 2);
    assert_eq!(log[0].gpus[0].limit, Some(6 * GI));
    assert!(
        log[0].detail.contains("limit 6144 MiB from vramgate.dev/memory-limit"),
        "{}",
        log[0].detail
    );
    let second = refusal(
        step(
            &service,
            &mut ledger,
            &admit_req("b", 2, &r, Policy::Reject),
            &mut Progress::default(),
        )
        .0,
    );
    let line = second.to_string();
    assert!(
        line.starts_with("vramgate: refused container b: its limit is 6144 MiB and GPU 0 (GPU-0) has room for limits up to 8192 MiB in all (8192 MiB total, 0 B headroom, 0 B [queue] limit_overcommit), and the limits of its 1 container add up to 6144 MiB"),
        "{line}"
    );
    assert!(!line.contains('\n'));
    drop(service);
    w.config.queue.limit_overcommit_ppm = 500_000;
    let service = w.service();
    assert!(admitted(
        &step(
            &service,
            &mut ledger,
            &admit_req("b", 2, &r, Policy::Reject),
            &mut Progress::default()
        )
        .0
    ));
    assert_eq!(
        (ledger.reserved_on("GPU-0"), ledger.limits_on("GPU-0")),
        (4 * GI, 12 * GI)
    );
    // A third: its request fits (4 of 8 GiB reserved), its limit does not (12 of 12).
    let third = refusal(
        step(
            &service,
            &mut ledger,
            &admit_req("c", 3, &r, Policy::Reject),
            &mut Progress::default(),
        )
        .0,
    );
    assert!(
        matches!(
            &third,
            Refusal::NoRoom {
                shortage: Shortage::Memory {
                    bound: crate::admission::Bound::Limits,
                    ..
                },
                ..
            }
        ),
        "{third}"
    );
    // A limit beyond what the limits may ever add up to: refused at once, even under wait.
    let huge = request_with_limit(GI, 13 * GI, "0");
    let never = refusal(
        step(
            &service,
            &mut Ledger::default(),
            &admit_req("d", 4, &huge, Policy::Wait),
            &mut Progress::default(),
        )
        .0,
    );
    assert!(
        never
            .to_string()
            .contains("its limit is 13.0 GiB, more than the limits on the GPU may ever add up to"),
        "{never}"
    );
}

/// A 10 GiB GPU held by "a" (6 GiB) and "b" (3 GiB), with "big" (8 GiB), "small" (2 GiB) and
/// "mid" (3 GiB) queued in that order, `apart` between small and mid; then "b" leaves and 4
/// GiB are free: small and mid both fit, big does not.
fn three_waiters_then_4_gib_free<'w>(
    service: &Service<'w>,
    w: &'w World,
    ledger: &mut Ledger,
    requests: &'w [Request; 3],
    apart: Duration,
) -> [Progress; 3] {
    for (id, n, gib) in [("a", 1, 6), ("b", 2, 3)] {
        let holder = request(gib * GI, "0");
        assert!(admitted(
            &step(
                service,
                ledger,
                &admit_req(id, n, &holder, Policy::Wait),
                &mut Progress::default()
            )
            .0
        ));
    }
    let big = queued(service, ledger, &admit_req("big", 3, &requests[0], Policy::Wait));
    let small = queued(service, ledger, &admit_req("small", 4, &requests[1], Policy::Wait));
    w.clock.advance(apart);
    let mid = queued(service, ledger, &admit_req("mid", 5, &requests[2], Policy::Wait));
    assert!(ledger.remove_reservation_of("b", None).is_some());
    [big, small, mid]
}

fn waiters(small_declares: Option<Duration>, mid_declares: Option<Duration>) -> [Request; 3] {
    let mut small = request(2 * GI, "0");
    small.expected_duration = small_declares;
    let mut mid = request(3 * GI, "0");
    mid.expected_duration = mid_declares;
    [request(8 * GI, "0"), small, mid]
}

#[test]
fn backfill_order_largest_lets_the_largest_waiter_that_fits_in_first() {
    for (order, first) in [(BackfillOrder::Arrival, "small"), (BackfillOrder::Largest, "mid")] {
        let mut w = World::new(1, 10 * GI);
        w.config.queue.backfill = true;
        w.config.queue.backfill_order = order;
        let service = w.service();
        let mut ledger = Ledger::default();
        let requests = waiters(None, None);
        let [_, mut small, mut mid] =
            three_waiters_then_4_gib_free(&service, &w, &mut ledger, &requests, Duration::from_secs(1));
        // Waiters race for the lock: the smaller, older one tries first.
        let (s, _) = step(
            &service,
            &mut ledger,
            &admit_req("small", 4, &requests[1], Policy::Wait),
            &mut small,
        );
        let (m, _) = step(
            &service,
            &mut ledger,
            &admit_req("mid", 5, &requests[2], Policy::Wait),
            &mut mid,
        );
        let admitted_ids: Vec<&str> = ledger.reservations.iter().map(|r| r.container_id.as_str()).collect();
        assert_eq!(admitted_ids, ["a", first], "{order}");
        assert_eq!(admitted(&s), first == "small", "{order}");
        assert_eq!(admitted(&m), first == "mid", "{order}");
    }
}

#[test]
fn backfill_order_longest_orders_by_the_declared_duration() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    w.config.queue.backfill_order = BackfillOrder::Longest;
    let service = w.service();
    let mut ledger = Ledger::default();
    let requests = waiters(Some(Duration::from_secs(600)), Some(Duration::from_secs(60)));
    let [_, mut small, mut mid] =
        three_waiters_then_4_gib_free(&service, &w, &mut ledger, &requests, Duration::from_secs(1));
    assert_eq!(
        ledger.queue[1].expected_ms,
        Some(600_000),
        "the ticket keeps what was declared"
    );
    let (m, _) = step(
        &service,
        &mut ledger,
        &admit_req("mid", 5, &requests[2], Policy::Wait),
        &mut mid,
    );
    assert!(matches!(m, Ok(Step::Wait)), "the longer small job goes first");
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("small", 4, &requests[1], Policy::Wait),
        &mut small,
    );
    assert!(admitted(&s));
}

#[test]
fn no_backfill_order_passes_a_waiter_that_has_waited_the_bound() {
    for order in [BackfillOrder::Largest, BackfillOrder::Longest] {
        let mut w = World::new(1, 10 * GI);
        w.config.queue.backfill = true;
        w.config.queue.backfill_bound = Duration::from_secs(30);
        w.config.queue.backfill_order = order;
        let service = w.service();
        let mut ledger = Ledger::default();
        // mid is larger and declares longer, but small has waited the bound when room frees.
        let requests = waiters(Some(Duration::from_secs(1)), Some(Duration::from_secs(600)));
        let [_, mut small, mut mid] =
            three_waiters_then_4_gib_free(&service, &w, &mut ledger, &requests, Duration::from_secs(20));
        w.clock.advance(Duration::from_secs(11));
        // big, past the bound too, would hold both back: it gives up.
        assert_eq!(ledger.remove_tickets_of("big", None).len(), 1);
        let (m, _) = step(
            &service,
            &mut ledger,
            &admit_req("mid", 5, &requests[2], Policy::Wait),
            &mut mid,
        );
        assert!(
            matches!(m, Ok(Step::Wait)),
            "{order}: mid may not pass small, 31 s in line"
        );
        let (s, _) = step(
            &service,
            &mut ledger,
            &admit_req("small", 4, &requests[1], Policy::Wait),
            &mut small,
        );
        assert!(admitted(&s), "{order}: past the bound small defers to no one");
    }
}
