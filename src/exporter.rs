//! `vramgate exporter`: serves [`crate::metrics`] over HTTP at `/metrics` for Prometheus.
//!
//! Every scrape is one snapshot taken then, the same as `vramgate status` (an unlocked read of
//! the ledger and one inventory query), so the exporter holds no state of its own: the
//! counters live in the ledger and keep increasing across exporter restarts. Requests are
//! answered one at a time on one thread: a scrape takes milliseconds, and Prometheus sends one
//! at a time per target.
//!
//! The inventory is opened once, at start: NVML's initialisation is most of a query's cost
//! (about 8 ms on the H200 host), and a handle kept open makes each scrape cheap. The config
//! is read on every scrape, like every hook reads it, so a changed headroom or state
//! directory shows at once; a changed `[inventory]` section needs a restart.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

use crate::config::{Config, ConfigError};
use crate::inventory::{Inventory, InventoryError};

/// 9835: in the exporter range Prometheus assigns (9100-9999); the range has no free numbers
/// left, so this one may be taken on a host that runs many exporters: `--listen` changes it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9835";
pub const METRICS_PATH: &str = "/metrics";

#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("cannot serve HTTP on {addr}: {message}")]
    Serve { addr: SocketAddr, message: String },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
}

type Result<T> = std::result::Result<T, ExporterError>;

pub struct Exporter {
    server: tiny_http::Server,
    addr: SocketAddr,
    inventory: Box<dyn Inventory>,
    /// Re-read at every scrape, so an edited config (state_dir, headroom) shows at once.
    config_path: PathBuf,
}

impl Exporter {
    /// Loads the config, opens the inventory and listens on `listen` (`host:port`; port 0
    /// picks a free one, see [`Exporter::local_addr`]).
    pub fn bind(listen: &str, config_path: PathBuf) -> Result<Exporter> {
        let config = Config::load_from(&config_path)?;
        let inventory = crate::inventory::open(&config)?;
        let listen_err = |source| ExporterError::Listen {
            addr: listen.to_string(),
            source,
        };
        let listener = TcpListener::bind(listen).map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        let server = tiny_http::Server::from_listener(listener, None).map_err(|e| ExporterError::Serve {
            addr,
            message: e.to_string(),
        })?;
        Ok(Exporter {
            server,
            addr,
            inventory,
            config_path,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers requests until the server fails. A failed snapshot is a 500 with the one-line
    /// reason (and the same line on stderr, for the journal): Prometheus then records the
    /// target as down (`up == 0`) rather than graphing stale numbers.
    pub fn serve(self) -> Result<()> {
        loop {
            let request = self.server.recv().map_err(|e| ExporterError::Serve {
                addr: self.addr,
                message: e.to_string(),
            })?;
            let (status, content_type, body) = self.answer(request.method(), request.url());
            let response = tiny_http::Response::from_string(body)
                .with_status_code(status)
                .with_header(
                    tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
                        .expect("a valid header"),
                );
            // A client that went away is its own problem, not the exporter's.
            let _ = request.respond(response);
        }
    }

    fn answer(&self, method: &tiny_http::Method, url: &str) -> (u16, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        let path = url.split('?').next().unwrap_or(url);
        if !matches!(method, tiny_http::Method::Get | tiny_http::Method::Head) {
            return (405, TEXT, "only GET is served\n".into());
        }
        match path {
            METRICS_PATH => match Config::load_from(&self.config_path)
                .map_err(crate::metrics::MetricsError::from)
                .and_then(|config| crate::metrics::snapshot(&config, self.inventory.as_ref()))
            {
                Ok(text) => (200, crate::metrics::CONTENT_TYPE, text),
                Err(e) => {
                    eprintln!("vramgate exporter: scrape failed: {e}");
                    (500, TEXT, format!("vramgate: {e}\n"))
                }
            },
            "/" => (
                200,
                TEXT,
                format!("vramgate {}: metrics at {METRICS_PATH}\n", env!("CARGO_PKG_VERSION")),
            ),
            _ => (404, TEXT, format!("not found; metrics are at {METRICS_PATH}\n")),
        }
    }
}
