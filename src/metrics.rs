//! Prometheus metrics: what `vramgate status` shows and the outcome counters of the ledger, in
//! the Prometheus text exposition format (version 0.0.4).
//!
//! [`render`] is a function of one snapshot (a [`StatusReport`], the ledger's [`Counters`] and
//! the time), so it does not matter who took the snapshot: `vramgate metrics` (stdout, or a
//! file for node_exporter's textfile collector) and `vramgate exporter` (HTTP) both call it.
//! The output is built afresh from each snapshot, so a reservation that is gone leaves no
//! series behind, and labels are bounded by the live containers and the GPUs. A container's
//! series carry `container_id` and `name` (its [`crate::ledger::Reservation::name`], absent where
//! it has none): both are the reservation's, so `name` adds no series, and it is at most three
//! parts of [`crate::request::name::MAX_NAME_PART`] characters of a set that needs no escaping.
//!
//! The format is written here rather than with the `prometheus-client` crate: that crate
//! writes only OpenMetrics (counters as `# TYPE x counter` with samples named `x_total`,
//! `# UNIT` and `# EOF` lines; prometheus/client_rust#51, #293), which node_exporter's
//! textfile collector reads as the 0.0.4 format (prometheus/node_exporter#1988): there the
//! counters turn into untyped `x_total` series with a made-up HELP, and `promtool check
//! metrics` fails on them. The 0.0.4 format is a few lines of code; tests/it/prometheus.rs holds
//! this output to a real Prometheus, to `promtool check metrics` and to node_exporter.
//!
//! Conventions: base units (`_bytes`, `_seconds`), `_total` on counters, one `vramgate_`
//! prefix, HELP on every family. Memory is exposed as integers of bytes, times as exact
//! decimals of seconds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{Config, ConfigError};
use crate::counters::Counters;
use crate::inventory::{Inventory, InventoryError};
use crate::ledger::{Ledger, LedgerError, StateDir};
use crate::status::StatusReport;

/// The file `vramgate metrics --textfile-dir DIR` writes (node_exporter reads `*.prom`).
pub const TEXTFILE_NAME: &str = "vramgate.prom";
/// What the exposition is, for the HTTP `Content-Type` header.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Inventory(#[from] InventoryError),
    #[error("{0}")]
    Ledger(#[from] LedgerError),
    #[error("cannot write the metrics file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Takes a snapshot, as `vramgate status` does (the ledger read without the lock, which
/// atomic renames make safe, and the inventory now) but without asking `/proc` whether each
/// entry's process is alive (metrics do not show it), and renders it.
pub fn snapshot(config: &Config, inventory: &dyn Inventory) -> Result<String, MetricsError> {
    let ledger = match StateDir::open_existing(&config.state_dir)? {
        Some(dir) => dir.read()?,
        // Nothing was ever admitted on this host: every GPU empty, every counter zero.
        None => Ledger::default(),
    };
    // The report `vramgate status` and the service's snapshot build, with liveness unchecked.
    let cgroup_usage = crate::enforce::cgroup_usage(&ledger, Path::new(&config.inventory.nvml_library));
    let sources = crate::status::Sources {
        inventory,
        clock: &crate::clock::SystemClock,
        liveness: &crate::procfs::NotChecked,
        pid_namespace: &crate::procfs::pid_namespace,
        cgroup_usage: cgroup_usage.as_ref(),
    };
    let rules = crate::admission::Rules::from_config(config);
    let report = crate::status::build_report(&sources, &rules, &config.state_dir, &ledger)?;
    Ok(render(&report, &ledger.counters, crate::clock::now_unix_ms()))
}

/// Replaces `<dir>/vramgate.prom` atomically, so node_exporter never reads half a file (it
/// reads only names ending in `.prom`, and the temporary name does not).
pub fn write_textfile(dir: &Path, exposition: &str) -> Result<PathBuf, MetricsError> {
    let path = dir.join(TEXTFILE_NAME);
    // 0644: node_exporter usually runs as its own user.
    crate::atomic_file::replace(&path, exposition.as_bytes(), 0o644, None).map_err(|source| MetricsError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The exposition of one snapshot. `now_unix_ms` is when it was taken.
pub fn render(report: &StatusReport, counters: &Counters, now_unix_ms: u64) -> String {
    let reservations: usize = report.gpus.iter().map(|g| g.reservations.len()).sum();
    let mut out = Exposition {
        // About 160 bytes a series; a GPU has 9 and a reservation up to 3.
        text: String::with_capacity(4096 + 160 * (9 * report.gpus.len() + 3 * reservations)),
    };

    /// Name, HELP, and the value of one GPU's series.
    type GpuGauge = (&'static str, &'static str, fn(&crate::status::GpuStatus) -> u64);
    let gpu_gauges: [GpuGauge; 8] = [
        (
            "vramgate_gpu_memory_total_bytes",
            "Memory of the GPU (of the MIG device, for one).",
            |g| g.account.total,
        ),
        (
            "vramgate_gpu_memory_free_bytes",
            "Memory the driver reports free now; what any process has allocated, inside vramgate or not, is out of it.",
            |g| g.account.free,
        ),
        (
            "vramgate_gpu_memory_reserved_bytes",
            "Sum of the reservations on the GPU.",
            |g| g.account.reserved,
        ),
        (
            "vramgate_gpu_memory_used_outside_bytes",
            "Memory in use that no reservation covers: the driver's own, processes outside vramgate, containers beyond their reservation.",
            |g| g.used_outside,
        ),
        (
            "vramgate_gpu_memory_available_bytes",
            "Memory a new request may reserve now, by the admission rule.",
            |g| g.available,
        ),
        (
            "vramgate_gpu_memory_headroom_bytes",
            "Memory kept free on the GPU by the headroom setting.",
            |g| g.account.headroom,
        ),
        (
            "vramgate_gpu_reservations",
            "Reservations that hold memory on the GPU.",
            |g| g.account.reservations as u64,
        ),
        (
            "vramgate_queue_length",
            "Containers waiting for room on the GPU.",
            |g| g.queue.len() as u64,
        ),
    ];
    for (name, help, value) in gpu_gauges {
        out.family(name, "gauge", help);
        for gpu in &report.gpus {
            let index = gpu.account.index.to_string();
            out.sample_int(name, &[("gpu", &index), ("gpu_uuid", &gpu.account.uuid)], value(gpu));
        }
    }

    out.family(
        "vramgate_queue_oldest_wait_seconds",
        "gauge",
        "How long the longest-waiting container in the GPU's queue has waited; 0 when none waits.",
    );
    for gpu in &report.gpus {
        let index = gpu.account.index.to_string();
        let oldest = gpu.queue.iter().map(|t| t.waited_ms).max().unwrap_or(0);
        out.sample_seconds(
            "vramgate_queue_oldest_wait_seconds",
            &[("gpu", &index), ("gpu_uuid", &gpu.account.uuid)],
            oldest,
        );
    }

    /// Name, HELP, and the value of one container's series on one GPU (`None`: no sample).
    type ContainerGauge = (
        &'static str,
        &'static str,
        fn(&crate::status::ReservationStatus) -> Option<u64>,
    );
    let container_gauges: [ContainerGauge; 4] = [
        (
            "vramgate_container_reserved_bytes",
            "Memory a container has reserved on the GPU.",
            |r| Some(r.bytes),
        ),
        (
            "vramgate_container_limit_bytes",
            "Memory a container may use at most on the GPU: its limit, or what it reserved where it asked for no more.",
            |r| Some(r.limit),
        ),
        // These two only where NVML lists processes: on a host without it a 0 would claim
        // knowledge.
        (
            "vramgate_container_used_bytes",
            "Memory a container's processes hold on the GPU now (hosts where NVML lists processes only).",
            |r| r.used,
        ),
        (
            "vramgate_container_over_reservation",
            "1 when a container's processes hold more than its limit on the GPU (what it reserved where it asked for no more), else 0 (hosts where NVML lists processes only).",
            |r| r.used.map(|_| u64::from(r.over_reservation)),
        ),
    ];
    for (name, help, value) in container_gauges {
        out.family(name, "gauge", help);
        for gpu in &report.gpus {
            let index = gpu.account.index.to_string();
            for r in &gpu.reservations {
                if let Some(v) = value(r) {
                    // `name` adds no series: one per reservation, as `container_id` (see the
                    // module docs). Absent, as Prometheus reads an empty one, where none.
                    let mut labels = vec![
                        ("container_id", r.container_id.as_str()),
                        ("gpu", &index),
                        ("gpu_uuid", &gpu.account.uuid),
                    ];
                    if let Some(shown) = &r.name {
                        labels.push(("name", shown));
                    }
                    out.sample_int(name, &labels, v);
                }
            }
        }
    }

    out.family(
        "vramgate_requests_total",
        "counter",
        "Container starts that requested VRAM, by outcome: admitted (at once), admitted_after_wait, refused (by the admission rule), timed_out (waiting), abandoned (the waiting hook died).",
    );
    for (outcome, n) in [
        ("admitted", counters.admitted),
        ("admitted_after_wait", counters.admitted_after_wait),
        ("refused", counters.refused),
        ("timed_out", counters.timed_out),
        ("abandoned", counters.abandoned),
    ] {
        out.sample_int("vramgate_requests_total", &[("outcome", outcome)], n);
    }
    out.family(
        "vramgate_reservations_ended_total",
        "counter",
        "Reservations that ended: released (poststop, vramgate release) or reclaimed (the container's init process was gone).",
    );
    for (how, n) in [("released", counters.released), ("reclaimed", counters.reclaimed)] {
        out.sample_int("vramgate_reservations_ended_total", &[("how", how)], n);
    }

    out.family(
        "vramgate_queue_wait_seconds",
        "histogram",
        "Time in the queue of containers admitted after waiting.",
    );
    for (bound_ms, n) in counters.wait.cumulative() {
        let le = seconds(bound_ms);
        out.sample_int("vramgate_queue_wait_seconds_bucket", &[("le", &le)], n);
    }
    out.sample_int(
        "vramgate_queue_wait_seconds_bucket",
        &[("le", "+Inf")],
        counters.wait.count,
    );
    out.sample_seconds("vramgate_queue_wait_seconds_sum", &[], counters.wait.sum_ms);
    out.sample_int("vramgate_queue_wait_seconds_count", &[], counters.wait.count);

    out.family(
        "vramgate_snapshot_timestamp_seconds",
        "gauge",
        "When this snapshot was taken (Unix time); in textfile mode, alert when it stops advancing.",
    );
    out.sample_seconds("vramgate_snapshot_timestamp_seconds", &[], now_unix_ms);
    out.family(
        "vramgate_build_info",
        "gauge",
        "The vramgate version that wrote this, as a label; always 1.",
    );
    out.sample_int("vramgate_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);
    out.text
}

/// Milliseconds as exact decimal seconds ("1.5", "0.01", "3600"): no float rounding, and
/// bucket bounds read the same in every scrape.
fn seconds(ms: u64) -> String {
    match ms % 1000 {
        0 => (ms / 1000).to_string(),
        frac => {
            let digits = format!("{frac:03}");
            format!("{}.{}", ms / 1000, digits.trim_end_matches('0'))
        }
    }
}

struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        // HELP text escapes only backslash and newline; the texts above hold neither.
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn labels(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.text.push_str(name);
        if labels.is_empty() {
            return;
        }
        self.text.push('{');
        for (n, (key, value)) in labels.iter().enumerate() {
            if n > 0 {
                self.text.push(',');
            }
            self.text.push_str(key);
            self.text.push_str("=\"");
            escape_label_value(&mut self.text, value);
            self.text.push('"');
        }
        self.text.push('}');
    }

    fn sample_int(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.text, " {value}");
    }

    fn sample_seconds(&mut self, name: &str, labels: &[(&str, &str)], ms: u64) {
        self.labels(name, labels);
        let _ = writeln!(self.text, " {}", seconds(ms));
    }
}

/// Container ids come from the runtime and may hold quotes or backslashes (control characters
/// are refused when the OCI state is read, but a newline is escaped here all the same).
fn escape_label_value(out: &mut String, value: &str) {
    // Nearly every value needs no escaping: copy it whole (a scrape writes thousands).
    if !value.contains(['\\', '"', '\n']) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests;
