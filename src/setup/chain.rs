//! containerd's config as containerd reads it: the main file and every file it imports (and
//! theirs), in containerd's order, each read where the engine would read it, and the CRI
//! runtime section those files make together, or as `containerd config dump` prints it.
//!
//! containerd follows `imports` breadth first from the main file: a relative entry is relative
//! to the importing file's directory, an entry with a `*` is a glob whose matches are sorted,
//! and a file already loaded is not loaded again. containerd 2.x merges each file into what
//! came before key by key; containerd 1.x replaces a plugin's whole section with the later
//! file's (containerd issue #5837), so there the last file that has the section is the one
//! that counts. Paths in the files are the engine's: from a node set-up's container they are
//! resolved inside the host root ([`EngineView`]), never in the container's own `/etc`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use super::host_root::EngineView;
use super::*;

/// How long `containerd config dump` may take: it reads a few files and prints (well under a
/// second); a containerd that hangs must not hang setup.
pub const DUMP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a host's own programs are, in the order a root shell's PATH has them: where a node
/// set-up looks for the host's `containerd` to run chrooted into the host root.
pub const HOST_PROGRAM_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// One file of containerd's config.
#[derive(Debug, Clone)]
pub struct ChainFile {
    /// The path as containerd names it.
    pub engine: PathBuf,
    /// Where this process reads (and writes) it.
    pub local: PathBuf,
    pub text: String,
    pub table: toml::Table,
}

/// The files containerd loads, the main one first, in containerd's order.
#[derive(Debug, Clone, Default)]
pub struct ConfigChain {
    pub files: Vec<ChainFile>,
    /// What could not be followed, for the lines setup prints.
    pub notes: Vec<String>,
}

pub use crate::spec::clean;

fn imports_in(table: &toml::Table) -> Vec<String> {
    table
        .get("imports")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

impl ConfigChain {
    /// The main config (`main`, as containerd names it; read through `view` when given) and
    /// every file it imports. An import that cannot be read or parsed is left out with a note.
    pub fn load(main: &Path, main_text: &str, main_table: &toml::Table, view: Option<&EngineView>) -> ConfigChain {
        let local_of = |engine: &Path| -> std::result::Result<PathBuf, String> {
            match view {
                Some(view) => view.local(engine).map_err(|e| e.to_string()),
                None => Ok(engine.to_path_buf()),
            }
        };
        let mut chain = ConfigChain::default();
        let main_local = match local_of(main) {
            Ok(local) => local,
            Err(e) => {
                chain.notes.push(e);
                main.to_path_buf()
            }
        };
        chain.files.push(ChainFile {
            engine: main.to_path_buf(),
            local: main_local,
            text: main_text.to_string(),
            table: main_table.clone(),
        });
        let mut seen = vec![main.to_path_buf()];
        let mut pending: VecDeque<PathBuf> = chain.import_paths(main, main_table, &local_of).into();
        while let Some(engine) = pending.pop_front() {
            if seen.contains(&engine) {
                continue;
            }
            seen.push(engine.clone());
            let local = match local_of(&engine) {
                Ok(local) => local,
                Err(e) => {
                    chain
                        .notes
                        .push(format!("did not follow the import {}: {e}", engine.display()));
                    continue;
                }
            };
            let text = match read_optional(&local) {
                Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                Ok(None) => {
                    chain
                        .notes
                        .push(format!("the import {} does not exist", engine.display()));
                    continue;
                }
                Err(e) => {
                    chain.notes.push(e.to_string());
                    continue;
                }
            };
            let table = match toml::from_str::<toml::Table>(&text) {
                Ok(table) => table,
                Err(e) => {
                    chain.notes.push(format!(
                        "the import {} is not valid TOML ({}); containerd would not start with it",
                        engine.display(),
                        crate::one_line(e.message())
                    ));
                    continue;
                }
            };
            pending.extend(chain.import_paths(&engine, &table, &local_of));
            chain.files.push(ChainFile {
                engine,
                local,
                text,
                table,
            });
        }
        chain
    }

    /// The files `table` (of the file `engine`) imports, as containerd resolves them.
    fn import_paths(
        &mut self,
        engine: &Path,
        table: &toml::Table,
        local_of: &dyn Fn(&Path) -> std::result::Result<PathBuf, String>,
    ) -> Vec<PathBuf> {
        let dir = engine.parent().unwrap_or(Path::new("/"));
        let mut out = Vec::new();
        for entry in imports_in(table) {
            let path = clean(&dir.join(&entry));
            if !entry.contains('*') {
                out.push(path);
                continue;
            }
            let (Some(parent), Some(pattern)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
                continue;
            };
            if parent.to_string_lossy().contains('*') || pattern.matches('*').count() > 1 {
                self.notes.push(format!(
                    "did not follow the import {entry:?}: only one `*`, in the file name, is read"
                ));
                continue;
            }
            let Ok(local_dir) = local_of(parent) else { continue };
            let Ok(entries) = std::fs::read_dir(&local_dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|name| import_covers(&path.to_string_lossy(), &parent.join(name)))
                .collect();
            names.sort();
            out.extend(names.into_iter().map(|name| parent.join(name)));
        }
        out
    }

    /// The section of `plugin` as containerd makes it from these files, all but `skip` (the
    /// file setup writes, which must not feed itself): key by key (containerd 2.x), or the
    /// last file's whole section (`whole_sections`, containerd 1.x).
    pub fn section(&self, plugin: &str, whole_sections: bool, skip: Option<&Path>) -> toml::Table {
        let mut merged = toml::Table::new();
        for file in self.files.iter().filter(|f| Some(f.local.as_path()) != skip) {
            let Some(section) = plugin_section(&file.table, plugin) else {
                continue;
            };
            if whole_sections {
                merged = section.clone();
            } else {
                merge_into(&mut merged, section);
            }
        }
        merged
    }

    /// The imported files (not the main one), as containerd names them.
    pub fn imported(&self) -> impl Iterator<Item = &ChainFile> {
        self.files.iter().skip(1)
    }
}

/// `plugins.<plugin>` of a config file.
pub fn plugin_section<'a>(table: &'a toml::Table, plugin: &str) -> Option<&'a toml::Table> {
    table
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(toml::Value::as_table)
}

/// Where the merged CRI runtime section came from, for the line setup prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedFrom {
    /// `containerd --config <main> config dump` (chrooted into the host root from a node set-up).
    Dump,
    /// The config's files, merged as containerd 2.x merges them, because the dump could not be
    /// had (the reason).
    Files { files: Vec<PathBuf>, why: String },
}

/// The CRI runtime section of containerd 2.x's config (version 3) as containerd merges it:
/// `containerd config dump` ([`containerd_dump`]); where that fails (no containerd, a containerd
/// 1.x that cannot read version 3, a hang), the chain's files but `drop_in`, merged key by key.
/// An `SystemdCgroup = true` the admin set in an imported file is in both, never in the main
/// file alone.
pub fn merged_runtime_section(
    chain: &ConfigChain,
    view: Option<&EngineView>,
    drop_in: &Path,
) -> (toml::Table, MergedFrom) {
    match containerd_dump(&chain.files[0].engine, view) {
        Ok(dump) => (dump, MergedFrom::Dump),
        Err(why) => (
            chain.section(CRI_RUNTIME_PLUGIN_V3, false, Some(drop_in)),
            MergedFrom::Files {
                files: chain
                    .imported()
                    .filter(|f| f.local != drop_in)
                    .map(|f| f.engine.clone())
                    .collect(),
                why,
            },
        ),
    }
}

/// The CRI runtime section of `containerd --config <main> config dump`, or why there is none.
/// On the host, the `containerd` on PATH; from a node set-up, the host's own `containerd` run
/// chrooted into the host root (as NVIDIA's toolkit does), so that it reads the host's files
/// and its imports resolve there; a containerd in the set-up's image would read the image's.
pub fn containerd_dump(main: &Path, view: Option<&EngineView>) -> std::result::Result<toml::Table, String> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut command = match view {
        None => std::process::Command::new("containerd"),
        Some(view) if !view.engine_is_on_the_host() => {
            return Err(format!(
                "the engine reads its files under {}, where no program of the host's can be run",
                view.engine_root.display()
            ))
        }
        Some(view) => {
            let Some(binary) = HOST_PROGRAM_DIRS
                .iter()
                .map(|dir| Path::new(dir).join("containerd"))
                .find(|p| view.host.resolve(p).is_ok_and(|local| local.is_file()))
            else {
                return Err(format!(
                    "the host has no containerd in {}",
                    HOST_PROGRAM_DIRS.join(", ")
                ));
            };
            let root = std::ffi::CString::new(view.host.root.as_os_str().as_encoded_bytes())
                .map_err(|_| "the host root's path holds a NUL byte".to_string())?;
            let mut command = std::process::Command::new(&binary);
            // SAFETY: chroot(2) and chdir(2) are async-signal-safe, and the path was made
            // before the fork; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if nix::libc::chroot(root.as_ptr()) != 0 || nix::libc::chdir(c"/".as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            command
        }
    };
    let mut child = command
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
        return Err("the containerd found is not 2.x (its config dump is not version 3)".into());
    }
    plugin_section(&dump, CRI_RUNTIME_PLUGIN_V3)
        .cloned()
        .ok_or_else(|| format!("containerd config dump has no {CRI_RUNTIME_PLUGIN_V3} section"))
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
