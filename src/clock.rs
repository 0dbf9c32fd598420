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
}

/// Milliseconds since the epoch from the system clock (0 before 1970, which no host runs at).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
