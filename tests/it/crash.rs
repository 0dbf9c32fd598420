//! Crash safety: hooks SIGKILLed at random points of their work, at least 1,000 times.
//!
//! Four lanes run at once (so hooks are also killed while waiting for the lock another holds).
//! Each round starts a real process as the container's init, starts a real `vramgate-hook`
//! (admission, release, or a queued waiter) and SIGKILLs it after a random delay spread over a
//! hook's whole run: before it reads stdin, while it holds the lock, between writing the
//! temporary file and renaming it, after the rename. How long a run takes depends on the load
//! on the machine (CI runs other tests beside this one), so the span of the delays follows
//! where the kills land: wider while they land before the commit, narrower while hooks finish
//! first. Then:
//!
//! - the ledger parses (every read, from every lane, at every moment);
//! - every reservation whose hook exited 0, and whose container still runs, is in the ledger;
//! - a release whose hook exited 0 is gone from the ledger;
//! - after `vramgate gc` (the CLI binary), nothing of a killed hook's container (killed too)
//!   or of a killed waiter is left, and the survivors are all still there.

use crate::support;

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const LANES: usize = 4;
const MIN_KILLS: usize = 2000;
/// Admissions killed after their commit, and before it, that the run needs at least.
const MIN_EACH_SIDE_OF_THE_COMMIT: usize = 25;
/// A bound on the run, in case kills land too late to count (a very fast machine).
const MAX_ROUNDS_PER_LANE: usize = 4000;
const SURVIVORS_PER_LANE: usize = 8;
const BIG_GPU: &str = "GPU-crash-big";
const SMALL_GPU: &str = "GPU-crash-small";

struct Shared {
    scratch: HookHarness,
    kills: AtomicUsize,
    /// Where the kills landed: admissions killed after their commit (the reservation is in
    /// the ledger), before it, and with the temporary file written but not renamed.
    after_commit: AtomicUsize,
    before_commit: AtomicUsize,
    temp_left: AtomicUsize,
    /// Ids of containers that are dead and must be gone after gc.
    gone: Mutex<HashSet<String>>,
    /// The span of the random kill delays, in microseconds: first three typical uncontested
    /// hook runs, then adjusted by where the admissions' kills land.
    window_us: AtomicU64,
}

impl Shared {
    fn needs_more(&self) -> bool {
        self.kills.load(Ordering::Relaxed) < MIN_KILLS
            || self.after_commit.load(Ordering::Relaxed) < MIN_EACH_SIDE_OF_THE_COMMIT
            || self.before_commit.load(Ordering::Relaxed) < MIN_EACH_SIDE_OF_THE_COMMIT
    }

    /// Scales the delay span by `percent` / 100, within 50 µs and 2 s.
    fn scale_window(&self, percent: u64) {
        let _ = self.window_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            Some((w * percent / 100).clamp(50, 2_000_000))
        });
    }

    fn counts(&self) -> String {
        format!(
            "{} kills; admissions killed {} after their commit, {} before it; delay span now {} µs",
            self.kills.load(Ordering::Relaxed),
            self.after_commit.load(Ordering::Relaxed),
            self.before_commit.load(Ordering::Relaxed),
            self.window_us.load(Ordering::Relaxed)
        )
    }
}

#[test]
fn hooks_killed_at_random_points_never_corrupt_or_lose_the_ledger() {
    let scratch = harness(&format!(
        "policy = \"reject\"\n[queue]\npoll_interval = \"20ms\"\n[inventory]\nbackend = \"static\"\n\
         [[inventory.gpus]]\nindex = 0\nuuid = \"{BIG_GPU}\"\ntotal = \"1000Ti\"\n\
         [[inventory.gpus]]\nindex = 1\nuuid = \"{SMALL_GPU}\"\ntotal = \"1Gi\"\n"
    ));
    let admit = scratch.bundle("admit", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    // The small GPU is held full for the whole run, so every waiter on it queues.
    let full = scratch.bundle("full", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "1")]);
    scratch.bundle(
        "waiter",
        &[
            ("vramgate.dev/memory", "512Mi"),
            ("vramgate.dev/gpus", "1"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "30s"),
        ],
    );
    let holder = FakeContainer::start();
    let out = scratch.hook("createRuntime", &oci_state("holder", Some(holder.pid()), &full));
    assert!(out.status.success(), "{}", stderr(&out));

    // Time uncontested runs, so random delays span a whole hook run.
    let mut times = Vec::new();
    for i in 0..15 {
        let c = FakeContainer::start();
        let id = format!("warmup-{i}");
        let began = Instant::now();
        let out = scratch.hook("createRuntime", &oci_state(&id, Some(c.pid()), &admit));
        times.push(began.elapsed());
        assert!(out.status.success(), "{}", stderr(&out));
        let out = scratch.hook("poststop", &oci_state(&id, None, &admit));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    times.sort();
    let hook_time = times[times.len() / 2];
    let seed = Rng::seed_from_env();
    eprintln!("seed {seed} (replay with VRAMGATE_TEST_SEED={seed}); a hook run takes about {hook_time:?}");

    let shared = Arc::new(Shared {
        scratch,
        kills: AtomicUsize::new(0),
        after_commit: AtomicUsize::new(0),
        before_commit: AtomicUsize::new(0),
        temp_left: AtomicUsize::new(0),
        gone: Mutex::new(HashSet::new()),
        window_us: AtomicU64::new(hook_time.as_micros() as u64 * 3 + 1),
    });
    let started = Instant::now();
    let lanes: Vec<_> = (0..LANES)
        .map(|lane| {
            let shared = shared.clone();
            std::thread::spawn(move || run_lane(&shared, lane, seed.wrapping_add(lane as u64 * 104_729)))
        })
        .collect();
    let mut survivors = Vec::new();
    let mut rounds = 0;
    for lane in lanes {
        let (lane_survivors, lane_rounds) = lane.join().expect("a lane failed");
        survivors.extend(lane_survivors);
        rounds += lane_rounds;
    }
    eprintln!(
        "{rounds} rounds in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        shared.counts()
    );
    assert!(
        !shared.needs_more(),
        "too few kills landed where they must: {}",
        shared.counts()
    );
    let (after, before, temp) = (
        shared.after_commit.load(Ordering::Relaxed),
        shared.before_commit.load(Ordering::Relaxed),
        shared.temp_left.load(Ordering::Relaxed),
    );
    eprintln!(
        "killed admissions: {after} after their commit, {before} before it; {temp} times a killed hook left its temporary file"
    );

    let scratch = &shared.scratch;
    gc_and_check(
        scratch,
        &shared.gone.lock().unwrap(),
        survivors.iter().map(|(id, _)| id.as_str()),
    );
    // Finally every container stops: gc leaves the ledger holding only the small GPU's holder.
    for (_, c) in survivors {
        c.kill();
    }
    let out = scratch.cli(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ledger = scratch.ledger();
    assert_eq!(
        ledger
            .reservations
            .iter()
            .map(|r| r.container_id.as_str())
            .collect::<Vec<_>>(),
        ["holder"]
    );
    assert!(ledger.queue.is_empty(), "{:?}", ledger.queue);
    drop(holder);
}

fn run_lane(shared: &Shared, lane: usize, seed: u64) -> (Vec<(String, FakeContainer)>, usize) {
    let scratch = &shared.scratch;
    let mut rng = Rng::new(seed);
    let mut survivors: Vec<(String, FakeContainer)> = Vec::new();
    let mut round = 0;
    while shared.needs_more() && round < MAX_ROUNDS_PER_LANE {
        round += 1;
        let id = format!("l{lane}-r{round}");
        let window = shared.window_us.load(Ordering::Relaxed);
        let delay = Duration::from_micros(rng.below(window));
        let pick = rng.below(100);
        if pick < 15 && !survivors.is_empty() {
            // Kill a release: exited 0 means gone, killed means its container must be reclaimed.
            let (old_id, container) = survivors.swap_remove(rng.below(survivors.len() as u64) as usize);
            let status = spawn_and_kill(
                shared,
                "poststop",
                &oci_state(&old_id, None, &scratch.bundle_path("admit")),
                delay,
            );
            container.kill();
            if status.success() {
                assert!(
                    scratch.ledger().reservation(&old_id).is_none(),
                    "{old_id} was released (hook exited 0) but is still in the ledger"
                );
            }
            shared.gone.lock().unwrap().insert(old_id);
        } else if pick < 25 {
            // Kill a waiter, most likely while it sits in the queue.
            let container = FakeContainer::start();
            let delay = Duration::from_micros(rng.below(window * 4));
            let status = spawn_and_kill(
                shared,
                "createRuntime",
                &oci_state(&id, Some(container.pid()), &scratch.bundle_path("waiter")),
                delay,
            );
            assert!(!status.success(), "the small GPU is full: a waiter cannot be admitted");
            container.kill();
            shared.gone.lock().unwrap().insert(id);
        } else {
            let container = FakeContainer::start();
            let status = spawn_and_kill(
                shared,
                "createRuntime",
                &oci_state(&id, Some(container.pid()), &scratch.bundle_path("admit")),
                delay,
            );
            if status.success() {
                // The hook finished first: the span reaches past whole runs.
                shared.scale_window(98);
                survivors.push((id, container));
                if survivors.len() > SURVIVORS_PER_LANE {
                    let (old_id, old) = survivors.remove(0);
                    old.kill();
                    shared.gone.lock().unwrap().insert(old_id);
                }
            } else {
                let ledger = scratch.ledger();
                let counter = if ledger.reservation(&id).is_some() {
                    &shared.after_commit
                } else {
                    // Killed before its commit: the span falls short of whole runs.
                    shared.scale_window(102);
                    &shared.before_commit
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if scratch.state_dir.join("ledger.json.tmp").exists() {
                    shared.temp_left.fetch_add(1, Ordering::Relaxed);
                }
                container.kill();
                shared.gone.lock().unwrap().insert(id);
            }
        }
        // After every round: the ledger parses and no acknowledged reservation was lost.
        let ledger = match scratch.open_state().read() {
            Ok(l) => l,
            Err(e) => panic!("round {round} of lane {lane}: the ledger does not parse after a kill: {e}"),
        };
        for (sid, _) in &survivors {
            assert!(
                ledger.reservation(sid).is_some(),
                "{sid} was admitted (hook exited 0) and is missing after a kill"
            );
        }
        if round % 150 == 0 && lane == 0 {
            gc_and_check(scratch, &shared.gone.lock().unwrap().clone(), std::iter::empty());
        }
    }
    (survivors, round)
}

/// Starts a hook, SIGKILLs it after `delay` (unless it is done), and returns how it ended.
fn spawn_and_kill(shared: &Shared, stage: &str, state: &[u8], delay: Duration) -> std::process::ExitStatus {
    let mut child = shared.scratch.spawn_hook(stage, state);
    let deadline = Instant::now() + delay;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    if status.signal() == Some(9) {
        shared.kills.fetch_add(1, Ordering::Relaxed);
    } else {
        let mut err = String::new();
        use std::io::Read;
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        // A hook that finished must have finished cleanly: admitted, released, or (for a
        // waiter whose container was found dead) a one-line refusal.
        assert!(
            status.success() || err.starts_with("vramgate: "),
            "a hook that was not killed failed: {status:?} {err}"
        );
    }
    status
}

/// Runs `vramgate gc` and checks that every dead container's reservation and ticket is gone
/// and every survivor is still there.
fn gc_and_check<'a>(scratch: &HookHarness, gone: &HashSet<String>, survivors: impl Iterator<Item = &'a str>) {
    let out = scratch.cli(&["gc"]);
    assert!(out.status.success(), "vramgate gc failed: {}", stderr(&out));
    let ledger = scratch.ledger();
    for r in &ledger.reservations {
        assert!(
            !gone.contains(&r.container_id),
            "after gc, dead container {} still holds a reservation",
            r.container_id
        );
    }
    for t in &ledger.queue {
        assert!(
            !gone.contains(&t.container_id),
            "after gc, killed waiter {} still holds ticket {}",
            t.container_id,
            t.ticket
        );
    }
    for id in survivors {
        assert!(ledger.reservation(id).is_some(), "gc reclaimed live container {id}");
    }
}
