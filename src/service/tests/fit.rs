//! Admit or refuse: what fits a card, what the card's other users and the limits hold back,
//! the same container twice, a GPU the host lacks.

use super::*;

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
        outcomes.push(first_step(&service, &mut ledger, &req).0);
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
fn the_same_container_twice_is_idempotent_and_a_live_namesake_is_refused() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let r = request(GI, "0");
    let _ = first_step(&service, &mut ledger, &admit_req("c", 1, &r, Policy::Reject));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("c", 1, &r, Policy::Reject));
    assert!(matches!(s, Ok(Step::Done(Admission::AlreadyAdmitted))));
    let (s, _) = first_step(&service, &mut ledger, &admit_req("c", 2, &r, Policy::Reject));
    assert_eq!(
        refusal(s).to_string(),
        "vramgate: refused container c: a live container with the same id (init pid 1) already holds a reservation"
    );
    // Once the first one is gone, its namesake is admitted in its place.
    w.liveness.gone.borrow_mut().insert(1);
    let (s, _) = first_step(&service, &mut ledger, &admit_req("c", 2, &r, Policy::Reject));
    assert!(admitted(&s));
    assert_eq!(ledger.reservations[0].init, pid(2));
}

#[test]
fn before_refusing_for_lack_of_room_every_reservation_is_checked() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mut ledger = Ledger::default();
    let big = request(8 * GI, "0");
    let _ = first_step(&service, &mut ledger, &admit_req("dead", 1, &big, Policy::Reject));
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
        None,
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
    let (s, _) = first_step(&service, &mut Ledger::default(), &admit_req("c", 1, &r, Policy::Reject));
    let line = refusal(s).to_string();
    assert!(line.contains("5120 MiB used outside vramgate"), "{line}");
    w.inventory.use_outside(0, 0);
    let (s, _) = first_step(&service, &mut Ledger::default(), &admit_req("c", 1, &r, Policy::Reject));
    assert!(admitted(&s));
}

#[test]
fn a_gpu_the_host_lacks_is_a_request_error_that_drops_the_ticket() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let r = request(GI, "3");
    let err = first_step(&service, &mut Ledger::default(), &admit_req("c", 1, &r, Policy::Reject))
        .0
        .err()
        .expect("no GPU 3");
    assert!(
        matches!(err, ServiceError::Request { .. }) && !err.is_state_error(),
        "{err}"
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
    let (first, log) = first_step(&service, &mut ledger, &admit_req("a", 1, &r, Policy::Reject));
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
    let second = refusal(first_step(&service, &mut ledger, &admit_req("b", 2, &r, Policy::Reject)).0);
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
    let third = refusal(first_step(&service, &mut ledger, &admit_req("c", 3, &r, Policy::Reject)).0);
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
        first_step(
            &service,
            &mut Ledger::default(),
            &admit_req("d", 4, &huge, Policy::Wait),
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

/// A pod's second container given the claim its first holds is admitted on a GPU that could
/// not hold the claim twice, ahead of a waiter (it takes nothing), and recorded as a holder;
/// another pod's container given the same devices, or the pod's container with another
/// amount, is decided by the rules and finds no room.
#[test]
fn a_pods_second_holder_of_a_claim_joins_it_and_no_one_else_does() {
    let mut w = World::new(1, 10 * GI);
    w.config.enforce.over_use = crate::config::OverUseAction::Kill;
    watch_beats(&w);
    let service = w.service();
    let (mine, other_pod, other_amount) = (claim("pod-1", 6 * GI), claim("pod-2", 6 * GI), claim("pod-1", 7 * GI));
    let mut ledger = Ledger::default();
    let first = reject_once(&service, &mut ledger, "app", 1, &mine);
    assert!(admitted(&first.0));
    // A waiter for 5 GiB is queued behind the claim's 6.
    let plain = request(5 * GI, "0");
    let _waiting = queued(&service, &mut ledger, &admit_req("waiter", 2, &plain, Policy::Wait));
    let joined = reject_once(&service, &mut ledger, "sidecar", 3, &mine);
    assert!(admitted(&joined.0), "{:?}", joined.0);
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    assert!(ledger.reservations.iter().all(|r| r.claim
        == Some(crate::ledger::ClaimHold {
            pod: "pod-1".into(),
            devices: vec!["u-gpu-0".into()]
        })));
    for (id, n, req) in [("elsewhere", 4, &other_pod), ("more", 5, &other_amount)] {
        let refused = refusal(reject_once(&service, &mut ledger, id, n, req).0);
        assert!(matches!(refused, Refusal::NoRoom { .. }), "{id}: {refused}");
    }
    // A container outside any pod never joins, whatever it names.
    let outside = Request {
        pod_sandbox: None,
        ..mine.clone()
    };
    let refused = refusal(reject_once(&service, &mut ledger, "outside", 6, &outside).0);
    assert!(matches!(refused, Refusal::NoRoom { .. }), "{refused}");
}

/// A watch measuring now, as `vramgate watch` leaves it after a pass: its heartbeat written,
/// and the world's clock set to the time it was written at.
fn watch_beats(w: &World) {
    crate::service::beat(&w.state, &mut false).unwrap();
    w.clock.unix_ms.set(crate::clock::now_unix_ms());
}

/// A claim's holders count once only while a watch is seen running (its heartbeat fresh), not
/// because the config says `kill`: a watch never started, or stopped, stops no one. Without
/// one the pod's second holder is counted whole (and does not fit); with one it joins; once
/// the heartbeat is stale, the holds recorded count whole again, so what fit beside the claim
/// held once does not.
#[test]
fn a_claim_is_held_once_only_while_a_watch_is_seen_running() {
    let mut w = World::new(1, 10 * GI);
    w.config.enforce.over_use = crate::config::OverUseAction::Kill;
    w.clock.unix_ms.set(crate::clock::now_unix_ms());
    let service = w.service();
    let mine = claim("pod-1", 6 * GI);
    // No watch has measured: `kill` in the config alone holds nothing once.
    let mut ledger = Ledger::default();
    assert!(admitted(&reject_once(&service, &mut ledger, "app", 1, &mine).0));
    assert_eq!(ledger.reservations[0].claim, None);
    let refused = refusal(reject_once(&service, &mut ledger, "sidecar", 2, &mine).0);
    assert!(matches!(refused, Refusal::NoRoom { .. }), "{refused}");

    // A watch runs: the pod's second container joins the claim.
    watch_beats(&w);
    let mut ledger = Ledger::default();
    assert!(admitted(&reject_once(&service, &mut ledger, "app", 1, &mine).0));
    assert!(admitted(&reject_once(&service, &mut ledger, "sidecar", 2, &mine).0));
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    let small = request(GI, "0");
    let mut beside = ledger.clone();
    assert!(admitted(&reject_once(&service, &mut beside, "small", 3, &small).0));

    // The watch stops: past the heartbeat's window both holders count whole (12 GiB of 10),
    // and 1 GiB beside them no longer fits.
    let window = crate::service::heartbeat_window(w.config.enforce.over_use_interval).as_millis() as u64;
    w.clock.unix_ms.set(w.clock.unix_ms.get() + window + 1);
    let refused = refusal(reject_once(&service, &mut ledger, "small", 3, &small).0);
    assert!(matches!(refused, Refusal::NoRoom { .. }), "{refused}");
}

/// Where `vramgate watch` does not stop a pod's holders together (`over_use` other than
/// `kill`), each container's tier holds it alone to the claim's limit: the pod's containers
/// could use that limit each, so each is counted whole and no hold is recorded.
#[test]
fn a_claim_is_held_once_only_where_the_watch_stops_its_holders_together() {
    let w = World::new(1, 10 * GI);
    let service = w.service();
    let mine = claim("pod-1", 6 * GI);
    let mut ledger = Ledger::default();
    let first = reject_once(&service, &mut ledger, "app", 1, &mine);
    assert!(admitted(&first.0));
    assert_eq!(ledger.reservations[0].claim, None);
    let refused = refusal(reject_once(&service, &mut ledger, "sidecar", 2, &mine).0);
    assert!(matches!(refused, Refusal::NoRoom { .. }), "{refused}");
}

/// A request for `bytes` on GPU 0 by a container of pod `pod` given the claim's device
/// `u-gpu-0`.
fn claim(pod: &str, bytes: u64) -> Request {
    Request {
        claim_devices: vec!["u-gpu-0".into()],
        pod_sandbox: Some(pod.into()),
        ..request(bytes, "0")
    }
}

/// One attempt of `req` for container `id` (init pid `n`) under policy `reject`.
fn reject_once(service: &Service, ledger: &mut Ledger, id: &str, n: u32, req: &Request) -> (Result<Step>, Vec<Event>) {
    step(
        service,
        ledger,
        &admit_req(id, n, req, Policy::Reject),
        &mut Progress::default(),
    )
}
