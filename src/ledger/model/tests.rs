use super::*;

#[test]
fn exhausted_counters_are_corrupt() {
    for field in ["next_ticket", "generation"] {
        let mut json = serde_json::to_value(Ledger::default()).unwrap();
        json[field] = serde_json::json!(u64::MAX);
        let err = Ledger::parse(&serde_json::to_vec(&json).unwrap(), Path::new("/l")).unwrap_err();
        assert!(err.to_string().contains("at its maximum"), "{err}");
    }
}

#[test]
fn reserved_sum_saturates_instead_of_wrapping() {
    let share = |bytes| GpuShare {
        uuid: "GPU-a".into(),
        bytes,
        limit: None,
    };
    let reservation =
        |id: &str, bytes| Reservation::new(id, vec![share(bytes)], ProcessIdentity { pid: 1, start_time: 7 }, 1);
    let ledger = Ledger {
        reservations: vec![reservation("a", u64::MAX - 1), reservation("b", 5)],
        ..Ledger::default()
    };
    assert_eq!(ledger.reserved_on("GPU-a"), u64::MAX);
    assert_eq!(ledger.reserved_total(), u64::MAX);
    let mut two_gpus = reservation("c", u64::MAX / 2 + 1);
    two_gpus.gpus.push(share(u64::MAX / 2 + 1));
    assert_eq!(two_gpus.bytes(), u64::MAX, "the CLI prints this sum (gc, status)");
}

#[test]
fn enqueue_numbers_tickets_in_order() {
    let mut ledger = Ledger::default();
    let ticket = Ticket::for_test("c", vec![]);
    assert_eq!(ledger.enqueue(ticket.clone()), 1);
    assert_eq!(ledger.enqueue(ticket), 2);
    assert_eq!(ledger.next_ticket, 3);
    assert_eq!(ledger.remove_tickets_of("c", None).len(), 2);
}

#[test]
fn a_stop_releases_only_the_reservation_of_its_own_bundle() {
    let reservation = |bundle: Option<&str>| Reservation {
        bundle: bundle.map(PathBuf::from),
        ..Reservation::new("c", vec![], ProcessIdentity { pid: 1, start_time: 1 }, 0)
    };
    let live = reservation(Some("/run/containerd/ns-a/c"));
    assert!(live.belongs_to("c", Some(Path::new("/run/containerd/ns-a/c"))));
    assert!(
        !live.belongs_to("c", Some(Path::new("/run/containerd/ns-b/c"))),
        "a namesake elsewhere"
    );
    assert!(live.belongs_to("c", None), "vramgate release <id>");
    assert!(!live.belongs_to("d", None));
    assert!(
        reservation(None).belongs_to("c", Some(Path::new("/any"))),
        "an old ledger"
    );
}

/// A limit is written only where it is above the request, so a ledger without limits is
/// the format-1 file it always was; one with a limit is format 2 and reads back whole.
#[test]
fn a_limit_is_written_only_above_the_request() {
    let mut ledger = Ledger::default();
    let mut r = Reservation::for_test("a", "GPU-a", 2 << 30);
    r.gpus = vec![GpuShare::new("GPU-a", 2 << 30, 2 << 30)];
    ledger.reservations.push(r.clone());
    assert_eq!(ledger.format_needed(), 1);
    let plain = serde_json::to_string(&ledger).unwrap();
    assert!(
        plain.contains(r#""gpus":[{"uuid":"GPU-a","bytes":2147483648}]"#),
        "{plain}"
    );
    r.container_id = "b".into();
    r.gpus = vec![GpuShare::new("GPU-a", 2 << 30, 6 << 30)];
    ledger.reservations.push(r);
    assert_eq!(ledger.format_needed(), 2);
    assert_eq!(
        (ledger.reserved_on("GPU-a"), ledger.limits_on("GPU-a")),
        (4 << 30, 8 << 30)
    );
    ledger.schema = 2;
    let bytes = serde_json::to_vec(&ledger).unwrap();
    assert!(String::from_utf8_lossy(&bytes).contains(r#"{"uuid":"GPU-a","bytes":2147483648,"limit":6442450944}"#));
    assert_eq!(Ledger::parse(&bytes, Path::new("/l")).unwrap(), ledger);
    let below = String::from_utf8_lossy(&bytes).replace("6442450944", "1");
    let err = Ledger::parse(below.as_bytes(), Path::new("/l"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("has a limit (1) below its bytes (2147483648)"), "{err}");
}

#[test]
fn salvages_the_generation_of_a_parsable_but_invalid_file() {
    assert_eq!(
        Ledger::salvage_generation(br#"{"schema":99,"generation":41}"#),
        Some(41)
    );
    assert_eq!(Ledger::salvage_generation(b"{trunc"), None);
}

/// Fields a newer vramgate added, at every level that keeps them, come back out of a
/// parse and a rewrite as they went in.
#[test]
fn unknown_fields_survive_a_rewrite() {
    let newer = br#"{"schema":1,"generation":3,"next_ticket":3,"host_note":{"rack":7},
            "reservations":[{"container_id":"a","gpus":[{"uuid":"GPU-a","bytes":5}],
              "init":{"pid":1,"start_time":1},"created_unix_ms":1,"label":"train"}],
            "queue":[{"ticket":2,"container_id":"b","gpus":[{"uuid":"GPU-a","bytes":5}],
              "waiter":{"pid":1,"start_time":1},"enqueued_unix_ms":1,"deadline_unix_ms":9,
              "priority_hint":[1,2]}],
            "counters":{"admitted":3,"evicted":9}}"#;
    let mut ledger = Ledger::parse(newer, Path::new("/l")).unwrap();
    assert_eq!(ledger.reservations[0].extra["label"], "train");
    assert_eq!(ledger.queue[0].extra["priority_hint"], serde_json::json!([1, 2]));
    ledger.generation += 1;
    let written: serde_json::Value = serde_json::to_value(&ledger).unwrap();
    assert_eq!(written["host_note"], serde_json::json!({"rack": 7}));
    assert_eq!(written["reservations"][0]["label"], "train");
    assert_eq!(written["queue"][0]["priority_hint"], serde_json::json!([1, 2]));
    assert_eq!(written["counters"]["evicted"], 9);
    let bytes = serde_json::to_vec(&written).unwrap();
    assert_eq!(Ledger::parse(&bytes, Path::new("/l")).unwrap(), ledger);
}

/// A known field keeps its type check: only names this vramgate does not know are kept.
#[test]
fn known_fields_are_still_checked() {
    let bad = br#"{"schema":1,"generation":"3","next_ticket":1,"reservations":[],"queue":[]}"#;
    let err = Ledger::parse(bad, Path::new("/l")).unwrap_err().to_string();
    assert!(err.contains("corrupt") && err.contains("invalid type"), "{err}");
    let closed = br#"{"schema":1,"generation":3,"next_ticket":1,"queue":[],"reservations":[
            {"container_id":"a","gpus":[{"uuid":"GPU-a","bytes":5,"mig":1}],
             "init":{"pid":1,"start_time":1},"created_unix_ms":1}]}"#;
    let err = Ledger::parse(closed, Path::new("/l")).unwrap_err().to_string();
    assert!(err.contains("unknown field `mig`"), "a GPU share is closed: {err}");
}

#[test]
fn a_newer_format_is_refused_as_newer_and_format_zero_as_corrupt() {
    for newer in [
        &br#"{"schema":4,"generation":1,"next_ticket":1,"reservations":[],"queue":[]}"#[..],
        br#"{"schema":4,"reservations":"a new shape"}"#,
    ] {
        let err = Ledger::parse(newer, Path::new("/l")).unwrap_err().to_string();
        assert!(
            err.starts_with("ledger /l was written by a newer vramgate (ledger format 4; this one reads up to 3)"),
            "{err}"
        );
    }
    let zero = br#"{"schema":0,"generation":1,"next_ticket":1,"reservations":[],"queue":[]}"#;
    let err = Ledger::parse(zero, Path::new("/l")).unwrap_err().to_string();
    assert!(err.contains("corrupt") && err.contains("format"), "{err}");
}

/// A reservation of `id` holding claim `devices` in pod `pod` with `bytes` (limit `limit`) on
/// GPU-a.
fn holder(id: &str, pod: &str, devices: &[&str], bytes: u64, limit: u64) -> Reservation {
    Reservation {
        claim: Some(ClaimHold {
            pod: pod.into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }),
        ..Reservation::new(
            id,
            vec![GpuShare::new("GPU-a", bytes, limit)],
            ProcessIdentity { pid: 1, start_time: 1 },
            1,
        )
    }
}

#[test]
fn a_claim_held_by_a_pods_containers_counts_once_and_only_within_the_pod() {
    let mut ledger = Ledger::default();
    ledger.reservations = vec![
        holder("app", "pod-1", &["u-gpu-0"], 4 << 30, 6 << 30),
        holder("sidecar", "pod-1", &["u-gpu-0"], 4 << 30, 6 << 30),
        Reservation::for_test("plain", "GPU-a", 1 << 30),
    ];
    assert_eq!(
        ledger.reserved_on("GPU-a"),
        5 << 30,
        "the pod's claim once, and the plain one"
    );
    assert_eq!(ledger.limits_on("GPU-a"), 7 << 30);
    assert_eq!(ledger.reserved_total(), 5 << 30);
    let held = ledger.held_on("GPU-a");
    assert_eq!(held.len(), 2);
    assert_eq!(held[0].holders.len(), 2);
    let share = [GpuShare::new("GPU-a", 4 << 30, 6 << 30)];
    let hold = ledger.reservations[0].claim.clone().unwrap();
    assert!(ledger.holds_claim(&hold, &share));
    // Another amount, or the limit reserved whole (an older hook waits): not the same hold.
    assert!(!ledger.holds_claim(&hold, &[GpuShare::new("GPU-a", 6 << 30, 0)]));

    // The same claim in another pod, or other devices in the same pod: counted again.
    ledger
        .reservations
        .push(holder("elsewhere", "pod-2", &["u-gpu-0"], 4 << 30, 6 << 30));
    ledger
        .reservations
        .push(holder("more", "pod-1", &["u-gpu-0", "v-gpu-0"], 4 << 30, 6 << 30));
    assert_eq!(ledger.reserved_on("GPU-a"), 13 << 30);

    // Either holder alone still holds all of it: a stop leaves the claim counted whole.
    ledger.remove_reservation("app");
    assert_eq!(ledger.reserved_on("GPU-a"), 13 << 30);
    ledger.remove_reservation("sidecar");
    assert_eq!(ledger.reserved_on("GPU-a"), 9 << 30);
}

#[test]
fn a_claim_hold_is_kept_by_a_rewrite_and_absent_where_there_is_none() {
    let mut ledger = Ledger::default();
    ledger.reservations = vec![
        holder("app", "pod-1", &["u-gpu-0"], 4 << 30, 0),
        Reservation::for_test("plain", "GPU-a", 1 << 30),
    ];
    let text = serde_json::to_string(&ledger).unwrap();
    assert!(
        text.contains(r#""claim":{"pod":"pod-1","devices":["u-gpu-0"]}"#),
        "{text}"
    );
    assert_eq!(text.matches("\"claim\"").count(), 1, "{text}");
    let back = Ledger::parse(text.as_bytes(), Path::new("ledger.json")).unwrap();
    assert_eq!(back, ledger);
    assert_eq!(
        back.format_needed(),
        FORMAT_WITHOUT_LIMITS,
        "a hold needs no newer format"
    );
}
