//! containerd: the config `vramgate setup containerd` writes is read by the installed
//! containerd (`config dump` shows the runtime, its annotation pass-lists, and the host's own
//! CRI settings intact; containerd 1.x's config gets the runtime by key, in place), and a container run through `ctr run --runc-binary vramgate-runtime`
//! on a private containerd is admitted, refused and released.

use crate::support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

/// A host CRI section with values that differ from containerd's defaults, so that losing
/// them (containerd 1.x replaces a plugin section wholesale on import) would show.
const HOST_CONFIG: &str = r#"# the host's own config
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.example/pause:host"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"#;

fn setup_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(VRAMGATE);
    cmd.arg("setup").arg("containerd").args(args);
    cmd
}

/// `vramgate setup containerd`'s flags for the main config `main` and the drop-in `drop_in`,
/// with the built wrapper as the runtime.
fn setup_paths<'a>(main: &'a std::path::Path, drop_in: &'a std::path::Path) -> [&'a str; 6] {
    [
        "--config-path",
        drop_in.to_str().unwrap(),
        "--containerd-config",
        main.to_str().unwrap(),
        "--runtime-path",
        RUNTIME,
    ]
}

#[test]
fn setup_writes_a_config_containerd_reads() {
    require("containerd");
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let drop_in = dir.path().join("conf.d/vramgate.toml");
    std::fs::write(&main, HOST_CONFIG).unwrap();
    let paths = setup_paths(&main, &drop_in);

    // --dry-run prints the drop-in and writes nothing.
    let printed = run_ok(setup_cmd(&paths).arg("--dry-run"));
    assert!(
        printed.contains("would write") && printed.contains("BinaryName"),
        "{printed}"
    );
    assert!(!drop_in.exists());
    assert_eq!(std::fs::read_to_string(&main).unwrap(), HOST_CONFIG);

    run_ok(&mut setup_cmd(&paths));
    let dump = run_ok(
        Command::new("containerd")
            .arg("--config")
            .arg(&main)
            .args(["config", "dump"]),
    );
    let dumped: toml::Table = toml::from_str(&dump).expect("containerd's dump is TOML");
    // Config version 2: in the main config itself, every byte of the host's kept, no drop-in
    // (containerd 1.x would let it hide what other tools add to the main config).
    assert!(!drop_in.exists());
    let set_up = std::fs::read_to_string(&main).unwrap();
    assert!(set_up.starts_with(HOST_CONFIG), "{set_up}");
    let cri = &dumped["plugins"]["io.containerd.grpc.v1.cri"];
    let runtime = &cri["containerd"]["runtimes"]["vramgate"];
    assert_eq!(runtime["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(runtime["options"]["BinaryName"].as_str(), Some(RUNTIME));
    for key in ["pod_annotations", "container_annotations"] {
        assert_eq!(
            runtime[key].as_array().unwrap()[0].as_str(),
            Some("vramgate.dev/*"),
            "{key}"
        );
    }
    assert_eq!(
        cri["sandbox_image"].as_str(),
        Some("registry.example/pause:host"),
        "host CRI setting lost"
    );
    assert_eq!(
        cri["cni"]["bin_dir"].as_str(),
        Some("/usr/lib/cni"),
        "host CRI setting lost"
    );
    assert_eq!(
        cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
        Some(true)
    );
    assert_eq!(cri["containerd"]["default_runtime_name"].as_str(), Some("runc"));

    // Idempotent; --set-as-default makes it the CRI default; --remove restores the host file.
    let again = run_ok(&mut setup_cmd(&paths));
    assert!(
        again.contains("already as wanted") && !again.contains("wrote"),
        "{again}"
    );
    run_ok(setup_cmd(&paths).arg("--set-as-default"));
    let dump = run_ok(
        Command::new("containerd")
            .arg("--config")
            .arg(&main)
            .args(["config", "dump"]),
    );
    let dumped: toml::Table = toml::from_str(&dump).unwrap();
    assert_eq!(
        dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"].as_str(),
        Some("vramgate")
    );
    run_ok(setup_cmd(&paths).arg("--remove"));
    assert!(!drop_in.exists());
    assert_eq!(std::fs::read_to_string(&main).unwrap(), HOST_CONFIG);
}

struct Containerd {
    child: Option<Child>,
    address: PathBuf,
    state: PathBuf,
    tb: vramgate_testbed::Testbed,
    _host: HostDirs,
}

impl Containerd {
    fn start(tb: vramgate_testbed::Testbed) -> Containerd {
        // ctr and the runc shim keep fifos and runc state under /run/containerd whatever
        // containerd's --state is.
        let host = HostDirs::note(&[
            "/run/containerd/runc/default",
            "/run/containerd/runc",
            "/run/containerd/fifo",
            "/run/containerd/s",
            "/run/containerd",
        ]);
        let dir = tb.dir.join("containerd");
        let (child, address, state) = start_containerd(&dir, &tb.config_path, &path_with_sbin());
        wait_until("containerd listens", Duration::from_secs(20), || (address.exists(), ()));
        Containerd {
            child: Some(child),
            address,
            state,
            tb,
            _host: host,
        }
    }

    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&self.address).args(args).stdin(Stdio::null());
        cmd
    }

    /// `ctr run --rootfs --runc-binary vramgate-runtime [extra] ROOTFS id cmd...`
    fn run(&self, extra: &[&str], id: &str, cmd: &[&str]) -> Command {
        let mut c = self.ctr(&["run", "--rootfs", "--runc-binary", RUNTIME]);
        c.args(extra).arg(&self.tb.rootfs).arg(id).args(cmd);
        c
    }

    fn remove(&self, id: &str) {
        let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]).output();
        wait_until(&format!("task {id} stopped"), Duration::from_secs(10), || {
            let out = self.ctr(&["task", "ls"]).output().unwrap();
            let listing = String::from_utf8_lossy(&out.stdout).to_string();
            let running = listing.lines().any(|l| l.starts_with(id) && l.contains("RUNNING"));
            (!running, listing)
        });
        let _ = self.ctr(&["task", "delete", id]).output();
        let _ = self.ctr(&["container", "delete", id]).output();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Ok(out) = self.ctr(&["container", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                self.remove(id);
            }
        }
        if let Some(child) = self.child.take() {
            stop_pid(child.id() as i32, Duration::from_secs(10));
        }
        unmount_under(&self.tb.dir);
    }
}

#[test]
fn ctr_run_through_the_wrapper_is_admitted_and_released() {
    require("containerd");
    require("ctr");
    require("runc");
    let dir = tempfile::tempdir().unwrap();
    let c = Containerd::start(testbed(dir.path()));
    // The runc shim keeps each container's runc state under /run/containerd/runc/default,
    // shared by every containerd on the host: ids of this process's own.
    let (big, refused, plain) = (own_name("big"), own_name("refused"), own_name("plain"));

    // Annotations reach the spec through ctr; admitted while it runs.
    run_ok(&mut c.run(
        &[
            "-d",
            "--annotation",
            "vramgate.dev/memory=20Gi",
            "--annotation",
            "vramgate.dev/gpus=0",
        ],
        &big,
        &["/bin/sleep", "300"],
    ));
    wait_reserved(&c.tb, &big, 20 << 30);
    let bundle = c
        .state
        .join(format!("io.containerd.runtime.v2.task/default/{big}/config.json"));
    assert_eq!(vramgate_hook_stages(&bundle), ["createRuntime", "poststop"]);
    // ctr writes no annotation of its own (the id is the name its user gave): shown by its id.
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let keys: Vec<&String> = spec["annotations"].as_object().unwrap().keys().collect();
    assert!(keys.iter().all(|k| k.starts_with("vramgate.dev/")), "{keys:?}");
    support::assert_shown_as(&c.tb.config_path, &c.tb.state_dir, &big, None);

    // Over capacity (env request this time): ctr fails with vramgate's message.
    let out = c
        .run(
            &[
                "--rm",
                "--env",
                "VRAMGATE_MEMORY=5Gi",
                "--env",
                "NVIDIA_VISIBLE_DEVICES=0",
            ],
            &refused,
            &["/bin/true"],
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("vramgate: refused container {refused}: it requests 5120 MiB")),
        "{stderr}"
    );
    assert_eq!(reservations(&c.tb), [(big.clone(), 20 << 30)]);

    // Killed and deleted: released by the poststop hook the wrapper added.
    c.remove(&big);
    wait_released(&c.tb, &big);

    // Without a request: no hooks in its spec, nothing reserved.
    run_ok(&mut c.run(&["-d"], &plain, &["/bin/sleep", "300"]));
    let bundle = c
        .state
        .join(format!("io.containerd.runtime.v2.task/default/{plain}/config.json"));
    assert!(vramgate_hook_stages(&bundle).is_empty());
    assert!(reservations(&c.tb).is_empty());
    c.remove(&plain);
}

/// sid's containerd 2.1 binary, unpacked by scripts/fetch-containerd-2.
fn containerd_2() -> PathBuf {
    let sid =
        std::env::var("VRAMGATE_CONTAINERD_2").unwrap_or_else(|_| "/var/cache/vramgate-tests/containerd-sid".into());
    let two = PathBuf::from(sid).join("usr/bin/containerd");
    assert!(
        two.is_file(),
        "containerd 2.1 is not unpacked at {}: run scripts/install-deps (or scripts/fetch-containerd-2)",
        two.display()
    );
    two
}

/// containerd's own default config (`containerd config default`) of Debian 12's 1.6 (config
/// version 2) and of sid's 2.1 (version 3, unpacked by scripts/fetch-containerd-2).
fn default_configs() -> Vec<(&'static str, String)> {
    require("containerd");
    let two = containerd_2();
    let mut one = Command::new("containerd");
    one.env("PATH", path_with_sbin());
    [("containerd 1.6", one), ("containerd 2.1", Command::new(two))]
        .into_iter()
        // As containerd prints it, its last line ended (run_ok trims).
        .map(|(name, mut cmd)| (name, run_ok(cmd.args(["config", "default"])) + "\n"))
        .collect()
}

#[test]
fn setup_then_remove_gives_default_configs_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let drop_in = dir.path().join("conf.d/vramgate.toml");
    let paths = setup_paths(&main, &drop_in);
    for (name, default) in default_configs() {
        assert!(default.contains("\nimports = []\n"), "{name}: {default}");
        let with_imports = default.replace("\nimports = []\n", "\nimports = [\"/etc/containerd/site.toml\"]\n");
        let without_imports = default.replace("\nimports = []\n", "\n");
        let version_2 = default.contains("\nversion = 2\n");
        for (case, original) in [
            ("as written", &default),
            ("with an import", &with_imports),
            ("without imports", &without_imports),
        ] {
            std::fs::write(&main, original).unwrap();
            run_ok(&mut setup_cmd(&paths));
            let set_up = std::fs::read_to_string(&main).unwrap();
            let table: toml::Table = toml::from_str(&set_up).unwrap();
            if version_2 {
                // containerd 1.x: by key, in the main config.
                let runtimes = &table["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
                assert!(runtimes.get("vramgate").is_some(), "{name} {case}: {set_up}");
                assert!(!drop_in.exists(), "{name} {case}");
            } else {
                let imports = table["imports"].as_array().unwrap();
                assert!(
                    imports.iter().any(|i| i.as_str() == drop_in.to_str()),
                    "{name} {case}: {imports:?}"
                );
                assert!(drop_in.exists(), "{name} {case}");
            }
            run_ok(setup_cmd(&paths).arg("--remove"));
            let back = std::fs::read(&main).unwrap();
            assert!(
                back == original.as_bytes(),
                "{name} {case}: setup then --remove changed the file:\n--- before\n{original}\n--- after\n{}",
                String::from_utf8_lossy(&back)
            );
            assert!(!drop_in.exists(), "{name} {case}");
        }
    }
}

/// containerd 2.x merges imported files into the main config key by key, and admins set
/// `SystemdCgroup = true` (kubelet's cgroup driver) in one of them as often as in the main
/// file. vramgate's runtime must run with the default runtime's options as containerd merges
/// them, or its pods land in other cgroups than kubelet expects; but never with its
/// `BinaryName`, which is the wrapper's. Read from containerd 2.1's `config dump` when that
/// containerd is on PATH, else (Debian's 1.6 on PATH cannot dump version 3) from the files.
#[test]
fn setup_for_containerd_2_takes_the_default_runtimes_options_from_imported_files() {
    require("containerd");
    let two = containerd_2();
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let site = dir.path().join("site.d/10-cgroups.toml");
    let drop_in = dir.path().join("conf.d/vramgate.toml");
    std::fs::create_dir_all(site.parent().unwrap()).unwrap();
    let original = format!(
        "version = 3\nimports = [{:?}]\n\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"registry.example/pause:host\"\n",
        dir.path().join("site.d/*.toml")
    );
    std::fs::write(&main, &original).unwrap();
    std::fs::write(
        &site,
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n  NoNewKeyring = true\n  BinaryName = \"/usr/local/sbin/runc-site\"\n",
    )
    .unwrap();
    let paths = setup_paths(&main, &drop_in);
    let with_2 = format!("{}:{}", two.parent().unwrap().display(), path_with_sbin());
    for (case, path, says) in [
        ("containerd 2.1 on PATH", with_2.as_str(), "config dump`"),
        ("containerd 1.6 on PATH", &path_with_sbin(), "is not 2.x"),
    ] {
        let printed = run_ok(setup_cmd(&paths).env("PATH", path));
        let dump = run_ok(Command::new(&two).arg("--config").arg(&main).args(["config", "dump"]));
        let dumped: toml::Table = toml::from_str(&dump).expect("containerd's dump is TOML");
        let runtimes = &dumped["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"];
        let ours = &runtimes["vramgate"]["options"];
        let option = |key: &str| ours.get(key).cloned();
        assert_eq!(option("SystemdCgroup"), Some(true.into()), "{case}: {dump}");
        assert_eq!(option("NoNewKeyring"), Some(true.into()), "{case}: {dump}");
        assert_eq!(option("BinaryName"), Some(RUNTIME.into()), "{case}: {dump}");
        assert_eq!(
            runtimes["runc"]["options"]["BinaryName"].as_str(),
            Some("/usr/local/sbin/runc-site"),
            "{case}: the host's runtime is left as it was"
        );
        assert_eq!(
            dumped["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
            Some("registry.example/pause:host")
        );
        // Which one was read, and why not the dump.
        assert!(
            printed.contains("note: the default runtime's options were read from") && printed.contains(says),
            "{case}: {printed}"
        );
        run_ok(setup_cmd(&paths).arg("--remove"));
        assert!(!drop_in.exists(), "{case}");
        assert_eq!(std::fs::read_to_string(&main).unwrap(), original, "{case}");
    }
}
