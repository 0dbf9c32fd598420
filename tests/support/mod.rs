//! What the integration tests share beyond the scratch hosts of the crate `vramgate_testbed`
//! (testbed/, which the benches use too): the built binaries, reading
//! `vramgate status --json`, waiting with a bound, starting and stopping the daemons the
//! engine tests drive, and a seeded random generator for the reliability tests.

// The integration binary (tests/it) and the two real-node binaries (tests/kube_node.rs,
// tests/kube_helm.rs) compile this module; each uses a part of it.
#![allow(dead_code)]

// The engines' and Kubernetes' harnesses, each used by some of the tests.
pub mod cluster;
pub mod cri;
pub mod crio;
pub mod dra;
pub mod helm;
pub mod host;
pub mod kubelet;
pub mod node_image;
pub mod registration_client;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
// The engines' process plumbing, shared with the test node's supervisor (tools/testnode).
pub use testnode::containerd::*;
pub use testnode::host_dirs::*;
pub use testnode::process::*;
use vramgate_testbed::{HookHarness, Testbed};

pub const VRAMGATE: &str = env!("CARGO_BIN_EXE_vramgate");
pub const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");
pub const RUNTIME: &str = env!("CARGO_BIN_EXE_vramgate-runtime");
/// The most a test gives a step that the product takes "at once" (a ticket dropped by its
/// guard after a kill, a waiter let in after a release, a refusal without waiting) before it
/// counts as not having happened: sized for a loaded 2-core machine, where four engineers'
/// builds and test suites run side by side and a process can wait seconds for a core. Where a
/// test bounds a time at all, it is to tell the promised cause from a slower wrong one (a
/// wait timeout, a poll interval), each set well above this; how fast the step is goes to
/// bench/, not into an assertion.
pub const LOADED_MACHINE_BOUND: Duration = Duration::from_secs(10);

/// The simulated GPU of the default static inventory: 24,265 MiB.
pub const GPU_MIB: u64 = 24_265;
pub const GIB: u64 = 1 << 30;

/// A testbed (private state dir, busybox rootfs) on the static simulated GPU.
pub fn testbed(dir: &Path) -> Testbed {
    let config = Testbed::default_config(dir, "[inventory]\nbackend = \"static\"");
    Testbed::create(dir, "runc", Path::new(HOOK), &config).expect("testbed")
}

/// A testbed in a new temporary directory named after the test, with `config_extra` in its
/// config; the directory goes when the returned guard drops.
pub fn runc_testbed(name: &str, config_extra: &str) -> (tempfile::TempDir, Testbed) {
    let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
    let config = Testbed::default_config(dir.path(), config_extra);
    let bed = Testbed::create(dir.path(), "runc", Path::new(HOOK), &config).unwrap();
    (dir, bed)
}

/// A testbed whose "runc" is `vramgate-runtime`, which runs the real runc next with the built
/// hook; `config_extra` is added to its config.
pub fn wrapper_testbed(name: &str, config_extra: &str) -> (tempfile::TempDir, Testbed) {
    let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
    let config = Testbed::default_config(
        dir.path(),
        &format!("[runtime]\nruntimes = [\"runc\"]\nhook_path = {HOOK:?}\n{config_extra}"),
    );
    let bed = wrapper_testbed_in(dir.path(), &config);
    (dir, bed)
}

/// A testbed in `dir` whose "runc" is `vramgate-runtime`, with exactly `config` as its config
/// (the runtimes it runs next are the test's).
pub fn wrapper_testbed_in(dir: &Path, config: &str) -> Testbed {
    Testbed::create(dir, RUNTIME, Path::new(HOOK), config).unwrap()
}

/// Runs the wrapper against the testbed's runc root, reading the testbed's config; returns
/// whether it succeeded and its stderr. Output goes to a file, not a pipe: a created container
/// keeps the stdio it inherited, and a pipe would never reach end of file.
pub fn wrapper(bed: &Testbed, args: &[&str]) -> (bool, String) {
    let err_file = tempfile::NamedTempFile::new_in(&bed.dir).unwrap();
    let (key, value) = bed.env();
    let status = bed
        .runc(args)
        .env(key, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file.reopen().unwrap())
        .status()
        .unwrap();
    (status.success(), std::fs::read_to_string(err_file.path()).unwrap())
}

/// Removes every container a test left in its testbed, however the test ends.
pub struct Cleanup<'a>(pub &'a Testbed);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        self.0.cleanup_containers();
    }
}

/// `runc run` of a new bundle (with the vramgate hooks) in the background, its output piped.
pub fn spawn_container(bed: &Testbed, id: &str, args: &[&str], annotations: &[(&str, &str)]) -> Child {
    let bundle = bed.bundle(id, args, annotations, &[], true).unwrap();
    bed.runc_run(&bundle, id)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A scratch host for running the built `vramgate-hook` directly (see `HookHarness`).
pub fn harness(config_extra: &str) -> HookHarness {
    HookHarness::new(HOOK, config_extra)
}

/// What `vramgate status --json` reports for the host whose config is `config`.
pub fn status(config: &Path) -> Value {
    serde_json::from_str(&status_output(config, &["--json"])).unwrap()
}

/// The output of `vramgate status <args>` for the host whose config is `config`, which must
/// succeed.
pub fn status_output(config: &Path, args: &[&str]) -> String {
    let out = Command::new(VRAMGATE)
        .arg("status")
        .args(args)
        .env("VRAMGATE_CONFIG", config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vramgate status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `object[key]`, which must be there. The readers below read the product's JSON through
/// these: a status or event that drops or renames a field fails the test that reads it, naming
/// the field, where a default would have read as "nothing reserved" or "nothing queued" and
/// passed every check of an absence.
pub fn field<'a>(object: &'a Value, key: &str) -> &'a Value {
    object
        .get(key)
        .unwrap_or_else(|| panic!("the field {key:?} is missing from {object}"))
}

/// `object[key]` as an array (see [`field`]).
pub fn array_field<'a>(object: &'a Value, key: &str) -> &'a Vec<Value> {
    field(object, key)
        .as_array()
        .unwrap_or_else(|| panic!("the field {key:?} is not an array in {object}"))
}

/// `object[key]` as a string (see [`field`]).
pub fn str_field<'a>(object: &'a Value, key: &str) -> &'a str {
    field(object, key)
        .as_str()
        .unwrap_or_else(|| panic!("the field {key:?} is not a string in {object}"))
}

/// `object[key]` as an unsigned number (see [`field`]).
pub fn u64_field(object: &Value, key: &str) -> u64 {
    field(object, key)
        .as_u64()
        .unwrap_or_else(|| panic!("the field {key:?} is not an unsigned number in {object}"))
}

/// `object[key]` as a boolean (see [`field`]). The product omits `alive` exactly when it cannot
/// tell: that is a missing field here, not a guess.
pub fn bool_field(object: &Value, key: &str) -> bool {
    field(object, key)
        .as_bool()
        .unwrap_or_else(|| panic!("the field {key:?} is missing or not a boolean in {object}"))
}

/// The OCI spec in `path`: a bundle's config.json, as the engine handed it to the runtime.
pub fn read_spec(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The environment of a spec's process, `KEY=value` each.
pub fn process_env(spec: &Value) -> Vec<&str> {
    spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect()
}

/// The GPUs of a `vramgate status --json` report.
pub fn status_gpus(status: &Value) -> &Vec<Value> {
    array_field(status, "gpus")
}

/// The reservations `vramgate status --json` lists: (container id, bytes).
pub fn reservations(tb: &Testbed) -> Vec<(String, u64)> {
    reservations_by_gpu(tb).into_iter().flat_map(|(_, held)| held).collect()
}

/// Each GPU's reservations in `vramgate status --json`: (uuid, [(container id, bytes)]). Every
/// GPU must list `reservations` (empty when it holds none).
pub fn reservations_by_gpu(tb: &Testbed) -> Vec<(String, Vec<(String, u64)>)> {
    status_gpus(&status(&tb.config_path))
        .iter()
        .map(|g| {
            let held = array_field(g, "reservations")
                .iter()
                .map(|r| (str_field(r, "container_id").to_string(), u64_field(r, "bytes")))
                .collect();
            (str_field(g, "uuid").to_string(), held)
        })
        .collect()
}

/// The container ids of the queue `vramgate status --json` lists, on every GPU (a placement
/// waiting for any of several GPUs is listed on each). Every GPU must list `queue`.
pub fn queued_ids(tb: &Testbed) -> Vec<String> {
    status_gpus(&status(&tb.config_path))
        .iter()
        .flat_map(|g| array_field(g, "queue").clone())
        .map(|t| str_field(&t, "container_id").to_string())
        .collect()
}

/// Every kind of event the hooks log (`src/events.rs`), written here by hand: a kind the tests
/// do not know (a renamed one, which every filter on the old name would miss) fails the read.
pub const EVENT_KINDS: &[&str] = &[
    "admit",
    "admit_after_wait",
    "refuse",
    "enqueue",
    "timeout",
    "cancel",
    "release",
    "confirm",
    "reclaim",
    "abandon_ticket",
    "fail_open",
    "enforce",
    "over_use",
    "over_use_stop",
    "note",
];

/// The events logged in the state directory `state_dir`, in order; none when no decision was
/// logged yet (no file). Each must carry a known `event` kind and its `container`: the tests
/// filter on both, and a filter on a field that is gone finds nothing and passes.
pub fn events_in(state_dir: &Path) -> Vec<Value> {
    let path = state_dir.join("events.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    text.lines()
        .map(|l| {
            let event: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", path.display()));
            let kind = str_field(&event, "event");
            assert!(
                EVENT_KINDS.contains(&kind),
                "the field \"event\" has a kind the tests do not know, {kind:?} (add it to EVENT_KINDS in tests/support/mod.rs): {l}"
            );
            str_field(&event, "container");
            event
        })
        .collect()
}

/// `name` made this test process's own (`name-<pid>`): for a container id in a host-wide
/// runc root or a name matched in a host-wide `ps`, where another test binary running beside
/// this one may use the same name.
pub fn own_name(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// The keys a TOML text sets, commented out or not (`key = ...` at the start of a line),
/// sorted and each once: what `packaging/config.toml` offers an admin.
pub fn config_keys(text: &str) -> Vec<String> {
    let mut keys: Vec<String> = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim_start())
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_string)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// `vramgate watch` on a testbed's config, as vramgate-watch.service runs it: stopped (by its
/// own pid) when dropped.
pub struct RunningWatch(std::process::Child);

impl RunningWatch {
    /// Starts the watch and returns once a pass has measured (its heartbeat is in the state
    /// directory, which is made first as the first hook would make it).
    pub fn start(bed: &vramgate_testbed::Testbed) -> RunningWatch {
        let state = vramgate::ledger::StateDir::open_or_create(&bed.state_dir).unwrap();
        let (key, value) = bed.env();
        let child = Command::new(VRAMGATE)
            .arg("watch")
            .env(key, value)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let watch = RunningWatch(child);
        let heartbeat = state.path().join(vramgate::service::HEARTBEAT_FILE);
        wait_until("the watch's first heartbeat", Duration::from_secs(10), || {
            (heartbeat.exists(), ())
        });
        watch
    }

    /// Stops it now.
    pub fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RunningWatch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A config file replaced by a FIFO nobody writes: a read of it blocks, as an NVML call can on a
/// GPU that fell off the bus. The FIFO's second name reaches a blocked reader afterwards.
pub struct HungConfig {
    config: PathBuf,
    text: Vec<u8>,
    writer_end: PathBuf,
}

impl HungConfig {
    /// Replaces the config file at `config` by the FIFO.
    pub fn hang(config: &Path) -> HungConfig {
        let text = std::fs::read(config).unwrap();
        let fifo = config.with_extension("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let writer_end = config.with_extension("fifo.writer");
        std::fs::hard_link(&fifo, &writer_end).unwrap();
        std::fs::rename(&fifo, config).unwrap();
        HungConfig {
            config: config.to_path_buf(),
            text,
            writer_end,
        }
    }

    /// Gives the config's text to the first reader (a binary's own read at start), so that
    /// only the next read blocks.
    pub fn serve_one_read(&self) {
        let (writer_end, text) = (self.writer_end.clone(), self.text.clone());
        std::thread::spawn(move || {
            // Opening blocks until the reader opens; closing is the reader's end of file.
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .open(&writer_end)
                .and_then(|mut f| std::io::Write::write_all(&mut f, &text));
        });
    }

    /// Puts the file back first (a read after the blocked one must not find the FIFO), then
    /// unblocks the reader waiting on the FIFO.
    pub fn release(self) {
        let restored = self.config.with_extension("restored");
        std::fs::write(&restored, &self.text).unwrap();
        std::fs::rename(&restored, &self.config).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.writer_end)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &self.text))
            .unwrap();
    }
}

/// `runc kill <id> KILL` once runc says the container runs. A reservation shows at
/// createRuntime, while `runc run` is still creating the container, and a kill then can race
/// the create (runc answers that the container is not running) on a loaded machine.
#[allow(dead_code)]
pub fn runc_kill_when_running(bed: &Testbed, id: &str) -> bool {
    eventually(&format!("runc says {id} runs"), Duration::from_secs(20), || {
        bed.runc(&["state", id])
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("\"running\""))
    });
    bed.runc(&["kill", id, "KILL"]).status().is_ok_and(|s| s.success())
}

/// Polls `check` every 25 ms for at most `limit`; returns how long it took to hold, which the
/// queue tests measure (hence the shorter period).
pub fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> Duration {
    poll(what, limit, Duration::from_millis(25), || (check(), ())).1
}

pub fn wait_released(tb: &Testbed, id: &str) {
    wait_until(&format!("{id} is released"), Duration::from_secs(15), || {
        let r = reservations(tb);
        (!r.iter().any(|(c, _)| c == id), r)
    });
}

pub fn wait_reserved(tb: &Testbed, id: &str, bytes: u64) {
    wait_until(&format!("{id} holds {bytes} bytes"), Duration::from_secs(15), || {
        let r = reservations(tb);
        (r.iter().any(|(c, b)| c == id && *b == bytes), r)
    });
}

/// `cmd` started with the variable `key`=`value` (the testbed's config), no stdin and its output dropped: a
/// create that waits in the queue while the test looks at the ledger.
pub fn spawn_quiet(cmd: &mut Command, key: impl AsRef<std::ffi::OsStr>, value: impl AsRef<std::ffi::OsStr>) -> Child {
    cmd.env(key, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The repo's hooks.d files, as packaged, written to `hooks_d` pointed at the built hook and
/// the testbed `tb`'s config (podman and CRI-O read them).
pub fn write_packaged_hooks(hooks_d: &Path, tb: &Testbed) {
    let repo_hooks = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks");
    for name in ["vramgate-prestart.json", "vramgate-poststop.json"] {
        let mut doc: Value = serde_json::from_slice(&std::fs::read(repo_hooks.join(name)).unwrap()).unwrap();
        doc["hook"]["path"] = serde_json::json!(HOOK);
        doc["hook"]["env"] = serde_json::json!([format!("VRAMGATE_CONFIG={}", tb.config_path.display())]);
        std::fs::write(hooks_d.join(name), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    }
}

/// Which vramgate hook stages a bundle's `config.json` carries.
pub fn vramgate_hook_stages(config_json: &Path) -> Vec<String> {
    let spec: Value = serde_json::from_slice(&std::fs::read(config_json).unwrap()).unwrap();
    let mut stages = Vec::new();
    if let Some(hooks) = spec.get("hooks").and_then(Value::as_object) {
        for (stage, entries) in hooks {
            let ours = entries
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["path"].as_str().is_some_and(|p| p.ends_with("/vramgate-hook")));
            if ours {
                stages.push(stage.clone());
            }
        }
    }
    stages
}

/// A small deterministic generator (xorshift64*): reproducible runs from a printed seed,
/// without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    /// A seed from `VRAMGATE_TEST_SEED` if set (to replay a failure), else the clock.
    pub fn seed_from_env() -> u64 {
        std::env::var("VRAMGATE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            })
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Compiles the C fixture `tests/fixtures/<fixture>` into the shared library `lib`, with the
/// preprocessor definitions `defines` (`-DNAME=value`): how each stub NVML library a test
/// loads in place of the driver's is built. A missing compiler fails the test: skipping would
/// pass without checking anything.
pub fn compile_fixture_library(fixture: &str, lib: &Path, defines: &[String]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(fixture);
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(lib)
        .arg(&source)
        .args(defines)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc (install gcc: scripts/install-deps does): {e}"));
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles the stub NVML library (`tests/fixtures/nvml_limit_stub.c`) into `dir`: with the
/// driver memory limit's calls (a driver R615+ would have them), or without (`with_limits:
/// false`, a 580 driver). Returns the library and the log it appends every call to; the file
/// of what each cgroup "uses" (for `nvmlDeviceGetMemoryLimits_v1`) is the log's path plus
/// `.usage`. The stub's "host" has the GPUs `devices` (their UUIDs, written to the log's path plus
/// `.devices`): as the real library, it refuses a handle for any other UUID. A missing compiler
/// fails the test: skipping would pass without checking anything.
pub fn nvml_stub(dir: &Path, with_limits: bool, devices: &[&str]) -> (PathBuf, PathBuf) {
    let lib = dir.join(if with_limits {
        "libnvml-limits.so"
    } else {
        "libnvml-580.so"
    });
    let log = dir.join(format!("{}.log", lib.file_name().unwrap().to_string_lossy()));
    let mut defines = vec![format!("-DLOG_PATH=\"{}\"", log.display())];
    if !with_limits {
        defines.push("-DWITHOUT_LIMITS".to_string());
    }
    compile_fixture_library("nvml_limit_stub.c", &lib, &defines);
    let mut listed = devices.join("\n");
    listed.push('\n');
    std::fs::write(format!("{}.devices", log.display()), listed).unwrap();
    (lib, log)
}

/// The host's cgroup v2 mount: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
/// hybrid one (the development VM); `0::` paths in /proc are relative to either.
pub fn cgroup_v2_root() -> PathBuf {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").exists())
        .expect("this host mounts no cgroup v2 (neither /sys/fs/cgroup nor /sys/fs/cgroup/unified)")
}

/// `program args` in the layout the driver limit needs, cgroup v2 at /sys/fs/cgroup: as it
/// is on a unified host, and on a hybrid one (the development VM) in a private mount
/// namespace with the unified hierarchy bound over /sys/fs/cgroup. runc then creates each
/// container's cgroup in cgroup v2, where the hook finds it, as on a real GPU host.
pub fn in_cgroup_v2(program: &Path, args: &[&std::ffi::OsStr]) -> Command {
    let root = cgroup_v2_root();
    if root == Path::new("/sys/fs/cgroup") {
        let mut cmd = Command::new(program);
        cmd.args(args);
        return cmd;
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind {} /sys/fs/cgroup && exec \"$0\" \"$@\"",
            root.display()
        ))
        .arg(program)
        .args(args);
    cmd
}

/// The binaries this test run built, by name: `cargo test` sets `CARGO_BIN_EXE_<name>` for each
/// (under `CARGO_TARGET_DIR`, wherever that is). A binary added to src/bin/ must be added here.
pub fn built_binary(name: &str) -> PathBuf {
    PathBuf::from(match name {
        "vramgate" => env!("CARGO_BIN_EXE_vramgate"),
        "vramgate-hook" => env!("CARGO_BIN_EXE_vramgate-hook"),
        "vramgate-runtime" => env!("CARGO_BIN_EXE_vramgate-runtime"),
        "vramgate-device-plugin" => env!("CARGO_BIN_EXE_vramgate-device-plugin"),
        "vramgate-dra" => env!("CARGO_BIN_EXE_vramgate-dra"),
        other => panic!("src/bin/{other}.rs: add it to tests/support/mod.rs's built_binary"),
    })
}

/// The GNU build id of the ELF file `path` (its `.note.gnu.build-id`, as `readelf -n` shows
/// it): a hash the linker writes over the linked output, which `strip` keeps. A packaged,
/// stripped binary carries the id of the binary it was stripped from.
pub fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run readelf (binutils): {e}"));
    assert!(out.status.success(), "readelf -n {}: {}", path.display(), stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no GNU build id: {text}", path.display()))
        .to_string()
}

/// Asserts that each binary in `dir` (the package's /usr/bin, unpacked or installed) is the one
/// this test run built, by build id: packaging whatever target/release held (a build of
/// another commit, or of another target directory) fails here.
pub fn assert_built_here(dir: &Path, names: &[String]) {
    for name in names {
        let packaged = dir.join(name);
        let built = built_binary(name);
        assert_eq!(
            build_id(&packaged),
            build_id(&built),
            "{} is not the {name} this test run built ({}): the package took another build",
            packaged.display(),
            built.display()
        );
    }
}

/// Asserts that the container `id` is shown as `name` (`None`: by its id) wherever a container
/// is shown: `vramgate status --json` and its table, the metrics' `name` label and its admission
/// in the event log (issue 47).
pub fn assert_shown_as(config: &Path, state_dir: &Path, id: &str, name: Option<&str>) {
    let json = status(config);
    let entry = array_field(&json, "gpus")
        .iter()
        .flat_map(|g| array_field(g, "reservations"))
        .find(|r| field(r, "container_id") == id)
        .unwrap_or_else(|| panic!("{id} holds no reservation: {json}"));
    assert_eq!(field(entry, "name").as_str(), name, "{entry}");
    let table = status_output(config, &[]);
    let column = name.map_or_else(|| id.chars().take(24).collect::<String>(), str::to_string);
    assert!(
        table.lines().any(|l| l.trim_start().starts_with(&column)),
        "{column} is not in the CONTAINER column:\n{table}"
    );
    let metrics = Command::new(VRAMGATE)
        .arg("metrics")
        .env("VRAMGATE_CONFIG", config)
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let series = metrics
        .lines()
        .find(|l| l.starts_with(&format!("vramgate_container_reserved_bytes{{container_id=\"{id}\"")))
        .unwrap_or_else(|| panic!("no series of {id}:\n{metrics}"));
    match name {
        Some(name) => assert!(series.contains(&format!(",name=\"{name}\"}}")), "{series}"),
        None => assert!(!series.contains("name="), "{series}"),
    }
    let events = events_in(state_dir);
    let admitted = events
        .iter()
        .find(|e| e["container"] == id && e["event"].as_str().is_some_and(|k| k.starts_with("admit")))
        .unwrap_or_else(|| panic!("no admission of {id} in {events:?}"));
    assert_eq!(admitted.get("name").and_then(Value::as_str), name, "{admitted}");
}
