//! The distro packages, end to end: build the .deb and the .rpm with `scripts/package`,
//! install the .deb with dpkg on this host, run the installed tools and a real runc container
//! through the installed hook and hooks.d entries, reinstall over an admin's edit, then remove
//! and purge and check that nothing is left. The .rpm is checked with `rpm -qlp` and
//! `rpm -qp --scripts` (Debian's rpm cannot install it).
//!
//! This changes the host (/usr/bin, /etc/vramgate, /run/vramgate), so it is one test whose
//! steps run in order, and a guard purges the package even when a step fails. A missing tool
//! fails it with the one line that says what to install (`scripts/test` installs them all):
//! a skip would report `ok` for packages nobody built.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vramgate::testbed::Testbed;

const PACKAGE: &str = "vramgate";
const HOOKS_D: &str = "/usr/share/containers/oci/hooks.d";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// The binaries the packages must ship: one per `src/bin/*.rs`, so that a binary merged in
/// later (vramgate-runtime) is required the moment its source exists.
/// Where the package puts the manual's HTML.
const BOOK: &str = "/usr/share/doc/vramgate/book";

fn expected_binaries() -> Vec<String> {
    let mut bins: Vec<String> = std::fs::read_dir(root().join("src/bin"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    bins.sort();
    for bin in ["vramgate", "vramgate-hook", "vramgate-runtime"] {
        assert!(bins.contains(&bin.into()), "src/bin/{bin}.rs is missing: {bins:?}");
    }
    bins
}

/// Fails, naming what to install, unless this host can run the test.
fn require_tools() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the packaging test runs dpkg -i: run it as root (sudo scripts/test)"
    );
    for (tool, hint) in [
        ("cargo-deb", "cargo install --locked cargo-deb"),
        ("cargo-generate-rpm", "cargo install --locked cargo-generate-rpm"),
        ("dpkg", "a Debian host"),
        ("rpm", "apt-get install rpm"),
        ("runc", "apt-get install runc"),
        ("systemd-analyze", "apt-get install systemd"),
    ] {
        assert!(
            vramgate::testbed::which(tool).is_some(),
            "{tool} is not installed: {hint} (scripts/install-deps installs it)"
        );
    }
}

/// Purges the package and removes the test's containers however the test ends.
struct Cleanup {
    testbed: Option<Testbed>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(testbed) = &self.testbed {
            testbed.cleanup_containers();
        }
        if installed() || Path::new("/var/lib/dpkg/info/vramgate.list").exists() {
            let _ = Command::new("dpkg")
                .args(["--purge", PACKAGE])
                .stdout(Stdio::null())
                .status();
        }
    }
}

fn newest(dir: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let version = env!("CARGO_PKG_VERSION");
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(&format!("{prefix}{version}")) && name.ends_with(suffix)
        })
        .max_by_key(|p| p.metadata().unwrap().modified().unwrap())
        .unwrap_or_else(|| panic!("no {prefix}{version}*{suffix} in {}", dir.display()))
}

/// The hooks an engine reading hooks.d would add to a spec, taken from the installed files.
fn hooks_from_hooks_d() -> Value {
    let mut hooks = serde_json::Map::new();
    for entry in std::fs::read_dir(HOOKS_D).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("vramgate") {
            continue;
        }
        let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(file["hook"]["path"], "/usr/bin/vramgate-hook", "{name}");
        for stage in file["stages"].as_array().unwrap() {
            let list = hooks.entry(stage.as_str().unwrap()).or_insert_with(|| json!([]));
            list.as_array_mut().unwrap().push(file["hook"].clone());
        }
    }
    assert!(
        hooks.contains_key("prestart") && hooks.contains_key("poststop"),
        "{hooks:?}"
    );
    Value::Object(hooks)
}

/// `vramgate status --json` of the installed tool with the installed config.
fn installed_status() -> Value {
    let out = run(Command::new("/usr/bin/vramgate")
        .args(["status", "--json"])
        .env_remove("VRAMGATE_CONFIG"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "vramgate status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn reservations(status: &Value) -> Vec<String> {
    status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["reservations"].as_array().unwrap().iter())
        .map(|r| r["container_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn packages_install_gate_a_container_and_purge_clean() {
    require_tools();
    assert!(
        !installed(),
        "the vramgate package is already installed on this host; this test installs and purges it, so it \
         will not touch an existing install: `dpkg --purge vramgate` first, or run it on a scratch machine"
    );
    let binaries = expected_binaries();

    // 1. Build both packages from the binaries `cargo test` just built.
    run_ok(
        Command::new(root().join("scripts/package"))
            .arg("--no-build")
            .current_dir(root()),
    );
    let deb = newest(&root().join("target/debian"), "vramgate_", ".deb");
    let rpm = newest(&root().join("target/generate-rpm"), "vramgate-", ".rpm");

    // 2. The .rpm: its file list, config file and scriptlets.
    let files = run_ok(Command::new("rpm").arg("-qlp").arg(&rpm));
    let mut rpm_expected: Vec<String> = binaries.iter().map(|b| format!("/usr/bin/{b}")).collect();
    rpm_expected.extend(
        [
            "/etc/vramgate/config.toml",
            "/usr/share/containers/oci/hooks.d/vramgate-prestart.json",
            "/usr/share/containers/oci/hooks.d/vramgate-poststop.json",
            "/usr/lib/tmpfiles.d/vramgate.conf",
            "/usr/lib/systemd/system/vramgate-exporter.service",
            "/usr/lib/systemd/system/vramgate-device-plugin.service",
            "/usr/lib/systemd/system/vramgate-dra.service",
            "/usr/lib/systemd/system/vramgate-watch.service",
            "/usr/share/doc/vramgate/k8s/device-plugin.yaml",
            "/usr/share/doc/vramgate/k8s/dra.yaml",
            "/usr/share/doc/vramgate/k8s/dra-pod.yaml",
            "/usr/share/doc/vramgate/contrib/grafana/vramgate.json",
            "/usr/share/doc/vramgate/contrib/prometheus/vramgate-alerts.yml",
            "/usr/share/man/man8/vramgate.8.gz",
            "/usr/share/man/man8/vramgate-hook.8.gz",
            "/usr/share/man/man8/vramgate-runtime.8.gz",
            "/usr/share/man/man8/vramgate-device-plugin.8.gz",
            "/usr/share/man/man8/vramgate-dra.8.gz",
            "/usr/share/man/man5/vramgate.toml.5.gz",
            "/usr/share/bash-completion/completions/vramgate",
            "/usr/share/zsh/site-functions/_vramgate",
            "/usr/share/fish/vendor_completions.d/vramgate.fish",
            "/usr/share/doc/vramgate/README.md",
            "/usr/share/licenses/vramgate/LICENSE",
        ]
        .map(String::from),
    );
    for path in &rpm_expected {
        assert!(files.lines().any(|l| l == path), "the rpm lacks {path}:\n{files}");
    }
    // The manual's HTML: its pages and mdbook's assets, whatever mdbook version built them.
    for page in ["index.html", "reference.html", "replay.html"] {
        let path = format!("{BOOK}/{page}");
        assert!(files.lines().any(|l| l == path), "the rpm lacks {path}");
    }
    let unexpected: Vec<&str> = files
        .lines()
        .filter(|l| !rpm_expected.iter().any(|p| p == l) && !l.starts_with(&format!("{BOOK}/")))
        .collect();
    assert!(
        unexpected.is_empty(),
        "the rpm ships files nobody listed: {unexpected:?}"
    );
    let config_files = run_ok(Command::new("rpm").arg("-qcp").arg(&rpm));
    assert_eq!(config_files.trim(), "/etc/vramgate/config.toml");
    let scripts = run_ok(Command::new("rpm").args(["-qp", "--scripts"]).arg(&rpm));
    for (scriptlet, must_contain) in [
        (
            "postinstall scriptlet",
            "systemd-tmpfiles --create /usr/lib/tmpfiles.d/vramgate.conf",
        ),
        ("preuninstall scriptlet", "setup \"$engine\" --remove"),
        ("postuninstall scriptlet", "rm -rf /run/vramgate"),
    ] {
        let start = scripts
            .find(scriptlet)
            .unwrap_or_else(|| panic!("no {scriptlet}:\n{scripts}"));
        let body = &scripts[start..];
        // The next scriptlet's header ends this one's body.
        let header_end = body.find('\n').unwrap();
        let body = &body[..body[header_end..]
            .find("scriptlet")
            .map_or(body.len(), |n| header_end + n)];
        assert!(
            body.contains(must_contain),
            "{scriptlet} lacks {must_contain:?}:\n{body}"
        );
    }
    // Never restart, reload or signal an engine behind the admin's back.
    for word in ["systemctl", "service ", "kill ", "pkill", "invoke-rc.d"] {
        assert!(!scripts.contains(word), "a scriptlet runs {word:?}:\n{scripts}");
    }
    for (n, scriptlet) in ["post", "preun", "postun"].iter().enumerate() {
        let out = run(Command::new("sh")
            .arg("-n")
            .arg(root().join(format!("target/package/rpm/{scriptlet}.sh"))));
        assert!(out.status.success(), "scriptlet {n} is not valid sh");
    }

    // 3. The .deb: its control data says what dpkg will treat as the admin's.
    let conffiles = run_ok(Command::new("dpkg-deb").args(["-I"]).arg(&deb).arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/vramgate/config.toml");

    // 4. Install it.
    let mut cleanup = Cleanup { testbed: None };
    let install = run_ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(
        install.contains("no container engine was changed or restarted"),
        "{install}"
    );
    let listed = run_ok(Command::new("dpkg").args(["-L", PACKAGE]));
    let listed: Vec<PathBuf> = listed.lines().map(PathBuf::from).collect();
    for bin in &binaries {
        let path = PathBuf::from("/usr/bin").join(bin);
        assert!(listed.contains(&path), "the deb lacks {}", path.display());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{}", path.display());
    }
    for path in [
        "/etc/vramgate/config.toml",
        "/usr/lib/tmpfiles.d/vramgate.conf",
        "/usr/lib/systemd/system/vramgate-exporter.service",
        "/usr/lib/systemd/system/vramgate-device-plugin.service",
        "/usr/lib/systemd/system/vramgate-dra.service",
        "/usr/lib/systemd/system/vramgate-watch.service",
        "/usr/share/doc/vramgate/k8s/device-plugin.yaml",
        "/usr/share/doc/vramgate/k8s/dra.yaml",
        "/usr/share/doc/vramgate/k8s/dra-pod.yaml",
        "/usr/share/doc/vramgate/contrib/grafana/vramgate.json",
        "/usr/share/doc/vramgate/contrib/prometheus/vramgate-alerts.yml",
        "/usr/share/man/man8/vramgate.8.gz",
        "/usr/share/man/man8/vramgate-hook.8.gz",
        "/usr/share/man/man8/vramgate-runtime.8.gz",
        "/usr/share/man/man8/vramgate-device-plugin.8.gz",
        "/usr/share/man/man8/vramgate-dra.8.gz",
        "/usr/share/man/man5/vramgate.toml.5.gz",
        "/usr/share/bash-completion/completions/vramgate",
        "/usr/share/zsh/vendor-completions/_vramgate",
        "/usr/share/fish/vendor_completions.d/vramgate.fish",
        "/usr/share/doc/vramgate/copyright",
        &format!("{BOOK}/index.html"),
        &format!("{BOOK}/reference.html"),
    ] {
        assert!(Path::new(path).is_file(), "{path} was not installed");
    }
    let state = std::fs::metadata("/run/vramgate").expect("postinst created /run/vramgate");
    assert!(state.is_dir());
    assert_eq!(state.permissions().mode() & 0o777, 0o700);
    let version = run_ok(Command::new("/usr/bin/vramgate").arg("--version"));
    assert_eq!(version.trim(), format!("vramgate {}", env!("CARGO_PKG_VERSION")));
    let man = run_ok(
        Command::new("man")
            .args(["-P", "cat", "8", "vramgate"])
            .env("MANWIDTH", "80"),
    );
    assert!(man.contains("vramgate status"), "man 8 vramgate: {man}");
    // The exporter's, the device plugin's, the DRA driver's and the watch's units: valid for this
    // systemd, installed but not enabled.
    for unit in [
        "/usr/lib/systemd/system/vramgate-exporter.service",
        "/usr/lib/systemd/system/vramgate-device-plugin.service",
        "/usr/lib/systemd/system/vramgate-dra.service",
        "/usr/lib/systemd/system/vramgate-watch.service",
    ] {
        run_ok(Command::new("systemd-analyze").args(["verify", unit]));
    }
    let enabled: Vec<PathBuf> = std::fs::read_dir("/etc/systemd/system")
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_dir(e.ok()?.path()).ok())
        .flatten()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                [
                    "vramgate-exporter.service",
                    "vramgate-device-plugin.service",
                    "vramgate-dra.service",
                    "vramgate-watch.service",
                ]
                .iter()
                .any(|unit| n == *unit)
            })
        })
        .collect();
    assert!(enabled.is_empty(), "the package enabled a service: {enabled:?}");

    // 5. The installed tool works with the installed config.
    run_ok(
        Command::new("/usr/bin/vramgate")
            .arg("doctor")
            .env_remove("VRAMGATE_CONFIG"),
    );
    let status = installed_status();
    assert_eq!(status["state_dir"], "/run/vramgate");
    assert!(!status["gpus"].as_array().unwrap().is_empty(), "{status}");
    assert!(
        reservations(&status).is_empty(),
        "a fresh install holds reservations: {status}"
    );

    // 6. A real runc container through the installed hook, as hooks.d wires it.
    let scratch = tempfile::tempdir().unwrap();
    let testbed = Testbed::create(
        scratch.path(),
        "runc",
        Path::new("/usr/bin/vramgate-hook"),
        &Testbed::default_config(scratch.path(), ""),
    )
    .unwrap();
    let hooks = hooks_from_hooks_d();
    let bundle_with = |name: &str, memory: &str, args: &[&str]| {
        let bundle = testbed
            .bundle(
                name,
                args,
                &[("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")],
                &[],
                false,
            )
            .unwrap();
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["hooks"] = hooks.clone();
        std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        bundle
    };
    let admitted = bundle_with("admitted", "1Gi", &["sleep", "3"]);
    let refused = bundle_with("refused", "100Ti", &["true"]);
    cleanup.testbed = Some(testbed);
    let testbed = cleanup.testbed.as_ref().unwrap();

    let child = testbed
        .runc_run(&admitted, "vg-pkg-admitted")
        .env_remove("VRAMGATE_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if reservations(&installed_status()).contains(&"vg-pkg-admitted".to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the container never appeared in `vramgate status`"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        reservations(&installed_status()).is_empty(),
        "poststop did not release the reservation"
    );
    let out = run(testbed
        .runc_run(&refused, "vg-pkg-refused")
        .env_remove("VRAMGATE_CONFIG"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a 100Ti request started");
    assert!(
        stderr.contains("vramgate: refused container vg-pkg-refused"),
        "{stderr}"
    );
    let events = std::fs::read_to_string("/run/vramgate/events.jsonl").unwrap();
    assert!(
        events.contains("vg-pkg-admitted") && events.contains("vg-pkg-refused"),
        "{events}"
    );
    testbed.cleanup_containers();

    // 7. Reinstall over an admin's edit: the conffile and the state are kept, no next-step text.
    let config_path = Path::new("/etc/vramgate/config.toml");
    let edited = std::fs::read_to_string(config_path).unwrap() + "\npolicy = \"wait\"   # the admin's edit\n";
    std::fs::write(config_path, &edited).unwrap();
    let reinstall = run_ok(Command::new("dpkg").args(["-i", "--force-confold"]).arg(&deb));
    assert!(
        !reinstall.contains("next, "),
        "an upgrade repeats the first-install text: {reinstall}"
    );
    assert_eq!(std::fs::read_to_string(config_path).unwrap(), edited);
    assert!(
        Path::new("/run/vramgate/ledger.json").exists(),
        "an upgrade dropped the ledger"
    );

    // 8. Remove: binaries, hooks.d entries and state go; the admin's config stays.
    let remove = run_ok(Command::new("dpkg").args(["-r", PACKAGE]));
    for bin in &binaries {
        assert!(!Path::new("/usr/bin").join(bin).exists(), "{bin} survived dpkg -r");
    }
    assert!(!Path::new(HOOKS_D).join("vramgate-prestart.json").exists());
    assert!(
        !Path::new("/run/vramgate").exists(),
        "dpkg -r left the reservation state"
    );
    assert!(
        config_path.exists(),
        "dpkg -r removed the admin's config (only purge may)"
    );
    assert!(!remove.contains("still refers to a vramgate binary"), "{remove}");

    // 9. Purge: nothing of the package is left.
    run_ok(Command::new("dpkg").args(["--purge", PACKAGE]));
    assert!(!installed());
    assert!(!Path::new("/etc/vramgate").exists(), "purge left /etc/vramgate");
    assert!(!Path::new("/run/vramgate").exists());
    let left: Vec<&PathBuf> = listed
        .iter()
        .filter(|p| p.starts_with("/usr/share/doc/vramgate") || !p.is_dir())
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "purge left {left:?}");
}
