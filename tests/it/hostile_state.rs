//! Hostile state: the state directory or the files in it replaced by symlinks, special files,
//! or files owned or writable by someone else; the ledger truncated, emptied or filled with
//! garbage. The real hook binary must refuse with one clear line (fail-closed, the default) or
//! start the container unaccounted with a warning (fail-open), never follow a link, never
//! write anywhere but its own directory, and never hang. The recovery commands are then run
//! end to end with the real CLI.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const GPU: &str =
    "[inventory]\nbackend = \"static\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-hostile\"\ntotal = \"16Gi\"\n";
const CANARY: &[u8] = b"canary: vramgate must never write here\n";

struct Case {
    scratch: HookHarness,
    bundle: PathBuf,
    container: FakeContainer,
    /// A file and a directory outside the state dir that links point at.
    canary: PathBuf,
    elsewhere: PathBuf,
}

impl Case {
    fn new(on_state_error: &str) -> Case {
        let scratch = harness(&format!("on_state_error = \"{on_state_error}\"\n{GPU}"));
        let bundle = scratch.bundle("b", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
        let canary = scratch.dir().join("canary");
        std::fs::write(&canary, CANARY).unwrap();
        let elsewhere = scratch.dir().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        Case {
            scratch,
            bundle,
            container: FakeContainer::start(),
            canary,
            elsewhere,
        }
    }

    /// Runs the admission hook; a hook that hangs is a failure, not a stuck test.
    fn admit(&self, id: &str) -> (Option<i32>, String) {
        let mut child = self.scratch.spawn_hook(
            "createRuntime",
            &oci_state(id, Some(self.container.pid()), &self.bundle),
        );
        let began = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if began.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("the hook hung on hostile state");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let out = child.wait_with_output().unwrap();
        (out.status.code(), stderr(&out))
    }

    fn state(&self) -> &Path {
        &self.scratch.state_dir
    }

    fn assert_untouched(&self) {
        assert_eq!(
            std::fs::read(&self.canary).unwrap(),
            CANARY,
            "the link target was written"
        );
        let entries: Vec<_> = std::fs::read_dir(&self.elsewhere).unwrap().collect();
        assert!(entries.is_empty(), "files were created through a link: {entries:?}");
    }
}

fn fresh_state(case: &Case) {
    std::fs::create_dir(case.state()).unwrap();
    std::fs::set_permissions(case.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// A fresh state directory holding an empty ledger, for a case to make hostile.
fn state_with_empty_ledger(case: &Case) {
    fresh_state(case);
    std::fs::write(
        case.state().join("ledger.json"),
        br#"{"schema":1,"generation":1,"next_ticket":1,"reservations":[],"queue":[]}"#,
    )
    .unwrap();
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown_nobody(path: &Path) {
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// Each hostile setup, the words its refusal must contain.
fn hostile_setups() -> Vec<(&'static str, Box<dyn Fn(&Case)>, &'static str)> {
    let ledger = |c: &Case| c.state().join("ledger.json");
    vec![
        (
            "state dir is a symlink",
            Box::new(|c: &Case| std::os::unix::fs::symlink(&c.elsewhere, c.state()).unwrap()),
            "is a symbolic link",
        ),
        (
            "state dir is a regular file",
            Box::new(|c: &Case| std::fs::write(c.state(), b"").unwrap()),
            "is not a directory",
        ),
        (
            "state dir owned by nobody",
            Box::new(|c: &Case| {
                fresh_state(c);
                chown_nobody(c.state());
            }),
            "is owned by uid 65534",
        ),
        (
            "state dir world-writable",
            Box::new(|c: &Case| {
                fresh_state(c);
                set_mode(c.state(), 0o777);
            }),
            "writable by group or others",
        ),
        (
            "state dir readable by others",
            Box::new(|c: &Case| {
                fresh_state(c);
                set_mode(c.state(), 0o755);
            }),
            "is open to group or others (mode 755)",
        ),
        (
            "ledger is a symlink",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::os::unix::fs::symlink(&c.canary, ledger(c)).unwrap();
            }),
            "is a symbolic link",
        ),
        (
            "ledger owned by nobody",
            Box::new(move |c: &Case| {
                state_with_empty_ledger(c);
                chown_nobody(&ledger(c));
            }),
            "is owned by uid 65534",
        ),
        (
            "ledger world-writable",
            Box::new(move |c: &Case| {
                state_with_empty_ledger(c);
                set_mode(&ledger(c), 0o666);
            }),
            "writable by group or others",
        ),
        (
            "ledger is a directory",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::create_dir(ledger(c)).unwrap();
            }),
            "is not a regular file",
        ),
        (
            "ledger is a FIFO",
            Box::new(move |c: &Case| {
                fresh_state(c);
                mkfifo(&ledger(c));
            }),
            "is not a regular file",
        ),
        (
            "lock is a symlink",
            Box::new(|c: &Case| {
                fresh_state(c);
                std::os::unix::fs::symlink(c.elsewhere.join("lock"), c.state().join("lock")).unwrap();
            }),
            "is a symbolic link",
        ),
        (
            "ledger is empty",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::write(ledger(c), b"").unwrap();
            }),
            "is corrupt (it is empty)",
        ),
        (
            "ledger is truncated",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::write(
                    ledger(c),
                    br#"{"schema":1,"generation":7,"next_ticket":1,"reservations":[{"container_id":"a","gp"#,
                )
                .unwrap();
            }),
            "is corrupt (EOF while parsing",
        ),
        (
            "ledger is garbage",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::write(ledger(c), [0xde, 0xad, 0xbe, 0xef, 0x00, 0x01]).unwrap();
            }),
            "is corrupt (expected value",
        ),
        (
            "ledger has a future schema",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::write(ledger(c), br#"{"schema":4,"everything":"different"}"#).unwrap();
            }),
            "was written by a newer vramgate (ledger format 4; this one reads up to 3)",
        ),
        (
            "ledger is larger than 32 MiB",
            Box::new(move |c: &Case| {
                fresh_state(c);
                std::fs::write(ledger(c), vec![b' '; (32 << 20) + 10]).unwrap();
            }),
            "is larger than",
        ),
    ]
}

#[test]
fn fail_closed_refuses_every_hostile_state_with_one_line_and_writes_nowhere_else() {
    for (name, setup, words) in hostile_setups() {
        let case = Case::new("fail-closed");
        setup(&case);
        let (code, message) = case.admit("c1");
        eprintln!("{name}: {message}");
        assert_eq!(
            code,
            Some(1),
            "{name}: a hostile state must refuse the start: {message}"
        );
        assert!(message.starts_with("vramgate: "), "{name}: {message}");
        assert!(message.contains(words), "{name}: expected {words:?} in: {message}");
        assert!(!message.contains('\n'), "{name}: one line: {message}");
        assert!(
            message.contains("vramgate ledger repair") || message.contains("fix or remove it"),
            "{name}: the message says how to recover: {message}"
        );
        case.assert_untouched();
    }
}

#[test]
fn fail_open_starts_the_container_unaccounted_with_a_warning() {
    for (name, setup, words) in hostile_setups() {
        let case = Case::new("fail-open");
        setup(&case);
        let (code, message) = case.admit("c1");
        assert_eq!(code, Some(0), "{name}: fail-open lets the container start: {message}");
        assert!(message.starts_with("vramgate: warning: "), "{name}: {message}");
        assert!(message.contains(words), "{name}: {message}");
        assert!(message.contains("starts unaccounted"), "{name}: {message}");
        assert!(!message.contains('\n'), "{name}: {message}");
        case.assert_untouched();
    }
    // fail-open covers vramgate's own state only: the user's own mistakes are still refused.
    let case = Case::new("fail-open");
    let bad = case
        .scratch
        .bundle("bad", &[("vramgate.dev/memory", "lots"), ("vramgate.dev/gpus", "0")]);
    let out = case
        .scratch
        .hook("createRuntime", &oci_state("c2", Some(case.container.pid()), &bad));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn links_in_the_state_dir_that_are_replaced_not_followed() {
    // A stale temporary file that is a link, and an event log that is a link: the hook
    // admits, replaces the first (removing the link, not its target) and refuses to write
    // through the second, warning about it.
    let case = Case::new("fail-closed");
    fresh_state(&case);
    std::os::unix::fs::symlink(&case.canary, case.state().join("ledger.json.tmp")).unwrap();
    std::os::unix::fs::symlink(&case.canary, case.state().join("events.jsonl")).unwrap();
    let (code, message) = case.admit("c1");
    assert_eq!(code, Some(0), "{message}");
    assert!(message.contains("cannot write the event log"), "{message}");
    case.assert_untouched();
    assert!(case.scratch.ledger().reservation("c1").is_some());
    let tmp = std::fs::symlink_metadata(case.state().join("ledger.json.tmp"));
    assert!(tmp.is_err(), "the stale temporary link was removed");

    // An event log that is a FIFO nobody reads must not hang the hook either.
    std::fs::remove_file(case.state().join("events.jsonl")).unwrap();
    mkfifo(&case.state().join("events.jsonl"));
    let (code, message) = case.admit("c2");
    assert_eq!(code, Some(0), "{message}");
}

#[test]
fn ledger_repair_and_gc_recover_end_to_end() {
    let case = Case::new("fail-closed");
    fresh_state(&case);
    let ledger = case.state().join("ledger.json");
    std::fs::write(&ledger, b"{\"schema\":1, garbage").unwrap();
    let (code, message) = case.admit("c1");
    assert_eq!(code, Some(1));
    assert!(message.contains("run `vramgate ledger repair`"), "{message}");

    let out = case.scratch.cli(&["ledger", "repair"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    eprintln!("vramgate ledger repair: {said}");
    assert!(said.contains("set the old ledger aside as"), "{said}");
    let aside: Vec<_> = std::fs::read_dir(case.state())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("ledger.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(
        std::fs::read(&aside[0]).unwrap(),
        b"{\"schema\":1, garbage",
        "kept for inspection"
    );
    let (code, message) = case.admit("c1");
    assert_eq!(code, Some(0), "admits again after repair: {message}");
    let out = case.scratch.cli(&["ledger", "repair"]);
    assert!(
        stdout(&out).contains("is readable; nothing to repair"),
        "{}",
        stdout(&out)
    );

    // A symlinked ledger is set aside as the link itself; its target is never touched.
    std::fs::remove_file(&ledger).unwrap();
    std::os::unix::fs::symlink(&case.canary, &ledger).unwrap();
    let out = case.scratch.cli(&["ledger", "repair"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(&ledger).unwrap().is_file());
    case.assert_untouched();

    // A container that died without its poststop hook: gc reclaims it, and only it.
    let doomed = FakeContainer::start();
    let out = case
        .scratch
        .hook("createRuntime", &oci_state("doomed", Some(doomed.pid()), &case.bundle));
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, _) = case.admit("alive");
    assert_eq!(code, Some(0));
    doomed.kill();
    let out = case.scratch.cli(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    eprintln!("vramgate gc: {said}");
    assert!(said.contains("from container doomed"), "{said}");
    let after = case.scratch.ledger();
    assert!(after.reservation("doomed").is_none());
    assert!(after.reservation("alive").is_some());
    assert_eq!(stdout(&case.scratch.cli(&["gc"])), "nothing to reclaim");

    // A symlinked state dir cannot be repaired by the tool: it says what to fix.
    let case = Case::new("fail-closed");
    std::os::unix::fs::symlink(&case.elsewhere, case.state()).unwrap();
    for args in [&["ledger", "repair"][..], &["gc"], &["status"]] {
        let out = case.scratch.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains("is a symbolic link"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    case.assert_untouched();
}

#[test]
fn a_running_hook_holds_only_cap_sys_ptrace() {
    // A waiter on a full GPU stays alive long enough to look at its credentials.
    let case = Case::new("fail-closed");
    let full = case
        .scratch
        .bundle("full", &[("vramgate.dev/memory", "16Gi"), ("vramgate.dev/gpus", "0")]);
    let out = case
        .scratch
        .hook("createRuntime", &oci_state("full", Some(case.container.pid()), &full));
    assert!(out.status.success(), "{}", stderr(&out));
    let waiter = case.scratch.bundle(
        "waiter",
        &[
            ("vramgate.dev/memory", "1Gi"),
            ("vramgate.dev/gpus", "0"),
            ("vramgate.dev/policy", "wait"),
            ("vramgate.dev/timeout", "20s"),
        ],
    );
    let mut hook = case
        .scratch
        .spawn_hook("createRuntime", &oci_state("w", Some(case.container.pid()), &waiter));
    let began = Instant::now();
    while case.scratch.ledger().queue.is_empty() {
        assert!(began.elapsed() < Duration::from_secs(10), "the waiter never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", hook.id())).unwrap();
    let field = |name: &str| vramgate::procfs::status_field(&status, name).unwrap().to_string();
    let _ = hook.kill();
    let _ = hook.wait();
    let sys_ptrace = format!("{:016x}", 1u64 << 19);
    assert_eq!(field("CapEff"), sys_ptrace, "{status}");
    assert_eq!(field("CapPrm"), sys_ptrace);
    assert_eq!(field("CapInh"), "0000000000000000");
    assert_eq!(field("CapAmb"), "0000000000000000");
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(field("Uid").split_whitespace().next(), Some("0"));
}
