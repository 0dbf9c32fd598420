//! Docker through `vramgate-runtime`: a private dockerd (own data-root, exec-root, socket,
//! pidfile, daemon.json) on a private containerd, both started here, with the `vramgate`
//! runtime pointing at the built wrapper and the wrapper's config (VRAMGATE_CONFIG in the
//! daemons' environment) pointing at a testbed with a simulated GPU. One daemon per Engine
//! version serves every case of that version: starting one costs seconds.
//!
//! Two engines: the host's (Debian 12's docker.io 20.10, requests in the environment) and
//! Engine 26 with containerd 1.7 from Debian trixie, for `docker run --annotation` (Engine 24
//! and later), which `scripts/fetch-docker-next` unpacks into a test directory without
//! installing it.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;
use support::*;
use vramgate_testbed::Testbed;

const IMAGE: &str = "vramgate-busybox:test";

/// Which Docker Engine a test drives: the PATH its dockerd, containerd, shims and client are
/// found on.
struct Engine {
    path: String,
}

impl Engine {
    /// The host's docker.io and containerd.
    fn host() -> Engine {
        require("dockerd");
        require("containerd");
        require("docker");
        Engine { path: path_with_sbin() }
    }

    /// Docker Engine 26 and containerd 1.7, unpacked by `scripts/fetch-docker-next` (which
    /// `scripts/install-deps` runs); runc is the host's.
    fn next() -> Engine {
        require("runc");
        let root =
            std::env::var("VRAMGATE_DOCKER_NEXT").unwrap_or_else(|_| "/var/cache/vramgate-tests/docker-trixie".into());
        let root = Path::new(&root);
        assert!(
            root.join("usr/sbin/dockerd").is_file() && root.join("usr/bin/containerd").is_file(),
            "Docker Engine 26 is not unpacked in {}: run scripts/install-deps (or scripts/fetch-docker-next)",
            root.display()
        );
        Engine {
            path: format!(
                "{}:{}:{}",
                root.join("usr/sbin").display(),
                root.join("usr/bin").display(),
                path_with_sbin()
            ),
        }
    }
}

struct Daemons {
    tb: Testbed,
    path: String,
    dir: PathBuf,
    socket: PathBuf,
    docker_config: PathBuf,
    containerd_state: PathBuf,
    containerd: Option<Child>,
    dockerd: Option<Child>,
    _host_dirs: HostDirs,
}

impl Daemons {
    fn start(tb: Testbed, engine: Engine) -> Daemons {
        let dir = tb.dir.join("docker");
        for d in ["data", "exec", "ctd-root", "ctd-state", "opt", "cli"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        // What dockerd and its containerd make at fixed host paths whatever their flags:
        // dockerd 20.10's trust key (whatever its data-root), the plugin directory, the shim
        // sockets. Shared with the other test's daemon and other test binaries' containerds:
        // HostDirs removes them once the last user is done.
        let host_dirs = HostDirs::note(&[
            "/etc/docker/key.json",
            "/etc/docker",
            "/run/containerd/s",
            "/run/containerd",
            "/run/docker/plugins",
            "/run/docker",
        ]);
        // The shim, and so the wrapper and the hooks, inherit VRAMGATE_CONFIG from it.
        let (containerd, ctd_socket, containerd_state) = start_containerd(&dir, &tb.config_path, &engine.path);
        let mut daemons = Daemons {
            path: engine.path,
            socket: dir.join("docker.sock"),
            docker_config: dir.join("cli"),
            containerd_state,
            dir: dir.clone(),
            tb,
            containerd: Some(containerd),
            dockerd: None,
            _host_dirs: host_dirs,
        };
        wait_until("containerd listens", Duration::from_secs(20), || {
            (ctd_socket.exists(), ())
        });

        // A second runtime whose wrapper reads a config naming no runtime that exists: shows
        // how the wrapper's own errors reach the docker user.
        let broken = dir.join("broken.toml");
        // Its own state dir: nothing of a test belongs in the host's /run/vramgate.
        std::fs::write(
            &broken,
            format!(
                "state_dir = {:?}\n[runtime]\nruntimes = [\"no-such-runtime-anywhere\"]\n",
                dir.join("broken-state").display().to_string()
            ),
        )
        .unwrap();
        let misconfigured = dir.join("vramgate-misconfigured");
        std::fs::write(
            &misconfigured,
            format!(
                "#!/bin/sh\nVRAMGATE_CONFIG={} exec {RUNTIME} \"$@\"\n",
                broken.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&misconfigured, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

        let daemon_json = dir.join("daemon.json");
        let config = json!({
            "storage-driver": "vfs",
            "bridge": "none",
            "iptables": false,
            "ip6tables": false,
            "ip-forward": false,
            "ip-masq": false,
            "userland-proxy": false,
            "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 20000, "Soft": 20000}},
            "runtimes": {
                "vramgate": {"path": RUNTIME},
                "vramgate-misconfigured": {"path": misconfigured},
            },
        });
        std::fs::write(&daemon_json, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let dockerd = daemon("dockerd")
            .env("PATH", &daemons.path)
            .arg("--config-file")
            .arg(&daemon_json)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("-H")
            .arg(format!("unix://{}", daemons.socket.display()))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .arg("--containerd")
            .arg(&ctd_socket)
            .env("VRAMGATE_CONFIG", &daemons.tb.config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .expect("starting dockerd");
        daemons.dockerd = Some(dockerd);
        wait_until("dockerd answers", Duration::from_secs(60), || {
            let ok = daemons
                .docker(&["version", "--format", "{{.Server.Version}}"])
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success());
            let log = std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default();
            (ok, log.lines().last().unwrap_or_default().to_string())
        });
        let tar = rootfs_tar(&daemons.tb);
        run_ok(daemons.docker(&["import"]).arg(&tar).arg(IMAGE));
        daemons
    }

    fn docker(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker");
        cmd.args(args)
            .env("DOCKER_HOST", format!("unix://{}", self.socket.display()))
            .env("DOCKER_CONFIG", &self.docker_config)
            .env("PATH", &self.path)
            .stdin(Stdio::null());
        cmd
    }

    /// `docker run --runtime vramgate --network none [extra] IMAGE cmd...`.
    fn run(&self, runtime: &str, extra: &[&str], cmd: &[&str]) -> Command {
        let mut c = self.docker(&["run", "--runtime", runtime, "--network", "none"]);
        c.args(extra).arg(IMAGE).args(cmd);
        c
    }

    /// The spec containerd handed the runtime for a running container.
    fn bundle_config(&self, id: &str) -> PathBuf {
        self.containerd_state
            .join("io.containerd.runtime.v2.task/moby")
            .join(id)
            .join("config.json")
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        if let Ok(out) = self.docker(&["ps", "-aq"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.docker(&["rm", "-f", id]).stderr(Stdio::null()).output();
            }
        }
        // dockerd by its pid file, as an operator would; then its containerd.
        let pid = std::fs::read_to_string(self.dir.join("docker.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .or_else(|| self.dockerd.as_ref().map(|c| c.id() as i32));
        if let Some(pid) = pid {
            stop_pid(pid, Duration::from_secs(20));
        }
        if let Some(mut c) = self.dockerd.take() {
            let _ = c.try_wait();
        }
        if let Some(c) = self.containerd.take() {
            stop_pid(c.id() as i32, Duration::from_secs(10));
        }
        unmount_under(&self.tb.dir);
    }
}

fn container_id(out: String) -> String {
    let id = out.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(id.len(), 64, "a container id: {out:?}");
    id
}

#[test]
fn docker_runs_through_vramgate_runtime() {
    let engine = Engine::host();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemons::start(testbed(dir.path()), engine);
    let gpu = ["-e", "NVIDIA_VISIBLE_DEVICES=0"];
    let req = |amount: &str| format!("VRAMGATE_MEMORY={amount}");

    // A container without a request: the wrapper leaves its spec alone, nothing is reserved.
    let plain = container_id(run_ok(&mut d.run(
        "vramgate",
        &["-d", "-e", "NVIDIA_VISIBLE_DEVICES=0"],
        &["sleep", "300"],
    )));
    assert_eq!(vramgate_hook_stages(&d.bundle_config(&plain)), Vec::<String>::new());
    assert!(reservations(&d.tb).is_empty());

    // Admitted, visible in status while it runs, with the hooks the wrapper added.
    let big = container_id(run_ok(&mut d.run(
        "vramgate",
        &["-d", "--name", "big-job", "-e", &req("20Gi"), gpu[0], gpu[1]],
        &["sleep", "300"],
    )));
    wait_reserved(&d.tb, &big, 20 << 30);
    // Docker writes no name into the spec (`--name` is dockerd's own): shown by its id.
    let spec = std::fs::read_to_string(d.bundle_config(&big)).unwrap();
    assert!(!spec.contains("big-job"), "Docker now writes the name: {spec}");
    support::assert_shown_as(&d.tb.config_path, &d.tb.state_dir, &big, None);
    assert_eq!(
        vramgate_hook_stages(&d.bundle_config(&big)),
        ["createRuntime", "poststop"]
    );

    // Over capacity: `docker run` fails and the user sees vramgate's refusal.
    let out = d
        .run("vramgate", &["--rm", "-e", &req("5Gi"), gpu[0], gpu[1]], &["true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an over-capacity container started");
    assert!(
        stderr.contains("vramgate: refused container") && stderr.contains("it requests 5"),
        "docker's error does not show vramgate's message: {stderr}"
    );
    assert_eq!(reservations(&d.tb).len(), 1, "the refused container holds nothing");

    // `docker rm -f` of a running container releases it.
    run_ok(&mut d.docker(&["rm", "-f", &big]));
    wait_released(&d.tb, &big);

    // `docker kill`.
    let killed = container_id(run_ok(&mut d.run(
        "vramgate",
        &["-d", "-e", &req("2Gi"), gpu[0], gpu[1]],
        &["sleep", "300"],
    )));
    wait_reserved(&d.tb, &killed, 2 << 30);
    run_ok(&mut d.docker(&["kill", &killed]));
    wait_released(&d.tb, &killed);
    run_ok(&mut d.docker(&["rm", &killed]));

    // `--rm`, in the foreground: reserved while it runs, released when `docker run` returns.
    let cidfile = d.dir.join("rm.cid");
    let cid_arg = cidfile.display().to_string();
    let mut fg = d
        .run(
            "vramgate",
            &["--rm", "--cidfile", &cid_arg, "-e", &req("3Gi"), gpu[0], gpu[1]],
            &["sleep", "2"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rm_id = wait_until("the --rm container has an id", Duration::from_secs(15), || {
        let id = std::fs::read_to_string(&cidfile).unwrap_or_default();
        (id.trim().len() == 64, id.trim().to_string())
    });
    wait_reserved(&d.tb, &rm_id, 3 << 30);
    assert!(fg.wait().unwrap().success());
    wait_released(&d.tb, &rm_id);

    // A normal exit without --rm: released when the process ends, before `docker rm`.
    let exits = container_id(run_ok(&mut d.run(
        "vramgate",
        &["-d", "-e", &req("4Gi"), gpu[0], gpu[1]],
        &["sleep", "2"],
    )));
    wait_reserved(&d.tb, &exits, 4 << 30);
    assert_eq!(run_ok(&mut d.docker(&["wait", &exits])), "0");
    wait_released(&d.tb, &exits);
    run_ok(&mut d.docker(&["rm", &exits]));

    // The wrapper's own errors reach the docker user through runc's --log.
    let out = d
        .run(
            "vramgate-misconfigured",
            &["--rm", "-e", &req("1Gi"), gpu[0], gpu[1]],
            &["true"],
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("vramgate: no runtime to run next") && stderr.contains("no-such-runtime-anywhere"),
        "{stderr}"
    );

    // `-e VRAMGATE_GPUS=auto`: the wrapper chooses the GPU, and the container's environment
    // names the one it got.
    let env = run_ok(&mut d.run(
        "vramgate",
        &["--rm", "-e", &req("1Gi"), "-e", "VRAMGATE_GPUS=auto"],
        &["env"],
    ));
    let chosen = format!("NVIDIA_VISIBLE_DEVICES={}", vramgate::config::SIMULATED_GPU_UUID);
    assert!(env.lines().any(|l| l == chosen), "{env}");
    assert!(
        env.lines()
            .any(|l| l == format!("VRAMGATE_GPUS={}", vramgate::config::SIMULATED_GPU_UUID)),
        "{env}"
    );

    run_ok(&mut d.docker(&["rm", "-f", &plain]));
    assert!(
        reservations(&d.tb).is_empty(),
        "nothing left reserved: {:?}",
        reservations(&d.tb)
    );
}

/// Docker Engine 24 and later pass `docker run --annotation` into the OCI spec, so the request
/// can be written the way podman and Kubernetes users write it. Also checks, on this engine,
/// what the manual says of a waiting start: dockerd holds the container's lock while its
/// create waits, and `vramgate release <id>` ends the wait.
#[test]
fn docker_engine_26_takes_the_request_as_an_annotation() {
    let engine = Engine::next();
    let dir = tempfile::tempdir().unwrap();
    let d = Daemons::start(testbed(dir.path()), engine);
    let version = run_ok(&mut d.docker(&["version", "--format", "{{.Server.Version}}"]));
    let major: u32 = version.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 24, "not Engine 24 or later: {version}");
    let annotated = |amount: &str| {
        [
            "--annotation".to_string(),
            format!("vramgate.dev/memory={amount}"),
            "--annotation".to_string(),
            "vramgate.dev/gpus=0".to_string(),
        ]
    };
    let args = |extra: &[&str], request: &[String]| -> Vec<String> {
        extra
            .iter()
            .map(|s| s.to_string())
            .chain(request.iter().cloned())
            .collect()
    };
    let run = |extra: Vec<String>, cmd: &[&str]| {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        d.run("vramgate", &extra, cmd)
    };

    // Admitted from the annotation alone: no VRAMGATE_* variable in the container.
    let big = container_id(run_ok(&mut run(
        args(
            &[
                "-d",
                "--name",
                "big-job",
                "--annotation",
                "vramgate.dev/name=nightly-eval",
            ],
            &annotated("20Gi"),
        ),
        &["sleep", "300"],
    )));
    wait_reserved(&d.tb, &big, 20 << 30);
    // Engine 26 writes no name of its own either; the one the container gives itself is shown.
    let spec = std::fs::read_to_string(d.bundle_config(&big)).unwrap();
    assert!(!spec.contains("big-job"), "Docker now writes the name: {spec}");
    support::assert_shown_as(&d.tb.config_path, &d.tb.state_dir, &big, Some("nightly-eval"));
    assert_eq!(
        vramgate_hook_stages(&d.bundle_config(&big)),
        ["createRuntime", "poststop"]
    );

    // Refused, with vramgate's line in `docker run`'s error.
    let out = run(args(&["--rm"], &annotated("5Gi")), &["true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an over-capacity container started");
    assert!(
        err.contains("vramgate: refused container") && err.contains("it requests 5"),
        "docker's error does not show vramgate's message: {err}"
    );

    // A waiting start: its container's lock is held, `vramgate release` ends the wait at once.
    let cidfile = d.dir.join("waiting.cid");
    let mut waiting = run(
        args(
            &[
                "--cidfile",
                &cidfile.display().to_string(),
                "--annotation",
                "vramgate.dev/policy=wait",
            ],
            &annotated("10Gi"),
        ),
        &["true"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let waiting_id = wait_until("the waiting container has an id", Duration::from_secs(15), || {
        let id = std::fs::read_to_string(&cidfile).unwrap_or_default();
        (id.trim().len() == 64, id.trim().to_string())
    });
    wait_until("the container waits in the queue", Duration::from_secs(20), || {
        let queue = queued_ids(&d.tb);
        (queue.contains(&waiting_id), queue)
    });
    let mut inspect = d
        .docker(&["inspect", "--format", "{{.State.Status}}", &waiting_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The inspect is under way (it holds a connection to dockerd), and a later inspect of the
    // running container is answered: dockerd serves inspects, and the one of the waiting
    // container, asked first, still has no answer.
    eventually(
        "docker inspect is connected to dockerd",
        Duration::from_secs(15),
        || {
            std::fs::read_dir(format!("/proc/{}/fd", inspect.id()))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")))
        },
    );
    run_ok(&mut d.docker(&["inspect", "--format", "{{.State.Status}}", &big]));
    assert!(
        inspect.try_wait().unwrap().is_none(),
        "docker inspect of a container whose create waits returned: the manual's note on Docker's lock (docs/src/engines.md) is out of date"
    );
    let release = Command::new(VRAMGATE)
        .args(["release", &waiting_id])
        .env("VRAMGATE_CONFIG", &d.tb.config_path)
        .output()
        .unwrap();
    assert!(release.status.success(), "vramgate release: {}", stderr(&release));
    eventually(
        "docker run ends after vramgate release",
        Duration::from_secs(15),
        || waiting.try_wait().unwrap().is_some(),
    );
    let out = waiting.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a cancelled start ran");
    assert!(err.contains("its wait was cancelled"), "docker's error: {err}");
    eventually("docker inspect returns", Duration::from_secs(15), || {
        inspect.try_wait().unwrap().is_some()
    });
    assert_eq!(
        queued_ids(&d.tb),
        Vec::<String>::new(),
        "the cancelled wait left a ticket"
    );
    assert_eq!(
        reservations(&d.tb),
        [(big.clone(), 20 << 30)],
        "the cancelled start holds nothing"
    );

    run_ok(&mut d.docker(&["rm", "-f", &big]));
    wait_released(&d.tb, &big);
    assert!(reservations(&d.tb).is_empty(), "{:?}", reservations(&d.tb));
}
