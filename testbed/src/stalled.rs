//! The exporter under connections that never finish a request, as bench/exporter_load.rs
//! measures it and tests/it/prometheus.rs asserts it (on fewer connections): what /proc says
//! the process holds, and the connections themselves. One copy, so that the bench measures
//! the load the test checks.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What /proc says of a process: its threads, resident memory and open files.
#[derive(Debug, Clone, Copy)]
pub struct Footprint {
    pub threads: u64,
    pub rss_kib: u64,
    pub fds: usize,
}

/// Process `pid`'s footprint now (from /proc/<pid>/status and /proc/<pid>/fd).
pub fn footprint(pid: u32) -> Footprint {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    };
    Footprint {
        threads: field("Threads:"),
        rss_kib: field("VmRSS:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count(),
    }
}

/// Process `pid`'s footprint at rest: the fewest descriptors of ten looks 50 ms apart. The
/// last scrape's socket may still be closing, and one transient descriptor in a baseline
/// would make "all open" unreachable.
pub fn footprint_at_rest(pid: u32) -> Footprint {
    (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            footprint(pid)
        })
        .min_by_key(|f| f.fds)
        .unwrap()
}

/// `n` connections to `addr` that never finish a request: the even ones send nothing, the odd
/// ones stop inside their request head.
pub fn open_stalled_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        if i % 2 == 1 {
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow")
                .unwrap();
        }
        clients.push(stream);
    }
    clients
}
