//! The one change the wrapper makes to a bundle: the vramgate hooks in `config.json`, when the
//! spec requests VRAM.
//!
//! The spec is edited as an order-preserving JSON tree, never through structs that would drop
//! fields vramgate does not know; everything but the `hooks` entries it adds stays as it was,
//! and a spec without a request is not even rewritten.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{Result, RuntimeError};
use crate::atomic_file;
use crate::config::{Config, ConfigError, RuntimeConfig, CONFIG_ENV, DEFAULT_CONFIG_PATH};
use crate::request;
use crate::spec::{self, array_at, json_type, object_at, SpecError, SpecView, MAX_SPEC_BYTES};

pub const HOOK_BINARY: &str = "vramgate-hook";
pub const DEFAULT_HOOK_PATH: &str = "/usr/bin/vramgate-hook";
/// What the hook timeout adds to `max_wait_timeout`: the hook ends its longest wait
/// [`HOOK_TIMEOUT_MARGIN`] before the runtime would kill it, and the rest covers reading the
/// GPU inventory and the ledger on a loaded host.
pub const HOOK_TIMEOUT_SLACK: Duration = Duration::from_secs(60);
/// Time kept between the end of the longest wait and the runtime's hook timeout, so the hook
/// always answers with a clear refusal before the runtime kills it (the hook reads it as
/// `crate::hook::HOOK_TIMEOUT_MARGIN`; it lives here, beside the timeout it is taken from, so
/// that the wrapper below the hook never reaches up into it).
pub const HOOK_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);
/// The stages the wrapper adds: admission as soon as the init pid exists, release on delete.
pub const ADMISSION_STAGE: &str = "createRuntime";
pub const RELEASE_STAGE: &str = "poststop";
/// Stages at which a vramgate hook already in the spec admits (podman's hooks.d adds prestart).
const ADMISSION_STAGES: &[&str] = &["prestart", "createRuntime", "createContainer"];

const _: () = assert!(HOOK_TIMEOUT_SLACK.as_secs() > HOOK_TIMEOUT_MARGIN.as_secs());

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

/// Adds the admission hook (after the spec's own) and the release hook (before them) to `spec`,
/// unless a vramgate hook is already at that stage. Returns whether anything changed; every
/// other field is left as it was.
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
    let hooks = match object_at(root, "hooks") {
        Some(hooks) => hooks,
        None => return Err(shape("hooks", &root["hooks"], "object")),
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
    let mut add = |hooks: &mut Map<String, Value>, stage: &str, entry: Value, first: bool| {
        if let Some(entries) = array_at(hooks, stage) {
            entries.insert(if first { 0 } else { entries.len() }, entry);
            changed = true;
        }
    };
    // Admission stays after the spec's own hooks (where it always was): one of theirs that
    // fails then stops the start before anything is reserved.
    if !ADMISSION_STAGES.iter().any(|s| present(hooks, s)) {
        add(hooks, ADMISSION_STAGE, admission, false);
    }
    // Release goes first: runc stops at the first poststop hook that fails, so behind a failing
    // hook of the spec's own it would never run and the memory would stay reserved. A vramgate
    // hook already there, wherever it is, is left where its writer put it.
    if !present(hooks, RELEASE_STAGE) {
        add(hooks, RELEASE_STAGE, release, true);
    }
    Ok(changed)
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
        let config = match self.loaded.take() {
            Some(config) => config,
            None => Config::load_from(&self.path)?,
        };
        Ok(self.loaded.insert(config))
    }

    /// What the hook needs to read the same file: its path, when it is not the default the
    /// hook would read anyway. Absolute, since runc starts hooks in another directory.
    fn path_for_hook(&self) -> Option<PathBuf> {
        (self.path != Path::new(DEFAULT_CONFIG_PATH))
            .then(|| std::path::absolute(&self.path).unwrap_or_else(|_| self.path.clone()))
    }
}

/// A pod's container given no GPU under the pod's memory annotation: the notice for the pod's
/// events ([`crate::pod_notice`]). One that cannot be left goes to runc's log as a warning; the
/// container starts as it would have.
fn tell_the_pod(view: &SpecView, inv: &super::Invocation, config: &Config) {
    if let Err(e) = crate::pod_notice::leave_if_unreserved(view, config) {
        super::warn(inv, &format!("vramgate: cannot leave the pod a notice: {e}"));
    }
}

/// For a spec that requests VRAM: admits the container ([`super::admit`]: reserves, and places
/// it when it leaves the choice to vramgate), narrows the spec to the GPUs chosen, and adds the
/// hooks (createRuntime confirms, poststop releases). Returns whether it reserved memory
/// (which a failed exec of the next runtime must give back). The config is read only when
/// there is a request; a refusal is an error and the next runtime never runs.
pub fn prepare_bundle(bundle: &Path, inv: &super::Invocation, config: &mut LazyConfig) -> Result<bool> {
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
        if request::pod_memory_annotation_not_taken(&view, Default::default()).is_some() {
            // A config that cannot be read stops no start that has no request: no notice then.
            if let Ok(config) = config.get() {
                tell_the_pod(&view, inv, config);
            }
        }
        return Ok(false);
    }
    let config_env = config.path_for_hook();
    let config = config.get()?;
    let verb = || inv.verb.as_deref().unwrap_or_default().to_string_lossy().into_owned();
    let container = inv
        .container
        .as_deref()
        .ok_or_else(|| RuntimeError::NoContainerId { verb: verb() })?
        .to_string_lossy()
        .into_owned();
    spec::validate_container_id(&container)?;
    let request =
        request::Request::from_spec_on_node(&view, &config.enforce.cdi_spec_dirs, config.runtime.nvidia_toolkit())
            .map_err(|source| RuntimeError::Request {
                container: container.clone(),
                source,
            })?;
    let Some(request) = request else {
        tell_the_pod(&view, inv, config);
        return Ok(false);
    };
    let mut spec: Value = serde_json::from_slice(&bytes).map_err(|source| SpecError::ParseSpec {
        path: path.clone(),
        source,
    })?;
    // `vramgate.dev/gpus=all` is the one request that keeps every GPU in sight.
    let sees_all = request.gpus.selection == request::GpuSelection::All;
    // NVIDIA's amounts are whole MiB, so always bytes: written as a byte count, exactly.
    let pinned_memory = match request.memory {
        crate::quantity::Quantity::Bytes(bytes) if request.from_nvidia => Some(bytes),
        _ => None,
    };
    // NVIDIA's limit likewise, so the hook reads the same limit as the request beside it.
    let pinned_limit = match request.limit {
        Some(crate::quantity::Quantity::Bytes(bytes)) if request.limit_from_nvidia => Some(bytes),
        _ => None,
    };
    let reserved = super::admit::admit_at_create(&container, bundle, request, config)?;
    // From here on, a failure gives back what was just reserved: nothing is left half-done.
    let undo = |e: RuntimeError| {
        if reserved.is_some() {
            super::admit::undo(&container, bundle, config);
        }
        e
    };
    // The tier the hook records is the one this wrapper writes, never one the container
    // brought along (`--annotation vramgate.dev/enforcement=driver_limit` would make status
    // and the metrics claim a limit no one set, and read usage from a driver figure that is
    // not there): whatever the spec carried under that key goes, and `enforce` writes it anew.
    let mut edited = remove_annotation(&mut spec, crate::tier::ENFORCEMENT_ANNOTATION);
    // A request in NVIDIA's words is written in vramgate's for the hook that confirms it: the
    // enforcement below may replace NVIDIA's variables with the reservation's (`toolkit`) or
    // remove them (`driver`), and the hook must read the same amount this wrapper admitted.
    if let (Some(bytes), Value::Object(root)) = (pinned_memory, &mut spec) {
        if let Some(annotations) = object_at(root, "annotations") {
            annotations.insert(request::MEMORY_ANNOTATION.to_string(), Value::String(bytes.to_string()));
            edited = true;
        }
    }
    if let (Some(bytes), Value::Object(root)) = (pinned_limit, &mut spec) {
        if let Some(annotations) = object_at(root, "annotations") {
            annotations.insert(
                request::MEMORY_LIMIT_ANNOTATION.to_string(),
                Value::String(bytes.to_string()),
            );
            edited = true;
        }
    }
    if let Some(reserved) = &reserved {
        // The container sees exactly the GPUs it reserved on: those vramgate chose, or those
        // it named, out of whatever else its engine gave it (`NVIDIA_VISIBLE_DEVICES=all`
        // with `vramgate.dev/gpus=1`). A limit keyed by ordinal (MPS) then names the right
        // GPU, and no GPU is reachable without a reservation on it.
        if !reserved.gpus.is_empty() && (reserved.placement.is_some() || !sees_all) {
            use super::devices::{narrow_to, WhenNoneGiven};
            let none_given = match reserved.placement {
                Some(_) => WhenNoneGiven::Give,
                None => WhenNoneGiven::Leave,
            };
            let mig_minors = crate::inventory::mig_caps::MigMinors::read();
            let host = crate::device_rules::HostPaths::default();
            narrow_to(&mut spec, &path, &reserved.gpus, none_given, &mig_minors, &host).map_err(undo)?;
            edited = true;
        }
        // The env as the container set it: placement changes only the GPU variables, which
        // the enforcement edits do not read.
        let env = view.env_entries();
        edited |= enforce(&mut spec, &path, env, reserved, config, inv).map_err(undo)?;
    }
    let hook = hook_path(&config.runtime);
    let timeout = hook_timeout_secs(config);
    let entry = |stage| hook_entry(&hook, stage, timeout, config_env.as_deref());
    let hooks_added = add_hooks(&mut spec, &path, entry(ADMISSION_STAGE), entry(RELEASE_STAGE), &hook).map_err(undo)?;
    if hooks_added || edited {
        write_spec(bundle, &path, &bytes, &spec).map_err(undo)?;
    }
    Ok(reserved.is_some())
}

/// What holds the container to its reservation once it runs ([`crate::enforce`]): the
/// configured limit's variables and mounts, the framework guardrails, and the tier in the
/// annotation the hook records when it confirms. Returns whether the spec changed.
fn enforce(
    spec: &mut Value,
    path: &Path,
    env: &[String],
    reserved: &super::admit::Reserved,
    config: &Config,
    inv: &super::Invocation,
) -> Result<bool> {
    use crate::enforce;
    let placed = reserved.placed_shares();
    if placed.is_empty() {
        return Ok(false);
    }
    let (mps_running, toolkit_hook) = enforce::node_offers(&config.enforce);
    let edits = enforce::spec_edits(&config.enforce, env, &placed, mps_running, toolkit_hook);
    for note in &edits.notes {
        super::warn(inv, &format!("vramgate: {note}"));
    }
    let mut changed = enforce::apply_spec_edits(spec, &edits).map_err(|e| RuntimeError::Enforce {
        path: path.to_path_buf(),
        source: e,
    })?;
    if let Value::Object(root) = spec {
        if let Some(annotations) = object_at(root, "annotations") {
            annotations.insert(
                crate::tier::ENFORCEMENT_ANNOTATION.to_string(),
                Value::String(edits.tier.as_str().to_string()),
            );
            changed = true;
        }
    }
    Ok(changed)
}

/// Removes `key` from the spec's annotations; whether it was there.
fn remove_annotation(spec: &mut Value, key: &str) -> bool {
    spec.get_mut("annotations")
        .and_then(Value::as_object_mut)
        .is_some_and(|annotations| annotations.shift_remove(key).is_some())
}

/// Replaces `path` (the bundle's `config.json`, read as `bytes`) with `spec`, atomically,
/// keeping its layout, mode and owner.
fn write_spec(bundle: &Path, path: &Path, bytes: &[u8], spec: &Value) -> Result<()> {
    let read_err = |source| SpecError::ReadSpec {
        path: path.to_path_buf(),
        source,
    };
    let write_err = |source| RuntimeError::WriteSpec {
        path: path.to_path_buf(),
        source,
    };
    // Keep the writer's layout: engines write compact JSON, `runc spec` writes indented.
    let pretty = bytes.starts_with(b"{\n");
    let out = if pretty {
        serde_json::to_vec_pretty(spec)
    } else {
        serde_json::to_vec(spec)
    }
    .map_err(|e| write_err(e.into()))?;
    // The new file keeps the old one's mode and owner: runc and the engine expect them.
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let owner = (meta.uid() != nix::unistd::geteuid().as_raw() || meta.gid() != nix::unistd::getegid().as_raw())
        .then(|| (meta.uid(), meta.gid()));
    // runc follows a bundle directory that is a symlink (it chdirs into it), and so must the
    // rewrite; atomic_file opens the directory it writes in with O_NOFOLLOW, so it gets the
    // resolved one.
    let target = std::fs::canonicalize(bundle).map_err(write_err)?.join("config.json");
    atomic_file::replace(&target, &out, meta.mode(), owner).map_err(write_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_added_once_and_fields_kept_in_order() {
        let hook = Path::new("/usr/bin/vramgate-hook");
        let text = r#"{"ociVersion":"1.0.2","zeta":{"b":1,"a":2},"process":{"env":["VRAMGATE_MEMORY=1Gi"]},"hooks":{"prestart":[{"path":"/usr/bin/other"}]},"alpha":18446744073709551615}"#;
        let mut spec: Value = serde_json::from_str(text).unwrap();
        let entry = |stage| hook_entry(hook, stage, 3660, Some(Path::new("/etc/vg.toml")));
        let add = |spec: &mut Value| {
            add_hooks(
                spec,
                Path::new("c.json"),
                entry("createRuntime"),
                entry("poststop"),
                hook,
            )
            .unwrap()
        };
        assert!(add(&mut spec));
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
        assert!(!add(&mut spec), "the second time adds nothing");
        assert_eq!(serde_json::to_string(&spec).unwrap(), once);
    }

    #[test]
    fn the_hook_is_told_the_config_path_only_when_it_is_not_the_default() {
        assert_eq!(
            LazyConfig::new(PathBuf::from(DEFAULT_CONFIG_PATH)).path_for_hook(),
            None
        );
        assert_eq!(
            LazyConfig::new(PathBuf::from("/srv/vg.toml")).path_for_hook(),
            Some(PathBuf::from("/srv/vg.toml"))
        );
        let relative = LazyConfig::new(PathBuf::from("vg.toml")).path_for_hook().unwrap();
        assert!(relative.is_absolute() && relative.ends_with("vg.toml"), "{relative:?}");
    }

    #[test]
    fn release_goes_before_the_specs_poststop_hooks_admission_after() {
        let hook = Path::new("/usr/bin/vramgate-hook");
        let mut spec = json!({"hooks": {
            "createRuntime": [{"path": "/a"}],
            "poststop": [{"path": "/failing"}, {"path": "/b"}]
        }});
        let e = |s| hook_entry(hook, s, 60, None);
        assert!(add_hooks(&mut spec, Path::new("c"), e("createRuntime"), e("poststop"), hook).unwrap());
        let paths = |stage: &str| -> Vec<String> {
            spec["hooks"][stage]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["path"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(paths("poststop"), ["/usr/bin/vramgate-hook", "/failing", "/b"]);
        assert_eq!(paths("createRuntime"), ["/a", "/usr/bin/vramgate-hook"]);
        let once = spec.clone();
        assert!(!add_hooks(&mut spec, Path::new("c"), e("createRuntime"), e("poststop"), hook).unwrap());
        assert_eq!(spec, once, "twice adds nothing");
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
}
