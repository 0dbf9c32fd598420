//! Benchmark of the metrics: a scrape of `vramgate exporter` with many live reservations, the
//! exporter's resident memory, and `vramgate metrics --textfile-dir` as a timer runs it.
//!
//!   cargo run --release --example metrics-bench -- [--live N] [--gpus N] [--scrapes N] [--state-root DIR]
//!
//! Run through `bench/metrics.sh`, which builds first. The ledger is written directly (the
//! hook's cost is measured elsewhere); its reservations belong to a few live `sleep`
//! processes, because a snapshot checks each one's /proc/<pid>/stat either way.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramgate::ledger::{GpuShare, Ledger, Reservation, StateDir, Ticket};
use vramgate::procfs::ProcessIdentity;

use vramgate_testbed::bench::{arg, built_binary as bin, report};

/// One scrape as Prometheus does it: connect, GET, read the whole body.
fn scrape(addr: SocketAddr) -> usize {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).unwrap();
    assert!(body.starts_with(b"HTTP/1.1 200") || body.starts_with(b"HTTP/1.0 200"));
    body.len()
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let live: usize = arg(&args, "--live", "1000").parse().unwrap();
    let gpus: usize = arg(&args, "--gpus", "8").parse().unwrap();
    let scrapes: usize = arg(&args, "--scrapes", "200").parse().unwrap();
    let root = PathBuf::from(arg(&args, "--state-root", "/dev/shm"));

    let dir = root.join(format!("vramgate-metrics-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state_dir = dir.join("state");
    let config = dir.join("config.toml");
    // H200-sized cards, enough of them that every reservation fits.
    let mut toml = format!("state_dir = {:?}\n", state_dir.display().to_string());
    for g in 0..gpus {
        toml += &format!(
            "[[inventory.gpus]]\nindex = {g}\nuuid = \"GPU-{g:08x}-0000-0000-0000-000000000000\"\ntotal = \"143771Mi\"\nused_outside = \"615Mi\"\n"
        );
    }
    std::fs::write(&config, toml).unwrap();

    let mut children = Kill(
        (0..8)
            .map(|_| Command::new("sleep").arg("3600").spawn().unwrap())
            .collect(),
    );
    let ids: Vec<ProcessIdentity> = children
        .0
        .iter()
        .map(|s| ProcessIdentity::of(s.id()).unwrap())
        .collect();
    let uuid = |n: usize| format!("GPU-{:08x}-0000-0000-0000-000000000000", n % gpus);
    let state = StateDir::open_or_create(&state_dir).unwrap();
    let mut tx = state.begin().unwrap();
    tx.ledger = Ledger::default();
    let now = vramgate::ledger::now_unix_ms();
    for n in 0..live {
        let gpus = vec![GpuShare::new(uuid(n), 1 << 30, 0)];
        tx.ledger
            .reservations
            .push(Reservation::new(format!("{:064x}", n), gpus, ids[n % ids.len()], now));
    }
    // A queue on each GPU, and counters that have seen some traffic.
    for n in 0..2 * gpus {
        tx.ledger.queue.push(Ticket {
            ticket: n as u64 + 1,
            container_id: format!("waiting-{n}"),
            gpus: vec![GpuShare {
                uuid: uuid(n),
                bytes: 40 << 30,
                limit: None,
            }],
            waiter: ids[n % ids.len()],
            enqueued_unix_ms: now,
            enqueued_boot_ms: None,
            deadline_unix_ms: now + 3_600_000,
            bundle: None,
            choose: None,
            expected_ms: None,
            pod_container: None,
            name: None,
            extra: Default::default(),
        });
    }
    tx.ledger.next_ticket = 2 * gpus as u64 + 1;
    for n in 0..5_000u64 {
        tx.ledger.counters.record_admit(None);
        tx.ledger
            .counters
            .record_admit(Some(Duration::from_millis(n * 37 % 600_000)));
        tx.ledger.counters.record_release();
    }
    drop(tx.commit().unwrap());
    let ledger_bytes = std::fs::metadata(state.ledger_path()).unwrap().len();

    let mut exporter = Command::new(bin("vramgate"))
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env("VRAMGATE_CONFIG", &config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = exporter.id();
    let mut first = String::new();
    BufReader::new(exporter.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    children.0.push(exporter);
    let addr: SocketAddr = first
        .trim()
        .trim_start_matches("vramgate exporter: serving http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {first}"));

    println!(
        "{live} live reservations on {gpus} GPUs, {} waiting, ledger {} KiB; exporter pid {pid} on {addr}",
        2 * gpus,
        ledger_bytes / 1024
    );
    let rss_start = status_kib(pid, "VmRSS:");
    let mut size = 0;
    for _ in 0..20 {
        size = scrape(addr);
    }
    let mut times = Vec::with_capacity(scrapes);
    for _ in 0..scrapes {
        let t = Instant::now();
        scrape(addr);
        times.push(t.elapsed());
    }
    report("scrape of /metrics (connect, GET, whole body)", times);
    println!("exposition: {} KiB, {} series", size / 1024, {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b.lines().filter(|l| l.starts_with("vramgate_")).count()
    });
    println!(
        "exporter resident memory: {:.1} MiB at start, {:.1} MiB after {} scrapes, peak {:.1} MiB",
        rss_start as f64 / 1024.0,
        status_kib(pid, "VmRSS:") as f64 / 1024.0,
        scrapes + 21,
        status_kib(pid, "VmHWM:") as f64 / 1024.0
    );

    let textfiles = dir.join("textfile");
    std::fs::create_dir_all(&textfiles).unwrap();
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let out = Command::new(bin("vramgate"))
            .args(["metrics", "--textfile-dir"])
            .arg(&textfiles)
            .env("VRAMGATE_CONFIG", &config)
            .output()
            .unwrap();
        times.push(t.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    report("vramgate metrics --textfile-dir (whole process)", times);
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}
