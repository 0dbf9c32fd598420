//! A ledger larger than one transaction's reclaim window (`ledger::RECLAIM_WINDOW`): dead
//! entries still leave within a bounded number of writes, and a request that needs their room
//! is never refused because they were not checked yet.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use vramgate::ledger::{GpuShare, Ledger, Reservation, StateDir, RECLAIM_WINDOW};
use vramgate::procfs::ProcessIdentity;

const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");
const LIVE: usize = 300;

struct Host {
    _dir: tempfile::TempDir,
    config: PathBuf,
    state: StateDir,
    bundle: PathBuf,
}

fn host(request: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("state_dir = {:?}\n", state_dir.display().to_string())).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        format!(r#"{{"annotations":{{"vramgate.dev/memory":"{request}","vramgate.dev/gpus":"0"}}}}"#),
    )
    .unwrap();
    let state = StateDir::open_or_create(&state_dir).unwrap();
    Host {
        _dir: dir,
        config,
        state,
        bundle,
    }
}

fn hook(host: &Host, stage: &str, id: &str, pid: u32) -> (bool, String) {
    let mut child = Command::new(HOOK)
        .arg(stage)
        .env("VRAMGATE_CONFIG", &host.config)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let state = format!(
        r#"{{"ociVersion":"1.0.2","id":"{id}","pid":{pid},"bundle":"{}"}}"#,
        host.bundle.display()
    );
    child.stdin.take().unwrap().write_all(state.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn reservation(id: &str, init: ProcessIdentity, bytes: u64) -> Reservation {
    Reservation {
        container_id: id.into(),
        gpus: vec![GpuShare {
            uuid: vramgate::config::SIMULATED_GPU_UUID.into(),
            bytes,
        }],
        init,
        created_unix_ms: 0,
        waited_ms: 0,
    }
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
fn fill(host: &Host, live: &ProcessIdentity, dead: Reservation) {
    let mut tx = host.state.begin().unwrap();
    tx.ledger = Ledger::default();
    for n in 0..LIVE {
        tx.ledger
            .reservations
            .push(reservation(&format!("live-{n}"), *live, 1 << 20));
    }
    tx.ledger.reservations.push(dead);
    tx.commit().unwrap();
}

fn sleeper() -> Child {
    Command::new("sleep").arg("120").spawn().unwrap()
}

#[test]
fn a_request_that_needs_dead_room_gets_it_at_once() {
    assert!(LIVE > RECLAIM_WINDOW);
    let h = host("10Gi");
    let mut live = sleeper();
    let live_id = ProcessIdentity::of(live.id()).unwrap();
    fill(&h, &live_id, reservation("dead-big", dead_identity(), 20 << 30));

    // 300 MiB live + 20 GiB dead: 10 GiB fits only once the dead entry is reclaimed.
    let (ok, stderr) = hook(&h, "createRuntime", "needs-room", live.id());
    assert!(ok, "{stderr}");
    let ledger = h.state.read().unwrap();
    assert!(ledger.reservation("dead-big").is_none());
    assert!(ledger.reservation("needs-room").is_some());
    assert_eq!(ledger.reservations.len(), LIVE + 1, "no live entry lost");
    let events = std::fs::read_to_string(h.state.path().join("events.jsonl")).unwrap();
    assert!(
        events.contains("\"reclaim\"") && events.contains("dead-big"),
        "{events}"
    );
    let _ = live.kill();
    let _ = live.wait();
}

#[test]
fn a_dead_entry_leaves_within_a_bounded_number_of_writes() {
    let h = host("1Mi");
    let mut live = sleeper();
    let live_id = ProcessIdentity::of(live.id()).unwrap();
    fill(&h, &live_id, reservation("dead-small", dead_identity(), 1 << 20));

    let bound = (LIVE + 1).div_ceil(RECLAIM_WINDOW) + 1;
    let mut writes = 0;
    while h.state.read().unwrap().reservation("dead-small").is_some() {
        assert!(writes < bound * 2, "still there after {writes} admit+release pairs");
        // Each admit and each release is a committed write that moves the window on.
        assert!(hook(&h, "createRuntime", "churn", live.id()).0);
        assert!(hook(&h, "poststop", "churn", live.id()).0);
        writes += 2;
    }
    assert!(
        writes <= bound + 1,
        "{writes} writes for a ledger of {} (bound {bound})",
        LIVE + 1
    );
    assert_eq!(h.state.read().unwrap().reservations.len(), LIVE);
    let _ = live.kill();
    let _ = live.wait();
}
