//! The admission rule on the GPUs' numbers, and carrying its decision out on the ledger:
//! reserve, refuse, or queue.

use std::path::Path;
use std::time::Duration;

use super::attempt::{At, Step};
use super::queue_wait::{Asked, Progress};
use super::{Admission, AdmitRequest, Refusal, Result, Service, ServiceError, Shortage};
use crate::admission::{self, Decision};
use crate::attribution;
use crate::config::Policy;
use crate::events::{Event, Kind};
use crate::inventory::Snapshot;
use crate::ledger::{ClaimHold, ClaimOf, GpuShare, Ledger, Reclaimed, Reservation, Ticket};
use crate::procfs;
use crate::quantity::format_duration;
use crate::request::{Request, RequestError};

/// What the admission rule concluded, with what it concluded it from.
pub(super) struct Decided {
    decision: Decision,
    /// The claim this container holds once with its pod's other holders, where it may.
    hold: Option<ClaimHold>,
    /// The resource claim whose own reservation this container takes over.
    took_over: Option<ClaimOf>,
    snapshot: Snapshot,
    shares: Vec<GpuShare>,
    choose: Option<u32>,
    /// The request's own shares, before a limit reserved whole for an older reader widened
    /// them: what a waiter judges its room by ([`super::queue_wait::Asked`]).
    asked: Vec<GpuShare>,
}

/// The resource claim a container's checked claim devices all belong to: their CDI names are
/// `<claim uid>-<device>` ([`crate::dra::cdi_spec`]). `None` without claim devices, or with
/// devices of several claims.
fn one_claim_uid(claim_devices: &[String]) -> Option<&str> {
    let mut uids = claim_devices
        .iter()
        .map(|d| d.get(..36).filter(|_| d.as_bytes().get(36) == Some(&b'-')));
    let first = uids.next()??;
    uids.all(|u| u == Some(first)).then_some(first)
}

impl Service<'_> {
    /// What a container of a pod holds with the other containers of its pod that were given the
    /// same claim devices ([`ClaimHold`]): its checked claim devices and its pod sandbox, where
    /// it has both and the node holds such containers together (see `claims_held_together`).
    /// `watch_runs`: whether holders may count once now ([`Service::watch_runs`]).
    fn claim_hold(&self, request: &Request, watch_runs: bool) -> Option<ClaimHold> {
        if !watch_runs {
            return None;
        }
        let pod = request.pod_sandbox.clone()?;
        (!request.claim_devices.is_empty()).then(|| ClaimHold {
            pod,
            devices: request.claim_devices.clone(),
        })
    }

    /// The admission rule on the GPUs' numbers now (see [`crate::admission`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &self,
        ledger: &mut Ledger,
        checked_all: bool,
        reclaimed: &mut Reclaimed,
        req: &AdmitRequest,
        progress: &Progress,
        at: At,
        read_before_lock: Option<Snapshot>,
    ) -> Result<Decided> {
        // Process lists matter only where live reservations are (to count what those
        // containers already allocated); everywhere else the driver's free memory says it all.
        // A transaction reads them before it locks (see `attempt_locked`); a caller deciding on
        // a ledger in memory reads them here.
        let snapshot = match read_before_lock {
            Some(snapshot) => snapshot,
            None => self
                .inventory
                .snapshot_with_processes(&|uuid: &str| ledger.has_reservations_on(uuid))?,
        };
        let (mut shares, choose) = shares_for(req.request, &snapshot, req.container, req.pending)?;
        let asked = shares.clone();
        // A hook of a release without limits waits and will read what this writes: the limit
        // is decided on and reserved whole, as that release would (see ledger/compat.rs), so
        // the rewrite that leaves limits out of the file cannot fill a GPU past its memory.
        if shares.iter().any(|s| s.limit.is_some()) && crate::ledger::limits_must_be_reserved(ledger) {
            for share in &mut shares {
                *share = GpuShare::new(std::mem::take(&mut share.uuid), share.limit_bytes(), 0);
            }
        }
        // A claim hold is in question where this container could hold one or the ledger holds
        // some: only then is the watch's heartbeat looked at.
        let holds_in_ledger = ledger.reservations.iter().any(|r| r.claim.is_some());
        let could_hold =
            self.claims_held_together && req.request.pod_sandbox.is_some() && !req.request.claim_devices.is_empty();
        let watch_runs = (holds_in_ledger || could_hold) && self.watch_runs();
        let hold = self.claim_hold(req.request, watch_runs);
        // The claim's first container takes over the reservation the DRA driver made for the
        // claim at allocation: the memory is already held, so it is admitted as it is, ahead of
        // any queue, and the claim's own entry goes in the same write (counted once).
        let claim = one_claim_uid(&req.request.claim_devices);
        if let Some(at) = claim.and_then(|uid| ledger.claim_reservation(uid)) {
            let held = &ledger.reservations[at].gpus;
            let covered = shares.iter().all(|s| {
                held.iter()
                    .any(|h| h.uuid == s.uuid && h.bytes >= s.bytes && h.limit_bytes() >= s.limit_bytes())
            });
            if choose.is_none() && covered {
                // What the container holds leaves the claim's entry; the rest of the claim (a
                // request on another GPU that this container was not given) stays held by the
                // claim until another of its containers takes it or the claim is deallocated.
                let claim_entry = &mut ledger.reservations[at];
                let took_over = claim_entry.claim_of.clone();
                for share in &shares {
                    if let Some(h) = claim_entry.gpus.iter_mut().find(|h| h.uuid == share.uuid) {
                        *h = GpuShare::new(
                            h.uuid.clone(),
                            h.bytes - share.bytes,
                            h.limit_bytes() - share.limit_bytes(),
                        );
                    }
                }
                claim_entry.gpus.retain(|h| h.bytes > 0);
                if claim_entry.gpus.is_empty() {
                    ledger.reservations.remove(at);
                }
                return Ok(Decided {
                    decision: Decision::Admit {
                        shares: shares.clone(),
                        placement: None,
                    },
                    hold,
                    took_over,
                    snapshot,
                    shares,
                    choose,
                    asked,
                });
            }
        }
        if let Some(joined) = admission::joins_claim(ledger, hold.as_ref(), &shares, choose) {
            return Ok(Decided {
                decision: joined,
                hold,
                took_over: None,
                snapshot,
                shares,
                choose,
                asked,
            });
        }
        let decide = |ledger: &Ledger| {
            // Without a watch seen running, the holds already recorded count each holder whole
            // too (a watch that has stopped stops nobody): decided on the ledger without them.
            let whole;
            let ledger = if holds_in_ledger && !watch_runs {
                let mut copy = ledger.clone();
                copy.reservations.iter_mut().for_each(|r| r.claim = None);
                whole = copy;
                &whole
            } else {
                ledger
            };
            self.rule_on(
                ledger,
                &snapshot,
                &shares,
                choose,
                progress.ticket,
                req.request.expected_duration.map(|d| d.as_millis() as u64),
                at.now,
            )
        };
        let mut decision = decide(ledger);
        if matches!(decision, Decision::NoRoom { .. }) && !checked_all {
            // Only part of a large ledger was checked; before anyone is refused or queued for
            // lack of room, every reservation is. Reclaiming only adds room, so a request
            // admitted without this would be admitted with it too.
            reclaimed.extend(ledger.reclaim_all(self.liveness));
            decision = decide(ledger);
        }
        Ok(Decided {
            decision,
            hold,
            took_over: None,
            snapshot,
            shares,
            choose,
            asked,
        })
    }

    /// The admission rule ([`admission::decide`]) on `ledger` and the GPUs' numbers in
    /// `snapshot`, with what the ledger's containers already allocated: what a container's
    /// admission and a claim's reservation at allocation ([`Service::reserve_claim`]) both ask.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rule_on(
        &self,
        ledger: &Ledger,
        snapshot: &Snapshot,
        shares: &[GpuShare],
        choose: Option<u32>,
        ticket: Option<u64>,
        expected_ms: Option<u64>,
        now: crate::clock::Stamp,
    ) -> Decision {
        let usage = self.cgroup_usage(ledger);
        let allocated =
            attribution::attribute_measured(ledger, &snapshot.processes, procfs::pid_namespace, usage).allocated;
        admission::decide(
            ledger,
            snapshot,
            &allocated,
            &self.rules,
            shares,
            choose,
            ticket,
            expected_ms,
            now,
        )
    }

    /// Carries a decision out on the ledger: reserve, refuse, or queue (the ticket is taken
    /// at the first wait and kept by later ones).
    pub(super) fn apply(
        &self,
        ledger: &mut Ledger,
        decided: Decided,
        req: &AdmitRequest,
        progress: &mut Progress,
        log: &mut Vec<Event>,
        at: At,
    ) -> Step {
        let id = req.container;
        // Another container of the pod took the claim over, and this one is not counted with it.
        let claim_held_by_sibling = decided.hold.is_none()
            && one_claim_uid(&req.request.claim_devices).is_some_and(|uid| {
                ledger
                    .reservations
                    .iter()
                    .any(|r| r.took_over_claim.as_ref().is_some_and(|c| c.uid == uid))
            });
        let Decided {
            decision,
            hold,
            took_over,
            snapshot,
            shares,
            choose,
            asked,
        } = decided;
        let refuse = |ledger: &mut Ledger, log: &mut Vec<Event>, kind: Kind, refusal: Refusal| {
            log.push(self.event(kind, id, &shares, refusal.to_string()));
            if kind == Kind::Timeout {
                ledger.counters.record_timeout();
            } else {
                ledger.counters.record_refuse();
            }
            Step::Done(Admission::Refused(refusal))
        };
        let shortage = match decision {
            Decision::Admit {
                shares: chosen,
                placement,
            } => {
                let queued = progress.ticket.is_some();
                let waited = if queued { at.waited } else { Duration::ZERO };
                // Only a confirmation takes the spec's word on the tier (see
                // AdmitRequest::enforcement), so none is recorded here.
                ledger.reservations.push(Reservation {
                    waited_ms: waited.as_millis() as u64,
                    bundle: req.bundle.map(Path::to_path_buf),
                    pending: req.pending,
                    claim: hold,
                    cgroup: req.cgroup.map(str::to_string),
                    name: req.request.name.clone(),
                    took_over_claim: took_over.clone(),
                    ..Reservation::new(id, chosen.clone(), req.init, at.now.unix_ms)
                });
                let kind = if queued { Kind::AdmitAfterWait } else { Kind::Admit };
                let mut detail = format!("{} from {}", req.request.memory, req.request.memory_source);
                if let Some(limit) = req.request.limit {
                    detail += &format!(", limit {limit} from {}", req.request.limit_source);
                }
                if queued {
                    detail += &format!(", after waiting {}", format_duration(waited));
                }
                if let Some(placement) = &placement {
                    detail += &format!("; placed {}", placement.describe());
                }
                if let Some(claim) = &took_over {
                    detail += &format!(
                        "; holds what resource claim {}/{} reserved at allocation",
                        claim.namespace, claim.name
                    );
                }
                let mut event = self.event(kind, id, &chosen, detail);
                event.placement = placement.clone();
                log.push(event);
                for note in &req.request.notes {
                    log.push(self.event(Kind::Note, id, &[], note.clone()));
                }
                ledger.counters.record_admit(queued.then_some(waited));
                let gpus = chosen
                    .iter()
                    .filter_map(|s| snapshot.by_uuid(&s.uuid).cloned())
                    .collect();
                return Step::Done(Admission::Admitted {
                    waited,
                    queued,
                    shares: chosen,
                    gpus,
                    placement,
                });
            }
            Decision::Never {
                request,
                account,
                among,
                bound,
            } => {
                let refusal = Refusal::NeverFits {
                    container: id.to_string(),
                    request,
                    account,
                    among,
                    bound,
                };
                return refuse(ledger, log, Kind::Refuse, refusal);
            }
            Decision::NoRoom {
                request,
                account,
                among,
                bound,
            } => Shortage::Memory {
                request,
                account,
                among,
                bound,
            },
            Decision::Queued { ahead } => Shortage::Queue { ahead },
        };
        let position = match shortage {
            Shortage::Queue { ahead } => ahead + 1,
            Shortage::Memory { .. } => crate::queue_order::position(ledger, progress.ticket, &shares),
        };
        progress.last = Some((shortage.clone(), position));
        // A container that could join its pod's claim hold takes nothing when it does, so
        // no room can be judged for it: it keeps trying on every change.
        progress.asked = hold.is_none().then(|| Asked::new(asked, choose, &snapshot));
        if req.policy == Policy::Reject {
            let refusal = if claim_held_by_sibling {
                Refusal::ClaimHeldTwice {
                    container: id.to_string(),
                    shortage,
                }
            } else {
                Refusal::NoRoom {
                    container: id.to_string(),
                    shortage,
                }
            };
            return refuse(ledger, log, Kind::Refuse, refusal);
        }
        if at.waited >= req.wait_for {
            let refusal = Refusal::TimedOut {
                container: id.to_string(),
                waited: at.waited,
                position,
                shortage,
            };
            return refuse(ledger, log, Kind::Timeout, refusal);
        }
        if progress.ticket.is_none() {
            let now = at.now.unix_ms;
            // kubelet's retry of a start it gave up on while it waited takes the place its
            // first attempt had (see KeptPlace): otherwise it would queue at the back with a
            // fresh age, and backfill could pass it for another whole bound on every retry.
            let kept = req
                .request
                .pod_container
                .as_ref()
                .and_then(|c| ledger.take_kept_place(c, at.now));
            let ticket = ledger.enqueue_at(
                Ticket {
                    ticket: 0,
                    container_id: id.to_string(),
                    gpus: shares.clone(),
                    waiter: req.waiter,
                    enqueued_unix_ms: now,
                    enqueued_boot_ms: at.now.boot_ms,
                    deadline_unix_ms: now.saturating_add(req.wait_for.saturating_sub(at.waited).as_millis() as u64),
                    bundle: req.bundle.map(Path::to_path_buf),
                    choose,
                    expected_ms: req.request.expected_duration.map(|d| d.as_millis() as u64),
                    pod_container: req.request.pod_container.clone(),
                    name: req.request.name.clone(),
                    extra: Default::default(),
                },
                kept.as_ref(),
            );
            progress.ticket = Some(ticket);
            let detail = match &kept {
                None => format!("ticket {ticket}, number {position}: {shortage}"),
                Some(k) => format!(
                    "ticket {ticket}, number {}, the place of its earlier attempt (waiting {}): {shortage}",
                    crate::queue_order::position(ledger, Some(ticket), &shares),
                    format_duration(Duration::from_millis(
                        at.now.ms_since(k.enqueued_unix_ms, k.enqueued_boot_ms)
                    ))
                ),
            };
            log.push(self.event(Kind::Enqueue, id, &shares, detail));
        }
        Step::Wait
    }
}

/// The memory each GPU share asks for on this host, resolved against the inventory. For a
/// placement (only when `placing`: the runtime wrapper at create), the shares are the
/// candidates and the count is how many to choose.
fn shares_for(
    request: &Request,
    snapshot: &Snapshot,
    container: &str,
    placing: bool,
) -> Result<(Vec<GpuShare>, Option<u32>)> {
    let request_error = |source| ServiceError::Request {
        container: container.to_string(),
        source,
    };
    let (uuids, choose) = match request.gpus.candidates(snapshot) {
        Some(_) if !placing => {
            // resolve() says why a placement cannot be made here.
            return Err(request_error(request.gpus.resolve(snapshot).expect_err("a placement")));
        }
        Some(found) => {
            let (count, uuids) = found.map_err(request_error)?;
            (uuids, Some(count))
        }
        None => (request.gpus.resolve(snapshot).map_err(request_error)?, None),
    };
    if uuids.is_empty() {
        return Err(request_error(RequestError::NoGpu {
            memory: request.memory.to_string(),
        }));
    }
    let shares = uuids
        .into_iter()
        .map(|uuid| {
            let total = snapshot.by_uuid(&uuid).map(|g| g.total).unwrap_or(0);
            let limit = request.limit_on(total).map_err(request_error)?;
            Ok(GpuShare::new(uuid, request.memory.bytes_on(total), limit))
        })
        .collect::<Result<_>>()?;
    Ok((shares, choose))
}
