//! The MPS limit (`[enforce] limit = "mps"`): under an MPS control daemon, each client's
//! allocations are capped by `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (NVIDIA's MPS documentation,
//! "Appendix: Environment Variables"), a comma-separated list of `device=limit` pairs such as
//! `0=4096M`.
//!
//! A container becomes an MPS client when it reaches the daemon: it needs the pipe directory
//! (and the same `CUDA_MPS_PIPE_DIRECTORY`) and the daemon's /dev/shm, which MPS clients and
//! the server share memory through; NVIDIA's Kubernetes device plugin mounts the same two for
//! its MPS sharing. The log directory is mounted read-only: only the daemon and server write
//! there.
//!
//! What it does not do: the limit is read by the CUDA library inside the container, from the
//! process's own environment. A program that changes its environment before initialising
//! CUDA, or a container that runs without MPS, is not held. It stops accidents (a framework
//! growing past its share), not a hostile container; that needs the driver limit.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use serde_json::json;

use super::{PlacedShare, SpecEdits, Tier, MIB};
use crate::config::{EnforceConfig, MpsDeviceKey};

pub const PINNED_LIMIT_VAR: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// CUDA numbers devices fastest first unless told `PCI_BUS_ID`: with ordinal keys and more than
/// one GPU, the numbering the limit uses (host order, which is PCI order) must be CUDA's too.
pub const DEVICE_ORDER_VAR: &str = "CUDA_DEVICE_ORDER";
pub const PIPE_DIRECTORY_VAR: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const LOG_DIRECTORY_VAR: &str = "CUDA_MPS_LOG_DIRECTORY";
/// The control daemon's socket in the pipe directory.
pub const CONTROL_SOCKET: &str = "control";
/// The file in the pipe directory where the control daemon writes its pid.
pub const CONTROL_PID_FILE: &str = "nvidia-cuda-mps-control.pid";
pub const CONTROL_BINARY: &str = "nvidia-cuda-mps-control";
/// Where a container's MPS clients expect the shared memory.
pub const SHM_DESTINATION: &str = "/dev/shm";

/// Whether an MPS control daemon serves `pipe_directory`: its control socket is there, and
/// the process that wrote its pid file (or, without one, some process) is
/// `nvidia-cuda-mps-control`. A socket alone is not enough: a daemon that died leaves it
/// behind, and a client would then run without MPS, and without a limit. `proc_root` is
/// `/proc` on the host.
pub fn mps_control_running(pipe_directory: &Path, proc_root: &Path) -> bool {
    let socket = std::fs::symlink_metadata(pipe_directory.join(CONTROL_SOCKET));
    if !socket.is_ok_and(|m| m.file_type().is_socket()) {
        return false;
    }
    match std::fs::read_to_string(pipe_directory.join(CONTROL_PID_FILE)) {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(pid) => is_control_daemon(proc_root, pid),
            Err(_) => false,
        },
        // Older daemons may write no pid file: look through the processes (once, bounded by
        // their number).
        Err(_) => std::fs::read_dir(proc_root).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .any(|pid| is_control_daemon(proc_root, pid))
        }),
    }
}

/// Whether `pid`'s argv[0] is the MPS control daemon. The command line, not `comm`: `comm`
/// is cut at 15 characters, where the daemon and its servers (`nvidia-cuda-mps-server`)
/// look the same.
fn is_control_daemon(proc_root: &Path, pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(proc_root.join(pid.to_string()).join("cmdline")) else {
        return false;
    };
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    Path::new(OsStr::from_bytes(argv0)).file_name() == Some(OsStr::new(CONTROL_BINARY))
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for the placed GPUs: each limit (the reservation where
/// no larger limit was asked) in whole MiB, rounded down (whether MPS reads `M` as 2^20 or
/// 10^6 bytes, the limit stays within what was allowed). With [`MpsDeviceKey::Ordinal`], a GPU's key is its rank among the placed
/// GPUs in host order: the container sees exactly those GPUs, renumbered from 0, and CUDA
/// enumerates identical GPUs in PCI order. A reservation under 1 MiB gets no entry (`0M`
/// could read as "no limit").
pub fn pinned_limit(placed: &[PlacedShare], key: MpsDeviceKey) -> String {
    let mut order: Vec<&PlacedShare> = placed.iter().collect();
    order.sort_by_key(|s| (s.index, s.mig_index));
    order
        .iter()
        .enumerate()
        .filter(|(_, s)| s.hard() >= MIB)
        .map(|(ordinal, s)| {
            let device = match key {
                MpsDeviceKey::Ordinal => ordinal.to_string(),
                MpsDeviceKey::Uuid => s.uuid.clone(),
            };
            format!("{device}={}M", s.hard() / MIB)
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn bind(source: &Path, destination: &Path, access: &str) -> serde_json::Value {
    json!({
        "destination": destination.to_string_lossy(),
        "type": "bind",
        "source": source.to_string_lossy(),
        "options": ["rbind", access, "nosuid", "nodev"],
    })
}

/// The MPS env and mounts, or a note when no daemon runs (the container then starts without a
/// limit: binding a pipe directory that may not exist would fail its start instead). Returns
/// the tier it gives.
pub fn edits(config: &EnforceConfig, placed: &[PlacedShare], mps_running: bool, edits: &mut SpecEdits) -> Option<Tier> {
    if !mps_running {
        edits.notes.push(format!(
            "vramgate: no MPS memory limit for this container: no MPS control daemon serves {} (start one with `nvidia-cuda-mps-control -d`)",
            config.mps_pipe_directory.display()
        ));
        return None;
    }
    let limit = pinned_limit(placed, config.mps_device_key);
    if limit.is_empty() {
        return None;
    }
    edits.env.push((PINNED_LIMIT_VAR.to_string(), limit));
    if config.mps_device_key == MpsDeviceKey::Ordinal && placed.len() > 1 {
        edits.env.push((DEVICE_ORDER_VAR.to_string(), "PCI_BUS_ID".to_string()));
    }
    edits.env.push((
        PIPE_DIRECTORY_VAR.to_string(),
        config.mps_pipe_directory.to_string_lossy().into_owned(),
    ));
    edits.env.push((
        LOG_DIRECTORY_VAR.to_string(),
        config.mps_log_directory.to_string_lossy().into_owned(),
    ));
    edits
        .mounts
        .push(bind(&config.mps_pipe_directory, &config.mps_pipe_directory, "rw"));
    edits
        .mounts
        .push(bind(&config.mps_log_directory, &config.mps_log_directory, "ro"));
    edits
        .mounts
        .push(bind(&config.mps_shm_directory, Path::new(SHM_DESTINATION), "rw"));
    Some(Tier::MpsLimit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::{spec_edits, LimitMechanism};
    use std::path::PathBuf;

    fn share(index: u32, bytes: u64) -> PlacedShare {
        PlacedShare {
            uuid: format!("GPU-{index}aaa"),
            index,
            mig_index: None,
            bytes,
            limit: bytes,
            total: 80 << 30,
        }
    }

    fn mps() -> EnforceConfig {
        EnforceConfig {
            limit: LimitMechanism::Mps,
            mps_device_key: MpsDeviceKey::Ordinal,
            ..EnforceConfig::default()
        }
    }

    #[test]
    fn the_default_key_is_the_uuid_and_ordinals_come_with_pci_order() {
        assert_eq!(EnforceConfig::default().mps_device_key, MpsDeviceKey::Uuid);
        let uuid = EnforceConfig {
            limit: LimitMechanism::Mps,
            ..EnforceConfig::default()
        };
        let two = [share(3, 6 << 30), share(1, 4 << 30)];
        let get = |edits: &SpecEdits, k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let edits = spec_edits(&uuid, &[], &two, true, false);
        assert_eq!(
            get(&edits, PINNED_LIMIT_VAR).as_deref(),
            Some("GPU-1aaa=4096M,GPU-3aaa=6144M")
        );
        assert_eq!(
            get(&edits, DEVICE_ORDER_VAR),
            None,
            "a UUID names the GPU whatever the order"
        );
        // Ordinals with two GPUs: CUDA must count them as the limit does; the container's own
        // order is replaced (vramgate's hard-limit values win).
        let existing = ["CUDA_DEVICE_ORDER=FASTEST_FIRST".to_string()];
        let edits = spec_edits(&mps(), &existing, &two, true, false);
        assert_eq!(get(&edits, PINNED_LIMIT_VAR).as_deref(), Some("0=4096M,1=6144M"));
        assert_eq!(get(&edits, DEVICE_ORDER_VAR).as_deref(), Some("PCI_BUS_ID"));
        // One GPU is ordinal 0 in any order.
        let edits = spec_edits(&mps(), &[], &two[..1], true, false);
        assert_eq!(get(&edits, DEVICE_ORDER_VAR), None);
    }

    /// MPS holds a client to one number: the limit, where one above the request was asked.
    #[test]
    fn pinned_limit_is_the_limit() {
        let mut placed = share(0, 2 << 30);
        placed.limit = 6 << 30;
        assert_eq!(pinned_limit(&[placed], MpsDeviceKey::Ordinal), "0=6144M");
    }

    #[test]
    fn pinned_limit_by_ordinal_in_host_order_and_by_uuid() {
        let placed = [share(3, 6 << 30), share(1, (4 << 30) + 123)];
        assert_eq!(pinned_limit(&placed, MpsDeviceKey::Ordinal), "0=4096M,1=6144M");
        assert_eq!(
            pinned_limit(&placed, MpsDeviceKey::Uuid),
            "GPU-1aaa=4096M,GPU-3aaa=6144M"
        );
        assert_eq!(
            pinned_limit(&[share(0, MIB - 1)], MpsDeviceKey::Ordinal),
            "",
            "under 1 MiB"
        );
    }

    #[test]
    fn mps_edits_when_the_daemon_runs_and_vramgates_values_win() {
        let existing = [
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G".to_string(),
            "CUDA_MPS_PIPE_DIRECTORY=/elsewhere".to_string(),
        ];
        let edits = spec_edits(&mps(), &existing, &[share(0, 4 << 30)], true, false);
        assert_eq!(edits.tier, Tier::MpsLimit);
        let get = |k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get(PINNED_LIMIT_VAR), Some("0=4096M"));
        assert_eq!(get(PIPE_DIRECTORY_VAR), Some("/tmp/nvidia-mps"));
        assert_eq!(get(LOG_DIRECTORY_VAR), Some("/tmp/nvidia-log"));
        assert_eq!(get("TF_FORCE_GPU_ALLOW_GROWTH"), Some("true"), "guardrails too");
        let destinations: Vec<&str> = edits
            .mounts
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(destinations, ["/tmp/nvidia-mps", "/tmp/nvidia-log", "/dev/shm"]);
        assert_eq!(edits.mounts[1]["options"][1], "ro");
        assert_eq!(edits.mounts[2]["source"], "/dev/shm");
    }

    #[test]
    fn no_daemon_no_mps_edits_and_a_note() {
        let edits = spec_edits(&mps(), &[], &[share(0, 4 << 30)], false, false);
        assert_eq!(edits.tier, Tier::Guardrails);
        assert!(edits.mounts.is_empty());
        assert!(edits.env.iter().all(|(k, _)| !k.starts_with("CUDA_MPS")));
        assert!(edits.notes[0].contains("/tmp/nvidia-mps"), "{:?}", edits.notes);
    }

    /// A scratch pipe directory with a real socket, and a scratch /proc.
    fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("nvidia-mps");
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(&pipe).unwrap();
        std::fs::create_dir_all(&proc_root).unwrap();
        (dir, pipe, proc_root)
    }

    fn fake_process(proc_root: &Path, pid: u32, argv: &[&str]) {
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmdline = argv.join("\0");
        cmdline.push('\0');
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
    }

    #[test]
    fn daemon_detection_needs_the_socket_and_the_daemon() {
        let (_dir, pipe, proc_root) = scratch();
        assert!(!mps_control_running(&pipe, &proc_root), "nothing there");
        let _socket = std::os::unix::net::UnixListener::bind(pipe.join(CONTROL_SOCKET)).unwrap();
        assert!(
            !mps_control_running(&pipe, &proc_root),
            "a socket left by a dead daemon"
        );
        // The server's comm looks the same as the daemon's; its argv[0] does not.
        fake_process(&proc_root, 40, &["/usr/bin/nvidia-cuda-mps-server"]);
        assert!(!mps_control_running(&pipe, &proc_root));
        fake_process(&proc_root, 41, &["/usr/local/nvidia/bin/nvidia-cuda-mps-control", "-d"]);
        assert!(mps_control_running(&pipe, &proc_root), "found by scanning");
        std::fs::write(pipe.join(CONTROL_PID_FILE), "40\n").unwrap();
        assert!(
            !mps_control_running(&pipe, &proc_root),
            "the pid file names another process"
        );
        std::fs::write(pipe.join(CONTROL_PID_FILE), "41\n").unwrap();
        assert!(mps_control_running(&pipe, &proc_root));
        std::fs::write(pipe.join(CONTROL_PID_FILE), "garbage").unwrap();
        assert!(!mps_control_running(&pipe, &proc_root));
    }

    #[test]
    fn a_regular_file_is_not_the_control_socket() {
        let (_dir, pipe, proc_root) = scratch();
        std::fs::write(pipe.join(CONTROL_SOCKET), "").unwrap();
        fake_process(&proc_root, 41, &["nvidia-cuda-mps-control"]);
        assert!(!mps_control_running(&pipe, &proc_root));
    }
}
