//! The fuzz targets' bodies, shared by the cargo-fuzz targets (`fuzz_targets/*.rs`) and the
//! stable-Rust corpus replay in CI (`tests/it/fuzz_corpus.rs`), so that what CI replays is
//! exactly what was fuzzed.
//!
//! Every entry point takes arbitrary bytes and must neither panic nor hang; on top of that it
//! checks what the rest of vramgate relies on: errors are one line (a hook prints exactly one
//! line, and a forged newline in a log is a way to lie to an operator), and what parses
//! survives a round trip.

#![allow(dead_code)] // each fuzz target uses one entry point

use std::path::Path;

use vramgate::admission::{self, Allocated, Rules};
use vramgate::clock::Stamp;
use vramgate::config::Config;
use vramgate::inventory::{GpuMemory, RecordedHost, RecordedInventory, Snapshot};
use vramgate::ledger::{GpuShare, Ledger};
use vramgate::quantity::{self, Quantity};
use vramgate::request::{self, GpuSelector, Request};
use vramgate::spec::{ContainerState, ProcessView, SpecView};
use vramgate::{metrics, status};

/// The fuzz targets, by name: the corpus lives in `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("quantity", quantity),
    ("oci_state", oci_state),
    ("spec", spec),
    ("request", request),
    ("visible_devices", visible_devices),
    ("config", config),
    ("ledger", ledger),
];

fn one_line(what: &str, message: &str) {
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "{what}: a multi-line error: {message:?}"
    );
}

/// Two whole GPUs (one of them in MIG mode with one MIG device) to resolve selections against.
fn snapshot() -> Snapshot {
    let gpu = |index, mig_index, uuid: &str, total| GpuMemory {
        index,
        mig_index,
        uuid: uuid.to_string(),
        minor: Some(index),
        total,
        free: total / 2,
        mig_caps: Vec::new(),
    };
    Snapshot {
        gpus: vec![
            gpu(0, None, "GPU-00000000-0000-0000-0000-000000000000", 24_265 << 20),
            gpu(1, Some(0), "MIG-11111111-1111-1111-1111-111111111111", 10 << 30),
        ],
        mig_parents: vec![1],
        processes: Vec::new(),
    }
}

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// `parse_quantity` and `parse_duration` (annotations, env vars, config values).
pub fn quantity(data: &[u8]) {
    let Some(input) = text(data) else { return };
    match quantity::parse_quantity(input) {
        Ok(q) => {
            for total in [0, 1, 24_265 << 20, u64::MAX] {
                let bytes = q.bytes_on(total);
                if let Quantity::Bytes(b) = q {
                    assert!(b > 0, "{input:?} parsed to zero bytes");
                    assert_eq!(bytes, b);
                } else {
                    assert!(bytes <= total, "{input:?}: a percentage above the whole GPU");
                }
                let _ = quantity::format_bytes(bytes);
            }
            let _ = q.to_string();
        }
        Err(e) => one_line("quantity", &e.to_string()),
    }
    match quantity::parse_duration(input) {
        Ok(d) => {
            let _ = quantity::format_duration(d);
        }
        Err(e) => one_line("duration", &e.to_string()),
    }
}

/// The OCI state a hook reads on stdin.
pub fn oci_state(data: &[u8]) {
    match ContainerState::read_from(data) {
        Ok(state) => {
            assert!(!state.id.is_empty() && !state.id.chars().any(char::is_control));
            assert!(state.bundle.is_absolute());
            if let Some(pid) = state.init_pid() {
                assert!(pid > 0 && pid <= i32::MAX as u32);
            }
        }
        Err(e) => one_line("oci state", &e.to_string()),
    }
}

fn check_request(spec: &SpecView) {
    let has = request::has_request(spec);
    match Request::from_spec(spec) {
        Ok(Some(request)) => {
            assert!(has, "a request found where has_request says none");
            match request.gpus.resolve(&snapshot()) {
                Ok(uuids) => {
                    let snap = snapshot();
                    for uuid in &uuids {
                        let gpu = snap.by_uuid(uuid).expect("resolves to a GPU of the host");
                        let _ = request.memory.bytes_on(gpu.total);
                    }
                }
                Err(e) => one_line("resolve", &e.to_string()),
            }
        }
        Ok(None) => assert!(!has, "has_request says yes but no request was read"),
        Err(e) => one_line("request", &e.to_string()),
    }
}

/// The container's `config.json`, then the request read from it.
pub fn spec(data: &[u8]) {
    match SpecView::parse(data, Path::new("/bundle/config.json")) {
        Ok(spec) => check_request(&spec),
        Err(e) => one_line("spec", &e.to_string()),
    }
}

/// Annotations and env vars straight, without JSON around them: a line `@key=value` is an
/// annotation, any other line an env entry.
pub fn request(data: &[u8]) {
    let Some(input) = text(data) else { return };
    let mut spec = SpecView::default();
    let mut env = Vec::new();
    for line in input.split('\n') {
        match line.strip_prefix('@') {
            Some(annotation) => {
                let (k, v) = annotation.split_once('=').unwrap_or((annotation, ""));
                spec.annotations.insert(k.to_string(), v.to_string());
            }
            None => env.push(line.to_string()),
        }
    }
    spec.process = Some(ProcessView {
        env,
        ..Default::default()
    });
    check_request(&spec);
}

/// An `NVIDIA_VISIBLE_DEVICES` (or `vramgate.dev/gpus`) value.
pub fn visible_devices(data: &[u8]) {
    let Some(input) = text(data) else { return };
    match GpuSelector::parse_list(request::VISIBLE_DEVICES_ENV, input) {
        Ok(selector) => match selector.resolve(&snapshot()) {
            Ok(uuids) => {
                let mut unique = uuids.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), uuids.len(), "a GPU named twice is reserved once");
            }
            Err(e) => one_line("resolve", &e.to_string()),
        },
        Err(e) => one_line("visible devices", &e.to_string()),
    }
}

/// `/etc/vramgate/config.toml`.
pub fn config(data: &[u8]) {
    let Some(input) = text(data) else { return };
    match Config::parse(input, Path::new("/etc/vramgate/config.toml")) {
        Ok(config) => {
            assert!(config.state_dir.is_absolute());
            assert!(config.wait_timeout <= config.max_wait_timeout);
            let gpus = config.inventory.static_gpus_or_simulated();
            assert!(!gpus.is_empty());
            let _ = Rules::from_config(&config);
        }
        Err(e) => one_line("config", &e.to_string()),
    }
}

/// `ledger.json`: parse, round trip, and run the admission rule and a reclaim over it.
pub fn ledger(data: &[u8]) {
    let path = Path::new("/run/vramgate/ledger.json");
    let ledger = match Ledger::parse(data, path) {
        Ok(l) => l,
        Err(e) => return one_line("ledger", &e.to_string()),
    };
    let bytes = serde_json::to_vec(&ledger).expect("a parsed ledger serializes");
    assert_eq!(Ledger::parse(&bytes, path).expect("a written ledger parses"), ledger);
    let snap = snapshot();
    let rules = Rules {
        headroom: Quantity::PartsPerMillion(50_000),
        backfill: true,
        backfill_bound: std::time::Duration::from_secs(30),
        // Not arrival: a decision then also weighs every other waiter on hostile tickets.
        backfill_order: vramgate::queue_order::BackfillOrder::Longest,
        strategy: vramgate::placement::Strategy::BestFit,
        limit_overcommit_ppm: 0,
    };
    // A placement over every GPU, as the runtime wrapper makes for `auto`.
    let every: Vec<GpuShare> = snap
        .gpus
        .iter()
        .map(|g| GpuShare {
            uuid: g.uuid.clone(),
            bytes: 1 << 30,
            limit: None,
        })
        .collect();
    let _ = admission::decide(
        &ledger,
        &snap,
        &Allocated::new(),
        &rules,
        &every,
        Some(1),
        None,
        None,
        Stamp::wall(0),
    );
    for gpu in &snap.gpus {
        let _ = ledger.reserved_on(&gpu.uuid);
        let account = admission::account(&ledger, gpu, &Allocated::new(), &rules);
        let _ = account.available();
        let _ = account.used_outside();
        one_line("account", &account.describe());
        let share = vec![GpuShare {
            uuid: gpu.uuid.clone(),
            bytes: 1 << 30,
            limit: None,
        }];
        let decide = |ticket, bound, at| {
            admission::decide(
                &ledger,
                &snap,
                &Allocated::new(),
                &rules,
                &share,
                None,
                ticket,
                bound,
                at,
            )
        };
        // At the far ends of the clock and the backfill bound.
        let far = Stamp {
            unix_ms: u64::MAX,
            boot_ms: Some(u64::MAX),
        };
        let _ = decide(ledger.queue.first().map(|t| t.ticket), Some(u64::MAX), far);
        let _ = decide(None, Some(0), Stamp::wall(0));
    }
    let mut copy = ledger.clone();
    let reclaimed = copy.reclaim_with(|p| p.pid % 2 == 0);
    assert_eq!(
        copy.reservations.len() + reclaimed.reservations.len(),
        ledger.reservations.len()
    );
    metrics_of(&ledger);
}

/// The metrics of whatever a ledger holds, on GPUs named after its own shares (so every
/// reservation and ticket shows): each sample is one line whose last field is a number, so a
/// container id cannot break the exposition.
fn metrics_of(ledger: &Ledger) {
    let mut uuids: Vec<&str> = ledger
        .reservations
        .iter()
        .flat_map(|r| &r.gpus)
        .chain(ledger.queue.iter().flat_map(|t| &t.gpus))
        .map(|s| s.uuid.as_str())
        .collect();
    uuids.sort_unstable();
    uuids.dedup();
    let host = RecordedHost {
        snapshot: Snapshot {
            gpus: uuids
                .iter()
                .enumerate()
                .map(|(n, uuid)| GpuMemory {
                    index: n as u32,
                    mig_index: None,
                    uuid: uuid.to_string(),
                    minor: None,
                    total: 80 << 30,
                    free: 70 << 30,
                    mig_caps: Vec::new(),
                })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let inventory = RecordedInventory { host };
    let sources = status::Sources {
        inventory: &inventory,
        clock: &vramgate::clock::SystemClock,
        liveness: &vramgate::procfs::NotChecked,
        pid_namespace: &|_| None,
        cgroup_usage: &vramgate::attribution::NoCgroupUsage,
    };
    let rules = vramgate::admission::Rules::from_config(&Config::default());
    let report = status::build_report(&sources, &rules, std::path::Path::new("/run/vramgate"), ledger)
        .expect("a recorded inventory answers");
    let text = metrics::render(&report, &ledger.counters, u64::MAX);
    for line in text.lines().filter(|l| !l.starts_with("# ")) {
        assert!(line.starts_with("vramgate_"), "{line:?}");
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line:?}");
    }
}
