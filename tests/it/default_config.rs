//! `packaging/config.toml` becomes the package's `/etc/vramgate/config.toml`. It must parse,
//! the defaults it shows in comments must be the real defaults, and it, the manual's
//! configuration chapter and vramgate.toml(5) must name the same keys.

use crate::support;

use std::path::{Path, PathBuf};

use support::config_keys;
use vramgate::config::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shipped() -> PathBuf {
    root().join("packaging/config.toml")
}

/// Settings are commented as `#key = value` (no space), prose as `# text`: uncommenting the
/// former gives the file an admin gets by uncommenting every setting.
fn uncomment_settings(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '[') => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn without_source(config: Config) -> String {
    format!("{:?}", Config { source: None, ..config })
}

#[test]
fn shipped_config_parses_to_the_defaults() {
    let config = Config::load_from(&shipped()).expect("packaging/config.toml parses");
    assert_eq!(config.source.as_deref(), Some(shipped().as_path()));
    assert_eq!(without_source(config), without_source(Config::default()));
}

#[test]
fn the_commented_defaults_are_the_real_defaults() {
    let text = uncomment_settings(&std::fs::read_to_string(shipped()).unwrap());
    assert!(
        text.contains("\nstate_dir = ") && text.contains("\n[[inventory.gpus]]"),
        "{text}"
    );
    let config = Config::parse(&text, Path::new("uncommented.toml"))
        .unwrap_or_else(|e| panic!("packaging/config.toml with every setting uncommented: {e}"));
    // The one example that is not a default: the static GPU table.
    assert_eq!(config.inventory.gpus.len(), 1);
    assert_eq!(config.inventory.gpus[0].total, 80 << 30);
    let mut config = config;
    config.inventory.gpus.clear();
    assert_eq!(without_source(config), without_source(Config::default()));
}

#[test]
fn manual_shipped_config_and_man_page_name_the_same_keys() {
    let readme = std::fs::read_to_string(root().join("docs/src/configuration.md")).unwrap();
    let start = readme
        .find("# Configuration")
        .expect("docs/src/configuration.md has its heading");
    let block = &readme[start..];
    let block = &block[block.find("```toml").expect("with a toml block") + 7..];
    let block = &block[..block.find("```").unwrap()];
    let readme_keys = config_keys(block);
    assert!(readme_keys.len() >= 10, "{readme_keys:?}");

    let shipped_keys = config_keys(&std::fs::read_to_string(shipped()).unwrap());
    let missing: Vec<_> = readme_keys.iter().filter(|k| !shipped_keys.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "packaging/config.toml lacks the configuration chapter's keys {missing:?}"
    );

    // roff escapes '-' but not '_', so the keys appear as written.
    let page = std::fs::read_to_string(root().join("man/vramgate.toml.5")).unwrap();
    let undocumented: Vec<_> = shipped_keys
        .iter()
        .filter(|k| !page.contains(&format!(".B {k}")) && !page.contains(&format!(".BR {k} ")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "man/vramgate.toml.5 does not describe {undocumented:?}"
    );
}

/// `vramgate --config` wins over `$VRAMGATE_CONFIG`, which wins over the default; the CLI
/// passes the path down instead of exporting it.
#[test]
fn the_cli_reads_the_config_named_by_flag_else_env() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str| {
        let config = dir.path().join(format!("{name}.toml"));
        let state = dir.path().join(format!("{name}-state"));
        std::fs::write(&config, format!("state_dir = {:?}\n", state.display().to_string())).unwrap();
        (config, state)
    };
    let (flag_config, flag_state) = write("flag");
    let (env_config, env_state) = write("env");
    let gc = |flag: Option<&Path>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vramgate"));
        if let Some(path) = flag {
            cmd.arg("--config").arg(path);
        }
        let out = cmd.arg("gc").env("VRAMGATE_CONFIG", &env_config).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let out = gc(Some(&flag_config));
    assert!(out.contains(&flag_state.display().to_string()), "{out}");
    let out = gc(None);
    assert!(out.contains(&env_state.display().to_string()), "{out}");
}
