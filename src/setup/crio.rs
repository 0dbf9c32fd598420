//! podman and CRI-O: the hooks.d files, and CRI-O's drop-in with the runtime handler `vramgate`.

use super::*;

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

pub(super) fn plan_hooks_d(options: &SetupOptions) -> Result<Plan> {
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
        plan.want(&path, current, (!options.remove).then_some(content), false, Owned::File);
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
pub(super) fn plan_crio_drop_in(options: &SetupOptions, plan: &mut Plan) -> Result<PathBuf> {
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
        plan.want(&path, current, Some(ours), false, Owned::File);
    } else if current.as_ref().is_some_and(|c| *c != ours) {
        plan.notes.push(format!(
            "{} is not what setup writes (changed since, or written for another runtime path); left alone: remove it by hand if it is vramgate's",
            path.display()
        ));
    } else {
        plan.want(&path, current, None, false, Owned::File);
    }
    Ok(path)
}
