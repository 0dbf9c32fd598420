//! Policy `wait` against real runc: the paper's replay, timeouts, an abandoned waiter, and
//! memory used outside vramgate holding and then letting in a waiter.

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{
    array_field, eventually, field, runc_testbed, spawn_container, status, str_field, u64_field, Cleanup, GIB, HOOK,
    LOADED_MACHINE_BOUND,
};
use vramgate_testbed::demo::{DemoArgs, DemoPolicy};
use vramgate_testbed::{scratch_config, Testbed};

/// The ledger as the hooks wrote it; before the first hook made it, an empty one. Any other
/// failure to read it fails the test (it is not "nothing reserved").
fn ledger(bed: &Testbed) -> Value {
    match std::fs::read(bed.state_dir.join("ledger.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!({"reservations": [], "queue": []}),
        Err(e) => panic!("reading the ledger: {e}"),
    }
}

fn reserved_ids(bed: &Testbed) -> Vec<String> {
    array_field(&ledger(bed), "reservations")
        .iter()
        .map(|r| str_field(r, "container_id").to_string())
        .collect()
}

fn queued(bed: &Testbed) -> Vec<(String, u32)> {
    array_field(&ledger(bed), "queue")
        .iter()
        .map(|t| {
            (
                str_field(t, "container_id").to_string(),
                u64_field(field(t, "waiter"), "pid") as u32,
            )
        })
        .collect()
}

/// A container on GPU 0 with these annotations.
fn spawn(bed: &Testbed, id: &str, args: &[&str], annotations: &[(&str, &str)]) -> Child {
    let mut all = vec![("vramgate.dev/gpus", "0")];
    all.extend_from_slice(annotations);
    spawn_container(bed, id, args, &all)
}

fn kill(bed: &Testbed, id: &str, child: &mut Child) {
    bed.runc(&["kill", id, "KILL"]).status().unwrap();
    child.wait().unwrap();
}

#[test]
fn paper_replay_with_wait_and_reject() {
    let args = DemoArgs {
        policy: DemoPolicy::Both,
        containers: 25,
        memory: "1205Mi".into(),
        seconds: 2,
        runc: "runc".into(),
        bin_dir: Some(PathBuf::from(HOOK).parent().unwrap().to_path_buf()),
        json: true,
        // Kept, to read its event log here; removed below.
        keep: true,
    };
    let summaries = vramgate_testbed::demo::run(&args).unwrap();
    let work = std::env::temp_dir().join(format!("vramgate-demo-{}", std::process::id()));
    let events = support::events_in(&work.join("wait/state"));
    std::fs::remove_dir_all(&work).unwrap();
    let wait = &summaries[0];
    assert_eq!(wait.policy, "wait");
    assert_eq!((wait.completed, wait.refused, wait.failed), (25, 0, 0), "{wait:?}");
    // First come, first served, from the log the hooks wrote (not from the demo's own
    // reading of it): 20 of 1205 MiB fit on 24,265 MiB, so 5 queue, and they are let in in the
    // order they queued (an enqueue is logged under the ledger lock, in ticket order).
    let of = |kind: &str| -> Vec<&str> {
        events
            .iter()
            .filter(|e| e["event"] == kind)
            .map(|e| support::str_field(e, "container"))
            .collect()
    };
    let (enqueued, let_in) = (of("enqueue"), of("admit_after_wait"));
    assert_eq!(
        enqueued.len(),
        5,
        "20 of 1205 MiB fit on 24,265 MiB; 5 queue: {events:#?}"
    );
    assert_eq!(let_in, enqueued, "admitted in the order they queued");
    assert_eq!(of("admit").len(), 20, "{events:#?}");
    // The demo's report says the same.
    assert_eq!(wait.waited, 5, "{wait:?}");
    assert!(wait.fifo, "{wait:?}");
    assert!(
        wait.max_reserved_bytes <= wait.capacity_bytes && wait.samples >= 10,
        "{wait:?}"
    );
    assert_eq!(wait.max_running, 20);

    let reject = &summaries[1];
    assert_eq!(
        (reject.completed, reject.refused, reject.failed),
        (20, 5, 0),
        "{reject:?}"
    );
    assert!(reject.max_reserved_bytes <= reject.capacity_bytes);
    assert!(
        reject.first_refusal.as_deref().unwrap().contains("policy=wait"),
        "{reject:?}"
    );
}

#[test]
fn waiter_times_out_with_the_message_and_huge_requests_fail_at_once() {
    let (_dir, bed) = runc_testbed("vg-timeout", "");
    let _c = Cleanup(&bed);
    let mut holder = spawn(&bed, "holder", &["sleep", "30"], &[("vramgate.dev/memory", "20Gi")]);
    eventually("holder admitted", Duration::from_secs(10), || {
        reserved_ids(&bed) == ["holder"]
    });

    let started = Instant::now();
    let out = spawn(
        &bed,
        "patient",
        &["echo", "CONTAINER-RAN"],
        &[
            ("vramgate.dev/memory", "10Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "2s"),
        ],
    )
    .wait_with_output()
    .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // It waited its 2 s, and gave up then: not at the holder's end (30 s) nor at the default
    // timeout. The upper bound leaves a loaded machine its slack.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(2) + LOADED_MACHINE_BOUND,
        "{took:?}"
    );
    assert!(stderr.contains("refused container patient: waited 2"), "{stderr}");
    assert!(
        stderr.contains("number 1 in the queue") && stderr.contains("vramgate.dev/timeout"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("CONTAINER-RAN"));
    assert!(queued(&bed).is_empty(), "the ticket left with it");

    let started = Instant::now();
    let out = spawn(
        &bed,
        "huge",
        &["true"],
        &[
            ("vramgate.dev/memory", "30Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "60s"),
        ],
    )
    .wait_with_output()
    .unwrap();
    assert!(!out.status.success());
    // Refused without a wait: its timeout is 60 s.
    assert!(
        started.elapsed() < LOADED_MACHINE_BOUND,
        "no waiting for the impossible: {:?}",
        started.elapsed()
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the GPU can ever hold"));
    kill(&bed, "holder", &mut holder);
}

#[test]
fn abandoned_waiter_does_not_block_the_one_behind_it() {
    let (_dir, bed) = runc_testbed("vg-abandon", "[queue]\npoll_interval = \"200ms\"\n");
    let _c = Cleanup(&bed);
    let mut holder = spawn(&bed, "holder", &["sleep", "60"], &[("vramgate.dev/memory", "20Gi")]);
    eventually("holder admitted", Duration::from_secs(10), || {
        reserved_ids(&bed) == ["holder"]
    });

    let wait = [("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "60s")];
    let first = spawn(
        &bed,
        "first",
        &["sleep", "1"],
        &[&[("vramgate.dev/memory", "10Gi")][..], &wait].concat(),
    );
    eventually("first queued", Duration::from_secs(10), || queued(&bed).len() == 1);
    // 2 GiB would fit now, but "first" asked first: FIFO keeps it waiting.
    let mut second = spawn(
        &bed,
        "second",
        &["sleep", "1"],
        &[&[("vramgate.dev/memory", "2Gi")][..], &wait].concat(),
    );
    eventually("second queued", Duration::from_secs(10), || queued(&bed).len() == 2);
    // Its ticket says it was not let in past first with 2 GiB free; that it never was while
    // first waited is checked below, against the order of the events the hooks wrote.
    assert_eq!(reserved_ids(&bed), ["holder"], "FIFO: second does not pass first");

    // The runtime kills first's hook (as at a hook timeout).
    let waiting = queued(&bed);
    assert_eq!(
        waiting.len(),
        2,
        "both still wait; events: {}",
        std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap_or_default()
    );
    let (id, waiter) = waiting[0].clone();
    assert_eq!(id, "first");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(!out.status.success(), "first failed to start");

    let took = eventually("second admitted", LOADED_MACHINE_BOUND, || {
        reserved_ids(&bed).contains(&"second".to_string())
    });
    assert!(
        reserved_ids(&bed).contains(&"holder".to_string()),
        "the holder never stopped: the dead ticket was simply dropped"
    );
    assert!(second.wait().unwrap().success());
    let events = support::events_in(&bed.state_dir);
    let at = |kind: &str, id: &str| events.iter().position(|e| e["event"] == kind && e["container"] == id);
    let abandoned = at("abandon_ticket", "first").unwrap_or_else(|| panic!("no abandon_ticket of first: {events:#?}"));
    let admitted = at("admit_after_wait", "second").unwrap_or_else(|| panic!("no admission of second: {events:#?}"));
    assert!(
        abandoned < admitted && at("admit", "second").is_none(),
        "FIFO: second was let in while first still waited: {events:#?}"
    );
    println!("second admitted {took:?} after first's hook was killed");
    kill(&bed, "holder", &mut holder);
}

fn write_config(bed: &Testbed, used_outside: &str) {
    let text = scratch_config(
        &bed.state_dir,
        &format!("[queue]\npoll_interval = \"200ms\"\n[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-sim\"\ntotal = \"24265Mi\"\nused_outside = {used_outside:?}"),
    );
    // Atomic, so a hook never reads half a file.
    let temp = bed.config_path.with_extension("tmp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, &bed.config_path).unwrap();
}

#[test]
fn memory_used_outside_holds_then_lets_in_a_waiter() {
    let (_dir, bed) = runc_testbed("vg-foreign", "");
    let _c = Cleanup(&bed);
    write_config(&bed, "0");
    write_config(&bed, "20Gi"); // something outside vramgate takes 20 GiB

    let mut waiter = spawn(
        &bed,
        "waiter",
        &["sleep", "1"],
        &[
            ("vramgate.dev/memory", "10Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "60s"),
        ],
    );
    eventually("queued behind outside usage", Duration::from_secs(10), || {
        queued(&bed).len() == 1
    });
    // Queued: it was held while the memory is used outside. That it stayed held until the
    // memory freed is checked below, against the time of its admission's event.
    assert!(reserved_ids(&bed).is_empty(), "held while the memory is used outside");

    let freed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    write_config(&bed, "1Gi"); // it frees most of it
    let took = eventually("admitted once memory frees", LOADED_MACHINE_BOUND, || {
        reserved_ids(&bed) == ["waiter"]
    });
    println!("admitted {took:?} after the outside usage fell");
    // Its run has ended, so its hook has logged the admission (logged after the ledger's
    // commit, which the check above may have seen first).
    assert!(waiter.wait().unwrap().success());
    let events = support::events_in(&bed.state_dir);
    let admissions: Vec<&Value> = events
        .iter()
        .filter(|e| e["container"] == "waiter" && e["event"].as_str().is_some_and(|k| k.starts_with("admit")))
        .collect();
    assert!(
        admissions.len() == 1
            && admissions[0]["event"] == "admit_after_wait"
            && support::u64_field(admissions[0], "time_unix_ms") >= freed_at,
        "let in before the memory used outside freed (at {freed_at}): {admissions:#?}"
    );
    assert!(reserved_ids(&bed).is_empty());
    let status = status(&bed.config_path);
    assert_eq!(status["gpus"][0]["used_outside"].as_u64().unwrap(), GIB);
}

#[test]
fn status_shows_the_queue() {
    let (_dir, bed) = runc_testbed("vg-qstatus", "");
    let _c = Cleanup(&bed);
    let mut holder = spawn(&bed, "holder", &["sleep", "30"], &[("vramgate.dev/memory", "20Gi")]);
    eventually("holder admitted", Duration::from_secs(10), || {
        reserved_ids(&bed) == ["holder"]
    });
    let mut waiter = spawn(
        &bed,
        "waiter",
        &["true"],
        &[
            ("vramgate.dev/memory", "8Gi"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "60s"),
        ],
    );
    eventually("queued", Duration::from_secs(10), || queued(&bed).len() == 1);

    let out = Command::new(support::VRAMGATE)
        .arg("status")
        .env("VRAMGATE_CONFIG", &bed.config_path)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("queue:") && table.contains("waiter") && table.contains("8192 MiB"),
        "{table}"
    );
    assert!(table.contains("holder") && table.contains("20.0 GiB"), "{table}");

    kill(&bed, "holder", &mut holder);
    // Let in by the release, well before its 60 s timeout; how soon is printed, not asserted.
    let took = eventually("waiter admitted after the release", LOADED_MACHINE_BOUND, || {
        !queued(&bed).iter().any(|q| q.0 == "waiter")
    });
    println!("waiter admitted {took:?} after the holder was killed");
    assert!(waiter.wait().unwrap().success());
}

/// Waiting hooks, killed and reaped however the test ends.
struct Crowd(Vec<Child>);

impl Drop for Crowd {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The inotify instances process `pid` holds (0 once it is gone).
fn inotify_instances(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
        fds.flatten()
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:inotify"))
            .count()
    })
}

#[test]
fn a_queue_of_300_leaves_the_host_its_inotify_instances() {
    // fs.inotify.max_user_instances (128 on Debian) counts every instance of every root
    // process: one per waiter once made containerd's CRI plugin and the DRA driver fail with
    // EMFILE past about 128 waiters. Built hooks, as the runtime starts them.
    const WAITERS: usize = 300;
    let h = support::harness(
        "[queue]\npoll_interval = \"1s\"\n[inventory]\nbackend = \"static\"\n\
         [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-wake\"\ntotal = \"10Gi\"\n",
    );
    let init = vramgate_testbed::FakeContainer::start();
    let holder = h.bundle("holder", &[("vramgate.dev/memory", "9Gi"), ("vramgate.dev/gpus", "0")]);
    let out = h.hook(
        "createRuntime",
        &vramgate_testbed::oci_state("holder", Some(init.pid()), &holder),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let waiting = h.bundle(
        "waiter",
        &[
            ("vramgate.dev/memory", "5Gi"),
            ("vramgate.dev/gpus", "0"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "60s"),
        ],
    );
    let dir = h.open_state();
    let queued = || dir.read().map_or(0, |l| l.queue.len());
    let mut crowd = Crowd(Vec::new());
    for i in 0..WAITERS {
        let state = vramgate_testbed::oci_state(&format!("w-{i}"), Some(init.pid()), &waiting);
        crowd.0.push(h.spawn_hook("createRuntime", &state));
        // A burst, a few dozen at a time: all at once would only measure the fork.
        if i % 50 == 49 {
            eventually("a batch queued", Duration::from_secs(30), || queued() > i);
        }
    }
    let took = eventually("all queued", Duration::from_secs(30), || queued() == WAITERS);
    println!("{WAITERS} waiters queued ({took:?} after the last start)");
    let held = |crowd: &Crowd| crowd.0.iter().map(|c| inotify_instances(c.id())).sum::<usize>();
    let instances = held(&crowd);
    assert!(
        (1..=usize::from(vramgate::service::WAKE_SLOTS)).contains(&instances),
        "{WAITERS} waiters hold {instances} inotify instances"
    );
    // What watching the ledger's stat costs the host: the crowd's CPU over 2 s.
    let ticks = || {
        crowd
            .0
            .iter()
            .filter_map(|c| std::fs::read_to_string(format!("/proc/{}/stat", c.id())).ok())
            .filter_map(|stat| {
                // utime and stime, the 14th and 15th fields; the name before them is in ().
                let rest = &stat[stat.rfind(')')? + 2..];
                let f: Vec<&str> = rest.split(' ').collect();
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
            .sum::<u64>()
    };
    let (before, at) = (ticks(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    // USER_HZ is 100 on Linux: ticks per second are per cent of one core.
    let percent = (ticks() - before) as f64 / at.elapsed().as_secs_f64();
    println!("{WAITERS} waiters use {percent:.1} % of one core while nothing changes");
    // Not a speed target (20 % on the idle 2-core VM, 50 % with the suite's other tests running
    // beside it; bench/queue-lock.sh measures the queue): a guard against waiters that stop
    // sleeping between their looks, which would take nearly all of both cores whatever else runs.
    assert!(
        percent < 150.0,
        "{WAITERS} waiters use {percent:.1} % of one core: do they still sleep between looks?"
    );
    // Another root process still gets one.
    let other = nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::IN_CLOEXEC);
    assert!(other.is_ok(), "inotify_init while {WAITERS} wait: {other:?}");
    drop(other);

    // A holder of a slot crashes: another waiter takes its slot.
    let crashed = crowd.0.iter().position(|c| inotify_instances(c.id()) > 0).unwrap();
    let mut c = crowd.0.remove(crashed);
    c.kill().unwrap();
    c.wait().unwrap();
    eventually("the crashed waiter's slot taken", Duration::from_secs(10), || {
        held(&crowd) == instances
    });

    // A release still wakes the queue: the two oldest alive fit in the 10 GiB freed.
    let out = h.hook("poststop", &vramgate_testbed::oci_state("holder", None, &holder));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let released = Instant::now();
    let admitted = || dir.read().map_or(0, |l| l.reservations.len());
    eventually("two waiters admitted", LOADED_MACHINE_BOUND, || admitted() == 2);
    println!(
        "release -> 2 admissions: {:?}; inotify instances of the waiters: {instances}",
        released.elapsed()
    );
    assert!(held(&crowd) <= usize::from(vramgate::service::WAKE_SLOTS));
}
