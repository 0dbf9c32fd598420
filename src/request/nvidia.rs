//! NVIDIA's vocabulary for a container's memory: `NVIDIA_GPU_MEMORY_REQUEST` / `_LIMIT` (whole
//! MiB) and KAI's per-container annotations, read and checked against vramgate's own word
//! (see the module documentation of [`super`]).

use super::*;

/// NVIDIA's spelling of a container's request, read and checked ([`nvidia_memory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaMemory {
    /// The request in bytes: NVIDIA's request, or its limit when it gives no request.
    pub request: Quantity,
    /// The limit in bytes: NVIDIA's limit, or its request when it gives no limit.
    pub limit: Quantity,
    /// The keys and values it came from, as messages show them
    /// (`NVIDIA_GPU_MEMORY_LIMIT = "2048"`).
    pub described: String,
}

/// The name this container has in its pod, from its CRI runtime's annotation.
fn container_name(spec: &SpecView) -> Option<&str> {
    CRI_CONTAINER_NAME_ANNOTATIONS
        .iter()
        .find_map(|key| spec.annotations.get(*key))
        .map(String::as_str)
}

/// True when the spec's NVIDIA variables are vramgate-runtime's own: under `limit = "toolkit"`
/// it replaces them with the reservation's values for the toolkit's hook (and records the tier
/// in [`crate::tier::ENFORCEMENT_ANNOTATION`], which it removes from any spec that brings it),
/// so the hook that confirms must not read them back as the container's request.
fn nvidia_env_written_by_vramgate(spec: &SpecView) -> bool {
    // The wrapper writes the toolkit's variables only for a container it admitted on a request
    // in vramgate's words (its own, or NVIDIA's pinned as `vramgate.dev/memory`). A container
    // on the hook's path that brings the annotation itself but asks only in NVIDIA's words
    // still has its variables read as its request: the annotation never takes a request away.
    spec.annotations
        .get(crate::tier::ENFORCEMENT_ANNOTATION)
        .map(String::as_str)
        == Some(crate::tier::Tier::ToolkitLimit.as_str())
        && annotation_or_env(spec, MEMORY_ANNOTATION, MEMORY_ENV).is_some()
}

/// NVIDIA's request keys the spec sets for this container, `(key, value)`: KAI's annotations for
/// the container's name when there is one, else the two variables. Annotations win over the
/// environment as vramgate's own do (KAI injects the variables from the annotations, so a pod
/// normally carries both, with the same values).
pub(super) fn nvidia_sources(spec: &SpecView) -> impl Iterator<Item = (String, &str)> {
    let annotated: Vec<(String, &str)> = container_name(spec)
        .into_iter()
        .flat_map(|name| ["request", "limit"].map(|kind| format!("{NVIDIA_ANNOTATION_PREFIX}{name}.gpu-memory.{kind}")))
        .filter_map(|key| spec.annotations.get(&key).map(|v| (key, v.as_str())))
        .collect();
    let env: Vec<(String, &str)> = if nvidia_env_written_by_vramgate(spec) {
        Vec::new()
    } else {
        [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV]
            .into_iter()
            .filter_map(|key| spec.env(key).map(|v| (key.to_string(), v)))
            .collect()
    };
    if annotated.is_empty() { env } else { annotated }.into_iter()
}

/// One NVIDIA amount: whole MiB, a decimal integer, as the toolkit's hook parses it (Go's
/// `strconv.ParseUint(value, 10, 64)`: digits only, no sign, no unit, no spaces), and small
/// enough that its bytes fit in 64 bits.
fn parse_mib(key: &str, value: &str) -> Result<u64, RequestError> {
    let invalid = |reason: String| RequestError::Invalid {
        source_name: key.to_string(),
        value: value.chars().take(80).collect(),
        reason,
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            "NVIDIA's memory amounts are whole MiB, written as a decimal integer with no unit (1024 is 1 GiB)".into(),
        ));
    }
    match value.parse::<u64>() {
        Ok(mib) if mib <= MAX_NVIDIA_MIB => Ok(mib),
        _ => Err(invalid(format!(
            "is too large to be a memory amount (at most {MAX_NVIDIA_MIB} MiB)"
        ))),
    }
}

/// The request and limit NVIDIA's vocabulary makes for this container, `None` when it says
/// nothing. Either alone stands for both (a lone limit is reserved whole, which never
/// over-commits). A request above the limit is refused, as the toolkit's hook refuses it. A note is added when KAI's annotations
/// override variables that say something else.
pub fn nvidia_memory(spec: &SpecView, notes: &mut Vec<String>) -> Result<Option<NvidiaMemory>, RequestError> {
    let sources: Vec<(String, &str)> = nvidia_sources(spec).collect();
    if sources.is_empty() {
        return Ok(None);
    }
    let mut request = None;
    let mut limit = None;
    for (key, value) in &sources {
        let mib = parse_mib(key, value)?;
        if key.ends_with("request") || key == NVIDIA_REQUEST_ENV {
            request = Some((key.as_str(), *value, mib));
        } else {
            limit = Some((key.as_str(), *value, mib));
        }
    }
    if let (Some((req_key, req_value, req)), Some((lim_key, lim_value, lim))) = (request, limit) {
        if req > lim {
            return Err(RequestError::Invalid {
                source_name: req_key.to_string(),
                value: req_value.chars().take(80).collect(),
                reason: format!(
                    "is more than {lim_key} = {lim_value:?}: a request cannot exceed the limit (NVIDIA's hook refuses it too)"
                ),
            });
        }
    }
    let request_mib = request.or(limit).map_or(0, |(_, _, mib)| mib);
    let limit_mib = limit.or(request).map_or(0, |(_, _, mib)| mib);
    let mib = request_mib.max(limit_mib);
    let described = sources
        .iter()
        .map(|(key, value)| format!("{key} = {:?}", value.chars().take(40).collect::<String>()))
        .collect::<Vec<_>>()
        .join(", ");
    if mib == 0 {
        return Err(RequestError::Invalid {
            source_name: sources
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(" and "),
            value: sources.iter().map(|(_, v)| *v).collect::<Vec<_>>().join(", "),
            reason: "is zero: a request must be at least 1 MiB".into(),
        });
    }
    if sources[0].0.starts_with(NVIDIA_ANNOTATION_PREFIX) && !nvidia_env_written_by_vramgate(spec) {
        let env: Vec<String> = [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV]
            .into_iter()
            .filter_map(|key| {
                spec.env(key)
                    .map(|v| format!("{key}={:?}", v.chars().take(40).collect::<String>()))
            })
            .collect();
        let same = [NVIDIA_REQUEST_ENV, NVIDIA_LIMIT_ENV].into_iter().all(|key| {
            let kind = if key == NVIDIA_REQUEST_ENV { "request" } else { "limit" };
            let from_annotation = sources.iter().find(|(k, _)| k.ends_with(kind)).map(|(_, v)| *v);
            spec.env(key).is_none() || spec.env(key) == from_annotation
        });
        if !env.is_empty() && !same {
            notes.push(format!("annotations {described} override env {}", env.join(", ")));
        }
    }
    // A zero request beside a non-zero limit: the limit alone says anything, so it stands for
    // both rather than admit a container that reserves nothing.
    let request_mib = if request_mib == 0 { limit_mib } else { request_mib };
    Ok(Some(NvidiaMemory {
        request: Quantity::Bytes(request_mib << 20),
        limit: Quantity::Bytes(limit_mib << 20),
        described,
    }))
}
