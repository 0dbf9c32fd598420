//! The ledger across versions, through the built hook: fields a newer vramgate wrote survive
//! this one's transactions (an upgrade in progress, a hook of the older version still
//! waiting), a ledger of a newer format is refused as such and left alone, and a transaction
//! whose ledger would outgrow what every reader accepts fails without writing anything. And the
//! stop of a container vramgate never held does not read the ledger at all.

use crate::support;

use serde_json::{json, Value};
use support::*;
use vramgate::ledger::{LEDGER_FILE, MAX_LEDGER_BYTES};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::{oci_state, FakeContainer, HookHarness};

const GPUS: &str = "[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n\
    [[inventory.gpus]]\nindex = 1\nuuid = \"GPU-one\"\ntotal = \"16Gi\"\n";

fn identity(pid: u32) -> Value {
    let id = ProcessIdentity::of(pid).expect("a live process");
    json!({"pid": id.pid, "start_time": id.start_time})
}

fn ledger_json(h: &HookHarness) -> Value {
    serde_json::from_slice(&std::fs::read(h.state_dir.join(LEDGER_FILE)).unwrap()).unwrap()
}

/// Writes `ledger` as the state directory's ledger, as a vramgate would (mode 0600, root's).
fn plant(h: &HookHarness, ledger: &[u8]) {
    // The directory and its ledger are made by a first read, with their checked modes.
    let _ = h.ledger();
    vramgate::atomic_file::replace(&h.state_dir.join(LEDGER_FILE), ledger, 0o600, None).unwrap();
}

/// A ledger as a newer vramgate of the same format would leave it: a field this one does not
/// know at the top, in a live reservation, in a live waiter's ticket and in the counters.
#[test]
fn fields_of_a_newer_vramgate_survive_admit_and_release() {
    let h = harness(GPUS);
    let other = FakeContainer::start();
    let waiter = FakeContainer::start();
    let newer = json!({
        "schema": 1, "generation": 41, "next_ticket": 8,
        "host_note": {"rack": 7},
        "reservations": [{
            "container_id": "other", "gpus": [{"uuid": "GPU-zero", "bytes": GIB}],
            "init": identity(other.pid()), "created_unix_ms": 1, "label": "training"
        }],
        "queue": [{
            "ticket": 7, "container_id": "waiting", "gpus": [{"uuid": "GPU-one", "bytes": 8 * GIB}],
            "waiter": identity(waiter.pid()), "enqueued_unix_ms": 1,
            "deadline_unix_ms": u64::MAX / 2, "priority_hint": [1, 2]
        }],
        "counters": {"admitted": 3, "evicted": 9}
    });
    plant(&h, &serde_json::to_vec(&newer).unwrap());

    let bundle = h.bundle("mine", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    let me = FakeContainer::start();
    let out = h.hook("createRuntime", &oci_state("mine", Some(me.pid()), &bundle));
    assert!(out.status.success(), "admit: {}", stderr(&out));
    let admitted = ledger_json(&h);
    assert_eq!(admitted["generation"], 42, "the admission was written: {admitted}");
    let ids: Vec<_> = admitted["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["container_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["other", "mine"]);

    let out = h.hook("poststop", &oci_state("mine", Some(me.pid()), &bundle));
    assert!(out.status.success(), "release: {}", stderr(&out));
    let released = ledger_json(&h);
    assert_eq!(released["generation"], 43, "the release was written: {released}");
    assert_eq!(released["reservations"].as_array().unwrap().len(), 1);

    // Every field of the newer vramgate came through both rewrites as it was.
    assert_eq!(released["host_note"], json!({"rack": 7}));
    assert_eq!(released["reservations"][0]["label"], "training");
    assert_eq!(released["queue"][0]["ticket"], 7);
    assert_eq!(released["queue"][0]["priority_hint"], json!([1, 2]));
    assert_eq!(released["counters"]["evicted"], 9);
    assert_eq!(released["counters"]["admitted"], 4);
    assert_eq!(released["counters"]["released"], 1);
}

/// A ledger of the release before names (no `name` anywhere) is read as it was, its containers
/// shown by their ids; the next admission records its container's name beside them without a
/// format bump (a name is only shown), and an older reader's entries keep no name.
#[test]
fn a_ledger_without_names_reads_and_the_next_admission_names_its_container() {
    let h = harness(GPUS);
    let other = FakeContainer::start();
    let older = json!({
        "schema": 1, "generation": 5, "next_ticket": 1,
        "reservations": [{
            "container_id": "other", "gpus": [{"uuid": "GPU-zero", "bytes": GIB}],
            "init": identity(other.pid()), "created_unix_ms": 1
        }],
        "queue": []
    });
    plant(&h, &serde_json::to_vec(&older).unwrap());
    let shown = status(&h.config);
    assert_eq!(shown["gpus"][0]["reservations"][0]["container_id"], "other");
    assert_eq!(shown["gpus"][0]["reservations"][0]["name"], Value::Null, "{shown}");

    let annotations = [
        ("vramgate.dev/memory", "1Gi"),
        ("vramgate.dev/gpus", "0"),
        ("vramgate.dev/name", "mine-job"),
    ];
    let bundle = h.bundle("mine", &annotations);
    let me = FakeContainer::start();
    let out = h.hook("createRuntime", &oci_state("mine", Some(me.pid()), &bundle));
    assert!(out.status.success(), "admit: {}", stderr(&out));
    let written = ledger_json(&h);
    assert_eq!(written["schema"], 1, "a name is no format bump: {written}");
    assert!(written["reservations"][0].get("name").is_none(), "{written}");
    assert_eq!(written["reservations"][1]["name"], "mine-job", "{written}");
    let shown = status(&h.config);
    assert_eq!(shown["gpus"][0]["reservations"][1]["name"], "mine-job", "{shown}");
}

/// A ledger of a format this vramgate does not read is refused with the line that says so,
/// by the hook and by the CLI, and nothing is written.
#[test]
fn a_newer_format_is_refused_by_hook_and_cli_and_left_alone() {
    let h = harness(GPUS);
    let newer = br#"{"schema":4,"generation":5,"next_ticket":1,"reservations":[],"queue":[],"shares":"a new shape"}"#;
    plant(&h, newer);
    let bundle = h.bundle("c", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    let container = FakeContainer::start();
    let out = h.hook("createRuntime", &oci_state("c", Some(container.pid()), &bundle));
    let hook_line = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "fail-closed refuses: {hook_line}");
    let out = h.cli(&["status"]);
    let cli_line = stderr(&out);
    assert!(!out.status.success(), "status: {cli_line}");
    for line in [&hook_line, &cli_line] {
        assert!(
            line.contains("was written by a newer vramgate (ledger format 4; this one reads up to 3)")
                && line.contains("finish upgrading vramgate"),
            "{line}"
        );
        assert!(!line.contains("corrupt"), "{line}");
        assert_eq!(line.trim_end().lines().count(), 1, "one line: {line}");
    }
    assert_eq!(std::fs::read(h.state_dir.join(LEDGER_FILE)).unwrap(), newer);
}

/// A ledger just under the limit every reader enforces (made so by a field of a newer vramgate,
/// which this one keeps): the admission that would push it over fails with the size and the
/// limit, and the file and the directory are as they were.
#[test]
fn a_ledger_is_never_written_larger_than_readers_accept() {
    let h = harness(GPUS);
    let mut ledger = json!({
        "schema": 1, "generation": 9, "next_ticket": 1, "reservations": [], "queue": [], "padding": ""
    });
    let base = serde_json::to_vec(&ledger).unwrap().len() as u64;
    ledger["padding"] = json!("x".repeat((MAX_LEDGER_BYTES - base - 16) as usize));
    let bytes = serde_json::to_vec(&ledger).unwrap();
    assert!(bytes.len() as u64 <= MAX_LEDGER_BYTES);
    plant(&h, &bytes);
    let names = || {
        let mut names: Vec<_> = std::fs::read_dir(&h.state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = names();

    let bundle = h.bundle("c", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    let container = FakeContainer::start();
    let out = h.hook("createRuntime", &oci_state("c", Some(container.pid()), &bundle));
    let line = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(
        line.contains("would grow to")
            && line.contains(&format!("over the {MAX_LEDGER_BYTES} bytes every vramgate reads")),
        "{line}"
    );
    assert_eq!(line.trim_end().lines().count(), 1, "one line: {line}");
    assert!(
        std::fs::read(h.state_dir.join(LEDGER_FILE)).unwrap() == bytes,
        "the ledger was changed"
    );
    // The attempt may have made the lock file, the event log and the markers' directory (its
    // marker for "c" made before the write, a harmless leftover: see ledger::marks); nothing
    // else, no temporary file.
    let made_by_any_attempt = |n: &std::ffi::OsString| n != "events.log" && n != "lock" && n != "held";
    let after: Vec<_> = names().into_iter().filter(made_by_any_attempt).collect();
    let before: Vec<_> = before.into_iter().filter(made_by_any_attempt).collect();
    assert_eq!(after, before, "files left in the state directory");
}

/// The poststop of a container vramgate never held (under podman's and CRI-O's hooks.d, every
/// container) is answered by the markers, without reading the ledger or taking its lock: its
/// syscalls, traced, never open the one nor the other. And the markers vouch only for the
/// ledger file as vramgate wrote it: once it is changed in place (same inode, which is what
/// they used to trust), the same stop reads it and reports the damage it finds.
#[test]
fn the_stop_of_a_container_never_held_does_not_read_the_ledger() {
    require("strace");
    let h = harness(GPUS);
    let held = h.bundle("held", &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "0")]);
    let container = FakeContainer::start();
    let out = h.hook("createRuntime", &oci_state("held", Some(container.pid()), &held));
    assert!(out.status.success(), "admit: {}", stderr(&out));
    let never = h.bundle("never", &[]);
    let out = h.hook("poststop", &oci_state("never", None, &never));
    assert!(out.status.success(), "{}", stderr(&out));

    let trace = h.state_dir.with_file_name("stop.strace");
    let mut traced = h
        .command("strace")
        .args(["-f", "-qq", "-y", "-o"])
        .arg(&trace)
        .args(["-e", "trace=open,openat,openat2,flock,fcntl,newfstatat,statx,read"])
        .arg(HOOK)
        .arg("poststop")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = traced.stdin.take().unwrap();
        stdin.write_all(&oci_state("never", None, &never)).unwrap();
    }
    let out = traced.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let state = h.state_dir.to_string_lossy().into_owned();
    let trace = std::fs::read_to_string(&trace).unwrap();
    let touched: Vec<&str> = trace.lines().filter(|l| l.contains(&state)).collect();
    // Every open, by absolute or relative name and against any directory descriptor, resolved.
    let forbidden = [h.state_dir.join("ledger.json"), h.state_dir.join("lock")];
    let opened: Vec<(std::path::PathBuf, &str)> = trace
        .lines()
        .filter_map(|l| opened_path(l).map(|p| (p, l)))
        .filter(|(p, _)| forbidden.contains(p))
        .collect();
    assert!(opened.is_empty(), "the stop opened the ledger or its lock: {opened:#?}");
    assert!(!touched.iter().any(|l| l.contains("flock(")), "{touched:#?}");
    assert!(
        touched.iter().any(|l| l.contains("\"ledger.json\"")),
        "it looked at the ledger's file (a stat): {touched:#?}"
    );

    {
        use std::io::Write;
        let mut ledger = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(h.state_dir.join(LEDGER_FILE))
            .unwrap();
        ledger.write_all(b"{damaged in place").unwrap();
    }
    let out = h.hook("poststop", &oci_state("never", None, &never));
    let line = stderr(&out);
    assert!(
        !out.status.success() && line.contains("is corrupt"),
        "a ledger changed in place is read, not vouched for: {line}"
    );
    let out = h.hook("poststop", &oci_state("held", Some(container.pid()), &held));
    let line = stderr(&out);
    assert!(!out.status.success() && line.contains("is corrupt"), "{line}");
}

/// The path an `open`, `openat` or `openat2` line of `strace -f -y` names, made absolute and
/// free of `.` and `..`: an absolute name as it is, a relative one joined to the directory of
/// its descriptor, which `-y` prints (`3</dir>`, `AT_FDCWD</cwd>`); `open` is relative to the
/// working directory, which `-y` does not print, so its relative names are joined to this
/// test's (the traced hook inherits it). `None` for any other line.
fn opened_path(line: &str) -> Option<std::path::PathBuf> {
    use std::path::{Component, Path, PathBuf};
    // "PID " with -f, then the call.
    let call = line.split_once(' ').map_or(line, |(_, rest)| rest);
    let (name, args) = call.split_once('(')?;
    let (dir, rest) = match name {
        "open" => (std::env::current_dir().unwrap(), args),
        "openat" | "openat2" => {
            let (fd, rest) = args.split_once(", ")?;
            let dir = fd.split_once('<')?.1.strip_suffix('>')?;
            (PathBuf::from(dir), rest)
        }
        _ => return None,
    };
    // The first argument left is the name, quoted, with `\"` and `\\` escaped.
    let quoted = rest.strip_prefix('"')?;
    let mut name = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => name.push(chars.next()?),
            '"' => break,
            c => name.push(c),
        }
    }
    let mut path = PathBuf::new();
    for part in dir.join(Path::new(&name)).components() {
        match part {
            Component::ParentDir => {
                path.pop();
            }
            Component::CurDir => {}
            other => path.push(other),
        }
    }
    Some(path)
}

/// The resolution the check above relies on, on lines as strace 6 prints them.
#[test]
fn opened_paths_are_resolved_whatever_the_spelling() {
    let want = Some(std::path::PathBuf::from("/s/state/ledger.json"));
    for line in [
        "12 openat(3</s/state>, \"ledger.json\", O_RDONLY|O_CLOEXEC) = 4</s/state/ledger.json>",
        "12 openat(AT_FDCWD</x>, \"/s/state/ledger.json\", O_RDONLY) = -1 ENOENT (No such file or directory)",
        "12 openat(5</s>, \"state/ledger.json\", O_RDWR) = 6</s/state/ledger.json>",
        "12 openat(AT_FDCWD</s/other>, \"../state/./ledger.json\", O_RDONLY <unfinished ...>",
        "12 openat2(7</s/state>, \"ledger.json\", {flags=O_RDONLY, resolve=0}, 24) = 8</s/state/ledger.json>",
        "12 open(\"/s/state/ledger.json\", O_RDONLY) = 3</s/state/ledger.json>",
    ] {
        assert_eq!(opened_path(line), want, "{line}");
    }
    assert_eq!(
        opened_path("12 newfstatat(3</s/state>, \"ledger.json\", {st_mode=S_IFREG|0600, ...}, 0) = 0"),
        None
    );
}
