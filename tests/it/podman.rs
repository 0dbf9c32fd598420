//! podman with runc and the repository's hooks.d JSON (rewritten to run the built hook with the
//! testbed's config): `podman run --annotation vramgate.dev/memory=...` is admitted, refused
//! with vramgate's message in front of the user, and released when the container ends.
//! Everything podman keeps lives in the temp dir (`--root`, `--runroot`, `--tmpdir`).

use crate::support;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;
use support::*;
use vramgate_testbed::Testbed;

const IMAGE: &str = "localhost/vramgate-busybox:test";

struct Podman {
    tb: Testbed,
    dir: PathBuf,
    hooks: PathBuf,
    _host: HostDirs,
}

impl Podman {
    fn new(tb: Testbed) -> Podman {
        let host = HostDirs::note(&[
            "/var/lib/containers/cache/blob-info-cache-v1.boltdb",
            "/var/lib/containers/cache",
            "/var/lib/containers",
            "/run/containers/networks",
            "/run/containers",
        ]);
        let dir = tb.dir.join("podman");
        let hooks = dir.join("hooks.d");
        std::fs::create_dir_all(&hooks).unwrap();
        // The hard nofile limit here is 20000; podman's default ulimits ask for more.
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = []\n[network]\nnetwork_config_dir = {:?}\n",
                dir.join("networks").display().to_string()
            ),
        )
        .unwrap();
        write_packaged_hooks(&hooks, &tb);
        let podman = Podman {
            tb,
            dir,
            hooks,
            _host: host,
        };
        let tar = rootfs_tar(&podman.tb);
        run_ok(podman.podman(&["import"]).arg(&tar).arg(IMAGE));
        podman
    }

    fn podman(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .arg("--hooks-dir")
            .arg(&self.hooks)
            .args([
                "--storage-driver",
                "vfs",
                "--runtime",
                "runc",
                "--cgroup-manager",
                "cgroupfs",
            ])
            .args(["--events-backend", "none"])
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("PATH", path_with_sbin())
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, extra: &[&str], memory: Option<&str>, cmd: &[&str]) -> Command {
        let mut c = self.podman(&["run", "--network", "none"]);
        if let Some(m) = memory {
            c.arg("--annotation")
                .arg(format!("vramgate.dev/memory={m}"))
                .arg("--annotation")
                .arg("vramgate.dev/gpus=0");
        }
        c.args(extra).arg(IMAGE).args(cmd);
        c
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.podman(&["rm", "-f", "-a", "-t", "0"]).output();
        unmount_under(&self.tb.dir);
    }
}

#[test]
fn podman_admits_refuses_and_releases() {
    require("podman");
    require("runc");
    let dir = tempfile::tempdir().unwrap();
    let p = Podman::new(testbed(dir.path()));

    // Admitted: visible in status while it runs.
    let big = run_ok(&mut p.run(&["-d", "--name", "big-job"], Some("20Gi"), &["sleep", "300"]));
    wait_reserved(&p.tb, &big, 20 << 30);
    // podman writes no name into the spec (`--name` is podman's own): shown by its id.
    support::assert_shown_as(&p.tb.config_path, &p.tb.state_dir, &big, None);

    // Refused: podman fails and prints vramgate's message; nothing more is reserved.
    let out = p.run(&["--rm"], Some("5Gi"), &["true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an over-capacity container started");
    assert!(
        stderr.contains("vramgate: refused container") && stderr.contains("it requests 5120 MiB"),
        "podman's error does not show vramgate's message: {stderr}"
    );
    assert_eq!(reservations(&p.tb), [(big.clone(), 20 << 30)]);

    // Released on `podman rm -f`.
    run_ok(&mut p.podman(&["rm", "-f", "-t", "0", &big]));
    wait_released(&p.tb, &big);

    // Released on a normal exit (before the container is removed).
    let short = run_ok(&mut p.run(&["-d"], Some("6Gi"), &["sleep", "2"]));
    wait_reserved(&p.tb, &short, 6 << 30);
    assert_eq!(run_ok(&mut p.podman(&["wait", &short])), "0");
    wait_released(&p.tb, &short);
    run_ok(&mut p.podman(&["rm", &short]));

    // `--rm` in the foreground; the container's own exit status comes through.
    let out = p.run(&["--rm"], Some("1Gi"), &["sh", "-c", "exit 7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));

    // A request in the environment is accounted too (the hooks.d files match every
    // container; the hook finds the request in the spec's env).
    let env = run_ok(&mut p.podman(&[
        "run",
        "--network",
        "none",
        "-d",
        "-e",
        "VRAMGATE_MEMORY=4Gi",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=0",
        IMAGE,
        "sleep",
        "300",
    ]));
    wait_reserved(&p.tb, &env, 4 << 30);
    run_ok(&mut p.podman(&["rm", "-f", "-t", "0", &env]));
    wait_released(&p.tb, &env);

    // A container's own `vramgate.dev/enforcement` is not a tier vramgate applied: the hook
    // alone records none, so status and the metrics never claim a driver limit no one set.
    let forged = run_ok(&mut p.run(
        &[
            "-d",
            "--annotation",
            "vramgate.dev/enforcement=driver_limit",
            "--annotation",
            "vramgate.dev/name=nightly-eval",
        ],
        Some("2Gi"),
        &["sleep", "300"],
    ));
    wait_reserved(&p.tb, &forged, 2 << 30);
    // The name the container gives itself is what status, the metrics and the events show.
    support::assert_shown_as(&p.tb.config_path, &p.tb.state_dir, &forged, Some("nightly-eval"));
    let listed = status(&p.tb.config_path)["gpus"][0]["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["container_id"] == forged.as_str())
        .cloned()
        .unwrap();
    assert_eq!(listed["tier"], Value::Null, "{listed}");
    run_ok(&mut p.podman(&["rm", "-f", "-t", "0", &forged]));
    wait_released(&p.tb, &forged);

    // Without a request the hooks run and do nothing: nothing is reserved.
    let plain = run_ok(&mut p.run(&["-d"], None, &["sleep", "300"]));
    assert!(reservations(&p.tb).is_empty());
    run_ok(&mut p.podman(&["rm", "-f", "-t", "0", &plain]));
    assert!(reservations(&p.tb).is_empty(), "nothing left reserved");
}
