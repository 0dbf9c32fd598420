//! `vramgate replay`: what-if over a workload, on the real decision code.
//!
//! The jobs ([`workload`]) are run through the same [`Service`] the hook and the wrapper use
//! (its admission, queue order, backfill bound, placement, timeouts and events), on a static
//! inventory of simulated GPUs, a virtual clock and a liveness in which every job's processes
//! live until the replay releases them. Nothing sleeps and no process is started: the loop
//! jumps from one instant where something happens (an arrival, a completion, a wait's
//! deadline) to the next. The ledger is a real state directory, on tmpfs (`/dev/shm`) where
//! there is one, so a commit costs what it costs in memory; it is removed afterwards.
//!
//! What the replay cannot know it takes from the workload: how long a job holds its memory
//! (admission to release). What it leaves out: memory used outside vramgate changing during
//! the run, containers that die without a stop (both show in the real inventory only), and the
//! time an engine takes between the hook's admission and the job's start.

pub mod report;
mod setting;
pub mod workload;

pub use setting::*;

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::StaticGpu;
use crate::inventory::StaticInventory;
use crate::ledger::StateDir;
use crate::procfs::{Life, Liveness, ProcessIdentity};
use crate::request::Request;
use crate::service::{Admission, AdmitRequest, Refusal, Service, ServiceError, Step};
use crate::spec::SpecView;

pub use report::{Outcome, Percentiles};
pub use workload::{Job, WorkloadError};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}")]
    Workload(#[from] WorkloadError),
    #[error("job {id} (line {line}): {reason}")]
    Job { id: String, line: usize, reason: String },
    #[error("--gpus {value:?}: {reason}; write it as COUNTxSIZE[,COUNTxSIZE...], e.g. 2x141Gi or 1x80Gi,1x24Gi")]
    Gpus { value: String, reason: String },
    #[error("--{key} {value:?}: {reason}")]
    Setting { key: String, value: String, reason: String },
    #[error("the replay's state directory {path}: {source}")]
    State { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Service(#[from] ServiceError),
}

type Result<T> = std::result::Result<T, ReplayError>;

/// The virtual clock: milliseconds since the replay's start, on every clock the service reads.
struct VirtualClock {
    now_ms: Cell<u64>,
}

/// The wall-clock origin written into the replay's ledger and events: fixed, so that a replay
/// is the same every time.
const EPOCH_MS: u64 = 1_700_000_000_000;

impl Clock for VirtualClock {
    fn now_unix_ms(&self) -> u64 {
        EPOCH_MS + self.now_ms.get()
    }
    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.now_ms.get())
    }
    fn boot_ms(&self) -> Option<u64> {
        Some(self.now_ms.get())
    }
}

/// Every job's processes live until the replay releases the job, which it does itself.
struct AllAlive;

impl Liveness for AllAlive {
    fn life(&self, _: &ProcessIdentity) -> Life {
        Life::Alive
    }
}

/// A job's request, read by the same parser a container's spec goes through.
fn request_of(job: &Job) -> Result<Request> {
    let mut annotations = serde_json::Map::new();
    annotations.insert(crate::request::MEMORY_ANNOTATION.into(), job.memory.clone().into());
    if let Some(limit) = &job.limit {
        annotations.insert(crate::request::MEMORY_LIMIT_ANNOTATION.into(), limit.clone().into());
    }
    annotations.insert(crate::request::GPUS_ANNOTATION.into(), job.gpus.clone().into());
    if let Some(p) = &job.policy {
        annotations.insert(crate::request::POLICY_ANNOTATION.into(), p.clone().into());
    }
    if let Some(t) = &job.timeout {
        annotations.insert(crate::request::TIMEOUT_ANNOTATION.into(), t.clone().into());
    }
    if let Some(d) = &job.expected_duration {
        annotations.insert(crate::request::EXPECTED_DURATION_ANNOTATION.into(), d.clone().into());
    }
    let spec = serde_json::json!({"ociVersion": "1.0.2", "annotations": annotations});
    let bad = |reason: String| ReplayError::Job {
        id: job.id.clone(),
        line: job.line,
        reason,
    };
    let bytes = serde_json::to_vec(&spec).expect("JSON serializes");
    let view = SpecView::parse(&bytes, std::path::Path::new("replay")).map_err(|e| bad(e.to_string()))?;
    let mut request = Request::from_spec(&view)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("it requests nothing".into()))?;
    // As vramgate-runtime does at create: `auto` is placed by the service.
    if let Some(placed) = request.gpus.to_place() {
        request.gpus = placed;
    }
    Ok(request)
}

/// A replay's state directory, private (0700) and new, removed when dropped.
struct ScratchState {
    path: PathBuf,
}

impl Drop for ScratchState {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn scratch_state() -> Result<ScratchState> {
    use std::os::unix::fs::DirBuilderExt;
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = base.join(format!("vramgate-replay-{}-{nanos}", std::process::id()));
    // `create`, not `create_all`: a name that exists already is refused, never reused.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|source| ReplayError::State {
            path: path.clone(),
            source,
        })?;
    Ok(ScratchState { path })
}

struct Waiting {
    job: usize,
    progress: crate::service::Progress,
    deadline_ms: u64,
}

/// Replays `jobs` under `setting` (its GPUs must be static), named `name` in the report,
/// calling `progress` now and then with the share of jobs done.
pub fn run(jobs: &[Job], setting: &Setting, name: &str, progress: &mut dyn FnMut(f64)) -> Result<Outcome> {
    // What each job asks; the exclusive baseline admits whole GPUs instead ([`whole_gpus`])
    // and records what the job asked.
    let mut asked: Vec<Request> = jobs.iter().map(request_of).collect::<Result<_>>()?;
    if setting.declared == Declared::Exact {
        for (request, job) in asked.iter_mut().zip(jobs) {
            request.expected_duration = Some(Duration::from_millis(job.duration_ms));
        }
    }
    let scratch = scratch_state()?;
    let mut config = setting.config.clone();
    config.state_dir = scratch.path.join("state");
    config.source = None;
    let gpus = config.inventory.static_gpus_or_simulated();
    // A job no GPU can ever hold is the workload's mistake, said before anything runs.
    let largest = gpus.iter().map(|g| g.total).max().unwrap_or(0);
    first_job_over(jobs, &asked, largest, |asks| {
        format!(
            "it asks {} and the largest GPU holds {}",
            crate::quantity::format_bytes(asks),
            crate::quantity::format_bytes(largest)
        )
    })?;
    let requests = match setting.sharing {
        Sharing::Shared => asked.clone(),
        Sharing::Exclusive => {
            exclusive_check(jobs, &asked, &gpus)?;
            // A whole GPU is the device's, not vramgate's: no headroom kept, no memory counted
            // as used outside (the device plugin hands out whole devices, whatever is on them).
            config.headroom = crate::quantity::Quantity::Bytes(0);
            asked.iter().map(whole_gpus).collect()
        }
    };
    let gpus: Vec<StaticGpu> = match setting.sharing {
        Sharing::Shared => gpus,
        Sharing::Exclusive => gpus.into_iter().map(|g| StaticGpu { used_outside: 0, ..g }).collect(),
    };
    let inventory = StaticInventory::from_gpus(gpus.clone());
    let clock = VirtualClock { now_ms: Cell::new(0) };
    let dir = StateDir::open_or_create(&config.state_dir).map_err(ServiceError::Ledger)?;
    let service = Service::new(dir, &inventory, &clock, &AllAlive, &config);
    let identity = |i: usize| ProcessIdentity {
        pid: 1_000_000 + i as u32,
        start_time: 1,
    };
    let admit_request = |i: usize| AdmitRequest {
        container: &jobs[i].id,
        init: identity(i),
        request: &requests[i],
        bundle: None,
        policy: requests[i].policy.unwrap_or(config.policy),
        wait_for: crate::service::wait_for(&requests[i], &config, None),
        waiter: identity(i),
        runtime: None,
        budget: None,
        pending: true,
        enforcement: None,
        cgroup: None,
    };

    let exclusive = setting.sharing == Sharing::Exclusive;
    let bound_ms = config
        .queue
        .backfill
        .then(|| u64::try_from(config.queue.backfill_bound.as_millis()).unwrap_or(u64::MAX));
    // An attempt that ended, at arrival or after a wait: the backfill bound checked, the
    // outcome recorded, the job's end scheduled; how many jobs it finished.
    let conclude = |record: &mut report::Recorder,
                    completions: &mut BinaryHeap<Reverse<(u64, usize)>>,
                    waiting: &[Waiting],
                    i: usize,
                    admission: Admission,
                    now: u64|
     -> Result<usize> {
        check_bound(&service, record, waiting, jobs, i, &admission, now, bound_ms)?;
        Ok(settle(
            record,
            completions,
            jobs,
            exclusive.then(|| &asked[i]),
            i,
            now,
            admission,
        ))
    };
    let mut record = report::Recorder::new(&gpus, name, setting.sharing);
    let mut completions: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut next_arrival = 0;
    let mut done = 0usize;
    let mut last_progress = 0usize;
    loop {
        let now = [
            jobs.get(next_arrival).map(|j| j.arrival_ms),
            completions.peek().map(|Reverse((t, _))| *t),
            waiting.iter().map(|w| w.deadline_ms).min(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(now) = now else { break };
        clock.now_ms.set(now);
        let mut freed = false;
        while let Some(Reverse((t, i))) = completions.peek().copied() {
            if t > now {
                break;
            }
            completions.pop();
            service.release(&jobs[i].id, None, "replay: the job ended")?;
            record.released(i, now);
            done += 1;
            freed = true;
        }
        while jobs.get(next_arrival).is_some_and(|j| j.arrival_ms <= now) {
            let i = next_arrival;
            next_arrival += 1;
            let req = admit_request(i);
            let mut progress = crate::service::Progress::start(&clock);
            match service
                .attempt(&req, &mut progress)
                .map_err(|e| job_error(&jobs[i], &e))?
            {
                Step::Wait => {
                    let deadline_ms = now.saturating_add(req.wait_for.as_millis() as u64);
                    waiting.push(Waiting {
                        job: i,
                        progress,
                        deadline_ms,
                    });
                }
                Step::Done(admission) => done += conclude(&mut record, &mut completions, &waiting, i, admission, now)?,
            }
        }
        // Waiters in ticket order: each that may be served now (the service's own test: at the
        // head of its GPUs' queues, or backfill) or whose deadline came tries again; an
        // admission or a timeout removes a ticket, which may put the next at a head.
        let mut changed = freed;
        loop {
            let mut progressed = false;
            let mut k = 0;
            // One read of the ledger answers the question for every waiter until an attempt
            // changes it.
            let mut ledger = if changed {
                Some(service.state_dir().read().map_err(ServiceError::Ledger)?)
            } else {
                None
            };
            while k < waiting.len() {
                let due = waiting[k].deadline_ms <= now;
                let may = ledger
                    .as_ref()
                    .is_some_and(|l| service.may_be_served_in(l, &waiting[k].progress));
                if !(due || may) {
                    k += 1;
                    continue;
                }
                let i = waiting[k].job;
                let req = admit_request(i);
                match service
                    .attempt(&req, &mut waiting[k].progress)
                    .map_err(|e| job_error(&jobs[i], &e))?
                {
                    Step::Wait => k += 1,
                    Step::Done(admission) => {
                        waiting.remove(k);
                        done += conclude(&mut record, &mut completions, &waiting, i, admission, now)?;
                        progressed = true;
                        if ledger.is_some() {
                            ledger = Some(service.state_dir().read().map_err(ServiceError::Ledger)?);
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
            changed = true;
        }
        record.sample(now, waiting.len());
        if jobs.len() >= 1000 && done * 20 / jobs.len() > last_progress {
            last_progress = done * 20 / jobs.len();
            progress(done as f64 / jobs.len() as f64);
        }
    }
    let outcome = record.finish(jobs);
    drop(service);
    drop(scratch);
    Ok(outcome)
}

/// An error of one job's attempt (a GPU the replayed host does not have, say), named by the
/// job and its line; vramgate's own state errors stay as they are.
fn job_error(job: &Job, e: &ServiceError) -> ReplayError {
    if e.is_state_error() {
        return ReplayError::Job {
            id: job.id.clone(),
            line: job.line,
            reason: format!("the replay's own state: {e}"),
        };
    }
    ReplayError::Job {
        id: job.id.clone(),
        line: job.line,
        reason: e.to_string(),
    }
}

/// Counts an admission of job `admitted` at `now` that passed a waiter which had waited the
/// backfill bound (`bound_ms`; `None` without backfill, where nothing passes at all) on a GPU
/// it asked for: what the bound forbids, so that a replay shows it never happens, whatever the
/// backfill order. A waiter that arrived earlier holds an older ticket.
#[allow(clippy::too_many_arguments)]
fn check_bound(
    service: &Service<'_>,
    record: &mut report::Recorder,
    waiting: &[Waiting],
    jobs: &[Job],
    admitted: usize,
    admission: &Admission,
    now: u64,
    bound_ms: Option<u64>,
) -> Result<()> {
    let (Some(bound_ms), Admission::Admitted { shares, .. }) = (bound_ms, admission) else {
        return Ok(());
    };
    let overdue: Vec<&str> = waiting
        .iter()
        .filter(|w| w.job < admitted && now.saturating_sub(jobs[w.job].arrival_ms) >= bound_ms)
        .map(|w| jobs[w.job].id.as_str())
        .collect();
    if overdue.is_empty() {
        return Ok(());
    }
    let ledger = service.state_dir().read().map_err(ServiceError::Ledger)?;
    if ledger
        .queue
        .iter()
        .any(|t| overdue.contains(&t.container_id.as_str()) && t.shares_gpu_with(shares))
    {
        record.passed_past_bound();
    }
    Ok(())
}

/// Records an attempt's end; returns 1 when the job will not run (so it counts as done now).
fn settle(
    record: &mut report::Recorder,
    completions: &mut BinaryHeap<Reverse<(u64, usize)>>,
    jobs: &[Job],
    exclusive: Option<&Request>,
    i: usize,
    now: u64,
    admission: Admission,
) -> usize {
    match admission {
        Admission::Admitted { mut shares, .. } => {
            // What the job asked of each GPU it holds: under the exclusive baseline a share is
            // the whole GPU (its size), and the job's own need is what the report counts, so
            // that both rows say how much of the memory held work.
            if let Some(asked) = exclusive {
                for share in &mut shares {
                    share.bytes = asked.memory.bytes_on(share.bytes);
                }
            }
            record.admitted(i, now, jobs[i].arrival_ms, &shares);
            completions.push(Reverse((now.saturating_add(jobs[i].duration_ms), i)));
            0
        }
        Admission::Refused(Refusal::TimedOut { .. }) => {
            record.timed_out(i);
            1
        }
        Admission::Refused(_) => {
            record.refused(i);
            1
        }
        // A replayed job is admitted once, by its one attempt: never confirmed, never again.
        Admission::Confirmed { .. } | Admission::AlreadyAdmitted => 0,
    }
}

/// A job of the exclusive baseline: the same GPUs (pinned, `auto` or `auto:N`), each whole.
fn whole_gpus(asked: &Request) -> Request {
    let mut whole = asked.clone();
    whole.memory = crate::quantity::Quantity::PartsPerMillion(1_000_000);
    // The whole GPU is the limit too.
    whole.limit = None;
    whole
}

/// The first job that asks more than a GPU of `total` bytes holds (a share is taken of that
/// GPU), refused with `reason(what it asks)`: the workload's mistake, said before anything runs.
fn first_job_over(jobs: &[Job], asked: &[Request], total: u64, reason: impl Fn(u64) -> String) -> Result<()> {
    for (job, request) in jobs.iter().zip(asked) {
        let asks = request.memory.bytes_on(total);
        if asks > total {
            return Err(ReplayError::Job {
                id: job.id.clone(),
                line: job.line,
                reason: reason(asks),
            });
        }
    }
    Ok(())
}

/// The exclusive baseline hands out a GPU without looking at its size, as a device plugin
/// does: on GPUs of several sizes a job that some of them cannot hold is not a fair baseline,
/// so it is refused before anything runs.
fn exclusive_check(jobs: &[Job], asked: &[Request], gpus: &[StaticGpu]) -> Result<()> {
    let smallest = gpus.iter().map(|g| g.total).min().unwrap_or(0);
    first_job_over(jobs, asked, smallest, |asks| {
        format!(
            "sharing=exclusive hands out any whole GPU, and it asks {}, more than the smallest GPU ({}); replay the baseline on GPUs it fits",
            crate::quantity::format_bytes(asks),
            crate::quantity::format_bytes(smallest)
        )
    })
}
