//! Benchmark of the device plugin, with this program as kubelet: how long a ledger change
//! takes to reach ListAndWatch (target <= 1 s), and Allocate and GetPreferredAllocation round
//! trips on the plugin's socket (Allocate target <= 5 ms), on 8 simulated 80 GiB GPUs whose
//! ledger holds N live reservations.
//!
//!   cargo run --release --example device-plugin-bench -- [--live N] [--changes N] [--calls N]
//!
//! Run through `bench/device-plugin.sh`, which builds first; needs root (the state dir is
//! root's). Each ledger change is a real transaction (lock, atomic rename) adding or removing
//! one 1 GiB reservation outside Kubernetes on GPU 0, timed from its commit to the list in
//! which GPU 0's healthy units moved. The reservations belong to pid 1, which outlives the run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramgate::deviceplugin::api;
use vramgate::deviceplugin::api::device_plugin_client::DevicePluginClient;
use vramgate::ledger::{GpuShare, Reservation, StateDir};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::bench::{arg, built_binary, gpu_uuid as uuid, report, static_config};
use vramgate_testbed::kubelet::{list_and_watch, Kubelet};

const GIB: u64 = 1 << 30;
const GPUS: usize = 8;

fn reservation(id: String, gpu: usize, init: ProcessIdentity) -> Reservation {
    Reservation::new(id, vec![GpuShare::new(uuid(gpu), GIB, 0)], init, 1)
}

/// GPU 0's healthy units in a list.
fn healthy_on_gpu0(devices: &[api::Device]) -> usize {
    let prefix = format!("{}/", uuid(0));
    devices
        .iter()
        .filter(|d| d.id.starts_with(&prefix) && d.health == "Healthy")
        .count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let live: usize = arg(&args, "--live", "500").parse().expect("--live N");
    let changes: usize = arg(&args, "--changes", "50").parse().expect("--changes N");
    let calls: usize = arg(&args, "--calls", "500").parse().expect("--calls N");

    // State and sockets on tmpfs, as /run is.
    let work = tempfile::Builder::new()
        .prefix("vramgate-dp-bench")
        .tempdir_in("/dev/shm")
        .unwrap();
    let state_dir = work.path().join("state");
    let plugin_dir = work.path().join("device-plugins");
    let config = work.path().join("config.toml");
    std::fs::write(&config, static_config(&state_dir, GPUS)).unwrap();
    let state = StateDir::open_or_create(&state_dir).unwrap();
    let init = ProcessIdentity::of(1).expect("pid 1 is readable");
    let mut tx = state.begin().unwrap();
    tx.ledger.reservations = (0..live)
        .map(|n| reservation(format!("live-{n}"), n % GPUS, init))
        .collect();
    drop(tx.commit().unwrap());

    let kubelet = Kubelet::start(&plugin_dir);
    let mut plugin = Command::new(built_binary("vramgate-device-plugin"))
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.path().join("plugin.log")).unwrap())
        .spawn()
        .expect("starting vramgate-device-plugin (build it first: bench/device-plugin.sh)");
    let registration = kubelet.registration(Duration::from_secs(30));
    let socket = plugin_dir.join(&registration.endpoint);

    let lists = list_and_watch(&socket);
    let (_, first) = lists.recv_timeout(Duration::from_secs(10)).expect("a first list");
    let all_ids: Vec<String> = first.iter().map(|d| d.id.clone()).collect();
    let mut gpu0 = healthy_on_gpu0(&first);

    // Ledger change -> ListAndWatch.
    let mut seen = Vec::new();
    for n in 0..changes {
        let mut tx = state.begin().unwrap();
        let adding = n % 2 == 0;
        if adding {
            tx.ledger.reservations.push(reservation("outside-k8s".into(), 0, init));
        } else {
            tx.ledger.reservations.retain(|r| r.container_id != "outside-k8s");
        }
        drop(tx.commit().unwrap());
        let committed = Instant::now();
        let want = if adding { gpu0 - 1 } else { gpu0 + 1 };
        loop {
            let (at, list) = lists
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("change {n}: GPU 0 never showed {want} healthy units"));
            if healthy_on_gpu0(&list) == want {
                seen.push(at.saturating_duration_since(committed));
                gpu0 = want;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Allocate and GetPreferredAllocation, one connection as kubelet keeps it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut client = DevicePluginClient::new(rt.block_on(vramgate::kubelet::connect(socket)).unwrap());
    let grant: Vec<String> = (0..4).map(|n| format!("{}/{n}", uuid(3))).collect();
    let mut allocate = Vec::new();
    let mut prefer = Vec::new();
    for _ in 0..calls {
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: grant.clone(),
            }],
        };
        let t = Instant::now();
        rt.block_on(client.allocate(request)).unwrap();
        allocate.push(t.elapsed());
        let request = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: all_ids.clone(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: 4,
            }],
        };
        let t = Instant::now();
        rt.block_on(client.get_preferred_allocation(request)).unwrap();
        prefer.push(t.elapsed());
    }

    println!(
        "{GPUS} GPUs of 80 GiB, {live} live reservations, {} units listed",
        all_ids.len()
    );
    report("ledger commit -> ListAndWatch list (target <= 1 s)", seen);
    report("Allocate, 4 units (target <= 5 ms)", allocate);
    report("GetPreferredAllocation, 4 of all units", prefer);
    let rss = std::fs::read_to_string(format!("/proc/{}/status", plugin.id()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
        .unwrap_or_default();
    println!("plugin resident memory: {rss} KiB");
    let _ = plugin.kill();
    let _ = plugin.wait();
    drop(kubelet);
}
