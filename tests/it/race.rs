//! Many hook processes racing on one simulated GPU never reserve more than it holds.
//!
//! Every ledger state is checked, not only the last: the event log is appended under the
//! ledger lock in commit order, so replaying it rebuilds every state the ledger went through;
//! a sampler also reads the live ledger file while the race runs.

use std::collections::HashMap;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vramgate_testbed::{feed, oci_state, FakeContainer, HookHarness};

use crate::support;

const CAPACITY: u64 = 24_265 << 20;
const REQUEST: u64 = 3 << 30;

/// Starts `n` hook processes at once for the given (container id, init pid) pairs.
fn race(host: &HookHarness, bundle: &Path, stage: &str, containers: &[(String, u32)]) -> Vec<(String, bool)> {
    let mut hooks: Vec<(String, Child)> = containers
        .iter()
        .map(|(id, _)| (id.clone(), host.hook_command(stage).spawn().unwrap()))
        .collect();
    // All processes exist before any gets its input, so they hit the lock together.
    for ((id, child), (_, pid)) in hooks.iter_mut().zip(containers) {
        feed(child, &oci_state(id, Some(*pid), bundle));
    }
    hooks
        .into_iter()
        .map(|(id, child)| {
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("panicked"), "{stderr}");
            if !out.status.success() {
                assert!(
                    stderr.contains("vramgate: refused container"),
                    "refused for the right reason: {stderr}"
                );
            }
            (id, out.status.success())
        })
        .collect()
}

/// Replays the event log and checks the reserved sum after every event.
fn replay_events(state_dir: &Path) -> (u64, usize) {
    let text = std::fs::read_to_string(state_dir.join("events.jsonl")).unwrap();
    let mut held: HashMap<String, u64> = HashMap::new();
    let mut max = 0;
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        let bytes: u64 = e["gpus"]
            .as_array()
            .map(|g| g.iter().map(|s| s["bytes"].as_u64().unwrap()).sum())
            .unwrap_or(0);
        let container = e["container"].as_str().unwrap().to_string();
        match e["event"].as_str().unwrap() {
            "admit" | "admit_after_wait" => {
                assert!(held.insert(container, bytes).is_none(), "admitted twice: {line}");
            }
            "release" | "reclaim" => {
                held.remove(&container).expect("released what was held");
            }
            _ => {}
        }
        let sum: u64 = held.values().sum();
        assert!(sum <= CAPACITY, "over capacity after {line}: {sum}");
        max = max.max(sum);
    }
    (max, held.len())
}

#[test]
fn twenty_four_hooks_race_and_never_over_commit() {
    let host = support::harness("");
    let bundle = host.bundle("c", &[("vramgate.dev/memory", "3Gi"), ("vramgate.dev/gpus", "0")]);
    let sleepers: Vec<FakeContainer> = (0..48).map(|_| FakeContainer::start()).collect();
    let round1: Vec<(String, u32)> = (0..24).map(|n| (format!("r1-{n}"), sleepers[n].pid())).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let ledger_path = host.state_dir.join("ledger.json");
        std::thread::spawn(move || {
            let mut samples = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(bytes) = std::fs::read(&ledger_path) {
                    let ledger: serde_json::Value = serde_json::from_slice(&bytes).expect("never a torn ledger");
                    let sum: u64 = ledger["reservations"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .flat_map(|r| {
                            r["gpus"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .map(|g| g["bytes"].as_u64().unwrap())
                        })
                        .sum();
                    assert!(sum <= CAPACITY, "sampled over capacity: {sum}");
                    samples += 1;
                }
            }
            samples
        })
    };

    let results = race(&host, &bundle, "createRuntime", &round1);
    let admitted: Vec<&String> = results.iter().filter(|r| r.1).map(|r| &r.0).collect();
    assert_eq!(
        admitted.len() as u64,
        CAPACITY / REQUEST,
        "exactly as many as fit: {admitted:?}"
    );

    // Round 2: the admitted ones stop while 24 new ones start, all at once.
    let stopping: Vec<(String, u32)> = round1
        .iter()
        .filter(|(id, _)| admitted.contains(&id))
        .cloned()
        .collect();
    let round2: Vec<(String, u32)> = (0..24).map(|n| (format!("r2-{n}"), sleepers[24 + n].pid())).collect();
    let host_ref = &host;
    let (released, results2) = std::thread::scope(|s| {
        let a = s.spawn(|| race(host_ref, &bundle, "poststop", &stopping));
        let b = s.spawn(|| race(host_ref, &bundle, "createRuntime", &round2));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(released.iter().all(|r| r.1), "every poststop succeeds");
    let admitted2 = results2.iter().filter(|r| r.1).count() as u64;
    assert!(admitted2 >= 1 && admitted2 <= CAPACITY / REQUEST, "{admitted2}");

    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    assert!(samples > 0);

    let (max, held) = replay_events(&host.state_dir);
    assert_eq!(held as u64, admitted2, "the log and the ledger agree");
    assert!(max <= CAPACITY && max >= 7 * REQUEST);
    let ledger: serde_json::Value =
        serde_json::from_slice(&std::fs::read(host.state_dir.join("ledger.json")).unwrap()).unwrap();
    assert_eq!(ledger["reservations"].as_array().unwrap().len() as u64, admitted2);
}
