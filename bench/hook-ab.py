#!/usr/bin/env python3
"""A/B of two vramgate-hook binaries with one driver: no request, admit and release with 100
live reservations, runs alternated between the two, state on tmpfs (/dev/shm) as /run is.
For a refactoring's before and after on the same machine:

    git worktree add /tmp/before <rev> && (cd /tmp/before && cargo build --release --bins)
    cargo build --release --bins
    sudo bench/hook-ab.py /tmp/before/target/release/vramgate-hook target/release/vramgate-hook [RUNS]

Each binary gets its own state directory (an older binary may not read a newer ledger).
"""
import subprocess, time, os, statistics, json, shutil, sys
sleeper = subprocess.Popen(["sleep", "3600"])
def start_time(pid):
    data = open(f"/proc/{pid}/stat").read()
    return int(data[data.rindex(")") + 2:].split()[19])
ident = {"pid": sleeper.pid, "start_time": start_time(sleeper.pid)}
bins = {"before": os.path.abspath(sys.argv[1]), "after": os.path.abspath(sys.argv[2])}
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 300
root = "/dev/shm/vg-ab"
shutil.rmtree(root, ignore_errors=True)
envs = {}
for k in bins:
    d = f"{root}/{k}"
    os.makedirs(f"{d}/state", mode=0o700)
    os.makedirs(f"{d}/bundle")
    os.makedirs(f"{d}/plain")
    json.dump({"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"}}, open(f"{d}/plain/config.json", "w"))
    json.dump({"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"},
               "annotations": {"vramgate.dev/memory": "1Gi", "vramgate.dev/gpus": "0"}}, open(f"{d}/bundle/config.json", "w"))
    open(f"{d}/config.toml", "w").write(f'state_dir = "{d}/state"\n[inventory]\nbackend = "static"\n[[inventory.gpus]]\nindex = 0\nuuid = "GPU-ab"\ntotal = "80Gi"\n')
    ledger = {"schema": 1, "generation": 1, "next_ticket": 1, "queue": [],
              "reservations": [{"container_id": f"live{i}", "gpus": [{"uuid": "GPU-ab", "bytes": 100 << 20}], "init": ident, "created_unix_ms": 1, "waited_ms": 0} for i in range(100)]}
    fd = os.open(f"{d}/state/ledger.json", os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, json.dumps(ledger).encode()); os.close(fd)
    envs[k] = dict(os.environ, VRAMGATE_CONFIG=f"{d}/config.toml")
steps = (("createRuntime", "plain", "no request"), ("createRuntime", "bundle", "admit"), ("poststop", "bundle", "release"))
res = {(k, name): [] for k in bins for (_, _, name) in steps}
print(f"load {open('/proc/loadavg').read().split()[0]}, {runs} runs each, 100 live reservations")
for i in range(runs):
    for k, b in bins.items():
        for stage, bundle, name in steps:
            st = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": sleeper.pid, "bundle": f"{root}/{k}/{bundle}"}).encode()
            t = time.perf_counter()
            p = subprocess.run([b, stage], input=st, env=envs[k], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            res[(k, name)].append((time.perf_counter() - t) * 1000)
            assert p.returncode == 0, p.stderr
for (_, _, name) in steps:
    for k in bins:
        v = sorted(res[(k, name)])
        print(f"{name:11} {k:6} median {statistics.median(v):.3f} ms  p90 {v[9*len(v)//10]:.3f}  p99 {v[99*len(v)//100]:.3f}")
sleeper.kill()
shutil.rmtree(root, ignore_errors=True)
