//! The DRA claim devices a container was given, from the markers and shares the driver's CDI
//! edits set (see [`crate::dra`]): which devices, and what several of them add up to.

use std::collections::HashMap;

use super::{RequestError, CLAIM_DEVICE_ENV_PREFIX, CLAIM_SHARE_ENV_PREFIX};
use crate::quantity;
use crate::spec::SpecView;

/// The DRA claim markers the container was given ([`CLAIM_DEVICE_ENV_PREFIX`]): each value
/// whole, the device's secret included (see [`crate::dra::cdi_spec`]).
pub fn claim_markers(spec: &SpecView) -> impl Iterator<Item = &str> {
    marker_vars(spec).into_iter().map(|(_, value)| value)
}

/// The most claim markers, and the most shares, one container may carry: one of each per
/// claim device, and no container is given this many (a node's GPUs, MIG instances included,
/// are fewer). Past it the container is refused before any variable is kept and before any
/// spec file is read, so a spec of thousands of them costs a count over its environment.
pub const MAX_CLAIM_DEVICES: usize = 64;

/// The claim variables of a container, read in time linear in its environment (a count per
/// prefix, then one pass for each kind).
pub(super) struct ClaimVars<'a> {
    /// The marker variables as the container's process sees them, `(suffix, value)`: one per
    /// name, the last value winning ([`SpecView::env`]), in the order their names first came.
    /// A name written twice (by the container, then by CDI's edits) is one variable, never a
    /// second device that would add a share again.
    pub markers: Vec<(&'a str, &'a str)>,
    /// The share variables by suffix, the last value winning.
    pub shares: HashMap<&'a str, &'a str>,
}

/// The container's claim variables; refused when it carries more than [`MAX_CLAIM_DEVICES`]
/// markers or shares ([`RequestError::TooManyClaimVariables`]).
pub(super) fn claim_vars(spec: &SpecView) -> Result<ClaimVars<'_>, RequestError> {
    let env = spec.env_entries();
    for prefix in [CLAIM_DEVICE_ENV_PREFIX, CLAIM_SHARE_ENV_PREFIX] {
        let count = env.iter().filter(|e| e.starts_with(prefix)).count();
        if count > MAX_CLAIM_DEVICES {
            return Err(RequestError::TooManyClaimVariables {
                prefix,
                count,
                limit: MAX_CLAIM_DEVICES,
            });
        }
    }
    let shares = env
        .iter()
        .filter_map(|e| e.strip_prefix(CLAIM_SHARE_ENV_PREFIX)?.split_once('='))
        .collect();
    Ok(ClaimVars {
        markers: marker_vars(spec),
        shares,
    })
}

/// [`ClaimVars::markers`], whatever their number (what the DRA driver reads back from the
/// bundles of containers admitted already). One pass: each name's place is looked up in a
/// map, not searched for along the list (which made the scan quadratic).
pub(super) fn marker_vars(spec: &SpecView) -> Vec<(&str, &str)> {
    let mut vars: Vec<(&str, &str)> = Vec::new();
    let mut place: HashMap<&str, usize> = HashMap::new();
    for (name, value) in spec
        .env_entries()
        .iter()
        .filter_map(|e| e.strip_prefix(CLAIM_DEVICE_ENV_PREFIX)?.split_once('='))
    {
        match place.get(name) {
            Some(&at) => vars[at].1 = value,
            None => {
                place.insert(name, vars.len());
                vars.push((name, value));
            }
        }
    }
    vars
}

/// The CDI device a claim marker's value names: what precedes its secret (`<uid>-gpu-0` of
/// `<uid>-gpu-0:<secret>`). What messages show; the secret never goes into a log.
pub fn claim_marker_device(value: &str) -> &str {
    value.split_once(':').map_or(value, |(name, _)| name)
}

/// The DRA claim devices the container was given, by name.
pub fn claim_devices(spec: &SpecView) -> impl Iterator<Item = &str> {
    claim_markers(spec).map(claim_marker_device)
}

/// The memory a container's claim devices give it, when it was given several: the same
/// amount (and limit) on each GPU they name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimShares {
    pub bytes: u64,
    pub limit: u64,
    /// Each GPU once, in the order the devices came.
    pub uuids: Vec<String>,
}

/// What several claim devices give the container ([`CLAIM_SHARE_ENV_PREFIX`]): devices on one
/// GPU add up (two requests of one claim on one device are one CDI device already; two
/// claims' devices on one GPU are two), and every GPU must then hold the same amount and the
/// same limit, which is what `count` and `allocationMode: All` give; other amounts are refused
/// ([`RequestError::UnequalClaimShares`]). `Ok(None)`: fewer than two devices (the one
/// device's `VRAMGATE_MEMORY` and `VRAMGATE_GPUS` say it). Devices whose spec has no share
/// (written by a driver before them) cannot be added up and are refused as before
/// ([`RequestError::SeveralClaimDevices`]).
pub fn claim_shares(spec: &SpecView) -> Result<Option<ClaimShares>, RequestError> {
    let ClaimVars { markers, shares } = claim_vars(spec)?;
    if markers.len() < 2 {
        return Ok(None);
    }
    let several = || RequestError::SeveralClaimDevices {
        count: markers.len(),
        devices: markers
            .iter()
            .map(|(_, v)| claim_marker_device(v))
            .collect::<Vec<_>>()
            .join(", ")
            .chars()
            .take(200)
            .collect(),
    };
    // Per GPU: (UUID, bytes, limit), in the order the devices came.
    let mut per_gpu: Vec<(String, u64, u64)> = Vec::new();
    for (suffix, _) in &markers {
        let key = format!("{CLAIM_SHARE_ENV_PREFIX}{suffix}");
        let value = *shares.get(suffix).ok_or_else(several)?;
        let invalid = |reason: &str| RequestError::Invalid {
            source_name: key.clone(),
            value: value.chars().take(80).collect(),
            reason: reason.to_string(),
        };
        let mut fields = value.split(',');
        let (Some(uuid), Some(bytes), Some(limit), None) = (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(invalid(
                "must be <GPU UUID>,<bytes>,<limit bytes>, as the DRA driver writes it",
            ));
        };
        let (Ok(bytes), Ok(limit)) = (bytes.parse::<u64>(), limit.parse::<u64>()) else {
            return Err(invalid("bytes and limit must be whole numbers of bytes"));
        };
        if uuid.is_empty() || bytes == 0 || limit < bytes {
            return Err(invalid(
                "needs a GPU, at least one byte, and a limit of at least the bytes",
            ));
        }
        match per_gpu.iter_mut().find(|(u, _, _)| u == uuid) {
            Some((_, b, l)) => {
                *b = b.saturating_add(bytes);
                *l = l.saturating_add(limit);
            }
            None => per_gpu.push((uuid.to_string(), bytes, limit)),
        }
    }
    let (_, bytes, limit) = per_gpu[0].clone();
    if per_gpu.iter().any(|(_, b, l)| (*b, *l) != (bytes, limit)) {
        let shares = per_gpu
            .iter()
            .map(|(uuid, b, l)| {
                let mut said = format!("{} on {uuid}", quantity::format_bytes(*b));
                if l > b {
                    said += &format!(" (limit {})", quantity::format_bytes(*l));
                }
                said
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(RequestError::UnequalClaimShares {
            shares: shares.chars().take(300).collect(),
        });
    }
    Ok(Some(ClaimShares {
        bytes,
        limit,
        uuids: per_gpu.into_iter().map(|(uuid, _, _)| uuid).collect(),
    }))
}
