//! Placement by the runtime wrapper: best fit, spread, the hook's confirmation, and a
//! pending reservation whose create died.

use super::*;

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
    let (s, log) = first_step(&service, &mut ledger, &placing("a", 7, &auto, Policy::Reject));
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
    let (s, log) = first_step(&service, &mut ledger, &hook);
    assert!(matches!(s, Ok(Step::Done(Admission::Confirmed { .. }))), "{s:?}");
    assert_eq!(log[0].event, Kind::Confirm);
    assert_eq!(ledger.reservations.len(), 1);
    assert!(!ledger.reservations[0].pending && ledger.reservations[0].init == pid(500));

    // Fill: the next 10 GiB goes to GPU 1 again (10 left), then GPU 2 (50 → 40).
    let (s, _) = first_step(&service, &mut ledger, &placing("b", 8, &auto, Policy::Reject));
    assert_eq!(placed_on(&s), ["GPU-1"]);
    let (s, _) = first_step(&service, &mut ledger, &placing("c", 9, &auto, Policy::Reject));
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
        let (s, _) = first_step(&service, &mut ledger, &placing(id, n as u32 + 1, &auto, Policy::Reject));
        chosen.extend(placed_on(&s));
    }
    assert_eq!(chosen, ["GPU-1", "GPU-2", "GPU-1", "GPU-2"]);
    // Two GPUs for one job: both at once, the amount on each.
    let two = request(5 * GI, "auto:2");
    let (s, _) = first_step(&service, &mut ledger, &placing("e", 9, &two, Policy::Reject));
    assert_eq!(placed_on(&s), ["GPU-0", "GPU-1"]);
}

#[test]
fn a_placement_no_gpu_can_hold_names_the_largest_gpu() {
    let w = World::new(2, 10 * GI);
    let service = w.service();
    let auto = request(12 * GI, "auto");
    let (s, _) = first_step(
        &service,
        &mut Ledger::default(),
        &placing("huge", 1, &auto, Policy::Wait),
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
    let (s, _) = first_step(&service, &mut ledger, &placing("later", 2, &fits_later, Policy::Reject));
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
    let err = match first_step(
        &service,
        &mut Ledger::default(),
        &admit_req("x", 1, &auto, Policy::Reject),
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
