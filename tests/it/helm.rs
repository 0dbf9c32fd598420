//! vramgate's Helm chart (charts/vramgate), driven with the Helm that scripts/fetch-helm builds:
//! `helm lint --strict`; every object of every combination of the main values valid for
//! Kubernetes 1.36 as the API server's strict field validation checks it
//! (tests/support/check_manifests.py); the values schema refusing a misspelt key or a bad
//! config value by name; the chart refusing the DRA driver beside the device plugin; the
//! config.toml the chart renders read by the built `vramgate`; k8s/*.yaml equal to the chart's
//! rendering; the packed chart carrying the package's version; `hostPaths` moving every mount
//! and flag. Installing, upgrading and uninstalling it on a real cluster is tests/kube_helm.rs.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::support::helm;

use helm::{chart, check_manifests, objects, root, Helm, Release};

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The values of one combination: which driver, the exporter, the watch, the config's source
/// and the RuntimeClass.
fn combination(driver: &str, exporter: bool, watch: bool, from_chart: bool, runtime_class: bool) -> Value {
    let mut values = json!({
        "dra": {"enabled": driver == "dra"},
        "devicePlugin": {"enabled": driver == "device-plugin"},
        "exporter": {"enabled": exporter},
        "watch": {"enabled": watch},
        "runtimeClass": {"create": runtime_class},
        "config": {"fromChart": from_chart},
    });
    if from_chart {
        values["config"]["settings"] = every_setting();
    }
    values
}

/// A value for every key of config.settings, none at its default.
fn every_setting() -> Value {
    json!({
        "headroom": "2Gi",
        "policy": "wait",
        "wait_timeout": "90s",
        "max_wait_timeout": "10m",
        "on_state_error": "fail-open",
        "queue": {
            "backfill": true,
            "backfill_bound": "45s",
            "backfill_order": "largest",
            "poll_interval": "250ms",
            "limit_overcommit": "20%"
        },
        "placement": {"strategy": "spread"},
        "runtime": {"runtimes": ["runc"], "hook_path": "/usr/local/bin/vramgate-hook"},
        "inventory": {
            "backend": "static",
            "nvml_library": "libnvidia-ml.so.1",
            "gpus": [
                {"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "total": "80Gi", "used_outside": "1Gi", "minor": 0},
                {"index": 1, "uuid": "GPU-66666666-7777-8888-9999-000000000000", "total": "40Gi"}
            ]
        },
        "enforce": {
            "limit": "mps",
            "mps_pipe_directory": "/run/mps",
            "mps_log_directory": "/var/log/mps",
            "mps_shm_directory": "/dev/shm",
            "mps_device_key": "ordinal",
            "cdi_spec_dirs": ["/etc/cdi"],
            "tensorflow_allow_growth": false,
            "jax_disable_preallocation": false,
            "jax_memory_fraction": false,
            "over_use": "kill",
            "over_use_margin": "5%",
            "over_use_interval": "2s"
        }
    })
}

#[test]
fn the_chart_passes_helm_lint_strict() {
    let helm = Helm::new();
    for values in [
        json!({}),
        combination("device-plugin", true, true, true, false),
        combination("none", false, true, false, true),
        helm::test_node_values(combination("dra", true, true, true, true)),
    ] {
        let out = helm.lint(&Release::new(values.clone()));
        let said = text(&out);
        assert!(out.status.success(), "{values}: {said}");
        assert!(
            said.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{values}: {said}"
        );
    }
}

#[test]
fn every_combination_of_the_main_values_renders_objects_valid_for_kubernetes_1_36() {
    let helm = Helm::new();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut expected = Vec::new();
    for driver in ["dra", "device-plugin", "none"] {
        for exporter in [false, true] {
            for watch in [false, true] {
                for from_chart in [false, true] {
                    for runtime_class in [false, true] {
                        let values = combination(driver, exporter, watch, from_chart, runtime_class);
                        let out = helm.template(&Release::new(values.clone()), &[]);
                        assert!(out.status.success(), "{values}: {}", text(&out));
                        let rendered = String::from_utf8(out.stdout).unwrap();
                        let mut want: Vec<&str> = Vec::new();
                        if driver == "dra" {
                            want.extend(helm::DRA_DRIVER_OBJECTS);
                        }
                        if driver == "device-plugin" {
                            want.push("DaemonSet vramgate-device-plugin");
                        }
                        if exporter {
                            want.push("DaemonSet vramgate-exporter");
                        }
                        if watch {
                            want.push("DaemonSet vramgate-watch");
                        }
                        if from_chart {
                            want.push("ConfigMap vramgate-config");
                        }
                        if runtime_class {
                            want.push("RuntimeClass vramgate");
                        }
                        let mut made = helm::names(&objects(&rendered));
                        made.sort();
                        want.sort();
                        assert_eq!(made, want, "{values}");
                        // With the config from the chart every pod reads the ConfigMap, and rolls
                        // when it changes; without, every pod reads the host's /etc/vramgate.
                        for ds in objects(&rendered).iter().filter(|o| o["kind"] == "DaemonSet") {
                            let pod = &ds["spec"]["template"];
                            let config = pod["spec"]["volumes"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .find(|v| v["name"] == "config")
                                .unwrap();
                            if from_chart {
                                assert_eq!(config["configMap"]["name"], "vramgate-config", "{values}");
                                assert!(
                                    pod["metadata"]["annotations"]["vramgate.dev/config-sha256"].is_string(),
                                    "{values}: {ds}"
                                );
                            } else {
                                assert_eq!(config["hostPath"]["path"], "/etc/vramgate", "{values}");
                            }
                        }
                        let file = dir.path().join(format!(
                            "{driver}-exporter_{exporter}-watch_{watch}-config_{from_chart}-rc_{runtime_class}.yaml"
                        ));
                        std::fs::write(&file, &rendered).unwrap();
                        files.push(file.clone());
                        expected.push((file, want));
                    }
                }
            }
        }
    }
    // None of the 48 renders is empty (driver "none" without the rest makes nothing; skip
    // such a file, as check_manifests.py refuses a file of no objects).
    let (checked, empty): (Vec<_>, Vec<_>) = expected.iter().partition(|(_, want)| !want.is_empty());
    assert_eq!(
        empty.len(),
        1,
        "only driver none, no exporter, watch, config or RuntimeClass makes nothing"
    );
    let out = check_manifests(&checked.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    for (file, want) in checked {
        for object in want {
            let line = format!("{}: {object} ok", file.display());
            assert!(stdout.lines().any(|l| l == line), "{line:?} not in: {stdout}");
        }
    }
    assert_eq!(files.len(), 48);
}

#[test]
fn a_misspelt_value_is_refused_by_the_schema_naming_it() {
    let helm = Helm::new();
    for (values, names) in [
        (json!({"exporterr": {"enabled": true}}), "exporterr"),
        (json!({"dra": {"stepp": "1Gi"}}), "stepp"),
        (json!({"image": {"pullPolicy": "Sometimes"}}), "pullPolicy"),
        (
            json!({"config": {"fromChart": true, "settings": {"polcy": "wait"}}}),
            "polcy",
        ),
        (
            json!({"config": {"fromChart": true, "settings": {"queue": {"backfil": true}}}}),
            "backfil",
        ),
    ] {
        let out = helm.template(&Release::new(values.clone()), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{values}: rendered: {}", text(&out));
        assert!(
            stderr.contains("values don't meet the specifications of the schema"),
            "{values}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("additional properties '{names}' not allowed"))
                || stderr.contains(&format!("/{names}': value must be one of")),
            "{values}: {stderr} should name {names}"
        );
        assert!(out.stdout.is_empty(), "{values}: {}", text(&out));
    }
}

#[test]
fn a_bad_config_value_is_refused_by_the_schema_naming_the_key() {
    let helm = Helm::new();
    for (settings, at, says) in [
        (
            json!({"policy": "queue"}),
            "/config/settings/policy",
            "value must be one of 'reject', 'wait'",
        ),
        (
            json!({"enforce": {"over_use": "stop"}}),
            "/config/settings/enforce/over_use",
            "value must be one of 'report', 'kill'",
        ),
        (
            json!({"placement": {"strategy": "worst-fit"}}),
            "/config/settings/placement/strategy",
            "value must be one of 'best-fit', 'spread'",
        ),
        (
            json!({"headroom": 2}),
            "/config/settings/headroom",
            "got number, want string",
        ),
    ] {
        let values = json!({"config": {"fromChart": true, "settings": settings}});
        let out = helm.template(&Release::new(values.clone()), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{values}: rendered: {}", text(&out));
        let line = format!("- at '{at}': {says}");
        assert!(
            stderr.lines().any(|l| l == line),
            "{values}: {stderr} should say {line:?}"
        );
    }
}

#[test]
fn the_dra_driver_beside_the_device_plugin_is_refused_with_the_charts_message() {
    let helm = Helm::new();
    let values = json!({"dra": {"enabled": true}, "devicePlugin": {"enabled": true}});
    let out = helm.template(&Release::new(values), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr.contains(
            "vramgate: dra.enabled and devicePlugin.enabled are both true: the DRA driver and the device \
             plugin would hand out the same GPU memory"
        ),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out));
}

/// `vramgate doctor --json --config FILE`: its checks by area.
fn doctor(config: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_vramgate"))
        .arg("--config")
        .arg(config)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    report["checks"].as_array().unwrap().clone()
}

#[test]
fn the_config_toml_rendered_from_values_is_read_by_the_built_vramgate() {
    let helm = Helm::new();
    let dir = tempfile::tempdir().unwrap();
    let values = json!({"config": {"fromChart": true, "settings": every_setting()}});
    let out = helm.template(&Release::new(values), &["--show-only", "templates/config.yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    let rendered = String::from_utf8(out.stdout).unwrap();
    let map = objects(&rendered).pop().unwrap();
    let toml = map["data"]["config.toml"].as_str().unwrap();
    let file = dir.path().join("config.toml");
    std::fs::write(&file, toml).unwrap();
    let checks = doctor(&file);
    let config = checks.iter().find(|c| c["area"] == "config").unwrap();
    assert_eq!(config["level"], "ok", "{toml}\n{checks:?}");
    assert_eq!(config["message"], format!("{} parses", file.display()), "{checks:?}");
    // The values took: doctor reads the two static GPUs, the MPS tier with the pipe directory
    // of the values, and the watch's kill.
    let message = |area: &str| {
        checks
            .iter()
            .find(|c| c["area"] == area)
            .unwrap_or_else(|| panic!("no {area} check: {checks:?}"))["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        message("inventory"),
        "backend static: static (2 GPUs from the config file)",
        "{toml}"
    );
    assert!(
        message("enforce").starts_with("limit = \"mps\", but no MPS control daemon serves /run/mps"),
        "{toml}\n{checks:?}"
    );
    assert!(
        message("watch").starts_with("[enforce] over_use = \"kill\""),
        "{toml}\n{checks:?}"
    );

    // The empty settings render a config of defaults, which it reads too.
    let out = helm.template(
        &Release::new(json!({"config": {"fromChart": true}})),
        &["--show-only", "templates/config.yaml"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let map = objects(&String::from_utf8(out.stdout).unwrap()).pop().unwrap();
    std::fs::write(&file, map["data"]["config.toml"].as_str().unwrap()).unwrap();
    let checks = doctor(&file);
    let config = checks.iter().find(|c| c["area"] == "config").unwrap();
    assert_eq!(config["level"], "ok", "{checks:?}");
}

#[test]
fn the_k8s_manifests_are_the_charts_rendering() {
    let helm = Helm::new();
    let out = Command::new(root().join("scripts/render-k8s"))
        .arg("--check")
        .env("VRAMGATE_HELM_BIN", &helm.binary)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    // And the check sees a difference: a hand edit of a rendered file is caught.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("repo");
    std::fs::create_dir_all(&copy).unwrap();
    let status = Command::new("cp")
        .args(["-a", "scripts", "charts", "k8s", "tools"])
        .arg(&copy)
        .current_dir(root())
        .status()
        .unwrap();
    assert!(status.success());
    let dra = copy.join("k8s/dra.yaml");
    let edited = std::fs::read_to_string(&dra)
        .unwrap()
        .replace("--step\", \"256Mi\"", "--step\", \"512Mi\"");
    std::fs::write(&dra, edited).unwrap();
    let out = Command::new(copy.join("scripts/render-k8s"))
        .arg("--check")
        .env("VRAMGATE_HELM_BIN", &helm.binary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("k8s/dra.yaml differ from the chart's rendering"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_charts_versions_are_the_packages_and_the_packed_chart_says_so() {
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap()).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart_yaml["version"], version, "charts/vramgate/Chart.yaml: version");
    assert_eq!(
        chart_yaml["appVersion"], version,
        "charts/vramgate/Chart.yaml: appVersion"
    );

    // scripts/package-chart, which scripts/package runs: the archive and its Chart.yaml.
    let helm = Helm::new();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(root().join("scripts/package-chart"))
        .arg(dir.path())
        .env("VRAMGATE_HELM_BIN", &helm.binary)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let archive = dir.path().join(format!("vramgate-{version}.tgz"));
    assert!(archive.exists(), "{}: {}", archive.display(), text(&out));
    let out = helm.command().args(["show", "chart"]).arg(&archive).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let packed: Value = serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(packed["appVersion"], version);
    assert_eq!(packed["version"], version);
    // The packed chart renders as the directory does.
    let out = helm
        .command()
        .args(["template", "vramgate"])
        .arg(&archive)
        .args(["--namespace", "kube-system", "--kube-version", helm::KUBE_VERSION])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert!(
        rendered.contains(&format!("image: registry.example/vramgate:{version}")),
        "{rendered}"
    );
}

#[test]
fn the_admission_policies_hold_the_releases_own_driver() {
    // Installed as release gpu in namespace vramgate-system, the driver runs as
    // gpu-vramgate-dra there: the policies must name that user, or its writes go unchecked.
    let helm = Helm::new();
    let release = Release {
        name: "gpu".into(),
        namespace: "vramgate-system".into(),
        values: json!({}),
    };
    let out = helm.template(&release, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let objects = objects(&String::from_utf8(out.stdout).unwrap());
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", helm::names(&objects)))
    };
    let account = find("ServiceAccount", "gpu-vramgate-dra");
    assert_eq!(account["metadata"]["namespace"], "vramgate-system");
    let daemonset = find("DaemonSet", "gpu-vramgate-dra");
    assert_eq!(daemonset["metadata"]["namespace"], "vramgate-system");
    assert_eq!(
        daemonset["spec"]["template"]["spec"]["serviceAccountName"],
        "gpu-vramgate-dra"
    );
    let binding = find("ClusterRoleBinding", "gpu-vramgate-dra");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gpu-vramgate-dra", "namespace": "vramgate-system"}])
    );
    assert_eq!(binding["roleRef"]["name"], "gpu-vramgate-dra");
    let user = "request.userInfo.username == 'system:serviceaccount:vramgate-system:gpu-vramgate-dra'";
    for policy in ["gpu-vramgate-dra-slices", "gpu-vramgate-dra-claim-status"] {
        let p = find("ValidatingAdmissionPolicy", policy);
        assert_eq!(p["spec"]["matchConditions"][0]["expression"], user, "{policy}");
        let b = find("ValidatingAdmissionPolicyBinding", policy);
        assert_eq!(b["spec"]["policyName"], policy);
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
    }
    // No object keeps the default release's user or namespace.
    let rendered = serde_json::to_string(&objects).unwrap();
    assert!(!rendered.contains("kube-system"), "{rendered}");
}

/// Only the DRA driver calls the API server, so only its pod gets a service account token:
/// every other pod (device plugin, exporter, watch, node set-up) sets
/// automountServiceAccountToken false, so that a token of the namespace's default account is
/// not mounted into privileged pods that never use it.
#[test]
fn only_the_dra_drivers_pod_mounts_a_service_account_token() {
    let helm = Helm::new();
    let mut seen = Vec::new();
    for driver in ["dra", "device-plugin"] {
        let mut values = combination(driver, true, true, false, true);
        values["nodeSetup"] = json!({"enabled": true});
        let (_, objects) = rendered_objects(&helm, &values);
        for ds in objects.iter().filter(|o| o["kind"] == "DaemonSet") {
            let name = ds["metadata"]["name"].as_str().unwrap().to_string();
            let pod = &ds["spec"]["template"]["spec"];
            if name == "vramgate-dra" {
                assert_eq!(pod["serviceAccountName"], "vramgate-dra", "{pod}");
                assert!(pod["automountServiceAccountToken"].is_null(), "{name}: {pod}");
            } else {
                assert_eq!(pod["automountServiceAccountToken"], false, "{name}: {pod}");
                assert!(pod["serviceAccountName"].is_null(), "{name}: {pod}");
            }
            seen.push(name);
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            "vramgate-device-plugin",
            "vramgate-dra",
            "vramgate-exporter",
            "vramgate-node-setup",
            "vramgate-watch"
        ],
        "every pod of the chart"
    );
}

#[test]
fn a_change_of_the_settings_changes_every_pods_template_so_an_upgrade_rolls_them() {
    // Kubernetes restarts a DaemonSet's pods only when their template changes; the ConfigMap
    // changing alone would leave the pods on the old settings (the device plugin and the
    // driver reread the file, the exporter and the watch read it once).
    let helm = Helm::new();
    let pods = |policy: &str| -> Vec<(String, Value)> {
        let values = json!({
            "dra": {"enabled": false},
            "devicePlugin": {"enabled": true},
            "exporter": {"enabled": true},
            "watch": {"enabled": true},
            "config": {"fromChart": true, "settings": {"policy": policy}},
        });
        let out = helm.template(&Release::new(values), &[]);
        assert!(out.status.success(), "{}", text(&out));
        objects(&String::from_utf8(out.stdout).unwrap())
            .into_iter()
            .filter(|o| o["kind"] == "DaemonSet")
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o["spec"]["template"].clone(),
                )
            })
            .collect()
    };
    let before = pods("reject");
    let after = pods("wait");
    assert_eq!(before.len(), 3, "{before:?}");
    for ((name, old), (_, new)) in before.iter().zip(&after) {
        let key = "vramgate.dev/config-sha256";
        assert_ne!(
            old["metadata"]["annotations"][key], new["metadata"]["annotations"][key],
            "{name}"
        );
        assert_eq!(old["spec"], new["spec"], "{name}: only the annotation differs");
    }
}

/// The chart's NOTES.txt as `helm install` would print it for `values`: Helm renders it only on
/// install, so the test renders a copy of the chart whose NOTES.txt is a named template, shown
/// by a probe template as one YAML string.
fn notes(helm: &Helm, values: Value) -> String {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("vramgate");
    let status = Command::new("cp").arg("-a").arg(chart()).arg(&copy).status().unwrap();
    assert!(status.success());
    let templates = copy.join("templates");
    let source = std::fs::read_to_string(templates.join("NOTES.txt")).unwrap();
    std::fs::remove_file(templates.join("NOTES.txt")).unwrap();
    std::fs::write(
        templates.join("_notes.tpl"),
        format!("{{{{- define \"vramgate.test.notes\" -}}}}\n{source}{{{{- end -}}}}\n"),
    )
    .unwrap();
    std::fs::write(
        templates.join("notes-probe.yaml"),
        "notes: {{ include \"vramgate.test.notes\" . | toJson }}\n",
    )
    .unwrap();
    let values_file = dir.path().join("values.json");
    std::fs::write(&values_file, values.to_string()).unwrap();
    let out = helm
        .command()
        .args(["template", "vramgate"])
        .arg(&copy)
        .args([
            "--namespace",
            "kube-system",
            "--show-only",
            "templates/notes-probe.yaml",
            "-f",
        ])
        .arg(&values_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let probe: Value = serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    probe["notes"].as_str().unwrap().to_string()
}

#[test]
fn the_notes_say_what_to_do_next() {
    let helm = Helm::new();
    let dra = notes(&helm, json!({}));
    for line in [
        "  2. the label: kubectl label node <node> vramgate.dev/ready=true",
        "  kubectl get runtimeclass vramgate",
        "  kubectl -n kube-system get daemonset vramgate-dra",
        "  kubectl get resourceslices --field-selector spec.driver=gpu-memory.vramgate.dev",
        "  a ResourceClaim of DeviceClass gpu-memory.vramgate.dev with capacity.requests.memory",
    ] {
        assert!(dra.lines().any(|l| l == line), "{line:?} not in:\n{dra}");
    }
    assert!(!dra.contains("configmap"), "{dra}");

    let plugin = notes(
        &helm,
        json!({"dra": {"enabled": false}, "devicePlugin": {"enabled": true}, "exporter": {"enabled": true}, "config": {"fromChart": true}}),
    );
    for line in [
        "  kubectl -n kube-system get daemonset vramgate-device-plugin",
        "  kubectl -n kube-system get pods -l app.kubernetes.io/name=vramgate-exporter -o wide",
        "    (metrics at http://<pod IP>:9835/metrics)",
        // The host's hook reads the host's file: the notes say how to put the chart's there.
        "     kubectl -n kube-system get configmap vramgate-config -o jsonpath='{.data.config\\.toml}' > /etc/vramgate/config.toml",
    ] {
        assert!(plugin.lines().any(|l| l == line), "{line:?} not in:\n{plugin}");
    }
    assert!(!plugin.contains("ResourceClaim"), "{plugin}");
}

/// The node set-up DaemonSet (`nodeSetup.enabled`), off by default: on, beside each driver,
/// every object valid for Kubernetes 1.36; the pod runs `vramgate setup-node` on the host's
/// root mounted at /host, with the host's PID namespace only for the signal restart, a grace
/// period for the undo, and the tolerations and node selection of the chart's other pods.
/// `helm template` with `values`, which must succeed: the text and its objects.
fn rendered_objects(helm: &Helm, values: &Value) -> (String, Vec<Value>) {
    let out = helm.template(&Release::new(values.clone()), &[]);
    assert!(out.status.success(), "{values}: {}", text(&out));
    let rendered = String::from_utf8(out.stdout).unwrap();
    let objects = objects(&rendered);
    (rendered, objects)
}

fn node_setup_daemonset<'a>(objects: &'a [Value], values: &Value) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "vramgate-node-setup")
        .unwrap_or_else(|| panic!("{values}: no node set-up DaemonSet in {objects:?}"))
}

#[test]
fn the_node_setup_daemonset_is_off_by_default_and_valid_when_on() {
    let helm = Helm::new();
    let dir = tempfile::tempdir().unwrap();
    let off = helm.template(&Release::new(json!({})), &[]);
    assert!(off.status.success(), "{}", text(&off));
    assert!(
        !helm::names(&objects(&String::from_utf8(off.stdout).unwrap()))
            .iter()
            .any(|n| n.contains("node-setup")),
        "the node set-up renders by default"
    );
    let mut files = Vec::new();
    for (driver, restart) in [("dra", "signal"), ("device-plugin", "none"), ("none", "signal")] {
        let mut values = combination(driver, false, false, false, true);
        values["nodeSetup"] = json!({"enabled": true, "restart": restart});
        let (rendered, objects) = rendered_objects(&helm, &values);
        let ds = node_setup_daemonset(&objects, &values);
        let pod = &ds["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(container["command"], json!(["/usr/bin/vramgate"]));
        assert_eq!(
            container["args"],
            json!([
                "setup-node",
                "--host-root",
                "/host",
                "--engine-config",
                "/etc/containerd/config.toml",
                "--engine-socket",
                "/run/containerd/containerd.sock",
                "--engine-tasks",
                "/run/containerd/io.containerd.runtime.v2.task",
                "--restart",
                restart,
                "--install-dir",
                "/usr/local/lib/vramgate",
                "--wait",
                "60"
            ]),
            "{values}"
        );
        // It reads the host's config.toml through the host root, as the host's hook reads it.
        assert_eq!(
            container["env"],
            json!([{"name": "VRAMGATE_CONFIG", "value": "/host/etc/vramgate/config.toml"}])
        );
        // The claims' CDI specs name the hook where the set-up copies it, not the package's.
        if driver == "dra" {
            let dra = objects
                .iter()
                .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "vramgate-dra")
                .expect("the DRA driver");
            let args = &dra["spec"]["template"]["spec"]["containers"][0]["args"];
            let hook = args
                .as_array()
                .and_then(|a| a.iter().position(|a| a == "--hook").map(|i| a[i + 1].clone()));
            assert_eq!(hook, Some(json!("/usr/local/lib/vramgate/vramgate-hook")), "{args}");
        }
        assert_eq!(container["securityContext"]["privileged"], true);
        assert_eq!(
            container["volumeMounts"],
            json!([{"name": "host", "mountPath": "/host"}])
        );
        assert_eq!(
            pod["volumes"],
            json!([{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}])
        );
        assert_eq!(
            pod["hostPID"].as_bool() == Some(true),
            restart == "signal",
            "{values}: {pod}"
        );
        assert_eq!(pod["terminationGracePeriodSeconds"], 150);
        assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(pod["nodeSelector"], json!({"vramgate.dev/ready": "true"}));
        for other in objects.iter().filter(|o| o["kind"] == "DaemonSet" && o != &ds) {
            assert_eq!(other["spec"]["template"]["spec"]["tolerations"], pod["tolerations"]);
        }
        let file = dir.path().join(format!("node-setup-{driver}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        files.push(file);
    }
    // With the config from the chart, the set-up installs the ConfigMap's config.toml where the
    // host's hook reads it (and reads that one itself), and rolls when the settings change.
    let mut values = combination("dra", false, false, true, true);
    values["nodeSetup"] = json!({"enabled": true, "installDir": "/opt/vramgate"});
    let (rendered, objects) = rendered_objects(&helm, &values);
    let ds = node_setup_daemonset(&objects, &values);
    let template = &ds["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let config_dir = values["hostPaths"]["config"]
        .as_str()
        .unwrap_or("/etc/vramgate")
        .to_string();
    for pair in [
        ["--install-dir", "/opt/vramgate"],
        ["--install-config", "/etc/vramgate-chart/config.toml"],
        ["--host-config", &format!("{config_dir}/config.toml")],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "{pair:?} not in {args:?}");
    }
    assert_eq!(
        container["env"],
        json!([{"name": "VRAMGATE_CONFIG", "value": "/etc/vramgate-chart/config.toml"}])
    );
    assert_eq!(
        container["volumeMounts"][1],
        json!({"name": "config", "mountPath": "/etc/vramgate-chart", "readOnly": true})
    );
    assert_eq!(
        template["spec"]["volumes"][1],
        json!({"name": "config", "configMap": {"name": "vramgate-config"}})
    );
    assert!(
        template["metadata"]["annotations"]["vramgate.dev/config-sha256"].is_string(),
        "{template}"
    );
    let file = dir.path().join("node-setup-from-chart.yaml");
    std::fs::write(&file, &rendered).unwrap();
    files.push(file);
    let out = check_manifests(&files);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for file in &files {
        let line = format!("{}: DaemonSet vramgate-node-setup ok", file.display());
        assert!(stdout.lines().any(|l| l == line), "{line:?} not in: {stdout}");
    }
    // The notes say what it changes on the host and how it restarts containerd.
    let said = notes(&helm, json!({"nodeSetup": {"enabled": true}}));
    for line in [
        "  1. nothing installed by hand: DaemonSet vramgate-node-setup (vramgate setup-node, privileged,",
        "     then restarts containerd once: SIGHUP to the process serving /run/containerd/containerd.sock, which ends it,",
        "     Deleting its pod (helm uninstall) undoes exactly that and restarts containerd once more;",
    ] {
        assert!(said.lines().any(|l| l == line), "{line:?} not in:\n{said}");
    }
    assert!(!said.contains("dpkg -i"), "{said}");
    let lint = helm.lint(&Release::new(json!({"nodeSetup": {"enabled": true}})));
    assert!(lint.status.success(), "{}", text(&lint));
    let misspelt = helm.template(
        &Release::new(json!({"nodeSetup": {"enabled": true, "restart": "systemd"}})),
        &[],
    );
    assert!(!misspelt.status.success());
    assert!(text(&misspelt).contains("/nodeSetup/restart"), "{}", text(&misspelt));
}

/// Host paths none of which is the default, as a k3s node with its own CDI directory and
/// kubelet root would have them.
fn moved_host_paths() -> Value {
    json!({
        "config": "/opt/vg/etc",
        "state": "/opt/vg/state",
        "containerdTasks": "/run/k3s/containerd/io.containerd.runtime.v2.task",
        "cdi": "/opt/vg/cdi",
        "cdiStatic": "/opt/vg/cdi-static",
        "kubeletPluginsRegistry": "/opt/kubelet/plugins_registry",
        "kubeletPlugins": "/opt/kubelet/plugins",
        "devicePlugins": "/opt/kubelet/device-plugins",
        "hook": "/opt/vg/bin/vramgate-hook",
    })
}

#[test]
fn host_paths_move_every_mount_and_tell_the_binaries() {
    // Every pod mounts each host path at the same path (the ledger and the bundles name host
    // paths), reads its config at the moved one, and the binaries get the moved directories
    // as flags: a default left anywhere would have a pod read another ledger or listen where
    // kubelet never looks.
    let helm = Helm::new();
    let moved = moved_host_paths();
    let allowed: Vec<&str> = moved
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        // /dev and NVML: not node layout but the GPU driver's, set by privileged and nvmlLibrary.
        .chain(["/dev", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"])
        .collect();
    for driver in ["dra", "device-plugin"] {
        let mut values = combination(driver, true, true, false, true);
        values["hostPaths"] = moved.clone();
        let out = helm.template(&Release::new(values), &[]);
        assert!(out.status.success(), "{}", text(&out));
        let daemonsets: Vec<Value> = objects(&String::from_utf8(out.stdout).unwrap())
            .into_iter()
            .filter(|o| o["kind"] == "DaemonSet")
            .collect();
        assert_eq!(daemonsets.len(), 3, "{driver}: {daemonsets:?}");
        for ds in &daemonsets {
            let name = ds["metadata"]["name"].as_str().unwrap();
            let spec = &ds["spec"]["template"]["spec"];
            let container = &spec["containers"][0];
            let mut paths = std::collections::BTreeMap::new();
            for volume in spec["volumes"].as_array().unwrap() {
                if let Some(path) = volume["hostPath"]["path"].as_str() {
                    assert!(allowed.contains(&path), "{name}: {path} is not a moved host path");
                    paths.insert(volume["name"].as_str().unwrap().to_string(), path.to_string());
                }
            }
            for mount in container["volumeMounts"].as_array().unwrap() {
                if let Some(path) = paths.get(mount["name"].as_str().unwrap()) {
                    assert_eq!(mount["mountPath"].as_str(), Some(path.as_str()), "{name}: {mount}");
                }
            }
            assert!(paths.values().any(|p| p == "/opt/vg/state"), "{name}: {paths:?}");
            assert!(paths.values().any(|p| p == "/opt/vg/etc"), "{name}: {paths:?}");
            let env = container["env"].as_array().unwrap();
            assert!(
                env.iter()
                    .any(|e| e["name"] == "VRAMGATE_CONFIG" && e["value"] == "/opt/vg/etc/config.toml"),
                "{name}: {env:?}"
            );
            let args: Vec<&str> = container["args"]
                .as_array()
                .map(|a| a.iter().map(|a| a.as_str().unwrap()).collect())
                .unwrap_or_default();
            let flag = |f: &str| args.iter().position(|a| *a == f).map(|i| args[i + 1]);
            if name.ends_with("-dra") {
                assert_eq!(
                    flag("--registry-dir"),
                    Some("/opt/kubelet/plugins_registry"),
                    "{args:?}"
                );
                assert_eq!(
                    flag("--plugin-dir"),
                    Some("/opt/kubelet/plugins/gpu-memory.vramgate.dev"),
                    "{args:?}"
                );
                assert_eq!(flag("--cdi-dir"), Some("/opt/vg/cdi"), "{args:?}");
                assert_eq!(flag("--hook"), Some("/opt/vg/bin/vramgate-hook"), "{args:?}");
            }
            if name.ends_with("-device-plugin") {
                assert_eq!(flag("--plugin-dir"), Some("/opt/kubelet/device-plugins"), "{args:?}");
            }
        }
    }
    // The chart's config.toml names the moved ledger (settings cannot: state_dir is not one).
    let mut values = combination("dra", false, false, true, true);
    values["hostPaths"] = moved.clone();
    let out = helm.template(&Release::new(values), &["--show-only", "templates/config.yaml"]);
    assert!(out.status.success(), "{}", text(&out));
    let config = objects(&String::from_utf8(out.stdout).unwrap())[0]["data"]["config.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(config.contains("\nstate_dir = \"/opt/vg/state\"\n"), "{config}");
    // A relative path is refused by the schema, naming the key.
    let mut values = combination("dra", false, false, false, true);
    values["hostPaths"] = moved;
    values["hostPaths"]["state"] = json!("run/vramgate");
    let out = helm.template(&Release::new(values), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("/hostPaths/state"), "{}", text(&out));
}
