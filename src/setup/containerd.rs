//! containerd: vramgate's runtime `vramgate` for the CRI plugin, added so that it lives beside
//! whatever else edits containerd's config (NVIDIA's toolkit above all), and taken out again
//! without touching anyone else's part.
//!
//! - **Config version 3** (containerd 2.x) merges imported files key by key: vramgate's
//!   runtime goes in a drop-in of its own (`conf.d/vramgate.toml`), imported from the main
//!   config unless an `imports` glob there already covers it.
//! - **Config version 2** (containerd 1.5 to 1.7) replaces a plugin's whole section with an
//!   imported file's (containerd issue #5837): a drop-in would hide every runtime another tool
//!   adds to the main config afterwards, and another tool's drop-in (NVIDIA's toolkit repeats
//!   the whole section in `99-nvidia.toml`) would hide vramgate's. So the runtime is added by
//!   key, in place, to every file that has the CRI section (the main config when none does),
//!   and every other byte of those files stays as it was.
//!
//! The undo (`--remove`, the node set-up's) takes out the drop-in, the import entry, and the
//! runtime `vramgate` wherever containerd would read it, in place: another tool that copied
//! the section while vramgate was installed (NVIDIA's toolkit does, from `containerd config
//! dump`) keeps everything of its own and loses only vramgate's runtime. A runtime `vramgate`
//! whose `BinaryName` is not vramgate's wrapper is someone else's, and is left with a note.
//!
//! vramgate's runtime takes the `options` of the default runtime as containerd would run it
//! (`SystemdCgroup` above all: kubelet's cgroup driver must match the runtime's, or pods land
//! in the wrong cgroups), all but its `BinaryName`, which is the wrapper's.

use super::chain::*;
use super::*;

pub const CRI_PLUGIN: &str = "io.containerd.grpc.v1.cri";
/// containerd 2.x's CRI runtime plugin: where config version 3 keeps the runtimes.
pub const CRI_RUNTIME_PLUGIN_V3: &str = "io.containerd.cri.v1.runtime";
/// The runtime containerd 1.x's CRI plugin defines by itself, and runs by default.
pub const CONTAINERD_DEFAULT_RUNTIME: &str = "runc";
const RUNC_V2: &str = "io.containerd.runc.v2";

/// The containerd config versions setup writes for, read from the main config's `version`:
/// 2 (containerd 1.5 to 1.7; containerd 2.x migrates it) and 3 (containerd 2.x). A host
/// without a main config gets version 2, which both read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerdVersion {
    V2,
    V3,
}

impl ContainerdVersion {
    /// The plugin whose section holds the CRI runtimes in this version.
    pub fn runtime_plugin(self) -> &'static str {
        match self {
            ContainerdVersion::V2 => CRI_PLUGIN,
            ContainerdVersion::V3 => CRI_RUNTIME_PLUGIN_V3,
        }
    }
}

fn default_name(section: &toml::Table) -> Option<String> {
    section
        .get("containerd")
        .and_then(|c| c.get("default_runtime_name"))
        .and_then(toml::Value::as_str)
        .map(str::to_string)
}

fn runtime_in<'a>(section: &'a toml::Table, name: &str) -> Option<&'a toml::Table> {
    section
        .get("containerd")
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(name))
        .and_then(toml::Value::as_table)
}

/// vramgate's runtime entry: the wrapper at `runtime_path` as a runc-v2 runtime with the CRI
/// annotation pass-lists (containerd passes no pod annotation to the spec unless a runtime
/// allows it), and the `options` of `section`'s default runtime but its `BinaryName`. Options
/// set in `mine` (a `vramgate` runtime the admin already had) stay as they are.
pub fn vramgate_runtime(runtime_path: &Path, section: &toml::Table, mine: Option<&toml::Table>) -> toml::Table {
    // A section that already names vramgate the default (setup run again after
    // --set-as-default) says nothing about the host's: then runc's.
    let default = default_name(section)
        .filter(|name| name != RUNTIME_NAME)
        .unwrap_or_else(|| CONTAINERD_DEFAULT_RUNTIME.to_string());
    let inherited = runtime_in(section, &default)
        .and_then(|r| r.get("options"))
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    let mut runtime = mine.cloned().unwrap_or_default();
    runtime.insert("runtime_type".into(), RUNC_V2.into());
    let allow = vec![ANNOTATION_PATTERN.into(), NVIDIA_ANNOTATION_PATTERN.into()];
    runtime.insert("pod_annotations".into(), toml::Value::Array(allow.clone()));
    // A device plugin's CDI requests (the cdi-annotations strategy) are container annotations,
    // which only kubelet writes, from the plugin's Allocate: NVIDIA's runtime after vramgate's
    // reads them (NVIDIA's installer passes them to its own runtimes too). Never the pod's: a
    // pod author must not ask for devices so.
    let mut container = allow;
    container.push(CDI_ANNOTATION_PATTERN.into());
    runtime.insert("container_annotations".into(), toml::Value::Array(container));
    let options = table_at(&mut runtime, "options");
    for (key, value) in inherited {
        // `config dump` lists every option, unset ones at their zero value: the same as unset.
        if key != "BinaryName" && !options.contains_key(&key) && !is_zero(&value) {
            options.insert(key, value);
        }
    }
    options.insert("BinaryName".into(), runtime_path.to_string_lossy().into_owned().into());
    runtime
}

/// The version 3 drop-in: vramgate's runtime alone (and the default runtime's name when
/// `set_as_default`), merged key by key into the CRI runtime section by containerd 2.x.
pub fn containerd_drop_in_v3(runtime: &toml::Table, set_as_default: bool) -> String {
    let mut containerd = toml::Table::new();
    if set_as_default {
        containerd.insert("default_runtime_name".into(), RUNTIME_NAME.into());
    }
    table_at(&mut containerd, "runtimes").insert(RUNTIME_NAME.into(), toml::Value::Table(runtime.clone()));
    let mut section = toml::Table::new();
    section.insert("containerd".into(), toml::Value::Table(containerd));
    let mut plugins = toml::Table::new();
    plugins.insert(CRI_RUNTIME_PLUGIN_V3.into(), toml::Value::Table(section));
    let mut doc = toml::Table::new();
    doc.insert("version".into(), 3.into());
    doc.insert("plugins".into(), toml::Value::Table(plugins));
    format!(
        "# Written by `vramgate setup containerd`; `vramgate setup containerd --remove` undoes it.\n\
         # containerd 2.x merges it key by key into the main config's CRI runtime section.\n{}",
        toml::to_string(&doc).expect("a TOML table serializes")
    )
}

/// Whether `value` is a Go zero value (`''`, `false`, `0`, `[]`, `{}`), as `containerd config
/// dump` prints an option nobody set.
pub(super) fn is_zero(value: &toml::Value) -> bool {
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

/// A TOML table as toml_edit's, for inserting into a file being edited in place.
fn edit_table(table: &toml::Table) -> toml_edit::Table {
    let mut out = toml_edit::Table::new();
    for (key, value) in table {
        let item = match value {
            toml::Value::Table(sub) => toml_edit::Item::Table(edit_table(sub)),
            other => toml_edit::value(
                other
                    .to_string()
                    .parse::<toml_edit::Value>()
                    .expect("a TOML value parses back"),
            ),
        };
        out.insert(key, item);
    }
    out
}

/// The table at `keys` under `table`, made (implicit: no header of its own) where missing.
fn table_path<'a>(table: &'a mut dyn toml_edit::TableLike, keys: &[&str]) -> Option<&'a mut dyn toml_edit::TableLike> {
    let Some((first, rest)) = keys.split_first() else {
        return Some(table);
    };
    if !table.contains_key(first) {
        let mut new = toml_edit::Table::new();
        new.set_implicit(true);
        table.insert(first, toml_edit::Item::Table(new));
    }
    table_path(table.get_mut(first)?.as_table_like_mut()?, rest)
}

fn parse_doc(text: &str, path: &Path) -> Result<toml_edit::DocumentMut> {
    text.parse::<toml_edit::DocumentMut>().map_err(|e| SetupError::Parse {
        path: path.to_path_buf(),
        format: "TOML",
        message: crate::one_line(e.message()),
    })
}

/// What vramgate added to a version 2 file besides its runtime: containerd's built-in `runc`
/// (where the section did not name it: containerd 1.x would otherwise lose it) and the default
/// runtime's name (its value before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedKeys {
    pub runc: bool,
    pub default_before: Option<Option<String>>,
}

/// `text` (a version 2 config file) with vramgate's runtime added to its CRI section by key.
fn with_runtime_keys(
    text: &str,
    path: &Path,
    runtime: &toml::Table,
    set_as_default: bool,
) -> Result<(String, AddedKeys)> {
    let mut doc = parse_doc(text, path)?;
    let shape = |what: &str| SetupError::Shape {
        path: path.to_path_buf(),
        what: format!("plugins.\"{CRI_PLUGIN}\".{what} is not a table"),
    };
    let containerd =
        table_path(doc.as_table_mut(), &["plugins", CRI_PLUGIN, "containerd"]).ok_or_else(|| shape("containerd"))?;
    let default_before = set_as_default.then(|| {
        containerd
            .get("default_runtime_name")
            .and_then(|v| v.as_str())
            .map(str::to_string)
    });
    if set_as_default {
        containerd.insert("default_runtime_name", toml_edit::value(RUNTIME_NAME));
    }
    let runtimes = table_path(containerd, &["runtimes"]).ok_or_else(|| shape("containerd.runtimes"))?;
    let runc = !runtimes.contains_key(CONTAINERD_DEFAULT_RUNTIME);
    if runc {
        let mut entry = toml_edit::Table::new();
        entry.insert("runtime_type", toml_edit::value(RUNC_V2));
        runtimes.insert(CONTAINERD_DEFAULT_RUNTIME, toml_edit::Item::Table(entry));
    }
    runtimes.insert(RUNTIME_NAME, toml_edit::Item::Table(edit_table(runtime)));
    Ok((doc.to_string(), AddedKeys { runc, default_before }))
}

/// What taking vramgate's runtime out of a file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeOut {
    /// The new text: the runtime (whose `BinaryName` was vramgate's) and a default runtime
    /// name naming it are gone, nothing else changed.
    Removed(String),
    /// No runtime `vramgate` in the file.
    Absent,
    /// A runtime `vramgate` that runs something else (its `BinaryName`): not vramgate's.
    Foreign(String),
}

/// `text` without the runtime `vramgate` of `plugin`'s section, where its `BinaryName` is one
/// of `binaries`, and without a `default_runtime_name` naming it (set back to `default_before`
/// when vramgate recorded what it replaced). What `--remove` and the node set-up's undo do to
/// every file containerd reads, another tool's copy of the section included. `ours`: the file
/// where setup itself set that name (the main config of version 2), whose section's table,
/// left with subtables alone, goes back to having no header of its own, as before setup gave
/// it a key; another tool's header stays.
pub fn without_runtime(
    text: &str,
    path: &Path,
    plugin: &str,
    binaries: &[&Path],
    default_before: Option<&str>,
    ours: bool,
) -> Result<RuntimeOut> {
    let mut doc = parse_doc(text, path)?;
    let Some(item) = doc
        .get_mut("plugins")
        .and_then(|p| p.get_mut(plugin))
        .and_then(|s| s.get_mut("containerd"))
    else {
        return Ok(RuntimeOut::Absent);
    };
    let Some(containerd) = item.as_table_like_mut() else {
        return Ok(RuntimeOut::Absent);
    };
    let binary = containerd.get("runtimes").and_then(|r| r.get(RUNTIME_NAME)).map(|r| {
        r.get("options")
            .and_then(|o| o.get("BinaryName"))
            .and_then(|b| b.as_str())
    });
    match binary {
        None => return Ok(RuntimeOut::Absent),
        Some(b)
            if !binaries
                .iter()
                .any(|ours| Some(Path::new(b.unwrap_or(""))) == Some(*ours)) =>
        {
            return Ok(RuntimeOut::Foreign(b.unwrap_or("").to_string()))
        }
        Some(_) => {}
    }
    if let Some(runtimes) = containerd.get_mut("runtimes").and_then(|r| r.as_table_like_mut()) {
        runtimes.remove(RUNTIME_NAME);
    }
    let mut removed_default = false;
    if containerd.get("default_runtime_name").and_then(|v| v.as_str()) == Some(RUNTIME_NAME) {
        match default_before {
            Some(before) => {
                containerd.insert("default_runtime_name", toml_edit::value(before));
            }
            None => {
                containerd.remove("default_runtime_name");
                removed_default = true;
            }
        }
    }
    if let Some(table) = item.as_table_mut().filter(|_| removed_default && ours) {
        if table.iter().all(|(_, value)| value.is_table()) {
            table.set_implicit(true);
        }
    }
    Ok(RuntimeOut::Removed(doc.to_string()))
}

/// `text` without the `runc` entry vramgate added to a version 2 file, when it is still the
/// one vramgate wrote (nothing but its runtime type).
pub fn without_added_runc(text: &str, path: &Path) -> Result<Option<String>> {
    let mut doc = parse_doc(text, path)?;
    let Some(runtimes) = doc
        .get_mut("plugins")
        .and_then(|p| p.get_mut(CRI_PLUGIN))
        .and_then(|s| s.get_mut("containerd"))
        .and_then(|c| c.get_mut("runtimes"))
        .and_then(|r| r.as_table_like_mut())
    else {
        return Ok(None);
    };
    let ours = runtimes
        .get(CONTAINERD_DEFAULT_RUNTIME)
        .and_then(|r| r.as_table_like())
        .is_some_and(|r| r.len() == 1 && r.get("runtime_type").and_then(|t| t.as_str()) == Some(RUNC_V2));
    if !ours {
        return Ok(None);
    }
    runtimes.remove(CONTAINERD_DEFAULT_RUNTIME);
    Ok(Some(doc.to_string()))
}

fn utf8(bytes: &[u8], path: &Path) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| SetupError::Parse {
        path: path.to_path_buf(),
        format: "UTF-8 TOML",
        message: "it is not UTF-8".into(),
    })
}

pub(super) fn plan_containerd(options: &SetupOptions) -> Result<Plan> {
    let drop_in = options
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_DROP_IN));
    let main = options
        .containerd_config
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_CONFIG));
    let view = options.engine_view.as_ref();
    let import = options.containerd_import.clone().unwrap_or_else(|| drop_in.clone());
    let main_engine = match view {
        Some(view) => view.engine(&view.host.host_path(&main))?,
        None => main.clone(),
    };
    let drop_in_str = import.to_string_lossy().into_owned();
    let mut plan = Plan::default();
    let main_current = read_optional(&main)?;
    let main_text = match &main_current {
        Some(b) => utf8(b, &main)?,
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
    let chain = ConfigChain::load(&main_engine, &main_text, &main_table, view);
    plan.notes.extend(chain.notes.iter().cloned());
    let plugin = version.runtime_plugin();
    let drop_in_current = read_optional(&drop_in)?;
    // The main config's text as this plan leaves it, edited below in turn.
    let imported = imports.iter().any(|i| i == &drop_in_str);
    let mut main_wanted = main_text.clone();
    // Files other than the main config and vramgate's drop-in that the plan edits in place.
    let mut others: Vec<(PathBuf, String, String, Owned)> = Vec::new();
    let mut main_owned = Owned::Removal;
    if options.remove {
        if imported {
            main_wanted = without_import(&main_wanted, &drop_in_str);
        }
        // Wherever containerd would read vramgate's runtime: the main config, another
        // tool's copy of the section; vramgate's own drop-in goes whole below.
        let binaries = [options.runtime_path.as_path()];
        for file in chain.files.iter().filter(|f| f.local != drop_in) {
            let is_main = file.local == main;
            let mut text = if is_main {
                main_wanted.clone()
            } else {
                file.text.clone()
            };
            for plugin in [CRI_PLUGIN, CRI_RUNTIME_PLUGIN_V3] {
                match without_runtime(&text, &file.local, plugin, &binaries, None, is_main)? {
                    RuntimeOut::Removed(new) => text = new,
                    RuntimeOut::Foreign(binary) => plan.notes.push(format!(
                        "left the runtime {RUNTIME_NAME} in {}: its BinaryName is {binary:?}, not {}",
                        file.engine.display(),
                        options.runtime_path.display()
                    )),
                    RuntimeOut::Absent => {}
                }
            }
            if is_main {
                main_wanted = text;
            } else if text != file.text {
                others.push((file.local.clone(), file.text.clone(), text, Owned::Removal));
            }
        }
        plan.want(&drop_in, drop_in_current, None, false, Owned::File);
    } else {
        match version {
            ContainerdVersion::V3 => {
                // containerd 2.x merges imported files into the main one: the default runtime's
                // options may be set in any of them.
                let (merged, from) = merged_runtime_section(&chain, view, &drop_in);
                plan.notes.push(match from {
                    MergedFrom::Dump => format!(
                        "the default runtime's options were read from `containerd --config {} config dump`{}",
                        main_engine.display(),
                        if view.is_some() {
                            ", run chrooted into the host root"
                        } else {
                            ""
                        }
                    ),
                    MergedFrom::Files { files, why } => format!(
                        "the default runtime's options were read from {}{} ({why})",
                        main_engine.display(),
                        files.iter().map(|f| format!(", {}", f.display())).collect::<String>()
                    ),
                });
                let mine = plugin_section(&main_table, plugin).and_then(|s| runtime_in(s, RUNTIME_NAME));
                let runtime = vramgate_runtime(&options.runtime_path, &merged, mine);
                let drop_in_wanted = containerd_drop_in_v3(&runtime, options.set_as_default).into_bytes();
                plan.want(&drop_in, drop_in_current, Some(drop_in_wanted), false, Owned::File);
                if !imports.iter().any(|i| import_covers(i, &import)) {
                    main_wanted = with_import(&main_text, &drop_in_str, &main)?;
                    main_owned = Owned::Import {
                        entry: drop_in_str.clone(),
                    };
                }
            }
            ContainerdVersion::V2 => {
                // A version 2 drop-in of an earlier release goes, with its import: the runtime
                // now lives in the files themselves.
                plan.want(&drop_in, drop_in_current, None, false, Owned::File);
                if imported {
                    main_wanted = without_import(&main_wanted, &drop_in_str);
                }
                let effective = chain.section(plugin, true, Some(&drop_in));
                let mut targets: Vec<&ChainFile> = chain
                    .files
                    .iter()
                    .filter(|f| f.local != drop_in && plugin_section(&f.table, plugin).is_some())
                    .collect();
                if targets.is_empty() {
                    targets.push(&chain.files[0]);
                }
                for file in targets {
                    let mine = plugin_section(&file.table, plugin).and_then(|s| runtime_in(s, RUNTIME_NAME));
                    let runtime = vramgate_runtime(&options.runtime_path, &effective, mine);
                    let is_main = file.local == main;
                    let text = if is_main { &main_wanted } else { &file.text };
                    let (new, added) = with_runtime_keys(text, &file.local, &runtime, options.set_as_default)?;
                    let owned = Owned::Keys {
                        runc: added.runc,
                        default_before: added.default_before,
                    };
                    if is_main {
                        main_wanted = new;
                        main_owned = owned;
                    } else {
                        others.push((file.local.clone(), file.text.clone(), new, owned));
                    }
                }
            }
        }
    }
    let main_wanted = (main_current.is_some() || main_wanted != main_text).then(|| main_wanted.into_bytes());
    plan.want(&main, main_current, main_wanted, true, main_owned);
    for (path, current, wanted, owned) in others {
        plan.want(
            &path,
            Some(current.into_bytes()),
            Some(wanted.into_bytes()),
            true,
            owned,
        );
    }
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
