use super::*;
use std::os::unix::fs::MetadataExt;

fn options(engine: Engine, dir: &Path) -> SetupOptions {
    SetupOptions {
        engine,
        remove: false,
        set_as_default: false,
        config_path: Some(dir.join(match engine {
            Engine::Docker => "daemon.json",
            Engine::Containerd => "conf.d/vramgate.toml",
            _ => "hooks.d",
        })),
        containerd_config: Some(dir.join("config.toml")),
        containerd_import: None,
        crio_drop_in: Some(dir.join("crio.conf.d/10-vramgate.conf")),
        runtime_path: PathBuf::from("/usr/bin/vramgate-runtime"),
        hook_path: PathBuf::from("/usr/bin/vramgate-hook"),
        hook_timeout_secs: 3660,
        engine_view: None,
    }
}

fn run(o: &SetupOptions) -> Plan {
    let p = plan(o).unwrap();
    apply(&p).unwrap();
    p
}

#[test]
fn docker_keeps_keys_backs_up_and_is_reversible() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.json");
    let original = "{\"zz-first\": true, \"runtimes\": {\"nvidia\": {\"path\": \"nvidia-container-runtime\"}}, \"log-driver\": \"journald\"}\n";
    std::fs::write(&path, original).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut o = options(Engine::Docker, dir.path());
    o.set_as_default = true;
    assert_eq!(run(&o).changes.len(), 1);
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["zz-first", "runtimes", "log-driver", "default-runtime"]);
    assert_eq!(v["runtimes"]["nvidia"]["path"], "nvidia-container-runtime");
    assert_eq!(v["runtimes"]["vramgate"]["path"], "/usr/bin/vramgate-runtime");
    assert_eq!(v["default-runtime"], "vramgate");
    assert_eq!(mode_of(&path), Some(0o640));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("daemon.json.vramgate-backup")).unwrap(),
        original
    );
    // Twice: nothing to do.
    let again = run(&o);
    assert!(again.changes.is_empty() && again.unchanged == [path.clone()]);
    o.remove = true;
    run(&o);
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v, serde_json::from_str::<Value>(original).unwrap());
    assert!(run(&o).changes.is_empty());
}

#[test]
fn a_symlinked_config_directory_is_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(real.join("daemon.json"), "{\"log-driver\": \"journald\"}\n").unwrap();
    let link = dir.path().join("docker");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    run(&options(Engine::Docker, &link));
    let v: Value = serde_json::from_slice(&std::fs::read(real.join("daemon.json")).unwrap()).unwrap();
    assert_eq!(v["runtimes"]["vramgate"]["path"], "/usr/bin/vramgate-runtime");
    assert!(real.join("daemon.json.vramgate-backup").exists());
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
}

#[test]
fn docker_refuses_what_it_cannot_edit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("daemon.json");
    for (bad, needle) in [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        ("{\"runtimes\": 1}", "\"runtimes\""),
    ] {
        std::fs::write(&path, bad).unwrap();
        let err = plan(&options(Engine::Docker, dir.path())).unwrap_err().to_string();
        assert!(err.contains(needle) && err.contains("daemon.json"), "{err}");
    }
    // Missing file: created; removing again leaves nothing behind.
    std::fs::remove_file(&path).unwrap();
    let mut o = options(Engine::Docker, dir.path());
    run(&o);
    assert!(path.exists());
    o.remove = true;
    run(&o);
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), "{}");
}

const V2_CRI: &str = "plugins.\"io.containerd.grpc.v1.cri\"";

/// containerd 1.x (config version 2): the runtime goes into the main config by key, in place,
/// with the built-in runc beside it where the section does not name it; every other byte stays,
/// setup again changes nothing, and --remove gives the file back byte for byte.
#[test]
fn containerd_1_gets_the_runtime_by_key_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let original = "# host config\nversion = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    sandbox_image = \"x\" # pinned\n";
    std::fs::write(&main, original).unwrap();
    let inode = std::fs::metadata(&main).unwrap().ino();
    let mut o = options(Engine::Containerd, dir.path());
    run(&o);
    let text = std::fs::read_to_string(&main).unwrap();
    assert!(text.starts_with(original), "{text}");
    assert_eq!(std::fs::metadata(&main).unwrap().ino(), inode, "rewritten in place");
    assert!(!dir.path().join("conf.d/vramgate.toml").exists());
    let d: toml::Table = toml::from_str(&text).unwrap();
    let cri = &d["plugins"][CRI_PLUGIN];
    assert_eq!(cri["sandbox_image"].as_str(), Some("x"));
    let rt = &cri["containerd"]["runtimes"]["vramgate"];
    assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(rt["options"]["BinaryName"].as_str(), Some("/usr/bin/vramgate-runtime"));
    assert_eq!(rt["pod_annotations"][0].as_str(), Some("vramgate.dev/*"));
    assert_eq!(rt["pod_annotations"][1].as_str(), Some("nvidia.com/container.*"));
    // containerd 1.x would lose its built-in runc to a section that names none.
    assert_eq!(
        cri["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    assert!(run(&o).changes.is_empty(), "setup again changes nothing");
    o.remove = true;
    run(&o);
    // --remove takes the runtime out; the runc it added stays (nothing says it added it).
    let removed = std::fs::read_to_string(&main).unwrap();
    assert!(removed.starts_with(original), "{removed}");
    let d: toml::Table = toml::from_str(&removed).unwrap();
    assert!(d["plugins"][CRI_PLUGIN]["containerd"]["runtimes"]
        .get("vramgate")
        .is_none());
    assert_eq!(without_added_runc(&removed, &main).unwrap().unwrap(), original);
}

/// vramgate's runtime takes the default runtime's options, but not its binary; what the host
/// set for vramgate's runtime itself stays.
#[test]
fn the_runtime_inherits_the_default_runtimes_options() {
    let host: toml::Table = toml::from_str(
        "[containerd]\ndefault_runtime_name = \"nvidia\"\n\
             [containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/nvidia-container-runtime\"\n\
             SystemdCgroup = true\nRoot = \"/run/nv\"\nIoUid = 0\n",
    )
    .unwrap();
    let mine: toml::Table = toml::from_str("[options]\nRoot = \"/run/mine\"\n").unwrap();
    let rt = vramgate_runtime(Path::new("/r"), &host, Some(&mine));
    let ours = &rt["options"];
    assert_eq!(ours["BinaryName"].as_str(), Some("/r"));
    assert_eq!(ours["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(ours["Root"].as_str(), Some("/run/mine"));
    // A zero value is what `config dump` prints for an option nobody set.
    assert!(ours.get("IoUid").is_none(), "{rt}");
    // Without a default named, runc's.
    let host: toml::Table = toml::from_str("[containerd.runtimes.runc.options]\nSystemdCgroup = true\n").unwrap();
    assert_eq!(
        vramgate_runtime(Path::new("/r"), &host, None)["options"]["SystemdCgroup"].as_bool(),
        Some(true)
    );
}

/// NVIDIA's toolkit in drop-in mode on containerd 1.x repeats the whole CRI section, with
/// vramgate's runtime in it, in conf.d/99-nvidia.toml: setup puts the runtime in every file
/// that has the section, and --remove takes it out of each, leaving the toolkit's runtime and
/// every other byte of its file.
#[test]
fn containerd_1_with_another_tools_copy_of_the_section() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let conf_d = dir.path().join("conf.d");
    std::fs::create_dir(&conf_d).unwrap();
    let main_text = format!("version = 2\nimports = [\"{}/*.toml\"]\n", conf_d.display());
    std::fs::write(&main, &main_text).unwrap();
    let nvidia = format!(
        "version = 2\n\n[{V2_CRI}.containerd]\n  default_runtime_name = \"nvidia\"\n\n[{V2_CRI}.containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[{V2_CRI}.containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\"\n  SystemdCgroup = true\n"
    );
    let toolkit = conf_d.join("99-nvidia.toml");
    std::fs::write(&toolkit, &nvidia).unwrap();
    let mut o = options(Engine::Containerd, dir.path());
    let plan = run(&o);
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    // The toolkit's file is the one containerd 1.x reads the section from: the runtime is
    // there, with the toolkit's runtime's options (it is the default); the main file, which
    // has no section, is left alone.
    assert_eq!(std::fs::read_to_string(&main).unwrap(), main_text);
    let d: toml::Table = toml::from_str(&std::fs::read_to_string(&toolkit).unwrap()).unwrap();
    let runtimes = &d["plugins"][CRI_PLUGIN]["containerd"]["runtimes"];
    assert!(runtimes.get("nvidia").is_some());
    assert_eq!(runtimes["vramgate"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    o.remove = true;
    run(&o);
    let after = std::fs::read_to_string(&toolkit).unwrap();
    assert_eq!(without_added_runc(&after, &toolkit).unwrap().unwrap_or(after), nvidia);
    // A runtime `vramgate` running something else is not vramgate's: left, with a line.
    let foreign = format!("{nvidia}\n[{V2_CRI}.containerd.runtimes.vramgate.options]\n  BinaryName = \"/opt/other\"\n");
    std::fs::write(&toolkit, &foreign).unwrap();
    let plan = run(&o);
    assert_eq!(std::fs::read_to_string(&toolkit).unwrap(), foreign);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("left the runtime vramgate") && n.contains("/opt/other")),
        "{:?}",
        plan.notes
    );
}

/// containerd 2.x's config version 3: the drop-in is version 3 and holds vramgate's
/// runtime alone, under the CRI runtime plugin, with the default runtime's options.
#[test]
fn containerd_2_gets_a_version_3_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let original = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"x\"\n";
    std::fs::write(&main, original).unwrap();
    let mut o = options(Engine::Containerd, dir.path());
    o.set_as_default = true;
    run(&o);
    let drop_in = dir.path().join("conf.d/vramgate.toml");
    let text = std::fs::read_to_string(&main).unwrap();
    assert!(
        text.starts_with(&format!(
            "version = 3\n{IMPORTS_MARK}\nimports = [{}]\n",
            toml_string(&drop_in.to_string_lossy())
        )),
        "{text}"
    );
    let d: toml::Table = toml::from_str(&std::fs::read_to_string(&drop_in).unwrap()).unwrap();
    assert_eq!(d["version"].as_integer(), Some(3));
    assert_eq!(d["plugins"].as_table().unwrap().len(), 1, "{d}");
    let containerd = &d["plugins"][CRI_RUNTIME_PLUGIN_V3]["containerd"];
    assert_eq!(containerd["default_runtime_name"].as_str(), Some("vramgate"));
    let runtimes = containerd["runtimes"].as_table().unwrap();
    assert_eq!(
        runtimes.keys().collect::<Vec<_>>(),
        ["vramgate"],
        "only vramgate's runtime: {d}"
    );
    let rt = &runtimes["vramgate"];
    assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(rt["container_annotations"][0].as_str(), Some("vramgate.dev/*"));
    assert_eq!(rt["options"]["BinaryName"].as_str(), Some("/usr/bin/vramgate-runtime"));
    assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert!(run(&o).changes.is_empty());
    // Another tool copied the section, vramgate's runtime included, into a file of its own
    // (NVIDIA's toolkit does, from `containerd config dump`): --remove takes the runtime and the
    // default's name out of that copy too, and leaves the rest of it.
    let copy = dir.path().join("99-nvidia.toml");
    let copied = format!(
        "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n  default_runtime_name = \"vramgate\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.vramgate]\n  runtime_type = \"io.containerd.runc.v2\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.vramgate.options]\n  BinaryName = \"/usr/bin/vramgate-runtime\"\n"
    );
    std::fs::write(&copy, &copied).unwrap();
    let with_copy = std::fs::read_to_string(&main).unwrap().replacen(
        "imports = [",
        &format!("imports = [\"{}\", ", copy.display()),
        1,
    );
    std::fs::write(&main, &with_copy).unwrap();
    o.remove = true;
    run(&o);
    assert_eq!(
        std::fs::read_to_string(&copy).unwrap(),
        "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    );
    assert!(!drop_in.exists());
    assert_eq!(
        std::fs::read_to_string(&main).unwrap(),
        original.replacen(
            "version = 3\n",
            &format!("version = 3\n{IMPORTS_MARK}\nimports = [\"{}\"]\n", copy.display()),
            1
        )
    );
    // Version 1 (no key in a file that has content) is still refused, with the way out.
    std::fs::write(&main, "[plugins.cri]\n").unwrap();
    o.remove = false;
    let err = plan(&o).unwrap_err().to_string();
    assert!(
        err.contains("version 1") && err.contains("containerd config migrate"),
        "{err}"
    );
}

/// containerd's config as containerd reads it: imports followed breadth first, relative to
/// the importing file, globs sorted, `..` cleaned, a file loaded once, a missing one noted;
/// containerd 2.x merges key by key, 1.x takes the last file's whole section. From a node
/// set-up, an absolute import is the host's file, never the container's.
#[test]
fn the_config_chain_is_read_as_containerd_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let conf_d = dir.path().join("conf.d");
    std::fs::create_dir(&conf_d).unwrap();
    let drop_in = conf_d.join("vramgate.toml");
    let runc = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]";
    let text = format!(
        "version = 3\nimports = [\"conf.d/*.toml\", \"/nonexistent.toml\", \"conf.d/10-site.toml\"]\n{runc}\nRoot = \"/run/main\"\nIoUid = 7\n"
    );
    std::fs::write(&main, &text).unwrap();
    std::fs::write(
        conf_d.join("10-site.toml"),
        format!("version = 3\nimports = [\"../more.toml\"]\n{runc}\nSystemdCgroup = true\nBinaryName = \"/opt/runc\"\nRoot = \"/run/site\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("more.toml"),
        format!("version = 3\n{runc}\nIoUid = 9\n"),
    )
    .unwrap();
    // A drop-in of an earlier setup, which must not feed itself.
    std::fs::write(&drop_in, format!("version = 3\n{runc}\nRoot = \"/run/stale\"\n")).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let chain = ConfigChain::load(&main, &text, &table, None);
    let engine: Vec<&Path> = chain.files.iter().map(|f| f.engine.as_path()).collect();
    assert_eq!(
        engine,
        [
            main.as_path(),
            &conf_d.join("10-site.toml"),
            &drop_in,
            &dir.path().join("more.toml")
        ]
    );
    assert!(
        chain
            .notes
            .iter()
            .any(|n| n.contains("/nonexistent.toml does not exist")),
        "{:?}",
        chain.notes
    );
    let merged = chain.section(CRI_RUNTIME_PLUGIN_V3, false, Some(&drop_in));
    let options = &merged["containerd"]["runtimes"]["runc"]["options"];
    assert_eq!(options["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(options["Root"].as_str(), Some("/run/site"));
    assert_eq!(options["IoUid"].as_integer(), Some(9));
    // containerd 1.x: the last file's whole section.
    let whole = chain.section(CRI_RUNTIME_PLUGIN_V3, true, Some(&drop_in));
    let options = &whole["containerd"]["runtimes"]["runc"]["options"];
    assert_eq!(options.get("SystemdCgroup"), None);
    assert_eq!(options["IoUid"].as_integer(), Some(9));

    // Through a host root: the engine names /etc/containerd/..., read under the root; a link
    // that leads out of it is not followed.
    let host = tempfile::tempdir().unwrap();
    let etc = host.path().join("etc/containerd");
    std::fs::create_dir_all(etc.join("conf.d")).unwrap();
    std::fs::write(
        etc.join("conf.d/10-site.toml"),
        format!("version = 3\n{runc}\nSystemdCgroup = true\n"),
    )
    .unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("evil.toml"),
        format!("version = 3\n{runc}\nRoot = \"/evil\"\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), host.path().join("etc/elsewhere")).unwrap();
    let text = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\", \"/etc/elsewhere/evil.toml\"]\n";
    let view = EngineView {
        host: HostRoot::new(host.path()),
        engine_root: PathBuf::from("/"),
    };
    let chain = ConfigChain::load(
        Path::new("/etc/containerd/config.toml"),
        text,
        &toml::from_str(text).unwrap(),
        Some(&view),
    );
    assert_eq!(chain.files.len(), 2, "{:?} {:?}", chain.files, chain.notes);
    assert_eq!(chain.files[1].engine, Path::new("/etc/containerd/conf.d/10-site.toml"));
    assert_eq!(chain.files[1].local, etc.join("conf.d/10-site.toml"));
    assert!(
        chain.notes.iter().any(|n| n.contains("leads out of the host root")),
        "{:?}",
        chain.notes
    );
    let merged = chain.section(CRI_RUNTIME_PLUGIN_V3, false, None);
    assert_eq!(
        merged["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
        Some(true)
    );
    assert_eq!(clean(Path::new("/a/b/../../../c/./d")), Path::new("/c/d"));
}

#[test]
fn containerd_import_edits() {
    let p = Path::new("/etc/containerd/config.toml");
    let f = "/etc/containerd/conf.d/vramgate.toml";
    assert_eq!(
        with_import("", f, p).unwrap(),
        format!("version = 2\n{IMPORTS_MARK}\nimports = [\"{f}\"]\n")
    );
    assert_eq!(
        with_import("version = 2\nimports = [\"/a.toml\"]\n[x]\n", f, p).unwrap(),
        format!("version = 2\nimports = [\"/a.toml\", \"{f}\"]\n[x]\n")
    );
    assert_eq!(
        with_import("imports = []\n", f, p).unwrap(),
        format!("imports = [\"{f}\"]\n")
    );
    assert!(with_import("imports = [\n  \"/a.toml\",\n]\n", f, p)
        .unwrap_err()
        .to_string()
        .contains("several lines"));
    assert_eq!(
        without_import(&format!("imports = [\"/a\", \"{f}\"]\n"), f),
        "imports = [\"/a\"]\n"
    );
    // Setup then --remove gives every layout back byte for byte: an `imports = []` the file
    // had stays (containerd's own `config default` writes one), spacing inside the brackets,
    // CRLF line endings and a last line without one survive.
    for original in [
        "version = 2\nimports = []\noom_score = 0\n",
        "version = 3\r\nimports = [ ]\r\n[grpc]\r\n",
        "imports = [ \"/a.toml\" ]\n[x]",
        "imports = [\"/a.toml\",\"/b.toml\"]\n",
        "# c\nversion = 2\n\n[x]\ny = 1\n",
        "version = 2",
        "[x]\r\ny = 1\r\n",
    ] {
        let added = with_import(original, f, p).unwrap();
        assert!(imports_of(&added, p).unwrap().iter().any(|i| i == f), "{added:?}");
        assert_eq!(without_import(&added, f), original, "{added:?}");
    }
    // Without its mark, an emptied line is the admin's and stays.
    assert_eq!(without_import(&format!("imports = [\"{f}\"]\n"), f), "imports = []\n");
    assert!(import_covers("/etc/containerd/conf.d/*.toml", Path::new(f)));
    assert!(!import_covers("/etc/containerd/other/*.toml", Path::new(f)));
}

#[test]
fn hooks_d_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(Engine::Podman, dir.path());
    o.hook_path = PathBuf::from("/opt/vg/vramgate-hook");
    o.hook_timeout_secs = 960;
    run(&o);
    let pre: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("hooks.d").join(PRESTART_FILE)).unwrap()).unwrap();
    assert_eq!(pre["hook"]["path"], "/opt/vg/vramgate-hook");
    assert_eq!(pre["hook"]["timeout"], 960);
    assert_eq!(pre["hook"]["args"][3], "960");
    assert_eq!(pre["stages"], json!(["prestart"]));
    // Every container: a request can come from the env as well as from the annotation.
    assert_eq!(pre["when"], json!({"always": true}));
    let post: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("hooks.d").join(POSTSTOP_FILE)).unwrap()).unwrap();
    assert_eq!(post["stages"], json!(["poststop"]));
    assert!(run(&o).changes.is_empty());
    o.remove = true;
    run(&o);
    assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 0);
}

#[test]
fn crio_gets_the_runtime_handler_drop_in_and_remove_takes_only_that_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(Engine::Crio, dir.path());
    o.runtime_path = PathBuf::from("/opt/vg/vramgate-runtime");
    let conf_d = dir.path().join("crio.conf.d");
    std::fs::create_dir_all(&conf_d).unwrap();
    std::fs::write(
        conf_d.join("20-admin.conf"),
        "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\n",
    )
    .unwrap();
    let drop_in = conf_d.join("10-vramgate.conf");
    run(&o);
    let doc: toml::Table = std::fs::read_to_string(&drop_in).unwrap().parse().unwrap();
    let handler = &doc["crio"]["runtime"]["runtimes"]["vramgate"];
    assert_eq!(handler["runtime_path"].as_str(), Some("/opt/vg/vramgate-runtime"));
    assert_eq!(handler["runtime_type"].as_str(), Some("oci"));
    assert_eq!(handler["runtime_root"].as_str(), Some("/run/runc"));
    assert_eq!(handler.as_table().unwrap().len(), 3, "{handler}");
    assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 2);
    assert!(run(&o).changes.is_empty());

    o.remove = true;
    run(&o);
    assert!(!drop_in.exists());
    let left: Vec<_> = std::fs::read_dir(&conf_d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["20-admin.conf"], "an admin's drop-in goes, or a backup is left");
    assert_eq!(std::fs::read_dir(dir.path().join("hooks.d")).unwrap().count(), 0);

    // A drop-in changed since setup wrote it is the admin's: --remove leaves it, saying so.
    o.remove = false;
    run(&o);
    let edited = format!(
        "{}monitor_env = [\"A=1\"]\n",
        std::fs::read_to_string(&drop_in).unwrap()
    );
    std::fs::write(&drop_in, &edited).unwrap();
    o.remove = true;
    let plan = run(&o);
    assert_eq!(std::fs::read_to_string(&drop_in).unwrap(), edited);
    assert!(plan.notes.iter().any(|n| n.contains("left alone")), "{:?}", plan.notes);
    // Setup again over it: replaced, and nothing but the drop-ins in CRI-O's directory.
    o.remove = false;
    let plan = run(&o);
    assert!(
        plan.notes.iter().any(|n| n.contains("now replaced")),
        "{:?}",
        plan.notes
    );
    let mut left: Vec<_> = std::fs::read_dir(&conf_d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["10-vramgate.conf", "20-admin.conf"]);
}
