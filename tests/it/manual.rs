//! The manual in `docs/` (an mdBook) and the README that leads into it: the book builds with
//! the real `mdbook`, no link inside it or from the README is dead (files and `#anchors`, with
//! mdbook's own heading ids), and the reference chapter names exactly the configuration keys,
//! annotations and environment variables the code reads.

use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chapters() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files
}

/// mdbook's id for a heading (`normalize_id`): lowercase alphanumerics, `_` and `-` kept,
/// whitespace turned into `-`, the rest dropped.
fn heading_id(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The ids of a markdown file's headings (outside code blocks), with mdbook's `-1`, `-2`
/// suffixes for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let id = heading_id(title);
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
        *n += 1;
    }
    out
}

/// Every `](target)` link outside code blocks and inline code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Inline code spans may show link syntax as an example.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// Dead links in `file`: a relative path that does not exist, or an anchor its target file
/// has no heading for.
fn dead_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    let mut dead = Vec::new();
    for link in links(&text) {
        if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match link.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (link.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !target.exists() {
            dead.push(format!("{}: {link} (no such file)", file.display()));
            continue;
        }
        if let Some(anchor) = anchor {
            let ids = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
            if !ids.contains(anchor) {
                dead.push(format!("{}: {link} (no heading with that id)", file.display()));
            }
        }
    }
    dead
}

#[test]
fn no_link_in_the_book_or_the_readme_is_dead() {
    let mut files = chapters();
    files.push(root().join("README.md"));
    let dead: Vec<String> = files.iter().flat_map(|f| dead_links(f)).collect();
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
    // Every chapter is in the book's table of contents, and every entry is a chapter.
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let present: BTreeSet<String> = chapters()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "SUMMARY.md")
        .collect();
    assert_eq!(listed, present, "SUMMARY.md and the chapters in docs/src differ");
}

#[test]
fn the_checker_finds_dead_links() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.md");
    std::fs::write(dir.path().join("b.md"), "# Bee\n\n## Two words\n\n## Two words\n").unwrap();
    std::fs::write(
        &a,
        "[ok](b.md#two-words) [ok](b.md#two-words-1) [no](b.md#bee-2) [gone](c.md) `[code](x.md)`\n",
    )
    .unwrap();
    let dead = dead_links(&a);
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead[0].ends_with("b.md#bee-2 (no heading with that id)"), "{dead:?}");
    assert!(dead[1].ends_with("c.md (no such file)"), "{dead:?}");
}

/// Builds the book with the real mdbook into a scratch directory: a chapter missing from the
/// table of contents or a broken include fails here, as it would in the package build.
#[test]
fn the_book_builds() {
    support::require("mdbook");
    let out = tempfile::tempdir().unwrap();
    let built = Command::new("mdbook")
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "mdbook build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    for page in ["index.html", "reference.html", "replay.html", "design-dra.html"] {
        assert!(out.path().join(page).is_file(), "{page} was not built");
    }
    let reference = std::fs::read_to_string(out.path().join("reference.html")).unwrap();
    assert!(
        reference.contains("backfill_bound"),
        "the reference page lacks its table"
    );
}

/// Backticked names in the first column(s) of the reference chapter's section `heading`.
fn reference_names(heading: &str, column: usize) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("docs/src/reference.md")).unwrap();
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("reference.md has no {heading}"));
    let section = &text[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .skip(1)
        .filter_map(|l| l.split('|').nth(column + 1).map(str::trim))
        .filter_map(|cell| cell.strip_prefix('`').and_then(|c| c.split('`').next()))
        .map(str::to_string)
        .collect()
}

/// The configuration keys: the shipped config (which tests/it/default_config.rs ties to the
/// code's defaults and to vramgate.toml(5)) and the reference chapter name the same ones.
#[test]
fn the_reference_names_every_config_key_and_no_other() {
    let shipped = std::fs::read_to_string(root().join("packaging/config.toml")).unwrap();
    let code: BTreeSet<String> = support::config_keys(&shipped).into_iter().collect();
    let documented = reference_names("## Configuration keys", 1);
    assert_eq!(
        documented, code,
        "docs/src/reference.md and packaging/config.toml differ"
    );
}

/// The annotations and environment variables: every `vramgate.dev/…` and `VRAMGATE_…` name the
/// source declares as a constant is in the reference chapter, and the chapter names none that
/// the source does not.
#[test]
fn the_reference_names_every_annotation_and_variable_and_no_other() {
    let mut code = BTreeSet::new();
    let mut stack = vec![root().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text
                .lines()
                .filter(|l| l.contains("const ") && l.contains(": &str = \""))
            {
                let value = line.split('"').nth(1).unwrap_or("");
                let is_key = (value.starts_with("vramgate.dev/") && !value.contains('*'))
                    || (value.starts_with("VRAMGATE_") && value.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
                if is_key {
                    code.insert(value.to_string());
                }
            }
        }
    }
    assert!(
        code.contains("vramgate.dev/memory") && code.contains("VRAMGATE_CONFIG"),
        "{code:?}"
    );
    let mut documented = reference_names("## Annotations and environment", 0);
    documented.extend(reference_names("## Annotations and environment", 1));
    assert_eq!(
        documented, code,
        "docs/src/reference.md and the source's constants differ"
    );
}

/// NVIDIA's request keys that vramgate reads are in the reference chapter's own section.
#[test]
fn the_reference_names_nvidias_request_keys() {
    let documented = reference_names("## NVIDIA's request keys", 1);
    for key in [
        vramgate::request::NVIDIA_REQUEST_ENV,
        vramgate::request::NVIDIA_LIMIT_ENV,
    ] {
        assert!(documented.contains(key), "{key} in {documented:?}");
    }
    let annotations = reference_names("## NVIDIA's request keys", 0);
    assert!(
        annotations.contains(vramgate::request::NVIDIA_ANNOTATION_PREFIX),
        "{annotations:?}"
    );
}
