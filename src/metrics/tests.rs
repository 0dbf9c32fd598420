use super::*;
use crate::admission::GpuAccount;
use crate::status::{GpuStatus, ReservationStatus, TicketStatus};
use std::time::Duration;

const GI: u64 = 1 << 30;

fn reservation(id: &str, bytes: u64, used: Option<u64>) -> ReservationStatus {
    ReservationStatus {
        container_id: id.into(),
        name: None,
        bytes,
        limit: bytes,
        used,
        over_reservation: used.is_some_and(|u| u > bytes),
        age_ms: 1_000,
        waited_ms: 0,
        pid: 42,
        alive: None,
        pending: false,
        tier: None,
    }
}

fn ticket(id: &str, waited_ms: u64) -> TicketStatus {
    TicketStatus {
        position: 1,
        ticket: 1,
        container_id: id.into(),
        name: None,
        bytes: GI,
        limit: GI,
        waited_ms,
        deadline_in_ms: 60_000,
        waiter_pid: 43,
        alive: None,
        choose: None,
    }
}

fn report(reservations: Vec<ReservationStatus>, queue: Vec<TicketStatus>) -> StatusReport {
    let reserved = reservations.iter().map(|r| r.bytes).sum();
    let account = GpuAccount {
        uuid: "GPU-a".into(),
        index: 0,
        total: 16 * GI,
        free: 12 * GI,
        reserved,
        unallocated: reserved,
        headroom: 0,
        reservations: reservations.len(),
        limits: reserved,
        limit_overcommit: 0,
    };
    StatusReport {
        snapshot: Default::default(),
        allocated: Default::default(),
        shared: Vec::new(),
        unattributed: Vec::new(),
        inventory: "test".into(),
        state_dir: "/run/vramgate".into(),
        generation: 1,
        gpus: vec![GpuStatus {
            gpu: crate::inventory::GpuMemory::for_test(0, None, "GPU-0"),
            available: account.available(),
            used_outside: account.used_outside(),
            account,
            reservations,
            queue,
            outside_processes: vec![],
        }],
    }
}

fn value(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_string))
}

#[test]
fn gpu_container_and_queue_series() {
    let text = render(
        &report(
            vec![reservation("a", 2 * GI, None), reservation("b", GI, Some(3 * GI))],
            vec![ticket("w1", 1_500), ticket("w2", 20_250)],
        ),
        &Counters::default(),
        1_700_000_000_123,
    );
    let gpu = r#"{gpu="0",gpu_uuid="GPU-a"}"#;
    assert_eq!(
        value(&text, &format!("vramgate_gpu_memory_total_bytes{gpu}")).as_deref(),
        Some("17179869184")
    );
    assert_eq!(
        value(&text, &format!("vramgate_gpu_memory_reserved_bytes{gpu}")).as_deref(),
        Some("3221225472")
    );
    assert_eq!(
        value(&text, &format!("vramgate_gpu_reservations{gpu}")).as_deref(),
        Some("2")
    );
    assert_eq!(
        value(&text, &format!("vramgate_queue_length{gpu}")).as_deref(),
        Some("2")
    );
    assert_eq!(
        value(&text, &format!("vramgate_queue_oldest_wait_seconds{gpu}")).as_deref(),
        Some("20.25")
    );
    let a = r#"{container_id="a",gpu="0",gpu_uuid="GPU-a"}"#;
    let b = r#"{container_id="b",gpu="0",gpu_uuid="GPU-a"}"#;
    assert_eq!(
        value(&text, &format!("vramgate_container_reserved_bytes{a}")).as_deref(),
        Some("2147483648")
    );
    // Used and the flag only where usage is known.
    assert_eq!(value(&text, &format!("vramgate_container_used_bytes{a}")), None);
    assert_eq!(value(&text, &format!("vramgate_container_over_reservation{a}")), None);
    assert_eq!(
        value(&text, &format!("vramgate_container_used_bytes{b}")).as_deref(),
        Some("3221225472")
    );
    assert_eq!(
        value(&text, &format!("vramgate_container_over_reservation{b}")).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(&text, "vramgate_snapshot_timestamp_seconds").as_deref(),
        Some("1700000000.123")
    );
}

#[test]
fn every_family_has_help_and_type_once_and_its_samples_together() {
    let mut counters = Counters::default();
    counters.record_admit(Some(Duration::from_millis(30)));
    let text = render(&report(vec![reservation("a", GI, Some(1))], vec![]), &counters, 0);
    let mut seen = std::collections::HashSet::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap().to_string();
            assert!(name.starts_with("vramgate_"), "{line}");
            assert!(seen.insert(name.clone()), "{name} twice");
            current = name;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            assert!(rest.starts_with(&format!("{current} ")), "{line}");
        } else {
            let series = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| series.strip_suffix(s).filter(|f| *f == current))
                .unwrap_or(series);
            assert_eq!(family, current, "{line} outside its family");
        }
    }
    assert!(text.ends_with('\n'));
}

#[test]
fn counters_and_histogram() {
    let mut c = Counters::default();
    c.record_admit(None);
    c.record_admit(None);
    c.record_admit(Some(Duration::from_millis(40)));
    c.record_admit(Some(Duration::from_secs(7_200)));
    c.record_refuse();
    c.record_release();
    let text = render(&report(vec![], vec![]), &c, 0);
    assert_eq!(
        value(&text, r#"vramgate_requests_total{outcome="admitted"}"#).as_deref(),
        Some("2")
    );
    assert_eq!(
        value(&text, r#"vramgate_requests_total{outcome="admitted_after_wait"}"#).as_deref(),
        Some("2")
    );
    assert_eq!(
        value(&text, r#"vramgate_requests_total{outcome="timed_out"}"#).as_deref(),
        Some("0")
    );
    assert_eq!(
        value(&text, r#"vramgate_reservations_ended_total{how="released"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(&text, r#"vramgate_queue_wait_seconds_bucket{le="0.01"}"#).as_deref(),
        Some("0")
    );
    assert_eq!(
        value(&text, r#"vramgate_queue_wait_seconds_bucket{le="0.05"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(&text, r#"vramgate_queue_wait_seconds_bucket{le="3600"}"#).as_deref(),
        Some("1")
    );
    assert_eq!(
        value(&text, r#"vramgate_queue_wait_seconds_bucket{le="+Inf"}"#).as_deref(),
        Some("2")
    );
    assert_eq!(
        value(&text, "vramgate_queue_wait_seconds_sum").as_deref(),
        Some("7200.04")
    );
    assert_eq!(value(&text, "vramgate_queue_wait_seconds_count").as_deref(), Some("2"));
    // No reservation, no per-container series: only the family's HELP and TYPE.
    assert!(!text.contains("vramgate_container_reserved_bytes{"));
}

#[test]
fn label_values_are_escaped() {
    let text = render(
        &report(vec![reservation(r#"we"ird\id"#, GI, None)], vec![]),
        &Counters::default(),
        0,
    );
    assert!(
        text.contains(r#"vramgate_container_reserved_bytes{container_id="we\"ird\\id",gpu="0""#),
        "{text}"
    );
}

#[test]
fn seconds_are_exact_decimals() {
    assert_eq!(seconds(0), "0");
    assert_eq!(seconds(10), "0.01");
    assert_eq!(seconds(250), "0.25");
    assert_eq!(seconds(1_000), "1");
    assert_eq!(seconds(3_600_001), "3600.001");
    assert_eq!(seconds(u64::MAX), "18446744073709551.615");
}

#[test]
fn textfile_is_replaced_whole_and_readable_by_others() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = write_textfile(dir.path(), "a 1\n").unwrap();
    assert_eq!(path, dir.path().join(TEXTFILE_NAME));
    write_textfile(dir.path(), "a 2\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(TEXTFILE_NAME)]);
    let err = write_textfile(&dir.path().join("missing"), "").unwrap_err();
    assert!(err.to_string().contains("missing/vramgate.prom"), "{err}");
}

#[test]
fn a_containers_series_carry_its_name_beside_its_id() {
    let named = ReservationStatus {
        name: Some("team-a/train/trainer".into()),
        ..reservation("c1", GI, None)
    };
    let text = render(
        &report(vec![named, reservation("c2", GI, None)], vec![]),
        &Counters::default(),
        0,
    );
    assert!(
        text.contains(r#"vramgate_container_reserved_bytes{container_id="c1",gpu="0",gpu_uuid="GPU-a",name="team-a/train/trainer"} 1073741824"#),
        "{text}"
    );
    assert!(
        text.contains(r#"vramgate_container_reserved_bytes{container_id="c2",gpu="0",gpu_uuid="GPU-a"} "#),
        "{text}"
    );
}
