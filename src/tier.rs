//! The enforcement tiers as data: what the ledger records for a reservation, what
//! `vramgate-runtime` writes into a spec's annotation and what `vramgate status` reports. They
//! live below the ledger and the request so that both can name a tier without reaching up into
//! [`crate::enforce`], which decides and applies them (and re-exports [`Tier`]).

use serde::{Deserialize, Serialize};

/// Where vramgate-runtime records, in the spec, what holds the container to its reservation
/// ([`Tier`]); the hook records it in the ledger when it confirms.
pub const ENFORCEMENT_ANNOTATION: &str = "vramgate.dev/enforcement";

/// What holds a container to its reservation, strongest first: reported per container by
/// `vramgate status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The driver refuses allocations beyond the reservation (per cgroup).
    DriverLimit,
    /// Handed to the NVIDIA toolkit's CDI hook, which makes the same driver call; vramgate
    /// cannot see whether that hook ran.
    ToolkitLimit,
    /// The MPS server refuses allocations beyond the client's pinned limit.
    MpsLimit,
    /// Only framework settings (TensorFlow growth, JAX fraction): advice a program can ignore.
    Guardrails,
    /// Nothing: admission only.
    None,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::DriverLimit => "driver_limit",
            Tier::ToolkitLimit => "toolkit_limit",
            Tier::MpsLimit => "mps_limit",
            Tier::Guardrails => "guardrails",
            Tier::None => "none",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
