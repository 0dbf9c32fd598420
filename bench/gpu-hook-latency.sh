#!/bin/bash
# The hook's wall time on the NVML path, against the floor of NVML itself. Run as root on a
# GPU host (not in CI):   bench/gpu-hook-latency.sh [ROUNDS]
#
# Each measurement spawns a process and waits for it, the way a runtime runs a hook, so the
# floor is measured the same way: nvml_floor (bench/nvml_floor.c) does only the NVML calls a
# decision needs (dlopen, nvmlInit, GPU 0, memory, process list, shutdown). Scenarios:
#   admit-empty  createRuntime on a GPU with no reservation (no process list is read)
#   admit-busy   createRuntime on a GPU with one live reservation (its process list is read)
#   release      poststop of an admitted container (no NVML at all)
#   no-request   createRuntime of a container without a request (no lock, no NVML)
set -u
here=$(cd "$(dirname "$0")" && pwd)
BIN=${VRAMGATE_BIN:-$here/../target/release}
ROUNDS=${1:-40}
work=$(mktemp -d /tmp/vramgate-lat.XXXXXX)
# The default state dir /run/vramgate is on a tmpfs on any systemd host; where this host's /run
# is not one (a VM), mount one, so that what is measured is vramgate and not the disk's fsync.
# STATE_ON_DISK=1 measures on /var/tmp instead.
if [ "${STATE_ON_DISK:-0}" = 1 ]; then
    base=/var/tmp/vramgate-lat-state
else
    base=/run/vramgate-lat-tmpfs
    mkdir -p "$base"
    mountpoint -q "$base" || mount -t tmpfs -o mode=0755 tmpfs "$base"
fi
state=$base/state.$$
echo "state dir: $state ($(stat -fc %T "$(dirname "$state")" 2>/dev/null || echo new))"
trap 'kill $sleeper $holder 2>/dev/null; rm -rf "$work" "$state"' EXIT

floor=${NVML_FLOOR:-$work/nvml_floor}
[ -x "$floor" ] || gcc -O2 -o "$floor" "$here/nvml_floor.c" -ldl || { echo "cannot build nvml_floor"; exit 1; }

cat >"$work/config.toml" <<TOML
state_dir = "$state"
[inventory]
backend = "nvml"
TOML
mkdir -p "$work/req" "$work/noreq" "$base"
cat >"$work/req/config.json" <<'JSON'
{"ociVersion":"1.0.2","process":{"args":["sleep"],"env":["NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"/"},"annotations":{"vramgate.dev/memory":"1Gi"}}
JSON
cat >"$work/noreq/config.json" <<'JSON'
{"ociVersion":"1.0.2","process":{"args":["sleep"],"env":["NVIDIA_VISIBLE_DEVICES=0"]},"root":{"path":"/"}}
JSON
sleep 3600 & sleeper=$!
sleep 3600 & holder=$!

VRAMGATE_CONFIG=$work/config.toml python3 - "$BIN/vramgate-hook" "$floor" "$work" "$sleeper" "$holder" "$ROUNDS" <<'PY'
import json, os, statistics, subprocess, sys, time
hook, floor, work, sleeper, holder, rounds = sys.argv[1:7]
rounds = int(rounds)

def state(cid, bundle, pid):
    return json.dumps({"ociVersion": "1.0.2", "id": cid, "status": "creating", "pid": int(pid), "bundle": f"{work}/{bundle}"}).encode()

def timed(argv, stdin=b""):
    t = time.perf_counter()
    r = subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        sys.exit(f"{argv[0]} failed: {r.stderr.decode().strip()}")
    return dt

results = {k: [] for k in ["true", "nvml_floor", "admit-empty", "release", "admit-busy", "no-request"]}
for i in range(rounds):
    results["true"].append(timed(["/bin/true"]))
    results["nvml_floor"].append(timed([floor]))
    results["admit-empty"].append(timed([hook, "createRuntime"], state(f"lat-{i}", "req", sleeper)))
    results["release"].append(timed([hook, "poststop"], state(f"lat-{i}", "req", sleeper)))
# One live reservation held by another "container" on GPU 0: now the process list is read.
timed([hook, "createRuntime"], state("holder", "req", holder))
for i in range(rounds):
    results["admit-busy"].append(timed([hook, "createRuntime"], state(f"latb-{i}", "req", sleeper)))
    timed([hook, "poststop"], state(f"latb-{i}", "req", sleeper))
    results["no-request"].append(timed([hook, "createRuntime"], state(f"latn-{i}", "noreq", sleeper)))
timed([hook, "poststop"], state("holder", "req", holder))

def q(xs, f):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))]
print(f"rounds {rounds} (each a spawned process, wall ms)")
print(f"{'what':<14} {'median':>8} {'p90':>8} {'min':>8}")
for k, xs in results.items():
    print(f"{k:<14} {statistics.median(xs):8.2f} {q(xs, 0.9):8.2f} {min(xs):8.2f}")
f = statistics.median(results["nvml_floor"])
for k in ["admit-empty", "admit-busy"]:
    print(f"{k} adds {statistics.median(results[k]) - f:+.2f} ms over the NVML floor (median)")
PY
echo "--- in-process NVML cost (C, 20 rounds):"
"$floor" 20
echo "--- in-process NVML cost (Python pynvml, as in the issue):"
python3 - <<'PY'
import time, pynvml
t = time.perf_counter(); pynvml.nvmlInit(); t1 = time.perf_counter()
h = pynvml.nvmlDeviceGetHandleByIndex(0); pynvml.nvmlDeviceGetMemoryInfo(h); pynvml.nvmlDeviceGetComputeRunningProcesses(h)
t2 = time.perf_counter()
print(f"pynvml init {1000*(t1-t):.2f} ms, memory+processes {1000*(t2-t1):.2f} ms")
# What each call the NVML backend makes costs (median of 20, in-process).
import statistics
calls = {
    "device_count": lambda: pynvml.nvmlDeviceGetCount(),
    "handle_by_index": lambda: pynvml.nvmlDeviceGetHandleByIndex(0),
    "uuid": lambda: pynvml.nvmlDeviceGetUUID(h),
    "minor_number": lambda: pynvml.nvmlDeviceGetMinorNumber(h),
    "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(h),
    "memory_info": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    "compute_processes": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
}
for name, f in calls.items():
    ts = []
    for _ in range(20):
        t = time.perf_counter()
        try:
            f()
        except pynvml.NVMLError as e:
            name_err = str(e)
        ts.append(1000 * (time.perf_counter() - t))
    print(f"  {name:<18} {statistics.median(ts):6.3f} ms")
PY
