//! Docker: the `vramgate` runtime in `/etc/docker/daemon.json`, edited as an order-preserving
//! JSON tree.

use super::*;

pub(super) fn plan_docker(options: &SetupOptions) -> Result<Plan> {
    let path = options
        .config_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(DOCKER_DAEMON_JSON));
    let current = read_optional(&path)?;
    let mut doc: Value = match &current {
        Some(bytes) if !bytes.iter().all(u8::is_ascii_whitespace) => {
            serde_json::from_slice(bytes).map_err(|e| SetupError::Parse {
                path: path.clone(),
                format: "JSON",
                message: e.to_string(),
            })?
        }
        _ => json!({}),
    };
    let shape = |what: &str| SetupError::Shape {
        path: path.clone(),
        what: what.to_string(),
    };
    let root = doc
        .as_object_mut()
        .ok_or_else(|| shape("the top level is not a JSON object"))?;
    if options.remove {
        if let Some(runtimes) = root.get_mut("runtimes").and_then(Value::as_object_mut) {
            runtimes.shift_remove(RUNTIME_NAME);
            if runtimes.is_empty() {
                root.shift_remove("runtimes");
            }
        }
        if root.get("default-runtime").and_then(Value::as_str) == Some(RUNTIME_NAME) {
            root.shift_remove("default-runtime");
        }
    } else {
        let runtimes = root.entry("runtimes").or_insert_with(|| json!({}));
        let runtimes = runtimes
            .as_object_mut()
            .ok_or_else(|| shape("\"runtimes\" is not a JSON object"))?;
        let entry = runtimes.entry(RUNTIME_NAME).or_insert_with(|| json!({}));
        let entry = entry
            .as_object_mut()
            .ok_or_else(|| shape("\"runtimes\".\"vramgate\" is not a JSON object"))?;
        // Keeps runtimeArgs or anything else an operator added to the entry.
        entry.insert("path".into(), json!(options.runtime_path.to_string_lossy()));
        if options.set_as_default {
            root.insert("default-runtime".into(), json!(RUNTIME_NAME));
        }
    }
    let wanted = if current.is_none() && doc.as_object().is_some_and(Map::is_empty) {
        None // --remove of a file setup never created
    } else {
        let mut text = serde_json::to_vec_pretty(&doc).expect("a Value serializes");
        text.push(b'\n');
        // Unchanged content keeps its own layout rather than being reformatted.
        match &current {
            Some(bytes) if serde_json::from_slice::<Value>(bytes).ok().as_ref() == Some(&doc) => Some(bytes.clone()),
            _ => Some(text),
        }
    };
    let mut plan = Plan::default();
    plan.want(&path, current, wanted, true, Owned::Settings);
    plan.next_steps.push(
        "reload dockerd so it reads the runtimes again (containers keep running): `systemctl reload docker` or `kill -HUP $(cat /var/run/docker.pid)`".into(),
    );
    if !options.remove {
        plan.next_steps.push(format!(
            "run GPU containers with `docker run --runtime {RUNTIME_NAME} -e VRAMGATE_MEMORY=6Gi -e NVIDIA_VISIBLE_DEVICES=0 ...`{}",
            if options.set_as_default { " (or without --runtime: it is the default)" } else { "" }
        ));
    }
    Ok(plan)
}
