//! Metrics end to end, with the real components: the exporter binary on a scratch host whose
//! containers are admitted, refused, queued, released and reclaimed by the real hook binary,
//! scraped every second by a real Prometheus on loopback, whose HTTP API is then asked what
//! it stored. And: node_exporter's textfile collector reading `vramgate metrics
//! --textfile-dir`, `promtool check metrics` on the output, `promtool check rules` and
//! `promtool test rules` on the shipped alerts, and every query of the Grafana dashboard and
//! the alerts run by Prometheus.
//!
//! Everything listens on 127.0.0.1 only; every wait is bounded; every process started here is
//! killed by a guard, also when an assertion fails.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{daemon, require, stderr, wait_until, GIB, HOOK, VRAMGATE as CLI};
use vramgate_testbed::stalled::{footprint, footprint_at_rest, open_stalled_connections};
use vramgate_testbed::{oci_state, FakeContainer, HookHarness as Scratch};

const LIMIT: Duration = Duration::from_secs(60);

/// Two simulated GPUs: GPU 1 has 1 GiB used by something outside vramgate.
const GPUS: &str = r#"
[[inventory.gpus]]
index = 0
uuid = "GPU-prom-0"
total = "8Gi"
[[inventory.gpus]]
index = 1
uuid = "GPU-prom-1"
total = "4Gi"
used_outside = "1Gi"
"#;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A process started by this test; killed and reaped when dropped.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            eprintln!("stopping {} (pid {})", self.name, self.child.id());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free now on loopback, for a daemon that must be told its port (a small race with
/// other processes, which a retry of the test would win).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Response {
    status: u16,
    content_type: String,
    body: String,
}

/// One HTTP/1.0 GET on loopback with std only: enough for /metrics and Prometheus's API.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type").then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok(Response {
        status,
        content_type,
        body: body.to_string(),
    })
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prometheus {
    addr: SocketAddr,
    _daemon: Daemon,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second, with its own tsdb under `dir`.
    fn start(dir: &Path, target: SocketAddr) -> Prometheus {
        require("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: vramgate\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = daemon("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let daemon = Daemon {
            name: "prometheus",
            child,
        };
        let _ready = wait_until("prometheus is ready", LIMIT, || {
            let ready = get(addr, "/-/ready").map(|r| r.status);
            (matches!(ready, Ok(200)), ready.map_err(|e| e.to_string()))
        });
        Prometheus { addr, _daemon: daemon }
    }

    /// An instant query: the API's whole answer.
    fn query_raw(&self, expr: &str) -> Value {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let r = get(self.addr, &path).unwrap_or_else(|e| panic!("querying {expr}: {e}"));
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{expr}: {e}: {}", r.body))
    }

    /// The values of an instant vector query, by `container_id`/`gpu_uuid`/`outcome`... labels.
    fn query(&self, expr: &str) -> Vec<(Value, f64)> {
        let answer = self.query_raw(expr);
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        answer["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
                (s["metric"].clone(), v)
            })
            .collect()
    }

    /// Waits until `expr` yields exactly one sample equal to `want` (a scrape is once a second).
    fn wait_value(&self, expr: &str, want: f64) {
        wait_until(&format!("{expr} == {want}"), LIMIT, || {
            let got = self.query(expr);
            (got.len() == 1 && got[0].1 == want, got)
        });
    }

    fn wait_absent(&self, expr: &str) {
        wait_until(&format!("{expr} has no series"), LIMIT, || {
            let got = self.query(expr);
            (got.is_empty(), got)
        });
    }
}

/// Starts `vramgate exporter` on `listen` and returns it with the address it serves.
fn start_exporter(scratch: &Scratch, listen: &str) -> (Daemon, SocketAddr) {
    let mut child = Command::new(CLI)
        .args(["exporter", "--listen", listen])
        .env("VRAMGATE_CONFIG", &scratch.config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let daemon = Daemon {
        name: "vramgate exporter",
        child,
    };
    // The first line says where it serves; read it on a thread so a silent exporter cannot
    // hang the test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines();
        let _ = tx.send(lines.next());
        // Keep draining, so the exporter never blocks on a full pipe; echo for the test log.
        for line in lines.map_while(Result::ok) {
            eprintln!("exporter: {line}");
        }
    });
    let line = rx
        .recv_timeout(LIMIT)
        .expect("the exporter says where it listens")
        .expect("a line")
        .unwrap();
    let url = line
        .strip_prefix("vramgate exporter: serving http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line}"));
    let addr: SocketAddr = url.trim_end_matches("/metrics").parse().unwrap();
    (daemon, addr)
}

struct Host {
    scratch: Scratch,
}

impl Host {
    fn new() -> Host {
        Host {
            scratch: Scratch::new(HOOK, GPUS),
        }
    }

    fn bundle(&self, id: &str, memory: &str, gpu: &str, wait: Option<&str>) -> PathBuf {
        let mut annotations = vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", gpu)];
        if let Some(timeout) = wait {
            annotations.push(("vramgate.dev/policy", "wait"));
            annotations.push(("vramgate.dev/timeout", timeout));
        }
        self.scratch.bundle(id, &annotations)
    }

    /// The createRuntime hook for a new container; returns whether it was admitted.
    fn admit(&self, id: &str, init: &FakeContainer, memory: &str, gpu: &str) -> bool {
        let bundle = self.bundle(id, memory, gpu, None);
        let out = self
            .scratch
            .hook("createRuntime", &oci_state(id, Some(init.pid()), &bundle));
        match out.status.code() {
            Some(0) => true,
            Some(1) => {
                assert!(
                    stderr(&out).starts_with("vramgate: refused container"),
                    "{}",
                    stderr(&out)
                );
                false
            }
            other => panic!("hook for {id}: {other:?}: {}", stderr(&out)),
        }
    }

    fn poststop(&self, id: &str) {
        let bundle = self.scratch.dir().join("bundles").join(id);
        let out = self.scratch.hook("poststop", &oci_state(id, None, &bundle));
        assert!(out.status.success(), "poststop {id}: {}", stderr(&out));
    }
}

/// The tests of this file run one at a time: the load test must open its connections within
/// the exporter's request timeout, which a real Prometheus and node_exporter starting beside
/// it on a 2-core machine can make it miss.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn prometheus_scrapes_every_outcome_from_the_exporter() {
    let _alone = one_at_a_time();
    require("prometheus");
    let host = Host::new();
    let (exporter, exporter_addr) = start_exporter(&host.scratch, "127.0.0.1:0");
    let prom = Prometheus::start(host.scratch.dir(), exporter_addr);
    prom.wait_value(r#"up{job="vramgate"}"#, 1.0);
    // Before anything ran: both GPUs, every counter at zero (no ledger exists yet).
    prom.wait_value(
        r#"vramgate_gpu_memory_total_bytes{gpu="0",gpu_uuid="GPU-prom-0"}"#,
        (8 * GIB) as f64,
    );
    prom.wait_value(r#"vramgate_requests_total{outcome="admitted"}"#, 0.0);

    // Two admissions, two refusals (no room now; larger than the GPU can ever hold).
    let a = FakeContainer::start();
    let b = FakeContainer::start();
    assert!(host.admit("c-a", &a, "3Gi", "0"));
    assert!(host.admit("c-b", &b, "2Gi", "1"));
    assert!(!host.admit("c-big", &FakeContainer::start(), "6Gi", "0"));
    assert!(!host.admit("c-huge", &FakeContainer::start(), "100Gi", "0"));
    prom.wait_value(r#"vramgate_requests_total{outcome="admitted"}"#, 2.0);
    prom.wait_value(r#"vramgate_requests_total{outcome="refused"}"#, 2.0);
    prom.wait_value(
        r#"vramgate_container_reserved_bytes{container_id="c-b"}"#,
        (2 * GIB) as f64,
    );
    // GPU 1: 4 GiB, 1 GiB used outside vramgate, 2 GiB reserved: 1 GiB available.
    prom.wait_value(
        r#"vramgate_gpu_memory_used_outside_bytes{gpu_uuid="GPU-prom-1"}"#,
        GIB as f64,
    );
    prom.wait_value(
        r#"vramgate_gpu_memory_available_bytes{gpu_uuid="GPU-prom-1"}"#,
        GIB as f64,
    );

    // A waiter: 3 GiB on GPU 1 does not fit until c-b stops.
    let w = FakeContainer::start();
    let bundle = host.bundle("c-w", "3Gi", "1", Some("60s"));
    let waiter = host
        .scratch
        .spawn_hook("createRuntime", &oci_state("c-w", Some(w.pid()), &bundle));
    let mut waiter = Daemon {
        name: "waiting hook",
        child: waiter,
    };
    prom.wait_value(r#"vramgate_queue_length{gpu_uuid="GPU-prom-1"}"#, 1.0);
    wait_until("the wait shows in the queue's oldest wait", LIMIT, || {
        let got = prom.query(r#"vramgate_queue_oldest_wait_seconds{gpu_uuid="GPU-prom-1"}"#);
        (got.len() == 1 && got[0].1 > 0.0, got)
    });
    host.poststop("c-b");
    drop(b);
    let status = wait_until("the waiter is admitted", LIMIT, || {
        let status = waiter.child.try_wait().unwrap();
        (status.is_some(), status)
    });
    assert!(status.unwrap().success(), "the waiter was refused");
    drop(waiter);
    prom.wait_value(r#"vramgate_requests_total{outcome="admitted_after_wait"}"#, 1.0);
    prom.wait_value(r#"vramgate_queue_wait_seconds_count"#, 1.0);
    prom.wait_value(r#"vramgate_queue_length{gpu_uuid="GPU-prom-1"}"#, 0.0);
    prom.wait_value(r#"vramgate_reservations_ended_total{how="released"}"#, 1.0);
    // The released container left no series behind.
    prom.wait_absent(r#"vramgate_container_reserved_bytes{container_id="c-b"}"#);
    prom.wait_value(
        r#"vramgate_container_reserved_bytes{container_id="c-w"}"#,
        (3 * GIB) as f64,
    );
    // The wait was at least as long as the two scrapes that saw it queued, and under a minute.
    let waited = prom.query("vramgate_queue_wait_seconds_sum");
    assert!(
        waited.len() == 1 && waited[0].1 > 0.0 && waited[0].1 < 60.0,
        "{waited:?}"
    );
    prom.wait_value(r#"vramgate_queue_wait_seconds_bucket{le="60"}"#, 1.0);

    // A waiter that times out: 6 GiB on GPU 0 while c-a holds 3 of its 8.
    let t = FakeContainer::start();
    let bundle = host.bundle("c-t", "6Gi", "0", Some("1s"));
    let out = host
        .scratch
        .hook("createRuntime", &oci_state("c-t", Some(t.pid()), &bundle));
    assert!(stderr(&out).contains("(its timeout)"), "{}", stderr(&out));
    prom.wait_value(r#"vramgate_requests_total{outcome="timed_out"}"#, 1.0);

    // A container that dies without poststop: reclaimed by gc.
    a.kill();
    let out = host.scratch.cli(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    prom.wait_value(r#"vramgate_reservations_ended_total{how="reclaimed"}"#, 1.0);
    prom.wait_absent(r#"vramgate_container_reserved_bytes{container_id="c-a"}"#);
    prom.wait_value(r#"vramgate_gpu_memory_reserved_bytes{gpu_uuid="GPU-prom-0"}"#, 0.0);
    prom.wait_value(r#"count(vramgate_container_reserved_bytes)"#, 1.0);

    // The exporter restarts on the same port: the counters go on from the ledger, no reset.
    drop(exporter);
    let (exporter, again) = start_exporter(&host.scratch, &exporter_addr.to_string());
    assert_eq!(again, exporter_addr);
    let x = FakeContainer::start();
    assert!(host.admit("c-x", &x, "1Gi", "0"));
    prom.wait_value(r#"vramgate_requests_total{outcome="admitted"}"#, 3.0);
    prom.wait_value(r#"resets(vramgate_requests_total{outcome="admitted"}[10m])"#, 0.0);
    for (outcome, n) in [
        ("admitted", 3.0),
        ("admitted_after_wait", 1.0),
        ("refused", 2.0),
        ("timed_out", 1.0),
        ("abandoned", 0.0),
    ] {
        prom.wait_value(&format!(r#"vramgate_requests_total{{outcome="{outcome}"}}"#), n);
    }

    // Every query of the dashboard and of the alerts is valid PromQL over these series.
    let dashboard: Value =
        serde_json::from_slice(&std::fs::read(repo("contrib/grafana/vramgate.json")).unwrap()).unwrap();
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".*")
                .replace("$gpu", ".*")
                .replace("$__rate_interval", "1m")
        })
        .collect();
    assert!(exprs.len() > 10, "{exprs:?}");
    let alerts = std::fs::read_to_string(repo("contrib/prometheus/vramgate-alerts.yml")).unwrap();
    exprs.extend(
        alerts
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: "))
            .map(str::to_string),
    );
    for expr in &exprs {
        let answer = prom.query_raw(expr);
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
    }
    // The dashboard's main panels have data (a panel on a misspelt metric would be empty).
    for expr in exprs
        .iter()
        .filter(|e| e.starts_with("vramgate_gpu_memory_") || e.contains("requests_total"))
    {
        assert!(!prom.query(expr).is_empty(), "no data for {expr}");
    }

    // The exporter's HTTP: the text format's content type, 404 elsewhere.
    let r = get(exporter_addr, "/metrics").unwrap();
    assert_eq!(
        (r.status, r.content_type.as_str()),
        (200, "text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        r.body.contains(
            r#"vramgate_container_reserved_bytes{container_id="c-x",gpu="0",gpu_uuid="GPU-prom-0"} 1073741824"#
        ),
        "{}",
        r.body
    );
    assert_eq!(get(exporter_addr, "/nope").unwrap().status, 404);

    // A ledger that cannot be read: every scrape fails with the reason, Prometheus marks the
    // target down.
    std::fs::write(host.scratch.state_dir.join("ledger.json"), b"{garbage").unwrap();
    let r = get(exporter_addr, "/metrics").unwrap();
    assert_eq!(r.status, 500);
    assert!(
        r.body.contains("is corrupt") && r.body.contains("vramgate ledger repair"),
        "{}",
        r.body
    );
    prom.wait_value(r#"up{job="vramgate"}"#, 0.0);
    drop(exporter);
}

/// One scrape of /metrics; how long it took.
fn scrape(addr: SocketAddr) -> Duration {
    let start = Instant::now();
    let r = get(addr, "/metrics").unwrap();
    let took = start.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("vramgate_gpu_memory_total_bytes{"), "{}", r.body);
    took
}

/// Anyone who reaches the port can open connections and say nothing, or say it a byte at a
/// time. A thousand of them (half silent, half stopped inside their request head) leave the
/// exporter answering every scrape, on the same threads; they are closed by the exporter
/// after its request timeout, and the memory goes back down. How much each costs, and 10,000
/// of them, are measured by bench/exporter-load.sh, not asserted here.
#[test]
fn the_exporter_answers_scrapes_under_a_thousand_idle_and_slow_connections() {
    let _alone = one_at_a_time();
    // Far more than any pool of threads per connection, few enough to open well within the
    // request timeout on a loaded machine.
    const CONNECTIONS: usize = 1_000;
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= CONNECTIONS as u64 + 256,
        "the open-files hard limit is {hard}, this test needs {}: raise it (ulimit -Hn)",
        CONNECTIONS + 256
    );
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();

    let host = Host::new();
    let (exporter, addr) = start_exporter(&host.scratch, "127.0.0.1:0");
    let pid = exporter.child.id();
    for _ in 0..5 {
        scrape(addr);
    }
    // The exporter's own descriptors at rest.
    let baseline = footprint_at_rest(pid);
    eprintln!("baseline after 5 scrapes: {baseline:?}");

    let opened = Instant::now();
    let mut clients = open_stalled_connections(addr, CONNECTIONS);
    // Past the exporter's request timeout the first connections are closed before the last
    // open, and "all open at once" can never be seen: say so, rather than wait for it.
    assert!(
        opened.elapsed() < vramgate::exporter::REQUEST_TIMEOUT,
        "opening {CONNECTIONS} connections took {:?}, longer than the exporter's request timeout: this machine is too loaded to measure",
        opened.elapsed()
    );
    let loaded = wait_until("the exporter accepts every connection", LIMIT, || {
        let f = footprint(pid);
        (f.fds >= baseline.fds + CONNECTIONS, f)
    });
    eprintln!(
        "{CONNECTIONS} connections open after {:?}: {loaded:?}",
        opened.elapsed()
    );

    for _ in 0..10 {
        scrape(addr);
    }
    let under_load = footprint(pid);
    eprintln!("10 scrapes with {CONNECTIONS} connections open: {under_load:?}");
    assert!(
        opened.elapsed() < vramgate::exporter::REQUEST_TIMEOUT,
        "the scrapes ran past the exporter's timeout, which may have closed the connections: {:?}",
        opened.elapsed()
    );
    assert_eq!(under_load.threads, baseline.threads, "the exporter started threads");

    // Nobody closes them here: the exporter does, at its request timeout, and the slow ones
    // get no answer (their request never ended).
    let closed = wait_until("the exporter closes the stalled connections", LIMIT, || {
        let f = footprint(pid);
        (f.fds <= baseline.fds, f)
    });
    eprintln!("after the exporter closed them ({:?}): {closed:?}", opened.elapsed());
    for stream in &mut clients[..2] {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        assert_eq!(stream.read_to_end(&mut rest).unwrap(), 0, "{rest:?}");
    }
    drop(clients);
    scrape(addr);
    let after = footprint(pid);
    eprintln!("after the connections closed: {after:?}");
    assert_eq!(after.threads, baseline.threads);
    assert!(
        after.rss_kib <= baseline.rss_kib + 2048,
        "resident memory stayed at {} KiB after the connections closed (baseline {} KiB)",
        after.rss_kib,
        baseline.rss_kib
    );
    drop(exporter);
}

/// `vramgate metrics --textfile-dir` read by node_exporter's textfile collector: the counter
/// stays a counter and every HELP survives (what OpenMetrics output would lose).
#[test]
fn node_exporter_reads_the_textfile() {
    let _alone = one_at_a_time();
    require("prometheus-node-exporter");
    let host = Host::new();
    let a = FakeContainer::start();
    assert!(host.admit("c-a", &a, "3Gi", "0"));
    assert!(!host.admit("c-big", &FakeContainer::start(), "7Gi", "0"));
    let textfiles = host.scratch.dir().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    let dir = textfiles.to_str().unwrap();
    let out = host.scratch.cli(&["metrics", "--textfile-dir", dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "textfile mode prints nothing");
    let names: Vec<_> = std::fs::read_dir(&textfiles)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["vramgate.prom"]);

    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = daemon("prometheus-node-exporter")
        .args([
            "--collector.disable-defaults",
            "--collector.textfile",
            &format!("--collector.textfile.directory={dir}"),
            &format!("--web.listen-address={addr}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("node_exporter starts");
    let _node_exporter = Daemon {
        name: "node_exporter",
        child,
    };
    let body = wait_until("node_exporter serves", LIMIT, || match get(addr, "/metrics") {
        Ok(r) if r.status == 200 => (true, r.body),
        other => (false, other.map(|r| r.body).unwrap_or_else(|e| e.to_string())),
    });
    assert!(body.contains("node_textfile_scrape_error 0"), "{body}");
    for line in [
        "# TYPE vramgate_requests_total counter",
        r#"vramgate_requests_total{outcome="admitted"} 1"#,
        r#"vramgate_requests_total{outcome="refused"} 1"#,
        "# HELP vramgate_requests_total Container starts that requested VRAM",
        "# TYPE vramgate_queue_wait_seconds histogram",
        r#"vramgate_queue_wait_seconds_bucket{le="+Inf"} 0"#,
        r#"vramgate_container_reserved_bytes{container_id="c-a",gpu="0",gpu_uuid="GPU-prom-0"} 3.221225472e+09"#,
        r#"vramgate_gpu_memory_available_bytes{gpu="1",gpu_uuid="GPU-prom-1"} 3.221225472e+09"#,
    ] {
        assert!(body.contains(line), "node_exporter lacks {line:?}:\n{body}");
    }
    // Mode 0644: node_exporter usually runs as its own user.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(textfiles.join("vramgate.prom"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

/// promtool: the output of a live host (reservations, a queue) and of a recorded NVML host
/// (used and over-reservation series) lints clean; the alert rules load and pass their tests.
#[test]
fn promtool_checks_the_output_and_the_rules() {
    let _alone = one_at_a_time();
    require("promtool");
    let host = Host::new();
    let a = FakeContainer::start();
    assert!(host.admit(r#"odd "id" \ with quotes"#, &a, "3Gi", "0"));
    let started = Instant::now();
    let out = host.scratch.cli(&["metrics"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let live = String::from_utf8(out.stdout).unwrap();
    assert!(live.contains(r#"container_id="odd \"id\" \\ with quotes""#), "{live}");
    eprintln!("vramgate metrics took {:?}", started.elapsed());

    let fixture = repo("tests/fixtures/nvml/attribution.json");
    let recorded = vramgate::inventory::RecordedHost::load(&fixture).unwrap();
    let inventory = vramgate::inventory::RecordedInventory { host: recorded.clone() };
    let report = vramgate::status::build_with(
        &vramgate::config::Config::default(),
        &inventory,
        &recorded.ledger,
        recorded.pid_namespace(),
    )
    .unwrap();
    let nvml = vramgate::metrics::render(&report, &recorded.ledger.counters, 0);
    assert!(nvml.contains("vramgate_container_over_reservation{"), "{nvml}");

    for (what, text) in [("live host", &live), ("recorded NVML host", &nvml)] {
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics on the {what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let rules = repo("contrib/prometheus");
    for args in [
        &["check", "rules", "vramgate-alerts.yml"][..],
        &["test", "rules", "vramgate-alerts.test.yml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&rules)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.contains("SUCCESS"),
            "promtool {args:?}: {said}"
        );
    }
}
