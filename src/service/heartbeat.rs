//! Whether `vramgate watch` runs: the heartbeat it leaves in the state directory.
//!
//! A claim's holders are counted once only where the watch stops them together when their use
//! added up passes the claim's limit ([`crate::ledger::ClaimHold`]). `[enforce] over_use =
//! "kill"` in the config does not make that so: a watch never started, stopped, crashed, or
//! failing every pass (NVML gone) stops nothing, and K holders could use K limits. So the
//! watch touches [`HEARTBEAT_FILE`] after every pass that measured, and the service counts a
//! claim's holders once only while the config says `kill` and the heartbeat is fresh
//! ([`watch_seen`]); otherwise each holder counts whole (more, never less), existing holds
//! included. `vramgate doctor` says which. Admission pays one `fstatat`, and only where a
//! claim hold is in question.

use std::time::{Duration, SystemTime};

use crate::ledger::{Access, LedgerError, StateDir};

/// The file in the state directory whose modification time is the watch's last measured pass;
/// it holds the pid of the watch that wrote it, for people.
pub const HEARTBEAT_FILE: &str = "watch.heartbeat";

/// How old the heartbeat may be and still say the watch runs: four of its intervals (a pass is
/// an interval's sleep and an NVML query) and two seconds for a slow query.
pub fn heartbeat_window(interval: Duration) -> Duration {
    interval.saturating_mul(4).saturating_add(Duration::from_secs(2))
}

/// What the heartbeat says about the watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchSeen {
    /// A pass measured `age_ms` ago, within [`heartbeat_window`].
    Running { age_ms: u64 },
    /// The last pass that measured is older than the window (or stamped in the future by more
    /// than it: a clock set back, which says nothing about now).
    Stale { age_ms: u64 },
    /// No heartbeat: no watch has measured here since the state directory was made.
    Never,
}

impl WatchSeen {
    pub fn runs(self) -> bool {
        matches!(self, WatchSeen::Running { .. })
    }
}

/// What the heartbeat in `dir` says at `now_unix_ms`, for a watch measuring every `interval`
/// (`[enforce] over_use_interval`). One `fstatat`.
pub fn watch_seen(dir: &StateDir, now_unix_ms: u64, interval: Duration) -> WatchSeen {
    let Some(at) = dir.modified_unix_ms(HEARTBEAT_FILE) else {
        return WatchSeen::Never;
    };
    let window = heartbeat_window(interval).as_millis() as u64;
    let age_ms = now_unix_ms.saturating_sub(at);
    if age_ms > window || at > now_unix_ms.saturating_add(window) {
        WatchSeen::Stale { age_ms }
    } else {
        WatchSeen::Running { age_ms }
    }
}

/// The watch's beat after a pass that measured: the file's modification time set to now (a
/// touch, not a rewrite: nothing synced to disk every interval; a heartbeat lost in a crash is
/// a stale one, which counts more). Its content, the watch's pid, is written when it differs.
pub fn beat(dir: &StateDir, written: &mut bool) -> Result<(), LedgerError> {
    if !*written {
        dir.write_file(HEARTBEAT_FILE, format!("{}\n", std::process::id()).as_bytes())?;
        *written = true;
    }
    let file = dir.open_file(HEARTBEAT_FILE, Access::Read)?;
    file.set_modified(SystemTime::now()).map_err(|source| LedgerError::Io {
        path: dir.path().join(HEARTBEAT_FILE),
        source,
    })
}

/// The DRA driver's beat, every [`crate::ledger::DRA_BEAT`]: its heartbeat written anew
/// (atomically) with this instant on both clocks ([`crate::ledger::dra_heartbeat_text`]). A
/// rewrite, not a touch: the instant is in the text, and a file removed meanwhile is made
/// again.
pub fn beat_dra(dir: &StateDir, clock: &dyn crate::clock::Clock) -> Result<(), LedgerError> {
    let text = crate::ledger::dra_heartbeat_text(std::process::id(), clock.stamp());
    dir.write_file(crate::ledger::DRA_HEARTBEAT_FILE, text.as_bytes())
}
