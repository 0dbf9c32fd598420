//! A `resource.k8s.io/v1` ResourceClaim as the scheduler leaves it, reduced to what this node
//! must do: for each allocation result of this driver, the GPU device and the memory the claim
//! consumed there, and the limit its opaque configuration asks for ([`CONFIG_KIND`]).

use serde::Deserialize;

use super::{DRIVER, MEMORY_CAPACITY};

/// The `apiVersion` and `kind` of this driver's opaque configuration (`parameters` of a
/// claim's `spec.devices.config[].opaque` naming this driver):
/// `{"apiVersion": "vramgate.dev/v1", "kind": "GpuMemoryConfig", "limit": "8Gi"}`.
pub const CONFIG_API_VERSION: &str = "vramgate.dev/v1";
pub const CONFIG_KIND: &str = "GpuMemoryConfig";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("claim {namespace}/{name}: not a ResourceClaim the API server would send ({reason})")]
    Shape {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("claim {namespace}/{name} has uid {found}, not {expected}: it was deleted and made again; kubelet will retry with the new one")]
    Replaced {
        namespace: String,
        name: String,
        expected: String,
        found: String,
    },
    #[error("claim {namespace}/{name} is not allocated yet")]
    NotAllocated { namespace: String, name: String },
    #[error("claim {namespace}/{name}: result for request {request:?} on device {device:?} has no consumedCapacity.memory; the device class must ask for memory (capacity.requests.memory) on a device published with allowMultipleAllocations")]
    NoMemory {
        namespace: String,
        name: String,
        request: String,
        device: String,
    },
    #[error("claim {namespace}/{name}: consumedCapacity.memory {value:?} of device {device:?}: {reason}")]
    BadQuantity {
        namespace: String,
        name: String,
        device: String,
        value: String,
        reason: String,
    },
    #[error(
        "claim {namespace}/{name}: the parameters of driver {DRIVER} in config[{index}] of its allocation: {reason}"
    )]
    Config {
        namespace: String,
        name: String,
        index: usize,
        reason: String,
    },
    #[error("claim {namespace}/{name}: limit {limit} (config[{index}] of its allocation) is below the {consumed} the claim consumed on device {device:?}; a limit is at least the request, or leave it out (limit = request)")]
    LimitBelowRequest {
        namespace: String,
        name: String,
        index: usize,
        device: String,
        limit: String,
        consumed: String,
    },
}

/// One allocation result of this driver: memory on one device of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub request: String,
    pub pool: String,
    pub device: String,
    /// What the scheduler counted against the device (rounded up by its request policy):
    /// what the node reserves, never the request itself.
    pub bytes: u64,
    pub share_id: Option<String>,
    /// What the claim's opaque configuration asks the container may reach (at least
    /// `bytes`); `None`: no limit asked, the limit is the request.
    pub limit: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Claim {
    metadata: Metadata,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    uid: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    allocation: Option<Allocation>,
}

#[derive(Deserialize)]
struct Allocation {
    #[serde(default)]
    devices: Option<Devices>,
}

#[derive(Deserialize)]
struct Devices {
    #[serde(default)]
    results: Vec<AllocationResult>,
    /// The class's and the claim's configuration, as the scheduler copied it, in order: a later
    /// entry wins over an earlier one (the claim's over the class's).
    #[serde(default)]
    config: Vec<AllocationConfig>,
}

#[derive(Deserialize)]
struct AllocationConfig {
    /// The requests it applies to; none: all of them.
    #[serde(default)]
    requests: Vec<String>,
    #[serde(default)]
    opaque: Option<Opaque>,
}

#[derive(Deserialize)]
struct Opaque {
    driver: String,
    #[serde(default)]
    parameters: serde_json::Value,
}

/// This driver's parameters. Unknown fields are refused: a misspelt `limit` must not pass
/// as no limit.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuMemoryConfig {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    limit: Option<String>,
}

impl AllocationConfig {
    fn applies_to(&self, request: &str) -> bool {
        // A subrequest's result names `<request>/<subrequest>`; config may name either.
        let parent = request.split_once('/').map_or(request, |(p, _)| p);
        self.requests.is_empty() || self.requests.iter().any(|r| r == request || r == parent)
    }
}

/// The limit in this driver's `parameters`, in bytes and as written (`None`: none asked), or why they are
/// not this driver's configuration.
fn limit_of(parameters: &serde_json::Value) -> Result<Option<(u64, String)>, String> {
    let object = parameters
        .as_object()
        .ok_or_else(|| format!("must be a JSON object {{\"apiVersion\": \"{CONFIG_API_VERSION}\", \"kind\": \"{CONFIG_KIND}\", \"limit\": \"8Gi\"}}"))?;
    let field = |key: &str| object.get(key).and_then(|v| v.as_str()).unwrap_or("");
    if field("apiVersion") != CONFIG_API_VERSION || field("kind") != CONFIG_KIND {
        return Err(format!(
            "apiVersion {} kind {}: this driver reads apiVersion {CONFIG_API_VERSION:?} kind {CONFIG_KIND:?}",
            object.get("apiVersion").cloned().unwrap_or(serde_json::Value::Null),
            object.get("kind").cloned().unwrap_or(serde_json::Value::Null),
        ));
    }
    let config: GpuMemoryConfig =
        serde_json::from_value(parameters.clone()).map_err(|e| crate::one_line(&e.to_string()))?;
    config
        .limit
        .map(|limit| match parse_quantity(&limit) {
            Ok(bytes) => Ok((bytes, limit)),
            Err(reason) => Err(format!("limit {limit:?}: {reason}")),
        })
        .transpose()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllocationResult {
    request: String,
    driver: String,
    pool: String,
    device: String,
    #[serde(rename = "shareID", default)]
    share_id: Option<String>,
    #[serde(default)]
    consumed_capacity: std::collections::BTreeMap<String, String>,
}

/// This driver's shares of the claim `json` (the API server's JSON of the object), which
/// kubelet asked to prepare as `namespace`/`name` with `uid`.
pub fn shares(json: &[u8], namespace: &str, name: &str, uid: &str) -> Result<Vec<Share>, ClaimError> {
    let claim: Claim = serde_json::from_slice(json).map_err(|e| ClaimError::Shape {
        namespace: namespace.to_string(),
        name: name.to_string(),
        reason: crate::one_line(&e.to_string()),
    })?;
    if claim.metadata.uid != uid {
        return Err(ClaimError::Replaced {
            namespace: namespace.to_string(),
            name: name.to_string(),
            expected: uid.to_string(),
            found: claim.metadata.uid,
        });
    }
    let devices = claim
        .status
        .and_then(|s| s.allocation)
        .ok_or_else(|| ClaimError::NotAllocated {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?
        .devices;
    let (results, config) = devices.map(|d| (d.results, d.config)).unwrap_or_default();
    // Every entry of this driver is checked, whether or not a result of it is here: a
    // mistake is said at the first prepare, not when a request it names appears.
    let mut limits = Vec::new();
    for (index, entry) in config.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == DRIVER) else {
            continue;
        };
        let limit = limit_of(&opaque.parameters).map_err(|reason| ClaimError::Config {
            namespace: namespace.to_string(),
            name: name.to_string(),
            index,
            reason,
        })?;
        limits.push((index, entry, limit));
    }
    results
        .into_iter()
        .filter(|r| r.driver == DRIVER)
        .map(|r| {
            let value = r
                .consumed_capacity
                .get(MEMORY_CAPACITY)
                .ok_or_else(|| ClaimError::NoMemory {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    request: r.request.clone(),
                    device: r.device.clone(),
                })?;
            let bytes = parse_quantity(value).map_err(|reason| ClaimError::BadQuantity {
                namespace: namespace.to_string(),
                name: name.to_string(),
                device: r.device.clone(),
                value: value.clone(),
                reason,
            })?;
            // The last entry that applies and says a limit wins.
            let asked = limits
                .iter()
                .rev()
                .find(|(_, entry, limit)| limit.is_some() && entry.applies_to(&r.request));
            let limit = match asked {
                Some((index, _, Some((limit, text)))) if *limit < bytes => {
                    return Err(ClaimError::LimitBelowRequest {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        index: *index,
                        device: r.device.clone(),
                        limit: text.clone(),
                        consumed: value.clone(),
                    })
                }
                Some((_, _, Some((limit, _)))) => Some(*limit),
                _ => None,
            };
            Ok(Share {
                request: r.request,
                pool: r.pool,
                device: r.device,
                bytes,
                share_id: r.share_id,
                limit,
            })
        })
        .collect()
}

/// A Kubernetes memory quantity in bytes, exactly: the forms vramgate's own parser reads
/// (`6Gi`, `6442450944`, `6G`, `6.5Gi`), which are the forms the API server writes for memory
/// it computed (it normalises to a binary or decimal suffix). A share (`%`) is not a quantity.
fn parse_quantity(value: &str) -> Result<u64, String> {
    match crate::quantity::parse_quantity(value) {
        Ok(crate::quantity::Quantity::Bytes(b)) => Ok(b),
        Ok(_) => Err("a share of a GPU is not a Kubernetes quantity".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim of docs/design/dra.md, as the scheduler leaves it, with a result of another
    /// driver beside ours.
    const CLAIM: &str = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
      "metadata":{"name":"trainer-gpu","namespace":"default","uid":"0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10"},
      "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu-memory.vramgate.dev","capacity":{"requests":{"memory":"6Gi"}}}}]}},
      "status":{"allocation":{"devices":{"results":[
        {"request":"gpu","driver":"gpu-memory.vramgate.dev","pool":"node-a","device":"gpu-1",
         "shareID":"9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60","consumedCapacity":{"memory":"6Gi"}},
        {"request":"nic","driver":"nic.example.com","pool":"node-a","device":"eth1"}]}}}}"#;
    const UID: &str = "0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10";

    #[test]
    fn this_drivers_results_with_the_memory_consumed() {
        let shares = shares(CLAIM.as_bytes(), "default", "trainer-gpu", UID).unwrap();
        assert_eq!(
            shares,
            [Share {
                request: "gpu".into(),
                pool: "node-a".into(),
                device: "gpu-1".into(),
                bytes: 6 << 30,
                share_id: Some("9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f60".into()),
                limit: None,
            }]
        );
    }

    /// The claim with `config` as the scheduler copies it into the allocation.
    fn configured(config: &str) -> String {
        CLAIM.replace(r#""results":["#, &format!(r#""config":{config},"results":["#))
    }

    #[test]
    fn a_limit_in_this_drivers_parameters_applies_to_the_requests_it_names() {
        let ours = |requests: &str, limit: &str| {
            format!(
                r#"{{"source":"FromClaim","requests":{requests},"opaque":{{"driver":"gpu-memory.vramgate.dev","parameters":{{"apiVersion":"vramgate.dev/v1","kind":"GpuMemoryConfig","limit":"{limit}"}}}}}}"#
            )
        };
        let other = r#"{"source":"FromClass","opaque":{"driver":"nic.example.com","parameters":{"anything":1}}}"#;
        let limit =
            |config: String| shares(configured(&config).as_bytes(), "default", "trainer-gpu", UID).map(|s| s[0].limit);
        assert_eq!(limit(format!("[{other}]")), Ok(None));
        assert_eq!(
            limit(format!(r#"[{other},{}]"#, ours("[\"gpu\"]", "8Gi"))),
            Ok(Some(8 << 30))
        );
        assert_eq!(limit(format!("[{}]", ours("[]", "6.5Gi"))), Ok(Some(6656 << 20)));
        assert_eq!(limit(format!("[{}]", ours("[\"other\"]", "8Gi"))), Ok(None));
        // The claim's entry comes after the class's, and wins.
        assert_eq!(
            limit(format!("[{},{}]", ours("[]", "10Gi"), ours("[\"gpu\"]", "7Gi"))),
            Ok(Some(7 << 30))
        );
        // Exactly the request is a limit too.
        assert_eq!(limit(format!("[{}]", ours("[]", "6Gi"))), Ok(Some(6 << 30)));
    }

    #[test]
    fn parameters_this_driver_cannot_read_fail_the_claim_in_one_line() {
        let with = |parameters: &str| {
            let config = format!(
                r#"[{{"source":"FromClaim","opaque":{{"driver":"gpu-memory.vramgate.dev","parameters":{parameters}}}}}]"#
            );
            shares(configured(&config).as_bytes(), "default", "trainer-gpu", UID)
                .unwrap_err()
                .to_string()
        };
        let cases = [
            (
                r#"{"apiVersion":"vramgate.dev/v2","kind":"GpuMemoryConfig","limit":"8Gi"}"#,
                r#"apiVersion "vramgate.dev/v2" kind "GpuMemoryConfig": this driver reads apiVersion "vramgate.dev/v1" kind "GpuMemoryConfig""#,
            ),
            (r#"{"limit":"8Gi"}"#, "apiVersion null kind null: this driver reads"),
            (
                r#"{"apiVersion":"vramgate.dev/v1","kind":"GpuMemoryConfig","limt":"8Gi"}"#,
                "unknown field `limt`, expected one of `apiVersion`, `kind`, `limit`",
            ),
            (
                r#"{"apiVersion":"vramgate.dev/v1","kind":"GpuMemoryConfig","limit":"8 gibibytes"}"#,
                r#"limit "8 gibibytes": "#,
            ),
            (
                r#"{"apiVersion":"vramgate.dev/v1","kind":"GpuMemoryConfig","limit":"50%"}"#,
                r#"limit "50%": a share of a GPU is not a Kubernetes quantity"#,
            ),
            (r#""8Gi""#, "must be a JSON object"),
            (
                r#"{"apiVersion":"vramgate.dev/v1","kind":"GpuMemoryConfig","limit":"4Gi"}"#,
                r#"limit 4Gi (config[0] of its allocation) is below the 6Gi the claim consumed on device "gpu-1""#,
            ),
        ];
        for (parameters, says) in cases {
            let error = with(parameters);
            assert!(error.starts_with("claim default/trainer-gpu: "), "{error}");
            assert!(error.contains(says), "{parameters}: {error:?} should say {says:?}");
            assert_eq!(error.lines().count(), 1, "{error}");
        }
    }

    #[test]
    fn what_the_node_cannot_prepare_is_said_in_one_line() {
        let err = shares(CLAIM.as_bytes(), "default", "trainer-gpu", "other-uid").unwrap_err();
        assert!(matches!(err, ClaimError::Replaced { .. }), "{err}");
        let pending = CLAIM.replace(r#""allocation""#, r#""unallocated""#);
        let err = shares(pending.as_bytes(), "default", "trainer-gpu", UID).unwrap_err();
        assert_eq!(err.to_string(), "claim default/trainer-gpu is not allocated yet");
        let no_memory = CLAIM.replace(r#""consumedCapacity":{"memory":"6Gi"}"#, r#""consumedCapacity":{}"#);
        let err = shares(no_memory.as_bytes(), "default", "trainer-gpu", UID).unwrap_err();
        assert!(err.to_string().contains("has no consumedCapacity.memory"), "{err}");
        let odd = CLAIM.replace(r#"{"memory":"6Gi"}"#, r#"{"memory":"6 gibibytes"}"#);
        let err = shares(odd.as_bytes(), "default", "trainer-gpu", UID).unwrap_err();
        assert!(
            err.to_string().contains("consumedCapacity.memory \"6 gibibytes\""),
            "{err}"
        );
        assert_eq!(err.to_string().lines().count(), 1);
        let err = shares(b"[1]", "default", "x", UID).unwrap_err();
        assert!(
            err.to_string().starts_with("claim default/x: not a ResourceClaim"),
            "{err}"
        );
    }
}
