//! A `resource.k8s.io/v1` ResourceClaim as the scheduler leaves it, reduced to what this node
//! must do: for each allocation result of this driver, the GPU device and the memory the claim
//! consumed there.

use serde::Deserialize;

use super::{DRIVER, MEMORY_CAPACITY};

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
    let results = claim
        .status
        .and_then(|s| s.allocation)
        .ok_or_else(|| ClaimError::NotAllocated {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?
        .devices
        .map(|d| d.results)
        .unwrap_or_default();
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
            Ok(Share {
                request: r.request,
                pool: r.pool,
                device: r.device,
                bytes,
                share_id: r.share_id,
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
            }]
        );
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
