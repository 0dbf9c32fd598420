//! `vramgate-runtime`: a runc-compatible wrapper, in the manner of `nvidia-container-runtime`.
//!
//! Engines that cannot be told to run an OCI hook (Docker, containerd) can be told to use
//! another runtime binary. On `create`, this wrapper adds the vramgate hooks to the bundle's
//! `config.json` when the spec carries a VRAM request; then, for every verb, it `exec`s the
//! next runtime (from config: the first of an ordered list found on PATH) with the argv it was
//! given. Everything but the `hooks` entries it adds is left byte-for-byte alone: the spec is
//! edited as an order-preserving JSON tree, never through structs that drop unknown fields, and
//! a spec without a request is not even rewritten.
//!
//! Its own errors go to stderr and, when runc's `--log` is given, to that file in runc's log
//! format: containerd's shim reads the last error line of that file into the message Docker
//! and `ctr` show, and stderr alone would be lost. Nothing is ever printed on a successful
//! path: containerd's go-runc parses the combined output of verbs such as `state` as JSON.

use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::{self, Config, ConfigError, RuntimeConfig, CONFIG_ENV};
use crate::hook::HOOK_TIMEOUT_MARGIN;
use crate::request;
use crate::spec::{self, SpecError, SpecView, MAX_SPEC_BYTES};

/// runc's global options that take a value (`runc --root X create …`). Everything else before
/// the verb is a switch (`--debug`, `--systemd-cgroup`, `--help`, `--version`).
pub const GLOBAL_VALUE_FLAGS: &[&str] = &["root", "log", "log-format", "criu", "rootless"];
/// `runc create` options that take a value.
pub const CREATE_VALUE_FLAGS: &[&str] = &["bundle", "b", "console-socket", "pid-file", "preserve-fds"];
pub const LOG_FLAG: &str = "log";
pub const LOG_FORMAT_FLAG: &str = "log-format";
pub const CREATE_VERB: &str = "create";
pub const HOOK_BINARY: &str = "vramgate-hook";
pub const DEFAULT_HOOK_PATH: &str = "/usr/bin/vramgate-hook";
/// What the hook timeout adds to `max_wait_timeout`: the hook ends its longest wait
/// [`HOOK_TIMEOUT_MARGIN`] before the runtime would kill it, and the rest covers reading the
/// GPU inventory and the ledger on a loaded host.
pub const HOOK_TIMEOUT_SLACK: Duration = Duration::from_secs(60);
/// The stages the wrapper adds: admission as soon as the init pid exists, release on delete.
pub const ADMISSION_STAGE: &str = "createRuntime";
pub const RELEASE_STAGE: &str = "poststop";
/// Stages at which a vramgate hook already in the spec admits (podman's hooks.d adds prestart).
const ADMISSION_STAGES: &[&str] = &["prestart", "createRuntime", "createContainer"];

const _: () = assert!(HOOK_TIMEOUT_SLACK.as_secs() > HOOK_TIMEOUT_MARGIN.as_secs());

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    Spec(#[from] SpecError),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("the container spec {path} has \"{field}\" of JSON type {found}, not an {expected}; fix the engine that wrote it")]
    SpecShape {
        path: PathBuf,
        field: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("cannot write the container spec {path}: {source}")]
    WriteSpec { path: PathBuf, source: std::io::Error },
    #[error("no runtime to run next: none of {tried:?} ([runtime] runtimes in {config}) is on PATH ({path}); install runc or fix the list")]
    NoRuntime {
        tried: Vec<String>,
        config: String,
        path: String,
    },
    #[error("cannot exec the runtime {path}: {source}")]
    Exec { path: PathBuf, source: nix::Error },
    #[error("an argument contains a NUL byte")]
    NulInArgument,
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// What the wrapper needs from runc's command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The verb (`create`, `state`, …); `None` for `runc --version` and the like.
    pub verb: Option<OsString>,
    /// `--log`: where runc (and so we) write errors for the engine to read.
    pub log: Option<PathBuf>,
    /// `--log-format`: `text` (runc's default) or `json` (what containerd passes).
    pub log_format: Option<OsString>,
    /// For `create`: the bundle directory, `.` when no flag names it.
    pub bundle: Option<PathBuf>,
}

/// Splits `--name=value`, `-name=value`, `--name`, `-name` into the name and the inline value.
fn flag_name(arg: &OsStr) -> Option<(&[u8], Option<&OsStr>)> {
    let bytes = arg.as_bytes();
    let stripped = bytes.strip_prefix(b"--").or_else(|| bytes.strip_prefix(b"-"))?;
    if stripped.is_empty() || stripped.starts_with(b"-") {
        return None; // "-", "--" and "---x" are not flags runc knows
    }
    match stripped.iter().position(|&b| b == b'=') {
        Some(eq) => Some((&stripped[..eq], Some(OsStr::from_bytes(&stripped[eq + 1..])))),
        None => Some((stripped, None)),
    }
}

fn takes_value(name: &[u8], flags: &[&str]) -> bool {
    flags.iter().any(|f| f.as_bytes() == name)
}

/// Reads the global flags, the verb and, for `create`, the bundle. `args` excludes argv[0].
/// Flags are read the way runc's CLI library reads them: one or two dashes, the value after a
/// space or an `=`; so `runc --root create create -b create id` has verb `create` and bundle
/// `create`.
/// The value of a flag that takes one: after `=` (`--bundle=/b`), else the next argument
/// (`--bundle /b`), which `i` then steps over.
fn flag_value(inline: Option<&OsStr>, args: &[OsString], i: &mut usize) -> Option<OsString> {
    match inline {
        Some(v) => Some(v.to_os_string()),
        None => {
            *i += 1;
            args.get(*i - 1).cloned()
        }
    }
}

pub fn parse_args(args: &[OsString]) -> Invocation {
    let mut inv = Invocation::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some((name, inline)) = flag_name(arg) else {
            inv.verb = Some(arg.clone());
            break;
        };
        if !takes_value(name, GLOBAL_VALUE_FLAGS) {
            continue;
        }
        let value = flag_value(inline, args, &mut i);
        if name == LOG_FLAG.as_bytes() {
            inv.log = value.map(PathBuf::from);
        } else if name == LOG_FORMAT_FLAG.as_bytes() {
            inv.log_format = value;
        }
    }
    if inv.verb.as_deref() != Some(OsStr::new(CREATE_VERB)) {
        return inv;
    }
    let mut bundle = None;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg.as_bytes() == b"--" {
            break;
        }
        let Some((name, inline)) = flag_name(arg) else {
            continue; // the container id
        };
        if !takes_value(name, CREATE_VALUE_FLAGS) {
            continue;
        }
        let value = flag_value(inline, args, &mut i);
        if name == b"bundle" || name == b"b" {
            bundle = value;
        }
    }
    inv.bundle = Some(bundle.map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")));
    inv
}

/// Where the hook binary is: config, else next to this wrapper, else the packaged path.
pub fn hook_path(runtime: &RuntimeConfig) -> PathBuf {
    if let Some(path) = &runtime.hook_path {
        return path.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(HOOK_BINARY)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HOOK_PATH))
}

/// The seconds the runtime gives each vramgate hook: the longest allowed wait plus slack.
pub fn hook_timeout_secs(config: &Config) -> u64 {
    config.max_wait_timeout.as_secs() + HOOK_TIMEOUT_SLACK.as_secs()
}

/// The hook entry for `stage`, as it goes into `config.json`.
pub fn hook_entry(hook: &Path, stage: &str, timeout_secs: u64, config_env: Option<&Path>) -> Value {
    let mut entry = Map::new();
    entry.insert("path".into(), json!(hook.to_string_lossy()));
    entry.insert(
        "args".into(),
        json!([HOOK_BINARY, stage, "--hook-timeout", timeout_secs.to_string()]),
    );
    // With an env list the hook gets only that list; without one, runc's own environment.
    if let Some(path) = config_env {
        entry.insert(
            "env".into(),
            json!([format!("{CONFIG_ENV}={}", path.to_string_lossy())]),
        );
    }
    entry.insert("timeout".into(), json!(timeout_secs));
    Value::Object(entry)
}

/// Whether a hook entry runs vramgate-hook (by path or by argv[0]), whoever added it.
pub fn is_vramgate_hook(entry: &Value, hook: &Path) -> bool {
    let path = entry.get("path").and_then(Value::as_str).unwrap_or_default();
    let arg0 = entry
        .get("args")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .unwrap_or_default();
    Path::new(path) == hook
        || Path::new(path).file_name() == Some(OsStr::new(HOOK_BINARY))
        || Path::new(arg0).file_name() == Some(OsStr::new(HOOK_BINARY))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Adds the admission and release hooks to `spec` unless a vramgate hook is already at that
/// stage. Returns whether anything changed; every other field is left as it was.
pub fn add_hooks(spec: &mut Value, path: &Path, admission: Value, release: Value, hook: &Path) -> Result<bool> {
    let shape = |field: &str, found: &Value, expected| RuntimeError::SpecShape {
        path: path.to_path_buf(),
        field: field.to_string(),
        found: json_type(found),
        expected,
    };
    let root = match spec {
        Value::Object(map) => map,
        other => return Err(shape("(top level)", other, "object")),
    };
    let hooks = root.entry("hooks").or_insert_with(|| Value::Object(Map::new()));
    if hooks.is_null() {
        *hooks = Value::Object(Map::new());
    }
    let hooks = match hooks {
        Value::Object(map) => map,
        other => return Err(shape("hooks", other, "object")),
    };
    for stage in ADMISSION_STAGES.iter().chain([&RELEASE_STAGE]) {
        match hooks.get(*stage) {
            None | Some(Value::Null) | Some(Value::Array(_)) => {}
            Some(other) => return Err(shape(&format!("hooks.{stage}"), other, "array")),
        }
    }
    let present = |hooks: &Map<String, Value>, stage: &str| {
        hooks
            .get(stage)
            .and_then(Value::as_array)
            .is_some_and(|entries| entries.iter().any(|e| is_vramgate_hook(e, hook)))
    };
    let mut changed = false;
    let mut append = |hooks: &mut Map<String, Value>, stage: &str, entry: Value| {
        let list = hooks.entry(stage).or_insert_with(|| Value::Array(Vec::new()));
        if list.is_null() {
            *list = Value::Array(Vec::new());
        }
        if let Value::Array(entries) = list {
            entries.push(entry);
            changed = true;
        }
    };
    if !ADMISSION_STAGES.iter().any(|s| present(hooks, s)) {
        append(hooks, ADMISSION_STAGE, admission);
    }
    if !present(hooks, RELEASE_STAGE) {
        append(hooks, RELEASE_STAGE, release);
    }
    Ok(changed)
}

/// Replaces `path` with `bytes`: a temporary file in the same directory with the original's
/// mode and owner, fsync, rename over, fsync of the directory. A reader (runc) sees the old
/// file or the new one, never a torn one, and a crash leaves one of the two.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.vramgate-{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&temp)?;
        // The umask narrowed the mode at creation; the original's is what runc and the engine expect.
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The wrapper's config, read from disk the first time it is needed (a `create` without a
/// request before `exec` needs only the runtime list; most verbs need nothing else).
pub struct LazyConfig {
    path: PathBuf,
    loaded: Option<Config>,
}

impl LazyConfig {
    pub fn new(path: PathBuf) -> LazyConfig {
        LazyConfig { path, loaded: None }
    }

    pub fn get(&mut self) -> Result<&Config, ConfigError> {
        if self.loaded.is_none() {
            self.loaded = Some(Config::load_from(&self.path)?);
        }
        Ok(self.loaded.as_ref().expect("just loaded"))
    }
}

/// Adds the hooks to `<bundle>/config.json` when its spec requests VRAM. Returns whether the
/// file was rewritten. The config is read only when there is a request.
pub fn prepare_bundle(bundle: &Path, config: &mut LazyConfig) -> Result<bool> {
    let path = bundle.join("config.json");
    let read_err = |source| SpecError::ReadSpec {
        path: path.clone(),
        source,
    };
    let bytes = spec::read_limited(&path, MAX_SPEC_BYTES)
        .map_err(read_err)?
        .ok_or_else(|| SpecError::SpecTooLarge { path: path.clone() })?;
    let view = SpecView::parse(&bytes, &path)?;
    if !request::has_request(&view) {
        return Ok(false);
    }
    let config = config.get()?;
    let mut spec: Value = serde_json::from_slice(&bytes).map_err(|source| SpecError::ParseSpec {
        path: path.clone(),
        source,
    })?;
    let hook = hook_path(&config.runtime);
    let timeout = hook_timeout_secs(config);
    let config_env = std::env::var_os(CONFIG_ENV).map(|p| std::path::absolute(&p).unwrap_or_else(|_| p.into()));
    let entry = |stage| hook_entry(&hook, stage, timeout, config_env.as_deref());
    if !add_hooks(&mut spec, &path, entry(ADMISSION_STAGE), entry(RELEASE_STAGE), &hook)? {
        return Ok(false);
    }
    // Keep the writer's layout: engines write compact JSON, `runc spec` writes indented.
    let pretty = bytes.starts_with(b"{\n");
    let out = if pretty {
        serde_json::to_vec_pretty(&spec)
    } else {
        serde_json::to_vec(&spec)
    }
    .expect("a serde_json::Value always serializes");
    let meta = std::fs::metadata(&path).map_err(read_err)?;
    let owner = (meta.uid() != nix::unistd::geteuid().as_raw() || meta.gid() != nix::unistd::getegid().as_raw())
        .then(|| (meta.uid(), meta.gid()));
    write_atomically(&path, &out, meta.mode(), owner).map_err(|source| RuntimeError::WriteSpec {
        path: path.clone(),
        source,
    })?;
    Ok(true)
}

/// The runtime to exec: the first of `runtimes` that exists, skipping this wrapper itself
/// (installed under a runtime's name, it would exec itself forever).
pub fn find_next_runtime(runtimes: &[String], path_var: Option<&OsStr>, myself: Option<&Path>) -> Option<PathBuf> {
    let dirs: Vec<PathBuf> = path_var.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
    let is_me = |candidate: &Path| myself.is_some_and(|me| candidate.canonicalize().is_ok_and(|c| c == me));
    let runnable =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) && !is_me(p);
    for name in runtimes {
        if name.contains('/') {
            if runnable(Path::new(name)) {
                return Some(PathBuf::from(name));
            }
            continue;
        }
        if let Some(found) = dirs.iter().map(|d| d.join(name)).find(|p| runnable(p)) {
            return Some(found);
        }
    }
    None
}

/// RFC 3339 UTC time with seconds, as runc's logrus writes it, from the system clock.
pub fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(now.as_secs() as i64, now.subsec_nanos())
}

/// Days-to-civil conversion (Howard Hinnant's algorithm), so no date crate is needed.
pub fn rfc3339(unix_secs: i64, nanos: u32) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        nanos
    )
}

/// One error line in runc's log format: JSON (`--log-format json`, what containerd passes)
/// or logrus text (runc's default).
pub fn log_line(message: &str, format: Option<&OsStr>, time: &str) -> String {
    if format == Some(OsStr::new("json")) {
        json!({ "level": "error", "msg": message, "time": time }).to_string() + "\n"
    } else {
        format!("time=\"{time}\" level=error msg={}\n", json!(message))
    }
}

/// Reports an error where the engine looks: stderr and, with `--log`, runc's log file.
pub fn report_error(inv: &Invocation, message: &str) {
    eprintln!("{message}");
    if let Some(log) = &inv.log {
        let line = log_line(message, inv.log_format.as_deref(), &rfc3339_now());
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(log)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            eprintln!("vramgate: cannot append to the runtime log {}: {e}", log.display());
        }
    }
}

/// `exec`s `runtime` with `args` (argv[1..] as received) in place of this process. Returns
/// only on failure.
pub fn exec_runtime(runtime: &Path, args: &[OsString]) -> RuntimeError {
    let to_c = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| RuntimeError::NulInArgument);
    let program = match to_c(runtime.as_os_str()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    // argv[0] is the runtime's own path, as nvidia-container-runtime passes it; the rest is
    // byte-for-byte what the engine gave us.
    let mut argv = vec![program.clone()];
    for a in args {
        match to_c(a) {
            Ok(c) => argv.push(c),
            Err(e) => return e,
        }
    }
    match nix::unistd::execv(&program, &argv) {
        Err(source) => RuntimeError::Exec {
            path: runtime.to_path_buf(),
            source,
        },
        Ok(never) => match never {},
    }
}

/// The whole wrapper: `args` is argv without argv[0]. Returns only when it could not exec.
pub fn run(args: &[OsString]) -> RuntimeError {
    let inv = parse_args(args);
    let config_path = config::config_path();
    let mut config = LazyConfig::new(config_path.clone());
    if let Some(bundle) = &inv.bundle {
        if let Err(e) = prepare_bundle(bundle, &mut config) {
            let e = RuntimeError::from(e);
            report_error(&inv, &format!("vramgate: {e}"));
            return e;
        }
    }
    let runtimes = match config.get() {
        Ok(config) => config.runtime.runtimes.clone(),
        Err(e) if inv.bundle.is_some() => {
            report_error(&inv, &format!("vramgate: {e}"));
            return e.into();
        }
        // A broken config must not stop `delete` or `kill` of running containers: pass the
        // verb to the default runtimes, and say so only in the log (never on stdout/stderr,
        // which the engine may parse).
        Err(e) => {
            if let Some(log) = &inv.log {
                let line = log_line(
                    &format!("vramgate: {e}; using the default runtimes"),
                    inv.log_format.as_deref(),
                    &rfc3339_now(),
                )
                .replace("\"error\"", "\"warning\"")
                .replace("level=error", "level=warning");
                let _ = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(log)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
            }
            RuntimeConfig::default().runtimes
        }
    };
    let path_var = std::env::var_os("PATH");
    let myself = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let Some(next) = find_next_runtime(&runtimes, path_var.as_deref(), myself.as_deref()) else {
        let e = RuntimeError::NoRuntime {
            tried: runtimes,
            config: config_path.display().to_string(),
            path: path_var.unwrap_or_default().to_string_lossy().into_owned(),
        };
        report_error(&inv, &format!("vramgate: {e}"));
        return e;
    };
    let e = exec_runtime(&next, args);
    report_error(&inv, &format!("vramgate: {e}"));
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(args: &[&str]) -> Invocation {
        parse_args(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn verbs_and_global_flags() {
        let cases: &[(&[&str], Option<&str>, Option<&str>, Option<&str>)] = &[
            // args, verb, log, bundle
            (&["--version"], None, None, None),
            (&["-v"], None, None, None),
            (&["features"], Some("features"), None, None),
            (&["state", "id"], Some("state"), None, None),
            (
                &[
                    "--root",
                    "/r",
                    "--log",
                    "/l",
                    "--log-format",
                    "json",
                    "delete",
                    "--force",
                    "id",
                ],
                Some("delete"),
                Some("/l"),
                None,
            ),
            (
                &["--root=/r", "--log=/l", "kill", "id", "9"],
                Some("kill"),
                Some("/l"),
                None,
            ),
            (
                &["-log", "/l", "-root", "create", "state", "id"],
                Some("state"),
                Some("/l"),
                None,
            ),
            (
                &["--debug", "--systemd-cgroup", "create", "id"],
                Some("create"),
                None,
                Some("."),
            ),
            (
                &["--criu", "create", "--rootless", "true", "create", "id"],
                Some("create"),
                None,
                Some("."),
            ),
            (&["create", "--bundle", "/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "--bundle=/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "-bundle", "/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "-bundle=/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "-b", "/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "-b=/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "--b", "/b", "id"], Some("create"), None, Some("/b")),
            (&["create", "id", "--bundle", "/b"], Some("create"), None, Some("/b")),
            (
                &["create", "--bundle", "create", "create"],
                Some("create"),
                None,
                Some("create"),
            ),
            (&["create", "--pid-file", "-b", "id"], Some("create"), None, Some(".")),
            (
                &[
                    "create",
                    "--console-socket",
                    "/s",
                    "--pid-file",
                    "/p",
                    "--no-pivot",
                    "-b",
                    "/b",
                    "id",
                ],
                Some("create"),
                None,
                Some("/b"),
            ),
            (&["create", "--", "-b", "/b"], Some("create"), None, Some(".")),
            (
                &[
                    "--log",
                    "/l",
                    "--log-format",
                    "json",
                    "create",
                    "--bundle",
                    "/b",
                    "--pid-file",
                    "/p",
                    "id",
                ],
                Some("create"),
                Some("/l"),
                Some("/b"),
            ),
            (&["--root", "create", "run", "-b", "/b", "id"], Some("run"), None, None),
            (&[], None, None, None),
        ];
        for (args, verb, log, bundle) in cases {
            let got = inv(args);
            assert_eq!(got.verb.as_deref(), verb.map(OsStr::new), "{args:?}");
            assert_eq!(got.log.as_deref(), log.map(Path::new), "{args:?}");
            assert_eq!(got.bundle.as_deref(), bundle.map(Path::new), "{args:?}");
        }
    }

    #[test]
    fn log_format_is_read() {
        let i = inv(&["--log", "/l", "--log-format=json", "create", "x"]);
        assert_eq!(i.log_format.as_deref(), Some(OsStr::new("json")));
    }

    #[test]
    fn hooks_added_once_and_fields_kept_in_order() {
        let hook = Path::new("/usr/bin/vramgate-hook");
        let text = r#"{"ociVersion":"1.0.2","zeta":{"b":1,"a":2},"process":{"env":["VRAMGATE_MEMORY=1Gi"]},"hooks":{"prestart":[{"path":"/usr/bin/other"}]},"alpha":18446744073709551615}"#;
        let mut spec: Value = serde_json::from_str(text).unwrap();
        let entry = |stage| hook_entry(hook, stage, 3660, Some(Path::new("/etc/vg.toml")));
        assert!(add_hooks(
            &mut spec,
            Path::new("c.json"),
            entry("createRuntime"),
            entry("poststop"),
            hook
        )
        .unwrap());
        let once = serde_json::to_string(&spec).unwrap();
        assert!(
            once.starts_with(r#"{"ociVersion":"1.0.2","zeta":{"b":1,"a":2},"#),
            "{once}"
        );
        assert!(once.ends_with(r#","alpha":18446744073709551615}"#), "{once}");
        assert_eq!(spec["hooks"]["prestart"][0]["path"], "/usr/bin/other");
        assert_eq!(
            spec["hooks"]["createRuntime"][0]["args"],
            json!(["vramgate-hook", "createRuntime", "--hook-timeout", "3660"])
        );
        assert_eq!(spec["hooks"]["poststop"][0]["timeout"], 3660);
        assert_eq!(
            spec["hooks"]["poststop"][0]["env"],
            json!(["VRAMGATE_CONFIG=/etc/vg.toml"])
        );
        assert!(!add_hooks(
            &mut spec,
            Path::new("c.json"),
            entry("createRuntime"),
            entry("poststop"),
            hook
        )
        .unwrap());
        assert_eq!(serde_json::to_string(&spec).unwrap(), once);
    }

    #[test]
    fn existing_hooks_from_hooks_d_count() {
        let hook = Path::new("/opt/vg/vramgate-hook");
        let mut spec = json!({"hooks": {"prestart": [{"path": "/usr/bin/vramgate-hook", "args": ["vramgate-hook", "prestart"]}], "poststop": null}});
        let e = |s| hook_entry(hook, s, 60, None);
        assert!(add_hooks(&mut spec, Path::new("c"), e("createRuntime"), e("poststop"), hook).unwrap());
        assert!(spec["hooks"].get("createRuntime").is_none());
        assert_eq!(spec["hooks"]["poststop"].as_array().unwrap().len(), 1);
        assert!(spec["hooks"]["poststop"][0].get("env").is_none());
    }

    #[test]
    fn misshapen_specs_are_errors() {
        let hook = Path::new("/h/vramgate-hook");
        let e = |s| hook_entry(hook, s, 60, None);
        for bad in [
            json!([]),
            json!({"hooks": 3}),
            json!({"hooks": {"poststop": {}}}),
            json!({"hooks": {"prestart": "x"}}),
        ] {
            let mut spec = bad.clone();
            let err = add_hooks(
                &mut spec,
                Path::new("/b/config.json"),
                e("createRuntime"),
                e("poststop"),
                hook,
            )
            .unwrap_err();
            assert!(err.to_string().contains("/b/config.json"), "{err}");
            assert_eq!(spec, bad, "left as it was");
        }
    }

    #[test]
    fn runc_log_lines() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(rfc3339(1_735_689_599, 0), "2024-12-31T23:59:59.000000000Z");
        let json_line = log_line("vramgate: \"x\" failed", Some(OsStr::new("json")), "T");
        let v: Value = serde_json::from_str(&json_line).unwrap();
        assert_eq!(
            v,
            json!({"level": "error", "msg": "vramgate: \"x\" failed", "time": "T"})
        );
        assert_eq!(
            log_line("a \"b\"", None, "T"),
            "time=\"T\" level=error msg=\"a \\\"b\\\"\"\n"
        );
    }

    #[test]
    fn next_runtime_skips_missing_and_myself() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let make = |p: &Path, mode| {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        make(&a.join("runc"), 0o755);
        make(&b.join("runc"), 0o755);
        make(&a.join("noexec"), 0o644);
        let path = std::env::join_paths([&a, &b]).unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find_next_runtime(&names(&["nvidia-container-runtime", "runc"]), Some(&path), None),
            Some(a.join("runc"))
        );
        assert_eq!(find_next_runtime(&names(&["noexec"]), Some(&path), None), None);
        let me = a.join("runc").canonicalize().unwrap();
        assert_eq!(
            find_next_runtime(&names(&["runc"]), Some(&path), Some(&me)),
            Some(b.join("runc"))
        );
        let abs = b.join("runc").to_string_lossy().into_owned();
        assert_eq!(find_next_runtime(&[abs.clone()], None, None), Some(PathBuf::from(abs)));
    }
}
