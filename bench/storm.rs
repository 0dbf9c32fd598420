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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::json;
use vramgate::ledger::{GpuShare, Reservation, StateDir};
use vramgate::procfs::ProcessIdentity;

const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");
const STORM: usize = 64;
const GPU_MIB: u64 = 24_265;

struct Bench {
    dir: PathBuf,
    config: PathBuf,
    state: PathBuf,
}

impl Bench {
    fn new(name: &str, gpu_total: &str) -> Bench {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let dir = PathBuf::from(base).join(format!("vramgate-storm-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("state");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = {:?}\npolicy = \"reject\"\n[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-storm\"\ntotal = \"{gpu_total}\"\n",
                state.display().to_string()
            ),
        )
        .unwrap();
        Bench { dir, config, state }
    }

    fn bundle(&self, memory: &str) -> PathBuf {
        let bundle = self.dir.join(format!("bundle-{memory}"));
        std::fs::create_dir_all(&bundle).unwrap();
        let spec = json!({"ociVersion": "1.0.2", "process": {"args": ["sleep", "1"]},
            "annotations": {"vramgate.dev/memory": memory, "vramgate.dev/gpus": "0"}});
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        bundle
    }

    /// Runs one hook to the end; returns its latency, exit code and stderr.
    fn hook(&self, stage: &str, id: &str, pid: Option<u32>, bundle: &Path) -> (Duration, Option<i32>, String) {
        let mut state = json!({"ociVersion": "1.0.2", "id": id, "bundle": bundle,
            "status": if pid.is_some() { "creating" } else { "stopped" }});
        if let Some(pid) = pid {
            state["pid"] = json!(pid);
        }
        let began = Instant::now();
        let mut child = Command::new(HOOK)
            .arg(stage)
            .env("VRAMGATE_CONFIG", &self.config)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let took = began.elapsed();
        (
            took,
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sleeper() -> Child {
    // Its stdio is not ours: a leaked sleeper must not hold the caller's pipes open.
    Command::new("sleep")
        .arg("3600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// One storm of 64 starts of `memory` MiB each; returns (latencies, admitted, wall time).
fn storm(bench: &Bench, memory_mib: u64, round: usize, inits: &[Child]) -> (Vec<Duration>, usize, Duration) {
    let bundle = bench.bundle(&format!("{memory_mib}Mi"));
    let barrier = Barrier::new(STORM + 1);
    let (results, wall) = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..STORM)
            .map(|i| {
                let (barrier, bundle) = (&barrier, &bundle);
                let pid = inits[i].id();
                scope.spawn(move || {
                    barrier.wait();
                    let id = format!("storm{round}-{i}");
                    let (took, code, err) = bench.hook("createRuntime", &id, Some(pid), bundle);
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
    let ledger = StateDir::open_or_create(&bench.state).unwrap().read().unwrap();
    let mut in_ledger: Vec<_> = ledger.reservations.iter().map(|r| r.container_id.clone()).collect();
    let mut expected = admitted.clone();
    in_ledger.sort();
    expected.sort();
    assert_eq!(in_ledger, expected, "the ledger holds exactly the admitted containers");
    assert!(ledger.reserved_on("GPU-storm") <= GPU_MIB << 20);

    // Release them all for the next round.
    for id in &admitted {
        let (_, code, err) = bench.hook("poststop", id, None, &bundle);
        assert_eq!(code, Some(0), "{err}");
    }
    let mut latencies: Vec<_> = results.iter().map(|r| r.1).collect();
    latencies.sort();
    (latencies, admitted.len(), wall)
}

fn run_storms(rounds: usize) {
    let bench = Bench::new("storm", &format!("{GPU_MIB}Mi"));
    let mut inits: Vec<Child> = (0..STORM).map(|_| sleeper()).collect();
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
    for c in &mut inits {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn run_big_ledger(live: usize, samples: usize) {
    let mut init = sleeper();
    let identity = ProcessIdentity::of(init.id()).unwrap();
    for prefill in [0, live] {
        let bench = Bench::new(&format!("ledger{prefill}"), "1000Ti");
        let dir = StateDir::open_or_create(&bench.state).unwrap();
        let mut tx = dir.begin().unwrap();
        for i in 0..prefill {
            tx.ledger.reservations.push(Reservation {
                // Ids as long as Docker's (64 hex characters), so the file has a real size.
                container_id: format!("{i:064x}"),
                gpus: vec![GpuShare {
                    uuid: "GPU-storm".into(),
                    bytes: 1 << 30,
                }],
                init: identity,
                created_unix_ms: vramgate::ledger::now_unix_ms(),
                waited_ms: 0,
            });
        }
        tx.commit().unwrap();
        drop(tx);
        let size = std::fs::metadata(dir.ledger_path()).map(|m| m.len()).unwrap_or(0);
        let bundle = bench.bundle("1Gi");
        let (mut admit, mut release) = (Vec::new(), Vec::new());
        for i in 0..samples {
            let id = format!("sample-{i}");
            let (took, code, err) = bench.hook("createRuntime", &id, Some(init.id()), &bundle);
            assert_eq!(code, Some(0), "{err}");
            admit.push(took);
            let (took, code, err) = bench.hook("poststop", &id, None, &bundle);
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
    let _ = init.kill();
    let _ = init.wait();
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
