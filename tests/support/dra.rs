//! What the DRA tests run the built `vramgate-dra` against: the stand-in API server
//! (tests/support/apiserver.py: the endpoints the driver and the scheduler use, every object
//! written validated against Kubernetes 1.36's strict OpenAPI schema of `resource.k8s.io/v1`
//! and the API server's own cross-field rules), the scheduler's part (Kubernetes' own
//! allocator, [`allocator`], deciding each claim from the slices the driver published, its
//! result written into the claim's status as kube-scheduler writes it), and the driver itself.
//!
//! `crate::support::dra`; it uses `crate::support`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use crate::support::*;

#[path = "allocator.rs"]
pub mod allocator;

pub const DRA: &str = env!("CARGO_BIN_EXE_vramgate-dra");
pub const DRIVER: &str = vramgate::dra::DRIVER;

/// The node the DRA tests' driver runs on, and its two GPUs of 16 GiB (static inventory).
pub const NODE: &str = "node-a";
pub const GPUS: &str = "[inventory]\nbackend = \"static\"\n\
    [[inventory.gpus]]\nindex = 0\nuuid = \"GPU-zero\"\ntotal = \"16Gi\"\n\
    [[inventory.gpus]]\nindex = 1\nuuid = \"GPU-one\"\ntotal = \"16Gi\"\n";

/// Adds `cdi_dir` to `[enforce] cdi_spec_dirs` of the config at `config`, where it is not
/// there yet: what an operator does for a driver run with another `--cdi-dir` (the driver
/// refuses to start otherwise, since the hook checks each claim's container against the specs
/// in those directories).
pub fn lists_cdi_dir(config: &Path, cdi_dir: &Path) {
    let text = std::fs::read_to_string(config).unwrap();
    let mut table: toml::Table = text.parse().unwrap();
    let enforce = table
        .entry("enforce")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .unwrap();
    let dirs = enforce
        .entry("cdi_spec_dirs")
        .or_insert_with(|| toml::Value::Array(Vec::new()))
        .as_array_mut()
        .unwrap();
    let dir = toml::Value::String(cdi_dir.display().to_string());
    if !dirs.contains(&dir) {
        dirs.push(dir);
        std::fs::write(config, toml::to_string(&table).unwrap()).unwrap();
    }
}

/// A directory that a scripts/ fetcher (run by scripts/install-deps) filled: `var` if set,
/// else `default`; the test fails, naming the script, when `marker` is not in it.
fn fetched(var: &str, default: &str, marker: &str, what: &str, script: &str) -> PathBuf {
    let dir = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        dir.join(marker).exists(),
        "{}: no {what}; run scripts/install-deps (or scripts/{script})",
        dir.display()
    );
    dir
}

/// Where scripts/fetch-k8s-schemas put the 1.36 schemas.
pub fn schemas_dir() -> PathBuf {
    fetched(
        "VRAMGATE_K8S_SCHEMAS",
        "/var/cache/vramgate-tests/k8s-json-schema-1.36",
        "_definitions.json",
        "Kubernetes JSON schemas",
        "fetch-k8s-schemas",
    )
}

/// Where scripts/fetch-cel-python put cel-python, with which the stand-in evaluates
/// k8s/dra.yaml's admission policy.
pub fn cel_python_dir() -> PathBuf {
    fetched(
        "VRAMGATE_CEL_PYTHON",
        "/var/cache/vramgate-tests/cel-python-0.5.0",
        ".complete",
        "cel-python",
        "fetch-cel-python",
    )
}

/// The driver's service account in k8s/dra.yaml, as the API server names its user.
pub const DRA_USER: &str = "system:serviceaccount:kube-system:vramgate-dra";

/// A bearer token the stand-in knows: its user, and the node of the pod its token is bound
/// to (the user extra `authentication.kubernetes.io/node-name`; "" for a token without it).
pub struct User<'a> {
    pub token: &'a str,
    pub username: &'a str,
    pub node: &'a str,
}

/// The stand-in API server, killed when dropped.
pub struct ApiServer {
    child: Child,
    pub url: String,
    /// The tests' own client: the admin token, a cluster admin to the stand-in.
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    /// Starts it for `nodes`, with a kubeconfig for it in `dir`.
    pub fn start(dir: &Path, nodes: &[&str]) -> ApiServer {
        ApiServer::launch(dir, nodes, false, &[])
    }

    /// Starts it with k8s/dra.yaml's admission policies evaluated on every ResourceSlice write
    /// and every update of a ResourceClaim's status, and `users`' tokens known (see
    /// [`ApiServer::kubeconfig_as`]).
    pub fn start_with_policy(dir: &Path, nodes: &[&str], users: &[User]) -> ApiServer {
        ApiServer::launch(dir, nodes, true, users)
    }

    fn launch(dir: &Path, nodes: &[&str], policy: bool, users: &[User]) -> ApiServer {
        // Debian's python3, which has python3-jsonschema (scripts/install-deps).
        let python = if Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut command = Command::new(python);
        command
            .arg(root.join("tests/support/apiserver.py"))
            .arg("--schemas")
            .arg(schemas_dir());
        for node in nodes {
            command.args(["--node", node]);
        }
        if policy {
            command
                .arg("--policy")
                .arg(root.join("k8s/dra.yaml"))
                .env("PYTHONPATH", cel_python_dir());
        }
        // The stand-in answers no request without a token (401): the tests' own client has
        // one of its own, unguessable by anything else on the host.
        let admin = admin_token();
        command.args(["--admin-token", &admin]);
        for user in users {
            command.args(["--user", user.token, user.username, user.node]);
        }
        let log = std::fs::File::create(dir.join("apiserver.log")).unwrap();
        let mut child = command.stdout(Stdio::piped()).stderr(log).spawn().unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| {
                panic!(
                    "the stand-in API server did not start: {first:?}; {}",
                    std::fs::read_to_string(dir.join("apiserver.log")).unwrap_or_default()
                )
            })
            .to_string();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(&url, &format!("{{token: {admin}}}"))).unwrap();
        ApiServer { child, url, kubeconfig }
    }

    /// A kubeconfig beside [`ApiServer::kubeconfig`] that calls as the user of `token` (one
    /// of those it was started with, or any other, which it answers with 401).
    pub fn kubeconfig_as(&self, token: &str) -> PathBuf {
        let path = self.kubeconfig.with_file_name(format!("kubeconfig-{token}"));
        std::fs::write(&path, kubeconfig_text(&self.url, &format!("{{token: {token}}}"))).unwrap();
        path
    }

    pub async fn client(&self) -> kube::Client {
        let file = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    async fn get_json(&self, path: &str) -> Value {
        let request = http::Request::get(path).body(Vec::new()).unwrap();
        let text = self.client().await.request_text(request).await.unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// `items` of a list at `path`.
    async fn list_json(&self, path: &str) -> Vec<Value> {
        let list = self.get_json(path).await;
        crate::support::array_field(&list, "items").clone()
    }

    /// Every write the API server accepted, in order (`method`, `path`, `name`, `time_ns`).
    pub async fn writes(&self) -> Vec<Value> {
        self.get_json("/_writes").await.as_array().unwrap().clone()
    }

    /// Every write it rejected, with the reason: the driver's must be none. A conflict of two
    /// writers (409, the claim's resourceVersion moved between read and write) is not counted:
    /// the driver's claim watcher and its prepare both write a claim's status, and the one
    /// that loses reads the claim again and retries, which the final status each test asserts
    /// shows. A conflict the test asked for (`refuse`) is counted.
    pub async fn rejected(&self) -> Vec<Value> {
        let all = self.get_json("/_rejected").await.as_array().unwrap().clone();
        all.into_iter()
            .filter(|r| {
                let message = r["message"].as_str().unwrap_or_default();
                !(r["code"] == 409 && message.contains("the object has been modified") && !message.contains("injected"))
            })
            .collect()
    }

    /// The next `count` writes of `method` whose path ends with `suffix` are answered with
    /// `code` (409: a Conflict; else an InternalError), as a busy or failing API server does.
    pub async fn refuse(&self, method: &str, suffix: &str, code: u16, count: u32) {
        let body = json!({"method": method, "suffix": suffix, "code": code, "count": count});
        let request = http::Request::post("/_refuse")
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        self.client().await.request_text(request).await.unwrap();
    }

    /// The node's slice of this driver, if there is one.
    pub async fn slice(&self, node: &str) -> Option<ResourceSlice> {
        let api: Api<ResourceSlice> = Api::all(self.client().await);
        api.get_opt(&vramgate::dra::slice::slice_name(node)).await.unwrap()
    }

    /// `capacity.memory.value` of each device of the node's slice, by device name, sorted by
    /// name (the slice lists them in ascending order of capacity: [`ApiServer::device_order`]).
    pub async fn capacities(&self, node: &str) -> Vec<(String, String)> {
        let Some(slice) = self.slice(node).await else {
            return Vec::new();
        };
        let mut capacities: Vec<(String, String)> = slice
            .spec
            .devices
            .expect("the slice has no field \"devices\"")
            .into_iter()
            .map(|d| {
                let value = d
                    .capacity
                    .as_ref()
                    .and_then(|c| c.get("memory"))
                    .map(|c| c.value.0.clone())
                    .unwrap_or_else(|| panic!("device {} of the slice has no capacity \"memory\"", d.name));
                (d.name, value)
            })
            .collect();
        capacities.sort();
        capacities
    }

    /// The names of the devices of the node's slice, in the slice's order.
    pub async fn device_order(&self, node: &str) -> Vec<String> {
        let Some(slice) = self.slice(node).await else {
            return Vec::new();
        };
        slice
            .spec
            .devices
            .expect("the slice has no field \"devices\"")
            .into_iter()
            .map(|d| d.name)
            .collect()
    }

    /// A claim for `memory` of one GPU, as a user (or a template) creates it; returns its uid.
    pub async fn create_claim(&self, namespace: &str, name: &str, memory: &str) -> String {
        self.create_claim_with(namespace, name, memory, json!([])).await
    }

    /// [`ApiServer::create_claim`] with `config` as its `spec.devices.config`.
    pub async fn create_claim_with(&self, namespace: &str, name: &str, memory: &str, config: Value) -> String {
        let request = json!({"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}});
        self.create_claim_spec(namespace, name, json!({"requests": [request], "config": config}))
            .await
    }

    /// [`ApiServer::create_claim`] for the GPU of `index`: a CEL selector on the attribute
    /// the driver publishes, as a user picks a GPU.
    pub async fn create_claim_on(&self, namespace: &str, name: &str, memory: &str, index: u32) -> String {
        self.create_claim_spec(
            namespace,
            name,
            json!({"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}},
            "selectors": [{"cel": {"expression":
                format!("device.attributes[\"{DRIVER}\"].index == {index}")}}]}}]}),
        )
        .await
    }

    /// A claim with `devices` as its `spec.devices`; returns its uid.
    pub async fn create_claim_spec(&self, namespace: &str, name: &str, devices: Value) -> String {
        let api: Api<ResourceClaim> = Api::namespaced(self.client().await, namespace);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": devices}
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &claim).await.unwrap();
        created.metadata.uid.unwrap()
    }

    /// Deletes claim `namespace`/`name`, as its pod's deletion has the garbage collector do:
    /// what lets the driver release the claim's own reservation.
    pub async fn delete_claim(&self, namespace: &str, name: &str) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client().await, namespace);
        api.delete(name, &Default::default()).await.unwrap();
    }

    /// The claim's `status.devices` as stored (empty when it has none: Kubernetes omits an
    /// empty list). Its absence counts only where `status` holds nothing but the fields the
    /// scheduler and kubelet write: a status under another name fails here, naming it, instead
    /// of reading as "no status".
    pub async fn device_status(&self, namespace: &str, name: &str) -> Vec<Value> {
        let claim = self
            .get_json(&format!(
                "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
            ))
            .await;
        let status = crate::support::field(&claim, "status");
        let known = ["allocation", "reservedFor", "devices"];
        let fields = status
            .as_object()
            .unwrap_or_else(|| panic!("the field \"status\" is not an object in {claim}"));
        for key in fields.keys() {
            assert!(
                known.contains(&key.as_str()),
                "the claim's status has an unknown field {key:?}: {status}"
            );
        }
        match status.get("devices") {
            None => Vec::new(),
            Some(_) => crate::support::array_field(status, "devices").clone(),
        }
    }

    /// kube-scheduler places the claims `names` (of `namespace`) on `node`, one after another:
    /// Kubernetes' allocator ([`allocator::allocate`]) decides each from every ResourceSlice
    /// the API server has, k8s/dra.yaml's DeviceClass and every claim allocated already, and
    /// each allocation is written into its claim's `status.allocation`, as the scheduler's
    /// PreBind writes it (the claim as stored, read again, with the allocation set). Returns
    /// the decisions, in order.
    pub async fn schedule(&self, namespace: &str, names: &[&str], node: &str) -> Vec<allocator::Decision> {
        let slices = self.list_json("/apis/resource.k8s.io/v1/resourceslices").await;
        let claims = self.list_json("/apis/resource.k8s.io/v1/resourceclaims").await;
        let allocated: Vec<Value> = claims
            .iter()
            .filter(|c| !c["status"]["allocation"].is_null())
            .cloned()
            .collect();
        let wanted: Vec<Value> = names
            .iter()
            .map(|name| {
                claims
                    .iter()
                    .find(|c| c["metadata"]["namespace"] == namespace && c["metadata"]["name"] == *name)
                    .unwrap_or_else(|| panic!("no claim {namespace}/{name} to schedule"))
                    .clone()
            })
            .collect();
        let decisions = allocator::allocate(node, &slices, &allocated, &wanted);
        for (name, decision) in names.iter().zip(&decisions) {
            if let Ok(allocation) = decision {
                let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
                let mut claim = self.get_json(&path).await;
                claim["status"]["allocation"] = allocation.clone();
                let request = http::Request::put(format!("{path}/status"))
                    .header("Content-Type", "application/json")
                    .body(serde_json::to_vec(&claim).unwrap())
                    .unwrap();
                self.client().await.request_text(request).await.unwrap();
            }
        }
        decisions
    }

    /// [`ApiServer::schedule`] of one claim that must fit: its allocation.
    pub async fn schedule_one(&self, namespace: &str, name: &str, node: &str) -> Value {
        let decision = self.schedule(namespace, &[name], node).await.remove(0);
        decision.unwrap_or_else(|why| panic!("the allocator did not place claim {namespace}/{name}: {why}"))
    }

    /// An allocation written by hand, for the results the allocator never produces and the
    /// node must refuse (another node's pool, a device the node has not, ...): `consumed` of
    /// `device` in the node's pool, with a share ID, and the node selector of the node; the
    /// claim's `spec.devices.config` is copied into the allocation (`source: FromClaim`), as
    /// the scheduler copies it for the drivers. Every claim the scheduler could produce goes
    /// through [`ApiServer::schedule`].
    pub async fn allocate_by_hand(&self, namespace: &str, name: &str, node: &str, results: &[(&str, &str)]) {
        let api: Api<ResourceClaim> = Api::namespaced(self.client().await, namespace);
        let mut claim = api.get(name).await.unwrap();
        let results: Vec<Value> = results
            .iter()
            .enumerate()
            .map(|(n, (device, consumed))| {
                json!({"request": "gpu", "driver": DRIVER, "pool": node, "device": device,
                    "shareID": format!("9a0c6a1e-5e2b-4c7f-8d3a-1b2c3d4e5f{n:02}"),
                    "consumedCapacity": {"memory": consumed}})
            })
            .collect();
        let config: Vec<Value> = serde_json::to_value(&claim.spec.devices).unwrap()["config"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let mut c = c.clone();
                c["source"] = json!("FromClaim");
                c
            })
            .collect();
        claim.status = Some(
            serde_json::from_value(json!({"allocation": {
                "devices": {"results": results, "config": config},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}))
            .unwrap(),
        );
        api.replace_status(name, &PostParams::default(), &claim).await.unwrap();
    }
}

/// 128 random bits, hex: the stand-in's admin token for one test.
fn admin_token() -> String {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kubeconfig_text(url: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {url}\n\
         users:\n- name: standin\n  user: {user}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n\
         current-context: standin\n"
    )
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a driver has to end after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The built driver, stopped (SIGTERM) when dropped.
pub struct Driver {
    pub child: Child,
    pub registry_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub log: PathBuf,
}

/// What a node gives the driver before it starts: the state directory (tmpfiles makes it at
/// boot; the driver never makes it itself), and a config that lists `cdi_dir`
/// ([`lists_cdi_dir`]).
fn prepare_node(config: &Path, cdi_dir: &Path) {
    let state_dir = vramgate::config::Config::load_from(config).unwrap().state_dir;
    vramgate::ledger::StateDir::open_or_create(&state_dir).unwrap();
    lists_cdi_dir(config, cdi_dir);
}

impl Driver {
    /// Starts `vramgate-dra` for `node` with the testbed's config, kubelet's directories under
    /// `dir`, and `cdi_dir` as the runtime's CDI directory; returns once its registration
    /// socket is there.
    pub fn start(dir: &Path, config: &Path, api: &ApiServer, node: &str, cdi_dir: &Path, extra: &[&str]) -> Driver {
        Driver::start_as(dir, config, &api.kubeconfig, node, cdi_dir, extra)
    }

    /// [`Driver::start`] with `kubeconfig`'s identity (e.g. [`ApiServer::kubeconfig_as`]).
    pub fn start_as(
        dir: &Path,
        config: &Path,
        kubeconfig: &Path,
        node: &str,
        cdi_dir: &Path,
        extra: &[&str],
    ) -> Driver {
        prepare_node(config, cdi_dir);
        Driver::spawn(dir, config, kubeconfig, node, cdi_dir, extra).registered()
    }

    /// The driver as [`Driver::start`] runs it, with `kubeconfig`, reading nothing itself (not
    /// even the config, which must list `cdi_dir` already: [`lists_cdi_dir`]) and waiting for
    /// nothing.
    pub fn spawn(dir: &Path, config: &Path, kubeconfig: &Path, node: &str, cdi_dir: &Path, extra: &[&str]) -> Driver {
        Driver::spawn_command(Command::new(DRA), dir, config, kubeconfig, node, cdi_dir, extra)
    }

    /// [`Driver::start`] with cgroup v2 at /sys/fs/cgroup ([`in_cgroup_v2`]), as on a GPU
    /// host: where the driver limit's figures for a container's cgroup are read.
    pub fn start_in_cgroup_v2(
        dir: &Path,
        config: &Path,
        api: &ApiServer,
        node: &str,
        cdi_dir: &Path,
        extra: &[&str],
    ) -> Driver {
        prepare_node(config, cdi_dir);
        let command = in_cgroup_v2(Path::new(DRA), &[]);
        Driver::spawn_command(command, dir, config, &api.kubeconfig, node, cdi_dir, extra).registered()
    }

    /// The driver once its registration socket is there; fails the test if it exits first.
    fn registered(mut self) -> Driver {
        let socket = self.registration_socket();
        wait_until("the driver's registration socket", Duration::from_secs(20), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("vramgate-dra exited ({status}): {}", self.log_text());
            }
            (socket.exists(), self.log_text())
        });
        self
    }

    fn spawn_command(
        mut command: Command,
        dir: &Path,
        config: &Path,
        kubeconfig: &Path,
        node: &str,
        cdi_dir: &Path,
        extra: &[&str],
    ) -> Driver {
        let registry_dir = dir.join("kubelet/plugins_registry");
        let plugin_dir = dir.join(format!("kubelet/plugins/{DRIVER}"));
        std::fs::create_dir_all(&registry_dir).unwrap();
        // Appended to, so that a restarted driver's lines follow the first one's.
        let log = dir.join("vramgate-dra.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = command
            .arg("--config")
            .arg(config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--registry-dir")
            .arg(&registry_dir)
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--cdi-dir")
            .arg(cdi_dir)
            .args(["--poll-interval", "100ms"])
            .arg("--hook")
            .arg(HOOK)
            .args(extra)
            .env("NODE_NAME", node)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        Driver {
            child,
            registry_dir,
            plugin_dir,
            cdi_dir: cdi_dir.to_path_buf(),
            log,
        }
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and its exit status; SIGKILL after [`STOP_GRACE`], so that a driver whose
    /// runtime is stuck fails its test (killed is not success) instead of hanging it.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let asked = std::time::Instant::now();
        while asked.elapsed() < STOP_GRACE {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// Applies the CDI devices `ids` (as kubelet hands them to the runtime) from the driver's spec
/// files in `cdi_dir` to the OCI spec of `bundle`, as containerd's and CRI-O's CDI library
/// (tags.cncf.io/container-device-interface) injects them: for each spec, its own
/// `containerEdits` and then each named device's, in order; env appended after the container's
/// own, a variable replacing one of the same name; hooks appended under their `hookName`;
/// device nodes added (type and numbers from the host's node, `rwm` allowed in the device
/// cgroup). The hooks the container runs are the driver's: nothing of vramgate's is added here.
pub fn apply_cdi(bundle: &Path, cdi_dir: &Path, ids: &[String]) {
    let config = bundle.join("config.json");
    let mut oci: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    let mut specs_applied: Vec<String> = Vec::new();
    for id in ids {
        let name = id
            .strip_prefix("vramgate.dev/gpu-memory=")
            .unwrap_or_else(|| panic!("{id} is not vramgate's CDI id"));
        let uid = name.get(..36).unwrap_or_else(|| panic!("{name}: no claim uid"));
        let file = cdi_dir.join(format!("vramgate.dev-gpu-memory_{uid}.json"));
        let spec: Value = serde_json::from_slice(
            &std::fs::read(&file).unwrap_or_else(|e| panic!("the driver's CDI spec {}: {e}", file.display())),
        )
        .unwrap();
        assert_eq!(spec["kind"], "vramgate.dev/gpu-memory", "{spec}");
        let device = array_field(&spec, "devices")
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("CDI device {name} is not in {}", file.display()))
            .clone();
        if !specs_applied.contains(&uid.to_string()) {
            if let Some(edits) = spec.get("containerEdits") {
                apply_edits(&mut oci, edits);
            }
            specs_applied.push(uid.to_string());
        }
        apply_edits(
            &mut oci,
            device
                .get("containerEdits")
                .unwrap_or_else(|| panic!("CDI device {name} has no containerEdits")),
        );
    }
    std::fs::write(&config, serde_json::to_vec_pretty(&oci).unwrap()).unwrap();
}

/// One `containerEdits` object applied to an OCI spec, as [`apply_cdi`] says. A field the CDI
/// library would apply and this does not (mounts, additionalGids, intelRdt) fails the test
/// instead of being dropped.
fn apply_edits(oci: &mut Value, edits: &Value) {
    let edits = edits
        .as_object()
        .unwrap_or_else(|| panic!("containerEdits is not an object: {edits}"));
    for key in edits.keys() {
        assert!(
            ["env", "hooks", "deviceNodes"].contains(&key.as_str()),
            "containerEdits.{key}: not applied by this test's CDI injection; apply it in tests/support/dra.rs"
        );
    }
    for entry in edits.get("env").and_then(Value::as_array).into_iter().flatten() {
        let entry = entry.as_str().unwrap().to_string();
        let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k).to_string();
        let env = oci["process"]["env"].as_array_mut().unwrap();
        match env.iter_mut().find(|e| {
            e.as_str()
                .unwrap()
                .split_once('=')
                .map_or(e.as_str().unwrap(), |(k, _)| k)
                == key
        }) {
            Some(same) => *same = json!(entry),
            None => env.push(json!(entry)),
        }
    }
    for hook in edits.get("hooks").and_then(Value::as_array).into_iter().flatten() {
        let stage = hook["hookName"]
            .as_str()
            .unwrap_or_else(|| panic!("a CDI hook without hookName: {hook}"));
        let mut entry = hook.clone();
        entry.as_object_mut().unwrap().remove("hookName");
        if oci.get("hooks").is_none_or(Value::is_null) {
            oci["hooks"] = json!({});
        }
        let list = oci["hooks"]
            .as_object_mut()
            .unwrap()
            .entry(stage.to_string())
            .or_insert_with(|| json!([]));
        list.as_array_mut().unwrap().push(entry);
    }
    for node in edits.get("deviceNodes").and_then(Value::as_array).into_iter().flatten() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let path = node["path"].as_str().unwrap();
        let host = node.get("hostPath").and_then(Value::as_str).unwrap_or(path);
        // The CDI library fills type and numbers from the host's node and fails without one.
        let meta = std::fs::metadata(host).unwrap_or_else(|e| panic!("CDI device node {host}: {e}"));
        let kind = if meta.file_type().is_char_device() { "c" } else { "b" };
        let (major, minor) = (nix::sys::stat::major(meta.rdev()), nix::sys::stat::minor(meta.rdev()));
        let devices = oci["linux"]
            .as_object_mut()
            .unwrap()
            .entry("devices")
            .or_insert_with(|| json!([]));
        devices
            .as_array_mut()
            .unwrap()
            .push(json!({"path": path, "type": kind, "major": major, "minor": minor}));
        if oci["linux"].get("resources").is_none_or(Value::is_null) {
            oci["linux"]["resources"] = json!({});
        }
        let rules = oci["linux"]["resources"]
            .as_object_mut()
            .unwrap()
            .entry("devices")
            .or_insert_with(|| json!([]));
        rules.as_array_mut().unwrap().push(
            json!({"allow": true, "type": kind, "major": major, "minor": minor, "access": node.get("permissions").and_then(Value::as_str).unwrap_or("rwm")}),
        );
    }
}
