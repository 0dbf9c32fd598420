//! The CRI runtime section as containerd merges it (its `config dump`, or the main config and
//! its imports merged as containerd 2.x does), where the host's default runtime options are read.

use super::*;

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

pub(super) fn runtime_section_v3(table: &toml::Table) -> Option<&toml::Table> {
    table
        .get("plugins")
        .and_then(|p| p.get(CRI_RUNTIME_PLUGIN_V3))
        .and_then(toml::Value::as_table)
}

/// The CRI runtime section of `containerd config dump`, or why there is none.
pub(super) fn containerd_dump(main: &Path) -> std::result::Result<toml::Table, String> {
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
pub(super) fn import_files(entry: &str, dir: &Path) -> Vec<PathBuf> {
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
pub(super) fn merged_from_files(main: &Path, main_table: &toml::Table, drop_in: &Path) -> (toml::Table, Vec<PathBuf>) {
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
pub(super) fn merge_into(into: &mut toml::Table, from: &toml::Table) {
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
pub(super) fn table_at<'a>(table: &'a mut toml::Table, key: &str) -> &'a mut toml::Table {
    let entry = table
        .entry(key.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !entry.is_table() {
        *entry = toml::Value::Table(toml::Table::new());
    }
    entry.as_table_mut().expect("just made a table")
}

pub(super) fn toml_string(s: &str) -> String {
    // A JSON string is a valid TOML basic string for everything a path holds.
    json!(s).to_string()
}

/// Whether containerd's `imports` entry (a path or a glob of one directory) covers `file`.
pub(super) fn import_covers(entry: &str, file: &Path) -> bool {
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
