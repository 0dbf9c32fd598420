//! Helm (scripts/fetch-helm's build) and vramgate's chart (charts/vramgate), for tests/it/helm.rs
//! and the tests that install the chart on the suite's one-node cluster: one place that finds
//! the binary, keeps Helm's own files out of the user's home, and turns a test's values into
//! the arguments `helm template`, `install`, `upgrade` and `uninstall` take.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The objects (kind and name) that install the DRA driver, in the chart with `driver: dra`
/// and in k8s/dra.yaml alike: the two ways to install it must install the same.
pub const DRA_DRIVER_OBJECTS: &[&str] = &[
    "DeviceClass gpu-memory.vramgate.dev",
    "ServiceAccount vramgate-dra",
    "ClusterRole vramgate-dra",
    "ClusterRoleBinding vramgate-dra",
    "ValidatingAdmissionPolicy vramgate-dra-slices",
    "ValidatingAdmissionPolicyBinding vramgate-dra-slices",
    "ValidatingAdmissionPolicy vramgate-dra-claim-status",
    "ValidatingAdmissionPolicyBinding vramgate-dra-claim-status",
    "DaemonSet vramgate-dra",
];

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// tests/support/check_manifests.py (Kubernetes 1.36's strict schemas) on `files`, with
/// Debian's python3 (python3-jsonschema and python3-yaml, scripts/install-deps); the schemas
/// from $VRAMGATE_K8S_SCHEMAS or their cache. For tests/it/manifests.rs and tests/it/helm.rs.
pub fn check_manifests(files: &[PathBuf]) -> Output {
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    Command::new(python)
        .arg(root().join("tests/support/check_manifests.py"))
        .args(files)
        .output()
        .unwrap()
}

/// The chart's directory.
pub fn chart() -> PathBuf {
    root().join("charts/vramgate")
}

/// The Kubernetes version the renders assume: the suite's cluster's (scripts/fetch-kubernetes)
/// and the schemas' (scripts/fetch-k8s-schemas), not Helm's own default (1.37 for Helm 3.22).
pub const KUBE_VERSION: &str = "1.36.3";

/// Where scripts/fetch-helm put the binary: $VRAMGATE_HELM, else the cache directory keyed by
/// the sha256 of tools/helm/go.mod, go.sum and the script, as the script computes it.
pub fn binary() -> PathBuf {
    let dir = match std::env::var_os("VRAMGATE_HELM") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let r = root();
            let out = Command::new("sh")
                .arg("-c")
                .arg("cat tools/helm/go.mod tools/helm/go.sum scripts/fetch-helm | sha256sum | cut -c1-16")
                .current_dir(&r)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "sha256sum: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let key = String::from_utf8(out.stdout).unwrap();
            PathBuf::from(format!("/var/cache/vramgate-tests/helm-{}", key.trim()))
        }
    };
    let binary = dir.join("bin/helm");
    assert!(
        binary.exists(),
        "{}: no Helm built from this checkout's tools/helm pins; run scripts/fetch-helm \
         (scripts/install-deps runs it)",
        binary.display()
    );
    binary
}

/// One release of the chart: its name, namespace and values (a JSON object, handed to Helm
/// as a values file, so that types are what the test wrote: `--set` would guess them).
pub struct Release {
    pub name: String,
    pub namespace: String,
    pub values: Value,
}

impl Release {
    /// Release `vramgate` in kube-system, as k8s/*.yaml are rendered, with `values`.
    pub fn new(values: Value) -> Release {
        Release {
            name: "vramgate".into(),
            namespace: "kube-system".into(),
            values,
        }
    }
}

/// The values for the suite's one-node cluster, which has no NVIDIA driver: no NVML library
/// to mount, the node image imported into the node's containerd beforehand (scripts/build-image,
/// `ctr -n k8s.io images import`) and never pulled, the pods on the node labelled
/// vramgate.dev/ready=true. `extra` is merged over them (a JSON object).
pub fn test_node_values(extra: Value) -> Value {
    let mut values = serde_json::json!({
        "nvmlLibrary": "",
        "image": {"pullPolicy": "Never"},
    });
    merge(&mut values, extra);
    values
}

/// `over` merged into `base`, objects key by key, anything else replaced: as Helm merges a
/// values file over the chart's.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (k, v) in over {
                merge(base.entry(k).or_insert(Value::Null), v);
            }
        }
        (base, over) => *base = over,
    }
}

/// Helm with its config, cache and data under a private directory (no repositories, no
/// plugins, nothing of the user's), removed when dropped.
pub struct Helm {
    pub binary: PathBuf,
    home: tempfile::TempDir,
}

impl Default for Helm {
    fn default() -> Self {
        Helm::new()
    }
}

impl Helm {
    pub fn new() -> Helm {
        Helm {
            binary: binary(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// `helm ARGS` with Helm's own files kept in the private directory.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        let home = self.home.path();
        command
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("KUBECONFIG");
        command
    }

    /// The release's values written where Helm reads them (`-f`).
    fn values_file(&self, release: &Release) -> PathBuf {
        let file = self.home.path().join(format!("values-{}.json", release.name));
        std::fs::write(&file, serde_json::to_vec_pretty(&release.values).unwrap()).unwrap();
        file
    }

    /// `helm template`: the release's objects as Helm would install them, `extra` appended
    /// (e.g. `--show-only templates/config.yaml`).
    pub fn template(&self, release: &Release, extra: &[&str]) -> Output {
        let values = self.values_file(release);
        self.command()
            .args(["template", &release.name])
            .arg(chart())
            .args(["--namespace", &release.namespace, "--kube-version", KUBE_VERSION, "-f"])
            .arg(values)
            .args(extra)
            .output()
            .unwrap()
    }

    /// `helm lint --strict` with the release's values.
    pub fn lint(&self, release: &Release) -> Output {
        let values = self.values_file(release);
        self.command()
            .args(["lint", "--strict"])
            .arg(chart())
            .args(["--namespace", &release.namespace, "--kube-version", KUBE_VERSION, "-f"])
            .arg(values)
            .output()
            .unwrap()
    }

    /// `helm upgrade --install` on the cluster of `kubeconfig`: installs the release, or
    /// upgrades it to these values, and waits (up to `timeout`, e.g. "120s") until its
    /// DaemonSets' pods are ready. The on-cluster test's install and upgrade.
    pub fn install(&self, kubeconfig: &Path, release: &Release, timeout: &str) -> Output {
        let values = self.values_file(release);
        self.command()
            .args(["upgrade", "--install", &release.name])
            .arg(chart())
            .args([
                "--namespace",
                &release.namespace,
                "--create-namespace",
                "--wait",
                "--timeout",
                timeout,
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("-f")
            .arg(values)
            .output()
            .unwrap()
    }

    /// `helm uninstall --wait`: deletes every object of the release and waits until they are gone.
    pub fn uninstall(&self, kubeconfig: &Path, release: &Release, timeout: &str) -> Output {
        self.command()
            .args([
                "uninstall",
                &release.name,
                "--namespace",
                &release.namespace,
                "--wait",
                "--timeout",
                timeout,
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .output()
            .unwrap()
    }

    /// `helm get manifest`: what the release made, for checking that uninstall removed it all.
    pub fn manifest(&self, kubeconfig: &Path, release: &Release) -> Output {
        self.command()
            .args(["get", "manifest", &release.name, "--namespace", &release.namespace])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .output()
            .unwrap()
    }
}

/// The objects of a `helm template` output: each document that has a kind, as JSON.
pub fn objects(rendered: &str) -> Vec<Value> {
    rendered
        .split("\n---")
        .filter_map(|doc| {
            let doc: Value = serde_saphyr::from_str(doc).ok()?;
            doc.get("kind")?;
            Some(doc)
        })
        .collect()
}

/// `kind name` of each object, as check_manifests.py names them.
pub fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}
