//! `vramgate exporter`: serves [`crate::metrics`] over HTTP at `/metrics` for Prometheus.
//!
//! Every scrape is one snapshot taken then, the same as `vramgate status` (an unlocked read of
//! the ledger and one inventory query), so the exporter holds no state of its own: the
//! counters live in the ledger and keep increasing across exporter restarts.
//!
//! The inventory is opened once, at start: NVML's initialisation is most of a query's cost
//! (about 8 ms on the H200 host), and a handle kept open makes each scrape cheap. The config
//! is read on every scrape, like every hook reads it, so a changed headroom or state
//! directory shows at once; a changed `[inventory]` section needs a restart.
//!
//! The port is reachable by whoever can reach the host, so what a client can make the
//! exporter hold is bounded: everything runs on one thread (a tokio current-thread runtime,
//! hyper for HTTP/1), at most [`MAX_CONNECTIONS`] connections are open at once (more wait
//! in the kernel's accept queue), each is closed [`REQUEST_TIMEOUT`] after it was accepted
//! whether or not its request came, and a request head may not exceed [`MAX_HEAD_BYTES`].
//! A snapshot is answered on that thread too: it takes milliseconds and the inventory's
//! queries are bounded (see [`Inventory`]), and Prometheus scrapes one at a time.

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{Config, ConfigError};
use crate::inventory::{Inventory, InventoryError};

/// 9835: in the exporter range Prometheus assigns (9100-9999); the range has no free numbers
/// left, so this one may be taken on a host that runs many exporters: `--listen` changes it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9835";
pub const METRICS_PATH: &str = "/metrics";

/// Connections open at once. One that has sent nothing yet costs a socket and about 1 KiB
/// (hyper takes it, with its 8 KiB read buffer, only once bytes arrive); one stopped inside
/// its request head about 10 KiB: so at most about 170 MiB, and 10,000 idle and slow clients
/// still leave room for Prometheus. Lowered at start to what the open-files limit allows
/// (see [`connection_limit`]).
pub const MAX_CONNECTIONS: usize = 16_384;

/// From accept to the last byte of the answer. Bounds a client that connects and says
/// nothing, one that sends its request a byte at a time, and one that never reads the
/// answer. Prometheus's default `scrape_timeout` is 10 s: a scrape it still waits for is
/// never cut.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest request head read (hyper's smallest buffer). A scrape's head is a few hundred
/// bytes; hyper's default (400 KiB) would let each slow client hold that much.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// File descriptors kept for what is not a connection: the listener, the config, the ledger,
/// NVML's device nodes, stdio.
const RESERVED_FDS: u64 = 64;

/// How many connections at once make a burst worth giving memory back after (see [`Slot`]).
const TRIM_AFTER_CONNECTIONS: usize = 256;

/// How often the exporter says, at most, that it is at its connection limit.
const FULL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How long the accept loop pauses after a failed accept (out of file descriptors or memory),
/// so that a lasting cause logs ten lines a second instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("cannot start the HTTP server on {addr}: {source}")]
    Runtime { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("{0}")]
    CgroupView(#[from] crate::attribution::ForeignCgroupView),
}

type Result<T> = std::result::Result<T, ExporterError>;

pub struct Exporter {
    listener: TcpListener,
    addr: SocketAddr,
    max_connections: usize,
    inventory: Box<dyn Inventory>,
    /// Re-read at every scrape, so an edited config (state_dir, headroom) shows at once.
    config_path: PathBuf,
}

impl Exporter {
    /// Loads the config, opens the inventory and listens on `listen` (`host:port`; port 0
    /// picks a free one, see [`Exporter::local_addr`]). Refused where this process cannot
    /// tell which container holds which GPU memory
    /// ([`crate::attribution::check_cgroup_namespace`]): every scrape would show it all as used
    /// outside vramgate.
    pub fn bind(listen: &str, config_path: PathBuf) -> Result<Exporter> {
        let config = Config::load_from(&config_path)?;
        let inventory = crate::inventory::open(&config)?;
        crate::attribution::check_cgroup_namespace(inventory.as_ref())?;
        let listen_err = |source| ExporterError::Listen {
            addr: listen.to_string(),
            source,
        };
        let listener = TcpListener::bind(listen).map_err(listen_err)?;
        // std listens with a queue of 128; under a flood of connects a full queue drops
        // Prometheus's SYN too, and it retries only a second later. Listening again on the
        // same socket only changes the queue's length (the kernel caps it at somaxconn).
        nix::sys::socket::listen(&listener, nix::sys::socket::Backlog::MAXCONN).map_err(|e| listen_err(e.into()))?;
        // tokio takes the listener over in `serve`, and needs it non-blocking.
        listener.set_nonblocking(true).map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        Ok(Exporter {
            listener,
            addr,
            max_connections: connection_limit(),
            inventory,
            config_path,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers requests until the process is stopped. A failed snapshot is a 500 with the
    /// one-line reason (and the same line on stderr, for the journal): Prometheus then records
    /// the target as down (`up == 0`) rather than graphing stale numbers.
    pub fn serve(self) -> Result<()> {
        let addr = self.addr;
        let runtime_err = |source| ExporterError::Runtime { addr, source };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(runtime_err)?;
        // The inventory is not `Send` (an NVML handle), so connections are tasks of a
        // `LocalSet` on this one thread rather than of a thread pool.
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let listener = tokio::net::TcpListener::from_std(self.listener).map_err(runtime_err)?;
            let limit = Arc::new(Semaphore::new(self.max_connections));
            let load = Rc::new(Load::default());
            let answerer = Rc::new(Answerer {
                inventory: self.inventory,
                config_path: self.config_path,
            });
            let mut said_full: Option<Instant> = None;
            loop {
                // Waiting for a slot before accepting leaves the excess in the kernel's
                // accept queue, where it costs this process nothing. Said once a minute at
                // most: a flood holds the exporter at its limit for as long as it lasts.
                if limit.available_permits() == 0 && said_full.is_none_or(|at| at.elapsed() >= FULL_LOG_INTERVAL) {
                    said_full = Some(Instant::now());
                    eprintln!(
                        "vramgate exporter: {} connections open, the most it serves; new ones wait",
                        self.max_connections
                    );
                }
                // An error means the semaphore was closed, which nothing here does.
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    return Ok(());
                };
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        eprintln!("vramgate exporter: cannot accept a connection on {addr}: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let answerer = answerer.clone();
                let slot = load.opened(permit);
                tokio::task::spawn_local(async move {
                    // Dropped when the task ends, after the socket: frees the slot.
                    let _slot = slot;
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, serve_connection(stream, answerer)).await;
                });
            }
        })
    }
}

/// One request on one connection. Until the client sends a byte, the task holds only the
/// socket: hyper's connection (its buffers, its state) is made, on the heap, once there is
/// something to read, so that thousands of silent clients cost about 1 KiB each.
async fn serve_connection(stream: tokio::net::TcpStream, answerer: Rc<Answerer>) {
    // `peek`, not `readable`: tokio reports a new socket readable before anything arrived.
    // Nothing (0) means the client closed without a request.
    if !matches!(stream.peek(&mut [0u8; 1]).await, Ok(1..)) {
        return;
    }
    http1(stream, answerer).await;
}

/// hyper's HTTP/1 connection, boxed: its future is kilobytes, and inline it would size every
/// waiting task (an `async fn` reserves room for all its states from the start).
fn http1(stream: tokio::net::TcpStream, answerer: Rc<Answerer>) -> Pin<Box<dyn Future<Output = ()>>> {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let response = answerer.respond(request.method(), request.uri().path());
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        // One request per connection: a kept-alive connection would hold a slot between
        // scrapes; Prometheus reconnects at no cost worth counting.
        .keep_alive(false)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    Box::pin(async move {
        // A client that went away or sent garbage is its own problem, not the exporter's.
        let _ = connection.await;
    })
}

/// Connections open now, and the most open at once since memory was last handed back.
#[derive(Default)]
struct Load {
    open: Cell<usize>,
    peak: Cell<usize>,
}

/// A connection's place, from accept to the end of its task.
struct Slot {
    _permit: OwnedSemaphorePermit,
    load: Rc<Load>,
}

impl Load {
    fn opened(self: &Rc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let open = self.open.get() + 1;
        self.open.set(open);
        self.peak.set(self.peak.get().max(open));
        Slot {
            _permit: permit,
            load: self.clone(),
        }
    }
}

impl Drop for Slot {
    /// The last of a burst of connections gives back the memory they used: glibc keeps what
    /// they freed for reuse, scattered inside its heap where its own trimming (the top of the
    /// heap only) does not reach, so a flood of clients would leave the exporter tens of MiB
    /// larger for good. Between scrapes no connection is open, so this runs soon after a
    /// burst ends, and only then (trimming takes a few milliseconds).
    fn drop(&mut self) {
        let open = self.load.open.get().saturating_sub(1);
        self.load.open.set(open);
        if open == 0 && self.load.peak.get() >= TRIM_AFTER_CONNECTIONS {
            self.load.peak.set(0);
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only returns free pages of glibc's heap to the kernel; it
            // takes the allocator's own locks and touches no memory in use.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// Raises this process's soft open-files limit to its hard limit (allowed without privilege)
/// and returns how many connections fit under it, at most [`MAX_CONNECTIONS`]. systemd's
/// default soft limit (1,024) would otherwise cap the exporter far below it.
fn connection_limit() -> usize {
    let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    };
    let fit = usize::try_from(soft.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    fit.clamp(1, MAX_CONNECTIONS)
}

/// What answers a request: the scrape's inputs.
struct Answerer {
    inventory: Box<dyn Inventory>,
    config_path: PathBuf,
}

impl Answerer {
    fn respond(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        let (status, content_type, body) = self.answer(method, path);
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }

    fn answer(&self, method: &Method, path: &str) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        // hyper answers HEAD with the headers of GET and no body.
        if !matches!(*method, Method::GET | Method::HEAD) {
            return (StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET is served\n".into());
        }
        match path {
            METRICS_PATH => match Config::load_from(&self.config_path)
                .map_err(crate::metrics::MetricsError::from)
                .and_then(|config| crate::metrics::snapshot(&config, self.inventory.as_ref()))
            {
                Ok(text) => (StatusCode::OK, crate::metrics::CONTENT_TYPE, text),
                Err(e) => {
                    eprintln!("vramgate exporter: scrape failed: {e}");
                    (StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("vramgate: {e}\n"))
                }
            },
            "/" => (
                StatusCode::OK,
                TEXT,
                format!("vramgate {}: metrics at {METRICS_PATH}\n", env!("CARGO_PKG_VERSION")),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                TEXT,
                format!("not found; metrics are at {METRICS_PATH}\n"),
            ),
        }
    }
}
