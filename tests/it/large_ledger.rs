//! A ledger larger than one transaction's reclaim window (`ledger::RECLAIM_WINDOW`): dead
//! entries still leave within a bounded number of writes, and a request that needs their room
//! is never refused because they were not checked yet.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramgate::ledger::{GpuShare, Ledger, Reservation, StateDir, RECLAIM_WINDOW};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

use crate::support;

const LIVE: usize = 300;

/// A scratch host with one bundle, which requests `request` on GPU 0.
fn host(request: &str) -> (HookHarness, PathBuf) {
    let h = support::harness("");
    let bundle = h.bundle("c", &[("vramgate.dev/memory", request), ("vramgate.dev/gpus", "0")]);
    (h, bundle)
}

/// Runs the hook for container `id` whose init is `pid`; returns (exit 0, stderr). Poststop
/// gets the same state with the pid: it releases by id either way.
fn hook(h: &HookHarness, bundle: &Path, stage: &str, id: &str, pid: u32) -> (bool, String) {
    let out = h.hook(stage, &oci_state(id, Some(pid), bundle));
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn reservation(id: &str, init: ProcessIdentity, bytes: u64) -> Reservation {
    let gpus = vec![GpuShare {
        uuid: vramgate::config::SIMULATED_GPU_UUID.into(),
        bytes,
        limit: None,
    }];
    Reservation::held(id, gpus, init)
}

/// An identity that was a real process and is gone now.
fn dead_identity() -> ProcessIdentity {
    let mut child = Command::new("true").spawn().unwrap();
    let id = ProcessIdentity {
        pid: child.id(),
        start_time: 1,
    };
    child.wait().unwrap();
    id
}

/// Fills the ledger with `LIVE` small live reservations, then `dead` at the end.
fn fill(state: &StateDir, live: &ProcessIdentity, dead: Reservation) {
    let mut tx = state.begin().unwrap();
    tx.ledger = Ledger::default();
    for n in 0..LIVE {
        tx.ledger
            .reservations
            .push(reservation(&format!("live-{n}"), *live, 1 << 20));
    }
    tx.ledger.reservations.push(dead);
    drop(tx.commit().unwrap());
}

#[test]
fn a_request_that_needs_dead_room_gets_it_at_once() {
    assert!(LIVE > RECLAIM_WINDOW);
    let (h, bundle) = host("10Gi");
    let state = StateDir::open_or_create(&h.state_dir).unwrap();
    let live = FakeContainer::start();
    let live_id = ProcessIdentity::of(live.pid()).unwrap();
    fill(&state, &live_id, reservation("dead-big", dead_identity(), 20 << 30));

    // 300 MiB live + 20 GiB dead: 10 GiB fits only once the dead entry is reclaimed.
    let (ok, stderr) = hook(&h, &bundle, "createRuntime", "needs-room", live.pid());
    assert!(ok, "{stderr}");
    let ledger = state.read().unwrap();
    assert!(ledger.reservation("dead-big").is_none());
    assert!(ledger.reservation("needs-room").is_some());
    assert_eq!(ledger.reservations.len(), LIVE + 1, "no live entry lost");
    let events = std::fs::read_to_string(state.path().join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"reclaim\"") && events.contains("dead-big"),
        "{events}"
    );
    live.kill();
}

#[test]
fn a_dead_entry_leaves_within_a_bounded_number_of_writes() {
    let (h, bundle) = host("1Mi");
    let state = StateDir::open_or_create(&h.state_dir).unwrap();
    let live = FakeContainer::start();
    let live_id = ProcessIdentity::of(live.pid()).unwrap();
    fill(&state, &live_id, reservation("dead-small", dead_identity(), 1 << 20));

    let bound = (LIVE + 1).div_ceil(RECLAIM_WINDOW) + 1;
    let mut writes = 0;
    while state.read().unwrap().reservation("dead-small").is_some() {
        assert!(writes < bound * 2, "still there after {writes} admit+release pairs");
        // Each admit and each release is a committed write that moves the window on.
        assert!(hook(&h, &bundle, "createRuntime", "churn", live.pid()).0);
        assert!(hook(&h, &bundle, "poststop", "churn", live.pid()).0);
        writes += 2;
    }
    assert!(
        writes <= bound + 1,
        "{writes} writes for a ledger of {} (bound {bound})",
        LIVE + 1
    );
    assert_eq!(state.read().unwrap().reservations.len(), LIVE);
    live.kill();
}
