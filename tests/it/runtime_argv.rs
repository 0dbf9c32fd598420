//! `vramgate-runtime` against a fake next runtime: a script first on PATH that records, byte
//! for byte, the argv it was exec'd with. Every verb must reach it unchanged; `create` must
//! add the vramgate hooks to the bundle's spec only when the spec requests VRAM, in every form
//! runc accepts the bundle flag.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use vramgate_testbed::Testbed;

const WRAPPER: &str = env!("CARGO_BIN_EXE_vramgate-runtime");
const HOOK: &str = env!("CARGO_BIN_EXE_vramgate-hook");

/// Records argv[1..] NUL-separated, and exits with $FAKE_EXIT.
const FAKE_RUNTIME: &str = "#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$FAKE_RECORD\"\nexit \"${FAKE_EXIT:-0}\"\n";

struct Bench {
    dir: tempfile::TempDir,
    bin: PathBuf,
    config: PathBuf,
    record: PathBuf,
}

impl Bench {
    fn new(config_toml: &str) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        // `fake-runc` is what the config names; `runc` is what the defaults fall back to.
        for name in ["fake-runc", "runc"] {
            let path = bin.join(name);
            std::fs::write(&path, FAKE_RUNTIME).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let config = dir.path().join("config.toml");
        std::fs::write(&config, Testbed::default_config(dir.path(), config_toml)).unwrap();
        let record = dir.path().join("argv");
        Bench {
            dir,
            bin,
            config,
            record,
        }
    }

    fn standard() -> Bench {
        Bench::new("[runtime]\nruntimes = [\"no-such-runtime-here\", \"fake-runc\"]")
    }

    fn wrapper(&self, args: &[OsString], cwd: &Path) -> Command {
        let _ = std::fs::remove_file(&self.record);
        let mut cmd = Command::new(WRAPPER);
        cmd.args(args)
            .current_dir(cwd)
            .env("PATH", format!("{}:/usr/bin:/bin", self.bin.display()))
            .env("VRAMGATE_CONFIG", &self.config)
            .env("FAKE_RECORD", &self.record);
        cmd
    }

    fn run(&self, args: &[OsString], cwd: &Path) -> Output {
        self.wrapper(args, cwd).output().unwrap()
    }

    /// What the fake runtime received, or `None` when it never ran.
    fn recorded(&self) -> Option<Vec<OsString>> {
        let bytes = std::fs::read(&self.record).ok()?;
        let mut args: Vec<OsString> = bytes
            .split(|&b| b == 0)
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect();
        assert_eq!(args.pop(), Some(OsString::new()), "every record ends with a NUL");
        Some(args)
    }

    /// A bundle whose spec is `spec` written compactly, with mode 0640.
    fn bundle(&self, name: &str, spec: &Value) -> PathBuf {
        let bundle = self.dir.path().join(name);
        std::fs::create_dir_all(&bundle).unwrap();
        let path = bundle.join("config.json");
        std::fs::write(&path, serde_json::to_vec(spec).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        bundle
    }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn assert_quiet_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "{what}: the wrapper printed something: {:?} {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A spec as engines write it: fields vramgate knows nothing about, in no sorted order.
fn spec_with(annotations: Value, env: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["sleep", "1"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "hostname": "x",
        "zzUnknownFutureField": {"nested": [1, 2.5, "three", null], "big": 18446744073709551615u64},
        "annotations": annotations,
        "linux": {"namespaces": [{"type": "pid"}], "resources": {"memory": {"limit": 9223372036854775807i64}}},
        "aaAlsoUnknown": true
    })
}

fn request_spec() -> Value {
    spec_with(
        json!({"vramgate.dev/memory": "1Gi", "org.example/other": "kept"}),
        &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"],
    )
}

/// The spec minus what the wrapper adds (the `hooks`; by default the framework guardrails'
/// variables appended to `process.env` and the tier in the annotation `vramgate.dev/enforcement`)
/// must be exactly what was there, keys in order.
fn assert_only_hooks_added(before: &Value, after_bytes: &[u8], bench: &Bench) {
    let mut after: Value = serde_json::from_slice(after_bytes).unwrap();
    let hooks = after
        .as_object_mut()
        .unwrap()
        .shift_remove("hooks")
        .expect("hooks were added");
    let tier = after["annotations"]
        .as_object_mut()
        .unwrap()
        .shift_remove("vramgate.dev/enforcement")
        .expect("the tier is recorded for the hook");
    assert_eq!(tier, "guardrails");
    let env = after["process"]["env"].as_array_mut().unwrap();
    let guardrails: Vec<String> = env
        .iter()
        .filter_map(Value::as_str)
        .filter(|e| e.starts_with("TF_FORCE_GPU_ALLOW_GROWTH=") || e.starts_with("XLA_"))
        .map(str::to_string)
        .collect();
    assert_eq!(guardrails.len(), 4, "{guardrails:?}");
    assert!(guardrails.contains(&"TF_FORCE_GPU_ALLOW_GROWTH=true".to_string()));
    env.retain(|e| !guardrails.iter().any(|g| e.as_str() == Some(g.as_str())));
    assert_eq!(
        serde_json::to_string(&after).unwrap(),
        serde_json::to_string(before).unwrap(),
        "fields other than hooks changed"
    );
    let hook = Path::new(HOOK).canonicalize().unwrap();
    for stage in ["createRuntime", "poststop"] {
        let entries = hooks[stage].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{stage}: {hooks}");
        let e = &entries[0];
        assert_eq!(Path::new(e["path"].as_str().unwrap()).canonicalize().unwrap(), hook);
        // Default max_wait_timeout (1h) + 60 s.
        assert_eq!(
            e["args"],
            json!(["vramgate-hook", stage, "--hook-timeout", "3660"]),
            "{stage}"
        );
        assert_eq!(e["timeout"], 3660);
        assert_eq!(e["env"], json!([format!("VRAMGATE_CONFIG={}", bench.config.display())]));
    }
}

#[test]
fn pass_through_verbs_are_byte_identical() {
    let bench = Bench::standard();
    let non_utf8 = OsString::from_vec(b"id-\xff\xfe-\x01".to_vec());
    let cases: Vec<Vec<OsString>> = vec![
        os(&["features"]),
        os(&["--version"]),
        os(&["-v"]),
        os(&["state", "abc"]),
        os(&[
            "--root",
            "/run/docker/runtime-runc/moby",
            "--log",
            "/x/log.json",
            "--log-format",
            "json",
            "delete",
            "--force",
            "abc",
        ]),
        os(&["--root=/r", "--systemd-cgroup", "kill", "abc", "9"]),
        os(&["kill", "--all", "abc", "SIGKILL"]),
        os(&["--debug", "start", "abc"]),
        os(&["ps", "--format", "json", "abc"]),
        os(&["update", "--resources", "-", "abc"]),
        os(&[
            "exec",
            "--process",
            "/tmp/p.json",
            "--detach",
            "--pid-file",
            "/p",
            "abc",
        ]),
        os(&["state", " spaced arg ", "", "--", "-b", "create"]),
        vec![OsString::from("state"), non_utf8],
    ];
    for args in cases {
        let out = bench.run(&args, bench.dir.path());
        assert_quiet_success(&out, &format!("{args:?}"));
        assert_eq!(bench.recorded().as_ref(), Some(&args), "{args:?}");
    }
    // The next runtime's exit status is the wrapper's (it is the same process).
    let out = bench
        .wrapper(&os(&["delete", "gone"]), bench.dir.path())
        .env("FAKE_EXIT", "3")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn create_adds_hooks_in_every_bundle_flag_form() {
    let bench = Bench::standard();
    let spec = request_spec();
    let parent = bench.dir.path().to_path_buf();
    // (args with B for the bundle, cwd: None = the temp dir, Some = the bundle itself)
    let forms: &[(&[&str], bool)] = &[
        (&["create", "--bundle", "B", "id1"], false),
        (&["create", "--bundle=B", "id1"], false),
        (&["create", "-bundle", "B", "id1"], false),
        (&["create", "-bundle=B", "id1"], false),
        (&["create", "-b", "B", "id1"], false),
        (&["create", "-b=B", "id1"], false),
        (&["create", "id1", "--bundle", "B"], false),
        (
            &[
                "--root",
                "/run/r",
                "--log",
                "LOG",
                "--log-format",
                "json",
                "--systemd-cgroup",
                "create",
                "--pid-file",
                "/run/p.pid",
                "--console-socket",
                "/s.sock",
                "--bundle",
                "B",
                "id1",
            ],
            false,
        ),
        (
            &[
                "--rootless",
                "false",
                "--criu",
                "/usr/sbin/criu",
                "create",
                "-b",
                "B",
                "id1",
            ],
            false,
        ),
        // No bundle flag: the current directory.
        (&["create", "id1"], true),
        (&["--root", "/r", "create", "--pid-file", "/p", "id1"], true),
    ];
    for (n, (form, in_bundle)) in forms.iter().enumerate() {
        let bundle = bench.bundle(&format!("bundle{n}"), &spec);
        let log = bench.dir.path().join(format!("log{n}.json"));
        let args: Vec<OsString> = form
            .iter()
            .map(|a| match *a {
                "LOG" => log.clone().into_os_string(),
                "B" => bundle.clone().into_os_string(),
                _ => match a.strip_suffix("=B") {
                    Some(flag) => OsString::from(format!("{flag}={}", bundle.display())),
                    None => OsString::from(a),
                },
            })
            .collect();
        let cwd = if *in_bundle { bundle.clone() } else { parent.clone() };
        let out = bench.run(&args, &cwd);
        assert_quiet_success(&out, &format!("{form:?}"));
        assert_eq!(bench.recorded().as_ref(), Some(&args), "argv unchanged for {form:?}");
        let config = bundle.join("config.json");
        assert_only_hooks_added(&spec, &std::fs::read(&config).unwrap(), &bench);
        assert_eq!(std::fs::metadata(&config).unwrap().mode() & 0o7777, 0o640, "mode kept");
        assert!(!log.exists(), "nothing logged on success");
        // No temporary file left next to it.
        assert_eq!(std::fs::read_dir(&bundle).unwrap().count(), 1);
    }
}

/// A container that brings its own `vramgate.dev/enforcement` (a pod annotation, podman's
/// `--annotation`) does not choose the tier the hook records: the wrapper writes its own.
#[test]
fn a_tier_annotation_the_container_brought_is_replaced_by_the_wrappers() {
    let bench = Bench::standard();
    let spec = spec_with(
        json!({"vramgate.dev/memory": "1Gi", "vramgate.dev/enforcement": "driver_limit"}),
        &["NVIDIA_VISIBLE_DEVICES=0"],
    );
    let bundle = bench.bundle("forged-tier", &spec);
    let args = os(&["create", "--bundle", bundle.to_str().unwrap(), "forged-tier"]);
    assert_quiet_success(&bench.run(&args, bench.dir.path()), "create");
    let after: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(after["annotations"]["vramgate.dev/enforcement"], "guardrails");
}

#[test]
fn a_symlinked_bundle_is_followed_as_runc_follows_it() {
    let bench = Bench::standard();
    let spec = request_spec();
    let real = bench.bundle("real-bundle", &spec);
    let link = bench.dir.path().join("link-bundle");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let args = vec![
        OsString::from("create"),
        OsString::from("--bundle"),
        link.clone().into_os_string(),
        OsString::from("id"),
    ];
    assert_quiet_success(&bench.run(&args, bench.dir.path()), "create through a symlink");
    assert_eq!(bench.recorded().as_ref(), Some(&args));
    assert_only_hooks_added(&spec, &std::fs::read(real.join("config.json")).unwrap(), &bench);
    assert!(
        std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
        "the link stays"
    );
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 1, "no temporary file left");
}

#[test]
fn run_adds_hooks_like_create() {
    // `runc run` is `create` + `start` in one: a container started that way must be admitted.
    let bench = Bench::standard();
    let spec = request_spec();
    let forms: &[&[&str]] = &[
        &["run", "--bundle", "B", "id1"],
        &["run", "-d", "-b=B", "id1"],
        &[
            "--root",
            "/run/r",
            "--log",
            "/dev/null",
            "run",
            "--detach",
            "--pid-file",
            "/run/p.pid",
            "--console-socket",
            "/s.sock",
            "--preserve-fds",
            "1",
            "--no-subreaper",
            "--no-pivot",
            "--no-new-keyring",
            "--keep",
            "-bundle",
            "B",
            "id1",
        ],
    ];
    for (n, form) in forms.iter().enumerate() {
        let bundle = bench.bundle(&format!("run{n}"), &spec);
        let args: Vec<OsString> = form
            .iter()
            .map(|a| match *a {
                "B" => bundle.clone().into_os_string(),
                "-b=B" => OsString::from(format!("-b={}", bundle.display())),
                _ => OsString::from(a),
            })
            .collect();
        assert_quiet_success(&bench.run(&args, bench.dir.path()), &format!("{form:?}"));
        assert_eq!(bench.recorded().as_ref(), Some(&args), "argv unchanged for {form:?}");
        assert_only_hooks_added(&spec, &std::fs::read(bundle.join("config.json")).unwrap(), &bench);
    }
    // No bundle flag: the current directory, as for create.
    let bundle = bench.bundle("run-cwd", &spec);
    assert_quiet_success(&bench.run(&os(&["run", "id2"]), &bundle), "run in the bundle");
    assert_only_hooks_added(&spec, &std::fs::read(bundle.join("config.json")).unwrap(), &bench);
}

#[test]
fn a_bundle_named_create_is_not_the_verb() {
    let bench = Bench::standard();
    let spec = request_spec();
    bench.bundle("create", &spec);
    let cases: &[&[&str]] = &[
        &["create", "--bundle", "create", "create"],
        &["--root", "create", "create", "-b", "create", "id"],
        &["--log-format", "json", "create", "-b=create", "create"],
    ];
    for args in cases {
        bench.bundle("create", &spec);
        let args = os(args);
        let out = bench.run(&args, bench.dir.path());
        assert_quiet_success(&out, &format!("{args:?}"));
        assert_eq!(bench.recorded().as_ref(), Some(&args));
        assert_only_hooks_added(
            &spec,
            &std::fs::read(bench.dir.path().join("create/config.json")).unwrap(),
            &bench,
        );
    }
    // `state create` is a state query of a container named "create": nothing is touched.
    let before = std::fs::read(bench.dir.path().join("create/config.json")).unwrap();
    let args = os(&["state", "create"]);
    assert_quiet_success(&bench.run(&args, &bench.dir.path().join("create")), "state create");
    assert_eq!(
        std::fs::read(bench.dir.path().join("create/config.json")).unwrap(),
        before
    );
}

#[test]
fn no_request_leaves_the_spec_untouched() {
    let bench = Bench::standard();
    for (name, spec) in [
        (
            "plain",
            spec_with(
                json!({"org.example/x": "y"}),
                &["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"],
            ),
        ),
        // Other vramgate settings without a memory request are no request.
        (
            "policy-only",
            spec_with(json!({"vramgate.dev/policy": "wait"}), &["VRAMGATE_POLICY=wait"]),
        ),
    ] {
        let bundle = bench.bundle(name, &spec);
        let config = bundle.join("config.json");
        let before = std::fs::read(&config).unwrap();
        let meta = std::fs::metadata(&config).unwrap();
        // A coarse-mtime filesystem could hide a rewrite; the inode cannot.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let args = vec![
            OsString::from("create"),
            OsString::from("--bundle"),
            bundle.clone().into_os_string(),
            OsString::from("c"),
        ];
        assert_quiet_success(&bench.run(&args, bench.dir.path()), name);
        assert_eq!(bench.recorded().as_ref(), Some(&args));
        let after = std::fs::metadata(&config).unwrap();
        assert_eq!(std::fs::read(&config).unwrap(), before, "{name}: bytes");
        assert_eq!(
            (after.ino(), after.mtime(), after.mtime_nsec()),
            (meta.ino(), meta.mtime(), meta.mtime_nsec()),
            "{name}: not rewritten"
        );
    }
}

#[test]
fn env_request_pretty_spec_and_idempotence() {
    let bench = Bench::new("max_wait_timeout = \"10m\"\nwait_timeout = \"1m\"\n[runtime]\nruntimes = [\"fake-runc\"]\nhook_path = \"/opt/vramgate/vramgate-hook\"");
    let spec = spec_with(
        json!({}),
        &["PATH=/bin", "VRAMGATE_MEMORY=512Mi", "NVIDIA_VISIBLE_DEVICES=0"],
    );
    let bundle = bench.dir.path().join("b");
    std::fs::create_dir(&bundle).unwrap();
    // `runc spec` writes indented JSON; the rewrite keeps it indented.
    std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let args = vec![
        OsString::from("create"),
        OsString::from("-b"),
        bundle.clone().into_os_string(),
        OsString::from("c"),
    ];
    for _ in 0..3 {
        assert_quiet_success(&bench.run(&args, bench.dir.path()), "create");
    }
    let text = std::fs::read_to_string(bundle.join("config.json")).unwrap();
    assert!(text.starts_with("{\n  \"ociVersion\""), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    for stage in ["createRuntime", "poststop"] {
        let entries = v["hooks"][stage].as_array().unwrap();
        assert_eq!(entries.len(), 1, "added once over three creates");
        assert_eq!(entries[0]["path"], "/opt/vramgate/vramgate-hook");
        assert_eq!(entries[0]["timeout"], 660, "10 min max wait + 60 s");
        assert_eq!(entries[0]["args"][3], "660");
    }
}

#[test]
fn vramgate_releases_before_the_specs_own_poststop_hooks() {
    // runc stops at the first failing poststop hook: a failing user hook placed before
    // vramgate's would skip the release and keep the memory reserved.
    let bench = Bench::standard();
    let mut spec = request_spec();
    spec["hooks"] = json!({
        "createRuntime": [{"path": "/usr/bin/user-create"}],
        "poststop": [{"path": "/usr/bin/user-stop-1"}, {"path": "/usr/bin/user-stop-2"}]
    });
    let bundle = bench.bundle("user-hooks", &spec);
    let args = vec![
        OsString::from("create"),
        OsString::from("-b"),
        bundle.clone().into(),
        OsString::from("c"),
    ];
    let hook = Path::new(HOOK).canonicalize().unwrap();
    let is_ours = |e: &Value| Path::new(e["path"].as_str().unwrap()).canonicalize().ok().as_deref() == Some(&*hook);
    for round in 0..2 {
        assert_quiet_success(&bench.run(&args, bench.dir.path()), "create");
        let v: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        let stop = v["hooks"]["poststop"].as_array().unwrap();
        assert_eq!(stop.len(), 3, "round {round}: {stop:?}");
        assert!(
            is_ours(&stop[0]),
            "round {round}: vramgate's release runs first: {stop:?}"
        );
        assert_eq!(stop[1]["path"], "/usr/bin/user-stop-1");
        assert_eq!(stop[2]["path"], "/usr/bin/user-stop-2");
        // Admission stays after the spec's own createRuntime hooks.
        let create = v["hooks"]["createRuntime"].as_array().unwrap();
        assert_eq!(create.len(), 2, "round {round}: {create:?}");
        assert_eq!(create[0]["path"], "/usr/bin/user-create");
        assert!(is_ours(&create[1]));
    }
}

#[test]
fn errors_go_to_stderr_and_the_runc_log() {
    let bench = Bench::standard();
    // A bundle without config.json: the wrapper refuses before exec, in runc's JSON log format.
    let missing = bench.dir.path().join("empty-bundle");
    std::fs::create_dir(&missing).unwrap();
    let log = bench.dir.path().join("log.json");
    std::fs::write(
        &log,
        "{\"level\":\"info\",\"msg\":\"earlier line\",\"time\":\"2024-01-01T00:00:00Z\"}\n",
    )
    .unwrap();
    let args = vec![
        OsString::from("--log"),
        log.clone().into_os_string(),
        OsString::from("--log-format"),
        OsString::from("json"),
        OsString::from("create"),
        OsString::from("--bundle"),
        missing.clone().into_os_string(),
        OsString::from("c1"),
    ];
    let out = bench.run(&args, bench.dir.path());
    assert!(!out.status.success());
    assert_eq!(bench.recorded(), None, "the next runtime must not run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("vramgate: cannot read the container spec") && stderr.contains("empty-bundle"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "appended, earlier lines kept: {text}");
    let line: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(line["level"], "error");
    assert_eq!(line["msg"].as_str().unwrap(), stderr.trim_end());
    let time = line["time"].as_str().unwrap();
    assert!(
        time.len() == 30 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{time}"
    );

    // A spec that is not JSON, with runc's default text log format.
    let bad = bench.dir.path().join("bad-bundle");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("config.json"), "{\"annotations\": {\"vramgate.dev/memory\": ").unwrap();
    let text_log = bench.dir.path().join("log.txt");
    let args: Vec<OsString> = vec![
        "--log".into(),
        text_log.clone().into(),
        "create".into(),
        "-b".into(),
        bad.into(),
        "c2".into(),
    ];
    let out = bench.run(&args, bench.dir.path());
    assert!(!out.status.success());
    let logged = std::fs::read_to_string(&text_log).unwrap();
    assert!(
        logged.starts_with("time=\"") && logged.contains("level=error msg=\"vramgate: the container spec"),
        "{logged}"
    );

    // Hooks of the wrong JSON type: refused rather than overwritten.
    let mut spec = request_spec();
    spec["hooks"] = json!({"poststop": {"path": "/bin/true"}});
    let bundle = bench.bundle("wrong-hooks", &spec);
    let before = std::fs::read(bundle.join("config.json")).unwrap();
    let out = bench.run(
        &[
            OsString::from("create"),
            OsString::from("-b"),
            bundle.clone().into(),
            OsString::from("c3"),
        ],
        bench.dir.path(),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"hooks.poststop\" of JSON type object"));
    assert_eq!(std::fs::read(bundle.join("config.json")).unwrap(), before);
}

#[test]
fn missing_runtime_and_broken_config() {
    // No runtime on the list exists: one line that names the list and the config.
    let bench = Bench::new("[runtime]\nruntimes = [\"nvidia-container-runtime-not-here\", \"/nonexistent/runc\"]");
    let out = bench.run(&os(&["state", "x"]), bench.dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no runtime to run next")
            && stderr.contains("/nonexistent/runc")
            && stderr.contains("config.toml"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1);

    // A broken config must not block `delete` or `state`: the verb goes to the default list
    // (runc, here the fake), nothing is printed, and the warning goes to the runc log only.
    let bench = Bench::new("[runtime]\nruntimez = 1");
    let log = bench.dir.path().join("log.json");
    let args: Vec<OsString> = vec![
        "--log".into(),
        log.clone().into(),
        "--log-format".into(),
        "json".into(),
        "delete".into(),
        "x".into(),
    ];
    let out = bench.run(&args, bench.dir.path());
    assert_quiet_success(&out, "delete with a broken config");
    assert_eq!(bench.recorded().as_ref(), Some(&args));
    let line: Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert_eq!(line["level"], "warning");
    assert!(line["msg"].as_str().unwrap().contains("runtimez"));

    // ...but a create with a request needs the config (the hook timeout), and says so.
    let bundle = bench.bundle("b", &request_spec());
    let out = bench.run(
        &[
            OsString::from("create"),
            OsString::from("-b"),
            bundle.into(),
            OsString::from("c"),
        ],
        bench.dir.path(),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("runtimez"));
    assert_eq!(bench.recorded(), None);
}

#[test]
fn a_broken_config_does_not_block_containers_without_a_request() {
    // As Docker's default runtime, a broken config.toml must not stop every container: one
    // without a request goes through untouched, with a warning in runc's log only.
    let bench = Bench::new("[runtime]\nruntimez = 1");
    let plain = spec_with(json!({"org.example/x": "y"}), &["PATH=/bin"]);
    for format in ["json", "text"] {
        let bundle = bench.bundle(&format!("plain-{format}"), &plain);
        let before = std::fs::read(bundle.join("config.json")).unwrap();
        let log = bench.dir.path().join(format!("log-{format}"));
        let args: Vec<OsString> = vec![
            "--log".into(),
            log.clone().into(),
            "--log-format".into(),
            format.into(),
            "create".into(),
            "--bundle".into(),
            bundle.clone().into(),
            "c".into(),
        ];
        let out = bench.run(&args, bench.dir.path());
        assert_quiet_success(&out, &format!("create without a request, broken config, {format} log"));
        assert_eq!(bench.recorded().as_ref(), Some(&args));
        assert_eq!(std::fs::read(bundle.join("config.json")).unwrap(), before);
        let logged = std::fs::read_to_string(&log).unwrap();
        assert_eq!(logged.lines().count(), 1, "{logged}");
        if format == "json" {
            let line: Value = serde_json::from_str(logged.trim()).unwrap();
            assert_eq!(line["level"], "warning");
            assert!(line["msg"].as_str().unwrap().contains("runtimez"), "{logged}");
        } else {
            assert!(
                logged.contains("level=warning") && logged.contains("runtimez"),
                "{logged}"
            );
        }
    }
    // `run` is `create` + `start`: the same holds.
    let bundle = bench.bundle("plain-run", &plain);
    let args = vec![
        OsString::from("run"),
        OsString::from("-d"),
        OsString::from("-b"),
        bundle.into(),
        OsString::from("c"),
    ];
    assert_quiet_success(&bench.run(&args, bench.dir.path()), "run without a request");
    assert_eq!(bench.recorded().as_ref(), Some(&args));
}

#[test]
fn the_wrapper_never_execs_itself() {
    // Installed under the name of the next runtime (a common mistake), it must skip itself.
    let bench = Bench::new("[runtime]\nruntimes = [\"selfish\", \"fake-runc\"]");
    std::os::unix::fs::symlink(WRAPPER, bench.bin.join("selfish")).unwrap();
    let args = os(&["state", "x"]);
    assert_quiet_success(&bench.run(&args, bench.dir.path()), "state");
    assert_eq!(bench.recorded().as_ref(), Some(&args));
}
