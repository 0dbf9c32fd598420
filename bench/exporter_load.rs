//! The exporter under hostile load, measured: `--connections` (10,000) connections to
//! `vramgate exporter` that never finish a request (half send nothing, half stop inside their
//! request head), `--scrapes` (50) scrapes of /metrics while they are open, and the exporter's
//! threads, resident memory and open files (from /proc/<pid>/status and /proc/<pid>/fd) before,
//! with them open, after its request timeout closed them, and after.
//!
//!   cargo run --release --example exporter-load -- [--connections N] [--scrapes N]
//!
//! Run through `bench/exporter-load.sh`, which builds first and writes the figures down. It
//! asserts nothing about them: what must hold whatever the machine (no thread per
//! connection, scrapes answered, stalled connections closed at the request timeout) is
//! tests/it/prometheus.rs's, on fewer connections. Loopback only; needs an open-files hard limit
//! above the connection count (ulimit -Hn).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramgate_testbed::bench::{arg, built_binary as bin, static_config};
use vramgate_testbed::stalled::{footprint, footprint_at_rest, open_stalled_connections};

/// One scrape as Prometheus does it; how long it took.
fn scrape(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).unwrap();
    let took = start.elapsed();
    assert!(
        body.starts_with(b"HTTP/1.1 200") || body.starts_with(b"HTTP/1.0 200"),
        "a scrape failed: {}",
        String::from_utf8_lossy(&body)
    );
    took
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`.
fn until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let connections: usize = arg(&args, "--connections", "10000").parse().unwrap();
    let scrapes: usize = arg(&args, "--scrapes", "50").parse().unwrap();
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= connections as u64 + 256,
        "the open-files hard limit is {hard}; {} connections need {}: raise it (ulimit -Hn)",
        connections,
        connections + 256
    );
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();

    let dir = tempfile::Builder::new()
        .prefix("vramgate-exporter-load")
        .tempdir()
        .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, static_config(&dir.path().join("state"), 2)).unwrap();
    let mut child = Command::new(bin("vramgate"))
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env("VRAMGATE_CONFIG", &config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let exporter = Kill(child);
    let line = lines.next().expect("the exporter says where it listens").unwrap();
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    let addr: SocketAddr = line
        .strip_prefix("vramgate exporter: serving http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    let pid = exporter.0.id();
    for _ in 0..5 {
        scrape(addr);
    }
    let baseline = footprint_at_rest(pid);
    println!("baseline after 5 scrapes: {baseline:?}");

    let opened = Instant::now();
    let clients = open_stalled_connections(addr, connections);
    let timeout = vramgate::exporter::REQUEST_TIMEOUT;
    let all_open = until(timeout, || {
        let f = footprint(pid);
        (f.fds >= baseline.fds + connections).then_some(f)
    });
    match all_open {
        Some(f) => println!("{connections} connections open after {:?}: {f:?}", opened.elapsed()),
        None => println!(
            "{connections} connections never all open at once: the first were closed at the request timeout ({timeout:?}) before the last opened (this machine is too loaded to measure)"
        ),
    }

    let mut took: Vec<Duration> = (0..scrapes).map(|_| scrape(addr)).collect();
    took.sort();
    println!(
        "{scrapes} scrapes with {connections} connections open: median {:?}, max {:?}; {:?}{}",
        took[took.len() / 2],
        took[took.len() - 1],
        footprint(pid),
        if opened.elapsed() < timeout {
            ""
        } else {
            " (some past the request timeout)"
        }
    );

    match until(timeout * 3, || {
        let f = footprint(pid);
        (f.fds <= baseline.fds).then_some(f)
    }) {
        Some(f) => println!("after the exporter closed them ({:?}): {f:?}", opened.elapsed()),
        None => println!(
            "the exporter had not closed them {:?} after they opened",
            opened.elapsed()
        ),
    }
    drop(clients);
    scrape(addr);
    println!("after the connections closed: {:?}", footprint(pid));
}
