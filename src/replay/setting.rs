//! What one replay runs under: the simulated GPUs (`--gpus`), the overrides a replay and a
//! `--compare` take, and the few words that name a setting in the report.

use std::collections::BTreeMap;

use super::{ReplayError, Result};
use crate::config::{Config, Policy, StaticGpu};

/// The simulated GPUs of `--gpus 2x141Gi,1x24Gi`.
pub fn parse_gpus(value: &str) -> Result<Vec<StaticGpu>> {
    let bad = |reason: String| ReplayError::Gpus {
        value: value.to_string(),
        reason,
    };
    let mut gpus = Vec::new();
    for part in value.split(',').map(str::trim) {
        let (count, size) = part
            .split_once('x')
            .ok_or_else(|| bad(format!("{part:?} has no 'x'")))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("{count:?} is not a count of GPUs")))?;
        let size = match crate::quantity::parse_quantity(size.trim()) {
            Ok(crate::quantity::Quantity::Bytes(b)) if b > 0 => b,
            _ => return Err(bad(format!("{size:?} is not a memory size such as 141Gi"))),
        };
        for _ in 0..count {
            let index = gpus.len() as u32;
            gpus.push(StaticGpu {
                index,
                uuid: format!("GPU-replay-{index:04}"),
                total: size,
                used_outside: 0,
                minor: index,
            });
        }
    }
    if gpus.is_empty() || gpus.len() > 1024 {
        return Err(bad(format!("{} GPUs; give 1 to 1024", gpus.len())));
    }
    Ok(gpus)
}

/// One setting a replay may override: the name as `--compare` and the flags spell it.
pub const SETTINGS: &[&str] = &[
    "gpus",
    "strategy",
    "backfill",
    "backfill-bound",
    "backfill-order",
    "policy",
    "headroom",
    "sharing",
    "declared",
];

/// How jobs hold GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// vramgate's way: a job reserves its memory, and jobs that fit share a GPU.
    Shared,
    /// The baseline without vramgate: the scheduler hands out whole GPUs (`nvidia.com/gpu: 1`),
    /// one job per GPU, whatever its size.
    Exclusive,
}

impl Sharing {
    pub fn parse(value: &str) -> Option<Sharing> {
        match value {
            "shared" => Some(Sharing::Shared),
            "exclusive" => Some(Sharing::Exclusive),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::Shared => "shared",
            Sharing::Exclusive => "exclusive",
        }
    }
}

/// What jobs declare as their duration (`vramgate.dev/expected-duration`), which only
/// `[queue] backfill_order = "longest"` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// What the workload says: a job file's `expected_duration`; an event log records none.
    Given,
    /// Every job declares exactly how long it runs: the most a declaration can give.
    Exact,
}

/// What one replay runs under: vramgate's settings, how jobs hold GPUs, and what they declare.
#[derive(Debug, Clone)]
pub struct Setting {
    pub config: Config,
    pub sharing: Sharing,
    pub declared: Declared,
}

impl Setting {
    pub fn new(config: Config) -> Setting {
        Setting {
            config,
            sharing: Sharing::Shared,
            declared: Declared::Given,
        }
    }
}

/// Applies one override to `setting`.
pub fn apply_setting(setting: &mut Setting, key: &str, value: &str) -> Result<()> {
    let bad = |reason: &str| ReplayError::Setting {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let config = &mut setting.config;
    match key {
        "sharing" => setting.sharing = Sharing::parse(value).ok_or_else(|| bad("give shared or exclusive"))?,
        "declared" => {
            setting.declared = match value {
                "given" => Declared::Given,
                "exact" => Declared::Exact,
                _ => return Err(bad("give given or exact")),
            }
        }
        "gpus" => {
            config.inventory.backend = crate::config::Backend::Static;
            config.inventory.gpus = parse_gpus(value)?;
        }
        "strategy" => {
            config.placement.strategy =
                crate::placement::Strategy::parse(value).ok_or_else(|| bad("give best-fit or spread"))?;
        }
        "backfill" => {
            config.queue.backfill = match value {
                "true" | "on" => true,
                "false" | "off" => false,
                _ => return Err(bad("give true or false")),
            }
        }
        "backfill-bound" => {
            config.queue.backfill_bound = crate::quantity::parse_duration(value).map_err(|e| bad(&e.to_string()))?;
        }
        "backfill-order" => {
            config.queue.backfill_order = crate::queue_order::BackfillOrder::parse(value)
                .ok_or_else(|| bad(&format!("give {}", crate::queue_order::BackfillOrder::VALUES)))?;
        }
        "policy" => config.policy = Policy::parse(value).ok_or_else(|| bad("give wait or reject"))?,
        "headroom" => config.headroom = crate::quantity::parse_quantity(value).map_err(|e| bad(&e.to_string()))?,
        _ => {
            return Err(bad(&format!(
                "not a setting a replay overrides ({})",
                SETTINGS.join(", ")
            )))
        }
    }
    Ok(())
}

/// The settings of one replay in a `--compare`: `base` with `key=value` applied, named.
pub fn settings_for(base: &Setting, compare: Option<&str>) -> Result<Vec<(String, Setting)>> {
    let Some(compare) = compare else {
        return Ok(vec![(describe(base), base.clone())]);
    };
    let (key, values) = compare.split_once('=').ok_or_else(|| ReplayError::Setting {
        key: "compare".into(),
        value: compare.into(),
        reason: format!("write it as KEY=V1,V2 with KEY one of {}", SETTINGS.join(", ")),
    })?;
    let values: Vec<&str> = if key == "gpus" {
        // A GPU list holds commas itself: alternatives are separated by ';' or '|'.
        values.split(['|', ';']).collect()
    } else {
        values.split(',').collect()
    };
    values
        .iter()
        .map(|v| {
            let mut setting = base.clone();
            apply_setting(&mut setting, key, v.trim())?;
            Ok((format!("{key}={}", v.trim()), setting))
        })
        .collect()
}

/// A few words for a setting: what the GPUs and rules are.
pub fn describe(setting: &Setting) -> String {
    let config = &setting.config;
    let mut sizes: BTreeMap<u64, usize> = BTreeMap::new();
    for g in config.inventory.static_gpus_or_simulated() {
        *sizes.entry(g.total).or_default() += 1;
    }
    let gpus: Vec<String> = sizes
        .iter()
        .map(|(size, n)| format!("{n}x{}", crate::quantity::format_bytes(*size).replace(' ', "")))
        .collect();
    let backfill = match config.queue.backfill_order {
        _ if !config.queue.backfill => String::new(),
        crate::queue_order::BackfillOrder::Arrival => " backfill".to_string(),
        order => format!(" backfill {order}"),
    };
    format!(
        "{} {}{}{}{}",
        gpus.join(","),
        config.placement.strategy.as_str(),
        backfill,
        if setting.declared == Declared::Exact {
            " declared exact"
        } else {
            ""
        },
        if setting.sharing == Sharing::Exclusive {
            " exclusive"
        } else {
            ""
        }
    )
}
