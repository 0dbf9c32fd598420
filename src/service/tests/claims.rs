//! A resource claim's own reservation: made at allocation, never reclaimed for a process (it
//! has none), taken over by the claim's first container, released at deallocation.

use super::*;
use crate::ledger::{ClaimOf, GpuShare};
use crate::service::ClaimReserved;

const UID: &str = "0b7c8c1e-4a53-4f0c-9d39-1f6a2d0c9e21";

fn claim() -> ClaimOf {
    ClaimOf {
        namespace: "default".into(),
        name: "trainer-gpu".into(),
        uid: UID.into(),
    }
}

fn share(gpu: u32, bytes: u64) -> Vec<GpuShare> {
    vec![GpuShare::new(format!("GPU-{gpu}"), bytes, 0)]
}

/// A container started for the claim: its checked claim device names the claim's uid.
fn claim_container_request(bytes: u64) -> Request {
    Request {
        claim_devices: vec![format!("{UID}-gpu-0")],
        ..request(bytes, "GPU-0")
    }
}

#[test]
fn a_claim_is_reserved_at_allocation_and_a_container_outside_it_cannot_take_its_memory() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    let reserved = s.reserve_claim(&claim(), &share(0, 6 * GI), Some("default/trainer/claim:trainer-gpu"));
    assert_eq!(reserved.unwrap(), ClaimReserved::Reserved);
    let ledger = w.state.read().unwrap();
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    assert_eq!(ledger.format_needed(), crate::ledger::FORMAT);
    // Asked again (a watch's second event): held already, nothing added.
    assert_eq!(
        s.reserve_claim(&claim(), &share(0, 6 * GI), None).unwrap(),
        ClaimReserved::AlreadyHeld
    );
    assert_eq!(w.state.read().unwrap().reserved_on("GPU-0"), 6 * GI);
    // A runc container of 4 GiB arriving now does not fit beside the claim.
    let outside = request(4 * GI, "GPU-0");
    let mut ledger = w.state.read().unwrap();
    let r = refusal(first_step(&s, &mut ledger, &admit_req("runc-1", 7, &outside, Policy::Reject)).0);
    assert!(r.to_string().contains("runc-1"), "{r}");
}

#[test]
fn a_claim_the_gpu_cannot_hold_now_is_refused_with_the_reason_and_nothing_is_reserved() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    w.inventory.use_outside(0, 4 * GI);
    let ClaimReserved::Refused(line) = s.reserve_claim(&claim(), &share(0, 6 * GI), None).unwrap() else {
        panic!("refused")
    };
    assert!(
        line.starts_with("vramgate: this node cannot hold resource claim default/trainer-gpu now: ")
            && line.contains("goes back to the scheduler")
            && !line.contains('\n'),
        "{line}"
    );
    assert_eq!(w.state.read().unwrap().reserved_on("GPU-0"), 0);
}

#[test]
fn a_claims_reservation_is_never_reclaimed_and_only_the_driver_releases_it() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    s.reserve_claim(&claim(), &share(0, 6 * GI), None).unwrap();
    // No process: every liveness says gone, and it stays.
    let mut ledger = w.state.read().unwrap();
    let reclaimed = ledger.reclaim_with(|_| false);
    assert!(reclaimed.reservations.is_empty());
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    assert_eq!(s.gc().unwrap().reservations.len(), 0);
    assert_eq!(s.claims_held().unwrap(), vec![(UID.to_string(), true)]);
    assert!(s.release_claim(UID, "resource claim deleted").unwrap());
    assert!(!s.release_claim(UID, "again").unwrap());
    assert_eq!(w.state.read().unwrap().reserved_on("GPU-0"), 0);
}

#[test]
fn the_claims_first_container_takes_its_reservation_over_counted_once_ahead_of_the_queue() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    s.reserve_claim(&claim(), &share(0, 6 * GI), None).unwrap();
    let mut ledger = w.state.read().unwrap();
    // A waiter of 4 GiB queues behind the claim.
    let other = request(4 * GI, "GPU-0");
    let _waiting = queued(&s, &mut ledger, &admit_req("waiter", 8, &other, Policy::Wait));
    let mine = claim_container_request(6 * GI);
    let (step, log) = first_step(&s, &mut ledger, &admit_req("ctr-1", 9, &mine, Policy::Reject));
    assert!(admitted(&step), "{step:?}");
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI, "counted once");
    assert!(ledger.claim_reservation(UID).is_none());
    assert!(ledger.claim_is_held(UID));
    let r = ledger.reservations.iter().find(|r| r.container_id == "ctr-1").unwrap();
    assert_eq!(r.took_over_claim.as_ref().map(|c| c.uid.as_str()), Some(UID));
    assert!(
        log.iter().any(|e| e.detail.contains("reserved at allocation")),
        "{log:?}"
    );
}

#[test]
fn a_container_of_another_claim_or_asking_more_does_not_take_the_reservation() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    s.reserve_claim(&claim(), &share(0, 2 * GI), None).unwrap();
    let mut ledger = w.state.read().unwrap();
    let more = claim_container_request(4 * GI);
    let (step, _) = first_step(&s, &mut ledger, &admit_req("ctr-2", 9, &more, Policy::Reject));
    assert!(admitted(&step), "{step:?}");
    assert!(ledger.claim_reservation(UID).is_some(), "left for the claim");
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
}

#[test]
fn a_second_container_of_the_claims_pod_refused_for_room_is_told_about_the_watch() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    s.reserve_claim(&claim(), &share(0, 6 * GI), None).unwrap();
    let mut ledger = w.state.read().unwrap();
    let mine = claim_container_request(6 * GI);
    assert!(admitted(
        &first_step(&s, &mut ledger, &admit_req("main", 9, &mine, Policy::Reject)).0
    ));
    // The pod's sidecar names the same claim; no watch runs, so it is counted whole.
    let side = refusal(first_step(&s, &mut ledger, &admit_req("side", 10, &mine, Policy::Reject)).0);
    assert!(matches!(side, Refusal::ClaimHeldTwice { .. }), "{side}");
    let line = side.to_string();
    assert!(line.contains("watch.enabled=true") && !line.contains('\n'), "{line}");
}

#[test]
fn a_claims_memory_goes_back_to_the_claim_when_its_container_leaves_and_a_restart_takes_it_again() {
    let w = World::new(1, 8 * GI);
    let s = w.service();
    s.reserve_claim(&claim(), &share(0, 6 * GI), Some("default/trainer/claim:trainer-gpu"))
        .unwrap();
    let mine = Request {
        name: Some("default/trainer/main".into()),
        ..claim_container_request(6 * GI)
    };
    let mut ledger = w.state.read().unwrap();
    assert!(admitted(
        &first_step(&s, &mut ledger, &admit_req("main", 9, &mine, Policy::Reject)).0
    ));
    // The container stops: the claim, still allocated, holds its memory again, under its name.
    let gone = ledger.remove_reservation("main").unwrap();
    assert_eq!(gone.took_over_claim, Some(claim()));
    let at = ledger.claim_reservation(UID).expect("handed back");
    assert_eq!(
        ledger.reservations[at].name.as_deref(),
        Some("default/trainer/claim:trainer-gpu")
    );
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    // A container outside the claim still finds no room...
    let outside = request(4 * GI, "GPU-0");
    let r = refusal(first_step(&s, &mut ledger, &admit_req("runc-1", 10, &outside, Policy::Reject)).0);
    assert!(r.to_string().contains("runc-1"), "{r}");
    // ...and the claim's restarted container takes it over again.
    assert!(admitted(
        &first_step(&s, &mut ledger, &admit_req("main-2", 11, &mine, Policy::Reject)).0
    ));
    assert!(ledger.claim_reservation(UID).is_none());
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
    // Reclaimed (its init gone without a stop seen): handed back the same way.
    let reclaimed = ledger.reclaim_with(|p| p.pid != 11);
    assert_eq!(reclaimed.reservations.len(), 1);
    assert!(ledger.claim_reservation(UID).is_some());
    assert_eq!(ledger.reserved_on("GPU-0"), 6 * GI);
}

#[test]
fn a_container_given_part_of_a_claim_takes_that_part_and_gives_it_back() {
    let w = World::new(2, 8 * GI);
    let s = w.service();
    let both = vec![GpuShare::new("GPU-0", 4 * GI, 0), GpuShare::new("GPU-1", 2 * GI, 0)];
    s.reserve_claim(&claim(), &both, None).unwrap();
    let mut ledger = w.state.read().unwrap();
    let part = Request {
        claim_devices: vec![format!("{UID}-gpu-1")],
        ..request(2 * GI, "GPU-1")
    };
    assert!(admitted(
        &first_step(&s, &mut ledger, &admit_req("part", 9, &part, Policy::Reject)).0
    ));
    let at = ledger.claim_reservation(UID).expect("the rest stays the claim's");
    assert_eq!(ledger.reservations[at].gpus, vec![GpuShare::new("GPU-0", 4 * GI, 0)]);
    assert_eq!(ledger.reserved_on("GPU-1"), 2 * GI, "counted once");
    ledger.remove_reservation("part").unwrap();
    let at = ledger.claim_reservation(UID).unwrap();
    assert_eq!(ledger.reservations[at].gpus, both);
}
