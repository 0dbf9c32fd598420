//! Host paths the engines make at fixed places whatever their flags, noted before and removed
//! after by the last user, and host-wide locks for what only one test binary may do at a time.

use std::path::PathBuf;
use std::sync::Mutex;

/// Host paths an engine creates at fixed places whatever its flags (`/run/containerd/s` for
/// shim sockets, `/run/docker/plugins`, dockerd 20.10's `/etc/docker/key.json`, podman's
/// blob-info cache): those that no test's engine had made before are removed once the last
/// test that uses any of them is done, deepest first (files, then empty directories).
///
/// Test binaries run side by side (two `cargo test` runs, or the tests of one binary), and one
/// test's engine may be using a directory another's made: each test holds a shared flock on
/// [`HOST_DIRS_LOCK`] while its engine runs, and removes only when it can take the lock
/// exclusively, that is when no other test holds it. Noting never waits for the exclusive
/// lock: a test that holds a shared one (its engine running) and notes again, or one whose
/// neighbour in the same binary holds one for the binary's whole run, would wait forever.
/// What tests made is kept in [`HOST_DIRS_MADE`] (a path there existed before no test),
/// edited under [`HOST_DIRS_MADE_LOCK`], so a test that finds a directory another test made
/// does not take it for the host's own.
pub struct HostDirs {
    _shared: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// The lock every [`HostDirs`] holder shares; /run/lock is the host's, and so is the lock.
pub const HOST_DIRS_LOCK: &str = "/run/lock/vramgate-tests-host-dirs.lock";

/// The host paths tests made, one a line, changed only under [`HOST_DIRS_LOCK`] held exclusively.
pub const HOST_DIRS_MADE: &str = "/run/lock/vramgate-tests-host-dirs.made";

/// Held exclusively, briefly, while [`HOST_DIRS_MADE`] is read and rewritten.
pub const HOST_DIRS_MADE_LOCK: &str = "/run/lock/vramgate-tests-host-dirs.made.lock";

fn host_dirs_lock(arg: nix::fcntl::FlockArg) -> Result<nix::fcntl::Flock<std::fs::File>, nix::errno::Errno> {
    flock_at(HOST_DIRS_LOCK, arg)
}

/// An flock on `path` (made if missing), taken as `arg` says.
pub fn flock_at(path: &str, arg: nix::fcntl::FlockArg) -> Result<nix::fcntl::Flock<std::fs::File>, nix::errno::Errno> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    nix::fcntl::Flock::lock(file, arg).map_err(|(_, errno)| errno)
}

fn host_dirs_made() -> Vec<PathBuf> {
    std::fs::read_to_string(HOST_DIRS_MADE)
        .unwrap_or_default()
        .lines()
        .map(PathBuf::from)
        .collect()
}

impl HostDirs {
    pub fn note(paths: &[&str]) -> HostDirs {
        // Shared first: from here no cleanup can run (it needs the lock exclusively), so what
        // is noted below is never removed from under this test.
        let shared = host_dirs_lock(nix::fcntl::FlockArg::LockShared).unwrap();
        let _editing = flock_at(HOST_DIRS_MADE_LOCK, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let mut made = host_dirs_made();
        for path in paths.iter().map(PathBuf::from) {
            if !path.exists() && !made.contains(&path) {
                made.push(path);
            }
        }
        let listed: String = made.iter().map(|p| format!("{}\n", p.display())).collect();
        std::fs::write(HOST_DIRS_MADE, listed).unwrap_or_else(|e| panic!("{HOST_DIRS_MADE}: {e}"));
        HostDirs { _shared: Some(shared) }
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        drop(self._shared.take());
        // Another test still holds it: the last one out removes.
        let Ok(_exclusive) = host_dirs_lock(nix::fcntl::FlockArg::LockExclusiveNonblock) else {
            return;
        };
        let _editing = flock_at(HOST_DIRS_MADE_LOCK, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let mut made = host_dirs_made();
        made.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for path in &made {
            if path.is_dir() {
                let _ = std::fs::remove_dir(path); // only when empty
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
        let _ = std::fs::remove_file(HOST_DIRS_MADE);
    }
}

/// An exclusive flock on `/run/lock/vramgate-tests-<name>.lock`, held until dropped: for tests
/// of different binaries that must not overlap on a host-wide path none of them can make
/// private (dpkg installs into /usr and /etc; `scripts/package` writes target/debian). Blocks
/// until the holder is done; a holder that died let go with its process.
pub fn host_lock(name: &str) -> nix::fcntl::Flock<std::fs::File> {
    let path = format!("/run/lock/vramgate-tests-{name}.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {path}: {e}"))
}

/// The runc shim keeps its sockets and runc state, and ctr its fifos, under /run/containerd
/// whatever containerd's --state is. The tests of a file run side by side, so the paths
/// are noted when the first containerd starts and removed (those that were not there, when
/// empty) when the last one stops.
pub static HOST_DIRS: Mutex<(usize, Option<HostDirs>)> = Mutex::new((0, None));

pub fn host_dirs_enter() {
    let mut host = HOST_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if host.0 == 0 {
        host.1 = Some(HostDirs::note(&[
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd/fifo",
            "/run/containerd/s",
            "/run/containerd",
        ]));
    }
    host.0 += 1;
}

pub fn host_dirs_leave() {
    let mut host = HOST_DIRS.lock().unwrap_or_else(|e| e.into_inner());
    host.0 -= 1;
    if host.0 == 0 {
        drop(host.1.take());
    }
}
