//! The distro packages, end to end: build the .deb and the .rpm with `scripts/package`,
//! install the .deb with dpkg on this host, run the installed tools and a real runc container
//! through the installed hook and hooks.d entries, reinstall over an admin's edit, then remove
//! and purge and check that nothing is left. The .rpm is checked with `rpm -qlp` and
//! `rpm -qp --scripts` (Debian's rpm cannot install it).
//!
//! The upgrade from the previous release (`PREVIOUS_RELEASE`, built from its own source) to this
//! one: with its exporter running under a stand-in `systemctl` (tests/support/systemctl) and a
//! container waiting in the queue, `dpkg -i` of this package restarts the exporter onto the new
//! binary, and the old hook still waiting keeps reading the ledger.
//!
//! These change the host (/usr/bin, /etc/vramgate, /run/vramgate, the exporter unit's port
//! 9835) and write target/debian, target/package and target/generate-rpm: each test's steps
//! run in order, the tests run one at a time (`DPKG` within this binary, the host-wide flock
//! `packages` against other binaries: tests/it/node_image.rs packages too), and a guard purges
//! the package even when a step fails. A missing tool
//! fails it with the one line that says what to install (`scripts/test` installs them all):
//! a skip would report `ok` for packages nobody built.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vramgate_testbed::Testbed;

use crate::support;

const PACKAGE: &str = "vramgate";

/// dpkg installs on this host: one test at a time.
static DPKG: Mutex<()> = Mutex::new(());

/// A test's turn at the host: this binary's other test waits on `DPKG`, other test binaries on
/// the host-wide flock `packages`. dpkg installs into /usr, /etc and /run, which no test can
/// make private, and `scripts/package` rewrites target/debian and target/package (which
/// tests/it/node_image.rs packages from too): a flock, since a Mutex holds within one process.
struct Turn {
    _host: nix::fcntl::Flock<std::fs::File>,
    _dpkg: MutexGuard<'static, ()>,
}

fn dpkg_turn() -> Turn {
    // A test that failed holding it has purged the package (its guard), so the next may go.
    let dpkg = DPKG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    Turn {
        _host: support::host_lock("packages"),
        _dpkg: dpkg,
    }
}
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

/// A runc testbed in `dir` whose hooks are the installed `/usr/bin/vramgate-hook`, with the
/// default config of a host under `state_base`.
fn installed_hook_testbed(dir: &Path, state_base: &Path) -> Testbed {
    let config = Testbed::default_config(state_base, "");
    Testbed::create(dir, "runc", Path::new("/usr/bin/vramgate-hook"), &config).unwrap()
}

/// What both packages install at the same path (besides the binaries and the manual).
const PACKAGED: &[&str] = &[
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
];

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
fn require_not_installed() {
    assert!(
        !installed(),
        "the vramgate package is already installed on this host; this test installs and purges it, so it \
         will not touch an existing install: `dpkg --purge vramgate` first, or run it on a scratch machine"
    );
}

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
            vramgate_testbed::which(tool).is_some(),
            "{tool} is not installed: {hint} (scripts/install-deps installs it)"
        );
    }
}

/// Purges the package, stops what the stand-in systemctl started and removes the test's
/// containers however the test ends.
struct Cleanup {
    testbed: Option<Testbed>,
    stand_in: Option<StandIn>,
}

/// The test's `runc run` processes, killed however the test ends (before [`Cleanup`] runs).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(testbed) = &self.testbed {
            testbed.cleanup_containers();
        }
        if let Some(stand_in) = &self.stand_in {
            let _ = stand_in
                .systemctl(&["stop"])
                .args(SERVICES)
                .stderr(Stdio::null())
                .status();
        }
        if installed() || Path::new("/var/lib/dpkg/info/vramgate.list").exists() {
            let _ = Command::new("dpkg")
                .args(["--purge", PACKAGE])
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// Builds this tree's .deb and .rpm from the binaries `cargo test` just built
/// (`scripts/package --no-build`), into target/debian and target/generate-rpm.
fn package_built_binaries() {
    run_ok(
        Command::new(root().join("scripts/package"))
            .arg("--no-build")
            .current_dir(root()),
    );
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

/// A bundle running `args` with `annotations`, whose hooks are `hooks` (what the installed
/// hooks.d entries give the engine), as an engine would hand it to runc.
fn bundle_with_hooks(
    testbed: &Testbed,
    name: &str,
    args: &[&str],
    annotations: &[(&str, &str)],
    hooks: &Value,
) -> PathBuf {
    let bundle = testbed.bundle(name, args, annotations, &[], false).unwrap();
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["hooks"] = hooks.clone();
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    bundle
}

/// [`bundle_with_hooks`] for a container asking `memory` on GPU 0, with the annotations `more`
/// after those two.
fn gpu_bundle(
    testbed: &Testbed,
    hooks: &Value,
    name: &str,
    memory: &str,
    args: &[&str],
    more: &[(&str, &str)],
) -> PathBuf {
    let mut annotations = vec![("vramgate.dev/memory", memory), ("vramgate.dev/gpus", "0")];
    annotations.extend_from_slice(more);
    bundle_with_hooks(testbed, name, args, &annotations, hooks)
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
    let _turn = dpkg_turn();
    require_tools();
    require_not_installed();
    let binaries = expected_binaries();

    // 1. Build both packages from the binaries `cargo test` just built.
    package_built_binaries();
    let deb = newest(&root().join("target/debian"), "vramgate_", ".deb");
    let rpm = newest(&root().join("target/generate-rpm"), "vramgate-", ".rpm");

    // 2. The .rpm: its file list, config file and scriptlets.
    let files = run_ok(Command::new("rpm").arg("-qlp").arg(&rpm));
    let mut rpm_expected: Vec<String> = binaries.iter().map(|b| format!("/usr/bin/{b}")).collect();
    rpm_expected.extend(
        [
            "/usr/share/containers/oci/hooks.d/vramgate-prestart.json",
            "/usr/share/containers/oci/hooks.d/vramgate-poststop.json",
            "/usr/share/zsh/site-functions/_vramgate",
            "/usr/share/fish/vendor_completions.d/vramgate.fish",
            "/usr/share/doc/vramgate/README.md",
            "/usr/share/licenses/vramgate/LICENSE",
        ]
        .map(String::from),
    );
    rpm_expected.extend(PACKAGED.iter().map(|p| p.to_string()));
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
    // Never restart, reload or signal an engine behind the admin's back: systemctl only ever
    // names vramgate's own units (through $SERVICES) or reloads unit files.
    for word in ["kill ", "pkill", "invoke-rc.d"] {
        assert!(!scripts.contains(word), "a scriptlet runs {word:?}:\n{scripts}");
    }
    // `service <name> restart`, not the `.service ` of a unit's name.
    assert!(
        !scripts
            .lines()
            .any(|l| l.trim_start().starts_with("service ") || l.contains(" service ")),
        "a scriptlet runs service:\n{scripts}"
    );
    for line in scripts
        .lines()
        .filter(|l| l.contains("systemctl ") && !l.trim_start().starts_with('#'))
    {
        let line = line.trim();
        assert!(
            line.contains("systemctl daemon-reload")
                || line.contains("systemctl try-restart \"$unit\"")
                || line.contains("systemctl restart $unit)"),
            "a scriptlet runs systemctl on something else: {line}"
        );
    }
    assert!(
        scripts.contains(&format!("SERVICES=\"{}\"", SERVICES.join(" "))),
        "{scripts}"
    );
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
    let mut cleanup = Cleanup {
        testbed: None,
        stand_in: None,
    };
    let install = run_ok(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(
        install.contains("no container engine was changed or restarted"),
        "{install}"
    );
    // The installed binaries are the ones this test run built (stripped: the build id stays),
    // not whatever else target/release held; and so are those the rpm was made from.
    support::assert_built_here(Path::new("/usr/bin"), &binaries);
    support::assert_built_here(&root().join("target/package/bin"), &binaries);
    let listed = run_ok(Command::new("dpkg").args(["-L", PACKAGE]));
    let listed: Vec<PathBuf> = listed.lines().map(PathBuf::from).collect();
    for bin in &binaries {
        let path = PathBuf::from("/usr/bin").join(bin);
        assert!(listed.contains(&path), "the deb lacks {}", path.display());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{}", path.display());
    }
    for path in PACKAGED.iter().copied().chain([
        "/usr/share/zsh/vendor-completions/_vramgate",
        "/usr/share/fish/vendor_completions.d/vramgate.fish",
        "/usr/share/doc/vramgate/copyright",
        &format!("{BOOK}/index.html"),
        &format!("{BOOK}/reference.html"),
    ]) {
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
    let testbed = installed_hook_testbed(scratch.path(), scratch.path());
    let hooks = hooks_from_hooks_d();
    let bundle_with = |name: &str, memory: &str, args: &[&str]| gpu_bundle(&testbed, &hooks, name, memory, args, &[]);
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

/// The last release whose ledger readers refuse fields they do not know (`deny_unknown_fields`
/// on the ledger, its reservations and tickets). There are no release tags: a release is a
/// commit that landed.
const PREVIOUS_RELEASE: &str = "ed7e56d";
/// vramgate's long-running units, which the package restarts on upgrade when they run.
const SERVICES: &[&str] = &[
    "vramgate-exporter.service",
    "vramgate-device-plugin.service",
    "vramgate-dra.service",
    "vramgate-watch.service",
];
/// Where the packaged exporter unit listens.
const EXPORTER: &str = "127.0.0.1:9835";

/// The .deb of `PREVIOUS_RELEASE`, built by its own `scripts/package` from `git archive` of
/// it, in target/upgrade-old/<commit>/ with its own target directory (seeded with hard links
/// to this tree's compiled dependencies, so those it shares are not compiled again). Kept
/// there: a rerun reuses it.
fn previous_release_deb() -> PathBuf {
    let commit = Command::new("git")
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{PREVIOUS_RELEASE}^{{commit}}"))
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run git: {e}"));
    assert!(
        commit.status.success(),
        "commit {PREVIOUS_RELEASE} (the previous release, whose package the upgrade test builds) is not in this \
         clone: a shallow clone lacks it; run `git fetch --unshallow` (.ci/run does)"
    );
    let commit = String::from_utf8_lossy(&commit.stdout).trim().to_string();
    let dir = root().join("target/upgrade-old").join(&commit);
    let deb = dir.join(format!("vramgate-{commit}.deb"));
    if deb.is_file() {
        return deb;
    }
    let src = dir.join("src");
    let target = dir.join("target");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    run_ok(
        Command::new("sh")
            .arg("-c")
            .arg("git archive \"$1\" | tar -x -C \"$2\"")
            .args(["sh", &commit])
            .arg(&src)
            .current_dir(root()),
    );
    if !target.join("release/deps").exists() {
        std::fs::create_dir_all(target.join("release")).unwrap();
        let ours = root().join("target/release");
        run_ok(
            Command::new("cp")
                .arg("-al")
                .args(["deps", "build", ".fingerprint"].map(|d| ours.join(d)))
                .arg(target.join("release")),
        );
    }
    // Its scripts/package reads target/ beside its source.
    std::os::unix::fs::symlink("../target", src.join("target")).unwrap();
    let started = Instant::now();
    run_ok(
        Command::new(src.join("scripts/package"))
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", &target),
    );
    eprintln!(
        "built the {PREVIOUS_RELEASE} package in {:.0?} (cached in {})",
        started.elapsed(),
        dir.display()
    );
    let built = std::fs::read_dir(target.join("debian"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("the previous release's scripts/package built no .deb");
    std::fs::copy(built, &deb).unwrap();
    deb
}

/// tests/support/systemctl, first on PATH, with its own state directory.
struct StandIn {
    bin: PathBuf,
    state: PathBuf,
}

impl StandIn {
    fn new(dir: &Path) -> StandIn {
        let bin = dir.join("bin");
        let state = dir.join("systemd-state");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(root().join("tests/support/systemctl"), bin.join("systemctl")).unwrap();
        StandIn { bin, state }
    }

    fn path(&self) -> String {
        format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin.display()
        )
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("PATH", self.path()).env("STANDIN_SYSTEMCTL_DIR", &self.state);
    }

    fn systemctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin.join("systemctl"));
        cmd.args(args);
        self.env(&mut cmd);
        cmd
    }

    fn main_pid(&self, unit: &str) -> u32 {
        let out = run_ok(self.systemctl(&["show", "-p", "MainPID", unit]).stderr(Stdio::null()));
        out.trim().trim_start_matches("MainPID=").parse().unwrap()
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.state.join("calls")).unwrap_or_default()
    }

    fn log(&self, unit: &str) -> String {
        std::fs::read_to_string(self.state.join(format!("{unit}.log"))).unwrap_or_default()
    }
}

/// Asserts that process `pid` runs in the sandbox its unit asks (the exporter's: root,
/// `CapabilityBoundingSet=CAP_SYS_PTRACE`, `NoNewPrivileges=yes`, `ProtectSystem=strict`):
/// what the stand-in systemctl set up, read back from /proc as the kernel holds it.
fn assert_sandboxed(pid: u32, what: &str) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
            .trim()
            .to_string()
    };
    let ptrace = format!("{:016x}", 1u64 << 19); // CAP_SYS_PTRACE
    assert_eq!(field("NoNewPrivs"), "1", "{what}: no_new_privs\n{status}");
    assert_eq!(field("CapBnd"), ptrace, "{what}: the bounding set\n{status}");
    assert_eq!(field("CapAmb"), "0000000000000000", "{what}: ambient\n{status}");
    let effective = u64::from_str_radix(&field("CapEff"), 16).unwrap();
    assert_eq!(
        effective & !(1u64 << 19),
        0,
        "{what}: effective beyond the bounding set\n{status}"
    );
    // ProtectSystem=strict: every mount it sees read-only but /dev, /proc and /sys.
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    for point in ["/", "/usr", "/etc", "/run"] {
        let options = mounts
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(point))
            .last()
            .map(|l| l.split(' ').nth(5).unwrap().to_string());
        if let Some(options) = options {
            assert!(
                options.split(',').any(|o| o == "ro"),
                "{what}: {point} is writable to it ({options})\n{mounts}"
            );
        } else {
            assert_ne!(point, "/", "{what}: no root mount\n{mounts}");
        }
    }
}

/// `GET /metrics` of the packaged exporter: the status line and the body.
fn scrape() -> std::io::Result<(String, String)> {
    let mut stream = std::net::TcpStream::connect_timeout(&EXPORTER.parse().unwrap(), Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

/// A scrape that answered 200 with no corrupt-ledger error (the exporter answers a ledger it
/// calls corrupt with a 500 naming it, which Prometheus records as the target down:
/// VramgateExporterDown).
fn healthy_scrape(what: &str) -> String {
    let (status, body) = scrape().unwrap_or_else(|e| panic!("{what}: the exporter at {EXPORTER} did not answer: {e}"));
    assert!(
        status.contains(" 200 ") && !body.contains("corrupt"),
        "{what}: the exporter answered {status}: {body}"
    );
    body
}

fn queue_length(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("vramgate_queue_length{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The installed ledger, read as a file (no vramgate parses it here).
fn ledger_json() -> Value {
    let bytes = std::fs::read("/run/vramgate/ledger.json").unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn waiting(ledger: &Value) -> Vec<(String, u32)> {
    ledger["queue"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["container_id"].as_str().unwrap().to_string(),
                t["waiter"]["pid"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An upgrade from the previous release while its exporter runs and one of its hooks waits in
/// the queue: the package restarts the exporter onto the new binary, the exporter never calls
/// the ledger corrupt, the old waiter keeps waiting through a container the new hook queues
/// beside it, and is admitted when the container in front of it stops.
#[test]
fn an_upgrade_restarts_the_exporter_and_the_old_waiter_keeps_its_place() {
    let _turn = dpkg_turn();
    require_tools();
    for tool in ["unshare", "git", "tar"] {
        assert!(vramgate_testbed::which(tool).is_some(), "{tool} is not installed");
    }
    require_not_installed();
    assert!(
        scrape().is_err(),
        "something already listens on {EXPORTER}, where the packaged exporter will"
    );
    let old_deb = previous_release_deb();
    package_built_binaries();
    let new_deb = newest(&root().join("target/debian"), "vramgate_", ".deb");

    let scratch = tempfile::tempdir().unwrap();
    let mut cleanup = Cleanup {
        testbed: None,
        stand_in: Some(StandIn::new(scratch.path())),
    };
    let mut children = Children(Vec::new());
    // 1. The previous release, its exporter started as systemd would.
    run_ok(Command::new("dpkg").arg("-i").arg(&old_deb));
    let stand_in = cleanup.stand_in.as_ref().unwrap();
    run_ok(&mut stand_in.systemctl(&["start", "vramgate-exporter"]));
    wait_for("the old exporter answering", Duration::from_secs(20), || {
        scrape().is_ok()
    });
    let old_exporter = stand_in.main_pid("vramgate-exporter.service");
    assert_ne!(old_exporter, 0, "{}", stand_in.log("vramgate-exporter.service"));
    assert_sandboxed(old_exporter, "the old exporter");
    healthy_scrape("the old exporter");

    // 2. Through the old installed hook (hooks.d, as podman and CRI-O run it) and real runc: a
    // container that fills the simulated GPU (24,265 MiB), and one that waits behind it.
    let testbed = installed_hook_testbed(&scratch.path().join("bed"), scratch.path());
    let hooks = hooks_from_hooks_d();
    let bundle_with = |name: &str, memory: &str, args: &[&str]| {
        let wait = [("vramgate.dev/policy", "wait"), ("vramgate.dev/timeout", "5m")];
        gpu_bundle(&testbed, &hooks, name, memory, args, &wait)
    };
    let filler = bundle_with("filler", "20Gi", &["sleep", "600"]);
    let old_waiter = bundle_with("old-waiter", "10Gi", &["true"]);
    let new_waiter = bundle_with("new-waiter", "10Gi", &["true"]);
    cleanup.testbed = Some(testbed);
    let testbed = cleanup.testbed.as_ref().unwrap();
    let mut start = |bundle: &Path, id: &str| {
        let child = testbed
            .runc_run(bundle, id)
            .env_remove("VRAMGATE_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        children.0.push(child);
        children.0.len() - 1
    };
    let filler_child = start(&filler, "vg-up-filler");
    wait_for("the filler's reservation", Duration::from_secs(20), || {
        ledger_json()["reservations"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["container_id"] == "vg-up-filler"))
    });
    let old_child = start(&old_waiter, "vg-up-old");
    wait_for("the old hook's ticket", Duration::from_secs(20), || {
        waiting(&ledger_json()).iter().any(|(id, _)| id == "vg-up-old")
    });
    let old_hook = waiting(&ledger_json())
        .into_iter()
        .find(|(id, _)| id == "vg-up-old")
        .unwrap()
        .1;
    assert_eq!(queue_length(&healthy_scrape("the old exporter, one waiting")), 1);

    // 3. The upgrade, where the postinst sees systemd (a private /run/systemd/system) and runs
    // the stand-in systemctl.
    let mut upgrade = Command::new("unshare");
    upgrade
        .args(["--mount", "--propagation", "private", "sh", "-ec"])
        .arg("mount -t tmpfs -o mode=0755 vramgate-test /run/systemd; mkdir /run/systemd/system; exec dpkg -i \"$1\"")
        .arg("sh")
        .arg(&new_deb);
    stand_in.env(&mut upgrade);
    let upgraded = run_ok(&mut upgrade);
    let version = run_ok(Command::new("/usr/bin/vramgate").arg("--version"));
    assert_eq!(version.trim(), format!("vramgate {}", env!("CARGO_PKG_VERSION")));
    support::assert_built_here(Path::new("/usr/bin"), &expected_binaries());

    // The exporter was restarted onto the new binary, after the unit files were reloaded; the
    // units that were not running stay stopped.
    let calls = stand_in.calls();
    let reload = calls
        .find("daemon-reload")
        .unwrap_or_else(|| panic!("no daemon-reload: {calls}\n{upgraded}"));
    let restart = calls
        .find("try-restart vramgate-exporter.service")
        .unwrap_or_else(|| panic!("the exporter was not try-restarted: {calls}\n{upgraded}"));
    assert!(reload < restart, "{calls}");
    let new_exporter = stand_in.main_pid("vramgate-exporter.service");
    assert!(
        new_exporter != 0 && new_exporter != old_exporter,
        "the exporter still runs as pid {old_exporter}: {calls}\n{upgraded}"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{new_exporter}/exe")).unwrap(),
        Path::new("/usr/bin/vramgate"),
        "the restarted exporter runs the new binary"
    );
    for unit in &SERVICES[1..] {
        assert_eq!(stand_in.main_pid(unit), 0, "{unit} was started by the upgrade");
    }
    wait_for("the new exporter answering", Duration::from_secs(20), || {
        scrape().is_ok()
    });
    let metrics = healthy_scrape("the new exporter");
    assert_sandboxed(new_exporter, "the new exporter");
    assert_eq!(queue_length(&metrics), 1, "{metrics}");
    let status = installed_status();
    assert!(
        status.to_string().contains("vg-up-old"),
        "the queue lost the old waiter: {status}"
    );
    // The old hook still waits, and runs the binary dpkg replaced.
    let exe = std::fs::read_link(format!("/proc/{old_hook}/exe")).unwrap();
    assert!(
        exe.to_string_lossy().ends_with(" (deleted)"),
        "the waiter is not the old hook: {}",
        exe.display()
    );

    // 4. A container queued through the new hook beside the old waiter.
    let new_child = start(&new_waiter, "vg-up-new");
    wait_for("the new hook's ticket", Duration::from_secs(20), || {
        waiting(&ledger_json()).iter().any(|(id, _)| id == "vg-up-new")
    });
    // The old waiter re-reads the ledger when it changes (and at least every poll interval,
    // 1 s): give it two to have read this one.
    std::thread::sleep(Duration::from_secs(2));
    for (child, id) in [(old_child, "vg-up-old"), (new_child, "vg-up-new")] {
        if let Some(status) = children.0[child].try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = children.0[child].stderr.take().unwrap().read_to_string(&mut stderr);
            panic!("{id} stopped waiting ({status}): {stderr}");
        }
    }
    let metrics = healthy_scrape("the new exporter, an old and a new waiter");
    assert_eq!(queue_length(&metrics), 2, "{metrics}");

    // 5. The filler stops: both waiters are admitted, run and end well.
    run_ok(&mut testbed.runc(&["kill", "vg-up-filler", "KILL"]));
    let _ = children.0[filler_child].wait();
    for (child, id) in [(old_child, "vg-up-old"), (new_child, "vg-up-new")] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = children.0[child].try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{id} was never admitted");
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut stderr = String::new();
        let _ = children.0[child].stderr.take().unwrap().read_to_string(&mut stderr);
        assert!(status.success(), "{id}: {status}: {stderr}");
    }
    let events = std::fs::read_to_string("/run/vramgate/events.jsonl").unwrap();
    assert!(events.contains("vg-up-old") && events.contains("vg-up-new"), "{events}");
    let metrics = healthy_scrape("the new exporter, after both waits");
    assert_eq!(queue_length(&metrics), 0, "{metrics}");
    for unit in ["vramgate-exporter.service"] {
        let log = stand_in.log(unit);
        assert!(!log.contains("corrupt"), "{unit} logged: {log}");
    }
}
