//! The built `vramgate-dra` between a stand-in kubelet (tests/support/kubelet.rs: the plugin
//! watcher's registration and the DRA v1 and v1beta1 calls, dialled as kubelet ≥ 1.26 dials)
//! and a stand-in API server (tests/support/apiserver.py: every object the driver writes is
//! validated against Kubernetes 1.36's strict schema and the API server's own rules). Every
//! claim the scheduler could produce is allocated by Kubernetes' own allocator
//! (tests/support/allocator.rs) from the slice the driver published; only the malformed
//! results the node must refuse are written by hand. Containers outside Kubernetes are real
//! runc containers with the vramgate hook.
//!
//! The path through containerd's CRI plugin (CDI) is in tests/it/dra_node.rs.
//!
//! Why stand-ins here, when tests/kube_node.rs runs the real kubelet and API server: these
//! tests need what the real ones do not do on demand: an API server that answers a write with
//! a Conflict or an InternalError when the test says so and records every write it refused,
//! a kubelet that speaks the v1beta1 DRA API of kubelets before 1.34 beside v1, and claims
//! that kube-scheduler would never allocate (malformed, forged, another node's), which the
//! driver must refuse. Each is a check of the driver's own edges, at test speed.

use crate::support;
use crate::support::dra as dra_support;
use crate::support::kubelet;
use crate::support::registration_client;

use std::time::{Duration, Instant};

use dra_support::*;
use kubelet::{claim, vramgate_ids};
use support::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn capacities(rt: &tokio::runtime::Runtime, api: &ApiServer) -> Vec<(String, String)> {
    rt.block_on(api.capacities(NODE))
}

fn wait_capacities(rt: &tokio::runtime::Runtime, api: &ApiServer, want: &[(&str, &str)]) -> Duration {
    let want: Vec<(String, String)> = want.iter().map(|(d, c)| (d.to_string(), c.to_string())).collect();
    let started = Instant::now();
    wait_until("the slice's capacities", Duration::from_secs(10), || {
        let now = capacities(rt, api);
        (now == want, now)
    });
    started.elapsed()
}

/// A runc testbed with the built driver on it, registered with the stand-in kubelet and
/// publishing both GPUs whole; `cdi` is the runtime's CDI directory, made before the driver
/// starts, and the last item kubelet's endpoint of the driver. Bound in this order, they are
/// dropped driver first, the testbed's directory last.
/// kubelet 1.36.3's plugin watcher dials the registration socket by its bare path with no
/// `grpc.WithAuthority`, so grpc-go sends the path as HTTP/2 `:authority`; h2 under tonic
/// refuses it (PROTOCOL_ERROR) unless the socket's front rewrites it. The real grpc-go client
/// (tools/kube/registration-client) gets the driver's name, versions and DRA endpoint.
#[test]
fn kubelets_own_grpc_client_gets_the_registration_info() {
    let (_dir, tb) = runc_testbed("vramgate-dra-authority", GPUS);
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let mut driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let socket = driver.registration_socket();
    assert!(
        !vramgate::kubelet::authority::valid_authority(socket.as_os_str().as_encoded_bytes()),
        "the path is what h2 refuses"
    );
    // Twice on one process: the second connection is served as the first.
    for _ in 0..2 {
        let out = registration_client::get_info(&socket);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            driver.log_text()
        );
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(info["type"], "DRAPlugin", "{info}");
        assert_eq!(info["name"], DRIVER, "{info}");
        assert_eq!(
            info["endpoint"],
            driver.plugin_dir.join("dra.sock").to_str().unwrap(),
            "{info}"
        );
        assert!(
            info["supported_versions"].as_array().is_some_and(|v| !v.is_empty()),
            "{info}"
        );
    }
    assert!(driver.stop().success(), "{}", driver.log_text());
}

/// The type of what [`registered_driver`] gives.
type RegisteredDriver = (
    tempfile::TempDir,
    vramgate_testbed::Testbed,
    tokio::runtime::Runtime,
    ApiServer,
    std::path::PathBuf,
    Driver,
    std::path::PathBuf,
);

fn registered_driver(name: &str) -> RegisteredDriver {
    registered_driver_with(name, &[])
}

/// A driver started with `args`, registered with the stand-in kubelet, its slice published.
fn registered_driver_with(name: &str, args: &[&str]) -> RegisteredDriver {
    let (dir, tb) = runc_testbed(name, GPUS);
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    let driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, args);
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    (dir, tb, rt, api, cdi_dir, driver, registered.endpoint)
}

fn assert_nothing_rejected(rt: &tokio::runtime::Runtime, api: &ApiServer) {
    let rejected = rt.block_on(api.rejected());
    assert!(rejected.is_empty(), "the API server rejected writes: {rejected:#?}");
}

#[test]
fn the_driver_registers_publishes_and_prepares_each_claim_or_says_why_not() {
    let (dir, tb) = runc_testbed("vramgate-dra-driver", GPUS);
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE, "node-b"]);
    let cdi_dir = tb.dir.join("cdi");
    let mut driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);

    // The plugin watcher's registration, as kubelet checks it.
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    assert_eq!(registered.versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(registered.endpoint, driver.plugin_dir.join("dra.sock"));

    // One device per GPU, all of its memory for claims (no headroom, nothing outside).
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    let slice = rt.block_on(api.slice(NODE)).unwrap();
    let device = &slice.spec.devices.as_ref().unwrap()[1];
    assert_eq!(device.allow_multiple_allocations, Some(true));
    let attributes = device.attributes.as_ref().unwrap();
    assert_eq!(attributes["uuid"].string.as_deref(), Some("GPU-one"));
    assert_eq!(attributes["index"].int, Some(1));
    let policy = serde_json::to_value(&device.capacity.as_ref().unwrap()["memory"].request_policy).unwrap();
    assert_eq!(
        policy,
        serde_json::json!({"default": "1Gi", "validRange": {"min": "256Mi", "max": "16Gi", "step": "256Mi"}})
    );
    assert_eq!(slice.spec.pool.name, NODE);
    assert_eq!(
        slice.metadata.owner_references.as_ref().map(|o| o[0].kind.as_str()),
        Some("Node")
    );

    // Kubernetes' allocator places the claims: 6 GiB on the first GPU with room (it fills
    // devices in the slice's order), and two devices of 1 GiB (`count: 2`) on both GPUs
    // (prepared in tests/it/dra_claims.rs).
    let trainer = rt.block_on(api.create_claim("default", "trainer", "6Gi"));
    rt.block_on(api.create_claim_spec(
        "default",
        "double",
        serde_json::json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER,
            "count": 2, "capacity": {"requests": {"memory": "1Gi"}}}}]}),
    ));
    let decisions = rt.block_on(api.schedule("default", &["trainer", "double"], NODE));
    let placed: Vec<Vec<(String, String)>> = decisions
        .iter()
        .map(|d| allocator::devices(d.as_ref().expect("placed")))
        .collect();
    let pair = |device: &str, memory: &str| (device.to_string(), memory.to_string());
    assert_eq!(
        placed,
        [
            vec![pair("gpu-0", "6Gi")],
            vec![pair("gpu-0", "1Gi"), pair("gpu-1", "1Gi")]
        ]
    );
    let trainer_share = decisions[0].as_ref().unwrap()["devices"]["results"][0]["shareID"].clone();
    let pending = rt.block_on(api.create_claim("default", "pending", "1Gi"));
    // Results the allocator never produces for this node's kubelet, written by hand: the
    // node must refuse them.
    let elsewhere = rt.block_on(api.create_claim("default", "elsewhere", "1Gi"));
    rt.block_on(api.allocate_by_hand("default", "elsewhere", "node-b", &[("gpu-0", "1Gi")]));
    let nowhere = rt.block_on(api.create_claim("default", "nowhere", "1Gi"));
    rt.block_on(api.allocate_by_hand("default", "nowhere", NODE, &[("gpu-7", "1Gi")]));

    let endpoint = registered.endpoint.clone();
    let answer = rt.block_on(kubelet::prepare(
        &endpoint,
        vec![
            claim("default", "trainer", &trainer),
            claim("default", "pending", &pending),
            claim("default", "elsewhere", &elsewhere),
            claim("default", "nowhere", &nowhere),
            claim("default", "replaced", "5d0e8a34-0000-4000-8000-000000000001"),
            claim("default", "trainer", "5d0e8a34-0000-4000-8000-000000000002"),
            claim("default", "../../nodes/node-a", "5d0e8a34-0000-4000-8000-000000000004"),
        ],
    ));
    let ok = &answer.claims[&trainer];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    let prepared = &ok.devices[0];
    assert_eq!(
        (
            prepared.request_names.as_slice(),
            prepared.pool_name.as_str(),
            prepared.device_name.as_str()
        ),
        (["gpu".to_string()].as_slice(), NODE, "gpu-0")
    );
    assert_eq!(
        prepared.cdi_device_ids,
        [format!("vramgate.dev/gpu-memory={trainer}-gpu-0")]
    );
    assert_eq!(prepared.share_id.as_deref(), trainer_share.as_str());
    let error = |uid: &str| answer.claims[uid].error.clone();
    let expect = [
        (pending.as_str(), "claim default/pending is not allocated yet"),
        (elsewhere.as_str(), "allocated from pool \"node-b\""),
        (
            nowhere.as_str(),
            "this node has no device \"gpu-7\" (it has gpu-0, gpu-1)",
        ),
        ("5d0e8a34-0000-4000-8000-000000000001", "404"),
        ("5d0e8a34-0000-4000-8000-000000000002", "deleted and made again"),
        (
            "5d0e8a34-0000-4000-8000-000000000004",
            "not a Kubernetes namespace and object name",
        ),
    ];
    for (uid, says) in expect {
        let error = error(uid);
        assert!(error.contains(says), "claim {uid}: {error:?} should say {says:?}");
        assert_eq!(error.lines().count(), 1, "{error:?}");
        assert!(answer.claims[uid].devices.is_empty());
    }

    // The CDI spec kubelet's runtime will read: the consumed memory, the GPU, the marker.
    let spec_path = cdi_dir.join(format!("vramgate.dev-gpu-memory_{trainer}.json"));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "vramgate.dev/gpu-memory");
    let env = &spec["devices"][0]["containerEdits"]["env"];
    assert_eq!(env[0], "VRAMGATE_MEMORY=6442450944");
    assert_eq!(env[1], "VRAMGATE_GPUS=GPU-zero");
    assert_eq!(
        std::fs::read_dir(&cdi_dir).unwrap().count(),
        1,
        "only the prepared claim has a spec"
    );

    // Prepared again (kubelet retries), through v1 and v1beta1: the same answer.
    let again = rt.block_on(kubelet::prepare(&endpoint, vec![claim("default", "trainer", &trainer)]));
    assert_eq!(again.claims[&trainer], *ok);
    let beta = rt.block_on(kubelet::prepare_v1beta1(
        &endpoint,
        vec![claim("default", "trainer", &trainer)],
    ));
    assert_eq!(beta.claims[&trainer].devices[0].cdi_device_ids, prepared.cdi_device_ids);

    // Unprepared, twice, and a claim never prepared: no error, nothing left.
    for _ in 0..2 {
        let answer = rt.block_on(kubelet::unprepare(
            &endpoint,
            vec![
                claim("default", "trainer", &trainer),
                claim("default", "never", "5d0e8a34-0000-4000-8000-000000000003"),
            ],
        ));
        assert!(answer.claims.values().all(|r| r.error.is_empty()), "{answer:?}");
    }
    assert_eq!(std::fs::read_dir(&cdi_dir).unwrap().count(), 0);

    assert_nothing_rejected(&rt, &api);
    let status = driver.stop();
    assert!(status.success(), "{status:?}: {}", driver.log_text());
    assert!(!driver.registration_socket().exists(), "stopping deregisters");
    drop(dir);
}

/// Issue 35: what Kubernetes' own allocator (v0.36.3, Kubernetes 1.36's default features)
/// decides from the slice the driver publishes for a 16 GiB and an 8 GiB GPU, and that the
/// node prepares each single-device claim it places with exactly what it consumed. The
/// allocator fills devices first-fit in the slice's order, never past a device's capacity;
/// it rounds a request up to the policy's step (256 MiB) and gives a claim without one the
/// policy's default (1 GiB). `allocationMode: All` takes one share of every GPU that has room
/// (claims of several GPUs are prepared in tests/it/dra_claims.rs).
#[test]
fn kubernetes_allocator_shares_each_gpu_by_its_published_capacity_and_the_node_prepares_what_it_placed() {
    let gpus = GPUS.replace(
        "uuid = \"GPU-one\"\ntotal = \"16Gi\"",
        "uuid = \"GPU-one\"\ntotal = \"8Gi\"",
    );
    let (dir, tb) = runc_testbed("vramgate-dra-allocator", &gpus);
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    let driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "8Gi")]);

    let request = |memory: Option<&str>, mode: serde_json::Value| {
        let mut exactly = serde_json::json!({"deviceClassName": DRIVER});
        if let Some(memory) = memory {
            exactly["capacity"] = serde_json::json!({"requests": {"memory": memory}});
        }
        if !mode.is_null() {
            exactly["allocationMode"] = mode;
        }
        serde_json::json!({"requests": [{"name": "gpu", "exactly": exactly}]})
    };
    let claims = [
        ("six-a", request(Some("6Gi"), serde_json::Value::Null)),
        ("six-b", request(Some("6Gi"), serde_json::Value::Null)),
        ("six-c", request(Some("6Gi"), serde_json::Value::Null)),
        ("five", request(Some("5000Mi"), serde_json::Value::Null)),
        ("unsized", request(None, serde_json::Value::Null)),
        ("odd", request(Some("1000Mi"), serde_json::Value::Null)),
        ("every", request(Some("1Gi"), serde_json::json!("All"))),
        ("two", request(Some("2Gi"), serde_json::Value::Null)),
    ];
    let mut uids = std::collections::HashMap::new();
    for (name, devices) in &claims {
        uids.insert(
            *name,
            rt.block_on(api.create_claim_spec("default", name, devices.clone())),
        );
    }
    let names: Vec<&str> = claims.iter().map(|(name, _)| *name).collect();
    let decisions = rt.block_on(api.schedule("default", &names, NODE));
    let placed: Vec<Result<Vec<(String, String)>, String>> = decisions
        .iter()
        .map(|d| d.as_ref().map(allocator::devices).map_err(Clone::clone))
        .collect();
    let on = |pairs: &[(&str, &str)]| -> Result<Vec<(String, String)>, String> {
        Ok(pairs.iter().map(|(d, m)| (d.to_string(), m.to_string())).collect())
    };
    let unschedulable = || Err("unschedulable: cannot allocate all claims".to_string());
    assert_eq!(
        placed,
        [
            // The slice lists the 8 GiB GPU first (ascending capacity): the first 6 there,
            // the next two on the 16 GiB GPU.
            on(&[("gpu-1", "6Gi")]),
            on(&[("gpu-0", "6Gi")]),
            on(&[("gpu-0", "6Gi")]),
            // 5000Mi is 5 GiB in steps: 2 GiB are left on gpu-1, 4 GiB on gpu-0.
            unschedulable(),
            // No request: the policy's default.
            on(&[("gpu-1", "1Gi")]),
            // Rounded up to the step.
            on(&[("gpu-1", "1Gi")]),
            // Every GPU with room: gpu-1 is full, so only gpu-0.
            on(&[("gpu-0", "1Gi")]),
            // 3 GiB left on gpu-0.
            on(&[("gpu-0", "2Gi")]),
        ]
    );
    for decision in decisions.iter().flatten() {
        let results = decision["devices"]["results"].as_array().unwrap();
        assert!(
            results.iter().all(|r| r["request"] == "gpu"
                && r["driver"] == DRIVER
                && r["pool"] == NODE
                && r["shareID"].is_string()),
            "{decision}"
        );
        assert_eq!(
            decision["nodeSelector"],
            serde_json::json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]})
        );
    }

    // The node prepares each single-device claim with what the allocator says it consumed.
    let single = [
        ("six-a", "GPU-one", 6u64 << 30),
        ("six-b", "GPU-zero", 6 << 30),
        ("six-c", "GPU-zero", 6 << 30),
        ("unsized", "GPU-one", 1 << 30),
        ("odd", "GPU-one", 1 << 30),
    ];
    let answer = rt.block_on(kubelet::prepare(
        &registered.endpoint,
        single
            .iter()
            .map(|(name, _, _)| claim("default", name, &uids[name]))
            .collect(),
    ));
    for (name, gpu, bytes) in single {
        let uid = &uids[name];
        assert_eq!(answer.claims[uid].error, "", "{name}");
        let path = cdi_dir.join(format!("vramgate.dev-gpu-memory_{uid}.json"));
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let env = &spec["devices"][0]["containerEdits"]["env"];
        assert_eq!(
            (&env[0], &env[1]),
            (
                &serde_json::json!(format!("VRAMGATE_MEMORY={bytes}")),
                &serde_json::json!(format!("VRAMGATE_GPUS={gpu}"))
            ),
            "{name}"
        );
    }
    assert_nothing_rejected(&rt, &api);
    drop(driver);
    drop(dir);
}

/// Anyone who can write a CDI directory can leave a FIFO there, or a link to one, named like
/// a spec. Opening it for reading waits for a writer: read on the driver's one async thread,
/// it stalled that prepare, kubelet's registration and every later call; read by the view
/// thread (a name of this driver's specs), it stopped the published capacity from following
/// the node. Such files are passed over, and NVIDIA's spec is read off the async runtime.
#[test]
fn a_fifo_among_the_cdi_specs_stalls_neither_prepare_nor_registration_nor_the_slice() {
    let (dir, tb, rt, api, cdi_dir, mut driver, endpoint) = registered_driver("vramgate-dra-cdi-fifo");

    let fifo =
        |name: &str| nix::unistd::mkfifo(&cdi_dir.join(name), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    fifo("a-fifo.json");
    fifo("vramgate.dev-gpu-memory_fifo.json");
    std::os::unix::fs::symlink(cdi_dir.join("a-fifo.json"), cdi_dir.join("b-link.yaml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", cdi_dir.join("c-zero.json")).unwrap();
    std::fs::write(
        cdi_dir.join("nvidia.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-one\n  containerEdits: {}\n",
    )
    .unwrap();

    // Answered at once, with NVIDIA's device from the spec after the FIFOs, twice (the second
    // from what the first read).
    let uid = rt.block_on(api.create_claim_on("default", "trainer", "6Gi", 1));
    rt.block_on(api.schedule_one("default", "trainer", NODE));
    let within = Duration::from_secs(10);
    for _ in 0..2 {
        let answer = rt
            .block_on(async {
                tokio::time::timeout(
                    within,
                    kubelet::prepare(&endpoint, vec![claim("default", "trainer", &uid)]),
                )
                .await
            })
            .unwrap_or_else(|_| panic!("NodePrepareResources: no answer in {within:?}: {}", driver.log_text()));
        let answer = &answer.claims[&uid];
        assert_eq!(answer.error, "");
        assert_eq!(
            answer.devices[0].cdi_device_ids,
            [
                format!("vramgate.dev/gpu-memory={uid}-gpu-1"),
                "nvidia.com/gpu=GPU-one".to_string()
            ]
        );
    }
    // kubelet's plugin watcher, after a kubelet restart, is answered too.
    rt.block_on(async { tokio::time::timeout(within, kubelet::register(&driver.registration_socket(), DRIVER)).await })
        .unwrap_or_else(|_| panic!("GetInfo: no answer in {within:?}: {}", driver.log_text()));
    // The view thread, which reads this driver's specs back, still follows the node: a
    // headroom set now shows in the slice.
    let config = std::fs::read_to_string(&tb.config_path).unwrap();
    std::fs::write(&tb.config_path, format!("headroom = \"1Gi\"\n{config}")).unwrap();
    wait_capacities(&rt, &api, &[("gpu-0", "15Gi"), ("gpu-1", "15Gi")]);

    assert_nothing_rejected(&rt, &api);
    let status = driver.stop();
    assert!(status.success(), "{status:?}: {}", driver.log_text());
    drop(dir);
}

/// A node name near the API server's 253-character limit: the slice's name stays within it
/// (the node's name cut, a hash of the whole kept), and the API server takes the slice.
#[test]
fn a_node_with_a_long_name_publishes_its_slice() {
    let (dir, tb) = runc_testbed("vramgate-dra-long-node", GPUS);
    let rt = runtime();
    let label = "n".repeat(60);
    let node = format!("{label}.{label}.{label}.{label}.node-x");
    assert!(node.len() > 253 - "-gpu-memory.vramgate.dev".len(), "{}", node.len());
    let api = ApiServer::start(&tb.dir, &[&node]);
    let cdi_dir = tb.dir.join("cdi");
    let mut driver = Driver::start(&tb.dir, &tb.config_path, &api, &node, &cdi_dir, &[]);
    rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_until("the long node's slice", Duration::from_secs(10), || {
        let now = rt.block_on(api.capacities(&node));
        (now.len() == 2, now)
    });
    let slice = rt.block_on(api.slice(&node)).unwrap();
    let name = slice.metadata.name.unwrap();
    assert!(
        name.len() <= 253 && name.ends_with("-gpu-memory.vramgate.dev"),
        "{name}"
    );
    assert_eq!(slice.spec.node_name.as_deref(), Some(node.as_str()));
    assert_nothing_rejected(&rt, &api);
    assert!(driver.stop().success(), "{}", driver.log_text());
    drop(dir);
}

#[test]
fn the_published_capacity_follows_what_is_held_outside_kubernetes() {
    let (dir, tb) = runc_testbed("vramgate-dra-capacity", GPUS);
    let _cleanup = Cleanup(&tb);
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    let mut driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);

    // A runc container outside Kubernetes reserves 4 GiB on GPU-one: the scheduler must see
    // 12 GiB there.
    let mut outside = spawn_container(
        &tb,
        "outside",
        &["sleep", "60"],
        &[("vramgate.dev/memory", "4Gi"), ("vramgate.dev/gpus", "GPU-one")],
    );
    wait_reserved(&tb, "outside", 4 << 30);
    let took = wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "12Gi")]);
    eprintln!(
        "capacity republished {} ms after the reservation was seen",
        took.as_millis()
    );

    // A claim's own container does not lower it: the scheduler already counts the claim.
    let uid = rt.block_on(api.create_claim_on("default", "trainer", "6Gi", 1));
    let allocation = rt.block_on(api.schedule_one("default", "trainer", NODE));
    assert_eq!(
        allocator::devices(&allocation),
        [("gpu-1".to_string(), "6Gi".to_string())]
    );
    let answer = rt.block_on(kubelet::prepare(
        &registered.endpoint,
        vec![claim("default", "trainer", &uid)],
    ));
    assert_eq!(answer.claims[&uid].error, "");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cdi_dir.join(format!("vramgate.dev-gpu-memory_{uid}.json"))).unwrap())
            .unwrap();
    // The container as the runtime leaves it after applying the CDI device's env.
    let env: Vec<String> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    // Before the claim's container starts, another container forges its marker from what
    // anyone who reads the claim knows (its uid and device name), or guesses its secret, to
    // reserve on the claim's GPU as the claim's, which would hide its memory from the
    // scheduler: the hook checks the marker against the driver's spec and refuses it with one
    // line, without the secret; nothing is reserved and the capacity stays.
    let forged = format!("VRAMGATE_DRA_DEVICE_{}_gpu_1={uid}-gpu-1", uid.replace('-', "_"));
    let guessed = format!("{forged}:00000000000000000000000000000000");
    let secret = env
        .iter()
        .find_map(|e| e.strip_prefix(&forged)?.strip_prefix(':'))
        .expect("the driver's marker")
        .to_string();
    for (id, env) in [
        (
            "forger",
            ["VRAMGATE_MEMORY=2Gi", "VRAMGATE_GPUS=GPU-one", forged.as_str()],
        ),
        (
            "guesser",
            ["VRAMGATE_MEMORY=1Gi", "VRAMGATE_GPUS=GPU-one", guessed.as_str()],
        ),
    ] {
        let bundle = tb.bundle(id, &["sleep", "60"], &[], &env, true).unwrap();
        let out = tb.runc_run(&bundle, id).output().unwrap();
        assert!(!out.status.success(), "{id} started");
        let said = stderr(&out);
        assert!(
            said.contains(&format!(
                "vramgate: container {id}: the container carries the marker of the Kubernetes resource claim device {uid}-gpu-1, which no claim this node's DRA driver prepared gives it"
            )),
            "{said}"
        );
        assert!(!said.contains(&secret), "{said}");
        let _ = tb.runc(&["delete", "--force", id]).status();
    }
    // Nothing but the outside container and the claim's own reservation, made by the driver at
    // its allocation (issue 56), which the scheduler counts already: the capacity stays.
    let claim_id = format!("claim-{uid}");
    assert!(
        reservations(&tb)
            .iter()
            .all(|(id, _)| id == "outside" || id == &claim_id),
        "{:?}",
        reservations(&tb)
    );
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "12Gi")]);
    // Its env, device nodes and hooks from the driver's spec, as the runtime applies them.
    let bundle = tb.bundle("claimed", &["sleep", "60"], &[], &[], false).unwrap();
    apply_cdi(&bundle, &cdi_dir, &vramgate_ids(&answer.claims[&uid]));
    let mut claimed = tb
        .runc_run(&bundle, "claimed")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_reserved(&tb, "claimed", 6 << 30);
    // A change that must be published (1 GiB outside Kubernetes on GPU-zero) shows the view
    // recomputed after the claim's reservation, with gpu-1 where it was.
    let mut nudge = spawn_container(
        &tb,
        "nudge",
        &["sleep", "60"],
        &[("vramgate.dev/memory", "1Gi"), ("vramgate.dev/gpus", "GPU-zero")],
    );
    wait_reserved(&tb, "nudge", 1 << 30);
    wait_capacities(&rt, &api, &[("gpu-0", "15Gi"), ("gpu-1", "12Gi")]);
    tb.runc(&["kill", "nudge", "KILL"]).status().unwrap();
    let _ = nudge.wait();
    wait_released(&tb, "nudge");
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "12Gi")]);
    let generation = rt.block_on(api.slice(NODE)).unwrap().spec.pool.generation;

    // The outside container stops: its 4 GiB come back, at a higher generation.
    tb.runc(&["kill", "outside", "KILL"]).status().unwrap();
    let _ = outside.wait();
    wait_released(&tb, "outside");
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    let later = rt.block_on(api.slice(NODE)).unwrap().spec.pool.generation;
    assert!(later > generation, "{later} after {generation}");

    // A view that never returns (the config replaced by a FIFO nobody writes, so reading it
    // blocks, as NVML can on a GPU that fell off the bus): within the watchdog's limit every
    // device is published with no capacity, and the next view that completes restores them.
    let config = HungConfig::hang(&tb.config_path);
    let took = wait_capacities(&rt, &api, &[]);
    eprintln!("view hung -> no device published after {} ms", took.as_millis());
    assert!(driver.log_text().contains("no new view for"), "{}", driver.log_text());
    config.release();
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);

    // kubelet restarts: it deletes the node's slices, the driver registers again and
    // publishes again; a restarted driver continues the generation.
    rt.block_on(async {
        let slices: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> = kube::Api::all(api.client().await);
        slices
            .delete(&format!("{NODE}-{DRIVER}"), &Default::default())
            .await
            .unwrap();
    });
    rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    driver.stop();
    let restarted = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    wait_until("a republish after the restart", Duration::from_secs(10), || {
        let generation = rt.block_on(api.slice(NODE)).map(|s| s.spec.pool.generation);
        (generation.is_some_and(|g| g > later), generation)
    });

    tb.runc(&["kill", "claimed", "KILL"]).status().unwrap();
    let _ = claimed.wait();
    assert_nothing_rejected(&rt, &api);
    drop(restarted);
    drop(dir);
}

/// A driver writing its claims' specs where the hook does not look for them would see every
/// pod placed and none started: it refuses to start, with one line that names the flag, the
/// config key and the file. Listed, the same driver registers.
#[test]
fn a_driver_whose_cdi_dir_the_hook_does_not_read_refuses_to_start() {
    let (_dir, tb) = runc_testbed("vramgate-dra-cdi-dir", GPUS);
    vramgate::ledger::StateDir::open_or_create(&tb.state_dir).unwrap();
    let cdi_dir = tb.dir.join("cdi");
    let mut driver = Driver::spawn(
        &tb.dir,
        &tb.config_path,
        &tb.dir.join("no-kubeconfig"),
        NODE,
        &cdi_dir,
        &[],
    );
    let exit = wait_until("the driver refuses", Duration::from_secs(10), || {
        let exit = driver.child.try_wait().unwrap();
        (exit.is_some(), exit)
    });
    let text = driver.log_text();
    assert_eq!(exit.unwrap().code(), Some(1), "{text}");
    let line = format!(
        "vramgate-dra: --cdi-dir {} is not among [enforce] cdi_spec_dirs (/etc/cdi, /var/run/cdi) of {}",
        cdi_dir.display(),
        tb.config_path.display()
    );
    let said: Vec<&str> = text.lines().filter(|l| l.starts_with("vramgate-dra: ")).collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(said[0].starts_with(&line), "{text}");
    assert!(!driver.registration_socket().exists());
}

/// What the first-view tests give `--startup-timeout`: past the steady state's limit
/// (ten poll intervals of 100 ms, 2 s at least), so that the two are told apart.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(4);

#[test]
fn a_first_view_that_never_comes_ends_the_driver_with_the_reason() {
    // The driver's own config read at start is answered; the view thread's blocks (a FIFO
    // nobody writes any more), as NVML's start can on a GPU that fell off the bus: the driver
    // must end with the reason, and the flag to raise, once --startup-timeout has passed,
    // not sit unregistered and silent.
    let (_dir, tb) = runc_testbed("vramgate-dra-first-view", GPUS);
    vramgate::ledger::StateDir::open_or_create(&tb.state_dir).unwrap();
    lists_cdi_dir(&tb.config_path, &tb.dir.join("cdi"));
    let config = HungConfig::hang(&tb.config_path);
    config.serve_one_read();
    let started = Instant::now();
    let allowance = format!("{}s", STARTUP_TIMEOUT.as_secs());
    let mut driver = Driver::spawn(
        &tb.dir,
        &tb.config_path,
        &tb.dir.join("no-kubeconfig"),
        NODE,
        &tb.dir.join("cdi"),
        &["--startup-timeout", &allowance],
    );
    let exit = wait_until(
        "the driver ends without a first view",
        STARTUP_TIMEOUT + Duration::from_secs(10),
        || {
            let exit = driver.child.try_wait().unwrap();
            (exit.is_some(), exit)
        },
    );
    let took = started.elapsed();
    let text = driver.log_text();
    assert_eq!(exit.unwrap().code(), Some(1), "{text}");
    let reason = format!("no first view within {}s", STARTUP_TIMEOUT.as_secs());
    assert!(text.contains(&reason), "{text}");
    assert!(
        text.contains("--startup-timeout"),
        "the error does not name the flag: {text}"
    );
    assert!(
        took >= STARTUP_TIMEOUT,
        "ended after {took:?}, before --startup-timeout {STARTUP_TIMEOUT:?}"
    );
    assert_eq!(
        std::fs::read_dir(&driver.registry_dir).unwrap().count(),
        0,
        "it registered without a view"
    );
}

#[test]
fn a_first_view_later_than_ten_poll_intervals_is_waited_for_then_published() {
    // NVML's start on a cold multi-GPU host can take longer than ten poll intervals, the limit
    // a view has once the driver runs: within --startup-timeout the driver waits, says so,
    // and offers nothing until the view comes; then it registers and publishes as usual.
    let (_dir, tb) = runc_testbed("vramgate-dra-slow-start", GPUS);
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    vramgate::ledger::StateDir::open_or_create(&tb.state_dir).unwrap();
    lists_cdi_dir(&tb.config_path, &tb.dir.join("cdi"));
    let config = HungConfig::hang(&tb.config_path);
    config.serve_one_read();
    let mut driver = Driver::spawn(
        &tb.dir,
        &tb.config_path,
        &api.kubeconfig,
        NODE,
        &tb.dir.join("cdi"),
        &["--startup-timeout", "20s"],
    );
    // Past the point where a view in steady state would count as hung, the driver says it
    // still waits (not a sleep: the line is the moment it could have given up); it has not
    // ended, and offers nothing. Its registration below, by this same process, shows it never
    // ended in between.
    wait_until(
        "the driver says it still waits for its first view",
        Duration::from_secs(20),
        || (driver.log_text().contains("still waiting"), driver.log_text()),
    );
    let text = driver.log_text();
    assert!(
        driver.child.try_wait().unwrap().is_none(),
        "the driver ended in a late first view: {text}"
    );
    assert_eq!(
        std::fs::read_dir(&driver.registry_dir).unwrap().count(),
        0,
        "it registered without a view"
    );
    assert!(rt.block_on(api.slice(NODE)).is_none(), "it published without a view");

    config.release();
    let socket = driver.registration_socket();
    wait_until("the driver's registration socket", Duration::from_secs(10), || {
        (socket.exists(), driver.log_text())
    });
    let registered = rt.block_on(kubelet::register(&socket, DRIVER));
    assert_eq!(registered.endpoint, driver.plugin_dir.join("dra.sock"));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    assert!(driver.child.try_wait().unwrap().is_none(), "{}", driver.log_text());
    assert_nothing_rejected(&rt, &api);
    assert!(driver.stop().success(), "{}", driver.log_text());
}

/// The stand-in API server with k8s/dra.yaml's admission policies, for node-a and node-b and
/// two driver tokens: node-a's ("dra-a") and one that names no node ("dra-nowhere").
fn api_with_policy(dir: &std::path::Path) -> ApiServer {
    let users = [
        User {
            token: "dra-a",
            username: DRA_USER,
            node: NODE,
        },
        User {
            token: "dra-nowhere",
            username: DRA_USER,
            node: "",
        },
    ];
    ApiServer::start_with_policy(dir, &[NODE, "node-b"], &users)
}

/// k8s/dra.yaml's admission policy on the built driver's own writes, as the stand-in evaluates
/// it (tests/support/vap.py, with cel-python) for the caller its bearer token names: with its
/// node's token the driver publishes as without the policy; with node-a's token on node-b (a
/// copied token, a wrong NODE_NAME) its create, replace and delete of node-b's slices are each
/// refused with the policy's message, and node-b's slices stay as they were; with a token that
/// names no node, its write is refused saying what is needed.
#[test]
fn the_admission_policy_lets_the_driver_write_only_its_own_nodes_slices() {
    let (_dir, tb) = runc_testbed("vramgate-dra-policy", GPUS);
    let rt = runtime();
    let api = api_with_policy(&tb.dir);
    let as_a = api.kubeconfig_as("dra-a");
    let _own = Driver::start_as(&tb.dir, &tb.config_path, &as_a, NODE, &tb.dir.join("cdi"), &[]);
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);
    assert_nothing_rejected(&rt, &api);

    let denied = "ValidatingAdmissionPolicy 'vramgate-dra-slices' with binding 'vramgate-dra-slices' denied request: ";
    let not_yours =
        "vramgate-dra on node 'node-a' may write only its own node's ResourceSlices, not one of node 'node-b'";
    // Waits for the stand-in to refuse `method` of slice `name` with `says`; the driver's log
    // must say it too.
    let refused = |driver: &Driver, method: &str, name: &str, says: &str| {
        let start = format!("resourceslices.resource.k8s.io \"{name}\" is forbidden: {denied}");
        wait_until(
            &format!("{method} of {name} refused by the policy"),
            Duration::from_secs(10),
            || {
                let rejected = rt.block_on(api.rejected());
                let found = rejected.iter().any(|r| {
                    let message = r["message"].as_str().unwrap_or_default();
                    r["method"] == method && r["code"] == 403 && message.starts_with(&start) && message.contains(says)
                });
                (found, rejected)
            },
        );
        wait_until("the driver's log says why", Duration::from_secs(5), || {
            let log = driver.log_text();
            (log.contains(says), log)
        });
    };
    let create_as_admin = |name: &str| -> String {
        let slice: k8s_openapi::api::resource::v1::ResourceSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": "node-b",
                "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1}, "devices": []}}))
        .unwrap();
        rt.block_on(async {
            let slices: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> = kube::Api::all(api.client().await);
            let created = slices.create(&Default::default(), &slice).await.unwrap();
            created.metadata.resource_version.unwrap()
        })
    };

    // node-b has no slice: the create is refused.
    let elsewhere = tb.dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let node_b = Driver::start_as(
        &elsewhere,
        &tb.config_path,
        &as_a,
        "node-b",
        &elsewhere.join("cdi"),
        &[],
    );
    let name_b = format!("node-b-{DRIVER}");
    refused(&node_b, "POST", &name_b, not_yours);
    // node-b's slice there (its own driver's): the replace is refused.
    let version_b = create_as_admin(&name_b);
    refused(&node_b, "PUT", &name_b, not_yours);
    // A slice of node-b under another name, which the driver deletes first: refused.
    let version_stray = create_as_admin("node-b-stray");
    refused(&node_b, "DELETE", "node-b-stray", not_yours);
    drop(node_b);
    for (name, version) in [(name_b.as_str(), version_b), ("node-b-stray", version_stray)] {
        let slices: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
            kube::Api::all(rt.block_on(api.client()));
        let now = rt.block_on(slices.get(name)).unwrap();
        assert_eq!(now.metadata.resource_version, Some(version), "{name} was written");
    }

    // A token bound to no node (as `kubectl create token` makes): even its own node's slice is
    // refused, with what it needs.
    let nowhere = tb.dir.join("nowhere");
    std::fs::create_dir_all(&nowhere).unwrap();
    let unbound = Driver::start_as(
        &nowhere,
        &tb.config_path,
        &api.kubeconfig_as("dra-nowhere"),
        NODE,
        &nowhere.join("cdi"),
        &[],
    );
    refused(
        &unbound,
        "PUT",
        &format!("{NODE}-{DRIVER}"),
        "this request does not say which node it comes from: it needs the service account token of a pod on the node",
    );
    drop(unbound);

    // Every refusal was the policy's, and the node's own driver still publishes.
    let rejected = rt.block_on(api.rejected());
    assert!(
        rejected
            .iter()
            .all(|r| r["code"] == 403 && r["message"].as_str().unwrap().contains(denied)),
        "{rejected:#?}"
    );
    assert_eq!(
        capacities(&rt, &api),
        [
            ("gpu-0".to_string(), "16Gi".to_string()),
            ("gpu-1".to_string(), "16Gi".to_string())
        ]
    );
}

/// A PUT of claim `name`'s status (of namespace default) by the caller of `kubeconfig`, on the
/// claim as stored with `edit` made: `Err((code, message))` when it is refused.
fn put_claim_status(
    rt: &tokio::runtime::Runtime,
    kubeconfig: &std::path::Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<(), (u16, String)> {
    rt.block_on(async {
        let file = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let path = format!("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}");
        let get = http::Request::get(path.as_str()).body(Vec::new()).unwrap();
        let mut claim: serde_json::Value = serde_json::from_str(&client.request_text(get).await.unwrap()).unwrap();
        edit(&mut claim);
        let put = http::Request::put(format!("{path}/status"))
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&claim).unwrap())
            .unwrap();
        match client.request_text(put).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err((status.code, status.message)),
            Err(e) => panic!("PUT {path}/status: {e}"),
        }
    })
}

/// Issue 43 item 6: the driver's role may update the status of every claim in the cluster;
/// k8s/dra.yaml's policy vramgate-dra-claim-status holds it to claims allocated to its own
/// node and to its own entries of `status.devices`, as the stand-in evaluates it (tests/support/
/// vap.py, with cel-python) for the caller its token names. The built driver, with its node's
/// token, prepares a claim of its node and writes its status as without the policy. With the
/// same token: a claim allocated to node-b is refused, as are a change to another driver's
/// entry (or its removal) and to `reservedFor` of a claim of its own node; its own entry there
/// is taken. A token that names no node is refused saying what it needs. Nothing refused was
/// stored.
#[test]
fn the_admission_policy_lets_the_driver_update_only_its_own_nodes_claims_and_its_own_entries() {
    let (_dir, tb) = runc_testbed("vramgate-dra-claim-policy", GPUS);
    let rt = runtime();
    let api = api_with_policy(&tb.dir);
    let as_a = api.kubeconfig_as("dra-a");
    let cdi_dir = tb.dir.join("cdi");
    // Without binding conditions, so that the claims' statuses hold only what this test and
    // prepare write (the driver's condition writes pass the same policy on the real API
    // server, tests/kube_node.rs).
    let mut driver = Driver::start_as(
        &tb.dir,
        &tb.config_path,
        &as_a,
        NODE,
        &cdi_dir,
        &["--binding-conditions=false"],
    );
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);

    // The driver's own write, on a claim the scheduler placed on its node.
    let uid = rt.block_on(api.create_claim("default", "mine", "1Gi"));
    rt.block_on(api.schedule_one("default", "mine", NODE));
    let answer = rt.block_on(kubelet::prepare(
        &registered.endpoint,
        vec![claim("default", "mine", &uid)],
    ));
    assert_eq!(answer.claims[&uid].error, "", "{}", driver.log_text());
    let written = rt.block_on(api.device_status("default", "mine"));
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["driver"], DRIVER);
    assert_nothing_rejected(&rt, &api);

    // A claim of node-b, and one of this node that another driver's device shares, with that
    // driver's entry in its status (both written as the scheduler and that driver would).
    rt.block_on(api.create_claim("default", "theirs", "1Gi"));
    rt.block_on(api.allocate_by_hand("default", "theirs", "node-b", &[("gpu-0", "1Gi")]));
    rt.block_on(api.create_claim("default", "shared", "1Gi"));
    rt.block_on(api.allocate_by_hand("default", "shared", NODE, &[("gpu-1", "1Gi")]));
    let other = serde_json::json!({"driver": "other.example.com", "pool": NODE, "device": "nic-0",
        "data": {"ip": "10.0.0.7"}});
    put_claim_status(&rt, &api.kubeconfig, "shared", |claim| {
        let results = claim["status"]["allocation"]["devices"]["results"]
            .as_array_mut()
            .unwrap();
        results.push(
            serde_json::json!({"request": "gpu", "driver": "other.example.com", "pool": NODE,
            "device": "nic-0"}),
        );
        claim["status"]["devices"] = serde_json::json!([other.clone()]);
    })
    .unwrap();
    let ours = |node: &str, device: &str| {
        serde_json::json!({"driver": DRIVER, "pool": node, "device": device,
            "shareID": "9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f00", "data": {"request": "1Gi"}})
    };
    let append = |entry: serde_json::Value| {
        move |claim: &mut serde_json::Value| {
            let status = &mut claim["status"];
            if status["devices"].is_null() {
                status["devices"] = serde_json::json!([]);
            }
            // In place of an entry of the same device (the binding condition the driver set at
            // the allocation): a second would be refused as a duplicate before any policy.
            let devices = status["devices"].as_array_mut().unwrap();
            let key = |e: &serde_json::Value| {
                (
                    e["driver"].clone(),
                    e["pool"].clone(),
                    e["device"].clone(),
                    e["shareID"].clone(),
                )
            };
            devices.retain(|e| key(e) != key(&entry));
            devices.push(entry);
        }
    };
    let denied = "is forbidden: ValidatingAdmissionPolicy 'vramgate-dra-claim-status' with binding 'vramgate-dra-claim-status' denied request: ";
    let refused = |result: Result<(), (u16, String)>, says: &str| {
        let (code, message) = result.expect_err(says);
        assert_eq!(code, 403, "{message}");
        assert!(
            message.contains(denied) && message.ends_with(says),
            "{message:?} should say {says:?}"
        );
    };

    refused(
        put_claim_status(&rt, &as_a, "theirs", append(ours("node-b", "gpu-0"))),
        "vramgate-dra on node 'node-a' may update only the status of ResourceClaims allocated to its own node, not one allocated to node 'node-b'",
    );
    let not_others = "vramgate-dra may change only its own entries (driver gpu-memory.vramgate.dev) of a ResourceClaim's status.devices, not those of other drivers";
    refused(
        put_claim_status(&rt, &as_a, "shared", |claim| {
            claim["status"]["devices"][0]["data"]["ip"] = "10.0.0.8".into();
        }),
        not_others,
    );
    refused(
        put_claim_status(&rt, &as_a, "shared", |claim| {
            claim["status"]["devices"] = serde_json::json!([ours(NODE, "gpu-1")]);
        }),
        not_others,
    );
    refused(
        put_claim_status(&rt, &as_a, "shared", |claim| {
            claim["status"]["reservedFor"] =
                serde_json::json!([{"resource": "pods", "name": "p", "uid": "5c1a2b3c-0000-4000-8000-000000000001"}]);
        }),
        "vramgate-dra may change only its own entries of a ResourceClaim's status.devices, not its status.allocation or status.reservedFor",
    );
    refused(
        put_claim_status(
            &rt,
            &api.kubeconfig_as("dra-nowhere"),
            "shared",
            append(ours(NODE, "gpu-1")),
        ),
        "vramgate-dra may update only the status of ResourceClaims allocated to its own node, and this request does not say which node it comes from: it needs the service account token of a pod on the node (kubelet's projected token, whose user extra authentication.kubernetes.io/node-name is the node: Kubernetes 1.30 or later with ServiceAccountTokenPodNodeInfo, GA in 1.32)",
    );
    // Nothing refused was stored.
    assert_eq!(
        rt.block_on(api.device_status("default", "theirs")),
        Vec::<serde_json::Value>::new()
    );
    assert_eq!(rt.block_on(api.device_status("default", "shared")), [other.clone()]);
    // Its own entry beside the other driver's is taken.
    put_claim_status(&rt, &as_a, "shared", append(ours(NODE, "gpu-1"))).unwrap();
    assert_eq!(
        rt.block_on(api.device_status("default", "shared")),
        [other, ours(NODE, "gpu-1")]
    );
    assert!(driver.child.try_wait().unwrap().is_none(), "{}", driver.log_text());
}

/// The stand-in API server refuses what kube-apiserver refuses (so that the driver's writes
/// passing it means something): each broken variant of a valid slice is a 422 naming the
/// field, as the real server's validation answers.
#[test]
fn the_stand_in_api_server_refuses_what_kube_apiserver_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let api = ApiServer::start(dir.path(), &[NODE]);
    let valid = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu-memory.vramgate.dev"},
        "spec": {"driver": DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 2, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                "attributes": {"uuid": {"string": "GPU-zero"}, "index": {"int": 0}},
                "capacity": {"memory": {"value": "16Gi", "requestPolicy": {"default": "1Gi",
                    "validRange": {"min": "256Mi", "max": "16Gi", "step": "256Mi"}}}}}]}});
    let post = |body: &serde_json::Value| -> Result<(), (u16, String)> {
        rt.block_on(async {
            let request = http::Request::post("/apis/resource.k8s.io/v1/resourceslices")
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(body).unwrap())
                .unwrap();
            match api.client().await.request_text(request).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) => Err((status.code, status.message.clone())),
                Err(e) => panic!("{e}"),
            }
        })
    };
    post(&valid).unwrap();
    let broken = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut body = valid.clone();
        body["metadata"]["name"] = serde_json::json!(name);
        edit(&mut body);
        post(&body).expect_err(name)
    };
    let policy = "/spec/devices/0/capacity/memory/requestPolicy";
    let cases: Vec<(&str, Box<dyn Fn(&mut serde_json::Value)>, &str)> = vec![
        (
            "misspelt",
            Box::new(|b| b.pointer_mut(policy).unwrap()["validRange"]["stepp"] = "1Mi".into()),
            "'stepp' was unexpected",
        ),
        (
            "not-shared",
            Box::new(|b| b["spec"]["devices"][0]["allowMultipleAllocations"] = false.into()),
            "allowMultipleAllocations must be true",
        ),
        (
            "off-step",
            Box::new(|b| b.pointer_mut(policy).unwrap()["default"] = "1100Mi".into()),
            "default is not a multiple of a given step",
        ),
        (
            "no-room",
            Box::new(|b| b["spec"]["devices"][0]["capacity"]["memory"]["value"] = "300Mi".into()),
            "one step",
        ),
        (
            "over",
            Box::new(|b| b.pointer_mut(policy).unwrap()["validRange"]["max"] = "17Gi".into()),
            "max is larger than capacity value",
        ),
        (
            "values",
            Box::new(|b| {
                *b.pointer_mut(policy).unwrap() = serde_json::json!({"default": "1Gi", "validValues": ["2Gi", "1Gi"]})
            }),
            "sorted in ascending order",
        ),
        (
            "two-nodes",
            Box::new(|b| b["spec"]["allNodes"] = true.into()),
            "exactly one of",
        ),
        ("Capital", Box::new(|_| {}), "metadata.name"),
        (
            "label",
            Box::new(|b| b["spec"]["devices"][0]["name"] = "gpu_0".into()),
            "spec.devices[0].name",
        ),
        (
            "long",
            Box::new(|b| b["spec"]["devices"][0]["attributes"]["uuid"]["string"] = "x".repeat(65).into()),
            "may not be more than 64",
        ),
        (
            "older",
            Box::new(|b| b["spec"]["pool"]["generation"] = 1.into()),
            "pool's newest",
        ),
        (
            "stranger",
            Box::new(|b| b["spec"]["nodeName"] = "node-z".into()),
            "no such node",
        ),
    ];
    for (name, edit, says) in cases {
        let (code, message) = broken(name, &*edit);
        assert_eq!(code, 422, "{name}: {message}");
        assert!(message.contains(says), "{name}: {message:?} should say {says:?}");
    }
    let (code, message) = rt.block_on(async {
        let request =
            http::Request::get("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.pool.name%3Dnode-a")
                .body(Vec::new())
                .unwrap();
        match api.client().await.request_text(request).await {
            Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(code, 400, "{message}");
    assert!(
        message.contains("field label not supported: spec.pool.name"),
        "{message}"
    );
}

/// The stand-in's own check of every endpoint and rule (tests/support/apiserver_selftest.sh,
/// with curl): 400-odd answers compared with what kube-apiserver 1.36 answers.
#[test]
fn the_stand_in_api_server_passes_its_selftest() {
    require("curl");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/apiserver_selftest.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(schemas_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("checks passed"));
}

/// The stand-in authenticates every request (issue 44, item 5): one without a bearer token is
/// a 401 and writes nothing, as kube-apiserver answers with anonymous requests off; the tests'
/// own client reads and writes with its admin token. The stand-in before took a request
/// without a token for a cluster admin's.
#[test]
fn the_stand_in_api_server_refuses_a_request_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::start(dir.path(), &[NODE]);
    let address = api.url.strip_prefix("http://").unwrap().to_string();
    let ask = |request: String| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    let answer = ask(format!(
        "GET {slices} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    ));
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    let body = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"forged"}}"#;
    let answer = ask(format!(
        "POST {slices} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    // The tests' own client, with its token, is answered; and nothing was written.
    let rt = runtime();
    let writes = rt.block_on(api.writes());
    assert!(writes.is_empty(), "{writes:?}");
}

/// This driver's opaque configuration in a claim, for its request `gpu`.
fn limit_config(parameters: serde_json::Value) -> serde_json::Value {
    serde_json::json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}])
}

fn gpu_memory_config(limit: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "vramgate.dev/v1", "kind": "GpuMemoryConfig", "limit": limit})
}

/// Issue 32, item 4. A claim may carry a limit in this driver's opaque configuration: a valid
/// one goes into the CDI edits beside the request, one the driver cannot read fails that
/// claim's prepare with one line and leaves no CDI spec. After a prepare the claim's
/// `status.devices[]` says, per device, the tier configured on the node, the request and the
/// limit, written through the status subresource and validated by the stand-in as
/// kube-apiserver validates it; unprepare leaves it.
#[test]
fn a_claims_status_says_the_tier_request_and_limit_and_a_bad_limit_fails_its_prepare() {
    // The node's toolkit, whose CDI spec carries its memory-limit hook: the toolkit tier is
    // the node's only where it does.
    let toolkit_cdi = tempfile::tempdir().unwrap();
    let hook_spec = serde_json::json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0",
        "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
        "args": ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--gpu-id", "GPU-0"]}]}}]});
    std::fs::write(toolkit_cdi.path().join("nvidia.json"), hook_spec.to_string()).unwrap();
    let (dir, tb) = runc_testbed(
        "vramgate-dra-status",
        &format!(
            "{GPUS}[enforce]\nlimit = \"toolkit\"\ncdi_spec_dirs = [{:?}]\n",
            toolkit_cdi.path().display().to_string()
        ),
    );
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    let _driver = Driver::start(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = rt.block_on(kubelet::register(&_driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);

    // Placed by the allocator first-fit: gpu-0 takes 6 + 6 + 1 + 1 + 1 GiB, and "below"
    // (6 GiB more) goes to gpu-1.
    let claims: [(&str, &str, serde_json::Value); 6] = [
        ("limited", "6Gi", limit_config(gpu_memory_config("8Gi"))),
        ("plain", "6Gi", serde_json::json!([])),
        (
            "misspelt",
            "1Gi",
            limit_config(
                serde_json::json!({"apiVersion": "vramgate.dev/v1", "kind": "GpuMemoryConfig", "limt": "8Gi"}),
            ),
        ),
        (
            "otherkind",
            "1Gi",
            limit_config(serde_json::json!({"apiVersion": "vramgate.dev/v1", "kind": "GpuConfig", "limit": "8Gi"})),
        ),
        ("badquantity", "1Gi", limit_config(gpu_memory_config("8 gigs"))),
        ("below", "6Gi", limit_config(gpu_memory_config("4Gi"))),
    ];
    let mut uids = std::collections::HashMap::new();
    for (name, memory, config) in &claims {
        let uid = rt.block_on(api.create_claim_with("default", name, memory, config.clone()));
        uids.insert(*name, uid);
    }
    let names: Vec<&str> = claims.iter().map(|(name, _, _)| *name).collect();
    let allocations: std::collections::HashMap<&str, serde_json::Value> = names
        .iter()
        .zip(rt.block_on(api.schedule("default", &names, NODE)))
        .map(|(name, decision)| (*name, decision.expect("placed")))
        .collect();
    let placed = |name: &str| allocator::devices(&allocations[name]);
    assert_eq!(placed("limited"), [("gpu-0".to_string(), "6Gi".to_string())]);
    assert_eq!(placed("below"), [("gpu-1".to_string(), "6Gi".to_string())]);
    let answer = rt.block_on(kubelet::prepare(
        &registered.endpoint,
        uids.iter().map(|(name, uid)| claim("default", name, uid)).collect(),
    ));

    // A bad configuration fails its claim alone, in one line saying what to fix; nothing is
    // written for it, neither a CDI spec nor a status.
    let expect = [
        (
            "misspelt",
            "claim default/misspelt: the parameters of driver gpu-memory.vramgate.dev in config[0] of its allocation: unknown field `limt`, expected one of `apiVersion`, `kind`, `limit`",
        ),
        (
            "otherkind",
            r#"claim default/otherkind: the parameters of driver gpu-memory.vramgate.dev in config[0] of its allocation: apiVersion "vramgate.dev/v1" kind "GpuConfig": this driver reads apiVersion "vramgate.dev/v1" kind "GpuMemoryConfig""#,
        ),
        (
            "badquantity",
            r#"claim default/badquantity: the parameters of driver gpu-memory.vramgate.dev in config[0] of its allocation: limit "8 gigs": "#,
        ),
        (
            "below",
            r#"claim default/below: limit 4Gi (config[0] of its allocation) is below the 6Gi the claim consumed on device "gpu-1"; a limit is at least the request"#,
        ),
    ];
    for (name, says) in expect {
        let got = &answer.claims[&uids[name]];
        assert!(
            got.error.starts_with(says),
            "claim {name}: {:?} should say {says:?}",
            got.error
        );
        assert_eq!(got.error.lines().count(), 1, "{:?}", got.error);
        assert!(got.devices.is_empty());
        assert!(
            !cdi_dir
                .join(format!("vramgate.dev-gpu-memory_{}.json", uids[name]))
                .exists(),
            "no CDI spec for {name}"
        );
        assert_eq!(
            rt.block_on(api.device_status("default", name)),
            Vec::<serde_json::Value>::new()
        );
    }

    // The limit goes into the CDI edits, in bytes, beside the request; none where none was asked.
    let env = |name: &str| -> Vec<String> {
        let path = cdi_dir.join(format!("vramgate.dev-gpu-memory_{}.json", uids[name]));
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        spec["devices"][0]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    };
    for name in ["limited", "plain"] {
        assert_eq!(answer.claims[&uids[name]].error, "", "{name}");
    }
    let limited = env("limited");
    assert!(
        limited.contains(&"VRAMGATE_MEMORY=6442450944".to_string()),
        "{limited:?}"
    );
    assert!(
        limited.contains(&"VRAMGATE_MEMORY_LIMIT=8589934592".to_string()),
        "{limited:?}"
    );
    // Without a configured limit the request is written as the limit: a container that sets
    // its own VRAMGATE_MEMORY_LIMIT gets no more than the scheduler counted.
    let plain = env("plain");
    assert!(
        plain.contains(&"VRAMGATE_MEMORY_LIMIT=6442450944".to_string()),
        "{plain:?}"
    );

    // The status: one entry per device, the allocation's key, and what the node applies.
    let status = |name: &str, limit: u64| {
        let result = &allocations[name]["devices"]["results"][0];
        serde_json::json!([{"driver": DRIVER, "pool": NODE, "device": result["device"],
            "shareID": result["shareID"],
            "data": {"apiVersion": "vramgate.dev/v1", "kind": "GpuMemoryStatus",
                "tier": "toolkit_limit", "request": 6u64 << 30, "limit": limit}}])
        .as_array()
        .unwrap()
        .clone()
    };
    // Beside it, the binding condition the driver set at the claim's allocation (issue 56):
    // kept by prepare's write, and looked at here on its own.
    let without_conditions = |name: &str| {
        let mut entries = wait_until(
            "the claim's binding condition beside prepare's data",
            Duration::from_secs(10),
            || {
                let entries = rt.block_on(api.device_status("default", name));
                let both = entries
                    .iter()
                    .all(|e| e.get("conditions").is_some() && e.get("data").is_some());
                (both && !entries.is_empty(), entries)
            },
        );
        for entry in &mut entries {
            let conditions = entry.as_object_mut().unwrap().remove("conditions");
            let types: Vec<_> = conditions
                .as_ref()
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .map(|c| (c["type"].clone(), c["status"].clone()))
                .collect();
            assert_eq!(
                types,
                [(
                    serde_json::json!(vramgate::dra::RESERVED_CONDITION),
                    serde_json::json!("True")
                )],
                "{name}"
            );
        }
        entries
    };
    assert_eq!(without_conditions("limited"), status("limited", 8 << 30));
    assert_eq!(
        without_conditions("plain"),
        status("plain", 6 << 30),
        "no limit asked: the limit is the request"
    );

    // Unprepared: the status stays with the allocation, as upstream drivers leave it.
    let answer = rt.block_on(kubelet::unprepare(
        &registered.endpoint,
        vec![claim("default", "limited", &uids["limited"])],
    ));
    assert!(answer.claims.values().all(|r| r.error.is_empty()), "{answer:?}");
    assert_eq!(without_conditions("limited"), status("limited", 8 << 30));
    assert_nothing_rejected(&rt, &api);
    drop(dir);
}

/// `runc ARGS` against the testbed's root with cgroup v2 at /sys/fs/cgroup ([`in_cgroup_v2`]),
/// where the hook sets the driver limit on the container's cgroup. Output goes to files: a
/// created container keeps the stdio it inherited, and a pipe would never reach its end.
fn runc_v2(tb: &vramgate_testbed::Testbed, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&std::ffi::OsStr> = vec![std::ffi::OsStr::new("--root"), tb.runc_root.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    let (key, value) = tb.env();
    let out = tempfile::NamedTempFile::new_in(&tb.dir).unwrap();
    let err = tempfile::NamedTempFile::new_in(&tb.dir).unwrap();
    let status = in_cgroup_v2(&tb.runc, &all)
        .env(key, value)
        .env("PATH", path_with_sbin())
        .stdin(std::process::Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(err.reopen().unwrap())
        .status()
        .unwrap();
    std::process::Output {
        status,
        stdout: std::fs::read(out.path()).unwrap(),
        stderr: std::fs::read(err.path()).unwrap(),
    }
}

/// Issue 32, item 4: `used` in a claim's status is what its containers hold on the GPU, from
/// the same service snapshot the slice is computed from, and it is rewritten when that
/// changes. On the driver limit's tier the driver's per-cgroup figure is the measurement
/// (the NVML stub plays the driver; no process list needed): the claim's container, started
/// from the claim's CDI edits, shows its figure, then the new one, then none once it is gone.
#[test]
fn a_claims_status_says_what_its_containers_use_refreshed_with_the_view() {
    require("runc");
    let stub_dir = tempfile::tempdir().unwrap();
    let (lib, log) = nvml_stub(stub_dir.path(), true, &["GPU-zero", "GPU-one"]);
    let usage = std::path::PathBuf::from(format!("{}.usage", log.display()));
    let gpus = GPUS.replacen(
        "backend = \"static\"\n",
        &format!("backend = \"static\"\nnvml_library = {:?}\n", lib.display().to_string()),
        1,
    );
    let (dir, tb) = runc_testbed("vramgate-dra-used", &format!("{gpus}[enforce]\nlimit = \"driver\"\n"));
    let rt = runtime();
    let api = ApiServer::start(&tb.dir, &[NODE]);
    let cdi_dir = tb.dir.join("cdi");
    let driver = Driver::start_in_cgroup_v2(&tb.dir, &tb.config_path, &api, NODE, &cdi_dir, &[]);
    let registered = rt.block_on(kubelet::register(&driver.registration_socket(), DRIVER));
    wait_capacities(&rt, &api, &[("gpu-0", "16Gi"), ("gpu-1", "16Gi")]);

    let uid = rt.block_on(api.create_claim_with("default", "trainer", "6Gi", limit_config(gpu_memory_config("8Gi"))));
    let allocation = rt.block_on(api.schedule_one("default", "trainer", NODE));
    assert_eq!(
        allocator::devices(&allocation),
        [("gpu-0".to_string(), "6Gi".to_string())]
    );
    let answer = rt.block_on(kubelet::prepare(
        &registered.endpoint,
        vec![claim("default", "trainer", &uid)],
    ));
    assert_eq!(answer.claims[&uid].error, "");
    let data = || -> serde_json::Value {
        let status = rt.block_on(api.device_status("default", "trainer"));
        status.first().map(|d| d["data"].clone()).unwrap_or_default()
    };
    let prepared = data();
    assert_eq!(
        (&prepared["tier"], &prepared["request"], &prepared["limit"]),
        (
            &serde_json::json!("driver_limit"),
            &serde_json::json!(6u64 << 30),
            &serde_json::json!(8u64 << 30)
        ),
        "{prepared}"
    );
    assert!(
        prepared.get("used").is_none(),
        "nothing runs yet, nothing measured: {prepared}"
    );

    // The claim's container, as the runtime makes it from the claim's CDI edits.
    let bundle = tb.bundle("claimed", &["sleep", "60"], &[], &[], false).unwrap();
    apply_cdi(&bundle, &cdi_dir, &vramgate_ids(&answer.claims[&uid]));
    let cgroup = format!("/vramgate-dra-used/{}/claimed", std::process::id());
    let config_json = bundle.join("config.json");
    let mut oci: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_json).unwrap()).unwrap();
    oci["linux"]["cgroupsPath"] = serde_json::json!(cgroup);
    std::fs::write(&config_json, serde_json::to_vec_pretty(&oci).unwrap()).unwrap();
    let out = runc_v2(&tb, &["create", "--bundle", bundle.to_str().unwrap(), "claimed"]);
    assert!(out.status.success(), "create: {}", stderr(&out));
    let cgroup_dir = format!("/sys/fs/cgroup{cgroup}");

    let wait_used = |want: Option<u64>| {
        wait_until(
            "the claim's status to say what its container uses",
            Duration::from_secs(10),
            || {
                let data = data();
                (data.get("used").and_then(|u| u.as_u64()) == want, data)
            },
        );
    };
    std::fs::write(&usage, format!("GPU-zero {cgroup_dir} {}\n", 3u64 << 30)).unwrap();
    wait_used(Some(3 << 30));
    std::fs::write(&usage, format!("GPU-zero {cgroup_dir} {}\n", 5u64 << 30)).unwrap();
    wait_used(Some(5 << 30));

    // The container goes: its reservation with it, and nothing is measured for the claim.
    let out = runc_v2(&tb, &["delete", "--force", "claimed"]);
    assert!(out.status.success(), "delete: {}", stderr(&out));
    // runc removed the container's own cgroup; its parents are this test's.
    let parent = cgroup_v2_root().join(format!("vramgate-dra-used/{}", std::process::id()));
    let _ = std::fs::remove_dir(&parent);
    let _ = std::fs::remove_dir(parent.parent().unwrap());
    wait_used(None);
    assert_eq!(data()["limit"], serde_json::json!(8u64 << 30));
    assert_nothing_rejected(&rt, &api);
    drop(driver);
    drop(dir);
}

/// Issue 32, item 4: the claim's status is what the node reports, not what kubelet waits for.
/// A status update that conflicts with another writer (409) is read again and retried at
/// once; one the API server fails (a 500, as a timed-out etcd gives) fails no prepare: the
/// prepare stands, the failure is logged, and the write is tried again later.
#[test]
fn a_status_write_that_fails_fails_no_prepare_and_is_tried_again() {
    // Without binding conditions: the status writes here are prepare's alone (with them, the
    // claim watcher's answer could meet the refusals the test injects for prepare).
    let (dir, _tb, rt, api, _cdi_dir, driver, endpoint) =
        registered_driver_with("vramgate-dra-status-retry", &["--binding-conditions=false"]);
    let busy = rt.block_on(api.create_claim("default", "busy", "2Gi"));
    let failing = rt.block_on(api.create_claim("default", "failing", "2Gi"));
    let decisions = rt.block_on(api.schedule("default", &["busy", "failing"], NODE));
    assert!(decisions.iter().all(Result::is_ok), "{decisions:?}");
    rt.block_on(api.refuse("PUT", "/resourceclaims/busy/status", 409, 1));
    rt.block_on(api.refuse("PUT", "/resourceclaims/failing/status", 500, 1));

    let answer = rt.block_on(kubelet::prepare(
        &endpoint,
        vec![claim("default", "busy", &busy), claim("default", "failing", &failing)],
    ));
    for uid in [&busy, &failing] {
        assert_eq!(answer.claims[uid].error, "");
        assert_eq!(answer.claims[uid].devices.len(), 1);
    }
    assert_eq!(
        rt.block_on(api.device_status("default", "busy")).len(),
        1,
        "the conflict was retried within the prepare"
    );
    assert!(
        driver
            .log_text()
            .contains("vramgate-dra: status of claim default/failing"),
        "{}",
        driver.log_text()
    );
    let started = Instant::now();
    wait_until(
        "the failed status write to be tried again",
        Duration::from_secs(15),
        || {
            let status = rt.block_on(api.device_status("default", "failing"));
            (status.len() == 1, status)
        },
    );
    eprintln!(
        "status written {} ms after the failed try",
        started.elapsed().as_millis()
    );
    let rejected: Vec<(u64, String)> = rt
        .block_on(api.rejected())
        .iter()
        .map(|r| (r["code"].as_u64().unwrap(), r["path"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        rejected,
        [
            (
                409,
                "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/busy/status".to_string()
            ),
            (
                500,
                "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/failing/status".to_string()
            ),
        ],
        "only the refusals the test asked for"
    );
    drop(driver);
    drop(dir);
}
