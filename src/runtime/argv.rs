//! runc's command line, as far as the wrapper needs it: the global flags (to find `--log`,
//! `--log-format` and `--root`), the verb, and for `create` and `run` the bundle.
//!
//! Flags are read the way runc's CLI library (urfave/cli) reads them: one or two dashes, the
//! value after a space or an `=`. Every flag that takes a value is named below, so its value
//! is never mistaken for the verb or for another flag: `runc --root create create -b create id`
//! has verb `create` and bundle `create`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// runc's global options that take a value (`runc --root X create …`). Everything else before
/// the verb is a switch (`--debug`, `--systemd-cgroup`, `--help`, `--version`).
/// The verb an engine runs when it is done with a container, a create it gave up on included.
pub const DELETE_VERB: &str = "delete";
pub const GLOBAL_VALUE_FLAGS: &[&str] = &["root", "log", "log-format", "criu", "rootless"];
/// Options of `runc create` and `runc run` that take a value (`pidfd-socket` since runc 1.2).
/// `run` adds only switches to create's: `--detach`/`-d`, `--keep`, `--no-subreaper`.
pub const CREATE_VALUE_FLAGS: &[&str] = &[
    "bundle",
    "b",
    "console-socket",
    "pidfd-socket",
    "pid-file",
    "preserve-fds",
];
pub const LOG_FLAG: &str = "log";
/// Where runc keeps its containers' state; runc ids are unique within one root, so (root, id)
/// names one container (containerd gives each namespace a root of its own).
pub const ROOT_FLAG: &str = "root";
pub const LOG_FORMAT_FLAG: &str = "log-format";
/// The two spellings of the bundle flag (`--bundle`, `-b`; runc accepts either dash count).
pub const BUNDLE_FLAGS: &[&str] = &["bundle", "b"];
pub const CREATE_VERB: &str = "create";
/// `create` and `start` in one: the container is created from the bundle just the same.
pub const RUN_VERB: &str = "run";
/// The verbs that create a container from a bundle, and so get the hooks.
pub const BUNDLE_VERBS: &[&str] = &[CREATE_VERB, RUN_VERB];

/// What the wrapper needs from runc's command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The verb (`create`, `state`, …); `None` for `runc --version` and the like.
    pub verb: Option<OsString>,
    /// `--log`: where runc (and so we) write errors for the engine to read.
    pub log: Option<PathBuf>,
    /// `--log-format`: `text` (runc's default) or `json` (what containerd passes).
    pub log_format: Option<OsString>,
    /// `--root`, as given; `None` where the runtime's default applies.
    pub root: Option<PathBuf>,
    /// For `create` and `run`: the bundle directory, `.` when no flag names it.
    pub bundle: Option<PathBuf>,
    /// For `create`, `run` and `delete`: the container id (runc's one positional argument).
    pub container: Option<OsString>,
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

fn is_one_of(name: &[u8], flags: &[&str]) -> bool {
    flags.iter().any(|f| f.as_bytes() == name)
}

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

/// Reads the global flags, the verb and, for `create` and `run`, the bundle. `args` excludes
/// argv[0].
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
        if !is_one_of(name, GLOBAL_VALUE_FLAGS) {
            continue;
        }
        let value = flag_value(inline, args, &mut i);
        if name == LOG_FLAG.as_bytes() {
            inv.log = value.map(PathBuf::from);
        } else if name == LOG_FORMAT_FLAG.as_bytes() {
            inv.log_format = value;
        } else if name == ROOT_FLAG.as_bytes() {
            inv.root = value.map(PathBuf::from);
        }
    }
    if inv
        .verb
        .as_deref()
        .is_some_and(|v| v.as_bytes() == DELETE_VERB.as_bytes())
    {
        // `runc delete [--force] <id>`: its flags are switches, its one argument the id.
        inv.container = args[i..].iter().find(|a| flag_name(a).is_none()).cloned();
        return inv;
    }
    if !inv
        .verb
        .as_deref()
        .is_some_and(|v| is_one_of(v.as_bytes(), BUNDLE_VERBS))
    {
        return inv;
    }
    let mut bundle = None;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg.as_bytes() == b"--" {
            if inv.container.is_none() {
                inv.container = args.get(i).cloned();
            }
            break;
        }
        let Some((name, inline)) = flag_name(arg) else {
            // The container id.
            if inv.container.is_none() {
                inv.container = Some(arg.clone());
            }
            continue;
        };
        if !is_one_of(name, CREATE_VALUE_FLAGS) {
            continue;
        }
        let value = flag_value(inline, args, &mut i);
        if is_one_of(name, BUNDLE_FLAGS) {
            bundle = value;
        }
    }
    inv.bundle = Some(bundle.map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")));
    inv
}

/// The `--root` of the runtime process `pid`, read from its command line: what the hook
/// (run by `runc create` or `runc delete` as their child) knows of the root its container
/// lives in. `None` where the flag is absent, and where the command line cannot be read (a
/// runtime that runs hooks through a helper process would then not match the wrapper's
/// `delete`, which passes its own flag; see [`crate::enforce::lifecycle`]).
pub fn runtime_root_of(pid: u32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<OsString> = cmdline
        .split(|&b| b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| OsStr::from_bytes(a).to_os_string())
        .collect();
    parse_args(&args).root
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_root_is_read_in_both_spellings() {
        assert_eq!(
            inv(&["--root", "/r", "delete", "c"]).root.as_deref(),
            Some(Path::new("/r"))
        );
        assert_eq!(
            inv(&["-root=/r2", "create", "c"]).root.as_deref(),
            Some(Path::new("/r2"))
        );
        assert_eq!(
            inv(&["delete", "--root", "c"]).root,
            None,
            "a flag after the verb is not global"
        );
        assert_eq!(inv(&["delete", "c"]).root, None);
    }

    fn inv(args: &[&str]) -> Invocation {
        parse_args(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }
    /// `delete` names its container (the wrapper drops an abandoned wait of that id); other
    /// pass-through verbs are not read past the verb.
    #[test]
    fn delete_names_its_container() {
        for (args, id) in [
            (&["--root", "/r", "delete", "--force", "c1"][..], Some("c1")),
            (&["delete", "-f", "c2"][..], Some("c2")),
            (&["delete", "c3"][..], Some("c3")),
            (&["delete"][..], None),
            (&["kill", "c4", "9"][..], None),
        ] {
            assert_eq!(inv(args).container.as_deref(), id.map(OsStr::new), "{args:?}");
        }
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
            // `run` is `create` + `start`: the same bundle flags.
            (
                &["--root", "create", "run", "-b", "/b", "id"],
                Some("run"),
                None,
                Some("/b"),
            ),
            (&["run", "id"], Some("run"), None, Some(".")),
            (&["run", "-d", "--bundle", "/b", "id"], Some("run"), None, Some("/b")),
            (
                &["run", "--detach", "-b=/b", "--keep", "id"],
                Some("run"),
                None,
                Some("/b"),
            ),
            (
                &[
                    "--log",
                    "/l",
                    "run",
                    "--pid-file",
                    "/p",
                    "--console-socket",
                    "/s",
                    "--preserve-fds",
                    "2",
                    "--no-subreaper",
                    "--no-pivot",
                    "--no-new-keyring",
                    "-b",
                    "/b",
                    "id",
                ],
                Some("run"),
                Some("/l"),
                Some("/b"),
            ),
            (&["run", "--pid-file", "-b", "id"], Some("run"), None, Some(".")),
            (&["run", "--", "-b", "/b"], Some("run"), None, Some(".")),
            // runc 1.2's --pidfd-socket takes a value, for create and run alike.
            (
                &["create", "--pidfd-socket", "-b", "id"],
                Some("create"),
                None,
                Some("."),
            ),
            (
                &["run", "--pidfd-socket=/s", "-b", "/b", "id"],
                Some("run"),
                None,
                Some("/b"),
            ),
            // Only create and run name a bundle; restore's and exec's flags are not read.
            (&["exec", "-b", "/b", "id"], Some("exec"), None, None),
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
}
