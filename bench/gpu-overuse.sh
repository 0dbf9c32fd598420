#!/bin/bash
# The over-use watch on a real GPU (issue 30, item 3): one container reserving 4Gi under
# [enforce] limit = "mps" runs two CUDA processes of 3 GiB each. MPS's pinned limit holds each
# process (3 GiB < 4 GiB), not the container (6 GiB and contexts). `vramgate watch` runs beside
# it, with neighbours reserving 3Gi and using 2 GiB.
#   1. over_use = "report": the container runs to completion; an over_use event is written;
#      measured: time from the container's first NVML sample over 4 GiB to the event.
#   2. over_use = "kill": the container is stopped; measured: time from over-use to the
#      over_use_stop event and to the container's exit; every neighbour completes (rc 0).
# Not CI. Run as root on a GPU host with the MPS binaries (nvidia-cuda-mps-control on PATH or
# in /usr/local/nvidia/bin), python3 with torch and pynvml, and the release binaries:
#   bench/gpu-overuse.sh [RESULT_DIR]
set -uo pipefail
source "$(dirname "$0")/gpu-common.sh"   # sourced without -e: it probes with commands that may fail
set -e

start_mps_check overuse 6 ovu "${1:-}"
cp "$here/gpu_two_procs.sh" "$WORK/gpu_two_procs.sh"
WATCH_PID=
cleanup() {
    set +e
    [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null
    runc_ list -q 2>/dev/null | grep "^$PREFIX-" | while read -r id; do runc_ delete --force "$id" >/dev/null 2>&1; done
    [ -S "$PIPE/control" ] && echo quit | mps_env timeout 20 "$MPS_CONTROL" >/dev/null 2>&1
}
trap cleanup EXIT

say "# $(date -u +%FT%TZ) $(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
say "# runc=$("$RUNC" --version | head -1) vramgate=$("$BIN/vramgate" --version 2>&1 | head -1) neighbours=$N"
mps_env "$MPS_CONTROL" -d
sleep 1
[ -S "$PIPE/control" ] || { fail "mps control daemon did not start"; exit 1; }

# write_config FILE LABEL ACTION
write_config() {
    cat >"$1" <<TOML
state_dir = "$STATE_BASE/overuse-$2"
policy = "reject"
[runtime]
runtimes = ["$RUNC"]
[inventory]
backend = "nvml"
[enforce]
limit = "mps"
mps_pipe_directory = "$PIPE"
mps_log_directory = "$LOGD"
over_use = "$3"
over_use_interval = "500ms"
TOML
}

# vrun CONFIG DIR ID: one container through vramgate-runtime; writes DIR/log and DIR/rc
# ("rc start end").
vrun() {
    local config=$1 dir=$2 id=$3 rc=0 s
    s=$(date +%s.%N)
    LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu" VRAMGATE_CONFIG=$config \
        timeout -k 10 "${RUN_TIMEOUT:-240}" "$BIN/vramgate-runtime" --root "$RUNC_ROOT" run "${RUN_FLAGS[@]}" \
        --bundle "$dir" "$id" </dev/null >"$dir/log" 2>&1 || rc=$?
    echo "$rc $s $(date +%s.%N)" >"$dir/rc"
}

# round ACTION: the greedy container and its neighbours under `vramgate watch`.
round() {
    local action=$1 cfg=$T/$1.toml dir=$T/$1
    mkdir -p "$dir"
    write_config "$cfg" "$action" "$action"
    VRAMGATE_CONFIG=$cfg "$BIN/vramgate" watch >"$R/watch-$action.log" 2>&1 &
    WATCH_PID=$!
    local pids=() i
    for i in $(seq 1 "$N"); do
        mkdir -p "$dir/n$i"
        bundle "$dir/n$i" - 3Gi 2 "${NEIGHBOUR_SECONDS:-25}"
        vrun "$cfg" "$dir/n$i" "$PREFIX-$action-n$i" &
        pids+=($!)
    done
    mkdir -p "$dir/greedy"
    bundle "$dir/greedy" - 4Gi 3 "${GREEDY_SECONDS:-15}"
    # The two-process command instead of gpu_job.py alone.
    "$PY" - "$dir/greedy/config.json" "$WORK/gpu_two_procs.sh" <<'PY'
import json, sys
path, script = sys.argv[1:]
spec = json.load(open(path))
spec["process"]["args"] = ["/bin/sh", script]
json.dump(spec, open(path, "w"), indent=2)
PY
    vrun "$cfg" "$dir/greedy" "$PREFIX-$action-greedy" &
    local greedy=$!
    # The container's pid namespace, once its init exists, for the sampler.
    local ns=""
    for _ in $(seq 1 200); do
        pid=$(runc_ state "$PREFIX-$action-greedy" 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pid"])' 2>/dev/null || true)
        if [ -n "$pid" ] && [ "$pid" != 0 ]; then ns=$(stat -Lc %i "/proc/$pid/ns/pid" 2>/dev/null || true); fi
        [ -n "$ns" ] && break
        sleep 0.05
    done
    [ -n "$ns" ] || { fail "$action: the greedy container never started ($(cat "$dir/greedy/log"))"; }
    "$PY" "$here/gpu_overuse_sample.py" "$ns" $((4 << 30)) >"$dir/sample.json" &
    local sampler=$!
    # Mid-run status, once the greedy container has grown.
    sleep "${MID_DELAY:-12}"
    VRAMGATE_CONFIG=$cfg timeout 20 "$BIN/vramgate" status >"$R/status-$action.txt" 2>&1 || true
    VRAMGATE_CONFIG=$cfg timeout 20 "$BIN/vramgate" status --json >"$R/status-$action.json" 2>&1 || true
    wait "$greedy" || true
    for p in "${pids[@]}"; do wait "$p" || true; done
    kill "$sampler"; wait "$sampler" || true
    kill "$WATCH_PID"; wait "$WATCH_PID" 2>/dev/null || true
    WATCH_PID=
    cp "$STATE_BASE/overuse-$action/events.jsonl" "$R/events-$action.jsonl" 2>/dev/null || true
    "$PY" - "$action" "$dir" "$R/events-$action.jsonl" "$N" "$PREFIX-$action-greedy" "$R/status-$action.json" <<'PY' | tee -a "$SUMMARY" || failures=$((failures + 1))
import json, sys
action, d, events_path, n, greedy_id, status_path = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
sample = json.load(open(f"{d}/sample.json"))
rc, start, end = open(f"{d}/greedy/rc").read().split()
try:
    events = [json.loads(l) for l in open(events_path)]
except OSError:
    events = []
mine = [e for e in events if e["container"] == greedy_id]
over = next((e for e in mine if e["event"] == "over_use"), None)
stop = next((e for e in mine if e["event"] == "over_use_stop"), None)
others = [e for e in events if e["event"].startswith("over_use") and e["container"] != greedy_id]
print(f"INFO {action}: greedy peak {sample['peak'] >> 20} MiB (reserved 4096 MiB), rc {rc}, first over 4 GiB at {sample['first_over']}")
neighbours = [open(f"{d}/n{i}/rc").read().split()[0] for i in range(1, n + 1)]
ok = True
def check(cond, text):
    global ok
    print(("PASS " if cond else "FAIL ") + f"{action}: {text}")
    ok &= bool(cond)
check(over is not None, "an over_use event for the greedy container" + (f": {over['detail']}" if over else ""))
check(not others, f"no over_use event for a neighbour ({len(others)})")
check(all(r == "0" for r in neighbours), f"every neighbour completed (rc {neighbours})")
if over and sample["first_over"]:
    print(f"INFO {action}: over-use to over_use event: {over['time_unix_ms'] / 1000 - sample['first_over']:.3f} s")
if action == "report":
    # Under kill the container is gone before the mid-run status is taken.
    try:
        st = json.load(open(status_path))
        flagged = [r for g in st["gpus"] for r in g["reservations"] if r["container_id"] == greedy_id and r["over_reservation"]]
        check(flagged, "status --json mid-run flags the greedy container over_reservation")
    except Exception as e:
        check(False, f"status --json mid-run: {e}")
    check(rc == "0", "under report the greedy container runs to completion")
    check(sample["peak"] > 6 << 30, f"its two processes held {sample['peak'] >> 20} MiB together, each within MPS's 4 GiB")
else:
    check(stop is not None, "an over_use_stop event" + (f": {stop['detail']}" if stop else ""))
    check(rc != "0", f"the greedy container was stopped (rc {rc})")
    if stop and sample["first_over"]:
        print(f"INFO kill: over-use to over_use_stop event: {stop['time_unix_ms'] / 1000 - sample['first_over']:.3f} s; to the container's exit: {float(end) - sample['first_over']:.3f} s")
sys.exit(0 if ok else 1)
PY
}

round report
round kill
say "failures: $failures"
exit $((failures > 0))
