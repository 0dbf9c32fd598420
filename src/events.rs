//! The event log: one JSON object a line in `<state>/events.jsonl`, for every decision.
//!
//! A hook's stderr reaches the user only when the hook fails, and crun discards it entirely,
//! so every admit, refusal, release and reclaim is also written here. Events are appended
//! while the ledger lock is held, so lines never interleave and rotation cannot race.

use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::ledger::{Access, GpuShare, StateDir};

pub const EVENTS_FILE: &str = "events.jsonl";
const ROTATED_FILE: &str = "events.jsonl.1";
/// The log is rotated once past this size; two files bound the disk it can take.
const ROTATE_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Admit,
    AdmitAfterWait,
    Refuse,
    Enqueue,
    Timeout,
    /// A wait ended by `vramgate release` before the container was admitted.
    Cancel,
    Release,
    /// The container's hook bound a reservation made at create to its init process.
    Confirm,
    Reclaim,
    AbandonTicket,
    FailOpen,
    /// What holds an admitted container to its reservation was set (the driver limit), or
    /// cleared when the container ended.
    Enforce,
    /// `vramgate watch` measured a container holding more than its reservation and margin.
    OverUse,
    /// ...and stopped it (`[enforce] over_use = "kill"`).
    OverUseStop,
    Note,
}

impl Kind {
    /// The kind a log line's `event` field names, or `None` for a name vramgate does not write:
    /// how a reader of the log (`vramgate replay`) tells it from another file. Read through the
    /// same serde names the log is written with, so a new or renamed kind needs no list kept
    /// beside this enum.
    pub fn from_name(name: &str) -> Option<Kind> {
        use serde::de::{value::Error, IntoDeserializer};
        Kind::deserialize(IntoDeserializer::<Error>::into_deserializer(name)).ok()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub time_unix_ms: u64,
    pub event: Kind,
    pub container: String,
    /// What the container is called ([`crate::ledger::Reservation::name`]), where it has a name:
    /// the container is still keyed by its id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuShare>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// For an admission that vramgate placed: the numbers it chose by, to replay it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement::Placement>,
}

impl Event {
    pub fn new(
        time_unix_ms: u64,
        event: Kind,
        container: impl Into<String>,
        gpus: &[GpuShare],
        detail: impl Into<String>,
    ) -> Event {
        Event {
            time_unix_ms,
            event,
            container: container.into(),
            name: None,
            gpus: gpus.to_vec(),
            detail: detail.into(),
            placement: None,
        }
    }
}

impl Event {
    /// The event, with the container's name where it has one.
    pub fn named(self, name: &Option<String>) -> Event {
        Event {
            name: name.clone(),
            ..self
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
    let mut file = state.open_file(EVENTS_FILE, Access::AppendCreate)?;
    if file.metadata()?.len() > ROTATE_BYTES {
        state.rename(EVENTS_FILE, ROTATED_FILE)?;
        file = state.open_file(EVENTS_FILE, Access::AppendCreate)?;
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
