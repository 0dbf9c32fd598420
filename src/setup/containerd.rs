//! containerd: the drop-in for config version 2 or 3 and the plan that writes it and the
//! main config's import line.

use super::*;

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

pub(super) fn plan_containerd(options: &SetupOptions) -> Result<Plan> {
    let drop_in = options
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_DROP_IN));
    let main = options
        .containerd_config
        .clone()
        .unwrap_or_else(|| PathBuf::from(CONTAINERD_CONFIG));
    let import = options.containerd_import.clone().unwrap_or_else(|| drop_in.clone());
    let drop_in_str = import.to_string_lossy().into_owned();
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
    } else if imports.iter().any(|i| import_covers(i, &import)) {
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
