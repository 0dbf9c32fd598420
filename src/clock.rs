//! The service's clocks, behind a trait so its decisions (deadlines, backfill bounds, ages)
//! can be tested at chosen instants.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub trait Clock {
    /// Wall-clock milliseconds since the epoch: written into the ledger, so it must mean the
    /// same to every process that reads it, across restarts.
    fn now_unix_ms(&self) -> u64;
    /// Monotonic time since an arbitrary origin: how long something has waited, immune to the
    /// wall clock being stepped (a wait must never outlast the runtime's hook timeout).
    fn monotonic(&self) -> Duration;
    /// Milliseconds on the boot clock (`CLOCK_BOOTTIME`): one origin for every process on the
    /// host, never stepped. Ages in the queue compare another process's instant with this
    /// one's, so they are taken on it where both sides have it ([`Stamp::ms_since`]). `None`
    /// where the clock cannot say (a test clock that only models the wall clock).
    fn boot_ms(&self) -> Option<u64> {
        None
    }
    /// This instant on both clocks.
    fn stamp(&self) -> Stamp {
        Stamp {
            unix_ms: self.now_unix_ms(),
            boot_ms: self.boot_ms(),
        }
    }
}

/// One instant, as the ledger records when something happened: on the wall clock (what people
/// read, and what still means something after a reboot) and on the boot clock (what ages are
/// measured on, immune to the wall clock being stepped by NTP or by hand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub unix_ms: u64,
    pub boot_ms: Option<u64>,
}

impl Stamp {
    /// An instant known on the wall clock only.
    pub fn wall(unix_ms: u64) -> Stamp {
        Stamp { unix_ms, boot_ms: None }
    }

    /// Milliseconds from an earlier instant (`unix_ms`, `boot_ms` as it was recorded) to this
    /// one: on the boot clock when both have it, else on the wall clock (entries written by a
    /// vramgate that recorded no boot time); 0 when the earlier one is later.
    pub fn ms_since(&self, unix_ms: u64, boot_ms: Option<u64>) -> u64 {
        match (self.boot_ms, boot_ms) {
            (Some(now), Some(then)) => now.saturating_sub(then),
            _ => self.unix_ms.saturating_sub(unix_ms),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        now_unix_ms()
    }

    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }

    fn boot_ms(&self) -> Option<u64> {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
        let ms = u64::try_from(t.tv_sec()).ok()?.checked_mul(1000)?;
        ms.checked_add(u64::try_from(t.tv_nsec()).ok()? / 1_000_000)
    }
}

/// Milliseconds since the epoch from the system clock (0 before 1970, which no host runs at).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
