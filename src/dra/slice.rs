//! The node's ResourceSlice (`resource.k8s.io/v1`): one device per GPU of the view, whose
//! `memory` capacity claims share (`allowMultipleAllocations`), with the request policy that
//! makes every claim consume a whole number of steps.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::slice_view::{DraView, Published, RequestPolicy};
use super::{DRIVER, MEMORY_CAPACITY};

/// The API server's limit on a string attribute.
const MAX_STRING_ATTRIBUTE: usize = 64;

/// The longest object name the API server takes (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The slice's name: one per node and driver, so that publishing is create-or-replace of a
/// name known in advance, and a restarted driver finds its own slice: `<node>-<driver>`. A
/// node name may itself be up to 253 characters, and the driver's name would push the slice's
/// past the limit, so that the driver could never publish: then the node's name is cut, and
/// a hash of the whole of it (FNV-1a, 64 bits) keeps two long names that share a beginning
/// apart (`<node prefix>-<16 hex digits>-<driver>`, 253 characters).
pub fn slice_name(node: &str) -> String {
    let whole = format!("{node}-{DRIVER}");
    if whole.len() <= MAX_NAME {
        return whole;
    }
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!("-{hash:016x}-{DRIVER}");
    // A DNS subdomain's labels end in an alphanumeric: no '-' or '.' before the hash's '-'.
    let prefix = node[..MAX_NAME - suffix.len()].trim_end_matches(['-', '.']);
    format!("{prefix}{suffix}")
}

/// `bytes` as a Kubernetes quantity in the form the API server keeps: the largest binary
/// suffix that divides it (`79Gi`, `1536Mi`), else plain bytes.
pub fn quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [(&str, u32); 6] = [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (suffix, shift) in SUFFIXES {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return Quantity(format!("{}{suffix}", bytes >> shift));
        }
    }
    Quantity(bytes.to_string())
}

/// The `memory` capacity of a device with `capacity` bytes (a whole number of steps). The API
/// server's rules decide the shape: a range needs room for `min + step`; one step of room is
/// offered as the single valid value; no room at all is a capacity of 0 that no claim fits.
pub fn memory_capacity(capacity: u64, policy: &RequestPolicy) -> DeviceCapacity {
    let step = policy.step;
    let request_policy = if capacity >= 2 * step {
        Some(CapacityRequestPolicy {
            default: Some(quantity(policy.default.min(capacity))),
            valid_range: Some(CapacityRequestPolicyRange {
                min: quantity(step),
                max: Some(quantity(capacity)),
                step: Some(quantity(step)),
            }),
            valid_values: None,
        })
    } else if capacity >= step {
        Some(CapacityRequestPolicy {
            default: Some(quantity(step)),
            valid_range: None,
            valid_values: Some(vec![quantity(step)]),
        })
    } else {
        None
    };
    DeviceCapacity {
        request_policy,
        value: quantity(capacity),
    }
}

fn string(value: &str) -> DeviceAttribute {
    let mut value = value.to_string();
    if value.len() > MAX_STRING_ATTRIBUTE {
        let mut end = MAX_STRING_ATTRIBUTE;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
    }
    DeviceAttribute {
        string: Some(value),
        ..Default::default()
    }
}

fn int(value: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(value)),
        ..Default::default()
    }
}

fn device(d: &Published, policy: &RequestPolicy, binding_conditions: bool) -> Device {
    let mut attributes = BTreeMap::from([
        ("uuid".to_string(), string(&d.gpu.uuid)),
        ("index".to_string(), int(d.gpu.index)),
        (
            "mig".to_string(),
            DeviceAttribute {
                bool: Some(d.gpu.mig_index.is_some()),
                ..Default::default()
            },
        ),
    ]);
    if let Some(mig) = d.gpu.mig_index {
        attributes.insert("migIndex".into(), int(mig));
    }
    if let Some(product) = &d.product {
        attributes.insert("productName".into(), string(product));
    }
    if let Some(profile) = &d.mig_profile {
        attributes.insert("migProfile".into(), string(profile));
    }
    Device {
        name: d.name.clone(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([(
            MEMORY_CAPACITY.to_string(),
            memory_capacity(d.capacity, policy),
        )])),
        // The scheduler binds a pod to this node only once the driver has reserved its claim
        // here (`RESERVED_CONDITION` True in the claim's status), and sends it back to its
        // queue when the node cannot hold it (`UNAVAILABLE_CONDITION`): see super::claim_watch.
        // An API server without DRADeviceBindingConditions drops both, and nothing waits.
        binding_conditions: binding_conditions.then(|| vec![super::RESERVED_CONDITION.to_string()]),
        binding_failure_conditions: binding_conditions.then(|| vec![super::UNAVAILABLE_CONDITION.to_string()]),
        ..Default::default()
    }
}

/// The node's slice for `view`, at pool `generation`, owned by the Node (`node_uid`) so that it
/// goes with the node, where the node's UID is known. A device with less than one step of
/// room is left out: published with a capacity of 0 it would still take claims that name no
/// amount (they consume the whole capacity, 0, and fit), which the node could not prepare.
/// Claims already allocated on it are prepared all the same (prepare reads the driver's view).
pub fn build(view: &DraView, node: &str, node_uid: Option<&str>, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(
                view.devices
                    .iter()
                    .filter(|d| d.capacity >= view.policy.step)
                    .map(|d| device(d, &view.policy, view.binding_conditions))
                    .collect(),
            ),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    /// A node name of up to 253 characters still gives a slice name the API server takes:
    /// at most 253 characters, a DNS subdomain, the same on every start, distinct per node.
    #[test]
    fn a_long_node_name_gives_a_bounded_slice_name() {
        assert_eq!(slice_name("gpu-7"), "gpu-7-gpu-memory.vramgate.dev");
        let label = "a".repeat(62);
        let long = |end: &str| format!("{label}.{label}.{label}.{}{end}", "b".repeat(60 - end.len()));
        let (one, two) = (long("x-1"), long("x-2"));
        assert!(one.len() > 253 - "-gpu-memory.vramgate.dev".len(), "{}", one.len());
        let (a, b) = (slice_name(&one), slice_name(&two));
        for name in [&a, &b] {
            assert!(name.len() <= 253, "{} characters", name.len());
            assert!(name.ends_with("-gpu-memory.vramgate.dev"), "{name}");
            // kube-apiserver's IsDNS1123Subdomain: the length and the pattern (labels are not
            // held to 63 characters there).
            assert!(
                name.split('.').all(|l| !l.is_empty()
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')),
                "not a DNS subdomain: {name}"
            );
        }
        assert_ne!(a, b, "two nodes sharing a long prefix");
        assert_eq!(a, slice_name(&one), "stable across starts");
        // A cut that would end on a '.' or '-' does not.
        let dotted = format!("{}.{}", "c".repeat(211), "d".repeat(41));
        assert_eq!(dotted.len(), 253);
        assert!(!slice_name(&dotted).contains(".-") && !slice_name(&dotted).contains("--"));
    }

    #[test]
    fn quantities_in_the_form_the_api_server_keeps() {
        assert_eq!(quantity(79 * GI).0, "79Gi");
        assert_eq!(quantity(1536 * MI).0, "1536Mi");
        assert_eq!(quantity(0).0, "0");
        assert_eq!(quantity(1000).0, "1000");
    }

    #[test]
    fn the_policy_follows_the_room_on_the_gpu() {
        let policy = RequestPolicy::new(256 * MI, GI).unwrap();
        let ranged = memory_capacity(70 * GI, &policy);
        let json = serde_json::to_value(&ranged).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"value": "70Gi", "requestPolicy": {"default": "1Gi",
                "validRange": {"min": "256Mi", "max": "70Gi", "step": "256Mi"}}})
        );
        // Less room than the default: the default shrinks to what is there.
        let json = serde_json::to_value(memory_capacity(512 * MI, &policy)).unwrap();
        assert_eq!(json["requestPolicy"]["default"], "512Mi");
        let json = serde_json::to_value(memory_capacity(256 * MI, &policy)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"value": "256Mi", "requestPolicy": {"default": "256Mi", "validValues": ["256Mi"]}})
        );
        let json = serde_json::to_value(memory_capacity(0, &policy)).unwrap();
        assert_eq!(json, serde_json::json!({"value": "0"}));
    }
}
