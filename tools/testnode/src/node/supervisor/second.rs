//! The second node (`second up`, `second down` on the control socket): a kubelet of its own
//! (its own name, root, ports and cgroup root) on a containerd 2.1 of its own, set up by the
//! built `vramgate setup containerd` with a vramgate config, ledger and simulated GPU of its
//! own, joined to the first node's control plane. For the scenarios where kube-scheduler
//! chooses between nodes: a pod one node cannot hold is placed on the other.
//!
//! kubelet keeps its device-plugin socket and checkpoint in /var/lib/kubelet/device-plugins
//! whatever `--root-dir` says, and empties that directory when it starts: a second kubelet there
//! would take the first one's device plugins away. So the second node's containerd and kubelet
//! run in one mount namespace of their own, a slave of the host's (they see its mounts; the host
//! sees none of theirs), where a tmpfs covers that directory. One namespace for both: containerd
//! mounts into its containers the volumes kubelet mounts for their pods. containerd is started
//! in it (`unshare`, the tmpfs, then exec: the namespace's first process is containerd itself)
//! and kubelet enters it (`nsenter`, then exec); the namespace and its mounts end with the last
//! of them and their shims.

use super::*;
use crate::node::{second_config_extra, SecondNodeFile, SECOND_FILE};

/// How long the second node may take to be Ready (kubelet registers and reports within
/// seconds; the loaded 2-core machine is slower).
const SECOND_UP_LIMIT: Duration = Duration::from_secs(180);

thread_local! {
    /// Set while this thread starts the second node, whose failure it catches.
    static CAUGHT_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a panic on this thread is caught where it happens (a `second up` that fails stops
/// the second node alone): the supervisor's panic hook then leaves the node up.
pub fn panic_is_caught() -> bool {
    CAUGHT_HERE.with(std::cell::Cell::get)
}

/// The tmpfs's source name (what marks it in the namespace's mount table).
const NAMESPACE_MARK: &str = "vramgate-second-node";

impl Supervisor {
    /// Starts the second node; answers `ok` once it is Ready and `second.json` is written, or
    /// `error: ...` (what started is stopped again).
    pub(super) fn second_up(&self) -> String {
        {
            let mut running = self.running.lock().unwrap();
            if running.second.is_some() || running.second_starting {
                return "error: the second node is up already".into();
            }
            running.second_starting = true;
        }
        let started = Instant::now();
        CAUGHT_HERE.with(|c| c.set(true));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start_second()));
        CAUGHT_HERE.with(|c| c.set(false));
        let reply = match outcome {
            Ok(info) => {
                write_json(&self.info.dir.join(SECOND_FILE), &info);
                self.running.lock().unwrap().second = Some(info);
                eprintln!("testnode: second node Ready in {:?}", started.elapsed());
                "ok".into()
            }
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into());
                self.stop_second(&self.info.dir.join("second"), &format!("{}-second", self.node));
                format!("error: the second node did not come up: {}", why.replace('\n', " | "))
            }
        };
        self.running.lock().unwrap().second_starting = false;
        self.changed.notify_all();
        reply
    }

    fn start_second(&self) -> SecondNodeFile {
        let node = format!("{}-second", self.node);
        let config = Testbed::default_config(&self.info.dir.join("second"), &second_config_extra());
        let tb = Testbed::create(
            &self.info.dir.join("second"),
            "runc",
            &self.info.vramgate_bin.join("vramgate-hook"),
            &config,
        )
        .unwrap_or_else(|e| panic!("the second node's vramgate testbed: {e:#}"));
        let kube_dir = tb.dir.join("kube");
        for sub in ["kubelet", "kubelet-pki", "podlogs"] {
            std::fs::create_dir_all(kube_dir.join(sub)).unwrap();
        }
        let ctd_dir = tb.dir.join("containerd");
        let info = SecondNodeFile {
            node: node.clone(),
            dir: tb.dir.clone(),
            vramgate_config: tb.config_path.clone(),
            kube_dir: kube_dir.clone(),
            containerd: ContainerdFile {
                address: ctd_dir.join("containerd.sock"),
                state: ctd_dir.join("ctd-state"),
                dir: ctd_dir.clone(),
                main_config: ctd_dir.join("config.toml"),
                path: self.info.containerd.path.clone(),
                log: self.kube.log("second-containerd"),
            },
            cdi_dir: ctd_dir.join("cdi"),
        };
        let ctd = &info.containerd;
        stop_asked();
        self.configure_containerd(ctd, &tb);
        // The first node's kubelet made the directory; the tmpfs covers it in the namespace.
        std::fs::create_dir_all(DEVICE_PLUGINS).unwrap();
        let mut containerd = daemon("unshare");
        // kubelet's root already a shared mount of its own: kubelet makes it one at start
        // (MakeRShared) unless it is, and its pod-resources socket, made meanwhile, once failed
        // to move into place across that new mount (EXDEV), which ends kubelet.
        let kubelet_root = kube_dir.join("kubelet");
        containerd
            .args(["--mount", "--propagation", "slave", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o mode=0750 {NAMESPACE_MARK} {DEVICE_PLUGINS} && \
                 mount --bind '{root}' '{root}' && mount --make-rshared '{root}' && exec \"$@\"",
                root = kubelet_root.display()
            ))
            .arg("second-containerd")
            .arg("containerd")
            .arg("--config")
            .arg(&ctd.main_config)
            .arg("--root")
            .arg(ctd_dir.join("ctd-root"))
            .arg("--state")
            .arg(&ctd.state)
            .arg("--address")
            .arg(&ctd.address)
            .env("VRAMGATE_CONFIG", &tb.config_path)
            .env("PATH", &ctd.path);
        self.spawn_command("second-containerd", containerd);
        let containerd_pid = self.component_pid("second-containerd").unwrap();
        self.kube.wait(
            "the second node's containerd answers",
            CONTAINERD_LIMIT,
            "second-containerd",
            || {
                let out = crictl(&self.bin, &ctd.address, &["version"]).output().unwrap();
                (out.status.success(), stderr(&out))
            },
        );
        self.import_images(ctd, &tb, "second-containerd");
        stop_asked();

        for h in cgroup_hierarchies() {
            let _ = std::fs::create_dir_all(h.join(SECOND_CGROUP_ROOT));
        }
        let config = kubelet_config(
            &kube_dir,
            &ctd.address,
            SECOND_CGROUP_ROOT,
            SECOND_KUBELET,
            SECOND_KUBELET_HEALTHZ,
        );
        let k = kube_dir.display();
        let mut kubelet = daemon("nsenter");
        kubelet
            .arg(format!("--mount=/proc/{containerd_pid}/ns/mnt"))
            .arg("--")
            .arg(self.bin.join("kubelet"))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}/second-kubelet.kubeconfig", self.dir.display()))
            .arg(format!("--root-dir={k}/kubelet"))
            .arg(format!("--cert-dir={k}/kubelet-pki"))
            .arg(format!("--hostname-override={node}"))
            .env("PATH", path_with_sbin());
        self.spawn_command("second-kubelet", kubelet);
        self.kube
            .wait("the second node is Ready", SECOND_UP_LIMIT, "second-kubelet", || {
                self.kube.node_ready(&node)
            });
        info
    }

    /// The pid of running component `name`.
    fn component_pid(&self, name: &str) -> Option<u32> {
        let running = self.running.lock().unwrap();
        running.components.iter().find(|c| c.name == name).map(|c| c.child.id())
    }

    /// Stops the second node and removes it (its pods, its Node and slices, its processes, its
    /// cgroup root, its directory); `ok` also when none runs. A `second up` under way is waited
    /// for first (at most [`SECOND_UP_LIMIT`] and a minute: a stop asked meanwhile ends it at
    /// its next step, and it removes what it started).
    pub(super) fn second_down(&self) -> String {
        let running = self.running.lock().unwrap();
        let (mut running, _) = self
            .changed
            .wait_timeout_while(running, SECOND_UP_LIMIT + Duration::from_secs(60), |r| {
                r.second_starting
            })
            .unwrap();
        let Some(info) = running.second.take() else {
            return "ok".into();
        };
        drop(running);
        let _ = std::fs::remove_file(self.info.dir.join(SECOND_FILE));
        self.stop_second(&info.dir, &info.node);
        "ok".into()
    }

    /// Cleanup of a second node in `dir` named `node`, however far it came; never panics.
    /// Its pods go through its kubelet (deleted while it runs); then kubelet stops, the hooks
    /// still queued are killed, what sandboxes are left go through CRI, containerd stops, and
    /// the Node and its slices are deleted so that kube-scheduler forgets it.
    fn stop_second(&self, dir: &Path, node: &str) {
        let on_node = format!("spec.nodeName={node}");
        if self.component_pid("second-kubelet").is_some() {
            let _ = self
                .kube
                .kubectl(&[
                    "delete",
                    "pods",
                    "--all-namespaces",
                    "--field-selector",
                    &on_node,
                    "--wait=true",
                    "--timeout=60s",
                ])
                .output();
        }
        self.stop_component("second-kubelet", Duration::from_secs(20));
        kill_queued_hooks(&self.info.vramgate_bin.join("vramgate"), &dir.join("config.toml"));
        let address = dir.join("containerd/containerd.sock");
        let _ = crictl(&self.bin, &address, &["rmp", "--all", "--force"]).output();
        self.stop_component("second-containerd", Duration::from_secs(10));
        let _ = self
            .kube
            .kubectl(&["delete", "node", node, "--ignore-not-found"])
            .output();
        let _ = self
            .kube
            .kubectl(&["delete", "resourceslices", "--field-selector", &on_node])
            .output();
        for h in cgroup_hierarchies() {
            crate::process::remove_cgroup(&h.join(SECOND_CGROUP_ROOT));
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
