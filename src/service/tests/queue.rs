//! The wait: first come first served per GPU, the backfill bound and orders, timeouts,
//! cancels and a waiter that wakes late.

use super::*;

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
    let _ = first_step(&service, &mut ledger, &admit_req("holder", 1, &big, Policy::Wait));
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
    let (s, _) = first_step(
        &service,
        &mut ledger,
        &admit_req("elsewhere", 4, &other_gpu, Policy::Reject),
    );
    assert!(admitted(&s));
    // Under reject, the queue is the reason given.
    let (s, _) = first_step(&service, &mut ledger, &admit_req("rejected", 5, &small, Policy::Reject));
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
    let _ = first_step(&service, &mut ledger, &admit_req("holder", 1, &big, Policy::Wait));
    let _ = first_step(&service, &mut ledger, &admit_req("big", 2, &big, Policy::Wait));
    w.clock.advance(Duration::from_secs(10));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("early", 3, &small, Policy::Reject));
    assert!(admitted(&s), "within the bound a small request may pass");
    w.clock.advance(Duration::from_secs(25));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("late", 4, &small, Policy::Reject));
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
    // Its budget, not the lock's own timeout, ended the wait: a bound under that timeout, with
    // room for a loaded machine (the 40 ms budget is not what is checked).
    assert!(started.elapsed() < crate::ledger::LOCK_TIMEOUT / 2);
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
    let mut watcher = wake::LedgerWatcher::new(&w.state, None);
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
        // The sleeping waiter notices within CONTAINER_CHECK (a second), whatever the poll
        // interval: it woke before its 10 s poll, which is all that tells the check from the
        // poll, and leaves a loaded machine the rest of those 10 s.
        let mut watcher = wake::LedgerWatcher::new(&w.state, None);
        let started = std::time::Instant::now();
        service.sleep_until_worth_trying(&req, &progress, &mut watcher);
        assert!(CONTAINER_CHECK < w.config.queue.poll_interval);
        assert!(
            started.elapsed() < w.config.queue.poll_interval,
            "{:?}",
            started.elapsed()
        );
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

/// A request of the container `name` of pod `pod`, as a CRI runtime marks it.
fn in_pod(request: Request, pod: &str, name: &str) -> Request {
    Request {
        pod_sandbox: Some(pod.into()),
        pod_container: Some(crate::ledger::PodContainer {
            pod: pod.into(),
            name: name.into(),
        }),
        ..request
    }
}

/// Issue 43, item 5: kubelet gives up on a queued start at its deadline (containerd's shim
/// kills the waiting create, and the next transaction drops its ticket), then retries it as a
/// new container of the same pod with the same name. The retry keeps the place and the age of
/// its first attempt, so once that attempt's age passes `backfill_bound` nothing passes it;
/// before, it queued at the back with a fresh age and backfill passed it for another whole
/// bound on every retry.
#[test]
fn a_retried_start_keeps_its_age_and_is_not_passed_beyond_the_bound() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    w.config.queue.backfill_bound = Duration::from_secs(30);
    let service = w.service();
    let (big, small) = (in_pod(request(8 * GI, "0"), "pod-a", "train"), request(GI / 2, "0"));
    let mut ledger = held(&service, &request(8 * GI, "0"));
    let first = placing("big-1", 2, &big, Policy::Wait);
    let _first = queued(&service, &mut ledger, &first);
    let enqueued = ledger.queue[0].enqueued_unix_ms;
    assert_eq!(ledger.queue[0].ticket, 1);

    // kubelet's deadline: the waiting create is killed, and a transaction drops its ticket.
    w.clock.advance(Duration::from_secs(20));
    w.liveness.gone.borrow_mut().insert(2);
    let reclaimed = ledger.reclaim_all(&w.liveness);
    assert_eq!(reclaimed.tickets.len(), 1);
    assert!(ledger.queue.is_empty());
    // While no ticket is there, a small request passes: nobody waits.
    let (s, _) = first_step(&service, &mut ledger, &admit_req("between", 3, &small, Policy::Reject));
    assert!(admitted(&s));

    // The retry: a new container id and process, the same pod and name.
    w.clock.advance(Duration::from_secs(2));
    let retry = placing("big-2", 4, &big, Policy::Wait);
    let mut retried = Progress::default();
    let (s, log) = step(&service, &mut ledger, &retry, &mut retried);
    assert!(matches!(s, Ok(Step::Wait)));
    let ticket = &ledger.queue[0];
    assert_eq!(
        (ticket.container_id.as_str(), ticket.ticket, ticket.enqueued_unix_ms),
        ("big-2", 1, enqueued),
        "the retry takes its first attempt's number and age"
    );
    assert!(
        log[0].detail.contains("the place of its earlier attempt (waiting 22s)"),
        "{}",
        log[0].detail
    );
    assert!(ledger.kept_places.is_empty(), "the place is used once");

    // Within the bound (counted from the first attempt) a small request still passes it...
    w.clock.advance(Duration::from_secs(5));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("early", 5, &small, Policy::Reject));
    assert!(admitted(&s), "27 s after the first attempt, within the bound");
    // ...and past it, none does, although the retry itself has waited only 8 s.
    w.clock.advance(Duration::from_secs(4));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("late", 6, &small, Policy::Reject));
    assert!(
        matches!(
            refusal(s),
            Refusal::NoRoom {
                shortage: Shortage::Queue { ahead: 1 },
                ..
            }
        ),
        "31 s after the first attempt, the retry is not passed"
    );
}

/// A kept place goes only to the same container of the same pod, once, and only while the
/// dropped ticket could itself have waited; a ticket of no pod keeps none; a hook's wait that
/// the engine cancels (its runtime process gone) keeps its place as a killed waiter does.
#[test]
fn a_kept_place_goes_once_to_the_same_pod_container_within_the_first_wait() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    let service = w.service();
    let big = in_pod(request(8 * GI, "0"), "pod-a", "train");
    let mut ledger = held(&service, &request(8 * GI, "0"));
    // Not in a pod: nothing is kept.
    let plain = request(8 * GI, "0");
    let _ = queued(&service, &mut ledger, &placing("plain", 2, &plain, Policy::Wait));
    // The hook's wait, whose runtime process the engine killed.
    let mut hooked = queued(&service, &mut ledger, &admit_req("big-1", 3, &big, Policy::Wait));
    let first = ledger.queue[1].clone();
    w.clock.advance(Duration::from_secs(5));
    w.liveness.gone.borrow_mut().extend([2, 20_003]);
    ledger.reclaim_all(&w.liveness);
    let (s, _) = step(
        &service,
        &mut ledger,
        &admit_req("big-1", 3, &big, Policy::Wait),
        &mut hooked,
    );
    assert!(matches!(refusal(s), Refusal::ContainerGone { .. }));
    assert!(ledger.queue.is_empty());
    assert_eq!(ledger.kept_places.len(), 1, "{:?}", ledger.kept_places);
    assert_eq!(ledger.kept_places[0].ticket, first.ticket);

    // Another pod's container of that name, or another container of that pod: a place of its own.
    for (id, n, req) in [
        ("other-pod", 4, in_pod(request(8 * GI, "0"), "pod-b", "train")),
        ("other-name", 5, in_pod(request(8 * GI, "0"), "pod-a", "eval")),
    ] {
        let _ = queued(&service, &mut ledger, &placing(id, n, &req, Policy::Wait));
        let t = ledger.queue.iter().find(|t| t.container_id == id).unwrap();
        assert!(
            t.ticket > first.ticket && t.enqueued_unix_ms > first.enqueued_unix_ms,
            "{id}"
        );
    }
    // The retry, once; a second retry of it (with the first retry still waiting) has none.
    // Each attempt's wait is counted from its own start, as a new process's is.
    let queued_now = |ledger: &mut Ledger, req: &AdmitRequest| {
        let (s, _) = step(&service, ledger, req, &mut Progress::start(&w.clock));
        assert!(matches!(s, Ok(Step::Wait)), "{s:?}");
    };
    queued_now(&mut ledger, &placing("big-2", 6, &big, Policy::Wait));
    assert_eq!(ledger.queue[0].container_id, "big-2");
    assert_eq!(ledger.queue[0].ticket, first.ticket);
    let _ = queued(&service, &mut ledger, &placing("big-3", 7, &big, Policy::Wait));
    assert!(ledger.queue.last().unwrap().container_id == "big-3");

    // Both retries given up on: the earlier place is kept. It lasts until the deadline of the
    // ticket that held it last (big-2's: 5 s + its 60 s wait after the first attempt).
    w.liveness.gone.borrow_mut().extend([6, 7]);
    ledger.reclaim_all(&w.liveness);
    assert_eq!(ledger.kept_places.len(), 1, "one place per container: the earliest");
    assert_eq!(ledger.kept_places[0].ticket, first.ticket);
    w.clock.advance(Duration::from_secs(61));
    queued_now(&mut ledger, &placing("big-4", 8, &big, Policy::Wait));
    let t = ledger.queue.iter().find(|t| t.container_id == "big-4").unwrap();
    assert!(t.ticket > first.ticket, "past that deadline the place is gone");
    assert!(ledger.kept_places.is_empty());
}

/// What a waiter woken by a change (`polled` false) or by its poll does: true when it would
/// take the lock for an attempt, false when it goes back to sleep on its unlocked read.
fn tries(service: &Service, ledger: &Ledger, progress: &Progress, polled: bool) -> bool {
    service.worth_trying_in(ledger, progress, polled)
}

/// A ledger in which containers `(id, init pid, GiB)` were admitted on GPU 0, in that order.
fn holding(service: &Service, held: &[(&str, u32, u64)]) -> Ledger {
    let mut ledger = Ledger::default();
    for &(id, pid, gib) in held {
        let r = request(gib * GI, "0");
        assert!(admitted(
            &first_step(service, &mut ledger, &admit_req(id, pid, &r, Policy::Wait)).0
        ));
    }
    ledger
}

#[test]
fn a_backfill_waiter_stays_off_the_lock_until_the_ledger_leaves_it_room() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    let service = w.service();
    let mut ledger = holding(&service, &[("a", 1, 5), ("b", 2, 2), ("c", 3, 2)]);
    // Two waiters: big (8 GiB) first, then small (2 GiB), which backfill may let pass.
    let (big, small) = (request(8 * GI, "0"), request(2 * GI, "0"));
    let mut big_waits = queued(&service, &mut ledger, &admit_req("big", 4, &big, Policy::Wait));
    let mut small_waits = queued(&service, &mut ledger, &admit_req("small", 5, &small, Policy::Wait));
    // c leaves: 3 GiB free. Too little for big, which stays off the lock; enough for small.
    ledger.remove_reservation("c");
    assert!(!tries(&service, &ledger, &big_waits, false));
    assert!(tries(&service, &ledger, &small_waits, false));
    assert!(admits(
        &service,
        &mut ledger,
        &admit_req("small", 5, &small, Policy::Wait),
        &mut small_waits
    ));
    // b leaves: 3 GiB again, still too little for big; a leaves: 8 GiB, and big tries.
    ledger.remove_reservation("b");
    assert!(!tries(&service, &ledger, &big_waits, false));
    ledger.remove_reservation("a");
    assert!(tries(&service, &ledger, &big_waits, false));
    assert!(admits(
        &service,
        &mut ledger,
        &admit_req("big", 4, &big, Policy::Wait),
        &mut big_waits
    ));
}

#[test]
fn a_backfill_waiter_behind_one_past_the_bound_stays_off_the_lock_while_it_lives() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    w.config.queue.backfill_bound = Duration::from_secs(30);
    let service = w.service();
    let (big, small) = (request(8 * GI, "0"), request(2 * GI, "0"));
    let mut ledger = holding(&service, &[("a", 1, 6), ("b", 2, 3)]);
    let _big_waits = queued(&service, &mut ledger, &admit_req("big", 3, &big, Policy::Wait));
    let small_waits = queued(&service, &mut ledger, &admit_req("small", 4, &small, Policy::Wait));
    // b leaves: room for small, not for big. Backfill lets small pass big for 30 s, not after:
    // then only big leaving lets it in.
    ledger.remove_reservation("b");
    assert!(tries(&service, &ledger, &small_waits, false));
    w.clock.advance(Duration::from_secs(31));
    assert!(!tries(&service, &ledger, &small_waits, false));
    assert!(!tries(&service, &ledger, &small_waits, true));
    // big's hook is gone: a transaction must remove its ticket, and small makes it.
    w.liveness.gone.borrow_mut().insert(10_003);
    assert!(tries(&service, &ledger, &small_waits, false));
}

#[test]
fn a_waiter_at_the_head_still_takes_the_lock_at_every_poll() {
    for backfill in [false, true] {
        // A holder that died without its release: the ledger still counts its 6 GiB, so no
        // unlocked read gives the waiter room; at its poll it tries, and the attempt reclaims.
        let mut w = World::new(1, 10 * GI);
        w.config.queue.backfill = backfill;
        let service = w.service();
        service
            .admit(&admit_req("holder", 1, &request(6 * GI, "0"), Policy::Reject))
            .unwrap();
        let big = request(8 * GI, "0");
        let req = admit_req("waiter", 2, &big, Policy::Wait);
        let mut progress = Progress::start(&w.clock);
        assert!(matches!(service.attempt(&req, &mut progress), Ok(Step::Wait)));
        w.liveness.gone.borrow_mut().insert(1);
        let ledger = w.state.read().unwrap();
        assert!(!tries(&service, &ledger, &progress, false), "a change alone");
        assert!(
            tries(&service, &ledger, &progress, true),
            "its poll (backfill {backfill})"
        );
        let admission = service.attempt(&req, &mut progress).unwrap();
        assert!(matches!(admission, Step::Done(Admission::Admitted { .. })));
    }
}

#[test]
fn memory_freed_outside_vramgate_is_found_at_a_poll() {
    let mut w = World::new(1, 10 * GI);
    w.config.queue.backfill = true;
    let service = w.service();
    // A head that does not fit (9 GiB), and behind it a waiter for 6 GiB that the ledger has
    // room for but the GPU has not: 5 GiB are in use outside vramgate.
    w.inventory.use_outside(0, 5 * GI);
    let (huge, mid) = (request(9 * GI + GI / 2, "0"), request(6 * GI, "0"));
    let mut head = Progress::start(&w.clock);
    let mut behind = Progress::start(&w.clock);
    let head_req = admit_req("head", 1, &huge, Policy::Wait);
    let behind_req = admit_req("behind", 2, &mid, Policy::Wait);
    assert!(matches!(service.attempt(&head_req, &mut head), Ok(Step::Wait)));
    assert!(matches!(service.attempt(&behind_req, &mut behind), Ok(Step::Wait)));
    let ledger = w.state.read().unwrap();
    // Nothing in the ledger tells, so it tries at its polls (and changes): a lock each, which
    // is what finding outside memory freed costs.
    assert!(tries(&service, &ledger, &behind, true));
    w.inventory.use_outside(0, 0);
    let admission = service.attempt(&behind_req, &mut behind).unwrap();
    assert!(matches!(admission, Step::Done(Admission::Admitted { .. })));
}

#[test]
fn fifo_still_serves_only_the_head_and_stays_off_the_lock_behind_it() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let (big, small) = (request(8 * GI, "0"), request(GI, "0"));
    let mut ledger = held(&service, &big);
    let mut big_waits = queued(&service, &mut ledger, &admit_req("big", 2, &big, Policy::Wait));
    let mut small_waits = queued(&service, &mut ledger, &admit_req("small", 3, &small, Policy::Wait));
    // small would fit, but big asked first: small tries neither on a change nor at a poll.
    for polled in [false, true] {
        assert!(!tries(&service, &ledger, &small_waits, polled));
    }
    // big heads the queue: no room on a change, but it tries at its poll, as before.
    assert!(!tries(&service, &ledger, &big_waits, false));
    assert!(tries(&service, &ledger, &big_waits, true));
    // The holder leaves: big tries on the change and is admitted; small still waits for room.
    ledger.remove_reservation("holder");
    assert!(tries(&service, &ledger, &big_waits, false));
    assert!(admits(
        &service,
        &mut ledger,
        &admit_req("big", 2, &big, Policy::Wait),
        &mut big_waits
    ));
    assert!(tries(&service, &ledger, &small_waits, false), "at the head with room");
    assert!(admits(
        &service,
        &mut ledger,
        &admit_req("small", 3, &small, Policy::Wait),
        &mut small_waits
    ));
    // A head whose hook is gone lets the next one try, which removes it.
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mut ledger = held(&service, &big);
    let _gone = queued(&service, &mut ledger, &admit_req("gone", 2, &big, Policy::Wait));
    let next = queued(&service, &mut ledger, &admit_req("next", 3, &small, Policy::Wait));
    assert!(!tries(&service, &ledger, &next, false));
    w.liveness.gone.borrow_mut().insert(10_002);
    assert!(tries(&service, &ledger, &next, false));
}

#[test]
fn only_a_few_waiters_hold_an_inotify_instance_and_a_freed_slot_is_taken() {
    // fs.inotify.max_user_instances is shared by every root process on the node: a queue of
    // any length holds at most WAKE_SLOTS instances, and the rest watch the ledger's stat.
    let w = World::new(1, GI);
    let mut watchers: Vec<_> = (0..3 * usize::from(WAKE_SLOTS))
        .map(|_| wake::LedgerWatcher::new(&w.state, None))
        .collect();
    let holding = |ws: &[wake::LedgerWatcher]| ws.iter().filter(|w| w.has_slot()).count();
    assert_eq!(holding(&watchers), usize::from(WAKE_SLOTS));
    // A holder admitted or crashed closes its slot's file (the kernel does it for a crash):
    // a waiter without one takes it at its next try (SLOT_RETRY, a second).
    let first = watchers.iter().position(|w| w.has_slot()).unwrap();
    drop(watchers.remove(first));
    assert_eq!(holding(&watchers), usize::from(WAKE_SLOTS) - 1);
    let started = std::time::Instant::now();
    while holding(&watchers) < usize::from(WAKE_SLOTS) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the freed slot was never taken"
        );
        for w in watchers.iter_mut().filter(|w| !w.has_slot()) {
            let _ = w.wait(Duration::from_millis(10));
        }
    }
    assert_eq!(holding(&watchers), usize::from(WAKE_SLOTS));
}

#[test]
fn a_waiter_without_a_slot_learns_of_a_commit_from_the_ledgers_stat() {
    let w = World::new(1, GI);
    let holders: Vec<_> = (0..WAKE_SLOTS)
        .map(|_| wake::LedgerWatcher::new(&w.state, None))
        .collect();
    assert!(holders.iter().all(|h| h.has_slot()));
    let mut watcher = wake::LedgerWatcher::new(&w.state, None);
    assert!(!watcher.has_slot());
    // Nothing changed: the wait runs out, false.
    assert!(!watcher.wait(3 * STAT_POLL));
    let committer = {
        let state = w.state.clone();
        std::thread::spawn(move || {
            std::thread::sleep(2 * STAT_POLL);
            // A change, or the commit writes nothing.
            let mut tx = state.begin().unwrap();
            tx.ledger.next_ticket += 1;
            assert!(tx.commit().unwrap().changed);
        })
    };
    let started = std::time::Instant::now();
    assert!(watcher.wait(Duration::from_secs(5)), "the commit was not seen");
    // Within a few stat polls of the commit, far inside the wait.
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    committer.join().unwrap();
    // And the same commit is not seen twice.
    assert!(!watcher.wait(2 * STAT_POLL));
}
