//! NVIDIA's container toolkit beside vramgate, for real (issue 53, item 3): NVIDIA's own
//! binaries, v1.20.2 built from its Go module by `scripts/fetch-nvidia-toolkit`, run the way a
//! node runs them.
//!
//! 1. **containerd's config.** `nvidia-ctk runtime configure` (drop-in and in place, with and
//!    without `--nvidia-set-as-default`) and the GPU Operator's installer (`nvidia-ctk-installer`:
//!    its install, and its undo on SIGTERM) run chrooted into a scratch host root holding the
//!    host's containerd (2.1, and 1.7), each on containerd's own `containerd config default`,
//!    before, between and after the set-up and the undo of the built `vramgate setup-node`. After
//!    every step, `containerd config dump` (the host's containerd, chrooted) must show vramgate's
//!    runtime exactly while vramgate is set up and nowhere otherwise, and everything else of the
//!    CRI runtime section exactly as the toolkit alone leaves it at that point: the same toolkit
//!    steps run on a fresh host without vramgate. So neither tool's undo takes the other's part,
//!    and vramgate's undo leaves no runtime of its own anywhere, the toolkit's copy of the section
//!    included.
//! 2. **The chain under containerd 2.1's CRI.** Pods created and started over CRI as kubelet does,
//!    through the `vramgate` handler of `vramgate setup containerd`, whose wrapper runs NVIDIA's
//!    `nvidia-container-runtime` next (as on a GPU Operator node), which runs runc. The GPU is
//!    given each way NVIDIA's device plugin gives one (its four strategies), and a pod given none
//!    runs a CUDA image's `NVIDIA_VISIBLE_DEVICES=all`, under the toolkit's default setting and
//!    under the GPU Operator's.
//!
//! What does not run for real: this machine has no GPU and no NVIDIA driver. The CDI spec is
//! written by hand (`nvidia-ctk cdi generate` needs NVML), its `/dev/nvidia0` is `/dev/null`, and
//! NVIDIA's runtime runs in `cdi` mode (its default `jit-cdi` needs NVML; `legacy` needs
//! libnvidia-container and the driver). The GPU Operator's installed runtime is a shell wrapper
//! that runs runc directly when the `nvidia` kernel module is not loaded: the wrapper here is the
//! same minus that check. The installer restarts nothing (`--restart-mode=none`: the dumps read
//! the files as a restarted containerd would), and its toolkit source root holds empty
//! libnvidia-container libraries and a stand-in `nvidia-container-cli`, which it only copies.

use crate::support;
use crate::support::cri as cri_support;
use crate::support::host;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::{json, Value};

use cri_support::*;
use host::*;
use support::*;
use vramgate::config::SIMULATED_GPU_UUID;
use vramgate_testbed::Testbed;

const WAIT: Duration = Duration::from_secs(60);
/// Where `vramgate setup-node` puts the wrapper on the host, as containerd names it.
const WRAPPER_ON_HOST: &str = "/usr/local/lib/vramgate/vramgate-runtime";
/// The CRI annotations vramgate's runtime lets through to the spec.
const PASSED_ANNOTATIONS: [&str; 2] = ["vramgate.dev/*", "nvidia.com/container.*"];
const REQUEST: &str = "1205Mi";
const REQUEST_BYTES: u64 = 1205 << 20;

/// The toolkit's binaries: `$VRAMGATE_NVIDIA_TOOLKIT/bin`, else scripts/fetch-nvidia-toolkit's
/// cache directory, keyed as the script keys it.
fn toolkit_bin() -> PathBuf {
    let dir = match std::env::var_os("VRAMGATE_NVIDIA_TOOLKIT") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let key = run_ok(
                Command::new("sh")
                    .arg("-c")
                    .arg("cat tools/nvidia-toolkit/go.mod tools/nvidia-toolkit/go.sum scripts/fetch-nvidia-toolkit | sha256sum | cut -c1-16")
                    .current_dir(env!("CARGO_MANIFEST_DIR")),
            );
            PathBuf::from(format!("/var/cache/vramgate-tests/nvidia-toolkit-{key}"))
        }
    };
    let bin = dir.join("bin");
    assert!(
        bin.join("nvidia-ctk").is_file() && bin.join("nvidia-container-runtime").is_file(),
        "{}: no NVIDIA container toolkit built from this checkout's tools/nvidia-toolkit pins; run scripts/fetch-nvidia-toolkit (scripts/install-deps runs it)",
        bin.display()
    );
    bin
}

// ---------------------------------------------------------------------------------------------
// 1. containerd's config: the toolkit's tools and vramgate's set-up, in every order.
// ---------------------------------------------------------------------------------------------

/// One thing done to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    /// `nvidia-ctk runtime configure --runtime=containerd`, writing its drop-in
    /// (`conf.d/99-nvidia.toml`, its default) or the main config (`--drop-in-config=""`); with
    /// `--nvidia-set-as-default` or not. It has no undo.
    Ctk { drop_in: bool, set_as_default: bool },
    /// The GPU Operator's installer starts, installs the toolkit, configures containerd and waits.
    Install,
    /// SIGTERM to the installer: it takes its runtimes out and exits.
    Uninstall,
    /// `vramgate setup-node` starts and sets the node up.
    SetUp,
    /// SIGTERM to `vramgate setup-node`: its undo.
    Undo,
}

use Step::*;

const DROP_IN: Step = Ctk {
    drop_in: true,
    set_as_default: false,
};
const DROP_IN_DEFAULT: Step = Ctk {
    drop_in: true,
    set_as_default: true,
};
// In place, nvidia-ctk 1.20.2 loses its own runtime for version 2 and 3 configs (an upstream
// bug in its `ConfigWithDropIn.Save`: it writes the section into the main config, then writes
// the main config again over it, with only an `imports` line added). The baseline is what the
// toolkit alone does, so the comparison holds vramgate to that, bug included, and
// `check_baseline` says the runtime is missing, so that a fixed toolkit is noticed.
const IN_PLACE: Step = Ctk {
    drop_in: false,
    set_as_default: false,
};
const IN_PLACE_DEFAULT: Step = Ctk {
    drop_in: false,
    set_as_default: true,
};

/// nvidia-ctk, each way, before vramgate's set-up, between set-up and undo, and after the undo.
const CTK_SEQUENCES: [&[Step]; 12] = [
    &[DROP_IN, SetUp, Undo],
    &[SetUp, DROP_IN, Undo],
    &[SetUp, Undo, DROP_IN],
    &[DROP_IN_DEFAULT, SetUp, Undo],
    &[SetUp, DROP_IN_DEFAULT, Undo],
    &[SetUp, Undo, DROP_IN_DEFAULT],
    &[IN_PLACE, SetUp, Undo],
    &[SetUp, IN_PLACE, Undo],
    &[SetUp, Undo, IN_PLACE],
    &[IN_PLACE_DEFAULT, SetUp, Undo],
    &[SetUp, IN_PLACE_DEFAULT, Undo],
    &[SetUp, Undo, IN_PLACE_DEFAULT],
];

/// The installer's install and undo in every order relative to vramgate's set-up and undo.
const INSTALLER_SEQUENCES: [&[Step]; 6] = [
    &[Install, Uninstall, SetUp, Undo],
    &[Install, SetUp, Uninstall, Undo],
    &[Install, SetUp, Undo, Uninstall],
    &[SetUp, Install, Uninstall, Undo],
    &[SetUp, Install, Undo, Uninstall],
    &[SetUp, Undo, Install, Uninstall],
];

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ctk {
                drop_in,
                set_as_default,
            } => write!(
                f,
                "nvidia-ctk {}{}",
                if *drop_in { "drop-in" } else { "in place" },
                if *set_as_default {
                    " --nvidia-set-as-default"
                } else {
                    ""
                }
            ),
            Install => write!(f, "installer install"),
            Uninstall => write!(f, "installer undo"),
            SetUp => write!(f, "vramgate set-up"),
            Undo => write!(f, "vramgate undo"),
        }
    }
}

fn describe(sequence: &[Step]) -> String {
    sequence.iter().map(Step::to_string).collect::<Vec<_>>().join(", ")
}

/// The CRI runtime section of each config version: where the runtimes live.
fn cri_plugin(containerd: Containerd) -> &'static str {
    match containerd {
        Containerd::Two => "io.containerd.cri.v1.runtime",
        Containerd::Seven | Containerd::Debian => "io.containerd.grpc.v1.cri",
    }
}

/// A host root with every program the sequences run, made once per test; each sequence's host
/// is a copy of it (hard links: nothing writes these files) with containerd's default config.
struct Template {
    _dir: tempfile::TempDir,
    root: PathBuf,
    containerd: Containerd,
    /// `containerd config default` of the host's containerd.
    default_config: String,
}

/// Where the installer finds what it installs, inside the host root (`--toolkit-source-root`).
const TOOLKIT_SOURCE: &str = "/opt/nvidia-toolkit-source";

impl Template {
    fn new(containerd: Containerd) -> Template {
        require("chroot");
        let bin = toolkit_bin();
        let dir = tempfile::Builder::new().prefix("vramgate-ntk-host").tempdir().unwrap();
        let root = dir.path().join("root");
        give_program(&root, &containerd.binary(), Path::new("/usr/bin/containerd"));
        give_program(&root, &bin.join("nvidia-ctk"), Path::new("/usr/bin/nvidia-ctk"));
        give_program(
            &root,
            &bin.join("nvidia-ctk-installer"),
            Path::new("/usr/bin/nvidia-ctk-installer"),
        );
        give_dev_null(&root);
        // The installer's source root, laid out as its container image's (/artifacts/deb): the
        // binaries it copies to the toolkit directory, and libnvidia-container, which it must
        // find and copy but never loads (empty files stand in), nor runs the CLI.
        let source = root.join(TOOLKIT_SOURCE.trim_start_matches('/'));
        let usr_bin = source.join("usr/bin");
        std::fs::create_dir_all(&usr_bin).unwrap();
        for name in [
            "nvidia-ctk",
            "nvidia-container-runtime",
            "nvidia-container-runtime.cdi",
            "nvidia-container-runtime.legacy",
            "nvidia-container-runtime-hook",
            "nvidia-cdi-hook",
        ] {
            std::fs::copy(bin.join(name), usr_bin.join(name)).unwrap();
        }
        let cli = usr_bin.join("nvidia-container-cli");
        std::fs::write(
            &cli,
            "#!/bin/sh\necho 'a stand-in: libnvidia-container is not built here' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let libs = source.join(format!("usr/lib/{}-linux-gnu", std::env::consts::ARCH));
        std::fs::create_dir_all(&libs).unwrap();
        for lib in ["libnvidia-container.so.1", "libnvidia-container-go.so.1"] {
            std::fs::write(libs.join(lib), "").unwrap();
        }
        // What a node has and `vramgate setup-node` expects: /usr/local/lib, /etc/containerd.
        std::fs::create_dir_all(root.join("usr/local/lib")).unwrap();
        std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
        let default_config =
            run_ok(
                Command::new("chroot")
                    .arg(&root)
                    .args(["/usr/bin/containerd", "config", "default"]),
            );
        Template {
            _dir: dir,
            root,
            containerd,
            default_config: default_config + "\n",
        }
    }

    /// A new host root from the template, with containerd's default config as its main config.
    fn host(&self, name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::Builder::new().prefix(name).tempdir().unwrap();
        let root = dir.path().join("root");
        run_ok(Command::new("cp").arg("-al").arg(&self.root).arg(&root));
        // A file of its own (not a link to the template's): every tool writes it.
        std::fs::write(root.join("etc/containerd/config.toml"), &self.default_config).unwrap();
        std::fs::write(dir.path().join("vramgate-config.toml"), "").unwrap();
        (dir, root)
    }
}

/// `cmd`'s stdout and stderr both to the file `log`, in the order written (one open file).
fn output_to(cmd: &mut Command, log: &Path) {
    let file = std::fs::File::create(log).unwrap();
    cmd.stdout(file.try_clone().unwrap()).stderr(file);
}

/// A process a step started and a later step stops, its output in a file.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for `line` in its output; panics with the output if it exits first.
    fn wait_for(&mut self, what: &str, line: &str) {
        let started = Instant::now();
        while !self.output().contains(line) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("{what} exited ({status}) before {line:?}:\n{}", self.output());
            }
            assert!(
                started.elapsed() < WAIT,
                "{what}: no {line:?} within {WAIT:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits (bounded) for it to exit; panics with the output unless it exits 0.
    fn terminate(mut self, what: &str) -> String {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < WAIT,
                "{what} did not exit within {WAIT:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{what} ended with {status}:\n{}", self.output());
        self.output()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The PATH the toolkit's programs run with, a node's: they run `containerd` by name.
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One host root and what runs on it.
struct Host {
    dir: tempfile::TempDir,
    root: PathBuf,
    containerd: Containerd,
    node: Option<Running>,
    installer: Option<Running>,
    /// Each program's output so far, for a failure's message.
    history: Vec<String>,
    runs: usize,
}

impl Host {
    fn new(template: &Template, name: &str) -> Host {
        let (dir, root) = template.host(name);
        Host {
            dir,
            root,
            containerd: template.containerd,
            node: None,
            installer: None,
            history: Vec::new(),
            runs: 0,
        }
    }

    fn log_file(&mut self, what: &str) -> PathBuf {
        self.runs += 1;
        self.dir.path().join(format!("{}-{what}.log", self.runs))
    }

    /// A toolkit program run chrooted into the host root, as the toolkit's container runs it
    /// against the host's root: its environment only what a node's root shell would give (the
    /// installer reads many variables, none of which must come from the test's environment).
    fn chrooted(&self, program: &str) -> Command {
        let mut cmd = daemon("chroot");
        cmd.env_clear().env("PATH", HOST_PATH).arg(&self.root).arg(program);
        cmd
    }

    fn step(&mut self, step: Step) {
        match step {
            Ctk {
                drop_in,
                set_as_default,
            } => {
                let mut cmd = self.chrooted("/usr/bin/nvidia-ctk");
                cmd.args([
                    "runtime",
                    "configure",
                    "--runtime=containerd",
                    "--config=/etc/containerd/config.toml",
                ]);
                cmd.arg(if drop_in {
                    "--drop-in-config=/etc/containerd/conf.d/99-nvidia.toml"
                } else {
                    "--drop-in-config="
                });
                if set_as_default {
                    cmd.arg("--nvidia-set-as-default");
                }
                let out = cmd.stdin(Stdio::null()).output().unwrap();
                let text = format!("{}{}", stdout(&out), stderr(&out));
                assert!(out.status.success(), "{step}: {}\n{text}", out.status);
                self.history.push(format!("{step}:\n{text}"));
            }
            Install => {
                assert!(self.installer.is_none(), "the installer already runs");
                let log = self.log_file("installer");
                let mut cmd = self.chrooted("/usr/bin/nvidia-ctk-installer");
                // As the GPU Operator runs it (its defaults: set as default, drop-in
                // conf.d/99-nvidia.toml, read from `containerd config dump` first), with the
                // host root at / after the chroot, and no restart.
                cmd.args([
                    "--runtime=containerd",
                    "--host-root=/",
                    "--restart-mode=none",
                    "--toolkit-install-dir=/usr/local/nvidia",
                    "--pid-file=/run/nvidia/toolkit/toolkit.pid",
                    "--config-source=command,file",
                ])
                .arg(format!("--toolkit-source-root={TOOLKIT_SOURCE}"))
                .stdin(Stdio::null());
                output_to(&mut cmd, &log);
                let mut running = Running {
                    child: cmd.spawn().unwrap(),
                    log,
                };
                running.wait_for("the installer", "Waiting for signal");
                self.installer = Some(running);
            }
            Uninstall => {
                let running = self.installer.take().expect("the installer runs");
                let out = running.terminate("the installer");
                assert!(
                    out.contains("Completed 'cleanup'"),
                    "the installer did not undo:\n{out}"
                );
                self.history.push(format!("installer:\n{out}"));
            }
            SetUp => {
                assert!(self.node.is_none(), "setup-node already runs");
                let log = self.log_file("setup-node");
                let mut cmd = daemon(VRAMGATE);
                cmd.env("VRAMGATE_CONFIG", self.dir.path().join("vramgate-config.toml"))
                    .arg("setup-node")
                    .arg("--host-root")
                    .arg(&self.root)
                    .args(["--restart", "none"])
                    .stdin(Stdio::null());
                output_to(&mut cmd, &log);
                let child = cmd.spawn().unwrap();
                let mut running = Running { child, log };
                running.wait_for("vramgate setup-node", "node set up");
                self.node = Some(running);
            }
            Undo => {
                let running = self.node.take().expect("setup-node runs");
                let out = running.terminate("vramgate setup-node");
                self.history.push(format!("setup-node:\n{out}"));
            }
        }
    }

    /// `containerd config dump`'s CRI runtime section.
    fn section(&self) -> toml::Table {
        let dump = host_dump(&self.root);
        dump.get("plugins")
            .and_then(|p| p.get(cri_plugin(self.containerd)))
            .and_then(toml::Value::as_table)
            .cloned()
            .unwrap_or_else(|| panic!("containerd config dump has no {}:\n{dump}", cri_plugin(self.containerd)))
    }

    /// Every file of containerd's config directory, with its text: what a failure shows.
    fn files(&self) -> String {
        let mut out = String::new();
        let mut todo = vec![self.root.join("etc/containerd")];
        let mut files = Vec::new();
        while let Some(dir) = todo.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().unwrap().is_dir() {
                    todo.push(entry.path());
                } else {
                    files.push(entry.path());
                }
            }
        }
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            out += &format!("--- {}\n{text}\n", file.strip_prefix(&self.root).unwrap().display());
        }
        out
    }

    /// What the host's programs printed so far, those still running included.
    fn logs(&self) -> String {
        let mut out = self.history.join("\n");
        for (what, running) in [
            ("setup-node (running)", &self.node),
            ("installer (running)", &self.installer),
        ] {
            if let Some(running) = running {
                out += &format!("\n{what}:\n{}", running.output());
            }
        }
        out
    }
}

/// The runtimes table of a CRI runtime section.
fn runtimes(section: &toml::Table) -> toml::Table {
    section
        .get("containerd")
        .and_then(|c| c.get("runtimes"))
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default()
}

fn default_runtime(section: &toml::Table) -> Option<&str> {
    section.get("containerd")?.get("default_runtime_name")?.as_str()
}

/// Where two TOML values differ, one line per key.
fn differences(path: &str, a: Option<&toml::Value>, b: Option<&toml::Value>, out: &mut Vec<String>) {
    match (a, b) {
        (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                differences(&format!("{path}.{key}"), a.get(key), b.get(key), out);
            }
        }
        (a, b) if a != b => out.push(format!(
            "{path}: {} / {}",
            a.map_or("(absent)".into(), |v| v.to_string()),
            b.map_or("(absent)".into(), |v| v.to_string())
        )),
        _ => {}
    }
}

/// What the toolkit alone did must be what NVIDIA's notes say it does, or the comparison
/// against it would hold vramgate to something else: its runtime in drop-in mode and from the
/// installer, none in place (the bug above), none after the installer's undo.
fn check_baseline(step: Step, section: &toml::Table, containerd: Containerd) {
    let names = runtimes(section);
    let has_nvidia = names.contains_key("nvidia");
    let what = format!("the toolkit alone on containerd {containerd:?}, after {step}");
    match step {
        Ctk { drop_in: true, set_as_default } => {
            assert!(has_nvidia, "{what}: no runtime nvidia: {section}");
            assert_eq!(default_runtime(section) == Some("nvidia"), set_as_default, "{what}: {section}");
        }
        Ctk { drop_in: false, .. } => assert!(
            !has_nvidia,
            "{what}: the runtime nvidia is there; nvidia-ctk's in-place mode lost it in 1.20.2 (fixed upstream? then say so in the comment on IN_PLACE): {section}"
        ),
        Install => {
            for name in ["nvidia", "nvidia-cdi", "nvidia-legacy"] {
                assert!(names.contains_key(name), "{what}: no runtime {name}: {section}");
            }
            assert_eq!(default_runtime(section), Some("nvidia"), "{what}");
        }
        Uninstall => assert!(
            !names.keys().any(|n| n.starts_with("nvidia")),
            "{what}: {section}"
        ),
        SetUp | Undo => unreachable!("the baseline runs the toolkit's steps only"),
    }
}

/// The section after each of `toolkit_steps` on a fresh host without vramgate (index 0: before
/// any), cached by the steps: what vramgate's host must show but for vramgate's runtime.
fn baseline<'a>(
    template: &Template,
    cache: &'a mut HashMap<Vec<Step>, Vec<toml::Table>>,
    toolkit_steps: Vec<Step>,
) -> &'a [toml::Table] {
    cache.entry(toolkit_steps.clone()).or_insert_with(|| {
        let mut host = Host::new(template, "vramgate-ntk-baseline");
        let mut sections = vec![host.section()];
        for step in toolkit_steps {
            host.step(step);
            let section = host.section();
            check_baseline(step, &section, template.containerd);
            sections.push(section);
        }
        if let Some(installer) = host.installer.take() {
            installer.terminate("the baseline's installer");
        }
        sections
    })
}

/// vramgate's runtime as `vramgate setup-node` must leave it in the dump: a runc v2 runtime
/// running the wrapper, with vramgate's annotation pass-lists and the default runtime's options
/// but those at their zero value (runc's, which the toolkit's runtime copies when it is the
/// default). containerd dumps every other key of a runtime at its zero value, and its options
/// as the files give them: so it is runc's entry, every key zeroed but those.
fn expected_vramgate_runtime(section: &toml::Table) -> toml::Value {
    let runc = runtimes(section)
        .get("runc")
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_else(|| panic!("no runc runtime: {section}"));
    let mut expected: toml::Table = runc
        .iter()
        .filter(|(key, _)| key.as_str() != "options")
        .map(|(key, value)| (key.clone(), zero(value)))
        .collect();
    expected.insert("runtime_type".into(), "io.containerd.runc.v2".into());
    let allow = |extra: &[&str]| {
        toml::Value::Array(
            PASSED_ANNOTATIONS
                .iter()
                .chain(extra)
                .map(|a| toml::Value::from(*a))
                .collect(),
        )
    };
    expected.insert("pod_annotations".into(), allow(&[]));
    // A device plugin's CDI requests pass from containers, never from pods.
    expected.insert("container_annotations".into(), allow(&["cdi.k8s.io/*"]));
    let mut options: toml::Table = runc
        .get("options")
        .and_then(toml::Value::as_table)
        .into_iter()
        .flatten()
        .filter(|(_, value)| zero(value) != **value)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    options.insert("BinaryName".into(), WRAPPER_ON_HOST.into());
    expected.insert("options".into(), toml::Value::Table(options));
    toml::Value::Table(expected)
}

/// The Go zero value of `value`'s type, as `containerd config dump` prints a key nobody set.
fn zero(value: &toml::Value) -> toml::Value {
    match value {
        toml::Value::String(_) => "".into(),
        toml::Value::Integer(_) => 0.into(),
        toml::Value::Float(_) => 0.0.into(),
        toml::Value::Boolean(_) => false.into(),
        toml::Value::Array(_) => toml::Value::Array(Vec::new()),
        toml::Value::Table(_) => toml::Value::Table(toml::Table::new()),
        other => other.clone(),
    }
}

/// Files of containerd's config directory that name vramgate, by name or in their text.
fn naming_vramgate(host: &Host) -> Vec<String> {
    host.files()
        .split("--- ")
        .filter(|f| f.contains("vramgate"))
        .map(|f| f.lines().next().unwrap_or_default().to_string())
        .collect()
}

/// The toolkit's drop-in, where its copy of the CRI section lives.
const TOOLKIT_DROP_IN: &str = "etc/containerd/conf.d/99-nvidia.toml";

/// Whether the toolkit's drop-in has a runtime `vramgate`, in either version's CRI section.
fn toolkit_copy_holds_vramgate(host: &Host) -> bool {
    let Ok(text) = std::fs::read_to_string(host.root.join(TOOLKIT_DROP_IN)) else {
        return false;
    };
    let table: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{TOOLKIT_DROP_IN}: {e}\n{text}"));
    ["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"]
        .iter()
        .any(|plugin| {
            table
                .get("plugins")
                .and_then(|p| p.get(plugin))
                .and_then(|s| s.get("containerd"))
                .and_then(|c| c.get("runtimes"))
                .is_some_and(|r| r.get("vramgate").is_some())
        })
}

/// Whether the toolkit's drop-in holds vramgate's runtime when vramgate undoes itself in
/// `sequence`: where the undo must take it out of another tool's file, which the sequences
/// must reach (else "no runtime of vramgate's left anywhere" would hold trivially). The drop-in
/// is there if the toolkit's last step before the undo wrote it (its drop-in mode, or the
/// installer not yet undone). On containerd 1.7 (version 2) it then always holds vramgate's
/// runtime: vramgate adds it to every file that has the CRI section, and the toolkit copies
/// the main config's section, which has it. On 2.1 (version 3) vramgate's runtime is in a
/// drop-in of its own, which nvidia-ctk (reading the main config) never copies; the installer
/// copies it, reading `containerd config dump`, when it installs while vramgate is set up.
fn toolkit_copy_expected(containerd: Containerd, sequence: &[Step]) -> bool {
    let undo = sequence
        .iter()
        .position(|s| *s == Undo)
        .expect("the sequence undoes vramgate");
    let before = &sequence[..undo];
    let last_toolkit_step = before.iter().rev().find(|s| !matches!(s, SetUp | Undo));
    let drop_in_there = matches!(last_toolkit_step, Some(Ctk { drop_in: true, .. } | Install));
    let set_up = before
        .iter()
        .position(|s| *s == SetUp)
        .expect("the sequence sets vramgate up");
    match containerd {
        Containerd::Two => drop_in_there && before[set_up..].contains(&Install),
        Containerd::Seven | Containerd::Debian => drop_in_there,
    }
}

/// Runs `sequence` on a fresh host of `template`, checking the dump after every step against
/// the toolkit alone (see the module's doc).
fn run_sequence(template: &Template, cache: &mut HashMap<Vec<Step>, Vec<toml::Table>>, sequence: &[Step]) {
    let toolkit_steps: Vec<Step> = sequence
        .iter()
        .copied()
        .filter(|s| !matches!(s, SetUp | Undo))
        .collect();
    let expected = baseline(template, cache, toolkit_steps).to_vec();
    let mut host = Host::new(template, "vramgate-ntk-seq");
    let mut toolkit_done = 0;
    let mut set_up = false;
    let check = |host: &Host, after: &str, toolkit_done: usize, set_up: bool| {
        let section = host.section();
        let mut rest = section.clone();
        let ours = rest
            .get_mut("containerd")
            .and_then(|c| c.get_mut("runtimes"))
            .and_then(toml::Value::as_table_mut)
            .and_then(|r| r.remove("vramgate"));
        let context = || {
            format!(
                "containerd {:?}, sequence [{}], after {after}\n=== files\n{}\n=== logs\n{}",
                host.containerd,
                describe(sequence),
                host.files(),
                host.logs()
            )
        };
        match (&ours, set_up) {
            (Some(ours), true) => {
                let want = expected_vramgate_runtime(&section);
                let mut diff = Vec::new();
                differences("vramgate", Some(ours), Some(&want), &mut diff);
                assert!(
                    diff.is_empty(),
                    "vramgate's runtime is not as set up (dump / expected):\n{}\n{}",
                    diff.join("\n"),
                    context()
                );
            }
            (None, true) => panic!("vramgate's runtime is missing while vramgate is set up\n{}", context()),
            (Some(ours), false) => panic!(
                "vramgate's runtime is there while vramgate is not set up: {ours}\n{}",
                context()
            ),
            (None, false) => {
                let files = naming_vramgate(host);
                assert!(files.is_empty(), "files still name vramgate: {files:?}\n{}", context());
            }
        }
        let want = &expected[toolkit_done];
        let mut diff = Vec::new();
        differences(
            cri_plugin(host.containerd),
            Some(&toml::Value::Table(rest.clone())),
            Some(&toml::Value::Table(want.clone())),
            &mut diff,
        );
        assert!(
            diff.is_empty(),
            "the CRI runtime section but vramgate's runtime differs from the toolkit's alone (this host / toolkit alone):\n{}\n{}",
            diff.join("\n"),
            context()
        );
    };
    check(&host, "nothing", 0, false);
    for step in sequence {
        if *step == Undo {
            let held = toolkit_copy_holds_vramgate(&host);
            assert_eq!(
                held,
                toolkit_copy_expected(host.containerd, sequence),
                "whether the toolkit's drop-in holds vramgate's runtime before vramgate's undo, containerd {:?}, sequence [{}]\n{}",
                host.containerd,
                describe(sequence),
                host.files()
            );
        }
        host.step(*step);
        match step {
            SetUp => set_up = true,
            Undo => set_up = false,
            _ => toolkit_done += 1,
        }
        check(&host, &step.to_string(), toolkit_done, set_up);
    }
}

fn run_sequences(containerd: Containerd, sequences: &[&[Step]]) {
    let started = Instant::now();
    let template = Template::new(containerd);
    let mut cache = HashMap::new();
    for sequence in sequences {
        run_sequence(&template, &mut cache, sequence);
    }
    eprintln!(
        "{} sequences on containerd {containerd:?} in {:?}",
        sequences.len(),
        started.elapsed()
    );
}

#[test]
fn nvidia_ctk_and_setup_node_in_every_order_on_containerd_2_1() {
    run_sequences(Containerd::Two, &CTK_SEQUENCES);
}

#[test]
fn nvidia_ctk_and_setup_node_in_every_order_on_containerd_1_7() {
    run_sequences(Containerd::Seven, &CTK_SEQUENCES);
}

#[test]
fn gpu_operator_installer_and_setup_node_in_every_order_on_containerd_2_1() {
    run_sequences(Containerd::Two, &INSTALLER_SEQUENCES);
}

#[test]
fn gpu_operator_installer_and_setup_node_in_every_order_on_containerd_1_7() {
    run_sequences(Containerd::Seven, &INSTALLER_SEQUENCES);
}

// ---------------------------------------------------------------------------------------------
// 2. The chain under containerd 2.1's CRI: vramgate-runtime, then nvidia-container-runtime.
// ---------------------------------------------------------------------------------------------

/// Where NVIDIA's device plugin mounts `/dev/null` per GPU under its volume-mounts strategy.
const VOLUME_MOUNTS_ROOT: &str = "/var/run/nvidia-container-devices";
/// The variable each CDI device of the hand-written spec sets to its own name: which device was
/// injected, seen from inside the container.
const MARKER: &str = "VRAMGATE_TEST_CDI_DEVICE";

/// The hand-written CDI spec (kind nvidia.com/gpu): GPU 0 of the static inventory under the
/// names vramgate and the device plugin give it (its UUID, its index) and `all`, each with the
/// device node `/dev/nvidia0` (the host's `/dev/null`: there is no GPU) and a marker; common
/// edits as NVIDIA's generated specs have (the toolkit's `pkg/nvcdi/wrapper.go`, `GetCommonEdits`), so that
/// after the spec's edits NVIDIA's runtime finds nothing more to do.
fn cdi_spec() -> Value {
    let device = |name: &str| {
        json!({
            "name": name,
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}],
                "env": [format!("{MARKER}={name}")],
            },
        })
    };
    json!({
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [device(SIMULATED_GPU_UUID), device("0"), device("all")],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [{
                "hostPath": "/dev/null",
                "containerPath": format!("{VOLUME_MOUNTS_ROOT}/void"),
                "options": ["ro", "nosuid", "nodev", "bind"],
            }],
        },
    })
}

/// NVIDIA's toolkit config (what `NVIDIA_CTK_CONFIG_FILE_PATH` names): CDI mode on the test's
/// spec directory; `operator`: the GPU Operator's setting with the device plugin's
/// volume-mounts strategy (the mounts accepted, the env of an unprivileged container not),
/// else the toolkit's defaults (the env accepted, the mounts not).
fn toolkit_config(cdi_dir: &Path, log: &Path, operator: bool) -> String {
    format!(
        "accept-nvidia-visible-devices-envvar-when-unprivileged = {}\n\
         accept-nvidia-visible-devices-as-volume-mounts = {operator}\n\
         \n\
         [nvidia-container-runtime]\n\
         mode = \"cdi\"\n\
         runtimes = [\"runc\"]\n\
         log-level = \"debug\"\n\
         debug = {:?}\n\
         \n\
         [nvidia-container-runtime.modes.cdi]\n\
         default-kind = \"nvidia.com/gpu\"\n\
         annotation-prefixes = [\"cdi.k8s.io/\"]\n\
         spec-dirs = [{:?}]\n",
        !operator,
        log.display().to_string(),
        cdi_dir.display().to_string(),
    )
}

/// How the GPU reaches the container: the device plugin's strategies, and none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    /// `envvar`: `NVIDIA_VISIBLE_DEVICES=<UUID>`.
    Envvar,
    /// `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and a mount of
    /// `/dev/null` at `/var/run/nvidia-container-devices/<UUID>`.
    VolumeMounts,
    /// `cdi-annotations`: the container annotation `cdi.k8s.io/nvidia-device-plugin_<x>`.
    CdiAnnotations,
    /// `cdi-cri`: the CRI `ContainerConfig.cdi_devices`, which containerd resolves itself.
    CdiCri,
    /// No GPU: only a CUDA image's `ENV NVIDIA_VISIBLE_DEVICES=all`.
    NoneFromCudaImage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Runs with GPU 0 (its node, the marker of its UUID's device) and 1205 MiB reserved on it.
    ReservedOnGpu0,
    /// Runs with no GPU and nothing reserved.
    NoGpuNothingReserved,
    /// StartContainer fails with vramgate's line naming the env, nothing reserved.
    Refused,
}

struct Case {
    given: Given,
    /// The toolkit's config: the GPU Operator's setting (see [`toolkit_config`]) or its defaults.
    operator: bool,
    outcome: Outcome,
}

const CASES: [Case; 6] = [
    Case {
        given: Given::Envvar,
        operator: false,
        outcome: Outcome::ReservedOnGpu0,
    },
    Case {
        given: Given::VolumeMounts,
        operator: true,
        outcome: Outcome::ReservedOnGpu0,
    },
    // containerd 2.1 (enable_cdi, on by default in 2.x) resolves `cdi.k8s.io/` annotations of
    // the CRI container config itself, as it does cdi_devices; the handler also passes them on
    // (container annotations only: kubelet writes them from the device plugin's Allocate, a pod
    // author cannot), so NVIDIA's runtime after vramgate's reads them too, as it must where
    // containerd does not resolve them (1.7, enable_cdi off by default). Checked below: the
    // annotation is in the runtime's spec.
    Case {
        given: Given::CdiAnnotations,
        operator: false,
        outcome: Outcome::ReservedOnGpu0,
    },
    Case {
        given: Given::CdiCri,
        operator: false,
        outcome: Outcome::ReservedOnGpu0,
    },
    // Under the toolkit's default NVIDIA's runtime would give this container every GPU, which
    // Kubernetes never gave it: vramgate refuses it, since it can neither reserve on GPUs not
    // given nor admit it unaccounted.
    Case {
        given: Given::NoneFromCudaImage,
        operator: false,
        outcome: Outcome::Refused,
    },
    // Under the GPU Operator's setting the toolkit ignores the env of an unprivileged container:
    // no GPU, so nothing to reserve.
    Case {
        given: Given::NoneFromCudaImage,
        operator: true,
        outcome: Outcome::NoGpuNothingReserved,
    },
];

/// The container config kubelet sends for `given` (what NVIDIA's device plugin's Allocate
/// answered, merged into the container's own), running until stopped.
fn gpu_container(given: Given) -> cri::ContainerConfig {
    let env: Vec<(&str, String)> = match given {
        Given::Envvar => vec![("NVIDIA_VISIBLE_DEVICES", SIMULATED_GPU_UUID.to_string())],
        Given::VolumeMounts => vec![("NVIDIA_VISIBLE_DEVICES", VOLUME_MOUNTS_ROOT.to_string())],
        Given::CdiAnnotations | Given::CdiCri => vec![],
        Given::NoneFromCudaImage => vec![("NVIDIA_VISIBLE_DEVICES", "all".to_string())],
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut config = container_config("cuda", RUNS_AND_KEEPS_ITS_ENV, &env);
    let gpu = format!("nvidia.com/gpu={SIMULATED_GPU_UUID}");
    match given {
        Given::VolumeMounts => config.mounts.push(cri::Mount {
            container_path: format!("{VOLUME_MOUNTS_ROOT}/{SIMULATED_GPU_UUID}"),
            host_path: "/dev/null".into(),
            readonly: true,
            ..Default::default()
        }),
        Given::CdiAnnotations => {
            config
                .annotations
                .insert("cdi.k8s.io/nvidia-device-plugin_0".into(), gpu);
        }
        Given::CdiCri => config.cdi_devices.push(cri::CdiDevice { name: gpu }),
        Given::Envvar | Given::NoneFromCudaImage => {}
    }
    config
}

/// Runs until stopped, as [`RUN_UNTIL_STOPPED`], having written the environment it started
/// with (runc's, from the spec as the runtimes before it left it) to [`ENV_AT_START`]. An exec
/// would not see it: containerd execs with the spec it made, before the runtimes' edits; and the
/// container shares its pod's PID namespace, where PID 1 is the sandbox's.
const RUNS_AND_KEEPS_ITS_ENV: &[&str] = &[
    "/bin/sh",
    "-c",
    "env > /tmp/env-at-start; trap 'exit 0' TERM; sleep 600 & wait",
];
const ENV_AT_START: &str = "/tmp/env-at-start";

/// ExecSync in the container (as `kubectl exec`): its stdout; panics unless it exits 0.
fn exec(cri: &Cri, id: &str, cmd: &[&str]) -> String {
    let mut client = cri.runtime.clone();
    let request = req(cri::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout: 20,
    });
    let out = cri
        .block_on(async move { client.exec_sync(request).await })
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?} in {id}: {e}"))
        .into_inner();
    assert_eq!(
        out.exit_code,
        0,
        "{cmd:?} in {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the container sees: whether it has the device node /dev/nvidia0 (a character device),
/// the CDI marker of the environment it started with, and that environment, for a failure's
/// message.
fn seen_inside(cri: &Cri, id: &str) -> (bool, Option<String>, String) {
    let node = exec(
        cri,
        id,
        &["sh", "-c", "if [ -c /dev/nvidia0 ]; then echo yes; else echo no; fi"],
    );
    let environ = exec(cri, id, &["cat", ENV_AT_START]);
    let marker = environ
        .lines()
        .find_map(|v| v.strip_prefix(&format!("{MARKER}=")))
        .map(str::to_string);
    (node.trim() == "yes", marker, environ.replace('\n', " "))
}

fn spec_env(spec: &Value) -> Vec<String> {
    spec["process"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn nvidia_runtime_chained_after_vramgate_gives_and_accounts_the_gpu_under_containerd_2_1s_cri() {
    require("containerd");
    require("ctr");
    require("runc");
    let bin = toolkit_bin();
    let tmp = tempfile::Builder::new().prefix("vramgate-ntk-cri").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    // containerd's own CDI spec directory (Containerd::Two's host config: enable_cdi, and
    // cdi_spec_dirs = [<dir>/containerd/cdi]) is also the toolkit's: one spec, read by both.
    let cdi_dir = dir.join("containerd/cdi");
    std::fs::create_dir_all(&cdi_dir).unwrap();
    std::fs::write(cdi_dir.join("nvidia.json"), cdi_spec().to_string()).unwrap();
    let toolkit = dir.join("nvidia-toolkit");
    std::fs::create_dir_all(&toolkit).unwrap();
    let toolkit_config_path = toolkit.join("config.toml");
    let runtime_log = toolkit.join("nvidia-container-runtime.log");
    // The GPU Operator's installed wrapper, but its first lines: they run runc directly when
    // /proc/modules has no `nvidia` module, which on this machine without a GPU would leave
    // NVIDIA's runtime out of the chain altogether.
    let wrapper = toolkit.join("nvidia-container-runtime");
    std::fs::write(
        &wrapper,
        format!(
            "#! /bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH={} \\\n\texec {} \"$@\"\n",
            toolkit_config_path.display(),
            bin.join("nvidia-container-runtime").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // vramgate's wrapper runs NVIDIA's next (runc where it is missing), and reads the toolkit's
    // config for how NVIDIA's runtime treats NVIDIA_VISIBLE_DEVICES.
    let config = Testbed::default_config(
        &dir,
        &format!(
            "[inventory]\nbackend = \"static\"\n[runtime]\nruntimes = [{:?}, \"runc\"]\nnvidia_toolkit_configs = [{:?}]\n",
            wrapper.display().to_string(),
            toolkit_config_path.display().to_string()
        ),
    );
    let tb = Testbed::create(&dir, "runc", Path::new(HOOK), &config).unwrap();
    let mut cri = Cri::launch(tb, Containerd::Two);
    cri.dir = Some(tmp);

    for case in &CASES {
        std::fs::write(
            &toolkit_config_path,
            toolkit_config(&cdi_dir, &runtime_log, case.operator),
        )
        .unwrap();
        let _ = std::fs::remove_file(&runtime_log);
        let what = format!(
            "{:?} under the toolkit's {} setting",
            case.given,
            if case.operator { "GPU Operator" } else { "default" }
        );
        let logs = |cri: &Cri| {
            format!(
                "=== nvidia-container-runtime's log\n{}\n=== containerd's log (end)\n{}\n=== events\n{:?}",
                std::fs::read_to_string(&runtime_log).unwrap_or_default(),
                std::fs::read_to_string(cri.tb.dir.join("containerd/containerd.log"))
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n"),
                cri.events()
            )
        };
        let pods = run_all(&cri, vec![pod_config("cuda", &[("vramgate.dev/memory", REQUEST)])]);
        let id = cri.create(&pods[0], gpu_container(case.given));
        let started = cri.start_one(&id);
        match case.outcome {
            Outcome::ReservedOnGpu0 => {
                started.unwrap_or_else(|e| panic!("{what}: StartContainer: {e}\n{}", logs(&cri)));
                let (node, marker, environ) = seen_inside(&cri, &id);
                let spec: Value = serde_json::from_slice(&std::fs::read(cri.bundle_spec(&id)).unwrap()).unwrap();
                assert!(
                    node,
                    "{what}: the container has no /dev/nvidia0\n{spec}\n{}",
                    logs(&cri)
                );
                assert_eq!(
                    marker.as_deref(),
                    Some(SIMULATED_GPU_UUID),
                    "{what}: the CDI device injected; the container's environment: {environ}\nits spec: {spec}\n{}",
                    logs(&cri)
                );
                // The spec runc ran (the bundle's, as NVIDIA's runtime rewrote it in place):
                // the spec's common edits applied, so the toolkit gave nothing more.
                assert!(
                    spec_env(&spec).contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()),
                    "{what}: {:?}",
                    spec_env(&spec)
                );
                // Who gave the device: NVIDIA's runtime, from the env or the mounts; containerd
                // itself, from a CDI request (then NVIDIA's runtime, seeing
                // NVIDIA_VISIBLE_DEVICES=void, adds nothing).
                let by_nvidia = std::fs::read_to_string(&runtime_log)
                    .unwrap_or_default()
                    .contains(&format!(
                        "Injecting devices using CDI: [nvidia.com/gpu={SIMULATED_GPU_UUID}]"
                    ));
                if case.given == Given::CdiAnnotations {
                    // Both may inject it (containerd from the CRI config, NVIDIA's runtime from
                    // the spec's annotation): one device either way.
                    let annotations = spec["annotations"].as_object().cloned().unwrap_or_default();
                    assert!(
                        annotations.keys().any(|k| k.starts_with("cdi.k8s.io/")),
                        "{what}: the CDI annotation did not reach the runtime's spec: {annotations:?}"
                    );
                } else {
                    assert_eq!(
                        by_nvidia,
                        matches!(case.given, Given::Envvar | Given::VolumeMounts),
                        "{what}: whether NVIDIA's runtime injected the device\n{}",
                        logs(&cri)
                    );
                }
                assert_eq!(
                    reservations_by_gpu(&cri.tb),
                    [(SIMULATED_GPU_UUID.to_string(), vec![(id.clone(), REQUEST_BYTES)])],
                    "{what}\n{}",
                    logs(&cri)
                );
                cri.delete_pods(&pods);
                wait_released(&cri.tb, &id);
            }
            Outcome::NoGpuNothingReserved => {
                started.unwrap_or_else(|e| panic!("{what}: StartContainer: {e}\n{}", logs(&cri)));
                let (node, marker, environ) = seen_inside(&cri, &id);
                assert!(!node, "{what}: the container has /dev/nvidia0\n{}", logs(&cri));
                assert_eq!(
                    marker,
                    None,
                    "{what}: a CDI device was injected ({environ})\n{}",
                    logs(&cri)
                );
                assert_eq!(reservations(&cri.tb), [], "{what}");
                cri.delete_pods(&pods);
            }
            Outcome::Refused => {
                let err = started.expect_err(&format!("{what}: StartContainer succeeded"));
                let message = err.message();
                assert!(
                    message.contains("NVIDIA_VISIBLE_DEVICES=all") && message.contains("no GPU"),
                    "{what}: {message}\n{}",
                    logs(&cri)
                );
                assert_eq!(reservations(&cri.tb), [], "{what}");
                cri.delete_pods(&pods);
            }
        }
        assert_eq!(reservations(&cri.tb), [], "{what}: left a reservation");
    }
}
