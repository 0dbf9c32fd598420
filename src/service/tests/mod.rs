//! The service's decisions against a fake inventory, clock and liveness: no processes, no
//! GPUs, and (for single attempts) no files touched.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::path::Path;

use super::*;
use crate::inventory::{GpuMemory, Snapshot};
use crate::procfs::Life;
use crate::quantity::Quantity;
use crate::queue_order::BackfillOrder;
use crate::request::GpuSelector;

mod claims;
mod fit;
mod lifecycle;
mod placement;
mod queue;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
/// The paper's card: 24,265 MiB.
const CARD: u64 = 24_265 * MI;

struct FakeInventory {
    snapshot: RefCell<Snapshot>,
}

impl FakeInventory {
    fn gpus(n: u32, total: u64) -> FakeInventory {
        let gpus = (0..n)
            .map(|i| GpuMemory {
                index: i,
                mig_index: None,
                uuid: format!("GPU-{i}"),
                minor: Some(i),
                total,
                free: total,
                mig_caps: Vec::new(),
            })
            .collect();
        FakeInventory {
            snapshot: RefCell::new(Snapshot {
                gpus,
                ..Snapshot::default()
            }),
        }
    }

    /// Memory taken by something outside vramgate.
    fn use_outside(&self, gpu: usize, bytes: u64) {
        let mut snapshot = self.snapshot.borrow_mut();
        let g = &mut snapshot.gpus[gpu];
        g.free = g.total - bytes;
    }
}

impl Inventory for FakeInventory {
    fn snapshot(&self) -> std::result::Result<Snapshot, InventoryError> {
        Ok(self.snapshot.borrow().clone())
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

#[derive(Default)]
struct FakeClock {
    unix_ms: Cell<u64>,
    mono: Cell<Duration>,
}

impl FakeClock {
    fn advance(&self, by: Duration) {
        self.unix_ms.set(self.unix_ms.get() + by.as_millis() as u64);
        self.mono.set(self.mono.get() + by);
    }
}

impl Clock for FakeClock {
    fn now_unix_ms(&self) -> u64 {
        self.unix_ms.get()
    }

    fn monotonic(&self) -> Duration {
        self.mono.get()
    }
}

/// Every process is alive unless listed as gone or unreadable.
#[derive(Default)]
struct FakeLiveness {
    gone: RefCell<HashSet<u32>>,
    unknown: RefCell<HashSet<u32>>,
}

impl Liveness for FakeLiveness {
    fn life(&self, p: &ProcessIdentity) -> Life {
        if self.gone.borrow().contains(&p.pid) {
            Life::Gone
        } else if self.unknown.borrow().contains(&p.pid) {
            Life::Unknown
        } else {
            Life::Alive
        }
    }
}

struct World {
    _dir: tempfile::TempDir,
    state: StateDir,
    inventory: FakeInventory,
    clock: FakeClock,
    liveness: FakeLiveness,
    config: Config,
}

impl World {
    fn new(gpus: u32, total: u64) -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open_or_create(&dir.path().join("state")).unwrap();
        let clock = FakeClock::default();
        clock.unix_ms.set(1_000_000);
        World {
            _dir: dir,
            state,
            inventory: FakeInventory::gpus(gpus, total),
            clock,
            liveness: FakeLiveness::default(),
            config: Config::default(),
        }
    }

    fn service(&self) -> Service<'_> {
        Service::new(
            self.state.clone(),
            &self.inventory,
            &self.clock,
            &self.liveness,
            &self.config,
        )
    }
}

fn request(bytes: u64, gpus: &str) -> Request {
    Request {
        memory: Quantity::Bytes(bytes),
        memory_source: crate::request::MEMORY_ANNOTATION.to_string(),
        from_nvidia: false,
        limit: None,
        limit_source: String::new(),
        limit_from_nvidia: false,
        policy: None,
        timeout: None,
        expected_duration: None,
        gpus: GpuSelector::parse_list(crate::request::GPUS_ANNOTATION, gpus).unwrap(),
        notes: vec![],
        claim_devices: vec![],
        pod_sandbox: None,
        pod_container: None,
        name: None,
    }
}

fn pid(n: u32) -> ProcessIdentity {
    ProcessIdentity { pid: n, start_time: 1 }
}

fn admit_req<'r>(id: &'r str, n: u32, request: &'r Request, policy: Policy) -> AdmitRequest<'r> {
    AdmitRequest {
        container: id,
        init: pid(n),
        request,
        bundle: None,
        policy,
        wait_for: Duration::from_secs(60),
        waiter: pid(10_000 + n),
        runtime: Some(pid(20_000 + n)),
        budget: None,
        pending: false,
        enforcement: None,
        cgroup: None,
    }
}

/// One attempt on an in-memory ledger, as a transaction would run it.
fn step(
    service: &Service,
    ledger: &mut Ledger,
    req: &AdmitRequest,
    progress: &mut Progress,
) -> (Result<Step>, Vec<Event>) {
    let mut reclaimed = Reclaimed::default();
    let mut log = Vec::new();
    let step = service.decide_on(ledger, true, &mut reclaimed, req, progress, &mut log, None);
    (step, log)
}

/// A first attempt of `req` (no progress yet), as a new arrival's hook makes it.
fn first_step(service: &Service, ledger: &mut Ledger, req: &AdmitRequest) -> (Result<Step>, Vec<Event>) {
    step(service, ledger, req, &mut Progress::default())
}

fn refusal(step: Result<Step>) -> Refusal {
    match step {
        Ok(Step::Done(Admission::Refused(r))) => r,
        Ok(Step::Done(other)) => panic!("expected a refusal, got {other:?}"),
        Ok(Step::Wait) => panic!("expected a refusal, got a wait"),
        Err(e) => panic!("expected a refusal, got {e}"),
    }
}

fn admitted(step: &Result<Step>) -> bool {
    matches!(step, Ok(Step::Done(Admission::Admitted { .. })))
}

/// Whether the next attempt of `req`, after `progress`, is admitted.
fn admits(service: &Service, ledger: &mut Ledger, req: &AdmitRequest, progress: &mut Progress) -> bool {
    admitted(&step(service, ledger, req, progress).0)
}

/// A ledger in which "holder" (init pid 1) was admitted with `request`.
fn held(service: &Service, request: &Request) -> Ledger {
    let mut ledger = Ledger::default();
    let holder = admit_req("holder", 1, request, Policy::Wait);
    assert!(admitted(&first_step(service, &mut ledger, &holder).0));
    ledger
}

/// One attempt of `req` that must queue; returns its progress for the next attempt.
fn queued(service: &Service, ledger: &mut Ledger, req: &AdmitRequest) -> Progress {
    let mut progress = Progress::default();
    assert!(matches!(step(service, ledger, req, &mut progress).0, Ok(Step::Wait)));
    progress
}

/// A request that leaves the choice of GPU to vramgate, as the runtime wrapper makes it at
/// create (`pending`, owned by the runtime process `n`).
fn placing<'r>(id: &'r str, n: u32, request: &'r Request, policy: Policy) -> AdmitRequest<'r> {
    AdmitRequest {
        pending: true,
        runtime: None,
        waiter: pid(n),
        ..admit_req(id, n, request, policy)
    }
}
