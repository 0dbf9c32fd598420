//! `vramgate setup <engine>`: wire vramgate into Docker, containerd, podman or CRI-O the way
//! each engine expects, like `nvidia-ctk runtime configure`.
//!
//! Every engine is planned first (what each file would become) and applied second, so
//! `--dry-run` prints exactly what a real run writes. A file already in the wanted state is not
//! rewritten; a file that is changed keeps every key vramgate does not own, and its previous
//! content is kept as `<file>.vramgate-backup`. `--remove` undoes what setup did.
//!
//! - Docker: the `vramgate` runtime in `/etc/docker/daemon.json` (edited as an order-preserving
//!   JSON tree). dockerd re-reads runtimes on SIGHUP.
//! - containerd: a drop-in with a runc-v2 runtime whose `BinaryName` is `vramgate-runtime`, and
//!   the CRI annotation pass-lists (containerd passes no pod annotations to the spec unless a
//!   runtime allows them), imported from the main config.
//! - podman and CRI-O: the hooks.d JSON in `/usr/share/containers/oci/hooks.d`, the directory
//!   both read by default (podman reads `/etc/containers/oci/hooks.d` only when configured).
//! - CRI-O also: a drop-in in `/etc/crio/crio.conf.d` with the runtime handler `vramgate`
//!   (`runtime_path` = `vramgate-runtime`), for what needs the wrapper (placement, narrowing,
//!   the enforcement tiers it sets up). CRI-O passes every annotation but its own
//!   `io.kubernetes.cri-o.*` ones to the spec, so no `allowed_annotations` are needed.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::atomic_file;

pub const DOCKER_DAEMON_JSON: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CONTAINERD_DROP_IN: &str = "/etc/containerd/conf.d/vramgate.toml";
pub const HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
/// CRI-O reads its drop-ins in name order; 10- goes before the ones an admin numbers higher.
pub const CRIO_DROP_IN: &str = "/etc/crio/crio.conf.d/10-vramgate.conf";
/// The runc state directory of the `vramgate` handler: runc's own (CRI-O's default for its
/// `runc` handler), so `runc list` shows every container whichever handler ran it.
pub const CRIO_RUNTIME_ROOT: &str = "/run/runc";
pub const RUNTIME_NAME: &str = "vramgate";
pub const RUNTIME_BINARY: &str = "vramgate-runtime";
pub const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/vramgate-runtime";
pub const BACKUP_SUFFIX: &str = ".vramgate-backup";
/// Annotations the CRI plugin copies from pods and containers into the OCI spec.
pub const ANNOTATION_PATTERN: &str = "vramgate.dev/*";
/// KAI's per-container memory annotations (`nvidia.com/container.<name>.gpu-memory.*`), which
/// are a request ([`crate::request::nvidia_memory`]) and reach the spec only when allowed.
pub const NVIDIA_ANNOTATION_PATTERN: &str = "nvidia.com/container.*";
const PRESTART_JSON: &str = include_str!("../hooks/vramgate-prestart.json");
const POSTSTOP_JSON: &str = include_str!("../hooks/vramgate-poststop.json");
pub const PRESTART_FILE: &str = "vramgate-prestart.json";
pub const POSTSTOP_FILE: &str = "vramgate-poststop.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Engine {
    Docker,
    Containerd,
    Podman,
    Crio,
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid {format}: {message}; fix it by hand, then run setup again")]
    Parse {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    #[error("{path}: {what}; fix it by hand, then run setup again")]
    Shape { path: PathBuf, what: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot remove {path}: {source}")]
    Remove { path: PathBuf, source: std::io::Error },
}

pub type Result<T, E = SetupError> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct SetupOptions {
    pub engine: Engine,
    pub remove: bool,
    pub set_as_default: bool,
    /// The file (Docker: daemon.json; containerd: the drop-in) or directory (podman, CRI-O:
    /// hooks.d) to edit instead of the engine's default.
    pub config_path: Option<PathBuf>,
    /// containerd's main config, which must import the drop-in.
    pub containerd_config: Option<PathBuf>,
    /// CRI-O's drop-in with the `vramgate` runtime handler.
    pub crio_drop_in: Option<PathBuf>,
    pub runtime_path: PathBuf,
    pub hook_path: PathBuf,
    /// Seconds the engine gives the admission hook (hooks.d only; the wrapper computes its own).
    pub hook_timeout_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Write(Vec<u8>),
    Remove,
}

#[derive(Debug, Clone)]
pub struct Change {
    pub path: PathBuf,
    pub action: Action,
    /// Where the previous content goes (files that exist and hold more than vramgate's part).
    pub backup: Option<PathBuf>,
    /// The previous content, written to `backup`.
    pub previous: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Files that are already as wanted.
    pub unchanged: Vec<PathBuf>,
    /// What the operator does next (reload the engine, how to use it).
    pub next_steps: Vec<String>,
    /// What setup read to decide, and what it could not read: printed whatever changes.
    pub notes: Vec<String>,
}

/// A binary next to the running one, else its packaged path.
pub fn sibling_or(name: &str, packaged: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(packaged))
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SetupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

impl Plan {
    /// Adds a change that makes `path` hold `wanted` (`None`: not exist), when it does not.
    fn want(&mut self, path: &Path, current: Option<Vec<u8>>, wanted: Option<Vec<u8>>, backup: bool) {
        if current == wanted {
            self.unchanged.push(path.to_path_buf());
            return;
        }
        let backup = (backup && current.is_some()).then(|| {
            let mut p = path.as_os_str().to_os_string();
            p.push(BACKUP_SUFFIX);
            PathBuf::from(p)
        });
        self.changes.push(Change {
            path: path.to_path_buf(),
            action: match wanted {
                Some(bytes) => Action::Write(bytes),
                None => Action::Remove,
            },
            backup,
            previous: current,
        });
    }
}

pub fn plan(options: &SetupOptions) -> Result<Plan> {
    match options.engine {
        Engine::Docker => plan_docker(options),
        Engine::Containerd => plan_containerd(options),
        Engine::Podman | Engine::Crio => plan_hooks_d(options),
    }
}

/// Replaces `path` atomically. An engine's config directory may be a symlink (a distribution
/// or an admin moving `/etc/docker` elsewhere); atomic_file opens the directory it writes in
/// with O_NOFOLLOW, so it gets the resolved one.
fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let target = match (path.parent().filter(|d| !d.as_os_str().is_empty()), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)?.join(name),
        _ => path.to_path_buf(),
    };
    atomic_file::replace(&target, bytes, mode, None)
}

/// Writes the plan: backups first, then each file atomically (keeping its mode).
pub fn apply(plan: &Plan) -> Result<()> {
    for change in &plan.changes {
        let write_err = |source| SetupError::Write {
            path: change.path.clone(),
            source,
        };
        if let (Some(backup), Some(previous)) = (&change.backup, &change.previous) {
            replace_file(backup, previous, 0o600).map_err(|source| SetupError::Write {
                path: backup.clone(),
                source,
            })?;
        }
        match &change.action {
            Action::Write(bytes) => {
                if let Some(dir) = change.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(write_err)?;
                }
                let mode = std::fs::metadata(&change.path).map(|m| m.mode()).unwrap_or(0o644);
                replace_file(&change.path, bytes, mode).map_err(write_err)?;
            }
            Action::Remove => match std::fs::remove_file(&change.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(SetupError::Remove {
                        path: change.path.clone(),
                        source,
                    })
                }
            },
        }
    }
    Ok(())
}

fn plan_docker(options: &SetupOptions) -> Result<Plan> {
    let path = options
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(DOCKER_DAEMON_JSON));
    let current = read_optional(&path)?;
    let mut doc: Value = match &current {
        Some(bytes) if !bytes.iter().all(u8::is_ascii_whitespace) => {
            serde_json::from_slice(bytes).map_err(|e| SetupError::Parse {
                path: path.clone(),
                format: "JSON",
                message: e.to_string(),
            })?
        }
        _ => json!({}),
    };
    let shape = |what: &str| SetupError::Shape {
        path: path.clone(),
        what: what.to_string(),
    };
    let root = doc
        .as_object_mut()
        .ok_or_else(|| shape("the top level is not a JSON object"))?;
    if options.remove {
        if let Some(runtimes) = root.get_mut("runtimes").and_then(Value::as_object_mut) {
            runtimes.shift_remove(RUNTIME_NAME);
            if runtimes.is_empty() {
                root.shift_remove("runtimes");
            }
        }
        if root.get("default-runtime").and_then(Value::as_str) == Some(RUNTIME_NAME) {
            root.shift_remove("default-runtime");
        }
    } else {
        let runtimes = root.entry("runtimes").or_insert_with(|| json!({}));
        let runtimes = runtimes
            .as_object_mut()
            .ok_or_else(|| shape("\"runtimes\" is not a JSON object"))?;
        let entry = runtimes.entry(RUNTIME_NAME).or_insert_with(|| json!({}));
        let entry = entry
            .as_object_mut()
            .ok_or_else(|| shape("\"runtimes\".\"vramgate\" is not a JSON object"))?;
        // Keeps runtimeArgs or anything else an operator added to the entry.
        entry.insert("path".into(), json!(options.runtime_path.to_string_lossy()));
        if options.set_as_default {
            root.insert("default-runtime".into(), json!(RUNTIME_NAME));
        }
    }
    let wanted = if current.is_none() && doc.as_object().is_some_and(Map::is_empty) {
        None // --remove of a file setup never created
    } else {
        let mut text = serde_json::to_vec_pretty(&doc).expect("a Value serializes");
        text.push(b'\n');
        // Unchanged content keeps its own layout rather than being reformatted.
        match &current {
            Some(bytes) if serde_json::from_slice::<Value>(bytes).ok().as_ref() == Some(&doc) => Some(bytes.clone()),
            _ => Some(text),
        }
    };
    let mut plan = Plan::default();
    plan.want(&path, current, wanted, true);
    plan.next_steps.push(
        "reload dockerd so it reads the runtimes again (containers keep running): `systemctl reload docker` or `kill -HUP $(cat /var/run/docker.pid)`".into(),
    );
    if !options.remove {
        plan.next_steps.push(format!(
            "run GPU containers with `docker run --runtime {RUNTIME_NAME} -e VRAMGATE_MEMORY=6Gi -e NVIDIA_VISIBLE_DEVICES=0 ...`{}",
            if options.set_as_default { " (or without --runtime: it is the default)" } else { "" }
        ));
    }
    Ok(plan)
}

pub const CRI_PLUGIN: &str = "io.containerd.grpc.v1.cri";
/// containerd 2.x's CRI runtime plugin: where config version 3 keeps the runtimes.
pub const CRI_RUNTIME_PLUGIN_V3: &str = "io.containerd.cri.v1.runtime";
/// The runtime containerd 1.x's CRI plugin defines by itself, and runs by default.
pub const CONTAINERD_DEFAULT_RUNTIME: &str = "runc";

/// The containerd config versions setup writes a drop-in for, read from the main config's
/// `version`: 2 (containerd 1.5 to 1.7; containerd 2.x migrates it) and 3 (containerd 2.x).
/// A host without a main config gets version 2, which both read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerdVersion {
    V2,
    V3,
}

impl ContainerdVersion {
    /// The plugin whose section holds the CRI runtimes in this version.
    fn runtime_plugin(self) -> &'static str {
        match self {
            ContainerdVersion::V2 => CRI_PLUGIN,
            ContainerdVersion::V3 => CRI_RUNTIME_PLUGIN_V3,
        }
    }
}

/// The drop-in for containerd config `version`, adding the runtime `vramgate` (the wrapper
/// at `runtime_path`) to the CRI plugin, as the default runtime when `set_as_default`.
/// `host_runtime_section` is the main config's section of [`ContainerdVersion::runtime_plugin`].
///
/// **Version 2** (containerd 1.x): containerd before 2.0 merges an imported file per plugin,
/// not per key: a drop-in that sets anything under the CRI plugin replaces the host's whole
/// CRI section (containerd issue #5837; fixed in 2.0). So the drop-in carries the host's CRI
/// section with vramgate's runtime added; re-run setup after editing that section.
/// The same goes for the `runtimes` table inside it: containerd 1.x replaces its built-in one
/// (which holds `runc`, the default runtime) with the one in the file. A host config that
/// names no runtime, as Debian's does, would lose `runc`, and the CRI plugin would then refuse
/// to load at all ("no corresponding runtime configured in `containerd.runtimes` for
/// `containerd` `default_runtime_name = "runc"`"), taking every pod on the node with it. So
/// the drop-in also carries containerd's built-in `runc` when the host's section lacks it.
///
/// **Version 3** (containerd 2.x) merges imports key by key (checked with containerd 2.1.9's
/// `config dump`), so the drop-in holds vramgate's runtime alone and the host's section stays
/// where it is.
///
/// In both, vramgate's runtime takes the `options` of the host's default runtime
/// (`SystemdCgroup` above all: kubelet's cgroup driver must match the runtime's, or pods land
/// in the wrong cgroups), all but its `BinaryName`, which is the wrapper's; options the host
/// set for vramgate's runtime itself stay as they are. The default runtime is read from
/// `merged` when given (version 3: the config as containerd merges it, imports and all, see
/// [`containerd_merged_runtime_section`]), else from the main config's section.
pub fn containerd_drop_in(
    version: ContainerdVersion,
    runtime_path: &Path,
    set_as_default: bool,
    host_runtime_section: Option<&toml::Table>,
    merged: Option<&toml::Table>,
) -> String {
    let host = host_runtime_section.cloned().unwrap_or_default();
    let default_in = |section: &toml::Table| {
        section
            .get("containerd")
            .and_then(|c| c.get("default_runtime_name"))
            .and_then(toml::Value::as_str)
            .map(str::to_string)
    };
    let runtime_in = |section: &toml::Table, name: &str| {
        section
            .get("containerd")
            .and_then(|c| c.get("runtimes"))
            .and_then(|r| r.get(name))
            .and_then(toml::Value::as_table)
            .cloned()
    };
    let host_runtime = |name: &str| runtime_in(&host, name);
    let from = merged.unwrap_or(&host);
    // A merged config that already has this drop-in (setup run again after
    // --set-as-default) names vramgate as the default: the host's default is the one before.
    let default_name = default_in(from)
        .filter(|name| name != RUNTIME_NAME)
        .or_else(|| default_in(&host))
        .unwrap_or_else(|| CONTAINERD_DEFAULT_RUNTIME.to_string());
    let inherited = runtime_in(from, &default_name)
        .and_then(|r| r.get("options").and_then(toml::Value::as_table).cloned())
        .unwrap_or_default();
    // Version 2 repeats the whole host section; version 3 only what vramgate adds to it.
    let mut section = match version {
        ContainerdVersion::V2 => host,
        ContainerdVersion::V3 => {
            let mut section = toml::Table::new();
            if let Some(mine) = host_runtime(RUNTIME_NAME) {
                let runtimes = table_at(table_at(&mut section, "containerd"), "runtimes");
                runtimes.insert(RUNTIME_NAME.into(), toml::Value::Table(mine));
            }
            section
        }
    };
    let containerd = table_at(&mut section, "containerd");
    if set_as_default {
        containerd.insert("default_runtime_name".into(), RUNTIME_NAME.into());
    }
    let runtimes = table_at(containerd, "runtimes");
    if version == ContainerdVersion::V2 && !runtimes.contains_key(CONTAINERD_DEFAULT_RUNTIME) {
        let runc = table_at(runtimes, CONTAINERD_DEFAULT_RUNTIME);
        runc.insert("runtime_type".into(), "io.containerd.runc.v2".into());
    }
    let runtime = table_at(runtimes, RUNTIME_NAME);
    runtime.insert("runtime_type".into(), "io.containerd.runc.v2".into());
    let allow = toml::Value::Array(vec![ANNOTATION_PATTERN.into(), NVIDIA_ANNOTATION_PATTERN.into()]);
    runtime.insert("pod_annotations".into(), allow.clone());
    runtime.insert("container_annotations".into(), allow);
    let options = table_at(runtime, "options");
    for (key, value) in inherited {
        // `config dump` lists every option, unset ones at their zero value: the same as unset.
        if key != "BinaryName" && !options.contains_key(&key) && !is_zero(&value) {
            options.insert(key, value);
        }
    }
    options.insert("BinaryName".into(), runtime_path.to_string_lossy().into_owned().into());
    let mut plugins = toml::Table::new();
    plugins.insert(version.runtime_plugin().into(), toml::Value::Table(section));
    let mut doc = toml::Table::new();
    let (number, note) = match version {
        ContainerdVersion::V2 => (
            2,
            "# It repeats the CRI section of the main config (containerd 1.x replaces a plugin's whole\n\
             # section with an imported one): run setup again after editing that section.\n",
        ),
        ContainerdVersion::V3 => (
            3,
            "# containerd 2.x merges it key by key into the main config's CRI runtime section.\n",
        ),
    };
    doc.insert("version".into(), number.into());
    doc.insert("plugins".into(), toml::Value::Table(plugins));
    format!(
        "# Written by `vramgate setup containerd`; `vramgate setup containerd --remove` undoes it.\n{note}{}",
        toml::to_string(&doc).expect("a TOML table serializes")
    )
}

/// Whether `value` is a Go zero value (`''`, `false`, `0`, `[]`, `{}`), as `containerd config
/// dump` prints an option nobody set.
fn is_zero(value: &toml::Value) -> bool {
    match value {
        toml::Value::String(s) => s.is_empty(),
        toml::Value::Boolean(b) => !b,
        toml::Value::Integer(i) => *i == 0,
        toml::Value::Float(f) => *f == 0.0,
        toml::Value::Array(a) => a.is_empty(),
        toml::Value::Table(t) => t.is_empty(),
        toml::Value::Datetime(_) => false,
    }
}

/// How long `containerd config dump` may take: it reads a few files and prints (well under a
/// second); a containerd that hangs must not hang setup.
pub const DUMP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the merged CRI runtime section came from, for the line setup prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedFrom {
    /// `containerd --config <main> config dump`.
    Dump,
    /// The main config and these imported files, merged as containerd 2.x merges them,
    /// because the dump could not be had (the reason).
    Files { files: Vec<PathBuf>, why: String },
}

/// The CRI runtime section of containerd 2.x's config (version 3) as containerd merges it:
/// `containerd --config <main> config dump` (the `containerd` on PATH, bounded by
/// [`DUMP_TIMEOUT`]); where that fails (no containerd, a containerd 1.x that cannot read
/// version 3, a hang), the main config and its imports read here, but for `drop_in`, merged
/// key by key in containerd's order. An `SystemdCgroup = true` the admin set in an imported
/// file is in the first and the second, never in the main file alone.
pub fn containerd_merged_runtime_section(
    main: &Path,
    main_table: &toml::Table,
    drop_in: &Path,
) -> (toml::Table, MergedFrom) {
    match containerd_dump(main) {
        Ok(dump) => (dump, MergedFrom::Dump),
        Err(why) => {
            let (section, files) = merged_from_files(main, main_table, drop_in);
            (section, MergedFrom::Files { files, why })
        }
    }
}

fn runtime_section_v3(table: &toml::Table) -> Option<&toml::Table> {
    table
        .get("plugins")
        .and_then(|p| p.get(CRI_RUNTIME_PLUGIN_V3))
        .and_then(toml::Value::as_table)
}

/// The CRI runtime section of `containerd config dump`, or why there is none.
fn containerd_dump(main: &Path) -> std::result::Result<toml::Table, String> {
    use std::io::Read;
    let mut child = std::process::Command::new("containerd")
        .arg("--config")
        .arg(main)
        .args(["config", "dump"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run containerd: {e}"))?;
    // Read on threads: a dump larger than a pipe's buffer would otherwise never end.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = (&mut stdout).take(16 << 20).read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = (&mut stderr).take(64 << 10).read_to_end(&mut bytes);
        bytes
    });
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < DUMP_TIMEOUT => std::thread::sleep(std::time::Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "containerd config dump did not end within {}s",
                    DUMP_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for containerd config dump: {e}")),
        }
    };
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    if !status.success() {
        let err = String::from_utf8_lossy(&err);
        return Err(format!(
            "containerd config dump failed ({status}): {}",
            crate::one_line(err.lines().last().unwrap_or("").trim())
        ));
    }
    let dump: toml::Table = std::str::from_utf8(&out)
        .ok()
        .and_then(|text| toml::from_str(text).ok())
        .ok_or("containerd config dump printed no TOML")?;
    // containerd 1.x reads a version 3 file without error, and dumps its own version 2.
    if dump.get("version").and_then(toml::Value::as_integer) != Some(3) {
        return Err("the containerd on PATH is not 2.x (its config dump is not version 3)".into());
    }
    runtime_section_v3(&dump)
        .cloned()
        .ok_or_else(|| format!("containerd config dump has no {CRI_RUNTIME_PLUGIN_V3} section"))
}

/// The files `entry` of an `imports` list names, relative to `dir`: the file, or the files a
/// `*` in its name matches, sorted (as containerd's `filepath.Glob`).
fn import_files(entry: &str, dir: &Path) -> Vec<PathBuf> {
    let path = dir.join(entry);
    if !entry.contains('*') {
        return vec![path];
    }
    let Some(parent) = path.parent() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|f| import_covers(&path.to_string_lossy(), f))
        .collect();
    files.sort();
    files
}

/// The main config's CRI runtime section with those of its imports (and theirs) merged in,
/// key by key, in the order containerd 2.x loads them (the main file, then each import in
/// turn); `drop_in`, the file setup writes, is left out. Also the imported files read.
fn merged_from_files(main: &Path, main_table: &toml::Table, drop_in: &Path) -> (toml::Table, Vec<PathBuf>) {
    let mut merged = runtime_section_v3(main_table).cloned().unwrap_or_default();
    let dir = main.parent().unwrap_or(Path::new("/"));
    let imports_in = |table: &toml::Table| -> Vec<String> {
        table
            .get("imports")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let mut pending: std::collections::VecDeque<PathBuf> = imports_in(main_table)
        .iter()
        .flat_map(|i| import_files(i, dir))
        .collect();
    let mut read = Vec::new();
    let mut seen = std::collections::HashSet::from([main.to_path_buf()]);
    while let Some(file) = pending.pop_front() {
        if file == drop_in || !seen.insert(file.clone()) {
            continue;
        }
        let Some(table) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| toml::from_str::<toml::Table>(&text).ok())
        else {
            continue;
        };
        if let Some(section) = runtime_section_v3(&table) {
            merge_into(&mut merged, section);
        }
        let here = file.parent().unwrap_or(Path::new("/")).to_path_buf();
        pending.extend(imports_in(&table).iter().flat_map(|i| import_files(i, &here)));
        read.push(file);
    }
    (merged, read)
}

/// `from` merged into `into` key by key: tables merge, anything else replaces.
fn merge_into(into: &mut toml::Table, from: &toml::Table) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(toml::Value::Table(mine)), toml::Value::Table(theirs)) => merge_into(mine, theirs),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// The table under `key`, created when missing; a non-table there is replaced (the runtime
/// entry must be a table for containerd to read it).
fn table_at<'a>(table: &'a mut toml::Table, key: &str) -> &'a mut toml::Table {
    let entry = table
        .entry(key.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !entry.is_table() {
        *entry = toml::Value::Table(toml::Table::new());
    }
    entry.as_table_mut().expect("just made a table")
}

fn toml_string(s: &str) -> String {
    // A JSON string is a valid TOML basic string for everything a path holds.
    json!(s).to_string()
}

/// Whether containerd's `imports` entry (a path or a glob of one directory) covers `file`.
fn import_covers(entry: &str, file: &Path) -> bool {
    if Path::new(entry) == file {
        return true;
    }
    let entry = Path::new(entry);
    match (
        entry.parent(),
        entry.file_name().and_then(|n| n.to_str()),
        file.file_name().and_then(|n| n.to_str()),
    ) {
        (Some(dir), Some(pattern), Some(name)) if Some(dir) == file.parent() => match pattern.split_once('*') {
            Some((prefix, suffix)) if !suffix.contains('*') => {
                name.len() >= prefix.len() + suffix.len() && name.starts_with(prefix) && name.ends_with(suffix)
            }
            _ => false,
        },
        _ => false,
    }
}

fn parse_toml(text: &str, path: &Path) -> Result<toml::Table> {
    toml::from_str(text).map_err(|e| SetupError::Parse {
        path: path.to_path_buf(),
        format: "TOML",
        message: e.message().to_string(),
    })
}

fn imports_of(text: &str, path: &Path) -> Result<Vec<String>> {
    let table = parse_toml(text, path)?;
    match table.get("imports") {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| SetupError::Shape {
                    path: path.to_path_buf(),
                    what: "\"imports\" holds something other than strings".into(),
                })
            })
            .collect(),
        Some(_) => Err(SetupError::Shape {
            path: path.to_path_buf(),
            what: "\"imports\" is not an array".into(),
        }),
    }
}

/// The comment setup writes above an `imports` line it adds: `--remove` takes the two lines
/// out only when it finds them, so an `imports = []` the file had before stays.
const IMPORTS_MARK: &str = "# added by `vramgate setup containerd`; `--remove` takes this line and the next out";

/// The lines of `text` as byte ranges, each without its line ending (`\n` or `\r\n`), and the
/// offset where the next line starts.
fn line_spans(text: &str) -> Vec<(std::ops::Range<usize>, usize)> {
    let mut spans = Vec::new();
    let mut at = 0;
    for piece in text.split_inclusive('\n') {
        let body = piece.strip_suffix('\n').unwrap_or(piece);
        let body = body.strip_suffix('\r').unwrap_or(body);
        spans.push((at..at + body.len(), at + piece.len()));
        at += piece.len();
    }
    spans
}

/// The line of the top-level `imports = [...]` (on one line), if any, as its range in `text`
/// (without the line ending) and the offset of the next line: the lines before the first
/// table header are the top level. The edits below change only bytes inside it (or add and
/// take out whole lines of their own), so setup followed by `--remove` gives the file back
/// byte for byte, whatever its layout or line endings.
fn imports_line(text: &str) -> Option<(std::ops::Range<usize>, usize)> {
    line_spans(text)
        .into_iter()
        .take_while(|(r, _)| !text[r.clone()].trim_start().starts_with('['))
        .find(|(r, _)| {
            let l = text[r.clone()].trim_start();
            l.strip_prefix("imports")
                .is_some_and(|rest| rest.trim_start().starts_with('=') && l.trim_end().ends_with(']'))
        })
}

/// The main config text with `file` imported (text edit, so comments and layout survive; the
/// result is parsed again to check).
fn with_import(text: &str, file: &str, path: &Path) -> Result<String> {
    let quoted = toml_string(file);
    let several_lines = || SetupError::Shape {
        path: path.to_path_buf(),
        what: format!("its \"imports\" spans several lines; add {quoted} to it"),
    };
    let mut out = text.to_string();
    match imports_line(text) {
        None if text.lines().any(|l| l.trim_start().starts_with("imports")) => return Err(several_lines()),
        Some((line, _)) => {
            let body = &text[line.clone()];
            let open = line.start + body.find('[').expect("the line holds '['");
            let close = line.start + body.rfind(']').expect("the line ends with ']'");
            let inner = &text[open + 1..close];
            if inner.trim().is_empty() {
                out.insert_str(open + 1, &quoted);
            } else {
                out.insert_str(open + 1 + inner.trim_end().len(), &format!(", {quoted}"));
            }
        }
        None if text.trim().is_empty() => {
            out = format!("version = 2\n{IMPORTS_MARK}\nimports = [{quoted}]\n");
        }
        None => {
            // After `version = N` when the file starts with it (and that line ends), else first.
            let spans = line_spans(text);
            let at = spans
                .iter()
                .find(|(r, _)| {
                    let l = text[r.clone()].trim();
                    !l.is_empty() && !l.starts_with('#')
                })
                .filter(|(r, next)| text[r.clone()].trim_start().starts_with("version") && *next > r.end)
                .map_or(0, |(_, next)| *next);
            out.insert_str(at, &format!("{IMPORTS_MARK}\nimports = [{quoted}]\n"));
        }
    }
    if !imports_of(&out, path)?.iter().any(|i| i == file) {
        return Err(several_lines());
    }
    Ok(out)
}

/// The main config text without `file` imported: the undo of [`with_import`].
fn without_import(text: &str, file: &str) -> String {
    let quoted = toml_string(file);
    let Some((line, next)) = imports_line(text) else {
        return text.to_string();
    };
    let body = &text[line.clone()];
    let edited = [format!(", {quoted}"), format!("{quoted}, "), quoted.clone()]
        .iter()
        .find_map(|needle| {
            body.find(needle.as_str())
                .map(|i| body[..i].to_string() + &body[i + needle.len()..])
        })
        .unwrap_or_else(|| body.to_string());
    // The line setup added under its mark goes with the mark, once nothing else is imported.
    let mark = line_spans(text)
        .into_iter()
        .find(|(_, n)| *n == line.start)
        .filter(|(r, _)| &text[r.clone()] == IMPORTS_MARK);
    match mark {
        Some((mark, _)) if edited.replace(' ', "") == "imports=[]" => text[..mark.start].to_string() + &text[next..],
        _ => text[..line.start].to_string() + &edited + &text[line.end..],
    }
}

fn plan_containerd(options: &SetupOptions) -> Result<Plan> {
    let drop_in = options
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_DROP_IN));
    let main = options
        .containerd_config
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_CONFIG));
    let drop_in_str = drop_in.to_string_lossy().into_owned();
    let mut plan = Plan::default();
    let main_current = read_optional(&main)?;
    let main_text = match &main_current {
        Some(b) => String::from_utf8(b.clone()).map_err(|_| SetupError::Parse {
            path: main.clone(),
            format: "UTF-8 TOML",
            message: "it is not UTF-8".into(),
        })?,
        None => String::new(),
    };
    let imports = imports_of(&main_text, &main)?;
    let main_table = parse_toml(&main_text, &main)?;
    let version = match main_table.get("version").and_then(toml::Value::as_integer) {
        Some(2) => ContainerdVersion::V2,
        Some(3) => ContainerdVersion::V3,
        None if main_current.is_none() || main_text.trim().is_empty() => ContainerdVersion::V2,
        other => {
            return Err(SetupError::Shape {
                path: main.clone(),
                what: format!(
                    "containerd config version {} is not one setup writes for (it writes version 2 for containerd 1.5 to 1.7 and version 3 for containerd 2.x); migrate it with `containerd config migrate`, or add the runtime by hand as the manual's engines chapter shows",
                    other.map_or("1 (no version key)".to_string(), |v| v.to_string())
                ),
            })
        }
    };
    let host_section = main_table
        .get("plugins")
        .and_then(|p| p.get(version.runtime_plugin()))
        .and_then(toml::Value::as_table);
    let main_wanted = if options.remove {
        if imports.iter().any(|i| i == &drop_in_str) {
            Some(without_import(&main_text, &drop_in_str).into_bytes())
        } else {
            main_current.clone()
        }
    } else if imports.iter().any(|i| import_covers(i, &drop_in)) {
        main_current.clone()
    } else {
        Some(with_import(&main_text, &drop_in_str, &main)?.into_bytes())
    };
    // containerd 2.x merges imported files into the main one: the default runtime's options
    // may be set in any of them.
    let merged = (version == ContainerdVersion::V3 && !options.remove).then(|| {
        let (section, from) = containerd_merged_runtime_section(&main, &main_table, &drop_in);
        plan.notes.push(match from {
            MergedFrom::Dump => format!(
                "the default runtime's options were read from `containerd --config {} config dump`",
                main.display()
            ),
            MergedFrom::Files { files, why } => format!(
                "the default runtime's options were read from {}{} ({why})",
                main.display(),
                files.iter().map(|f| format!(", {}", f.display())).collect::<String>()
            ),
        });
        section
    });
    let drop_in_wanted = (!options.remove).then(|| {
        containerd_drop_in(
            version,
            &options.runtime_path,
            options.set_as_default,
            host_section,
            merged.as_ref(),
        )
        .into_bytes()
    });
    plan.want(&drop_in, read_optional(&drop_in)?, drop_in_wanted, false);
    plan.want(&main, main_current, main_wanted, true);
    plan.next_steps.push(
        "restart containerd, which reads its config only at start (running containers keep running): `systemctl restart containerd`".into(),
    );
    if !options.remove {
        plan.next_steps.push(format!(
            "Kubernetes: a RuntimeClass with handler \"{RUNTIME_NAME}\" and the pod annotation vramgate.dev/memory; ctr: `ctr run --runc-binary {} --env VRAMGATE_MEMORY=6Gi ...`",
            options.runtime_path.display()
        ));
    }
    Ok(plan)
}

/// A hooks.d file from the repository's template, pointing at `hook` with `timeout` seconds.
pub fn hooks_d_file(template: &str, hook: &Path, timeout: Option<u64>) -> Vec<u8> {
    let mut doc: Value = serde_json::from_str(template).expect("the hooks/ templates are valid JSON");
    doc["hook"]["path"] = json!(hook.to_string_lossy());
    if let Some(secs) = timeout {
        doc["hook"]["args"] = json!(["vramgate-hook", "prestart", "--hook-timeout", secs.to_string()]);
        doc["hook"]["timeout"] = json!(secs);
    }
    let mut out = serde_json::to_vec_pretty(&doc).expect("a Value serializes");
    out.push(b'\n');
    out
}

fn plan_hooks_d(options: &SetupOptions) -> Result<Plan> {
    let dir = options.config_path.clone().unwrap_or_else(|| PathBuf::from(HOOKS_DIR));
    let mut plan = Plan::default();
    let files = [
        (
            PRESTART_FILE,
            hooks_d_file(PRESTART_JSON, &options.hook_path, Some(options.hook_timeout_secs)),
        ),
        (POSTSTOP_FILE, hooks_d_file(POSTSTOP_JSON, &options.hook_path, None)),
    ];
    for (name, content) in files {
        let path = dir.join(name);
        let current = read_optional(&path)?;
        plan.want(&path, current, (!options.remove).then_some(content), false);
    }
    match options.engine {
        Engine::Crio => {
            let drop_in = plan_crio_drop_in(options, &mut plan)?;
            plan.next_steps.push(format!(
                "CRI-O reads {} by default and notices new files there: pods request memory with the annotation vramgate.dev/memory",
                dir.display()
            ));
            plan.next_steps.push(format!(
                "`systemctl restart crio` for the runtime handler `{RUNTIME_NAME}` in {} (running containers keep running); a RuntimeClass with handler `{RUNTIME_NAME}` gives pods placement (vramgate.dev/gpus=auto) and narrowing",
                drop_in.display()
            ));
        }
        _ => plan.next_steps.push(format!(
            "podman reads {} on every run: nothing to reload; `podman run --annotation vramgate.dev/memory=6Gi --annotation vramgate.dev/gpus=0 ...`",
            dir.display()
        )),
    }
    Ok(plan)
}

/// The drop-in that gives CRI-O the runtime handler `vramgate`.
pub fn crio_drop_in(runtime_path: &Path) -> String {
    let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
    format!(
        "# Written by `vramgate setup crio`; `vramgate setup crio --remove` deletes it.\n\
         # The runtime handler `{RUNTIME_NAME}` (a RuntimeClass's handler) runs vramgate-runtime,\n\
         # which admits, places and narrows a container's GPUs, then runs runc.\n\
         [crio.runtime.runtimes.{RUNTIME_NAME}]\n\
         runtime_path = {}\n\
         runtime_type = \"oci\"\n\
         runtime_root = {}\n",
        quoted(&runtime_path.to_string_lossy()),
        quoted(CRIO_RUNTIME_ROOT),
    )
}

/// Plans CRI-O's drop-in; returns its path. `--remove` deletes it only when it is what setup
/// writes: a file an admin changed since is theirs, and is left with a note.
fn plan_crio_drop_in(options: &SetupOptions, plan: &mut Plan) -> Result<PathBuf> {
    let path = options
        .crio_drop_in
        .clone()
        .unwrap_or_else(|| PathBuf::from(CRIO_DROP_IN));
    let current = read_optional(&path)?;
    let ours = crio_drop_in(&options.runtime_path).into_bytes();
    if !options.remove {
        // No `<file>.vramgate-backup` beside it: CRI-O reads every file of that directory as
        // config, and the old content, read after ours, would win.
        if current.as_ref().is_some_and(|c| *c != ours) {
            plan.notes.push(format!(
                "{} held other content, now replaced (not backed up beside it: CRI-O would read the backup as config)",
                path.display()
            ));
        }
        plan.want(&path, current, Some(ours), false);
    } else if current.as_ref().is_some_and(|c| *c != ours) {
        plan.notes.push(format!(
            "{} is not what setup writes (changed since, or written for another runtime path); left alone: remove it by hand if it is vramgate's",
            path.display()
        ));
    } else {
        plan.want(&path, current, None, false);
    }
    Ok(path)
}

/// What a plan does, for people: one line per file, and the new content on `--dry-run`.
pub fn describe(plan: &Plan, dry_run: bool) -> String {
    let mut out = String::new();
    let verb = |now: &'static str, would: &'static str| if dry_run { would } else { now };
    for change in &plan.changes {
        match &change.action {
            Action::Write(bytes) => {
                out += &format!("{} {}", verb("wrote", "would write"), change.path.display());
                if let Some(b) = &change.backup {
                    out += &format!(" (previous content {} {})", verb("kept in", "kept in"), b.display());
                }
                out += "\n";
                if dry_run {
                    out += &String::from_utf8_lossy(bytes);
                    if !bytes.ends_with(b"\n") {
                        out += "\n";
                    }
                }
            }
            Action::Remove => out += &format!("{} {}\n", verb("removed", "would remove"), change.path.display()),
        }
    }
    for path in &plan.unchanged {
        out += &format!("{} is already as wanted; left alone\n", path.display());
    }
    for note in &plan.notes {
        out += &format!("note: {note}\n");
    }
    if !plan.changes.is_empty() {
        for step in &plan.next_steps {
            out += &format!("next: {step}\n");
        }
    }
    out
}

/// Mode bits of an existing file, for tests and callers that check setup kept them.
pub fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(engine: Engine, dir: &Path) -> SetupOptions {
        SetupOptions {
            engine,
            remove: false,
            set_as_default: false,
            config_path: Some(dir.join(match engine {
                Engine::Docker => "daemon.json",
                Engine::Containerd => "conf.d/vramgate.toml",
                _ => "hooks.d",
            })),
            containerd_config: Some(dir.join("config.toml")),
            crio_drop_in: Some(dir.join("crio.conf.d/10-vramgate.conf")),
            runtime_path: PathBuf::from("/usr/bin/vramgate-runtime"),
            hook_path: PathBuf::from("/usr/bin/vramgate-hook"),
            hook_timeout_secs: 3660,
        }
    }

    fn run(o: &SetupOptions) -> Plan {
        let p = plan(o).unwrap();
        apply(&p).unwrap();
        p
    }

    #[test]
    fn docker_keeps_keys_backs_up_and_is_reversible() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.json");
        let original = "{\"zz-first\": true, \"runtimes\": {\"nvidia\": {\"path\": \"nvidia-container-runtime\"}}, \"log-driver\": \"journald\"}\n";
        std::fs::write(&path, original).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let mut o = options(Engine::Docker, dir.path());
        o.set_as_default = true;
        assert_eq!(run(&o).changes.len(), 1);
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["zz-first", "runtimes", "log-driver", "default-runtime"]);
        assert_eq!(v["runtimes"]["nvidia"]["path"], "nvidia-container-runtime");
        assert_eq!(v["runtimes"]["vramgate"]["path"], "/usr/bin/vramgate-runtime");
        assert_eq!(v["default-runtime"], "vramgate");
        assert_eq!(mode_of(&path), Some(0o640));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("daemon.json.vramgate-backup")).unwrap(),
            original
        );
        // Twice: nothing to do.
        let again = run(&o);
        assert!(again.changes.is_empty() && again.unchanged == [path.clone()]);
        o.remove = true;
        run(&o);
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(original).unwrap());
        assert!(run(&o).changes.is_empty());
    }

    #[test]
    fn a_symlinked_config_directory_is_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("daemon.json"), "{\"log-driver\": \"journald\"}\n").unwrap();
        let link = dir.path().join("docker");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        run(&options(Engine::Docker, &link));
        let v: Value = serde_json::from_slice(&std::fs::read(real.join("daemon.json")).unwrap()).unwrap();
        assert_eq!(v["runtimes"]["vramgate"]["path"], "/usr/bin/vramgate-runtime");
        assert!(real.join("daemon.json.vramgate-backup").exists());
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    }

    #[test]
    fn docker_refuses_what_it_cannot_edit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.json");
        for (bad, needle) in [
            ("{not json", "not valid JSON"),
            ("[]", "not a JSON object"),
            ("{\"runtimes\": 1}", "\"runtimes\""),
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = plan(&options(Engine::Docker, dir.path())).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("daemon.json"), "{err}");
        }
        // Missing file: created; removing again leaves nothing behind.
        std::fs::remove_file(&path).unwrap();
        let mut o = options(Engine::Docker, dir.path());
        run(&o);
        assert!(path.exists());
        o.remove = true;
        run(&o);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), "{}");
    }

    #[test]
    fn containerd_imports_and_drop_in() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        let original = "# host config\nversion = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"x\"\n";
        std::fs::write(&main, original).unwrap();
        let mut o = options(Engine::Containerd, dir.path());
        run(&o);
        let text = std::fs::read_to_string(&main).unwrap();
        let drop_in = dir.path().join("conf.d/vramgate.toml");
        assert!(
            text.starts_with(&format!(
                "# host config\nversion = 2\n{IMPORTS_MARK}\nimports = [{}]\n",
                toml_string(&drop_in.to_string_lossy())
            )),
            "{text}"
        );
        let d: toml::Table = toml::from_str(&std::fs::read_to_string(&drop_in).unwrap()).unwrap();
        let rt = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vramgate"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(rt["options"]["BinaryName"].as_str(), Some("/usr/bin/vramgate-runtime"));
        assert_eq!(rt["pod_annotations"][0].as_str(), Some("vramgate.dev/*"));
        assert_eq!(rt["pod_annotations"][1].as_str(), Some("nvidia.com/container.*"));
        // The host's CRI settings ride along, or containerd 1.x would drop them; so does the
        // built-in runc runtime, which the host's section does not name.
        assert_eq!(
            d["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"].as_str(),
            Some("x")
        );
        let runtimes = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        assert_eq!(runtimes["runc"]["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        // A runc the host does define is kept as it is.
        let host: toml::Table = toml::from_str("[containerd.runtimes.runc.options]\nSystemdCgroup = true\n").unwrap();
        let d: toml::Table = toml::from_str(&containerd_drop_in(
            ContainerdVersion::V2,
            Path::new("/r"),
            false,
            Some(&host),
            None,
        ))
        .unwrap();
        let runc = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"];
        assert_eq!(runc.get("runtime_type"), None);
        assert_eq!(runc["options"]["SystemdCgroup"].as_bool(), Some(true));
        // vramgate's runtime takes the default runtime's options, but not its binary; what the
        // host set for vramgate's runtime itself stays.
        let host: toml::Table = toml::from_str(
            "[containerd]\ndefault_runtime_name = \"nvidia\"\n\
             [containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/nvidia-container-runtime\"\n\
             SystemdCgroup = true\nRoot = \"/run/nv\"\n\
             [containerd.runtimes.vramgate.options]\nRoot = \"/run/mine\"\n",
        )
        .unwrap();
        let d: toml::Table = toml::from_str(&containerd_drop_in(
            ContainerdVersion::V2,
            Path::new("/r"),
            true,
            Some(&host),
            None,
        ))
        .unwrap();
        let ours = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["vramgate"]["options"];
        assert_eq!(ours["BinaryName"].as_str(), Some("/r"));
        assert_eq!(ours["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(ours["Root"].as_str(), Some("/run/mine"));
        assert!(run(&o).changes.is_empty());
        o.remove = true;
        run(&o);
        assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
        assert!(!drop_in.exists());
    }

    /// containerd 2.x's config version 3: the drop-in is version 3 and holds vramgate's
    /// runtime alone, under the CRI runtime plugin, with the default runtime's options.
    #[test]
    fn containerd_2_gets_a_version_3_drop_in() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        let original = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"x\"\n";
        std::fs::write(&main, original).unwrap();
        let mut o = options(Engine::Containerd, dir.path());
        o.set_as_default = true;
        run(&o);
        let drop_in = dir.path().join("conf.d/vramgate.toml");
        let text = std::fs::read_to_string(&main).unwrap();
        assert!(
            text.starts_with(&format!(
                "version = 3\n{IMPORTS_MARK}\nimports = [{}]\n",
                toml_string(&drop_in.to_string_lossy())
            )),
            "{text}"
        );
        let d: toml::Table = toml::from_str(&std::fs::read_to_string(&drop_in).unwrap()).unwrap();
        assert_eq!(d["version"].as_integer(), Some(3));
        assert_eq!(d["plugins"].as_table().unwrap().len(), 1, "{d}");
        let containerd = &d["plugins"][CRI_RUNTIME_PLUGIN_V3]["containerd"];
        assert_eq!(containerd["default_runtime_name"].as_str(), Some("vramgate"));
        let runtimes = containerd["runtimes"].as_table().unwrap();
        assert_eq!(
            runtimes.keys().collect::<Vec<_>>(),
            ["vramgate"],
            "only vramgate's runtime: {d}"
        );
        let rt = &runtimes["vramgate"];
        assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
        assert_eq!(rt["container_annotations"][0].as_str(), Some("vramgate.dev/*"));
        assert_eq!(rt["options"]["BinaryName"].as_str(), Some("/usr/bin/vramgate-runtime"));
        assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert!(run(&o).changes.is_empty());
        o.remove = true;
        run(&o);
        assert_eq!(std::fs::read_to_string(&main).unwrap(), original);
        assert!(!drop_in.exists());
        // Version 1 (no key in a file that has content) is still refused, with the way out.
        std::fs::write(&main, "[plugins.cri]\n").unwrap();
        o.remove = false;
        let err = plan(&o).unwrap_err().to_string();
        assert!(
            err.contains("version 1") && err.contains("containerd config migrate"),
            "{err}"
        );
    }

    /// Where `containerd config dump` cannot be had, the main config and its imports are
    /// merged as containerd 2.x merges them: later files win key by key, setup's own drop-in
    /// is left out, and the drop-in takes the merged default runtime's options.
    #[test]
    fn containerd_2_options_set_in_an_imported_file_are_merged_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        let conf_d = dir.path().join("conf.d");
        std::fs::create_dir(&conf_d).unwrap();
        let drop_in = conf_d.join("vramgate.toml");
        let runc = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]";
        let text = format!("version = 3\nimports = [\"conf.d/*.toml\", \"/nonexistent.toml\"]\n{runc}\nRoot = \"/run/main\"\nIoUid = 7\n");
        std::fs::write(&main, &text).unwrap();
        std::fs::write(
            conf_d.join("10-site.toml"),
            format!("version = 3\nimports = [\"../more.toml\"]\n{runc}\nSystemdCgroup = true\nBinaryName = \"/opt/runc\"\nRoot = \"/run/site\"\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("more.toml"),
            format!("version = 3\n{runc}\nIoUid = 9\n"),
        )
        .unwrap();
        // A drop-in of an earlier setup, which must not feed itself.
        std::fs::write(&drop_in, format!("version = 3\n{runc}\nRoot = \"/run/stale\"\n")).unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let (merged, files) = merged_from_files(&main, &table, &drop_in);
        assert_eq!(
            files,
            [conf_d.join("10-site.toml"), dir.path().join("conf.d/../more.toml")]
        );
        let options = &merged["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(options["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(options["Root"].as_str(), Some("/run/site"));
        assert_eq!(options["IoUid"].as_integer(), Some(9));
        let d: toml::Table = toml::from_str(&containerd_drop_in(
            ContainerdVersion::V3,
            Path::new("/usr/bin/vramgate-runtime"),
            false,
            runtime_section_v3(&table),
            Some(&merged),
        ))
        .unwrap();
        let ours = &d["plugins"][CRI_RUNTIME_PLUGIN_V3]["containerd"]["runtimes"]["vramgate"]["options"];
        assert_eq!(ours["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(ours["BinaryName"].as_str(), Some("/usr/bin/vramgate-runtime"));
        assert_eq!(ours["Root"].as_str(), Some("/run/site"));
        assert_eq!(
            d["plugins"][CRI_RUNTIME_PLUGIN_V3]["containerd"].get("default_runtime_name"),
            None
        );
    }

    #[test]
    fn containerd_import_edits() {
        let p = Path::new("/etc/containerd/config.toml");
        let f = "/etc/containerd/conf.d/vramgate.toml";
        assert_eq!(
            with_import("", f, p).unwrap(),
            format!("version = 2\n{IMPORTS_MARK}\nimports = [\"{f}\"]\n")
        );
        assert_eq!(
            with_import("version = 2\nimports = [\"/a.toml\"]\n[x]\n", f, p).unwrap(),
            format!("version = 2\nimports = [\"/a.toml\", \"{f}\"]\n[x]\n")
        );
        assert_eq!(
            with_import("imports = []\n", f, p).unwrap(),
            format!("imports = [\"{f}\"]\n")
        );
        assert!(with_import("imports = [\n  \"/a.toml\",\n]\n", f, p)
            .unwrap_err()
            .to_string()
            .contains("several lines"));
        assert_eq!(
            without_import(&format!("imports = [\"/a\", \"{f}\"]\n"), f),
            "imports = [\"/a\"]\n"
        );
        // Setup then --remove gives every layout back byte for byte: an `imports = []` the file
        // had stays (containerd's own `config default` writes one), spacing inside the brackets,
        // CRLF line endings and a last line without one survive.
        for original in [
            "version = 2\nimports = []\noom_score = 0\n",
            "version = 3\r\nimports = [ ]\r\n[grpc]\r\n",
            "imports = [ \"/a.toml\" ]\n[x]",
            "imports = [\"/a.toml\",\"/b.toml\"]\n",
            "# c\nversion = 2\n\n[x]\ny = 1\n",
            "version = 2",
            "[x]\r\ny = 1\r\n",
        ] {
            let added = with_import(original, f, p).unwrap();
            assert!(imports_of(&added, p).unwrap().iter().any(|i| i == f), "{added:?}");
            assert_eq!(without_import(&added, f), original, "{added:?}");
        }
        // Without its mark, an emptied line is the admin's and stays.
        assert_eq!(without_import(&format!("imports = [\"{f}\"]\n"), f), "imports = []\n");
        assert!(import_covers("/etc/containerd/conf.d/*.toml", Path::new(f)));
        assert!(!import_covers("/etc/containerd/other/*.toml", Path::new(f)));
    }

    #[test]
    fn hooks_d_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(Engine::Podman, dir.path());
        o.hook_path = PathBuf::from("/opt/vg/vramgate-hook");
        o.hook_timeout_secs = 960;
        run(&o);
        let pre: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("hooks.d").join(PRESTART_FILE)).unwrap()).unwrap();
        assert_eq!(pre["hook"]["path"], "/opt/vg/vramgate-hook");
        assert_eq!(pre["hook"]["timeout"], 960);
        assert_eq!(pre["hook"]["args"][3], "960");
        assert_eq!(pre["stages"], json!(["prestart"]));
        // Every container: a request can come from the env as well as from the annotation.
        assert_eq!(pre["when"], json!({"always": true}));
        let post: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("hooks.d").join(POSTSTOP_FILE)).unwrap()).unwrap();
        assert_eq!(post["stages"], json!(["poststop"]));
        assert!(run(&o).changes.is_empty());
        o.remove = true;
        run(&o);
        assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 0);
    }

    #[test]
    fn crio_gets_the_runtime_handler_drop_in_and_remove_takes_only_that_away() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = options(Engine::Crio, dir.path());
        o.runtime_path = PathBuf::from("/opt/vg/vramgate-runtime");
        let conf_d = dir.path().join("crio.conf.d");
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(
            conf_d.join("20-admin.conf"),
            "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\n",
        )
        .unwrap();
        let drop_in = conf_d.join("10-vramgate.conf");
        run(&o);
        let doc: toml::Table = std::fs::read_to_string(&drop_in).unwrap().parse().unwrap();
        let handler = &doc["crio"]["runtime"]["runtimes"]["vramgate"];
        assert_eq!(handler["runtime_path"].as_str(), Some("/opt/vg/vramgate-runtime"));
        assert_eq!(handler["runtime_type"].as_str(), Some("oci"));
        assert_eq!(handler["runtime_root"].as_str(), Some("/run/runc"));
        assert_eq!(handler.as_table().unwrap().len(), 3, "{handler}");
        assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 2);
        assert!(run(&o).changes.is_empty());

        o.remove = true;
        run(&o);
        assert!(!drop_in.exists());
        let left: Vec<_> = std::fs::read_dir(&conf_d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["20-admin.conf"], "an admin's drop-in goes, or a backup is left");
        assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 0);

        // A drop-in changed since setup wrote it is the admin's: --remove leaves it, saying so.
        o.remove = false;
        run(&o);
        let edited = format!(
            "{}monitor_env = [\"A=1\"]\n",
            std::fs::read_to_string(&drop_in).unwrap()
        );
        std::fs::write(&drop_in, &edited).unwrap();
        o.remove = true;
        let plan = run(&o);
        assert_eq!(std::fs::read_to_string(&drop_in).unwrap(), edited);
        assert!(plan.notes.iter().any(|n| n.contains("left alone")), "{:?}", plan.notes);
        // Setup again over it: replaced, and nothing but the drop-ins in CRI-O's directory.
        o.remove = false;
        let plan = run(&o);
        assert!(
            plan.notes.iter().any(|n| n.contains("now replaced")),
            "{:?}",
            plan.notes
        );
        let mut left: Vec<_> = std::fs::read_dir(&conf_d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["10-vramgate.conf", "20-admin.conf"]);
    }
}
