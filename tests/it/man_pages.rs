//! The man pages in `man/` and the shell completions in `completions/` that come from the
//! clap definitions in `src/cli.rs` are generated here, so that `--help`, the man page and
//! the completion of a flag cannot drift apart. The checked-in files must match what the code
//! generates now; after changing the CLI, regenerate them with
//!
//!     UPDATE_MAN=1 cargo test --release --test it man_pages::
//!
//! (that run writes them and fails: writing is not checking), review and commit the result, and
//! run the test again without it. `man/vramgate-runtime.8` (the runc wrapper has no parser of its own:
//! it passes runc's argv through) and `man/vramgate.toml.5` are written by hand; every page,
//! generated or not, must render without a warning.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;
use vramgate::cli::{Cli, DevicePluginCli, DraCli, HookCli};

const REGENERATE: &str = "UPDATE_MAN=1 cargo test --release --test it man_pages::";
/// The date in the pages' title line: that of the last change to what they say. clap_mangen
/// drops an empty date and shifts the title line's fields, so there must be one.
const MAN_DATE: &str = "2026-11-28";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every generated file: its path under the repository and its content.
fn generated() -> Vec<(&'static str, Vec<u8>)> {
    let mut files = vec![
        ("man/vramgate.8", vramgate_page()),
        ("man/vramgate-hook.8", hook_page()),
        ("man/vramgate-device-plugin.8", device_plugin_page()),
        ("man/vramgate-dra.8", dra_page()),
    ];
    for (path, shell) in [
        ("completions/vramgate.bash", Shell::Bash),
        ("completions/_vramgate", Shell::Zsh),
        ("completions/vramgate.fish", Shell::Fish),
    ] {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "vramgate", &mut out);
        files.push((path, out));
    }
    files
}

fn header(name: &str) -> Vec<u8> {
    format!(
        ".\\\" {name}: generated from src/cli.rs by tests/it/man_pages.rs; do not edit.\n.\\\" Regenerate: {REGENERATE}\n"
    )
    .into_bytes()
}

/// The title line every vramgate page shares: section, source and manual as admins expect.
fn man(cmd: clap::Command, section: &str) -> Man {
    let title = cmd.get_name().to_uppercase();
    Man::new(cmd)
        .title(title)
        .section(section)
        .date(MAN_DATE)
        .source(format!("vramgate {}", env!("CARGO_PKG_VERSION")))
        .manual("System Administration")
}

/// Renders one section with clap_mangen, without its `.SH` line, to reuse inside another.
fn section_body(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Vec<u8> {
    let mut out = Vec::new();
    render(&mut out).expect("rendering to memory");
    let text = String::from_utf8(out).expect("roff is UTF-8");
    text.lines()
        .filter(|l| !l.starts_with(".SH "))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .into_bytes()
}

/// `after_help` text as a man section: a first line ending in ':' names the section, indented
/// lines are kept as they are (commands), others are filled as prose.
fn after_help_section(cmd: &clap::Command, default_title: &str) -> Vec<u8> {
    let Some(text) = cmd.get_after_help().map(|t| t.to_string()) else {
        return Vec::new();
    };
    let mut lines = text.lines().peekable();
    let title = match lines.peek() {
        Some(first) if first.ends_with(':') => lines.next().unwrap().trim_end_matches(':').to_uppercase(),
        _ => default_title.to_string(),
    };
    let mut roff = Roff::new();
    roff.control("SH", [title.as_str()]);
    let mut in_block = false;
    for line in lines {
        let indented = line.starts_with("  ");
        if indented && !in_block {
            roff.control("PP", []).control("nf", []).control("RS", ["4"]);
            in_block = true;
        } else if !indented && in_block {
            roff.control("RE", []).control("fi", []);
            in_block = false;
        }
        if line.trim().is_empty() {
            roff.control("PP", []);
        } else {
            roff.text([roman(if indented { &line[2..] } else { line })]);
        }
    }
    if in_block {
        roff.control("RE", []).control("fi", []);
    }
    roff.render().into_bytes()
}

/// Hand-written sections of a generated page: roff source appended as is.
fn text_sections(sections: &[(&str, &[&str])]) -> Vec<u8> {
    let mut roff = Roff::new();
    for (title, paragraphs) in sections {
        roff.control("SH", [*title]);
        for (n, paragraph) in paragraphs.iter().enumerate() {
            if n > 0 {
                roff.control("PP", []);
            }
            match paragraph.split_once('\t') {
                // "term\tdefinition": a tagged paragraph, term in bold.
                Some((term, definition)) => {
                    roff.control("TP", []).text([bold(term)]).text([roman(definition)]);
                }
                None => {
                    roff.text([roman(*paragraph)]);
                }
            }
        }
    }
    roff.render().into_bytes()
}

/// The leaves of a command tree ("status", "ledger show", ...), each with its full name.
fn leaf_commands(cmd: &clap::Command, prefix: &str, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("{prefix} {}", sub.get_name());
        if sub.has_subcommands() {
            leaf_commands(sub, &name, out);
        } else {
            out.push((name, sub.clone()));
        }
    }
}

/// vramgate(8): one page with every command and its options, like systemctl(1), rather than
/// a page per command: there are few, and an admin reads them together.
fn vramgate_page() -> Vec<u8> {
    let cmd = Cli::command();
    let page = man(cmd.clone(), "8");
    let mut out = header("vramgate(8)");
    let body = |f: fn(&Man, &mut dyn std::io::Write) -> std::io::Result<()>| {
        let mut o = Vec::new();
        f(&page, &mut o).unwrap();
        o
    };
    out.extend(body(Man::render_title));
    out.extend(body(Man::render_name_section));
    out.extend(body(Man::render_synopsis_section));
    out.extend(body(Man::render_description_section));
    out.extend(body(Man::render_options_section));

    let mut commands = Vec::new();
    leaf_commands(&cmd, "vramgate", &mut commands);
    out.extend(b".SH COMMANDS\n");
    for (name, sub) in commands {
        let sub = sub.bin_name(&name).disable_help_flag(true);
        let mut roff = Roff::new();
        roff.control("SS", [name.as_str()]);
        out.extend(roff.render().into_bytes());
        let sub_page = Man::new(sub.clone());
        out.extend(section_body(|w| sub_page.render_synopsis_section(w)));
        if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
            let mut roff = Roff::new();
            roff.control("PP", []).text([roman(about.to_string())]);
            out.extend(roff.render().into_bytes());
        }
        if sub.get_arguments().next().is_some() {
            out.extend(section_body(|w| sub_page.render_options_section(w)));
        }
    }
    out.extend(after_help_section(&cmd, "EXAMPLES"));
    out.extend(text_sections(&[
        (
            "EXIT STATUS",
            &["0 on success; 1 when the command failed or found nothing to act on (a message on stderr says which); 2 on a usage error."],
        ),
        (
            "ENVIRONMENT",
            &["VRAMGATE_CONFIG\tThe config file to read instead of /etc/vramgate/config.toml; --config sets it."],
        ),
        (
            "FILES",
            &[
                "/etc/vramgate/config.toml\tThe configuration, see vramgate.toml(5). A missing file means the defaults.",
                "/run/vramgate/\tThe state directory (root only, mode 0700): ledger.json, the reservations and the wait queue; lock, taken for every change; events.jsonl, one line per decision.",
                "/usr/share/containers/oci/hooks.d/vramgate-*.json\tThe hooks.d entries that make podman and CRI-O run vramgate-hook(8).",
            ],
        ),
        ("SEE ALSO", &["vramgate-hook(8), vramgate-runtime(8), vramgate.toml(5), runc(8), podman(1)"]),
    ]));
    out
}

/// A section 8 page of a binary without subcommands: clap_mangen's title, name, synopsis,
/// description and options, the command's after-help as NOTES, then `sections`.
fn single_command_page(cmd: clap::Command, title: &str, sections: &[(&str, &[&str])]) -> Vec<u8> {
    let page = man(cmd.clone(), "8");
    let mut out = header(title);
    let mut o = Vec::new();
    page.render_title(&mut o).unwrap();
    page.render_name_section(&mut o).unwrap();
    page.render_synopsis_section(&mut o).unwrap();
    page.render_description_section(&mut o).unwrap();
    page.render_options_section(&mut o).unwrap();
    out.extend(o);
    out.extend(after_help_section(&cmd, "NOTES"));
    out.extend(text_sections(sections));
    out
}

/// vramgate-hook(8): clap_mangen's page with section 8, plus what an OCI hook's page needs.
fn hook_page() -> Vec<u8> {
    single_command_page(
        HookCli::command(),
        "vramgate-hook(8)",
        &[
        (
            "STAGES",
            &[
                "createRuntime, prestart\tReserve the container's request, wait for it (policy wait), or refuse the start. The OCI state on stdin must carry the container's init pid.",
                "createContainer\tAccepted for runtimes that only offer it; the same as createRuntime.",
                "poststop\tRelease the container's reservation and queue ticket; a container vramgate never saw is no error. Runtimes only warn when a poststop hook fails.",
            ],
        ),
        (
            "ENVIRONMENT",
            &["VRAMGATE_CONFIG\tThe config file to read instead of /etc/vramgate/config.toml (a hook's env entry can set it)."],
        ),
        (
            "FILES",
            &[
                "/etc/vramgate/config.toml\tThe configuration, see vramgate.toml(5).",
                "/run/vramgate/events.jsonl\tEvery decision, one JSON object a line; crun discards hook stderr, this keeps it.",
            ],
        ),
        ("SEE ALSO", &["vramgate(8), vramgate-runtime(8), vramgate.toml(5), oci-hooks(5)"]),
        ],
    )
}

/// vramgate-device-plugin(8): the Kubernetes device plugin, from its clap definition.
fn device_plugin_page() -> Vec<u8> {
    single_command_page(
        DevicePluginCli::command(),
        "vramgate-device-plugin(8)",
        &[
        (
            "FILES",
            &[
                "/var/lib/kubelet/device-plugins/kubelet.sock\tkubelet's registration socket; when it is created again (kubelet restarted) the plugin registers again.",
                "/etc/vramgate/config.toml\tThe configuration, see vramgate.toml(5): the state directory and the inventory the plugin reads.",
                "/usr/lib/systemd/system/vramgate-device-plugin.service\tThe unit that runs it on a node (installed, not enabled).",
            ],
        ),
        ("SEE ALSO", &["vramgate(8), vramgate-runtime(8), vramgate-hook(8), vramgate.toml(5)"]),
        ],
    )
}

fn dra_page() -> Vec<u8> {
    single_command_page(
        DraCli::command(),
        "vramgate-dra(8)",
        &[
        (
            "FILES",
            &[
                "/var/lib/kubelet/plugins_registry/gpu-memory.vramgate.dev-reg.sock\tThe registration socket kubelet's plugin watcher finds; removed at stop (kubelet then removes the node's slice unless the driver comes back).",
                "/var/lib/kubelet/plugins/gpu-memory.vramgate.dev/dra.sock\tThe DRA service kubelet calls to prepare and unprepare claims.",
                "/var/run/cdi/vramgate.dev-gpu-memory_<claim uid>.json\tEach prepared claim's CDI spec: the driver's record of what it prepared.",
                "/etc/vramgate/config.toml\tThe configuration, see vramgate.toml(5): the state directory and the inventory the driver reads.",
                "/usr/lib/systemd/system/vramgate-dra.service\tThe unit that runs it on a node (installed, not enabled), with /etc/default/vramgate-dra.",
            ],
        ),
        ("SEE ALSO", &["vramgate(8), vramgate-runtime(8), vramgate-device-plugin(8), vramgate.toml(5)"]),
        ],
    )
}

#[test]
fn man_pages_and_completions_match_the_cli() {
    let update = std::env::var_os("UPDATE_MAN").is_some();
    let mut stale = Vec::new();
    for (relative, content) in generated() {
        let path = root().join(relative);
        if std::fs::read(&path).ok().as_deref() != Some(&content[..]) {
            stale.push(relative);
        }
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            file.write_all(&content).unwrap();
            eprintln!("wrote {}", path.display());
        }
    }
    // Writing the files is not checking them: a run with UPDATE_MAN never passes, so that it
    // cannot stand in CI (or a developer's habit) for the comparison.
    assert!(
        !update,
        "UPDATE_MAN is set: the man pages and completions were written ({} had changed), not \
         checked; review and commit them, then run again without UPDATE_MAN",
        if stale.is_empty() {
            "none".to_string()
        } else {
            stale.join(", ")
        }
    );
    assert!(
        stale.is_empty(),
        "{} do not match the CLI in src/cli.rs: regenerate them with `{REGENERATE}` and commit the result",
        stale.join(", ")
    );
}

fn man_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("man"))
        .expect("man/ exists")
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    pages
}

#[test]
fn every_page_the_issue_names_exists() {
    let names: Vec<String> = man_pages()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for page in [
        "vramgate.8",
        "vramgate-hook.8",
        "vramgate-runtime.8",
        "vramgate-device-plugin.8",
        "vramgate.toml.5",
    ] {
        assert!(
            names.iter().any(|n| n == page),
            "man/{page} is missing (have {names:?})"
        );
    }
}

/// `man -l` and `groff -ww` render each page without a warning (an unknown macro, a broken
/// escape, a line that cannot be adjusted all show up here before a user sees them).
#[test]
fn man_pages_render_without_warnings() {
    for page in man_pages() {
        let man = Command::new("man")
            .args(["--warnings", "-l", "-E", "UTF-8"])
            .arg(&page)
            .env("MANWIDTH", "80")
            .output()
            .expect("man(1) runs: install it with `apt-get install man-db` (scripts/install-deps does)");
        let warnings = String::from_utf8_lossy(&man.stderr);
        assert!(man.status.success(), "man -l {} failed: {warnings}", page.display());
        assert!(
            warnings.trim().is_empty(),
            "man -l {} warns:\n{warnings}",
            page.display()
        );
        let rendered = String::from_utf8_lossy(&man.stdout);
        assert!(
            rendered.contains("NAME"),
            "{} renders without a NAME section",
            page.display()
        );

        let groff = Command::new("groff")
            .args(["-ww", "-z", "-man", "-K", "utf8"])
            .arg(&page)
            .output()
            .expect("groff runs (apt-get install groff-base)");
        let warnings = String::from_utf8_lossy(&groff.stderr);
        assert!(
            warnings.trim().is_empty(),
            "groff -ww {} warns:\n{warnings}",
            page.display()
        );
    }
}
