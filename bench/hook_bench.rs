//! Benchmarks of the hook as the runtime sees it: wall time of a whole `vramgate-hook`
//! process, spawned with the OCI state on stdin, as runc spawns it.
//!
//!   cargo run --release --example hook-bench -- latency  [--state-root DIR] [--live N] [--runs N]
//!   cargo run --release --example hook-bench -- runc     [--runs N]
//!   cargo run --release --example hook-bench -- queue    [--runs N]
//!
//! Run through `bench/hook-latency.sh` and `bench/queue-latency.sh`, which build first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramgate::ledger::{GpuShare, Ledger, Reservation};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness, Testbed};

/// A binary of this build: an example runs from target/<profile>/examples/, and cargo sets no
/// `CARGO_BIN_EXE_*` for examples.
use vramgate_testbed::bench::{arg, built_binary as bin, report};

/// A scratch host under `root` with one static GPU of `total`, a bundle that requests 1 GiB
/// on it, and a realistic one that requests nothing.
struct Host {
    harness: HookHarness,
    bundle: PathBuf,
    empty_bundle: PathBuf,
}

fn host(root: &Path, total: &str, extra: &str) -> Host {
    let harness = HookHarness::new_in(
        root,
        bin("vramgate-hook"),
        &format!("{extra}\n[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-bench\"\ntotal = {total:?}"),
    );
    let bundle = harness.bundle("bundle", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    // A realistic spec without a request: runc's default spec is about 2.5 KB.
    let plain = serde_json::json!({"ociVersion": "1.0.2", "process": {"env": ["PATH=/usr/bin:/bin", "TERM=xterm"], "args": ["sh"], "cwd": "/"},
        "root": {"path": "rootfs"}, "mounts": (0..12).map(|i| serde_json::json!({"destination": format!("/m{i}"), "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "noexec"]})).collect::<Vec<_>>(),
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}], "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"]}});
    let empty_bundle = harness.bundle_with_spec("plain", &plain);
    Host {
        harness,
        bundle,
        empty_bundle,
    }
}

/// The wall time of one whole hook run, which must succeed.
fn timed_hook(h: &HookHarness, stage: &str, state: &[u8]) -> Duration {
    let start = Instant::now();
    let out = h.hook(stage, state);
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{stage}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn latency(args: &[String]) {
    let root = PathBuf::from(arg(args, "--state-root", "/dev/shm"));
    let live: usize = arg(args, "--live", "100").parse().unwrap();
    let runs: usize = arg(args, "--runs", "500").parse().unwrap();
    let Host {
        harness: h,
        bundle,
        empty_bundle,
    } = host(&root, "100Ti", "");
    let fs = Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "-T"])
        .arg(h.dir())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "state dir {} ({fs}), {live} live reservations, {runs} runs each",
        h.state_dir.display()
    );

    // `live` reservations held by one live process each would need `live` processes; the hook
    // checks each entry's /proc/<pid>/stat either way, so they share a handful of sleepers.
    let sleepers: Vec<FakeContainer> = (0..8).map(|_| FakeContainer::start()).collect();
    let ids: Vec<ProcessIdentity> = sleepers.iter().map(|s| ProcessIdentity::of(s.pid()).unwrap()).collect();
    let dir = h.open_state();
    let mut tx = dir.begin().unwrap();
    tx.ledger = Ledger::default();
    for n in 0..live {
        tx.ledger.reservations.push(Reservation::new(
            format!("{:064x}", n),
            vec![GpuShare::new("GPU-bench", 1 << 30, 0)],
            ids[n % ids.len()],
            vramgate::ledger::now_unix_ms(),
        ));
    }
    drop(tx.commit().unwrap());

    let container = FakeContainer::start();
    let s = oci_state("bench-container", Some(container.pid()), &bundle);
    let plain = oci_state("plain-container", Some(container.pid()), &empty_bundle);
    for _ in 0..20 {
        timed_hook(&h, "createRuntime", &s);
        timed_hook(&h, "poststop", &s);
    }
    let (mut admit, mut release, mut none) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        admit.push(timed_hook(&h, "createRuntime", &s));
        release.push(timed_hook(&h, "poststop", &s));
        none.push(timed_hook(&h, "createRuntime", &plain));
    }
    let ledger = dir.read().unwrap();
    assert_eq!(
        ledger.reservations.len(),
        live,
        "the bench left the ledger as it found it"
    );
    report("admit (createRuntime, request fits)", admit);
    report("release (poststop)", release);
    report("no request (createRuntime)", none);
    // The floor: spawning a do-nothing process the same way.
    let mut floor = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let mut c = Command::new("/bin/true")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let _ = c.stdin.take().unwrap().write_all(&s);
        c.wait().unwrap();
        floor.push(start.elapsed());
    }
    report("floor: /bin/true spawned the same way", floor);
}

fn runc_ratio(args: &[String]) {
    let runs: usize = arg(args, "--runs", "40").parse().unwrap();
    let dir = std::env::temp_dir().join(format!("vramgate-bench-runc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bed = Testbed::create(&dir, "runc", &bin("vramgate-hook"), &Testbed::default_config(&dir, "")).unwrap();
    let with_vramgate = bed
        .bundle(
            "vg",
            &["true"],
            &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")],
            &[],
            true,
        )
        .unwrap();
    // The same container with /bin/true as its hooks: what any hook costs runc.
    let with_true = bed.bundle("tr", &["true"], &[], &[], true).unwrap();
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(with_true.join("config.json")).unwrap()).unwrap();
    for stage in ["createRuntime", "poststop"] {
        spec["hooks"][stage][0] = serde_json::json!({"path": "/bin/true", "args": ["true"]});
    }
    std::fs::write(with_true.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
    let (mut vg, mut tr) = (Vec::new(), Vec::new());
    for n in 0..runs + 3 {
        for (bundle, samples, id) in [(&with_vramgate, &mut vg, "vg"), (&with_true, &mut tr, "tr")] {
            let start = Instant::now();
            let out = bed.runc_run(bundle, &format!("{id}{n}")).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            if n >= 3 {
                samples.push(start.elapsed());
            }
        }
    }
    let a = report("runc run busybox true, vramgate hooks", vg);
    let b = report("runc run busybox true, /bin/true hooks", tr);
    println!(
        "ratio of medians: {:.3} (target <= 1.10)",
        a.as_secs_f64() / b.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn queue(args: &[String]) {
    let runs: usize = arg(args, "--runs", "30").parse().unwrap();
    let h = host(Path::new("/dev/shm"), "24265Mi", "[queue]\npoll_interval = \"1s\"").harness;
    let holder_init = FakeContainer::start();
    let waiter_init = FakeContainer::start();
    // Requests: the holder takes 20 GiB, the waiter wants 10 GiB and must wait for the release.
    let big = h.bundle("big", &[("vramgate.dev/memory", "20Gi"), ("vramgate.dev/gpus", "0")]);
    let waiting = h.bundle(
        "waiting",
        &[
            ("vramgate.dev/memory", "10Gi"),
            ("vramgate.dev/gpus", "0"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "5m"),
        ],
    );
    let holder = oci_state("holder", Some(holder_init.pid()), &big);
    let waiter = oci_state("waiter", Some(waiter_init.pid()), &waiting);
    let dir = h.open_state();
    let queued = || dir.read().map(|l| l.queue.len() == 1).unwrap_or(false);

    let mut latencies = Vec::new();
    for _ in 0..runs {
        timed_hook(&h, "createRuntime", &holder);
        let mut w = h.spawn_hook("createRuntime", &waiter);
        while !queued() {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        timed_hook(&h, "poststop", &holder);
        let released = Instant::now();
        assert!(w.wait().unwrap().success());
        latencies.push(released.elapsed());
        timed_hook(&h, "poststop", &waiter);
    }
    report("release -> waiter admitted (hook exits)", latencies);

    // CPU of a waiter that cannot get in, over 10 s.
    timed_hook(&h, "createRuntime", &holder);
    let mut w = h.spawn_hook("createRuntime", &waiter);
    while !queued() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let ticks = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let before = ticks(w.id());
    std::thread::sleep(Duration::from_secs(10));
    let used = ticks(w.id()) - before;
    let hz = 100.0; // USER_HZ on Linux
    println!(
        "waiting hook CPU over 10 s: {} ticks = {:.2}% of one core (target < 1%)",
        used,
        used as f64 / hz / 10.0 * 100.0
    );
    let _ = w.kill();
    let _ = w.wait();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("latency") => latency(&args),
        Some("runc") => runc_ratio(&args),
        Some("queue") => queue(&args),
        _ => eprintln!("usage: hook-bench latency|runc|queue [options]"),
    }
}
