//! The registration client (tools/kube/registration-client, built by
//! scripts/fetch-registration-client): GetInfo on a kubelet plugin's registration socket,
//! dialed exactly as kubelet 1.36.3's plugin watcher dials it, with the grpc-go kubelet links.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The client, checked: present, and built from the tools/kube/registration-client/main.go,
/// go.mod and go.sum of this checkout.
pub fn binary() -> PathBuf {
    let dir = std::env::var_os("VRAMGATE_REGISTRATION_CLIENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vramgate-tests/registration-client"));
    let binary = dir.join("bin/registration-client");
    assert!(
        binary.exists(),
        "{}: no registration client; run scripts/fetch-registration-client (scripts/install-deps runs it)",
        binary.display()
    );
    let version = Command::new(&binary).arg("version").output().expect("the client runs");
    let version = String::from_utf8_lossy(&version.stdout);
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/kube");
    for (file, name) in [
        ("registration-client/main.go", "main.go"),
        ("go.mod", "go.mod"),
        ("go.sum", "go.sum"),
    ] {
        let source = module.join(file);
        let sum = Command::new("sha256sum").arg(&source).output().expect("sha256sum runs");
        let sum = String::from_utf8_lossy(&sum.stdout);
        let sum = sum.split_whitespace().next().unwrap_or_default();
        assert!(
            version.lines().any(|l| l == format!("source {sum} {name}")),
            "{}: built from another {} (it says {version:?}); run scripts/fetch-registration-client",
            binary.display(),
            source.display()
        );
    }
    binary
}

/// GetInfo on `socket` as kubelet 1.36.3 calls it.
pub fn get_info(socket: &Path) -> Output {
    Command::new(binary()).arg(socket).output().expect("the client runs")
}
