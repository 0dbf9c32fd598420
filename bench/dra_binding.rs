//! Allocation to bind with and without binding conditions (bench/dra-binding.sh): on the
//! suite's one-node Kubernetes 1.36.3 (tests/support/cluster.rs), the built `vramgate-dra` as a
//! host process, PODS pods one after another, each with a claim of 1Gi from a template. Two
//! `kubectl get -w` streams (claims, pods) stamp when each claim is first seen allocated and
//! each pod first seen with its node: bind - allocation, per pod, with the driver's slice
//! carrying binding conditions (`--binding-conditions=true`, the default) and without.
//! A measurement, not a test: nothing is asserted beyond each pod running.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::BufReader;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::cluster::*;
use support::dra as dra_support;

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// Stamps, by pod name, when `kubectl get <what> -w` first shows `pod_of(object)` with `ready`.
fn stamp(
    c: &Cluster,
    what: &str,
    pod_of: fn(&Value) -> Option<String>,
    ready: fn(&Value) -> bool,
) -> (Seen, std::process::Child) {
    let mut child = c
        .kubectl(&["get", what, "-w", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let seen: Seen = Arc::default();
    let into = seen.clone();
    std::thread::spawn(move || {
        for object in serde_json::Deserializer::from_reader(BufReader::new(out)).into_iter::<Value>() {
            let Ok(object) = object else { return };
            let at = Instant::now();
            if let (Some(pod), true) = (pod_of(&object), ready(&object)) {
                into.lock().unwrap().entry(pod).or_insert(at);
            }
        }
    });
    (seen, child)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Per pod: allocation to bind, and allocation to the driver's `reserved` answer (ms).
fn run(c: &Cluster, binding_conditions: bool, pods: usize) -> Vec<(f64, Option<f64>)> {
    let flag = format!("--binding-conditions={binding_conditions}");
    let driver = start_dra_driver(c, &[&flag]);
    c.wait("the slice is published", POD_LIMIT, "vramgate-dra", || {
        let slices = c.get_json(&["resourceslices"]).unwrap_or_default();
        let ours = slices["items"].as_array().into_iter().flatten().any(|s| {
            s["spec"]["driver"] == dra_support::DRIVER
                && s["spec"]["devices"][0]["bindingConditions"].is_array() == binding_conditions
        });
        (ours, ())
    });
    c.apply(
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "bench-1gi", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu-memory.vramgate.dev", "count": 1,
                "capacity": {"requests": {"memory": "1Gi"}}}}]}}}})
        .to_string(),
    );
    let (allocated, mut claims) = stamp(
        c,
        "resourceclaims",
        |o| o["metadata"]["ownerReferences"][0]["name"].as_str().map(str::to_string),
        |o| o["status"]["allocation"].is_object(),
    );
    let (answered, mut answers) = stamp(
        c,
        "resourceclaims",
        |o| o["metadata"]["ownerReferences"][0]["name"].as_str().map(str::to_string),
        |o| {
            o["status"]["devices"].as_array().into_iter().flatten().any(|d| {
                d["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == vramgate::dra::RESERVED_CONDITION && c["status"] == "True")
            })
        },
    );
    let (bound, mut watch_pods) = stamp(
        c,
        "pods",
        |o| o["metadata"]["name"].as_str().map(str::to_string),
        |o| o["spec"]["nodeName"].is_string(),
    );
    let mut took = Vec::new();
    for i in 0..pods {
        let name = format!("bind-{binding_conditions}-{i}");
        c.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"restartPolicy": "Never", "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": false, "runtimeClassName": "vramgate",
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bench-1gi"}],
                    "containers": [{"name": "main", "image": support::cri::APP_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "sleep 600"], "resources": {"claims": [{"name": "gpu"}]}}]}})
            .to_string(),
        );
        let (a, b) = c.wait(&format!("pod {name} is bound"), POD_LIMIT, "kube-scheduler", || {
            let a = allocated.lock().unwrap().get(&name).copied();
            let b = bound.lock().unwrap().get(&name).copied();
            (a.is_some() && b.is_some(), (a, b))
        });
        let ms = b.unwrap().saturating_duration_since(a.unwrap()).as_secs_f64() * 1000.0;
        // The driver's own part: allocation to its answer in the claim's status.
        let answer = answered.lock().unwrap().get(&name).copied();
        let answer_ms = answer.map(|t| t.saturating_duration_since(a.unwrap()).as_secs_f64() * 1000.0);
        eprintln!("{name}: allocation -> bind {ms:.0} ms, allocation -> the driver's answer {answer_ms:?} ms");
        took.push((ms, answer_ms));
        wait_running(c, &name);
        c.kubectl_ok(&["delete", "pod", &name, "--wait=true", "--timeout=90s"]);
    }
    let _ = claims.kill();
    let _ = answers.kill();
    let _ = watch_pods.kill();
    c.kubectl_ok(&["delete", "resourceclaimtemplate", "bench-1gi"]);
    drop(driver);
    std::thread::sleep(Duration::from_secs(1));
    took
}

fn main() {
    // Re-run as the test node's tool (support::cluster::start_node).
    testnode::cli::run_if_requested();
    let pods: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let c = Cluster::start(&default_config_extra());
    let with = run(&c, true, pods);
    let without = run(&c, false, pods);
    let binds = |runs: &[(f64, Option<f64>)]| runs.iter().map(|r| r.0).collect::<Vec<f64>>();
    let answers: Vec<f64> = with.iter().filter_map(|r| r.1).collect();
    let show = |what: &str, v: Vec<f64>| {
        let (min, max) = (
            v.iter().cloned().fold(f64::MAX, f64::min),
            v.iter().cloned().fold(0.0, f64::max),
        );
        println!(
            "  {what:<44} median {:>6.0}  min {min:>6.0}  max {max:>6.0}",
            median(v.clone())
        );
    };
    println!("{pods} pods one after another, each with a 1Gi claim (ms, kubectl watch stamps):");
    show("allocation -> bind, with binding conditions", binds(&with));
    show("allocation -> bind, without", binds(&without));
    if !answers.is_empty() {
        show("allocation -> the driver's answer (with)", answers);
    }
    println!(
        "  extra at the median: {:.0} ms (target <= 200)",
        median(binds(&with)) - median(binds(&without))
    );
    let left = c.teardown();
    if !left.is_empty() {
        eprintln!("the cluster left on the host:\n  {}", left.join("\n  "));
        std::process::exit(1);
    }
}
