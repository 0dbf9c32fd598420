use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/vramgate/config.toml"))
}

#[test]
fn empty_file_means_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.state_dir, PathBuf::from("/run/vramgate"));
    assert_eq!(c.policy, Policy::Reject);
    assert_eq!(c.inventory.backend, Backend::Auto);
    assert_eq!(c.inventory.static_gpus_or_simulated()[0].total, 24_265 << 20);
}

#[test]
fn missing_file_means_defaults() {
    let c = Config::load_from(Path::new("/nonexistent/vramgate.toml")).unwrap();
    assert!(c.source.is_none());
}

#[test]
fn full_file() {
    let c = parse(
        r#"
state_dir = "/var/run/vg"
headroom = "512Mi"
policy = "wait"
wait_timeout = "90s"
on_state_error = "fail-open"
[queue]
backfill = true
backfill_bound = "10s"
poll_interval = "200ms"
[inventory]
backend = "static"
[[inventory.gpus]]
index = 0
uuid = "GPU-a"
total = "80Gi"
used_outside = "1Gi"
[[inventory.gpus]]
index = 1
uuid = "GPU-b"
total = "80Gi"
minor = 5
"#,
    )
    .unwrap();
    assert_eq!(c.headroom, Quantity::Bytes(512 << 20));
    assert_eq!(c.policy, Policy::Wait);
    assert_eq!(c.wait_timeout, Duration::from_secs(90));
    assert_eq!(c.on_state_error, OnStateError::FailOpen);
    assert!(c.queue.backfill);
    assert_eq!(c.queue.limit_overcommit_ppm, 0, "the default");
    assert_eq!(c.inventory.gpus.len(), 2);
    assert_eq!(c.inventory.gpus[0].used_outside, 1 << 30);
    assert_eq!(c.inventory.gpus[1].minor, 5);
    assert_eq!(c.runtime, RuntimeConfig::default());
}

#[test]
fn limit_overcommit_is_a_percentage_up_to_100() {
    for (v, ppm) in [
        ("0%", 0),
        ("0", 0),
        ("50%", 500_000),
        ("12.5%", 125_000),
        ("100%", 1_000_000),
    ] {
        let c = parse(&format!("[queue]\nlimit_overcommit = \"{v}\"")).unwrap();
        assert_eq!(c.queue.limit_overcommit_ppm, ppm, "{v}");
    }
    for v in ["150%", "-5%", "50", "2Gi", "lots", ""] {
        let err = parse(&format!("[queue]\nlimit_overcommit = \"{v}\""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("queue.limit_overcommit") && err.contains("from \"0%\" to \"100%\""),
            "{v}: {err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn each_table_has_its_own_struct() {
    let c = parse("[queue]\nbackfill = true\n[inventory]\nbackend = \"static\"").unwrap();
    assert_eq!(
        c.queue,
        QueueConfig {
            backfill: true,
            ..QueueConfig::default()
        }
    );
    assert_eq!(
        c.inventory,
        InventoryConfig {
            backend: Backend::Static,
            ..InventoryConfig::default()
        }
    );
    assert_eq!(c.runtime, RuntimeConfig::default());
}

#[test]
fn runtime_table() {
    let c =
        parse("[runtime]\nruntimes = [\"/opt/bin/crun\", \"runc\"]\nhook_path = \"/opt/bin/vramgate-hook\"").unwrap();
    assert_eq!(c.runtime.runtimes, ["/opt/bin/crun", "runc"]);
    assert_eq!(c.runtime.hook_path, Some(PathBuf::from("/opt/bin/vramgate-hook")));
    // NVIDIA's runtime on PATH (the package), then where the GPU Operator installs it.
    assert_eq!(
        parse("").unwrap().runtime.runtimes,
        [
            "nvidia-container-runtime",
            "/usr/local/nvidia/toolkit/nvidia-container-runtime",
            "runc"
        ]
    );
}

/// How NVIDIA's toolkit reads NVIDIA_VISIBLE_DEVICES is read from its own config: the first of
/// the configured files that exists; its default where none does, or the key is absent.
#[test]
fn the_nvidia_toolkits_setting_is_read_from_its_config() {
    let dir = tempfile::tempdir().unwrap();
    let (missing, operator) = (dir.path().join("missing.toml"), dir.path().join("operator.toml"));
    let c = parse(&format!(
        "[runtime]\nnvidia_toolkit_configs = [{:?}, {:?}]\n",
        missing.display().to_string(),
        operator.display().to_string()
    ))
    .unwrap();
    assert!(c.runtime.nvidia_toolkit().envvar_when_unprivileged);
    std::fs::write(
        &operator,
        "accept-nvidia-visible-devices-as-volume-mounts = true\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n[nvidia-container-runtime]\nmode = \"cdi\"\n",
    )
    .unwrap();
    assert!(!c.runtime.nvidia_toolkit().envvar_when_unprivileged);
    std::fs::write(&operator, "[nvidia-container-runtime]\nmode = \"cdi\"\n").unwrap();
    assert!(c.runtime.nvidia_toolkit().envvar_when_unprivileged);
    let err = parse("[runtime]\nnvidia_toolkit_configs = [\"relative.toml\"]\n").unwrap_err();
    assert!(err.to_string().contains("runtime.nvidia_toolkit_configs"), "{err}");
}

#[test]
fn enforce_table() {
    let c = parse("").unwrap();
    assert_eq!(c.enforce, EnforceConfig::default());
    assert_eq!(c.enforce.limit, LimitMechanism::None);
    assert!(c.enforce.tensorflow_allow_growth && c.enforce.jax_disable_preallocation && c.enforce.jax_memory_fraction);
    let c = parse(
        "[enforce]\nlimit = \"mps\"\nmps_pipe_directory = \"/run/mps\"\nmps_device_key = \"uuid\"\njax_memory_fraction = false",
    )
    .unwrap();
    assert_eq!(c.enforce.limit, LimitMechanism::Mps);
    assert_eq!(c.enforce.mps_pipe_directory, PathBuf::from("/run/mps"));
    assert_eq!(c.enforce.mps_log_directory, PathBuf::from("/tmp/nvidia-log"));
    assert_eq!(c.enforce.mps_device_key, MpsDeviceKey::Uuid);
    assert!(!c.enforce.jax_memory_fraction && c.enforce.tensorflow_allow_growth);
    assert_eq!(
        c.enforce.cdi_spec_dirs,
        [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
    );
    let c = parse("[enforce]\ncdi_spec_dirs = [\"/opt/cdi\"]").unwrap();
    assert_eq!(c.enforce.cdi_spec_dirs, [PathBuf::from("/opt/cdi")]);
    for name in ["none", "driver", "toolkit", "mps"] {
        assert_eq!(LimitMechanism::parse(name).unwrap().as_str(), name);
    }
}

#[test]
fn errors_name_the_key() {
    let cases = [
        ("stat_dir = \"/x\"", "stat_dir"),
        ("policy = \"later\"", "policy"),
        ("headroom = \"lots\"", "headroom"),
        ("wait_timeout = \"5 days\"", "wait_timeout"),
        ("state_dir = \"relative\"", "state_dir"),
        ("[queue]\npoll_interval = \"1ms\"", "poll_interval"),
        ("[inventory]\nbackend = \"cuda\"", "cuda"),
        (
            "[[inventory.gpus]]\nindex = 0\nuuid = \"a\"\ntotal = \"50%\"",
            "inventory.gpus[0].total",
        ),
        (
            "[[inventory.gpus]]\nindex = 0\nuuid = \"a\"\ntotal = \"1Gi\"\ncolour = 1",
            "colour",
        ),
        ("wait_timeout = \"2h\"", "max_wait_timeout"),
        ("[runtime]\nruntimes = []", "runtime.runtimes"),
        ("[runtime]\nruntimes = [\"bin/runc\"]", "runtime.runtimes"),
        ("[runtime]\nhook_path = \"vramgate-hook\"", "runtime.hook_path"),
        ("[runtime]\nruntime = [\"runc\"]", "runtime"),
        ("[enforce]\nlimit = \"cgroup\"", "enforce.limit"),
        (
            "[enforce]\nmps_pipe_directory = \"nvidia-mps\"",
            "enforce.mps_pipe_directory",
        ),
        ("[enforce]\nmps_device_key = \"index\"", "enforce.mps_device_key"),
        ("[enforce]\ncdi_spec_dirs = []", "enforce.cdi_spec_dirs"),
        ("[enforce]\ncdi_spec_dirs = [\"etc/cdi\"]", "enforce.cdi_spec_dirs"),
        (
            "[enforce]\ntensorflow_allow_growth = \"yes\"",
            "tensorflow_allow_growth",
        ),
        ("[enforce]\njax_preallocate = false", "jax_preallocate"),
        ("this is not toml", "config.toml"),
        ("\"a\\nb\" = 1", "unknown field"),
    ];
    for (text, needle) in cases {
        let err = parse(text).expect_err(text).to_string();
        assert!(err.contains(needle), "{text:?} -> {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}
