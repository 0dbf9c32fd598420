//! Benchmarks of the hook as the runtime sees it: wall time of a whole `vramgate-hook`
//! process, spawned with the OCI state on stdin, as runc spawns it.
//!
//!   cargo run --release --example hook-bench -- latency  [--state-root DIR] [--live N] [--runs N]
//!   cargo run --release --example hook-bench -- runc     [--runs N]
//!   cargo run --release --example hook-bench -- queue    [--runs N]
//!   cargo run --release --example hook-bench -- queue-lock --order fifo|backfill
//!       [--crowd other|same] [--waiters N] [--rounds N]
//!
//! Run through `bench/hook-latency.sh`, `bench/queue-latency.sh` and `bench/queue-lock.sh`,
//! which build first.

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

/// Lock acquisitions and release-to-admission time with a crowd of waiters that cannot fit.
///
/// Two static 80 GiB GPUs. GPU 0: a filler holds 55 GiB and a slot 20 GiB. The crowd: `--waiters`
/// hooks asking 30 GiB each, queued on GPU 1 (`other`: a blocker holds 60 GiB there) or on GPU 0
/// itself (`same`: only backfill can serve anyone past them). Each round queues a probe asking
/// 20 GiB on GPU 0, releases the slot (the previous probe), and times the probe's admission
/// from the end of the release; the probe then holds the slot. Every lock a process takes is
/// counted by vramgate itself (`VRAMGATE_LOCK_LOG`, see `ledger::LOCK_LOG_ENV`), from the first
/// round to the last, and split into the crowd's and the rest's (probes and releases: three
/// per round). The crowd never fits, so every lock it takes is one a waiter could have saved.
fn queue_lock(args: &[String]) {
    let order = arg(args, "--order", "backfill");
    let crowd_on = arg(args, "--crowd", "other");
    let waiters: usize = arg(args, "--waiters", "200").parse().unwrap();
    let rounds: usize = arg(args, "--rounds", "30").parse().unwrap();
    let backfill = match order.as_str() {
        "fifo" => false,
        "backfill" => true,
        other => panic!("--order {other}: fifo or backfill"),
    };
    let crowd_gpu = match crowd_on.as_str() {
        "other" => "1",
        "same" => "0",
        other => panic!("--crowd {other}: other or same"),
    };
    assert!(
        backfill || crowd_gpu == "1",
        "under FIFO nothing passes a crowd on its own GPU"
    );
    let gpus = (0..2)
        .map(|i| format!("[[inventory.gpus]]\nindex = {i}\nuuid = \"GPU-lock-{i}\"\ntotal = \"80Gi\"\n"))
        .collect::<String>();
    // The bound is out of reach: a crowd ahead on the same GPU must stay passable all run long.
    let config = format!(
        "[queue]\nbackfill = {backfill}\nbackfill_bound = \"1h\"\npoll_interval = \"1s\"\n[inventory]\nbackend = \"static\"\n{gpus}"
    );
    let mut h = HookHarness::new_in(Path::new("/dev/shm"), bin("vramgate-hook"), &config);
    let lock_log = h.dir().join("locks.log");
    h.env
        .push((vramgate::ledger::LOCK_LOG_ENV.into(), lock_log.display().to_string()));
    let init = FakeContainer::start();
    let bundle = |name: &str, memory: &str, gpu: &str, wait: bool| {
        let mut annotations = vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", gpu)];
        if wait {
            annotations.extend([("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "1h")]);
        }
        h.bundle(name, &annotations)
    };
    let admit = |id: &str, b: &Path| timed_hook(&h, "createRuntime", &oci_state(id, Some(init.pid()), b));
    let (filler, slot_bundle) = (bundle("filler", "55Gi", "0", false), bundle("slot", "20Gi", "0", true));
    admit("filler", &filler);
    admit("slot-0", &slot_bundle);
    if crowd_gpu == "1" {
        admit("blocker", &bundle("blocker", "60Gi", "1", false));
    }
    let crowd_bundle = bundle("crowd", "30Gi", crowd_gpu, true);
    let dir = h.open_state();
    let queued = |n: usize| dir.read().map(|l| l.queue.len() >= n).unwrap_or(false);
    let mut crowd = Vec::new();
    for i in 0..waiters {
        crowd.push(h.spawn_hook(
            "createRuntime",
            &oci_state(&format!("crowd-{i}"), Some(init.pid()), &crowd_bundle),
        ));
        // A few at a time, as a burst of starts arrives: all at once would only measure the fork.
        if i % 20 == 19 {
            while !queued(i + 1) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    while !queued(waiters) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past every waiter's first poll: the crowd is settled when the rounds start.
    std::thread::sleep(Duration::from_secs(2));
    let crowd_pids: std::collections::HashSet<u32> = crowd.iter().map(|c| c.id()).collect();
    let lines = || std::fs::read_to_string(&lock_log).unwrap_or_default();
    let counted_before = lines().lines().count();
    let started = Instant::now();
    let mut latencies = Vec::new();
    // Probes without an inotify instance: every wake slot was taken (src/service/wake.rs), and
    // they learn of the release from the ledger's stat, within STAT_POLL.
    let mut unwatched = 0;
    let crowd_inotify = crowd.iter().filter(|c| watches_inotify(c.id())).count();
    for r in 1..=rounds {
        let id = format!("slot-{r}");
        let mut probe = h.spawn_hook("createRuntime", &oci_state(&id, Some(init.pid()), &slot_bundle));
        while !dir.read().is_ok_and(|l| l.queue.iter().any(|t| t.container_id == id)) {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(100));
        if !watches_inotify(probe.id()) {
            unwatched += 1;
        }
        timed_hook(
            &h,
            "poststop",
            &oci_state(&format!("slot-{}", r - 1), None, &slot_bundle),
        );
        let released = Instant::now();
        let status = probe.wait().unwrap();
        latencies.push(released.elapsed());
        assert!(status.success(), "probe {id} was not admitted");
    }
    let elapsed = started.elapsed();
    // The herd an admission's commit wakes lands after the probe's hook exits: let it finish.
    std::thread::sleep(Duration::from_millis(500));
    let all = lines();
    let measured: Vec<u32> = all
        .lines()
        .skip(counted_before)
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    let by_crowd = measured.iter().filter(|p| crowd_pids.contains(p)).count();
    let still_waiting = dir.read().map(|l| l.queue.len()).unwrap_or(0);
    for mut c in crowd {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_eq!(still_waiting, waiters, "the crowd waited all along and nobody else did");
    println!(
        "{order}, crowd of {waiters} on {} GPU, {rounds} rounds in {:.1} s: {:.1} lock acquisitions per admission ({:.1} by the crowd, {:.1} by the probe and the release)",
        if crowd_gpu == "1" { "the other" } else { "the same" },
        elapsed.as_secs_f64(),
        measured.len() as f64 / rounds as f64,
        by_crowd as f64 / rounds as f64,
        (measured.len() - by_crowd) as f64 / rounds as f64,
    );
    report(&format!("  release -> admission ({order}, {crowd_on})"), latencies);
    println!(
        "  inotify instances: {crowd_inotify} held by the crowd of {waiters}; {} of {rounds} probes held one, the others watched the ledger's stat",
        rounds - unwatched
    );
}

/// Whether process `pid` holds an inotify instance (the waiter's ledger watcher).
fn watches_inotify(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify"))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("latency") => latency(&args),
        Some("runc") => runc_ratio(&args),
        Some("queue") => queue(&args),
        Some("queue-lock") => queue_lock(&args),
        _ => eprintln!("usage: hook-bench latency|runc|queue|queue-lock [options]"),
    }
}
