//! Telling whether a recorded process is still the same process.
//!
//! A pid alone is not an identity: after a container dies its pid can be handed to an
//! unrelated process, which would keep a dead reservation alive forever. A pid plus its start
//! time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot) names one process for the
//! life of the boot.

use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
}

/// Where `/proc` is; tests of the parser use other roots.
const PROC: &str = "/proc";

struct Stat {
    state: u8,
    start_time: u64,
}

/// What reading a process's stat file found.
enum StatRead {
    Found(Stat),
    /// No such process (the file is gone, or the process vanished while it was read).
    Gone,
    /// The read failed for another reason (EMFILE, ENOMEM, EACCES, an unparsable file): the
    /// process may well be alive, and guessing "gone" would hand its memory to someone else.
    Unknown,
}

fn read_stat(pid: u32) -> StatRead {
    use std::io::{Read, Write};
    // Every transaction checks every reservation's process, so this is the hook's innermost
    // loop: no allocation, and one read into a small stack buffer (`read_to_string` spent a
    // stat and five growing reads per file; a large zeroed buffer cost more than the read).
    let mut path = [0u8; 32];
    let mut cursor = &mut path[..];
    if write!(cursor, "{PROC}/{pid}/stat").is_err() {
        return StatRead::Unknown;
    }
    let len = 32 - cursor.len();
    let Ok(path) = std::str::from_utf8(&path[..len]) else {
        return StatRead::Unknown;
    };
    let gone_or_unknown = |e: std::io::Error| match e.raw_os_error() {
        Some(code) if code == nix::libc::ENOENT || code == nix::libc::ESRCH => StatRead::Gone,
        _ => StatRead::Unknown,
    };
    // The start time (field 22) always lies in the first 512 bytes: the command name is at
    // most 16 bytes and the 19 numeric fields before it at most 21 bytes each.
    let mut buf = [0u8; 512];
    let n = match std::fs::File::open(path).and_then(|mut f| f.read(&mut buf)) {
        Ok(n) => n,
        Err(e) => return gone_or_unknown(e),
    };
    match parse_stat(&buf[..n]) {
        Some(stat) => StatRead::Found(stat),
        None => StatRead::Unknown,
    }
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last `)`.
fn parse_stat(bytes: &[u8]) -> Option<Stat> {
    let after_comm = &bytes[bytes.iter().rposition(|&b| b == b')')? + 1..];
    let mut fields = after_comm.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    // After the state (field 3) comes field 4; start time is field 22, i.e. 18 further on.
    let start_time = fields.nth(18)?;
    if start_time.is_empty() || start_time.len() > 20 || !start_time.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let start_time = start_time
        .iter()
        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?;
    Some(Stat { state, start_time })
}

/// Whether a recorded process still runs, as far as `/proc` can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Life {
    Alive,
    /// Exited (or a zombie), or its pid now belongs to another process.
    Gone,
    /// `/proc` could not be read (out of file descriptors or memory, say): keep what it holds.
    Unknown,
}

impl ProcessIdentity {
    /// The identity of a running process, `None` when it is gone (or a zombie) or unreadable.
    pub fn of(pid: u32) -> Option<ProcessIdentity> {
        match read_stat(pid) {
            StatRead::Found(stat) if is_running_state(stat.state) => Some(ProcessIdentity {
                pid,
                start_time: stat.start_time,
            }),
            _ => None,
        }
    }

    pub fn current() -> Option<ProcessIdentity> {
        ProcessIdentity::of(std::process::id())
    }

    /// Whether the process with this pid is the one that was recorded. A zombie counts as
    /// gone: it has exited and holds no GPU memory, only its exit status.
    pub fn life(&self) -> Life {
        match read_stat(self.pid) {
            StatRead::Found(s) if s.start_time == self.start_time && is_running_state(s.state) => Life::Alive,
            StatRead::Found(_) | StatRead::Gone => Life::Gone,
            StatRead::Unknown => Life::Unknown,
        }
    }

    /// True only when the process is known to run (an unreadable `/proc` is not "alive").
    pub fn is_alive(&self) -> bool {
        self.life() == Life::Alive
    }
}

/// A handle on one process (`pidfd_open`, Linux 5.3): a signal sent through it reaches that
/// process or nothing, never a later process given the same pid. What `vramgate watch` stops
/// containers through, where a pid read a moment earlier may already name someone else.
#[derive(Debug)]
pub struct PidFd(std::os::fd::OwnedFd);

impl PidFd {
    /// The process that has `pid` now; `None` when there is none (or the kernel has no pidfds).
    pub fn open(pid: u32) -> Option<PidFd> {
        use std::os::fd::FromRawFd;
        let pid = nix::libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        let fd = std::os::fd::RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
        // SAFETY: the descriptor was just returned to us and is owned by nothing else.
        Some(PidFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// SIGKILL to the process; false when it has already exited (or the signal was refused).
    pub fn kill(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(pidfd, sig, info = NULL, flags = 0): no memory is passed.
        let sent = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                nix::libc::SIGKILL,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        sent == 0
    }
}

impl ProcessIdentity {
    /// A [`PidFd`] on this process, only while its pid still is this process: the descriptor
    /// is opened first and the start time checked after, so it cannot name a process that
    /// took the pid later (a pid is not reused while a process holds it).
    pub fn pidfd(&self) -> Option<PidFd> {
        let fd = PidFd::open(self.pid)?;
        self.is_alive().then_some(fd)
    }
}

/// How the reservation service asks whether a recorded process still runs; `/proc` on a host,
/// a table in unit tests.
pub trait Liveness {
    fn life(&self, process: &ProcessIdentity) -> Life;
}

/// Liveness from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcLiveness;

impl Liveness for ProcLiveness {
    fn life(&self, process: &ProcessIdentity) -> Life {
        process.life()
    }
}

/// Liveness that does not look: every process is [`Life::Unknown`]. For readers that do not
/// show liveness (metrics): at 1,000 reservations the `/proc` reads would be most of a scrape.
/// Never for a transaction, where unknown means "keep".
#[derive(Debug, Clone, Copy, Default)]
pub struct NotChecked;

impl Liveness for NotChecked {
    fn life(&self, _: &ProcessIdentity) -> Life {
        Life::Unknown
    }
}

fn is_running_state(state: u8) -> bool {
    !matches!(state, b'Z' | b'X' | b'x')
}

/// The pid namespace of a process (`/proc/<pid>/ns/pid`), used to tell which container a GPU
/// process belongs to.
pub fn pid_namespace(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let path: PathBuf = [PROC, &pid.to_string(), "ns", "pid"].iter().collect();
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The text of `/proc/<pid>/cgroup`: the cgroups a process is in, one line per hierarchy
/// (`id:controllers:path`). `None` when it is gone or unreadable.
pub fn cgroups(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("{PROC}/{pid}/cgroup")).ok()
}

/// The cgroup namespace `/proc/<entry>/ns/cgroup` names (`entry`: a pid, or `self`), as the
/// inode that identifies it. Another process's needs ptrace read access to it (root with
/// `CAP_SYS_PTRACE`, which the readers that attribute keep: [`crate::privilege`]).
pub fn cgroup_namespace(entry: &str) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let path: PathBuf = [PROC, entry, "ns", "cgroup"].iter().collect();
    std::fs::metadata(path).map(|m| m.ino())
}

/// Whether a cgroup path, as `/proc/<pid>/cgroup` shows it, is not one from the reader's
/// cgroup namespace root down: the kernel writes each path relative to the *reader's*
/// namespace, and one outside it climbs (`/../../kubepods/...`, `/..`). Such a path names a
/// cgroup relative to a root nobody recorded, so it compares with no recorded path.
fn climbs(path: &str) -> bool {
    !path.starts_with('/') || path.split('/').any(|c| c == "..")
}

/// The first line of a `/proc/<pid>/cgroup` text whose path climbs out of the reader's cgroup
/// namespace ([`climbs`]), if any.
pub fn climbing_line(text: &str) -> Option<&str> {
    text.lines()
        .find(|l| cgroup_line(l).is_some_and(|(_, _, path)| climbs(path)))
}

/// The line of a container init's `/proc/<pid>/cgroup` text that names the container's own
/// cgroup: what a reservation records ([`crate::ledger::Reservation::cgroup`]) and attribution
/// finds the container's processes by, whatever pid namespace they are in
/// ([`cgroup_match`]).
///
/// Which hierarchy: the cgroup v2 line (`0::/path`) where the init is in a v2 cgroup other than
/// the root: every process of a unified host (the GPU hosts), and a hybrid host's where runc
/// joins its unified tree too. Else the v1 `pids` controller's line (runc joins every v1
/// controller mounted, whatever limits the spec sets, and `pids` is mounted on every hybrid or
/// v1 host systemd runs; `memory` may be switched off on the kernel's command line, and
/// `name=systemd` is joined only by runc's systemd driver). A line whose path is the root
/// (`/`: a container left in the host's cgroup) or climbs out of the reader's cgroup
/// namespace ([`climbs`]) tells nothing apart: `None`, and the container's processes are
/// attributed by pid namespace as before cgroups were recorded.
pub fn own_cgroup(text: &str) -> Option<String> {
    let usable = |path: &str| path != "/" && !climbs(path);
    let lines = || text.lines().filter_map(|l| Some((l, cgroup_line(l)?)));
    let v2 = lines().find(|(_, (id, controllers, path))| *id == "0" && controllers.is_empty() && usable(path));
    let v1 = || lines().find(|(_, (_, controllers, path))| controllers.split(',').any(|c| c == "pids") && usable(path));
    v2.or_else(v1).map(|(line, _)| line.to_string())
}

/// A `/proc/<pid>/cgroup` line's hierarchy id, controllers and path.
fn cgroup_line(line: &str) -> Option<(&str, &str, &str)> {
    let mut parts = line.splitn(3, ':');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// Whether cgroup path `path` is `ancestor` or lies below it.
fn at_or_below(path: &str, ancestor: &str) -> bool {
    path.strip_prefix(ancestor)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether the cgroup `recorded` (a line of [`own_cgroup`]) is `line`'s, or an ancestor of it,
/// in the same hierarchy.
fn nests_under(line: &str, recorded: &str) -> bool {
    let Some((id, controllers, path)) = cgroup_line(recorded) else {
        return false;
    };
    cgroup_line(line).is_some_and(|(i, c, p)| i == id && c == controllers && at_or_below(p, path))
}

/// Where a process lies against a recorded cgroup ([`cgroup_match`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMatch {
    /// In the cgroup, or in one below it.
    Inside,
    /// Elsewhere in its hierarchy (or in none of its hierarchy's cgroups).
    Outside,
    /// Its path in that hierarchy (or the recorded one) climbs out of the reader's cgroup
    /// namespace ([`climbs`]): relative to another root than the one the recorded path was
    /// read from, it can be neither matched nor ruled out.
    CannotTell,
}

/// Whether a process whose `/proc/<pid>/cgroup` text is `text` lies in the cgroup `recorded`
/// (a line of [`own_cgroup`]) or one below it: a container's process, in whatever pid
/// namespace it runs (`unshare -Urpf` inside a container leaves its cgroup as it is). A path
/// that climbs is [`CgroupMatch::CannotTell`], never a quiet "outside": read from a cgroup
/// namespace of the reader's own, every process would be outside every container.
pub fn cgroup_match(recorded: &str, text: &str) -> CgroupMatch {
    let Some((id, controllers, path)) = cgroup_line(recorded) else {
        return CgroupMatch::Outside;
    };
    if climbs(path) {
        return CgroupMatch::CannotTell;
    }
    let mut found = CgroupMatch::Outside;
    for (_, _, p) in text
        .lines()
        .filter_map(cgroup_line)
        .filter(|(i, c, _)| *i == id && *c == controllers)
    {
        if climbs(p) {
            found = CgroupMatch::CannotTell;
        } else if at_or_below(p, path) {
            return CgroupMatch::Inside;
        }
    }
    found
}

/// [`cgroup_match`] is [`CgroupMatch::Inside`].
pub fn in_cgroup(recorded: &str, text: &str) -> bool {
    cgroup_match(recorded, text) == CgroupMatch::Inside
}

/// Whether two recorded cgroups ([`own_cgroup`]) are one, or one lies below the other: their
/// containers' processes cannot all be told apart.
pub fn cgroups_nest(a: &str, b: &str) -> bool {
    nests_under(a, b) || nests_under(b, a)
}

/// The value of the field `name` (such as `CapEff`) in the text of a `/proc/<pid>/status`
/// file, trimmed.
pub fn status_field<'s>(status: &'s str, name: &str) -> Option<&'s str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let line = "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100 18446744073709551615";
        let stat = parse_stat(line.as_bytes()).unwrap();
        assert_eq!(stat.state, b'S');
        assert_eq!(stat.start_time, 987654);
        assert!(parse_stat(b"garbage").is_none());
        assert!(parse_stat(b"1 (x) S 1 2").is_none());
    }

    #[test]
    fn own_process_is_alive_and_a_changed_start_time_is_not() {
        let me = ProcessIdentity::current().unwrap();
        assert!(me.is_alive());
        assert!(!ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        }
        .is_alive());
        assert!(!ProcessIdentity {
            pid: u32::MAX - 1,
            start_time: 1
        }
        .is_alive());
    }

    #[test]
    fn a_containers_own_cgroup_is_its_v2_line_else_its_pids_line() {
        let hybrid = "9:name=systemd:/\n8:pids:/c1\n4:memory:/c1\n0::/\n";
        assert_eq!(own_cgroup(hybrid).as_deref(), Some("8:pids:/c1"));
        let unified = "0::/kubepods/pod1/c1\n";
        assert_eq!(own_cgroup(unified).as_deref(), Some("0::/kubepods/pod1/c1"));
        // The root, or a path out of the reader's cgroup namespace, tells nothing apart.
        assert_eq!(own_cgroup("8:pids:/\n0::/\n"), None);
        assert_eq!(own_cgroup("0::/../x\n"), None);
        // Below it (a nested pid namespace keeps it; a child cgroup lies under it); a sibling
        // whose name starts the same does not.
        assert!(in_cgroup("8:pids:/c1", "8:pids:/c1\n0::/\n"));
        assert!(in_cgroup("0::/pod/c1", "0::/pod/c1/inner\n"));
        assert!(!in_cgroup("0::/pod/c1", "0::/pod/c10\n"));
        assert!(!in_cgroup("8:pids:/c1", "7:blkio:/c1\n"));
        assert!(cgroups_nest("0::/pod/c1", "0::/pod/c1/inner") && cgroups_nest("0::/pod", "0::/pod"));
        assert!(!cgroups_nest("0::/pod/c1", "0::/pod/c2"));
    }

    /// Read from a cgroup namespace of the reader's own, a process outside it shows a path that
    /// climbs (`/..`): neither in the container's cgroup nor outside it, whatever the path
    /// goes on to name; a path merely named `..x` does not climb.
    #[test]
    fn a_path_that_climbs_out_of_the_readers_cgroup_namespace_can_neither_match_nor_be_ruled_out() {
        use CgroupMatch::{CannotTell, Inside, Outside};
        let recorded = "0::/kubepods/pod1/c1";
        assert_eq!(cgroup_match(recorded, "0::/kubepods/pod1/c1/inner\n"), Inside);
        assert_eq!(cgroup_match(recorded, "0::/kubepods/pod2/c2\n"), Outside);
        // The same container's process, and another's, as a reader in a namespace of its own
        // (rooted at /kubepods/pod9/c9) reads them.
        assert_eq!(cgroup_match(recorded, "0::/../../pod1/c1\n"), CannotTell);
        assert_eq!(cgroup_match(recorded, "0::/../../pod2/c2\n"), CannotTell);
        assert_eq!(cgroup_match(recorded, "0::/..\n"), CannotTell);
        assert_eq!(cgroup_match(recorded, "0::relative\n"), CannotTell);
        // v1: only the recorded hierarchy's line counts.
        assert_eq!(cgroup_match("8:pids:/c1", "8:pids:/../c1\n0::/\n"), CannotTell);
        assert_eq!(cgroup_match("8:pids:/c1", "8:pids:/c1\n4:memory:/../x\n"), Inside);
        assert_eq!(cgroup_match("8:pids:/c1", "8:pids:/c2\n4:memory:/../x\n"), Outside);
        // A recorded path that climbs (a ledger edited by hand) compares with nothing.
        assert_eq!(cgroup_match("0::/../c1", "0::/../c1\n"), CannotTell);
        assert!(!in_cgroup(recorded, "0::/../../pod1/c1\n"));
        // Not a climb: a component that only starts with two dots.
        assert_eq!(cgroup_match("0::/pod/..c1", "0::/pod/..c1/x\n"), Inside);
        assert_eq!(
            climbing_line("1:cpu:/\n0::/../../init.scope\n"),
            Some("0::/../../init.scope")
        );
        assert_eq!(climbing_line("1:cpu:/\n0::/..c/init.scope\n"), None);
    }

    #[test]
    fn a_pidfd_is_opened_only_on_the_process_recorded() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let id = ProcessIdentity::of(child.id()).unwrap();
        let other = ProcessIdentity {
            start_time: id.start_time + 1,
            ..id
        };
        assert!(other.pidfd().is_none(), "another start time is another process");
        let fd = id.pidfd().unwrap();
        assert!(fd.kill());
        child.wait().unwrap();
        // Reaped: the pid may be anyone's now, the descriptor still names the one that exited.
        assert!(!fd.kill());
    }

    #[test]
    fn exited_child_is_dead() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let id = ProcessIdentity::of(child.id()).unwrap();
        assert!(id.is_alive());
        child.kill().unwrap();
        // Before it is reaped it is a zombie, which already counts as dead.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!id.is_alive());
        child.wait().unwrap();
        assert!(!id.is_alive());
    }
}
