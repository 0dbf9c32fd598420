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
    crate::support::dra::allocator::assert_built_from(
        &binary,
        "registration-client/main.go",
        "scripts/fetch-registration-client",
    );
    binary
}

/// GetInfo on `socket` as kubelet 1.36.3 calls it.
pub fn get_info(socket: &Path) -> Output {
    Command::new(binary()).arg(socket).output().expect("the client runs")
}
