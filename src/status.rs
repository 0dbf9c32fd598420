//! `vramgate status`: what each GPU holds, who reserved it, who is waiting.
//!
//! Status reads the ledger without the lock (atomic renames make that safe) and changes
//! nothing: entries whose process is gone are shown as such and left to `vramgate gc` or the
//! next transaction.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::admission::{self, GpuAccount, Rules};
use crate::attribution;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::inventory::{GpuProcess, Inventory};
use crate::ledger::{GpuShare, Ledger, Reservation};
use crate::procfs::{self, Life, Liveness, ProcLiveness, ProcessIdentity};
use crate::quantity::{format_bytes, format_duration};

#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub inventory: String,
    pub state_dir: String,
    pub generation: u64,
    pub gpus: Vec<GpuStatus>,
    /// What the report was measured from: the inventory's answer and what each reserved
    /// container has allocated on each GPU. Not in the JSON; the device plugin places on them
    /// (GetPreferredAllocation), so that its numbers are this report's.
    #[serde(skip)]
    pub snapshot: crate::inventory::Snapshot,
    #[serde(skip)]
    pub allocated: crate::admission::Allocated,
    /// The reservations judged together because their processes cannot be told apart
    /// ([`crate::attribution::Attribution::shared`]): what the watch judges and stops by.
    #[serde(skip)]
    pub shared: Vec<(String, Vec<String>)>,
    /// GPU processes whose cgroup could not be compared with the recorded ones
    /// ([`crate::attribution::Attribution::unattributed`]): in no reservation's `used`, and
    /// not among `outside_processes`; the watch says so once.
    #[serde(skip)]
    pub unattributed: Vec<crate::attribution::Unattributed>,
}

#[derive(Debug, Serialize)]
pub struct GpuStatus {
    /// The inventory's entry the account was made from (for the DRA driver's slice: MIG index,
    /// device nodes); not in the JSON, whose fields say it already.
    #[serde(skip)]
    pub gpu: crate::inventory::GpuMemory,
    #[serde(flatten)]
    pub account: GpuAccount,
    pub available: u64,
    pub used_outside: u64,
    pub reservations: Vec<ReservationStatus>,
    pub queue: Vec<TicketStatus>,
    /// GPU processes that belong to no reservation (NVML hosts only).
    pub outside_processes: Vec<GpuProcess>,
}

#[derive(Debug, Serialize)]
pub struct ReservationStatus {
    pub container_id: String,
    /// What the container is called ([`crate::ledger::Reservation::name`]): `namespace/pod/
    /// container` for a pod's, the name its owner gave otherwise; `null` where none was given.
    pub name: Option<String>,
    /// The request: what is reserved for it and counted by admission.
    pub bytes: u64,
    /// What it may use at most (`bytes` where it asked for no more).
    pub limit: u64,
    /// What the container's processes hold now, where NVML can tell.
    pub used: Option<u64>,
    /// `used` is above `limit` (the request where there is no limit above it): what the
    /// container was allowed is passed, not merely its guarantee.
    pub over_reservation: bool,
    pub age_ms: u64,
    pub waited_ms: u64,
    pub pid: u32,
    /// Whether the container's init process is still there; `None` when not checked or
    /// unreadable (metrics do not check: see [`crate::procfs::NotChecked`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alive: Option<bool>,
    /// Reserved by `vramgate-runtime` at create; the container's hook has not confirmed it
    /// yet (`pid` is then the runtime process creating it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// What holds the container to its reservation (driver limit, MPS limit, toolkit limit,
    /// guardrails, none); `None` where nothing was recorded (admitted by the hook alone).
    pub tier: Option<crate::enforce::Tier>,
}

#[derive(Debug, Serialize)]
pub struct TicketStatus {
    pub position: usize,
    pub ticket: u64,
    pub container_id: String,
    /// What the waiting container is called (see [`ReservationStatus::name`]).
    pub name: Option<String>,
    pub bytes: u64,
    /// The limit it asks for beside its request (`bytes` where it asked for no more).
    pub limit: u64,
    pub waited_ms: u64,
    pub deadline_in_ms: u64,
    pub waiter_pid: u32,
    /// Whether the waiting hook is still there; `None` when not checked or unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alive: Option<bool>,
    /// A placement waiting for any `count` of `candidates` GPUs (it is listed on each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choose: Option<TicketChoice>,
}

#[derive(Debug, Serialize)]
pub struct TicketChoice {
    pub count: u32,
    pub candidates: usize,
}

/// Where a report's facts come from: live sources on a host, recorded or fake ones in tests.
pub struct Sources<'a> {
    pub inventory: &'a dyn Inventory,
    pub clock: &'a dyn Clock,
    pub liveness: &'a dyn Liveness,
    /// The pid namespace of a process (recorded hosts replay theirs).
    pub pid_namespace: &'a dyn Fn(u32) -> Option<u64>,
    /// What the driver counts per limited container ([`crate::enforce::cgroup_usage`]).
    pub cgroup_usage: &'a dyn crate::attribution::CgroupUsage,
}

/// The report for `ledger` on this host's live sources (see [`crate::service::Service::snapshot`]).
pub fn build(
    config: &Config,
    inventory: &dyn Inventory,
    ledger: &Ledger,
) -> Result<StatusReport, crate::inventory::InventoryError> {
    build_with(config, inventory, ledger, procfs::pid_namespace)
}

/// `build`, with the way to read a process's pid namespace given (recorded hosts replay theirs).
pub fn build_with(
    config: &Config,
    inventory: &dyn Inventory,
    ledger: &Ledger,
    pid_namespace: impl Fn(u32) -> Option<u64>,
) -> Result<StatusReport, crate::inventory::InventoryError> {
    let cgroup_usage = crate::enforce::cgroup_usage(ledger, Path::new(&config.inventory.nvml_library));
    let sources = Sources {
        inventory,
        clock: &SystemClock,
        liveness: &ProcLiveness,
        pid_namespace: &pid_namespace,
        cgroup_usage: cgroup_usage.as_ref(),
    };
    build_report(&sources, &Rules::from_config(config), &config.state_dir, ledger)
}

/// How a container's use on one GPU is judged where it is not judged alone
/// ([`held_together`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Together {
    /// The group's use added up, of those that could be measured (`None` when none could): a
    /// holder that could not be measured hides none of what the others use.
    pub used: Option<u64>,
    /// What the group reserved: its shares added up, a claim held once counted once.
    pub reserved: u64,
    /// What the group may use: its limits added up, a claim held once counted once.
    pub limit: u64,
    /// How many containers it is.
    pub holders: usize,
    /// Whether some of them share a pid namespace (else they are a pod's holders of a claim).
    pub shared_namespace: bool,
    /// Names the group among those of this GPU: the containers with the same `group` are it.
    pub group: usize,
}

/// How the use of each container on GPU `uuid` that is not judged alone is judged: by
/// container id, its group's [`Together`]. A group is the containers of a pod that hold one
/// claim ([`crate::ledger::ClaimHold`]: they hold its memory once) and the containers whose
/// processes cannot be told apart (`shared`: [`crate::attribution::Attribution::shared`]),
/// joined where they overlap. Containers judged alone are absent. The one rule status's
/// `over_reservation` and `vramgate watch` judge by.
pub fn held_together<'l>(
    ledger: &'l Ledger,
    uuid: &str,
    shared: &[&[String]],
    used: &dyn Fn(&str) -> Option<u64>,
) -> std::collections::HashMap<&'l str, Together> {
    let held = ledger.held_on(uuid);
    // Each entry of `held` starts as its own group; the groups are joined by shared namespaces.
    let mut parent: Vec<usize> = (0..held.len()).collect();
    fn root(parent: &mut [usize], mut at: usize) -> usize {
        while parent[at] != at {
            parent[at] = parent[parent[at]];
            at = parent[at];
        }
        at
    }
    let entry_of: std::collections::HashMap<&str, usize> = held
        .iter()
        .enumerate()
        .flat_map(|(at, h)| h.holders.iter().map(move |r| (r.container_id.as_str(), at)))
        .collect();
    let mut in_namespace = vec![false; held.len()];
    for members in shared {
        let entries: Vec<usize> = members
            .iter()
            .filter_map(|m| entry_of.get(m.as_str()).copied())
            .collect();
        for pair in entries.windows(2) {
            let (a, b) = (root(&mut parent, pair[0]), root(&mut parent, pair[1]));
            parent[a] = b;
        }
        entries.iter().for_each(|&at| in_namespace[at] = true);
    }
    let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for at in 0..held.len() {
        let r = root(&mut parent, at);
        groups.entry(r).or_default().push(at);
    }
    let mut together = std::collections::HashMap::new();
    for (&group, entries) in &groups {
        let holders: Vec<&Reservation> = entries
            .iter()
            .flat_map(|&at| held[at].holders.iter().copied())
            .collect();
        if holders.len() < 2 {
            continue;
        }
        let sum = |f: &dyn Fn(&GpuShare) -> u64| {
            entries
                .iter()
                .fold(0u64, |total, &at| total.saturating_add(f(held[at].share)))
        };
        let judged = Together {
            used: holders
                .iter()
                .filter_map(|r| used(&r.container_id))
                .reduce(u64::saturating_add),
            reserved: sum(&|s| s.bytes),
            limit: sum(&|s| s.limit_bytes()),
            holders: holders.len(),
            shared_namespace: entries.iter().any(|&at| in_namespace[at]),
            group,
        };
        for r in holders {
            together.insert(r.container_id.as_str(), judged);
        }
    }
    together
}

pub fn build_report(
    sources: &Sources,
    rules: &Rules,
    state_dir: &Path,
    ledger: &Ledger,
) -> Result<StatusReport, crate::inventory::InventoryError> {
    let snapshot = sources.inventory.snapshot()?;
    let attribution =
        attribution::attribute_measured(ledger, &snapshot.processes, sources.pid_namespace, sources.cgroup_usage);
    let now = sources.clock.now_unix_ms();
    let can_see_processes = sources.inventory.sees_processes();
    let alive = |p: &ProcessIdentity| match sources.liveness.life(p) {
        Life::Alive => Some(true),
        Life::Gone => Some(false),
        Life::Unknown => None,
    };
    let gpus = snapshot
        .gpus
        .iter()
        .map(|gpu| {
            let account = admission::account(ledger, gpu, &attribution.allocated, rules);
            let used_by = |id: &str| {
                let key = (id.to_string(), gpu.uuid.clone());
                (can_see_processes || attribution.measured.contains(&key))
                    .then(|| attribution.allocated.get(&key).copied().unwrap_or(0))
            };
            let shared: Vec<&[String]> = attribution.shared_on(&gpu.uuid).collect();
            let together = held_together(ledger, &gpu.uuid, &shared, &used_by);
            let reservations = ledger
                .reservations
                .iter()
                .filter_map(|r| {
                    let share = r.gpus.iter().find(|s| s.uuid == gpu.uuid)?;
                    let used = used_by(&r.container_id);
                    let (judged, limit) = together
                        .get(r.container_id.as_str())
                        .map_or((used, share.limit_bytes()), |t| (t.used, t.limit));
                    Some(ReservationStatus {
                        container_id: r.container_id.clone(),
                        name: shown_name(&r.name),
                        bytes: share.bytes,
                        limit: share.limit_bytes(),
                        used,
                        over_reservation: judged.is_some_and(|u| u > limit),
                        age_ms: now.saturating_sub(r.created_unix_ms),
                        waited_ms: r.waited_ms,
                        pid: r.init.pid,
                        alive: alive(&r.init),
                        pending: r.pending,
                        tier: r.enforcement,
                    })
                })
                .collect();
            let this_gpu = [GpuShare {
                uuid: gpu.uuid.clone(),
                bytes: 0,
                limit: None,
            }];
            let queue = ledger
                .queue
                .iter()
                .filter_map(|t| Some((t, t.gpus.iter().find(|s| s.uuid == gpu.uuid)?)))
                .map(|(t, share)| TicketStatus {
                    position: crate::queue_order::position(ledger, Some(t.ticket), &this_gpu),
                    ticket: t.ticket,
                    container_id: t.container_id.clone(),
                    name: shown_name(&t.name),
                    bytes: share.bytes,
                    limit: share.limit_bytes(),
                    waited_ms: now.saturating_sub(t.enqueued_unix_ms),
                    deadline_in_ms: t.deadline_unix_ms.saturating_sub(now),
                    waiter_pid: t.waiter.pid,
                    alive: alive(&t.waiter),
                    choose: t.choose.map(|count| TicketChoice {
                        count,
                        candidates: t.gpus.len(),
                    }),
                })
                .collect();
            GpuStatus {
                gpu: gpu.clone(),
                available: account.available(),
                used_outside: account.used_outside(),
                account,
                reservations,
                queue,
                outside_processes: attribution
                    .outside
                    .iter()
                    .filter(|p| p.gpu_uuid == gpu.uuid)
                    .cloned()
                    .collect(),
            }
        })
        .collect();
    Ok(StatusReport {
        inventory: sources.inventory.describe(),
        state_dir: state_dir.display().to_string(),
        generation: ledger.generation,
        gpus,
        allocated: attribution.allocated,
        shared: attribution.shared,
        unattributed: attribution.unattributed,
        snapshot,
    })
}

/// A name read back from the ledger, which someone may have edited: shown only where it is one
/// admission could have written ([`crate::request::checked_name`]), the id otherwise.
fn shown_name(name: &Option<String>) -> Option<String> {
    name.as_deref()
        .and_then(crate::request::checked_name)
        .map(str::to_string)
}

/// The report narrowed to the container `container_id`: its reservation or ticket on each GPU
/// that has one, and only those GPUs (`vramgate status NAME|ID`).
pub fn only(report: &mut StatusReport, container_id: &str) {
    for gpu in &mut report.gpus {
        gpu.reservations.retain(|r| r.container_id == container_id);
        gpu.queue.retain(|t| t.container_id == container_id);
        gpu.outside_processes.clear();
    }
    report
        .gpus
        .retain(|g| !g.reservations.is_empty() || !g.queue.is_empty());
}

/// What the CONTAINER column shows: the name where there is one, else the id, cut.
fn shown(name: &Option<String>, id: &str) -> String {
    name.clone().unwrap_or_else(|| short_id(id))
}

fn short_id(id: &str) -> String {
    if id.len() > 24 && id.is_char_boundary(24) {
        format!("{}…", &id[..24])
    } else {
        id.to_string()
    }
}

/// The human table.
pub fn render(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "inventory: {}   state: {}", report.inventory, report.state_dir);
    for gpu in &report.gpus {
        let a = &gpu.account;
        let _ = writeln!(
            out,
            "\nGPU {}  {}\n  total {}   free now {}   reserved {} ({} containers)   available to new requests {}   used outside vramgate {}   headroom {}",
            a.index,
            a.uuid,
            format_bytes(a.total),
            format_bytes(a.free),
            format_bytes(a.reserved),
            a.reservations,
            format_bytes(gpu.available),
            format_bytes(gpu.used_outside),
            format_bytes(a.headroom),
        );
        if a.limits != a.reserved || a.limit_overcommit > 0 {
            let _ = writeln!(
                out,
                "  limits {} of at most {} ([queue] limit_overcommit {})",
                format_bytes(a.limits),
                format_bytes(a.limit_capacity()),
                format_bytes(a.limit_overcommit),
            );
        }
        if gpu.reservations.is_empty() {
            let _ = writeln!(out, "  no reservations");
        } else {
            let _ = writeln!(
                out,
                "  {:<26} {:>11} {:>11} {:>11} {:>8} {:>8} {:>13}  NOTE",
                "CONTAINER", "RESERVED", "LIMIT", "USED", "AGE", "PID", "ENFORCED BY"
            );
            for r in &gpu.reservations {
                let used = r.used.map(format_bytes).unwrap_or_else(|| "-".into());
                let mut note = String::new();
                if r.alive == Some(false) {
                    note += "gone (reclaimed at the next transaction or `vramgate gc`) ";
                }
                if r.over_reservation && r.limit > r.bytes {
                    note += "USING MORE THAN ITS LIMIT ";
                } else if r.over_reservation {
                    note += "USING MORE THAN RESERVED ";
                }
                if r.pending {
                    note += "starting (reserved at create, pid is the runtime) ";
                }
                if r.waited_ms > 0 {
                    note += &format!(
                        "waited {}",
                        format_duration(std::time::Duration::from_millis(r.waited_ms))
                    );
                }
                let _ = writeln!(
                    out,
                    "  {:<26} {:>11} {:>11} {:>11} {:>8} {:>8} {:>13}  {}",
                    shown(&r.name, &r.container_id),
                    format_bytes(r.bytes),
                    format_bytes(r.limit),
                    used,
                    format_duration(std::time::Duration::from_secs(r.age_ms / 1000)),
                    r.pid,
                    r.tier.map_or("-", |t| t.as_str()),
                    note.trim_end()
                );
            }
        }
        if !gpu.queue.is_empty() {
            let _ = writeln!(out, "  queue:");
            let _ = writeln!(
                out,
                "  {:>4} {:<26} {:>11} {:>11} {:>8} {:>10}",
                "#", "CONTAINER", "REQUEST", "LIMIT", "WAITED", "TIMEOUT IN"
            );
            for t in &gpu.queue {
                let _ = writeln!(
                    out,
                    "  {:>4} {:<26} {:>11} {:>11} {:>8} {:>10}{}",
                    t.position,
                    shown(&t.name, &t.container_id),
                    format_bytes(t.bytes),
                    format_bytes(t.limit),
                    format_duration(std::time::Duration::from_secs(t.waited_ms / 1000)),
                    format_duration(std::time::Duration::from_secs(t.deadline_in_ms / 1000)),
                    if t.alive == Some(false) { "  (waiter gone)" } else { "" }
                );
                if let Some(choice) = &t.choose {
                    let _ = writeln!(
                        out,
                        "       (placement: any {} of {} GPUs, listed on each)",
                        choice.count, choice.candidates
                    );
                }
            }
        }
        for p in &gpu.outside_processes {
            let _ = writeln!(
                out,
                "  outside any reservation: pid {} holds {}",
                p.pid,
                format_bytes(p.used)
            );
        }
    }
    out
}

/// Clears a terminal and puts the cursor home, as `watch nvidia-smi` redraws: the next table is
/// drawn over the last one instead of scrolling.
pub const CLEAR_HOME: &str = "\x1b[H\x1b[2J";

/// One redraw of `vramgate status --watch`: on a terminal the screen cleared and `body` drawn
/// from the top under `header` (as watch(1) heads its screen); elsewhere (a pipe, a file, a log)
/// no control sequence at all, each table after the last under its `header` line.
pub fn watch_frame(header: &str, body: &str, terminal: bool) -> String {
    if terminal {
        format!("{CLEAR_HOME}{header}\n\n{body}")
    } else {
        format!("{header}\n{body}\n")
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn the_container_column_shows_the_name_and_the_id_where_there_is_none() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(shown(&Some("team-a/train/trainer".into()), id), "team-a/train/trainer");
        assert_eq!(shown(&None, id), "0123456789abcdef01234567…");
    }

    #[test]
    fn a_name_someone_wrote_into_the_ledger_by_hand_is_not_shown() {
        assert_eq!(shown_name(&Some("ns/pod/c".into())).as_deref(), Some("ns/pod/c"));
        assert_eq!(shown_name(&Some("x\n  GPU 9 fake line".into())), None);
        assert_eq!(shown_name(&Some("a\x1b[2J".into())), None);
    }

    #[test]
    fn a_watch_frame_redraws_in_place_only_on_a_terminal() {
        let on_tty = watch_frame("Every 2.0s", "table\n", true);
        assert!(on_tty.starts_with(CLEAR_HOME), "{on_tty:?}");
        let piped = watch_frame("Every 2.0s", "table\n", false);
        assert!(!piped.contains('\x1b'), "{piped:?}");
        assert_eq!(piped, "Every 2.0s\ntable\n\n");
    }
}
