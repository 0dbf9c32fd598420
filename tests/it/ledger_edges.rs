//! The ledger's edges, through the built binaries against real runc on the simulated
//! 24,265 MiB GPU: a commit that fails on a full state directory while a container waits, a
//! ledger rewritten in place under the markers, and the delete of a container vramgate never
//! held.

use crate::support;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{runc_testbed, wrapper, wrapper_testbed, Cleanup, HOOK, RUNTIME};
use vramgate_testbed::Testbed;

/// A tmpfs of `size` mounted at a directory for the length of a test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "vramgate-test"])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount a tmpfs at {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until its filesystem has no block left.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
                break;
            }
        }
    }
}

/// The ledger on disk, as written.
fn ledger(bed: &Testbed) -> Value {
    serde_json::from_slice(&std::fs::read(bed.state_dir.join("ledger.json")).unwrap()).unwrap()
}

/// The container ids of the ledger's `list` (`reservations`, `queue`), which it must have: a
/// ledger without it is not one with none.
fn ids(ledger: &Value, list: &str) -> Vec<String> {
    support::array_field(ledger, list)
        .iter()
        .map(|e| support::str_field(e, "container_id").to_string())
        .collect()
}

fn eventually(what: &str, check: impl FnMut() -> bool) {
    support::eventually(what, Duration::from_secs(20), check);
}

fn request<'a>(memory: &'a str, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")];
    all.extend_from_slice(more);
    all
}

/// `vramgate-runtime run` of a new bundle without hooks (the wrapper adds them), in the
/// background, its output piped.
fn run_wrapped(bed: &Testbed, id: &str, args: &[&str], annotations: &[(&str, &str)]) -> Child {
    let bundle = bed.bundle(id, args, annotations, &[], false).unwrap();
    let (key, value) = bed.env();
    bed.runc_run(&bundle, id)
        .env(key, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Item 3 of issue 31: the queued container's last attempt (its timeout) removes its ticket in
/// memory, and the commit fails with ENOSPC. It used to come back as a plain ledger error,
/// which fail-open answered by starting the container unaccounted, with its ticket on disk
/// and the ticket's waiter (the wrapper) living on as runc, so every request behind it waited
/// on it. Now the container is refused with one line that says the ticket stands, and once
/// its process is gone nothing waits behind the ticket.
#[test]
fn a_commit_that_fails_on_a_full_state_dir_refuses_the_waiter_and_leaves_no_live_ticket() {
    let dir = tempfile::Builder::new().prefix("vg-full").tempdir().unwrap();
    let config = Testbed::default_config(
        dir.path(),
        &format!("on_state_error = \"fail-open\"\n[runtime]\nruntimes = [\"runc\"]\nhook_path = {HOOK:?}\n"),
    );
    let bed = Testbed::create(dir.path(), RUNTIME, Path::new(HOOK), &config).unwrap();
    let _tmpfs = Tmpfs::mount(&bed.state_dir, "1m");
    let _cleanup = Cleanup(&bed);

    let mut holder = run_wrapped(&bed, "holder", &["sleep", "60"], &request("20Gi", &[]));
    eventually("holder admitted", || {
        bed.state_dir.join("ledger.json").exists() && ids(&ledger(&bed), "reservations") == ["holder"]
    });
    let waiter = run_wrapped(
        &bed,
        "waiter",
        &["sh", "-c", "echo CONTAINER-RAN; sleep 30"],
        &request(
            "10Gi",
            &[("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "5s")],
        ),
    );
    eventually("waiter queued", || ids(&ledger(&bed), "queue") == ["waiter"]);
    let filler = bed.state_dir.join("filler");
    fill(&filler);

    // Its timeout comes while the disk is full: the refusal cannot be written.
    let out: Output = waiter.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(
        !text(&out.stdout).contains("CONTAINER-RAN"),
        "never started unaccounted: {stderr}"
    );
    assert!(!out.status.success(), "{stderr}");
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("could not be removed")).collect();
    assert_eq!(said.len(), 1, "one line says the ticket stands: {stderr}");
    assert!(
        said[0].contains("container waiter") && said[0].contains("No space left on device"),
        "and why: {stderr}"
    );
    assert_eq!(
        ids(&ledger(&bed), "queue"),
        ["waiter"],
        "the ticket stands on disk, as the line says"
    );

    // Once there is room again, the next admission does not queue behind the dead ticket: its
    // waiter was the refused wrapper, which is gone, so the transaction's reclaim drops it.
    std::fs::remove_file(&filler).unwrap();
    let next = run_wrapped(
        &bed,
        "next",
        &["true"],
        &request("2Gi", &[("vramgate.dev/policy", "reject")]),
    )
    .wait_with_output()
    .unwrap();
    assert!(next.status.success(), "{}", text(&next.stderr));
    assert!(ids(&ledger(&bed), "queue").is_empty());

    let _ = bed.runc(&["kill", "holder", "KILL"]).status();
    holder.wait().unwrap();
}

/// The pid and start time of a running container's init, as the ledger records them.
fn init_identity(bed: &Testbed, id: &str) -> Value {
    let out = bed.runc(&["state", id]).output().unwrap();
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = state["pid"].as_u64().unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 1..];
    let start_time: u64 = after_comm.split_whitespace().nth(19).unwrap().parse().unwrap();
    json!({ "pid": pid, "start_time": start_time })
}

/// Item 4 of issue 31: the markers' sync file named only the ledger's inode, which a write in
/// place keeps (and ext4 reuses), so a ledger rewritten by hand that holds a reservation for a
/// container whose stop comes next was vouched for by markers that never heard of it, and the
/// stop skipped the release. Now the sync file names the file as vramgate wrote it.
#[test]
fn a_ledger_rewritten_in_place_still_releases_at_stop() {
    let (_dir, bed) = runc_testbed("vg-inplace", "");
    let _cleanup = Cleanup(&bed);
    // A commit: the ledger exists, with the markers' sync file for it.
    let first = support::spawn_container(&bed, "first", &["true"], &request("1Gi", &[]))
        .wait_with_output()
        .unwrap();
    assert!(first.status.success(), "{}", text(&first.stderr));
    let synced = || {
        std::fs::read_dir(bed.state_dir.join("held"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("ledger-"))
    };
    assert!(synced(), "the markers vouch for this ledger");

    // A container vramgate never admitted (no request); its poststop hook runs all the same.
    let mut plain = support::spawn_container(&bed, "plain", &["sleep", "30"], &[]);
    eventually("plain runs", || {
        bed.runc(&["state", "plain"])
            .output()
            .is_ok_and(|o| text(&o.stdout).contains("\"running\""))
    });
    let uuid = support::status(&bed.config_path)["gpus"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_string();

    // By hand, in place (same inode, same generation): the ledger now holds plain's memory.
    let path = bed.state_dir.join("ledger.json");
    let inode = std::fs::metadata(&path).unwrap().ino();
    let mut by_hand = ledger(&bed);
    by_hand["reservations"] = json!([{
        "container_id": "plain",
        "gpus": [{ "uuid": uuid, "bytes": 4u64 << 30 }],
        "init": init_identity(&bed, "plain"),
        "created_unix_ms": 1,
    }]);
    std::fs::write(&path, serde_json::to_vec(&by_hand).unwrap()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode, "written in place");
    assert!(synced(), "the old sync file is still there");
    assert_eq!(support::reservations(&bed), [("plain".to_string(), 4u64 << 30)]);

    assert!(support::runc_kill_when_running(&bed, "plain"));
    plain.wait().unwrap();
    assert!(
        ids(&ledger(&bed), "reservations").is_empty(),
        "its stop released it: {}",
        ledger(&bed)
    );
    let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap();
    assert!(
        events
            .lines()
            .any(|l| l.contains("\"release\"") && l.contains("\"plain\"")),
        "{events}"
    );
}

/// The state directory's syscalls of `vramgate-runtime delete <id>` (and of the runc it
/// `exec`s), as strace prints them with file descriptors resolved.
fn traced_delete(bed: &Testbed, id: &str) -> Vec<String> {
    let trace = bed.dir.join(format!("delete-{id}.strace"));
    let (key, value) = bed.env();
    let out = Command::new("strace")
        .args(["-f", "-qq", "-y", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=open,openat,openat2,flock,fcntl,newfstatat,statx,stat,lstat,fstat,read",
        ])
        .arg(RUNTIME)
        .arg("--root")
        .arg(&bed.runc_root)
        .args(["delete", "--force", id])
        .env(key, value)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state = bed.state_dir.to_string_lossy().into_owned();
    std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|l| l.contains(&state))
        .map(str::to_string)
        .collect()
}

/// Item 5 of issue 31: every container an engine deletes goes through the wrapper's
/// `delete`, which read and parsed the whole ledger (and could wait 30 s for its lock) to look
/// for an abandoned wait. For a container vramgate never held the markers answer: no open of
/// the ledger, no lock. A wait that was abandoned is still dropped.
#[test]
fn delete_of_a_container_never_held_reads_no_ledger_and_takes_no_lock() {
    support::require("strace");
    let (_dir, bed) = wrapper_testbed("vg-delete", "");
    let _cleanup = Cleanup(&bed);
    let mut holder = run_wrapped(&bed, "holder", &["sleep", "60"], &request("20Gi", &[]));
    eventually("holder admitted", || support::reservations(&bed).len() == 1);

    // A container without a request, created and deleted through the wrapper.
    let bundle = bed.bundle("plain", &["sleep", "30"], &[], &[], false).unwrap();
    let (ok, stderr) = wrapper(&bed, &["create", "--bundle", &bundle.to_string_lossy(), "plain"]);
    assert!(ok, "{stderr}");
    let touched = traced_delete(&bed, "plain");
    let lock = bed.state_dir.join("lock").to_string_lossy().into_owned();
    let opened_ledger: Vec<&String> = touched
        .iter()
        .filter(|l| (l.starts_with("open") || l.contains(" open")) && l.contains("ledger.json"))
        .collect();
    assert!(opened_ledger.is_empty(), "no read of the ledger: {touched:#?}");
    assert!(
        !touched.iter().any(|l| l.contains(&lock) || l.contains("\"lock\"")),
        "no lock: {touched:#?}"
    );
    assert!(
        touched.iter().any(|l| l.contains("newfstatat") || l.contains("statx")),
        "the markers were asked: {touched:#?}"
    );
    assert_eq!(support::reservations(&bed).len(), 1, "the held one stands");

    // A create that waited in the queue and was killed (the engine gave up): its delete still
    // drops the abandoned ticket.
    let bundle = bed
        .bundle(
            "gaveup",
            &["true"],
            &request(
                "10Gi",
                &[("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "60s")],
            ),
            &[],
            false,
        )
        .unwrap();
    let (key, value) = bed.env();
    let mut runc = bed.runc(&["create", "--bundle", &bundle.to_string_lossy(), "gaveup"]);
    let mut create = support::spawn_quiet(&mut runc, key, value);
    eventually("gaveup queued", || ids(&ledger(&bed), "queue") == ["gaveup"]);
    create.kill().unwrap();
    create.wait().unwrap();
    let (_, stderr) = wrapper(&bed, &["delete", "--force", "gaveup"]);
    assert!(ids(&ledger(&bed), "queue").is_empty(), "dropped at delete: {stderr}");

    let _ = bed.runc(&["kill", "holder", "KILL"]).status();
    holder.wait().unwrap();
}

/// The wrapper's fail-open path (`service::fails_open`, the one place the hook, its
/// driver-limit path and the wrapper ask): a corrupt ledger under `on_state_error =
/// "fail-open"` lets a wrapped container start unaccounted and records a `fail_open` event;
/// under `fail-closed` the same container is refused, never runs, and nothing is recorded as
/// failed open.
#[test]
fn the_wrapper_fails_open_on_a_corrupt_ledger_only_where_the_config_says_so() {
    for (mode, starts) in [("fail-open", true), ("fail-closed", false)] {
        let dir = tempfile::Builder::new().prefix("vg-failopen").tempdir().unwrap();
        let config = Testbed::default_config(
            dir.path(),
            &format!("on_state_error = \"{mode}\"\n[runtime]\nruntimes = [\"runc\"]\nhook_path = {HOOK:?}\n"),
        );
        let bed = Testbed::create(dir.path(), RUNTIME, Path::new(HOOK), &config).unwrap();
        let _cleanup = Cleanup(&bed);
        // The state directory as vramgate makes it (root's, 0700), with a ledger that is not one.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&bed.state_dir)
            .unwrap();
        std::fs::write(bed.state_dir.join("ledger.json"), b"{ not a ledger").unwrap();

        let out = run_wrapped(&bed, "c", &["sh", "-c", "echo CONTAINER-RAN"], &request("2Gi", &[]))
            .wait_with_output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(text(&out.stdout).contains("CONTAINER-RAN"), starts, "{mode}: {stderr}");
        assert_eq!(out.status.success(), starts, "{mode}: {stderr}");
        let events = std::fs::read_to_string(bed.state_dir.join("events.jsonl")).unwrap_or_default();
        assert_eq!(events.contains("\"fail_open\""), starts, "{mode}: {events}");
        if !starts {
            assert!(stderr.contains("ledger"), "{mode}: the line names the ledger: {stderr}");
        }
    }
}
