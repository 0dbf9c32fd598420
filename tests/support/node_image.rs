//! The node image as a node gets it: `scripts/package --no-build` packs the binaries this
//! `cargo test --release` built, `scripts/build-image` makes the OCI image of the .deb, and
//! `ctr images import` puts it into a containerd's `k8s.io` namespace under the name the
//! chart runs (registry.example/vramgate:<version>), never pulled. For tests/it/node_image.rs
//! (a pod through CRI) and tests/kube_helm.rs (the chart's DaemonSets on the real cluster).
//!
//! `crate::support::node_image`; it uses `crate::support` and `crate::support::cri`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::cri::Cri;
use crate::support::*;

/// The image name the chart and k8s/*.yaml run, under which the tests import the built image.
pub const IMAGE_REPOSITORY: &str = "registry.example/vramgate";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The image's tag: the package's version, which the chart's appVersion is.
pub fn image_tag() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// `registry.example/vramgate:<version>`.
pub fn image() -> String {
    format!("{IMAGE_REPOSITORY}:{}", image_tag())
}

/// Packs this build into a .deb and the .deb into the image; returns the image's OCI tar.
/// Fails unless the .deb's binaries are the ones this test run built (by build id).
/// scripts/package rewrites target/debian and target/package, as tests/it/packaging.rs's tests
/// do: the host-wide flock "packages" keeps the binaries apart until the tar is copied to
/// `dir` (another binary's package run would rewrite target/image).
pub fn build(dir: &Path) -> PathBuf {
    let _turn = host_lock("packages");
    run_ok(
        Command::new(root().join("scripts/package"))
            .arg("--no-build")
            .current_dir(root()),
    );
    let version = env!("CARGO_PKG_VERSION");
    let deb = std::fs::read_dir(root().join("target/debian"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("vramgate_{version}-")) && name.ends_with(".deb")
        })
        .max_by_key(|p| p.metadata().unwrap().modified().unwrap())
        .expect("scripts/package built a .deb");
    let unpacked = tempfile::tempdir().unwrap();
    run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(unpacked.path()));
    let binaries: Vec<String> = [
        "vramgate",
        "vramgate-hook",
        "vramgate-runtime",
        "vramgate-device-plugin",
        "vramgate-dra",
    ]
    .map(String::from)
    .into();
    assert_built_here(&unpacked.path().join("usr/bin"), &binaries);
    let built = run_ok(
        Command::new(root().join("scripts/build-image"))
            .arg(&deb)
            .current_dir(root()),
    );
    let tar = root().join(format!("target/image/vramgate-{version}.oci.tar"));
    assert!(tar.is_file(), "{built}");
    std::fs::create_dir_all(dir).unwrap();
    let copy = dir.join(tar.file_name().unwrap());
    std::fs::copy(&tar, &copy).unwrap();
    copy
}

/// Imports the image's tar into `cri`'s containerd (namespace k8s.io, where the CRI plugin
/// and kubelet find it) as [`image`]; returns that name.
pub fn import(cri: &Cri, tar: &Path) -> String {
    run_ok(cri.ctr(&["images", "import", "--base-name", IMAGE_REPOSITORY]).arg(tar));
    let name = image();
    let listed = run_ok(&mut cri.ctr(&["images", "list", "-q"]));
    assert!(
        listed.lines().any(|l| l == name),
        "{name} is not among containerd's images after the import: {listed}"
    );
    name
}
