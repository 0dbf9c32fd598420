//! Benchmark of the DRA driver, with this program as kubelet and as the scheduler, and the
//! stand-in API server (tests/support/apiserver.py) as the API server: NodePrepareResources
//! round trips (target p99 <= 10 ms) with N claims on 8 simulated 80 GiB GPUs, a ledger
//! change to the republished slice (target <= 1 s), and the driver's resident memory.
//!
//!   cargo run --release --example dra-bench -- [--claims N] [--changes N]
//!       [--config FILE [--outside-cmd CMD --outside-gib N]]
//!
//! With `--config` (a real GPU host: bench/gpu-dra.sh), the driver runs on that config's
//! inventory (NVML) instead of 8 simulated GPUs: the bench prints what the slice publishes
//! (product names, capacities), allocates the claims over the GPUs it lists, and with
//! `--outside-cmd` runs a command that holds `--outside-gib` GiB on GPU 0 outside vramgate
//! (a CUDA process of its own) and times how long the slice takes to show it gone and back.
//!
//! Run through `bench/dra.sh`, which builds first; needs root (the state dir is root's) and
//! the Kubernetes schemas (scripts/fetch-k8s-schemas). Each prepare reads its claim from the
//! stand-in over HTTP, as the driver reads it from the API server, so the figure includes
//! one API round trip on this machine (a real API server over TLS adds its own). Each ledger
//! change is a real transaction (lock, atomic rename) adding or removing one 1 GiB
//! reservation outside Kubernetes on GPU 0, timed from its commit to the moment the stand-in
//! accepted the slice that shows it (both on CLOCK_REALTIME).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use serde_json::json;
use vramgate::dra::api::registration::registration_client::RegistrationClient;
use vramgate::dra::api::registration::{InfoRequest, RegistrationStatus};
use vramgate::dra::api::v1;
use vramgate::dra::DRIVER;
use vramgate::ledger::{GpuShare, Reservation, StateDir};
use vramgate::procfs::ProcessIdentity;
use vramgate_testbed::bench::{arg, built_binary, report, static_config};

const GIB: u64 = 1 << 30;
const GPUS: usize = 8;
const NODE: &str = "bench-node";
/// The stand-in API server's admin token: a bench on a scratch loopback port needs no secret one.
const ADMIN_TOKEN: &str = "bench-admin";

/// A channel to the driver's socket at `path`, dialed as the plugins dial kubelet's.
async fn dial(path: std::path::PathBuf) -> tonic::transport::Channel {
    vramgate::kubelet::connect(path).await.unwrap()
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// GPU 0's published capacity in the node's slice.
async fn gpu0_capacity(client: &kube::Client) -> Option<String> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = slices.get_opt(&format!("{NODE}-{DRIVER}")).await.ok()??;
    let device = slice.spec.devices?.into_iter().find(|d| d.name == "gpu-0")?;
    Some(device.capacity?.get("memory")?.value.0.clone())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let claims: usize = arg(&args, "--claims", "100").parse().expect("--claims N");
    let changes: usize = arg(&args, "--changes", "30").parse().expect("--changes N");
    let given_config = arg(&args, "--config", "");
    let outside_cmd = arg(&args, "--outside-cmd", "");
    let outside_gib: u64 = arg(&args, "--outside-gib", "10").parse().expect("--outside-gib N");

    let work = tempfile::Builder::new()
        .prefix("vramgate-dra-bench")
        .tempdir_in("/dev/shm")
        .unwrap();
    let (config, state_dir) = if given_config.is_empty() {
        let state_dir = work.path().join("state");
        let config = work.path().join("config.toml");
        std::fs::write(&config, static_config(&state_dir, GPUS)).unwrap();
        (config, state_dir)
    } else {
        let config = std::path::PathBuf::from(&given_config);
        let state_dir = vramgate::config::Config::load_from(&config)
            .expect("--config")
            .state_dir;
        (config, state_dir)
    };
    let state = StateDir::open_or_create(&state_dir).unwrap();

    // The stand-in API server and a kubeconfig for it (its admin token: the stand-in answers
    // no request without one).
    let schemas = std::env::var("VRAMGATE_K8S_SCHEMAS")
        .unwrap_or_else(|_| "/var/cache/vramgate-tests/k8s-json-schema-1.36".into());
    let mut api = Command::new("/usr/bin/python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/apiserver.py"))
        .args(["--schemas", &schemas, "--admin-token", ADMIN_TOKEN, "--node", NODE])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(work.path().join("apiserver.log")).unwrap())
        .spawn()
        .expect("python3 tests/support/apiserver.py");
    let mut first = String::new();
    BufReader::new(api.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening ")
        .expect("the stand-in started")
        .to_string();
    let kubeconfig = work.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: {url}\nusers:\n- name: b\n  user: {{token: {ADMIN_TOKEN}}}\n\
             contexts:\n- name: b\n  context:\n    cluster: b\n    user: b\ncurrent-context: b\n"
        ),
    )
    .unwrap();

    let registry_dir = work.path().join("plugins_registry");
    let plugin_dir = work.path().join("plugins").join(DRIVER);
    let cdi_dir = work.path().join("cdi");
    let mut driver = Command::new(built_binary("vramgate-dra"))
        .arg("--config")
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--registry-dir")
        .arg(&registry_dir)
        .arg("--plugin-dir")
        .arg(&plugin_dir)
        .arg("--cdi-dir")
        .arg(&cdi_dir)
        .args(["--node-name", NODE])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.path().join("driver.log")).unwrap())
        .spawn()
        .expect("starting vramgate-dra (build it first: bench/dra.sh)");
    let socket = registry_dir.join(format!("{DRIVER}-reg.sock"));
    let started = Instant::now();
    while !socket.exists() {
        assert!(started.elapsed() < Duration::from_secs(30), "no registration socket");
        std::thread::sleep(Duration::from_millis(20));
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    });
    let endpoint = rt.block_on(async {
        let mut registration = RegistrationClient::new(dial(socket.clone()).await);
        let info = registration.get_info(InfoRequest {}).await.unwrap().into_inner();
        registration
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        std::path::PathBuf::from(info.endpoint)
    });
    let started = Instant::now();
    while rt.block_on(gpu0_capacity(&client)).is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "no slice published");
        std::thread::sleep(Duration::from_millis(20));
    }
    let slice = rt
        .block_on(Api::<ResourceSlice>::all(client.clone()).get(&format!("{NODE}-{DRIVER}")))
        .unwrap();
    let devices = slice.spec.devices.clone().unwrap_or_default();
    println!("the slice publishes {} device(s):", devices.len());
    for d in &devices {
        println!(
            "  {}: attributes {}, capacity {}",
            d.name,
            serde_json::to_string(&d.attributes).unwrap(),
            serde_json::to_string(&d.capacity).unwrap()
        );
    }
    let gpu0_uuid = devices[0].attributes.as_ref().unwrap()["uuid"].string.clone().unwrap();
    let device_count = devices.len();

    // N claims of 4 GiB, allocated round-robin over the 8 GPUs as the scheduler leaves them.
    let uids: Vec<String> = rt.block_on(async {
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
        let mut uids = Vec::new();
        for n in 0..claims {
            let name = format!("claim-{n}");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": DRIVER, "capacity": {"requests": {"memory": "4Gi"}}}}]}}}))
            .unwrap();
            let mut created = api.create(&PostParams::default(), &claim).await.unwrap();
            created.status = Some(
                serde_json::from_value(json!({"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": DRIVER, "pool": NODE, "device": devices[n % device_count].name.clone(),
                    "shareID": format!("00000000-0000-4000-8000-{n:012}"),
                    "consumedCapacity": {"memory": "4Gi"}}]}}}))
                .unwrap(),
            );
            api.replace_status(&name, &PostParams::default(), &created)
                .await
                .unwrap();
            uids.push(created.metadata.uid.unwrap());
        }
        uids
    });

    // NodePrepareResources, one claim a call (a pod with one claim), on one connection.
    let mut dra = rt.block_on(async { v1::dra_plugin_client::DraPluginClient::new(dial(endpoint.clone()).await) });
    let claim = |n: usize| v1::Claim {
        namespace: "default".into(),
        name: format!("claim-{n}"),
        uid: uids[n].clone(),
    };
    let mut prepare = Vec::new();
    for n in 0..claims {
        let t = Instant::now();
        let answer = rt
            .block_on(dra.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim(n)] }))
            .unwrap()
            .into_inner();
        prepare.push(t.elapsed());
        assert_eq!(answer.claims[&uids[n]].error, "", "claim {n}");
    }
    let t = Instant::now();
    rt.block_on(dra.node_prepare_resources(v1::NodePrepareResourcesRequest {
        claims: (0..claims).map(claim).collect(),
    }))
    .unwrap();
    let all_at_once = t.elapsed();
    let mut unprepare = Vec::new();
    for n in 0..claims {
        let t = Instant::now();
        rt.block_on(dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim(n)] }))
            .unwrap();
        unprepare.push(t.elapsed());
    }

    // A prepared claim's CDI spec, as the runtime will read it.
    rt.block_on(dra.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim(0)] }))
        .unwrap();
    let spec = std::fs::read_to_string(cdi_dir.join(format!("vramgate.dev-gpu-memory_{}.json", uids[0]))).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    println!("claim-0's CDI device: {}", spec["devices"][0]["containerEdits"]);
    rt.block_on(dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim(0)] }))
        .unwrap();

    // Ledger change -> republished slice. Capacities are compared in bytes, from GPU 0's
    // capacity now (a real GPU's free memory moves it by itself).
    let bytes = |q: &str| match vramgate::quantity::parse_quantity(q).unwrap() {
        vramgate::quantity::Quantity::Bytes(b) => b,
        _ => unreachable!("a quantity of bytes"),
    };
    let base = bytes(&rt.block_on(gpu0_capacity(&client)).unwrap());
    let init = ProcessIdentity::of(1).expect("pid 1 is readable");
    let mut seen = Vec::new();
    for n in 0..changes {
        let adding = n % 2 == 0;
        let want = vramgate::dra::slice::quantity(if adding { base - GIB } else { base }).0;
        let want = want.as_str();
        let mut tx = state.begin().unwrap();
        if adding {
            let gpus = vec![GpuShare::new(gpu0_uuid.clone(), GIB, 0)];
            tx.ledger
                .reservations
                .push(Reservation::new("outside-k8s", gpus, init, 1));
        } else {
            tx.ledger.reservations.retain(|r| r.container_id != "outside-k8s");
        }
        drop(tx.commit().unwrap());
        let committed = now_ns();
        let started = Instant::now();
        while rt.block_on(gpu0_capacity(&client)).as_deref() != Some(want) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "change {n}: GPU 0 never showed {want}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // When the stand-in accepted the write that shows it.
        let writes: serde_json::Value = rt.block_on(async {
            let request = http::Request::get("/_writes").body(Vec::new()).unwrap();
            serde_json::from_str(&client.request_text(request).await.unwrap()).unwrap()
        });
        let accepted = writes.as_array().unwrap().last().unwrap()["time_ns"].as_u64().unwrap() as u128;
        seen.push(Duration::from_nanos(accepted.saturating_sub(committed) as u64));
        std::thread::sleep(Duration::from_millis(50));
    }

    // Memory used outside vramgate (a process of its own on GPU 0) -> republished slice.
    let mut outside = Vec::new();
    if !outside_cmd.is_empty() {
        // exec: the process killed below is the one holding the memory, not a shell above it.
        let mut holder = Command::new("sh")
            .args(["-c", &format!("exec {outside_cmd}")])
            .spawn()
            .expect("--outside-cmd");
        let started = Instant::now();
        let lowered = loop {
            let now = bytes(&rt.block_on(gpu0_capacity(&client)).unwrap());
            if now + (outside_gib << 30) <= base + (512 << 20) {
                break now;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "GPU 0's capacity never showed the outside process"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        // From the process's start: includes CUDA's own start-up before the memory is taken.
        outside.push(("taken", started.elapsed(), lowered, base));
        let _ = holder.kill();
        let _ = holder.wait();
        let released = Instant::now();
        let back = loop {
            let now = bytes(&rt.block_on(gpu0_capacity(&client)).unwrap());
            if now + (512 << 20) >= base {
                break now;
            }
            assert!(
                released.elapsed() < Duration::from_secs(60),
                "GPU 0's capacity never came back"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        outside.push(("given back", released.elapsed(), back, lowered));
    }

    if given_config.is_empty() {
        println!("{GPUS} GPUs of 80 GiB, {claims} claims of 4 GiB, stand-in API server on this machine");
    } else {
        println!(
            "{device_count} GPU(s) of {}, {claims} claims of 4 GiB, stand-in API server on this machine",
            given_config
        );
    }
    report(
        "NodePrepareResources, 1 claim (target p99 <= 10 ms; includes reading the claim)",
        prepare,
    );
    println!(
        "NodePrepareResources, all {claims} claims in one call: {:.1} ms",
        all_at_once.as_secs_f64() * 1e3
    );
    report("NodeUnprepareResources, 1 claim", unprepare);
    report("ledger commit -> slice republished (target <= 1 s)", seen);
    for (what, took, capacity, before) in outside {
        println!(
            "memory outside vramgate {what} on GPU 0: slice shows {} after {:.0} ms (capacity before: {})",
            vramgate::dra::slice::quantity(capacity).0,
            took.as_secs_f64() * 1e3,
            vramgate::dra::slice::quantity(before).0
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", driver.id())).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    println!(
        "driver resident memory: {} KiB now, {} KiB at most",
        field("VmRSS:"),
        field("VmHWM:")
    );
    let _ = driver.kill();
    let _ = driver.wait();
    let _ = api.kill();
    let _ = api.wait();
}
