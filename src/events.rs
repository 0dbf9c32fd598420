//! The event log: one JSON object a line in `<state>/events.jsonl`, for every decision.
//!
//! A hook's stderr reaches the user only when the hook fails, and crun discards it entirely,
//! so every admit, refusal, release and reclaim is also written here. Events are appended
//! while the ledger lock is held, so lines never interleave and rotation cannot race.

use std::fs::OpenOptions;
use std::io::Write;

use serde::Serialize;

use crate::ledger::{now_unix_ms, GpuShare, StateDir};

pub const EVENTS_FILE: &str = "events.jsonl";
const ROTATED_FILE: &str = "events.jsonl.1";
/// The log is rotated once past this size; two files bound the disk it can take.
const ROTATE_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Admit,
    AdmitAfterWait,
    Refuse,
    Enqueue,
    Timeout,
    Release,
    Reclaim,
    AbandonTicket,
    FailOpen,
    Note,
}

#[derive(Debug, Serialize)]
pub struct Event<'a> {
    pub time_unix_ms: u64,
    pub event: Kind,
    pub container: &'a str,
    #[serde(skip_serializing_if = "<[GpuShare]>::is_empty")]
    pub gpus: &'a [GpuShare],
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl<'a> Event<'a> {
    pub fn new(event: Kind, container: &'a str, gpus: &'a [GpuShare], detail: impl Into<String>) -> Event<'a> {
        Event {
            time_unix_ms: now_unix_ms(),
            event,
            container,
            gpus,
            detail: detail.into(),
        }
    }
}

/// Appends events. Logging is best effort: a full disk must not turn into refused containers,
/// so a failure is reported on stderr and otherwise ignored.
pub fn append(state: &StateDir, events: &[Event]) {
    if events.is_empty() {
        return;
    }
    if let Err(e) = try_append(state, events) {
        eprintln!(
            "vramgate: warning: cannot write the event log in {}: {e}",
            state.path().display()
        );
    }
}

fn try_append(state: &StateDir, events: &[Event]) -> Result<(), Box<dyn std::error::Error>> {
    let mut file = state.open_file(EVENTS_FILE, OpenOptions::new().append(true).create(true))?;
    if file.metadata()?.len() > ROTATE_BYTES {
        std::fs::rename(state.path().join(EVENTS_FILE), state.path().join(ROTATED_FILE))?;
        file = state.open_file(EVENTS_FILE, OpenOptions::new().append(true).create(true))?;
    }
    let mut buf = Vec::new();
    for event in events {
        serde_json::to_writer(&mut buf, event)?;
        buf.push(b'\n');
    }
    // One write call: O_APPEND makes it land whole at the end.
    file.write_all(&buf)?;
    Ok(())
}
