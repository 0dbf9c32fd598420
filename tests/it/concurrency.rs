//! Concurrency: 32 workers, each running 500 random operations (reserve, release, wait) as
//! real `vramgate-hook` processes against two simulated 8 GiB GPUs, all at once.
//!
//! The auditor sees every ledger state, not a sample: the hooks run with `VRAMGATE_AUDIT_LOG`,
//! which appends each committed ledger to a file while the ledger lock is still held (see
//! `ledger::AUDIT_LOG_ENV` for why inotify on the state dir would miss states). For every
//! state it checks: generations are consecutive (so none is missing), the reservations on each
//! GPU sum to at most its capacity, a container newly admitted had no older waiter on its
//! GPUs (first come, first served), and no admission waited longer than its timeout. Beside
//! it, an unlocked reader reads `ledger.json` in a loop and must never see a torn file.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;
use vramgate::ledger::{Ledger, AUDIT_LOG_ENV};
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const WORKERS: usize = 32;
const OPS_PER_WORKER: usize = 500;
const CAPACITY: u64 = 8 * GIB;
const GPUS: [&str; 2] = ["GPU-conc-0000", "GPU-conc-0001"];
/// The `wait` ops' timeout; short, so a worker never blocks the run for long.
const WAIT_TIMEOUT: Duration = Duration::from_millis(600);
/// Slack on top of a timeout before a waiter counts as starved (kept waiting past its
/// timeout): process start, the final locked transaction, and a loaded 2-core machine shared
/// with 32 busy processes ([`LOADED_MACHINE_BOUND`]). A waiter never let in or refused would
/// hold its worker for ever, well past it.
const STARVATION_SLACK: Duration = LOADED_MACHINE_BOUND;

#[derive(Default, Debug)]
struct Tally {
    admitted: usize,
    refused: usize,
    wait_timeouts: usize,
    released: usize,
    longest_wait: Duration,
}

fn bundle_name(gib: u64, gpus: &str, policy: &str) -> String {
    format!("{gib}g-{}-{policy}", gpus.replace(',', "+"))
}

#[test]
fn thirty_two_workers_never_overcommit_and_never_starve() {
    let gpu_config: String = GPUS
        .iter()
        .enumerate()
        .map(|(i, uuid)| format!("[[inventory.gpus]]\nindex = {i}\nuuid = \"{uuid}\"\ntotal = \"8Gi\"\n"))
        .collect();
    let mut scratch = harness(&format!(
        "policy = \"reject\"\n[queue]\npoll_interval = \"50ms\"\n[inventory]\nbackend = \"static\"\n{gpu_config}"
    ));
    let audit = scratch.dir().join("audit.jsonl");
    scratch.env.push((AUDIT_LOG_ENV.into(), audit.display().to_string()));
    let timeout = format!("{}ms", WAIT_TIMEOUT.as_millis());
    for gib in 1..=4u64 {
        for gpus in ["0", "1", "0,1"] {
            for policy in ["reject", "wait"] {
                let size = format!("{gib}Gi");
                scratch.bundle(
                    &bundle_name(gib, gpus, policy),
                    &[
                        ("vramgate.dev/memory", &size),
                        ("vramgate.dev/gpus", gpus),
                        ("vramgate.dev/policy", policy),
                        ("vramgate.dev/timeout", &timeout),
                    ],
                );
            }
        }
    }
    // Create the state dir before the storm, so the first hooks do not all race to create it.
    scratch.open_state();
    let scratch = Arc::new(scratch);
    let seed = Rng::seed_from_env();
    eprintln!("seed {seed} (replay with VRAMGATE_TEST_SEED={seed})");

    // The unlocked reader: atomic renames mean it only ever sees whole ledgers.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (scratch, stop) = (scratch.clone(), stop.clone());
        std::thread::spawn(move || {
            let dir = scratch.open_state();
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = dir.read() {
                    panic!("an unlocked read failed mid-run: {e}");
                }
                reads += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            reads
        })
    };

    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let scratch = scratch.clone();
            std::thread::spawn(move || worker(&scratch, w, seed.wrapping_add(w as u64 * 7919)))
        })
        .collect();
    let mut total = Tally::default();
    for w in workers {
        let t = w.join().expect("a worker failed");
        total.admitted += t.admitted;
        total.refused += t.refused;
        total.wait_timeouts += t.wait_timeouts;
        total.released += t.released;
        total.longest_wait = total.longest_wait.max(t.longest_wait);
    }
    stop.store(true, Ordering::Relaxed);
    let unlocked_reads = reader.join().expect("the unlocked reader failed");
    eprintln!(
        "{} ops in {:.1}s: {total:?}, {unlocked_reads} unlocked reads",
        WORKERS * OPS_PER_WORKER,
        started.elapsed().as_secs_f64()
    );

    let states = audit_every_state(&std::fs::read_to_string(&audit).unwrap());
    let last = scratch.ledger();
    assert_eq!(
        states.last().unwrap(),
        &last,
        "the audit log ends at the ledger on disk"
    );
    assert!(
        last.reservations.is_empty(),
        "every worker released what it held: {last:?}"
    );
    assert!(last.queue.is_empty(), "no ticket is left behind: {:?}", last.queue);
    // The run must have exercised every path, or it proves little.
    assert!(total.admitted > 1000 && total.refused > 100, "{total:?}");
    assert!(
        last.counters.admitted_after_wait > 50 && total.wait_timeouts > 0,
        "{total:?}, {:?}",
        last.counters
    );
    assert!(states.iter().any(|s| s.queue.len() >= 3), "waiters really queued");

    // The counters in the ledger (what metrics expose) agree with what the workers saw, one
    // for one, although 32 hooks raced to increment them.
    let c = &last.counters;
    assert_eq!(
        (c.admitted + c.admitted_after_wait, c.refused, c.timed_out, c.released),
        (
            total.admitted as u64,
            total.refused as u64,
            total.wait_timeouts as u64,
            total.released as u64
        ),
        "counters {c:?} against {total:?}"
    );
    assert_eq!((c.reclaimed, c.abandoned), (0, 0), "nobody died: {c:?}");
    assert_eq!(c.wait.count, c.admitted_after_wait);
    for pair in states.windows(2) {
        let (a, b) = (&pair[0].counters, &pair[1].counters);
        assert!(
            b.admitted >= a.admitted
                && b.admitted_after_wait >= a.admitted_after_wait
                && b.refused >= a.refused
                && b.timed_out >= a.timed_out
                && b.released >= a.released
                && b.wait.count >= a.wait.count,
            "generation {}: a counter went down: {a:?} -> {b:?}",
            pair[1].generation
        );
    }
}

fn worker(scratch: &HookHarness, w: usize, seed: u64) -> Tally {
    let mut rng = Rng::new(seed);
    let container = FakeContainer::start();
    let mut held: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut tally = Tally::default();
    for op in 0..OPS_PER_WORKER {
        let release = !held.is_empty() && (held.len() >= 2 || rng.chance(45));
        if release {
            let (id, bundle) = held.swap_remove(rng.below(held.len() as u64) as usize);
            let out = scratch.hook("poststop", &oci_state(&id, None, &bundle));
            assert!(out.status.success(), "release of {id} failed: {}", stderr(&out));
            tally.released += 1;
            continue;
        }
        let wait = rng.chance(20);
        let gib = 1 + rng.below(4);
        let gpus = ["0", "1", "0,1"][rng.below(3) as usize];
        let bundle = scratch.bundle_path(&bundle_name(gib, gpus, if wait { "wait" } else { "reject" }));
        let id = format!("w{w}-op{op}");
        let began = Instant::now();
        let out = scratch.hook("createRuntime", &oci_state(&id, Some(container.pid()), &bundle));
        let took = began.elapsed();
        let message = stderr(&out);
        match (out.status.code(), wait) {
            (Some(0), _) => {
                assert!(message.is_empty(), "an admission prints nothing: {message}");
                tally.admitted += 1;
                held.push((id.clone(), bundle));
            }
            (Some(1), false) => {
                assert!(message.starts_with("vramgate: refused container"), "{message}");
                tally.refused += 1;
            }
            (Some(1), true) => {
                assert!(
                    message.contains("(its timeout)"),
                    "a waiter is refused only on timeout: {message}"
                );
                tally.wait_timeouts += 1;
            }
            (code, _) => panic!("hook for {id} exited {code:?}: {message}"),
        }
        if wait {
            assert!(
                took <= WAIT_TIMEOUT + STARVATION_SLACK,
                "{id} waited {took:?}, past its {WAIT_TIMEOUT:?} timeout"
            );
            tally.longest_wait = tally.longest_wait.max(took);
        }
    }
    for (id, bundle) in held {
        let out = scratch.hook("poststop", &oci_state(&id, None, &bundle));
        assert!(out.status.success(), "{}", stderr(&out));
        tally.released += 1;
    }
    container.kill();
    tally
}

/// Parses the audit log and checks every state and every step between two states.
fn audit_every_state(log: &str) -> Vec<Ledger> {
    let states: Vec<Ledger> = log
        .lines()
        .map(|line| Ledger::parse(line.as_bytes(), std::path::Path::new("audit")).expect("every state parses"))
        .collect();
    assert!(states.len() > 5000, "only {} states audited", states.len());
    let mut previous: Option<&Ledger> = None;
    for state in &states {
        for gpu in GPUS {
            let reserved = state.reserved_on(gpu);
            assert!(
                reserved <= CAPACITY,
                "generation {}: {reserved} bytes reserved on {gpu}, more than its {CAPACITY}",
                state.generation
            );
        }
        for r in &state.reservations {
            assert!(
                Duration::from_millis(r.waited_ms) <= WAIT_TIMEOUT + STARVATION_SLACK,
                "{} was admitted after {} ms, past its timeout",
                r.container_id,
                r.waited_ms
            );
        }
        if let Some(prev) = previous {
            assert_eq!(
                state.generation,
                prev.generation + 1,
                "a state is missing from the audit"
            );
            check_first_come_first_served(prev, state);
        } else {
            assert_eq!(state.generation, 1, "the audit starts at the first commit");
        }
        previous = Some(state);
    }
    states
}

/// A reservation that appears in `next` had no older ticket on any of its GPUs in `prev` that
/// is still waiting in `next` (every waiter in this test is alive, so none is reclaimed).
fn check_first_come_first_served(prev: &Ledger, next: &Ledger) {
    for r in next
        .reservations
        .iter()
        .filter(|r| prev.reservation(&r.container_id).is_none())
    {
        let own_ticket = prev
            .queue
            .iter()
            .find(|t| t.container_id == r.container_id)
            .map(|t| t.ticket);
        let passed = prev.queue.iter().find(|t| {
            own_ticket.is_none_or(|mine| t.ticket < mine)
                && t.container_id != r.container_id
                && t.gpus.iter().any(|g| r.gpus.iter().any(|s| s.uuid == g.uuid))
                && next.queue.iter().any(|n| n.ticket == t.ticket)
        });
        assert!(
            passed.is_none(),
            "generation {}: {} was admitted ahead of older waiter {:?}",
            next.generation,
            r.container_id,
            passed
        );
    }
}
