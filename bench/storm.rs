//! The storm benchmark (run it with `bench/storm.sh`): real `vramgate-hook` processes, real
//! `sleep` processes as the containers' init, the OCI state on stdin as runc writes it.
//!
//! 1. Storms: 64 container starts at once on one simulated 24,265 MiB GPU, each with a
//!    request, the hooks released together behind a barrier. Checked: every start was decided
//!    correctly (exactly as many admitted as fit, the rest refused with a message, the ledger
//!    holding exactly the admitted ones, never over capacity). Measured: admissions per
//!    second and the hook latency distribution (target: p99 <= 50 ms).
//! 2. A ledger of 1,000 live reservations: sequential admissions and releases, each a whole
//!    hook run (target: median <= 5 ms), beside the same on an empty ledger.

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use vramgate::ledger::{GpuShare, Reservation};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");
const STORM: usize = 64;
const GPU_MIB: u64 = 24_265;

/// A scratch host (on tmpfs, as /run is) with one static GPU of `gpu_total`, policy reject.
fn host(gpu_total: &str) -> HookHarness {
    HookHarness::new(
        HOOK,
        &format!(
            "policy = \"reject\"\n[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-storm\"\ntotal = \"{gpu_total}\""
        ),
    )
}

/// A bundle that requests `memory` on GPU 0.
fn request_bundle(host: &HookHarness, memory: &str) -> PathBuf {
    host.bundle(
        &format!("bundle-{memory}"),
        &[("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")],
    )
}

/// Runs one hook to the end; returns its latency (spawn to exit), exit code and stderr.
fn hook(host: &HookHarness, stage: &str, id: &str, pid: Option<u32>, bundle: &Path) -> (Duration, Option<i32>, String) {
    let state = oci_state(id, pid, bundle);
    let began = Instant::now();
    let out = host.hook(stage, &state);
    let took = began.elapsed();
    (
        took,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// One storm of 64 starts of `memory` MiB each; returns (latencies, admitted, wall time).
fn storm(
    bench: &HookHarness,
    memory_mib: u64,
    round: usize,
    inits: &[FakeContainer],
) -> (Vec<Duration>, usize, Duration) {
    let bundle = request_bundle(bench, &format!("{memory_mib}Mi"));
    let barrier = Barrier::new(STORM + 1);
    let (results, wall) = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..STORM)
            .map(|i| {
                let (barrier, bundle) = (&barrier, &bundle);
                let pid = inits[i].pid();
                scope.spawn(move || {
                    barrier.wait();
                    let id = format!("storm{round}-{i}");
                    let (took, code, err) = hook(bench, "createRuntime", &id, Some(pid), bundle);
                    (id, took, code, err)
                })
            })
            .collect();
        barrier.wait();
        let began = Instant::now();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        (results, began.elapsed())
    });

    // Every start decided correctly.
    let fit = (GPU_MIB / memory_mib).min(STORM as u64) as usize;
    let admitted: Vec<_> = results.iter().filter(|r| r.2 == Some(0)).map(|r| r.0.clone()).collect();
    for (id, _, code, err) in &results {
        assert!(
            *code == Some(0) || (*code == Some(1) && err.starts_with("vramgate: refused container")),
            "{id}: exit {code:?}: {err}"
        );
    }
    assert_eq!(admitted.len(), fit, "exactly the {fit} that fit are admitted");
    let ledger = bench.ledger();
    let mut in_ledger: Vec<_> = ledger.reservations.iter().map(|r| r.container_id.clone()).collect();
    let mut expected = admitted.clone();
    in_ledger.sort();
    expected.sort();
    assert_eq!(in_ledger, expected, "the ledger holds exactly the admitted containers");
    assert!(ledger.reserved_on("GPU-storm") <= GPU_MIB << 20);

    // Release them all for the next round.
    for id in &admitted {
        let (_, code, err) = hook(bench, "poststop", id, None, &bundle);
        assert_eq!(code, Some(0), "{err}");
    }
    let mut latencies: Vec<_> = results.iter().map(|r| r.1).collect();
    latencies.sort();
    (latencies, admitted.len(), wall)
}

fn run_storms(rounds: usize) {
    let bench = host(&format!("{GPU_MIB}Mi"));
    let inits: Vec<FakeContainer> = (0..STORM).map(|_| FakeContainer::start()).collect();
    for (label, memory) in [
        ("all fit (64 x 378 MiB)", 378),
        ("oversubscribed (64 x 1205 MiB)", 1205),
    ] {
        let mut all = Vec::new();
        let (mut admitted, mut wall) = (0, Duration::ZERO);
        for round in 0..rounds {
            let (lat, n, w) = storm(&bench, memory, round, &inits);
            all.extend(lat);
            admitted += n;
            wall += w;
        }
        all.sort();
        println!(
            "storm {label}: {rounds} rounds, {admitted} admitted, {} refused, all decided correctly; \
             {:.0} admissions/s, {:.0} decisions/s; hook latency p50 {} p99 {} max {}",
            rounds * STORM - admitted,
            admitted as f64 / wall.as_secs_f64(),
            (rounds * STORM) as f64 / wall.as_secs_f64(),
            ms(percentile(&all, 50.0)),
            ms(percentile(&all, 99.0)),
            ms(*all.last().unwrap()),
        );
    }
}

fn run_big_ledger(live: usize, samples: usize) {
    let init = FakeContainer::start();
    let identity = ProcessIdentity::of(init.pid()).unwrap();
    for prefill in [0, live] {
        let bench = host("1000Ti");
        let dir = bench.open_state();
        let mut tx = dir.begin().unwrap();
        for i in 0..prefill {
            // Ids as long as Docker's (64 hex characters), so the file has a real size.
            tx.ledger.reservations.push(Reservation::new(
                format!("{i:064x}"),
                vec![GpuShare::new("GPU-storm", 1 << 30, 0)],
                identity,
                vramgate::ledger::now_unix_ms(),
            ));
        }
        drop(tx.commit().unwrap());
        let size = std::fs::metadata(dir.ledger_path()).map(|m| m.len()).unwrap_or(0);
        let bundle = request_bundle(&bench, "1Gi");
        let (mut admit, mut release) = (Vec::new(), Vec::new());
        for i in 0..samples {
            let id = format!("sample-{i}");
            let (took, code, err) = hook(&bench, "createRuntime", &id, Some(init.pid()), &bundle);
            assert_eq!(code, Some(0), "{err}");
            admit.push(took);
            let (took, code, err) = hook(&bench, "poststop", &id, None, &bundle);
            assert_eq!(code, Some(0), "{err}");
            release.push(took);
        }
        admit.sort();
        release.sort();
        assert_eq!(dir.read().unwrap().reservations.len(), prefill);
        println!(
            "ledger of {prefill} live reservations ({} KiB): {samples} admissions median {} p99 {}; releases median {} p99 {}",
            size / 1024,
            ms(percentile(&admit, 50.0)),
            ms(percentile(&admit, 99.0)),
            ms(percentile(&release, 50.0)),
            ms(percentile(&release, 99.0)),
        );
    }
}

fn main() {
    // cargo bench passes `--bench`; our own flags are plain numbers.
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rounds = numbers.first().copied().unwrap_or(5);
    let samples = numbers.get(1).copied().unwrap_or(200);
    println!(
        "vramgate storm bench: hook {HOOK}, {} CPUs",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    run_storms(rounds);
    run_big_ledger(1000, samples);
}
