use super::*;
use crate::ledger::{Reservation, Ticket};
use crate::procfs::ProcessIdentity;
use crate::quantity::Quantity;

const MI: u64 = 1 << 20;
const CARD: u64 = 24_265 * MI;

fn admit(shares: &[GpuShare]) -> Decision {
    Decision::Admit {
        shares: shares.to_vec(),
        placement: None,
    }
}

fn rules() -> Rules {
    Rules {
        strategy: Strategy::BestFit,
        limit_overcommit_ppm: 0,
        headroom: Quantity::Bytes(0),
        backfill: false,
        backfill_bound: Duration::from_secs(30),
        backfill_order: crate::queue_order::BackfillOrder::Arrival,
    }
}

fn gpu(uuid: &str, total: u64, free: u64) -> GpuMemory {
    GpuMemory {
        index: 0,
        mig_index: None,
        uuid: uuid.into(),
        minor: Some(0),
        total,
        free,
        mig_caps: Vec::new(),
    }
}

fn snap(free: u64) -> Snapshot {
    Snapshot {
        gpus: vec![gpu("G", CARD, free)],
        ..Default::default()
    }
}

fn share(bytes: u64) -> Vec<GpuShare> {
    vec![GpuShare {
        uuid: "G".into(),
        bytes,
        limit: None,
    }]
}

fn reserve(ledger: &mut Ledger, id: &str, bytes: u64) {
    ledger.reservations.push(Reservation::held(
        id,
        share(bytes),
        ProcessIdentity { pid: 1, start_time: 1 },
    ));
}

fn enqueue(ledger: &mut Ledger, bytes: u64, at_ms: u64) -> u64 {
    let ticket = ledger.next_ticket;
    ledger.next_ticket += 1;
    ledger.queue.push(Ticket {
        ticket,
        enqueued_unix_ms: at_ms,
        deadline_unix_ms: u64::MAX,
        ..Ticket::for_test(&format!("t{ticket}"), share(bytes))
    });
    ticket
}

#[test]
fn paper_card_holds_twenty_of_1205_mib() {
    let mut ledger = Ledger::default();
    let mut admitted = 0;
    for n in 0..25 {
        match decide_named(
            &ledger,
            &snap(CARD),
            &Allocated::new(),
            &rules(),
            &share(1205 * MI),
            None,
            0,
        ) {
            Decision::Admit { .. } => {
                reserve(&mut ledger, &format!("c{n}"), 1205 * MI);
                admitted += 1;
            }
            Decision::NoRoom { account, .. } => assert!(account.available() < 1205 * MI),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(admitted, 20);
    assert!(ledger.reserved_on("G") <= CARD);
}

#[test]
fn never_fits_is_refused_even_when_empty() {
    let d = decide_named(
        &Ledger::default(),
        &snap(CARD),
        &Allocated::new(),
        &rules(),
        &share(CARD + 1),
        None,
        0,
    );
    assert!(matches!(d, Decision::Never { .. }));
    let mut r = rules();
    r.headroom = Quantity::Bytes(MI);
    assert!(matches!(
        decide_named(
            &Ledger::default(),
            &snap(CARD),
            &Allocated::new(),
            &r,
            &share(CARD),
            None,
            0
        ),
        Decision::Never { .. }
    ));
}

#[test]
fn outside_usage_blocks_and_allocation_is_not_counted_twice() {
    // 20 GiB used by something outside vramgate: only ~3.7 GiB can be promised.
    let s = snap(CARD - (20 << 30));
    assert!(matches!(
        decide_named(
            &Ledger::default(),
            &s,
            &Allocated::new(),
            &rules(),
            &share(4 << 30),
            None,
            0
        ),
        Decision::NoRoom { .. }
    ));
    assert_eq!(
        decide_named(
            &Ledger::default(),
            &s,
            &Allocated::new(),
            &rules(),
            &share(3 << 30),
            None,
            0
        ),
        admit(&share(3 << 30))
    );

    // A container reserved 10 GiB and has allocated 8 of it: free already excludes the 8.
    let mut ledger = Ledger::default();
    reserve(&mut ledger, "c", 10 << 30);
    let s = snap(CARD - (8 << 30));
    let mut allocated = Allocated::new();
    let account_without = account(&ledger, &s.gpus[0], &allocated, &rules());
    allocated.insert(("c".into(), "G".into()), 8 << 30);
    let account_with = account(&ledger, &s.gpus[0], &allocated, &rules());
    assert_eq!(account_with.available(), CARD - (10 << 30));
    assert_eq!(
        account_without.available(),
        CARD - (18 << 30),
        "unknown usage is counted as unallocated"
    );
    assert_eq!(account_with.used_outside(), 0);
}

#[test]
fn fifo_and_bounded_backfill() {
    let mut ledger = Ledger::default();
    reserve(&mut ledger, "big", CARD - (2 << 30));
    let old = enqueue(&mut ledger, 10 << 30, 0);
    let small = share(1 << 30);
    // Fits, but an older waiter shares the GPU: strict FIFO holds it back.
    assert_eq!(
        decide_named(&ledger, &snap(CARD), &Allocated::new(), &rules(), &small, None, 1_000),
        Decision::Queued { ahead: 1 }
    );
    // The head itself is judged on memory only.
    assert!(matches!(
        decide_named(
            &ledger,
            &snap(CARD),
            &Allocated::new(),
            &rules(),
            &share(10 << 30),
            Some(old),
            1_000
        ),
        Decision::NoRoom { .. }
    ));
    // Backfill lets it pass a young waiter, but not one older than the bound.
    let mut r = rules();
    r.backfill = true;
    assert_eq!(
        decide_named(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 1_000),
        admit(&small)
    );
    assert_eq!(
        decide_named(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 31_000),
        Decision::Queued { ahead: 1 }
    );
}

/// The bound is measured on the boot clock: the wall clock stepped back an hour does not
/// let backfill pass a waiter that has waited past the bound, and stepped forward an hour
/// it does not hold small requests behind a waiter that has just arrived.
#[test]
fn the_backfill_bound_ignores_wall_clock_steps() {
    let mut ledger = Ledger::default();
    reserve(&mut ledger, "big", CARD - (2 << 30));
    let t = enqueue(&mut ledger, 10 << 30, 10_000_000);
    ledger
        .queue
        .iter_mut()
        .find(|q| q.ticket == t)
        .unwrap()
        .enqueued_boot_ms = Some(50_000);
    let small = share(1 << 30);
    let mut r = rules();
    r.backfill = true;
    let at = |unix_ms, boot_ms| {
        decide(
            &ledger,
            &snap(CARD),
            &Allocated::new(),
            &r,
            &small,
            None,
            None,
            None,
            Stamp {
                unix_ms,
                boot_ms: Some(boot_ms),
            },
        )
    };
    // 40 s waited (past the 30 s bound) while the wall clock went back an hour.
    assert_eq!(
        at(10_000_000 - 3_600_000 + 40_000, 90_000),
        Decision::Queued { ahead: 1 }
    );
    // 1 s waited while the wall clock went forward an hour: backfill may still pass it.
    assert_eq!(at(10_000_000 + 3_600_000, 51_000), admit(&small));
    // A ticket without a boot time (an older vramgate's) is aged on the wall clock.
    ledger.queue.iter_mut().for_each(|q| q.enqueued_boot_ms = None);
    assert_eq!(
        decide_named(&ledger, &snap(CARD), &Allocated::new(), &r, &small, None, 10_031_000),
        Decision::Queued { ahead: 1 }
    );
}

#[test]
fn multi_gpu_is_all_or_nothing() {
    let s = Snapshot {
        gpus: vec![gpu("A", CARD, CARD), gpu("B", CARD, 1 << 30)],
        ..Default::default()
    };
    let both = vec![
        GpuShare {
            uuid: "A".into(),
            bytes: 2 << 30,
            limit: None,
        },
        GpuShare {
            uuid: "B".into(),
            bytes: 2 << 30,
            limit: None,
        },
    ];
    match decide_named(&Ledger::default(), &s, &Allocated::new(), &rules(), &both, None, 0) {
        Decision::NoRoom { account, .. } => assert_eq!(account.uuid, "B"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn vanished_gpu_never_fits() {
    let d = decide_named(
        &Ledger::default(),
        &snap(CARD),
        &Allocated::new(),
        &rules(),
        &[GpuShare {
            uuid: "gone".into(),
            bytes: 1,
            limit: None,
        }],
        None,
        0,
    );
    assert!(matches!(d, Decision::Never { .. }));
}

/// Rule 4: requests of 2 GiB with limits of 6 GiB on an 8 GiB card. The first fits; the
/// second has room for its request but not its limit at the default 0%, and fits at 50%
/// (limits may add up to 12 GiB). A limit past the card plus the bound never fits.
#[test]
fn the_sum_of_limits_is_bounded_by_limit_overcommit() {
    const GI: u64 = 1 << 30;
    let card = Snapshot {
        gpus: vec![gpu("G", 8 * GI, 8 * GI)],
        ..Default::default()
    };
    let asked = [GpuShare::new("G", 2 * GI, 6 * GI)];
    let mut ledger = Ledger::default();
    assert_eq!(
        decide_named(&ledger, &card, &Allocated::new(), &rules(), &asked, None, 0),
        admit(&asked)
    );
    ledger.reservations.push(Reservation {
        gpus: asked.to_vec(),
        ..Reservation::for_test("a", "G", 0)
    });
    match decide_named(&ledger, &card, &Allocated::new(), &rules(), &asked, None, 0) {
        Decision::NoRoom {
            request,
            account,
            bound: Bound::Limits,
            ..
        } => {
            assert_eq!(
                (request, account.limits, account.limit_room()),
                (6 * GI, 6 * GI, 2 * GI)
            );
            assert!(
                account
                    .describe_limits()
                    .contains("room for limits up to 8192 MiB in all"),
                "{}",
                account.describe_limits()
            );
        }
        other => panic!("{other:?}"),
    }
    let half = Rules {
        limit_overcommit_ppm: 500_000,
        ..rules()
    };
    assert_eq!(
        decide_named(&ledger, &card, &Allocated::new(), &half, &asked, None, 0),
        admit(&asked)
    );
    // The request itself is still rule 1's: 2 GiB reserved, 7 asked, does not fit.
    let big = [GpuShare::new("G", 7 * GI, 7 * GI)];
    assert!(matches!(
        decide_named(&ledger, &card, &Allocated::new(), &half, &big, None, 0),
        Decision::NoRoom {
            bound: Bound::Memory,
            ..
        }
    ));
    let huge = [GpuShare::new("G", 2 * GI, 13 * GI)];
    assert!(matches!(
        decide_named(&Ledger::default(), &card, &Allocated::new(), &half, &huge, None, 0),
        Decision::Never { request, bound: Bound::Limits, .. } if request == 13 * GI
    ));
}

/// `ledger_has_room` errs only towards "room": wherever `decide` admits, on any free memory,
/// allocation, headroom and limits, it says so too. A waiter that trusts its "no" and stays
/// off the lock can therefore never miss an admission the ledger it read allows.
#[test]
fn ledger_has_room_never_denies_what_decide_admits() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    const GI: u64 = 1 << 30;
    let (mut admitted, mut denied) = (0, 0);
    for _ in 0..20_000 {
        let total = 16 * GI;
        let rules = Rules {
            headroom: Quantity::Bytes(next(3) * GI / 2),
            limit_overcommit_ppm: [0, 250_000][next(2) as usize],
            ..rules()
        };
        let mut ledger = Ledger::default();
        let mut allocated = Allocated::new();
        for i in 0..next(5) {
            let uuid = ["A", "B"][next(2) as usize];
            let bytes = (1 + next(6)) * GI;
            let limit = if next(2) == 0 { 0 } else { bytes + next(4) * GI };
            let id = format!("r{i}");
            allocated.insert((id.clone(), uuid.to_string()), next(bytes + 1));
            ledger.reservations.push(Reservation::held(
                &id,
                vec![GpuShare::new(uuid, bytes, limit)],
                ProcessIdentity { pid: 1, start_time: 1 },
            ));
        }
        let gpus: Vec<GpuMemory> = ["A", "B"]
            .iter()
            .map(|u| gpu(u, total, total - next(total / GI + 1) * GI))
            .collect();
        let snapshot = Snapshot {
            gpus: gpus.clone(),
            ..Default::default()
        };
        let asked = |next: &mut dyn FnMut(u64) -> u64, uuid: &str| {
            let bytes = (1 + next(8)) * GI;
            GpuShare::new(uuid, bytes, if next(2) == 0 { 0 } else { bytes + next(3) * GI })
        };
        let (shares, choose) = match next(3) {
            0 => {
                let uuid = ["A", "B"][next(2) as usize];
                (vec![asked(&mut next, uuid)], None)
            }
            1 => (vec![asked(&mut next, "A"), asked(&mut next, "B")], None),
            _ => {
                let a = asked(&mut next, "A");
                let b = GpuShare {
                    uuid: "B".into(),
                    ..a.clone()
                };
                (vec![a, b], Some(1))
            }
        };
        let decision = decide(
            &ledger,
            &snapshot,
            &allocated,
            &rules,
            &shares,
            choose,
            None,
            None,
            Stamp::wall(0),
        );
        let room = ledger_has_room(&ledger, &gpus, &rules, &shares, choose);
        if matches!(decision, Decision::Admit { .. }) {
            admitted += 1;
            assert!(room, "{ledger:?} {gpus:?} {shares:?} {choose:?}");
        } else if !room {
            denied += 1;
        }
    }
    // Both sides were exercised.
    assert!(admitted > 1000 && denied > 1000, "{admitted} {denied}");
}
