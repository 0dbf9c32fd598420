//! containerd as the tests and the node run it: private root, state, socket and log; the host
//! config each version reads; the images an air-gapped node imports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::json;
use vramgate_testbed::Testbed;

use crate::process::{daemon, path_with_sbin, run_ok};

/// A private containerd (its own root, state, socket and opt dir under `dir`, no CRI plugin,
/// which would set up CNI) whose shims, and so the wrapper and the hooks, see
/// `VRAMGATE_CONFIG` = `config`, found on `path` (the PATH it runs with; its shims are looked
/// up there too). Returns the process, its socket and its state dir.
pub fn start_containerd(dir: &Path, config: &Path, path: &str) -> (Child, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let ctd_config = dir.join("containerd.toml");
    std::fs::write(
        &ctd_config,
        format!(
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n{}",
            containerd_opt_section(dir)
        ),
    )
    .unwrap();
    spawn_containerd_on(dir, &ctd_config, config, path)
}

/// containerd's opt plugin section, keeping its directory under `dir` (it is /opt/containerd
/// otherwise).
pub fn containerd_opt_section(dir: &Path) -> String {
    format!(
        "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {:?}\n",
        dir.join("opt").display().to_string()
    )
}

/// containerd with the config file `ctd_config` and its root, state, socket and log under
/// `dir`, as [`start_containerd`] describes.
pub fn spawn_containerd(dir: &Path, ctd_config: &Path, config: &Path) -> (Child, PathBuf, PathBuf) {
    spawn_containerd_on(dir, ctd_config, config, &path_with_sbin())
}

/// [`spawn_containerd`] with the containerd (and shims) found on `path`.
pub fn spawn_containerd_on(dir: &Path, ctd_config: &Path, config: &Path, path: &str) -> (Child, PathBuf, PathBuf) {
    let socket = dir.join("containerd.sock");
    let state = dir.join("ctd-state");
    let child = daemon("containerd")
        .arg("--config")
        .arg(ctd_config)
        .arg("--root")
        .arg(dir.join("ctd-root"))
        .arg("--state")
        .arg(&state)
        .arg("--address")
        .arg(&socket)
        .env("VRAMGATE_CONFIG", config)
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("containerd.log")).unwrap())
        .spawn()
        .expect("starting containerd");
    (child, socket, state)
}

/// The busybox rootfs as a tar, for `docker import` / `podman import`.
pub fn rootfs_tar(tb: &Testbed) -> PathBuf {
    let tar = tb.dir.join("rootfs.tar");
    let out = Command::new("tar")
        .arg("-C")
        .arg(&tb.rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    tar
}

pub const PAUSE_IMAGE: &str = "vramgate.test/pause:1";

pub const APP_IMAGE: &str = "vramgate.test/busybox:1";

/// The runtime handler `vramgate setup containerd` configures (a RuntimeClass's `handler`).
pub const HANDLER: &str = "vramgate";

/// Which containerd a CRI host runs: Debian 12's 1.6 (config version 2); 1.7 from Debian
/// trixie (config version 2), unpacked with Docker 26 by `scripts/fetch-docker-next`; or 2.1
/// from Debian sid (config version 3, what current Kubernetes distributions ship), unpacked by
/// `scripts/fetch-containerd-2`. None is installed over the host's; all run the host's runc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Containerd {
    Debian,
    Seven,
    Two,
}

impl Containerd {
    /// The PATH containerd runs with: sid's containerd, shim and ctr first for 2.1.
    pub fn path(self) -> String {
        match self {
            Containerd::Debian => path_with_sbin(),
            Containerd::Seven => {
                let dir = std::env::var("VRAMGATE_DOCKER_NEXT")
                    .unwrap_or_else(|_| "/var/cache/vramgate-tests/docker-trixie".into());
                let bin = Path::new(&dir).join("usr/bin");
                assert!(
                    bin.join("containerd").is_file() && bin.join("containerd-shim-runc-v2").is_file(),
                    "containerd 1.7 is not unpacked in {dir}: run scripts/install-deps (or scripts/fetch-docker-next)"
                );
                format!("{}:{}", bin.display(), path_with_sbin())
            }
            Containerd::Two => {
                let dir = std::env::var("VRAMGATE_CONTAINERD_2")
                    .unwrap_or_else(|_| "/var/cache/vramgate-tests/containerd-sid".into());
                let bin = Path::new(&dir).join("usr/bin");
                assert!(
                    bin.join("containerd").is_file(),
                    "containerd 2.1 is not unpacked in {dir}: run scripts/install-deps (or scripts/fetch-containerd-2)"
                );
                format!("{}:{}", bin.display(), path_with_sbin())
            }
        }
    }

    /// The host's own containerd config: the CRI plugin with the settings this VM needs,
    /// before `vramgate setup containerd` adds its import.
    /// The containerd binary itself.
    pub fn binary(self) -> PathBuf {
        let path = self.path();
        Path::new(path.split(':').next().unwrap()).join("containerd")
    }

    pub fn host_config(self, dir: &Path) -> String {
        let opt = containerd_opt_section(dir);
        let cni_bin = dir.join("cni/bin").display().to_string();
        let cni_conf = dir.join("cni/net.d").display().to_string();
        let cdi = dir.join("cdi").display().to_string();
        match self {
            // 1.7 reads version 2 as 1.6 does; its CDI and NRI stay off, as they are by default.
            Containerd::Debian | Containerd::Seven => format!(
                // No CDI in 1.6.
                r#"version = 2
{opt}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM lacks CAP_SYS_RESOURCE: containerd may only raise a container's oom_score_adj.
  restrict_oom_score_adj = true
  # kubectl exec/logs streaming: loopback only, on a port the kernel picks.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    # Empty: the pods use the host's network, and the host's CNI config stays unread.
    bin_dir = {cni_bin:?}
    conf_dir = {cni_conf:?}
"#
            ),
            // The same settings where version 3 keeps them. NRI (on by default in 2.x) would
            // listen on one host-wide socket for every test's containerd.
            Containerd::Two => format!(
                r#"version = 3
disabled_plugins = ["io.containerd.nri.v1.nri"]
{opt}
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  # CDI specs (a DRA driver's) come from the test's own directory, not the host's.
  enable_cdi = true
  cdi_spec_dirs = [{cdi:?}]
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{cni_bin:?}]
  conf_dir = {cni_conf:?}
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
            ),
        }
    }
}

/// containerd's name for this machine's architecture, for the image config.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A docker-archive tar with two single-layer images on the testbed's busybox rootfs: the
/// sandbox image (a `sleep` standing in for `pause`) and the app image.
pub fn build_images(tb: &Testbed) -> PathBuf {
    let layer = rootfs_tar(tb);
    let sum = run_ok(Command::new("sha256sum").arg(&layer));
    let diff_id = format!("sha256:{}", sum.split_whitespace().next().unwrap());
    let archive = tb.dir.join("images");
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::rename(&layer, archive.join("layer.tar")).unwrap();
    let image = |file: &str, entrypoint: &[&str]| {
        let config = json!({
            "architecture": go_arch(),
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        });
        std::fs::write(archive.join(file), config.to_string()).unwrap();
    };
    image("pause.json", &["/bin/sleep", "86400"]);
    image("app.json", &[]);
    let manifest = json!([
        {"Config": "pause.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]},
        {"Config": "app.json", "RepoTags": [APP_IMAGE], "Layers": ["layer.tar"]},
    ]);
    std::fs::write(archive.join("manifest.json"), manifest.to_string()).unwrap();
    let tar = tb.dir.join("images.tar");
    run_ok(Command::new("tar").arg("-C").arg(&archive).arg("-cf").arg(&tar).args([
        "manifest.json",
        "pause.json",
        "app.json",
        "layer.tar",
    ]));
    tar
}

/// `ctr` against the containerd at `address`, in the CRI plugin's `k8s.io` namespace, found on
/// `path` (the PATH that containerd runs with).
pub fn ctr(path: &str, address: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("ctr");
    cmd.env("PATH", path)
        .arg("--address")
        .arg(address)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .stdin(Stdio::null());
    cmd
}
