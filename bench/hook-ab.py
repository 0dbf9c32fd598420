#!/usr/bin/env python3
"""vramgate-hook's wall time with one driver, as a runtime runs it: a container without a
request at prestart and at poststop (what the hooks.d files cost every container), admit and
release, with 100 live reservations, state on tmpfs (/dev/shm) as /run is, and /bin/true
spawned the same way as the floor. Given two binaries, the runs alternate between them: a
refactoring's before and after on the same machine.

    cargo build --release --bins && sudo bench/hook-ab.py target/release/vramgate-hook [RUNS]
    git worktree add /tmp/before <rev> && (cd /tmp/before && cargo build --release --bins)
    sudo bench/hook-ab.py /tmp/before/target/release/vramgate-hook target/release/vramgate-hook [RUNS]

Each binary gets its own state directory (an older binary may not read a newer ledger).
"""
import subprocess, time, os, statistics, json, shutil, sys
sleeper = subprocess.Popen(["sleep", "3600"])
def start_time(pid):
    data = open(f"/proc/{pid}/stat").read()
    return int(data[data.rindex(")") + 2:].split()[19])
ident = {"pid": sleeper.pid, "start_time": start_time(sleeper.pid)}
paths = [a for a in sys.argv[1:] if not a.isdigit()]
bins = dict(zip(["before", "after"] if len(paths) == 2 else ["hook"], map(os.path.abspath, paths)))
runs = next((int(a) for a in sys.argv[1:] if a.isdigit()), 300)
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
steps = (("createRuntime", "plain", "no request"), ("createRuntime", "bundle", "admit"), ("poststop", "bundle", "release"),
         ("poststop", "plain", "stop, none"))
res = {(k, name): [] for k in bins for (_, _, name) in steps}
floor = []
# The floor any Rust binary pays: an empty `fn main`, linked as the hook is (dynamically).
rust_floor, empty = [], None
if shutil.which("rustc"):
    open(f"{root}/empty.rs", "w").write("fn main() {}\n")
    subprocess.run(["rustc", "-O", "-C", "panic=abort", "-o", f"{root}/empty", f"{root}/empty.rs"], check=True)
    empty = f"{root}/empty"
print(f"load {open('/proc/loadavg').read().split()[0]}, {runs} runs each, 100 live reservations")
for i in range(runs):
    for k, b in bins.items():
        for stage, bundle, name in steps:
            st = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": sleeper.pid, "bundle": f"{root}/{k}/{bundle}"}).encode()
            t = time.perf_counter()
            p = subprocess.run([b, stage], input=st, env=envs[k], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            res[(k, name)].append((time.perf_counter() - t) * 1000)
            assert p.returncode == 0, p.stderr
    t = time.perf_counter()
    subprocess.run(["/bin/true"], input=b"{}", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    floor.append((time.perf_counter() - t) * 1000)
    if empty:
        t = time.perf_counter()
        subprocess.run([empty], input=b"{}", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        rust_floor.append((time.perf_counter() - t) * 1000)
for (_, _, name) in steps:
    for k in bins:
        v = sorted(res[(k, name)])
        print(f"{name:11} {k:6} median {statistics.median(v):.3f} ms  p90 {v[9*len(v)//10]:.3f}  p99 {v[99*len(v)//100]:.3f}")
floor.sort()
print(f"{'/bin/true':11} {'floor':6} median {statistics.median(floor):.3f} ms  p90 {floor[9*len(floor)//10]:.3f}")
if rust_floor:
    rust_floor.sort()
    print(f"{'empty Rust':11} {'floor':6} median {statistics.median(rust_floor):.3f} ms  p90 {rust_floor[9*len(rust_floor)//10]:.3f}")
sleeper.kill()
shutil.rmtree(root, ignore_errors=True)
