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
    /// Bytes available to new requests ([`crate::admission::GpuAccount::available`]; the admission
    /// makes candidates, so placement names nothing above it).
    pub available: u64,
    pub reservations: usize,
    /// Bytes the request takes on this GPU: a share of each GPU's own size for a `N%`
    /// request, so GPUs of different sizes are ranked each by its own (0 in events written
    /// before it was recorded).
    #[serde(default)]
    pub request: u64,
}

impl Candidate {
    /// What would be left on this GPU after the request.
    pub fn left(&self) -> u64 {
        self.available.saturating_sub(self.request)
    }
}

/// A placement decision as the event log records it: enough to replay it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub strategy: Strategy,
    /// Bytes asked for on the first chosen GPU (each candidate has its own: `request`).
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
                    crate::quantity::format_bytes(if c.request == 0 {
                        c.available.saturating_sub(self.bytes)
                    } else {
                        c.left()
                    })
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

/// Chooses `count` distinct GPUs among `fitting` (each already known to hold its `request`),
/// or `None` when there are fewer than `count`. Each is ranked by what it would have left
/// after its own request. The order of `fitting` does not matter.
pub fn choose(strategy: Strategy, fitting: &[Candidate], count: usize) -> Option<Vec<String>> {
    if fitting.len() < count {
        return None;
    }
    let mut ranked: Vec<&Candidate> = fitting.iter().collect();
    ranked.sort_by(|a, b| {
        let by_room = match strategy {
            Strategy::BestFit => a.left().cmp(&b.left()),
            Strategy::Spread => b.left().cmp(&a.left()),
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
            request: 8 * GI,
        }
    }

    fn asking(request: u64, mut list: Vec<Candidate>) -> Vec<Candidate> {
        list.iter_mut().for_each(|c| c.request = request);
        list
    }

    #[test]
    fn best_fit_takes_the_tightest_hole_spread_the_widest() {
        let fitting = [c(0, 40, 1), c(1, 10, 3), c(2, 80, 0), c(3, 12, 2)];
        assert_eq!(choose(Strategy::BestFit, &fitting, 1).unwrap(), ["GPU-1"]);
        assert_eq!(choose(Strategy::Spread, &fitting, 1).unwrap(), ["GPU-2"]);
        assert_eq!(
            choose(Strategy::BestFit, &fitting, 3).unwrap(),
            ["GPU-1", "GPU-3", "GPU-0"]
        );
        assert_eq!(choose(Strategy::BestFit, &fitting, 5), None);
    }

    #[test]
    fn ties_go_to_fewer_reservations_then_the_lower_index() {
        let fitting = asking(GI, vec![c(4, 20, 2), c(2, 20, 1), c(1, 20, 1)]);
        assert_eq!(choose(Strategy::BestFit, &fitting, 1).unwrap(), ["GPU-1"]);
        assert_eq!(choose(Strategy::Spread, &fitting, 2).unwrap(), ["GPU-1", "GPU-2"]);
    }

    /// A `50%` request on an 80 GiB GPU with 48 GiB free (8 left after its 40) and on a
    /// 24 GiB GPU with 20 free (8 left after its 12): ranked each by its own share, best fit
    /// leaves 8 on either and takes the one with fewer reservations; by the first GPU's 40 GiB
    /// the small one would have been ranked as having nothing left.
    #[test]
    fn each_gpu_is_ranked_by_its_own_share_of_a_percent_request() {
        let mut big = c(0, 48, 2);
        big.request = 40 * GI;
        let mut small = c(1, 20, 1);
        small.request = 12 * GI;
        let spare = {
            let mut s = c(2, 30, 0);
            s.request = 12 * GI;
            s
        };
        assert_eq!(
            choose(Strategy::BestFit, &[big.clone(), small.clone()], 1).unwrap(),
            ["GPU-1"]
        );
        assert_eq!(choose(Strategy::Spread, &[big, small, spare], 1).unwrap(), ["GPU-2"]);
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
