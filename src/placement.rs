//! Placement: which GPUs a request that leaves the choice to vramgate gets.
//!
//! A request says `vramgate.dev/gpus=auto` (one GPU) or `auto:N` (N GPUs, the amount on each),
//! or arrives through `vramgate-runtime` with `NVIDIA_VISIBLE_DEVICES=all` (see
//! [`crate::request`]). The choice is made inside the admission transaction, under the ledger
//! lock, among the candidate GPUs that have room now:
//!
//! - **best fit** (the default): the GPU left with the least memory that still holds the
//!   request. Small jobs fill the fullest cards first, which keeps large holes for large jobs.
//! - **spread**: the GPU left with the most memory, so jobs share the cards evenly (less
//!   contention for compute and bandwidth, at the cost of fragmenting the memory).
//!
//! Ties go to the GPU with fewer reservations, then to the lower index, so a choice is a pure
//! function of the numbers that the event log records with it (see [`Placement`]).

use serde::{Deserialize, Serialize};

use crate::admission::GpuAccount;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    #[default]
    BestFit,
    Spread,
}

impl Strategy {
    pub fn parse(value: &str) -> Option<Strategy> {
        match value.trim() {
            "best-fit" => Some(Strategy::BestFit),
            "spread" => Some(Strategy::Spread),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::BestFit => "best-fit",
            Strategy::Spread => "spread",
        }
    }
}

/// One GPU a placement could have taken, with what it had when the choice was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub uuid: String,
    pub index: u32,
    /// Bytes available to new requests ([`GpuAccount::available`]).
    pub available: u64,
    pub reservations: usize,
}

impl Candidate {
    pub fn of(account: &GpuAccount) -> Candidate {
        Candidate {
            uuid: account.uuid.clone(),
            index: account.index,
            available: account.available(),
            reservations: account.reservations,
        }
    }
}

/// A placement decision as the event log records it: enough to replay it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub strategy: Strategy,
    /// Bytes asked for on each chosen GPU.
    pub bytes: u64,
    /// The GPUs that had room, with their numbers at the time.
    pub candidates: Vec<Candidate>,
    /// The UUIDs chosen, in the order chosen.
    pub chosen: Vec<String>,
}

impl Placement {
    /// A few words for the event log and messages: "best-fit: GPU 3 (12.0 GiB left)".
    pub fn describe(&self) -> String {
        let chosen: Vec<String> = self
            .chosen
            .iter()
            .filter_map(|uuid| self.candidates.iter().find(|c| &c.uuid == uuid))
            .map(|c| {
                format!(
                    "GPU {} ({} left)",
                    c.index,
                    crate::quantity::format_bytes(c.available.saturating_sub(self.bytes))
                )
            })
            .collect();
        format!(
            "{} on {} of {} GPU{} with room",
            self.strategy.as_str(),
            chosen.join(", "),
            self.candidates.len(),
            if self.candidates.len() == 1 { "" } else { "s" }
        )
    }
}

/// Chooses `count` distinct GPUs among `fitting` (each already known to hold `bytes`), or
/// `None` when there are fewer than `count`. The order of `fitting` does not matter.
pub fn choose(strategy: Strategy, bytes: u64, fitting: &[Candidate], count: usize) -> Option<Vec<String>> {
    if fitting.len() < count {
        return None;
    }
    let mut ranked: Vec<&Candidate> = fitting.iter().collect();
    ranked.sort_by(|a, b| {
        let left = |c: &Candidate| c.available.saturating_sub(bytes);
        let by_room = match strategy {
            Strategy::BestFit => left(a).cmp(&left(b)),
            Strategy::Spread => left(b).cmp(&left(a)),
        };
        by_room
            .then(a.reservations.cmp(&b.reservations))
            .then(a.index.cmp(&b.index))
            .then(a.uuid.cmp(&b.uuid))
    });
    Some(ranked.into_iter().take(count).map(|c| c.uuid.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn c(index: u32, available_gib: u64, reservations: usize) -> Candidate {
        Candidate {
            uuid: format!("GPU-{index}"),
            index,
            available: available_gib * GI,
            reservations,
        }
    }

    #[test]
    fn best_fit_takes_the_tightest_hole_spread_the_widest() {
        let fitting = [c(0, 40, 1), c(1, 10, 3), c(2, 80, 0), c(3, 12, 2)];
        assert_eq!(choose(Strategy::BestFit, 8 * GI, &fitting, 1).unwrap(), ["GPU-1"]);
        assert_eq!(choose(Strategy::Spread, 8 * GI, &fitting, 1).unwrap(), ["GPU-2"]);
        assert_eq!(
            choose(Strategy::BestFit, 8 * GI, &fitting, 3).unwrap(),
            ["GPU-1", "GPU-3", "GPU-0"]
        );
        assert_eq!(choose(Strategy::BestFit, 8 * GI, &fitting, 5), None);
    }

    #[test]
    fn ties_go_to_fewer_reservations_then_the_lower_index() {
        let fitting = [c(4, 20, 2), c(2, 20, 1), c(1, 20, 1)];
        assert_eq!(choose(Strategy::BestFit, GI, &fitting, 1).unwrap(), ["GPU-1"]);
        assert_eq!(choose(Strategy::Spread, GI, &fitting, 2).unwrap(), ["GPU-1", "GPU-2"]);
    }

    #[test]
    fn describe_names_the_choice() {
        let p = Placement {
            strategy: Strategy::BestFit,
            bytes: 8 * GI,
            candidates: vec![c(0, 40, 1), c(1, 10, 3)],
            chosen: vec!["GPU-1".into()],
        };
        assert_eq!(p.describe(), "best-fit on GPU 1 (2048 MiB left) of 2 GPUs with room");
    }
}
