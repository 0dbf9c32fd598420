//! The unit of the resource, its name, and device IDs (`<GPU-uuid>/<n>`).

use std::fmt;

use crate::quantity::{self, Quantity};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The smallest unit: below it an 80 GiB GPU would list over 640 devices and a node's
/// ListAndWatch message would grow towards gRPC's 4 MiB limit.
const MIN_UNIT: u64 = 128 * MIB;
/// kubelet's limit on a device ID (api.proto: "Max length of this field is 63 characters").
pub const MAX_DEVICE_ID_LEN: usize = 63;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    #[error("unit {value:?}: {reason}")]
    Invalid { value: String, reason: String },
}

/// The size of one unit of the resource, and the resource's name, which carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    bytes: u64,
    resource: String,
}

impl Unit {
    /// `1Gi` (the default), `2Gi`, `512Mi`: a whole number of MiB, at least 128 MiB.
    pub fn parse(value: &str) -> Result<Unit, UnitError> {
        let invalid = |reason: &str| UnitError::Invalid {
            value: value.chars().take(40).collect(),
            reason: reason.to_string(),
        };
        let bytes = match quantity::parse_quantity(value) {
            Ok(Quantity::Bytes(b)) => b,
            Ok(Quantity::PartsPerMillion(_)) => return Err(invalid("must be an amount such as 1Gi, not a share")),
            Err(e) => return Err(invalid(&e.to_string())),
        };
        if !bytes.is_multiple_of(MIB) {
            return Err(invalid("must be a whole number of MiB (1Gi, 512Mi)"));
        }
        if bytes < MIN_UNIT {
            return Err(invalid("must be at least 128Mi"));
        }
        // The name says the size: "gib" for 1 GiB, "2gib", "512mib".
        let suffix = match (bytes % GIB, bytes / GIB) {
            (0, 1) => "gib".to_string(),
            (0, n) => format!("{n}gib"),
            _ => format!("{}mib", bytes / MIB),
        };
        Ok(Unit {
            bytes,
            resource: format!("{}/gpu-memory-{suffix}", super::RESOURCE_DOMAIN),
        })
    }

    pub fn gib() -> Unit {
        Unit::parse("1Gi").expect("1Gi is a valid unit")
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// `vramgate.dev/gpu-memory-gib`.
    pub fn resource_name(&self) -> &str {
        &self.resource
    }

    /// The socket's file name in kubelet's directory: `vramgate-gpu-memory-gib.sock`.
    pub fn socket_name(&self) -> String {
        let name = self.resource.rsplit('/').next().unwrap_or(&self.resource);
        format!("vramgate-{name}.sock")
    }

    /// How many whole units `bytes` holds.
    pub fn units_in(&self, bytes: u64) -> u64 {
        bytes / self.bytes
    }

    /// `count` units as a size vramgate reads back exactly: `4Gi`, `1536Mi`.
    pub fn amount(&self, count: u64) -> String {
        let bytes = count.saturating_mul(self.bytes);
        if bytes.is_multiple_of(GIB) {
            format!("{}Gi", bytes / GIB)
        } else {
            format!("{}Mi", bytes / MIB)
        }
    }
}

/// One unit of one GPU: `<uuid>/<n>`. UUIDs may hold slashes (old MIG names such as
/// `MIG-GPU-…/1/2`), so the number is what follows the last one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub uuid: String,
    pub n: u32,
}

impl DeviceId {
    pub fn parse(id: &str) -> Option<DeviceId> {
        let (uuid, n) = id.rsplit_once('/')?;
        // Digits only: "+1" or " 1" would parse as numbers but are not IDs this plugin made.
        if uuid.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 9 {
            return None;
        }
        Some(DeviceId {
            uuid: uuid.to_string(),
            n: n.parse().ok()?,
        })
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.uuid, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_carries_the_size() {
        assert_eq!(Unit::gib().resource_name(), "vramgate.dev/gpu-memory-gib");
        assert_eq!(Unit::gib().socket_name(), "vramgate-gpu-memory-gib.sock");
        assert_eq!(
            Unit::parse("2Gi").unwrap().resource_name(),
            "vramgate.dev/gpu-memory-2gib"
        );
        assert_eq!(
            Unit::parse("512Mi").unwrap().resource_name(),
            "vramgate.dev/gpu-memory-512mib"
        );
        assert_eq!(
            Unit::parse("1536Mi").unwrap().resource_name(),
            "vramgate.dev/gpu-memory-1536mib"
        );
    }

    #[test]
    fn amounts_read_back_exactly() {
        assert_eq!(Unit::gib().amount(4), "4Gi");
        assert_eq!(Unit::parse("512Mi").unwrap().amount(3), "1536Mi");
        assert_eq!(Unit::parse("512Mi").unwrap().amount(4), "2Gi");
        let unit = Unit::parse("512Mi").unwrap();
        assert_eq!(
            quantity::parse_quantity(&unit.amount(3)).unwrap(),
            Quantity::Bytes(3 * 512 * MIB)
        );
        assert_eq!(Unit::gib().units_in(80 * GIB + 5), 80);
    }

    #[test]
    fn bad_units_name_the_value() {
        for (value, reason) in [
            ("25%", "not a share"),
            ("100Mi", "at least 128Mi"),
            ("1G", "whole number of MiB"),
            ("lots", "unit \"lots\""),
        ] {
            let err = Unit::parse(value).unwrap_err().to_string();
            assert!(err.contains(reason) && err.contains(value), "{value}: {err}");
        }
    }

    #[test]
    fn device_ids_name_the_gpu() {
        let id = DeviceId::parse("GPU-8a00c0de-0000/17").unwrap();
        assert_eq!((id.uuid.as_str(), id.n), ("GPU-8a00c0de-0000", 17));
        assert_eq!(id.to_string(), "GPU-8a00c0de-0000/17");
        assert_eq!(DeviceId::parse("MIG-GPU-abc/1/2/3").unwrap().uuid, "MIG-GPU-abc/1/2");
        for bad in ["GPU-1", "/3", "GPU-1/", "GPU-1/+3", "GPU-1/ 3", "GPU-1/99999999999"] {
            assert_eq!(DeviceId::parse(bad), None, "{bad}");
        }
    }
}
