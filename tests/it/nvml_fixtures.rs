//! The NVML side of vramgate on answers recorded on a GPU host (an H200, driver 580.159.04,
//! recorded by bench/gpu-test.sh and bench/gpu-experiment.sh with `vramgate status --record`
//! while real runc GPU containers ran), replayed here without a GPU; and the errors a host
//! without the driver gets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vramgate::admission::{self, Allocated, Decision, Rules};
use vramgate::attribution;
use vramgate::config::Config;
use vramgate::inventory::{Inventory, RecordedHost, RecordedInventory};
use vramgate::ledger::GpuShare;
use vramgate::quantity::Quantity;
use vramgate::request::{GpuSelector, RequestError};
use vramgate_testbed::{oci_state, FakeContainer, HookHarness, Testbed};

const MI: u64 = 1 << 20;

fn fixture(name: &str) -> RecordedHost {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nvml")
        .join(name);
    RecordedHost::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rules() -> Rules {
    Rules {
        headroom: Quantity::Bytes(0),
        backfill: false,
        backfill_bound: Duration::from_secs(30),
        backfill_order: vramgate::queue_order::BackfillOrder::Arrival,
        strategy: vramgate::placement::Strategy::BestFit,
        limit_overcommit_ppm: 0,
    }
}

fn allocated(host: &RecordedHost) -> attribution::Attribution {
    attribution::attribute(&host.ledger, &host.snapshot.processes, host.pid_namespace())
}

/// Two containers and a host process on a real GPU: a reserved 3 GiB and took 2.7 GiB; b
/// reserved 1 GiB and took 3.7 GiB; a process outside any container holds 1.5 GiB.
#[test]
fn recorded_processes_are_attributed_to_their_containers() {
    let host = fixture("attribution.json");
    let gpu = host.snapshot.gpus[0].uuid.clone();
    let a = allocated(&host);
    assert_eq!(a.allocated[&("gputest-a".to_string(), gpu.clone())], 2_864_709_632);
    assert_eq!(a.allocated[&("gputest-b".to_string(), gpu.clone())], 3_938_451_456);
    assert_eq!(a.outside.len(), 1, "{:?}", a.outside);
    assert_eq!(a.outside[0].pid, 8610);

    // What admission counts: a's untaken 340 MiB, nothing of b (it took more than it reserved).
    let account = admission::account(&host.ledger, &host.snapshot.gpus[0], &a.allocated, &rules());
    assert_eq!(account.unallocated, (3 << 30) - 2_864_709_632);
    // Memory in use not covered by a reservation: the driver's own, the host process, b's excess.
    let used = account.total - account.free;
    assert_eq!(
        account.used_outside(),
        used - (3 << 30) + account.unallocated - (1 << 30)
    );
    assert!(account.used_outside() > 1_616_904_192 + (3_938_451_456 - (1 << 30)));
}

#[test]
fn status_shows_used_against_reserved_and_flags_the_excess() {
    let host = fixture("attribution.json");
    let pid_ns = host.pid_namespace();
    let ledger = host.ledger.clone();
    let inventory = RecordedInventory { host: host.clone() };
    let report = vramgate::status::build_with(&Config::default(), &inventory, &ledger, pid_ns).unwrap();
    let gpu = &report.gpus[0];
    let by_id = |id: &str| gpu.reservations.iter().find(|r| r.container_id == id).unwrap();
    assert_eq!(by_id("gputest-a").used, Some(2_864_709_632));
    assert!(!by_id("gputest-a").over_reservation);
    assert_eq!(by_id("gputest-b").used, Some(3_938_451_456));
    assert!(by_id("gputest-b").over_reservation);
    assert_eq!(gpu.outside_processes.len(), 1);
    let text = vramgate::status::render(&report);
    assert!(text.contains("USING MORE THAN RESERVED"), "{text}");
    assert!(
        text.contains("outside any reservation: pid 8610 holds 1542 MiB"),
        "{text}"
    );
}

/// The value of one series in an exposition, found by its name and labels.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

fn metrics_of(host: &RecordedHost) -> String {
    let inventory = RecordedInventory { host: host.clone() };
    let report =
        vramgate::status::build_with(&Config::default(), &inventory, &host.ledger, host.pid_namespace()).unwrap();
    vramgate::metrics::render(&report, &host.ledger.counters, 0)
}

/// The metrics of the recorded H200 moment carry what NVML said: a used 2.7 GiB of its 3 GiB,
/// b used 3.7 GiB of its 1 GiB (over), and memory outside any reservation.
#[test]
fn metrics_show_recorded_usage_and_the_over_reservation() {
    let host = fixture("attribution.json");
    let uuid = host.snapshot.gpus[0].uuid.clone();
    let text = metrics_of(&host);
    let c = |name: &str, id: &str| {
        sample(
            &text,
            &format!(r#"{name}{{container_id="{id}",gpu="0",gpu_uuid="{uuid}"}}"#),
        )
    };
    assert_eq!(c("vramgate_container_reserved_bytes", "gputest-a"), 3 << 30);
    assert_eq!(c("vramgate_container_used_bytes", "gputest-a"), 2_864_709_632);
    assert_eq!(c("vramgate_container_over_reservation", "gputest-a"), 0);
    assert_eq!(c("vramgate_container_reserved_bytes", "gputest-b"), 1 << 30);
    assert_eq!(c("vramgate_container_used_bytes", "gputest-b"), 3_938_451_456);
    assert_eq!(c("vramgate_container_over_reservation", "gputest-b"), 1);

    let a = allocated(&host);
    let account = admission::account(&host.ledger, &host.snapshot.gpus[0], &a.allocated, &rules());
    let g = |name: &str| sample(&text, &format!(r#"{name}{{gpu="0",gpu_uuid="{uuid}"}}"#));
    assert_eq!(g("vramgate_gpu_memory_total_bytes"), host.snapshot.gpus[0].total);
    assert_eq!(g("vramgate_gpu_memory_free_bytes"), host.snapshot.gpus[0].free);
    assert_eq!(g("vramgate_gpu_memory_reserved_bytes"), 4 << 30);
    assert_eq!(g("vramgate_gpu_memory_used_outside_bytes"), account.used_outside());
    // The host process's 1.5 GiB and b's 2.7 GiB beyond its reservation are both outside.
    assert!(g("vramgate_gpu_memory_used_outside_bytes") > 1_616_904_192 + (3_938_451_456 - (1 << 30)));
    assert_eq!(g("vramgate_gpu_memory_available_bytes"), account.available());
    assert_eq!(g("vramgate_gpu_reservations"), 2);
}

/// The N=24 moment: 20 running, each using 6828 of its 6848 MiB, and 4 queued.
#[test]
fn metrics_of_the_recorded_queue_moment() {
    let host = fixture("wait-24.json");
    let uuid = host.snapshot.gpus[0].uuid.clone();
    let text = metrics_of(&host);
    let gpu = format!(r#"{{gpu="0",gpu_uuid="{uuid}"}}"#);
    assert_eq!(sample(&text, &format!("vramgate_queue_length{gpu}")), 4);
    assert_eq!(sample(&text, &format!("vramgate_gpu_reservations{gpu}")), 20);
    assert_eq!(
        sample(&text, &format!("vramgate_gpu_memory_reserved_bytes{gpu}")),
        20 * 6848 * MI
    );
    let used: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("vramgate_container_used_bytes{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(used.len(), 20);
    assert!(used.iter().all(|&u| u == 6828 * MI), "{used:?}");
    assert!(
        text.contains("vramgate_container_over_reservation{")
            && !text
                .lines()
                .any(|l| l.starts_with("vramgate_container_over_reservation{") && l.ends_with(" 1"))
    );
}

/// 24 containers of 6 GiB on the H200, policy wait, 9 s in: 20 running, 4 queued.
#[test]
fn recorded_queue_moment_admission_counts_allocation_once() {
    let host = fixture("wait-24.json");
    assert_eq!(host.ledger.reservations.len(), 20);
    assert_eq!(host.ledger.queue.len(), 4);
    let gpu = &host.snapshot.gpus[0];
    let a = allocated(&host);
    // Every running container's processes were found through its pid namespace.
    assert_eq!(a.allocated.len(), 20);
    assert!(a.outside.is_empty(), "{:?}", a.outside);

    let with = admission::account(&host.ledger, gpu, &a.allocated, &rules());
    let without = admission::account(&host.ledger, gpu, &Allocated::new(), &rules());
    // Each took 6828 of its 6848 MiB: 20 x 20 MiB are still promised.
    assert_eq!(with.unallocated, 20 * 20 * MI);
    // Without attribution, the 133 GiB they already took would be subtracted twice.
    assert_eq!(without.available(), 0);
    assert!(with.available() > 5_000 * MI, "{}", with.describe());

    // The head of the queue (6848 MiB) does not fit yet; it must wait, not be admitted.
    let head = &host.ledger.queue[0];
    let d = admission::decide_named(
        &host.ledger,
        &host.snapshot,
        &a.allocated,
        &rules(),
        &head.gpus,
        Some(head.ticket),
        head.enqueued_unix_ms,
    );
    assert!(matches!(d, Decision::NoRoom { .. }), "{d:?}");
    // A later arrival that would fit still queues behind the four (first come, first served).
    let small = vec![GpuShare {
        uuid: gpu.uuid.clone(),
        bytes: 1 << 30,
        limit: None,
    }];
    let d = admission::decide_named(&host.ledger, &host.snapshot, &a.allocated, &rules(), &small, None, 0);
    assert_eq!(d, Decision::Queued { ahead: 4 });
    // The sum of reservations never exceeded the card.
    assert!(host.ledger.reserved_on(&gpu.uuid) <= gpu.total);
}

#[test]
fn recorded_forty_container_moment_is_consistent() {
    let host = fixture("wait-40.json");
    let gpu = &host.snapshot.gpus[0];
    let a = allocated(&host);
    let account = admission::account(&host.ledger, gpu, &a.allocated, &rules());
    assert!(host.ledger.reserved_on(&gpu.uuid) <= gpu.total);
    assert!(account.reserved + account.available() <= gpu.total);
    // Processes are listed only where reservations are, and filtering keeps them all here.
    let inventory = RecordedInventory { host: host.clone() };
    let only_reserved = inventory
        .snapshot_with_processes(&|uuid| {
            host.ledger
                .reservations
                .iter()
                .any(|r| r.gpus.iter().any(|g| g.uuid == uuid))
        })
        .unwrap();
    assert_eq!(only_reserved.processes.len(), host.snapshot.processes.len());
    let none = inventory.snapshot_with_processes(&|_| false).unwrap();
    assert!(none.processes.is_empty());
    assert_eq!(none.gpus, host.snapshot.gpus);
}

#[test]
fn mig_devices_are_admitted_on_their_own_memory() {
    let host = fixture("synthetic-mig.json");
    let snapshot = &host.snapshot;
    let resolve = |value: &str| {
        GpuSelector::parse_list("NVIDIA_VISIBLE_DEVICES", value)
            .unwrap()
            .resolve(snapshot)
    };

    // The parent of MIG devices cannot be asked for as a whole; its MIG devices can.
    assert!(matches!(resolve("0"), Err(RequestError::MigParent { index: 0, .. })));
    assert_eq!(
        resolve("0:1").unwrap(),
        vec!["MIG-5c6a31e2-0001-5000-8000-000000000001"]
    );
    assert_eq!(
        resolve("MIG-5c6a31e2-0000-5000-8000-000000000000").unwrap(),
        vec!["MIG-5c6a31e2-0000-5000-8000-000000000000"]
    );
    assert_eq!(resolve("1").unwrap(), vec!["GPU-a1b2c3d4-0000-4000-8000-0000000000b1"]);

    let a = allocated(&host);
    assert_eq!(
        a.allocated[&("x".to_string(), "MIG-5c6a31e2-0000-5000-8000-000000000000".to_string())],
        8 << 30
    );
    assert_eq!(a.outside.len(), 1);
    assert_eq!(a.outside[0].gpu_uuid, "MIG-5c6a31e2-0001-5000-8000-000000000001");

    let share = |uuid: &str, bytes: u64| vec![GpuShare::new(uuid, bytes, 0)];
    // What the admission rule decides for `bytes` on `uuid` alone.
    let decide_on = |uuid: &str, bytes: u64| {
        admission::decide_named(
            &host.ledger,
            snapshot,
            &a.allocated,
            &rules(),
            &share(uuid, bytes),
            None,
            0,
        )
    };
    let small_mig = "MIG-5c6a31e2-0001-5000-8000-000000000001";
    // 12 GiB can never fit a 1g.10gb device, however empty the rest of the card is.
    let d = decide_on(small_mig, 12 << 30);
    assert!(matches!(d, Decision::Never { .. }), "{d:?}");
    // 8 GiB fits its 9984 MiB less the 1 GiB the outside process holds.
    let d = decide_on(small_mig, 8 << 30);
    assert!(matches!(d, Decision::Admit { .. }), "{d:?}");
    let d = decide_on(small_mig, 9 << 30);
    assert!(matches!(d, Decision::NoRoom { .. }), "{d:?}");
    // On the 3g.40gb device x's 10 GiB promise counts, minus the 8 GiB it already took.
    let big_mig = "MIG-5c6a31e2-0000-5000-8000-000000000000";
    let account = admission::account(&host.ledger, &snapshot.gpus[0], &a.allocated, &rules());
    assert_eq!(account.unallocated, 2 << 30);
    let fits = account.available();
    let d = decide_on(big_mig, fits);
    assert!(matches!(d, Decision::Admit { .. }), "{d:?}");
    assert!(matches!(decide_on(big_mig, fits + MI), Decision::NoRoom { .. }));
}

/// `vramgate status --json` under `config`, which must succeed.
fn status_json(config: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vramgate"))
        .args(["status", "--json"])
        .env("VRAMGATE_CONFIG", config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// An inventory section naming a driver library that does not exist.
fn missing_driver(backend: &str) -> String {
    format!("[inventory]\nbackend = \"{backend}\"\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"")
}

/// A scratch config in `dir` with that inventory.
fn missing_driver_config(dir: &Path, backend: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, Testbed::default_config(dir, &missing_driver(backend))).unwrap();
    path
}

const LOAD_ERROR: &str = "vramgate: cannot load the NVIDIA management library \"/nonexistent/libnvidia-ml.so.1\"";

#[test]
fn missing_driver_is_one_clear_line_from_status() {
    let dir = tempfile::tempdir().unwrap();
    let config = missing_driver_config(dir.path(), "nvml");
    let out = Command::new(env!("CARGO_BIN_EXE_vramgate"))
        .arg("status")
        .env("VRAMGATE_CONFIG", &config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(LOAD_ERROR), "{stderr}");
    // It says what was tried and what to do.
    assert!(stderr.contains("tried /nonexistent/libnvidia-ml.so.1"), "{stderr}");
    assert!(stderr.contains("set inventory.nvml_library"), "{stderr}");
    assert!(stderr.contains("inventory.backend = \"static\""), "{stderr}");

    // backend = "auto" on a host without the library is not an error: the static list is used.
    let config = missing_driver_config(dir.path(), "auto");
    assert!(status_json(&config).contains("\"inventory\": \"static"));
}

/// `program args` on a host that looks like a GPU host to the driver's own evidence: a private
/// mount namespace with `/proc/driver/nvidia` present (a tmpfs over /proc/driver), as the
/// NVIDIA kernel module makes it, while the library stays missing.
fn on_a_gpu_host(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs vramgate-test /proc/driver && mkdir /proc/driver/nvidia && exec \"$0\" \"$@\"")
        .arg(program)
        .args(args);
    cmd
}

/// `backend = "auto"` with the library missing on a host the driver says has a GPU: one line,
/// never the simulated card (status, doctor, and the hook, which refuses under fail-closed).
#[test]
fn auto_never_simulates_a_gpu_on_a_gpu_host() {
    let dir = tempfile::tempdir().unwrap();
    let config = missing_driver_config(dir.path(), "auto");
    let stderr = status_refused_on_a_gpu_host(&config);
    assert!(
        stderr.contains("this host has an NVIDIA GPU (/proc/driver/nvidia exists)")
            && stderr.contains("/nonexistent/libnvidia-ml.so.1")
            && stderr.contains("will not admit against a simulated GPU"),
        "{stderr}"
    );
    let out = on_a_gpu_host(env!("CARGO_BIN_EXE_vramgate"), &["doctor"])
        .env("VRAMGATE_CONFIG", &config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let inventory = text.lines().find(|l| l.contains(" inventory ")).unwrap_or_default();
    assert!(
        inventory.starts_with("PROBLEM") && inventory.contains("this host has an NVIDIA GPU"),
        "{text}"
    );

    let host = HookHarness::new(env!("CARGO_BIN_EXE_vramgate-hook"), &missing_driver("auto"));
    let stderr = hook_refused_on_a_gpu_host(&host, "gpuhost");
    assert!(stderr.contains("this host has an NVIDIA GPU"), "{stderr}");
}

/// `vramgate status --json` on a host that looks like a GPU host: asserts it printed no report
/// and one line, exit 1; returns the line.
fn status_refused_on_a_gpu_host(config: &Path) -> String {
    let out = on_a_gpu_host(env!("CARGO_BIN_EXE_vramgate"), &["status", "--json"])
        .env("VRAMGATE_CONFIG", config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no report: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

/// Runs the hook at createRuntime, on a host that looks like a GPU host, for a container
/// named `id` asking 1Gi of GPU 0; asserts it refused and reserved nothing; returns its stderr.
fn hook_refused_on_a_gpu_host(host: &HookHarness, id: &str) -> String {
    let bundle = host.bundle_with_spec(
        id,
        &serde_json::json!({"ociVersion": "1.0.2", "process": {"args": ["sleep"], "env": ["NVIDIA_VISIBLE_DEVICES=0"]},
            "root": {"path": "rootfs"}, "annotations": {"vramgate.dev/memory": "1Gi"}}),
    );
    let init = FakeContainer::start();
    let state = oci_state(id, Some(init.pid()), &bundle);
    let mut hook = on_a_gpu_host(env!("CARGO_BIN_EXE_vramgate-hook"), &["createRuntime"])
        .env("VRAMGATE_CONFIG", &host.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut hook.stdin.take().unwrap(), &state).unwrap();
    let out = hook.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "refused: {stderr}");
    assert!(host.ledger().reservations.is_empty(), "nothing admitted");
    stderr
}

/// `backend = "auto"` with the shipped config's `[[inventory.gpus]]` example uncommented, on a
/// host the driver says has a GPU: one line naming the list, never the simulated 80 GiB card
/// (status, and the hook, which then reserves nothing).
#[test]
fn auto_with_a_static_list_never_simulates_a_gpu_on_a_gpu_host() {
    let dir = tempfile::tempdir().unwrap();
    let listed = "[inventory]\nbackend = \"auto\"\n[[inventory.gpus]]\nindex = 0\nuuid = \"GPU-00000000-0000-0000-0000-000000000000\"\ntotal = \"80Gi\"\n";
    let config = dir.path().join("config.toml");
    std::fs::write(&config, Testbed::default_config(dir.path(), listed)).unwrap();
    // Without the driver's evidence the list is the simulated host it was written for.
    status_json(&config);
    let stderr = status_refused_on_a_gpu_host(&config);
    assert!(
        stderr.contains(&format!(
            "{}: inventory.backend = \"auto\" with 1 [[inventory.gpus]] table(s)",
            config.display()
        )) && stderr.contains("(/proc/driver/nvidia exists)")
            && stderr.contains("will not admit against a simulated GPU"),
        "{stderr}"
    );

    let host = HookHarness::new(env!("CARGO_BIN_EXE_vramgate-hook"), listed);
    let stderr = hook_refused_on_a_gpu_host(&host, "listed");
    assert!(stderr.contains("[[inventory.gpus]]"), "{stderr}");
}

#[test]
fn missing_driver_refuses_at_the_hook_with_one_line() {
    let host = HookHarness::new(env!("CARGO_BIN_EXE_vramgate-hook"), &missing_driver("nvml"));
    let bundle = host.bundle_with_spec(
        "nodriver",
        &serde_json::json!({"ociVersion": "1.0.2", "process": {"args": ["sleep"], "env": ["NVIDIA_VISIBLE_DEVICES=0"]},
            "root": {"path": "rootfs"}, "annotations": {"vramgate.dev/memory": "1Gi"}}),
    );
    let init = FakeContainer::start();
    let out = host.hook("createRuntime", &oci_state("nodriver", Some(init.pid()), &bundle));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(LOAD_ERROR), "{stderr}");
}

#[test]
fn doctor_reads_engine_configs_and_names_each_problem() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let config = missing_driver_config(r, "nvml");
    let hook = r.join("usr/bin/vramgate-hook");
    std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
    std::fs::write(&hook, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(r.join("etc/docker")).unwrap();
    std::fs::write(
        r.join("etc/docker/daemon.json"),
        r#"{"runtimes":{"vramgate":{"path":"/usr/bin/vramgate-runtime"}}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(r.join("etc/containers/oci/hooks.d")).unwrap();
    std::fs::write(
        r.join("etc/containers/oci/hooks.d/vramgate.json"),
        "{ \"hook\": vramgate",
    )
    .unwrap();

    let mut paths = vramgate::doctor::Paths::under(r, config.clone());
    paths.hook_candidates = vec![hook.clone()];
    let before: Vec<u8> = std::fs::read(r.join("etc/docker/daemon.json")).unwrap();
    let report = vramgate::doctor::run(&paths);
    let text = vramgate::doctor::render(&report);
    let line = |area: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {area} ")))
            .unwrap_or_default()
            .to_string()
    };

    assert!(line("config").starts_with("ok"), "{text}");
    assert!(
        line("inventory").starts_with("PROBLEM") && line("inventory").contains("/nonexistent/libnvidia-ml.so.1"),
        "{text}"
    );
    assert!(line("state").starts_with("ok"), "{text}");
    assert!(
        line("docker").starts_with("ok") && line("docker").contains("vramgate-runtime"),
        "{text}"
    );
    // The runtime the docker config names does not exist under this root.
    assert!(
        text.contains("vramgate-runtime is named by an engine config but is not an executable file"),
        "{text}"
    );
    assert!(
        text.contains("is not valid JSON") && text.contains("podman and CRI-O skip it"),
        "{text}"
    );
    assert_eq!(report.problems(), 3, "{text}");
    assert!(
        text.lines()
            .filter(|l| l.starts_with("PROBLEM"))
            .all(|l| l.contains("; fix: ")),
        "{text}"
    );
    // Doctor only reads.
    assert_eq!(std::fs::read(r.join("etc/docker/daemon.json")).unwrap(), before);
    assert!(!r.join("state").exists());

    // The binary exits non-zero when there is a problem.
    let out = Command::new(env!("CARGO_BIN_EXE_vramgate"))
        .arg("doctor")
        .env("VRAMGATE_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
