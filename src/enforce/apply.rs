//! [`SpecEdits`] into a container spec, edited as an order-preserving JSON tree (serde_json
//! with `preserve_order`, as `runtime::spec_edit` does): every field vramgate does not own is
//! kept where it was. A spec of the wrong shape is an error naming the field, and is left
//! exactly as it was: every shape is checked before anything changes.

use serde_json::Value;

use super::{env_name, json_type, EnforceError, SpecEdits};
use crate::spec::array_at;

fn shape(field: impl Into<String>, found: Option<&Value>, expected: &'static str) -> EnforceError {
    EnforceError::SpecShape {
        field: field.into(),
        found: found.map_or("missing", json_type),
        expected,
    }
}

/// Sets `edits.env` in `process.env` (an entry of the same name is replaced in place, and
/// any duplicates of it removed, so the value is the one every reader sees) and appends
/// `edits.mounts` to `mounts` (a mount already there, identical, is not added twice).
/// Returns whether the spec changed.
pub fn apply_spec_edits(spec: &mut Value, edits: &SpecEdits) -> Result<bool, EnforceError> {
    let root = match spec {
        Value::Object(map) => map,
        other => return Err(shape("(top level)", Some(other), "an object")),
    };
    // Check first, change after.
    if !edits.env.is_empty() || !edits.unset.is_empty() {
        match root.get("process") {
            Some(Value::Object(process)) => match process.get("env") {
                None | Some(Value::Null) => {}
                Some(Value::Array(entries)) => {
                    if let Some((i, bad)) = entries.iter().enumerate().find(|(_, e)| !e.is_string()) {
                        return Err(shape(format!("process.env[{i}]"), Some(bad), "a string"));
                    }
                }
                other => return Err(shape("process.env", other, "an array")),
            },
            // A spec without a process cannot be created; inventing one would hide that.
            other => return Err(shape("process", other, "an object")),
        }
    }
    if !edits.mounts.is_empty() {
        match root.get("mounts") {
            None | Some(Value::Null) | Some(Value::Array(_)) => {}
            other => return Err(shape("mounts", other, "an array")),
        }
    }

    let mut changed = false;
    if !edits.env.is_empty() || !edits.unset.is_empty() {
        if let Some(env) = root
            .get_mut("process")
            .and_then(Value::as_object_mut)
            .and_then(|process| array_at(process, "env"))
        {
            let before = env.len();
            env.retain(|e| !e.as_str().is_some_and(|s| edits.unset.iter().any(|u| env_name(s) == u)));
            changed |= env.len() != before;
            for (name, value) in &edits.env {
                changed |= set_env(env, name, value);
            }
        }
    }
    if !edits.mounts.is_empty() {
        if let Some(mounts) = array_at(root, "mounts") {
            for mount in &edits.mounts {
                if !mounts.contains(mount) {
                    mounts.push(mount.clone());
                    changed = true;
                }
            }
        }
    }
    Ok(changed)
}

/// Sets `name=value` in an env list of strings; returns whether the list changed.
fn set_env(env: &mut Vec<Value>, name: &str, value: &str) -> bool {
    let entry = format!("{name}={value}");
    let same_name = |e: &Value| e.as_str().is_some_and(|s| env_name(s) == name);
    let Some(first) = env.iter().position(same_name) else {
        env.push(Value::String(entry));
        return true;
    };
    let mut changed = env[first].as_str() != Some(entry.as_str());
    env[first] = Value::String(entry);
    let before = env.len();
    let mut i = 0;
    env.retain(|e| {
        i += 1;
        i - 1 == first || !same_name(e)
    });
    changed |= env.len() != before;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Tier;
    use serde_json::json;

    fn edits(env: &[(&str, &str)], mounts: Vec<Value>) -> SpecEdits {
        SpecEdits {
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            unset: Vec::new(),
            mounts,
            tier: Tier::MpsLimit,
            notes: Vec::new(),
        }
    }

    #[test]
    fn env_replaced_in_place_duplicates_dropped_fields_kept_in_order() {
        let text = r#"{"ociVersion":"1.0.2","zeta":1,"process":{"args":["sh"],"env":["PATH=/bin","CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G","HOME=/","CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=200G"],"cwd":"/"},"mounts":[{"destination":"/proc","type":"proc","source":"proc"}],"alpha":18446744073709551615}"#;
        let mut spec: Value = serde_json::from_str(text).unwrap();
        let mount = json!({"destination": "/tmp/nvidia-mps", "type": "bind", "source": "/tmp/nvidia-mps", "options": ["rbind", "rw"]});
        let e = edits(
            &[
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=4096M"),
                ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
            ],
            vec![mount.clone()],
        );
        assert!(apply_spec_edits(&mut spec, &e).unwrap());
        assert_eq!(
            spec["process"]["env"],
            json!([
                "PATH=/bin",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M",
                "HOME=/",
                "TF_FORCE_GPU_ALLOW_GROWTH=true"
            ])
        );
        assert_eq!(spec["mounts"][1], mount);
        let once = serde_json::to_string(&spec).unwrap();
        assert!(
            once.starts_with(r#"{"ociVersion":"1.0.2","zeta":1,"process":{"args":["sh"],"env":"#),
            "{once}"
        );
        assert!(once.ends_with(r#","alpha":18446744073709551615}"#), "{once}");
        // Twice changes nothing.
        assert!(!apply_spec_edits(&mut spec, &e).unwrap());
        assert_eq!(serde_json::to_string(&spec).unwrap(), once);
    }

    #[test]
    fn missing_env_and_mounts_are_created() {
        let mut spec = json!({"process": {"args": ["sh"]}});
        let e = edits(&[("A", "1")], vec![json!({"destination": "/x"})]);
        assert!(apply_spec_edits(&mut spec, &e).unwrap());
        assert_eq!(spec["process"]["env"], json!(["A=1"]));
        assert_eq!(spec["mounts"], json!([{"destination": "/x"}]));
        let mut spec = json!({"process": {"env": null}, "mounts": null});
        assert!(apply_spec_edits(&mut spec, &e).unwrap());
        assert_eq!(spec["process"]["env"], json!(["A=1"]));
    }

    #[test]
    fn no_edits_touch_nothing_even_in_an_odd_spec() {
        let mut spec = json!({"process": 3, "mounts": "x"});
        assert!(!apply_spec_edits(&mut spec, &edits(&[], Vec::new())).unwrap());
        assert_eq!(spec, json!({"process": 3, "mounts": "x"}));
    }

    #[test]
    fn misshapen_specs_are_errors_and_left_as_they_were() {
        let e = edits(&[("A", "1")], vec![json!({"destination": "/x"})]);
        for (bad, field) in [
            (json!([]), "(top level)"),
            (json!({}), "process"),
            (json!({"process": []}), "process"),
            (json!({"process": {"env": "A=1"}}), "process.env"),
            (json!({"process": {"env": ["A=1", 7]}}), "process.env[1]"),
            (json!({"process": {"env": []}, "mounts": {}}), "mounts"),
        ] {
            let mut spec = bad.clone();
            let err = apply_spec_edits(&mut spec, &e).unwrap_err().to_string();
            assert!(err.contains(&format!("{field:?}")), "{bad} -> {err}");
            assert_eq!(spec, bad, "left as it was");
        }
    }
}
