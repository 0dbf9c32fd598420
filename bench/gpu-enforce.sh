#!/bin/bash
# Enforcement on a real GPU (issue 14): does [enforce] limit = "mps" hold a container to its
# reservation while its neighbours run? Run as root on a GPU host with one GPU, after
# `cargo build --release` (the wrapper must call vramgate::enforce at create):
#
#   bench/gpu-enforce.sh [RESULTS_DIR]        # default: $OUT, else $WORK/enforce
#
# Needs: python3 with torch and pynvml; the MPS binaries (nvidia-cuda-mps-control, on PATH or
# in /usr/local/nvidia/bin); runc on PATH or unpacked from the .debs in $DEBS (see
# gpu-common.sh); target/release/{vramgate,vramgate-hook,vramgate-runtime} (or $VRAMGATE_BIN).
# Every container goes through vramgate-runtime, as Docker's or containerd's would.
#
# Steps, each with PASS/FAIL lines in RESULTS_DIR/summary.txt (exit 1 when any FAIL):
#   0. doctor, before MPS: the driver-limit tier is unavailable on this driver (580 < R615);
#   1. control, limit = "none": one container reserves 4Gi and takes 16 GiB (nothing stops it);
#   2. an MPS control daemon starts (its own pipe directory, quit on exit); doctor sees it;
#   3. guardrails and MPS env from inside a container (`env`), and a container that presets
#      them: its TF setting is kept, its MPS limit replaced;
#   4. limit = "mps": 20 neighbours reserve 3Gi and use 2 GiB for ~20 s, one hog reserves 4Gi
#      and tries 16 GiB: the hog fails alone with CUDA out-of-memory, all 20 complete;
#      mid-run: `vramgate status --json` (each container's tier) and NVML's per-process memory
#      (is an MPS client's memory charged to the client, the server, or both?);
#   5. experiment: mps_device_key = "ordinal" (the default is "uuid" since issue 19);
#   6. limit = "driver" on this driver (580 has no nvmlDeviceSetMemoryLimits_v1), through the
#      built hook with the capabilities it keeps: the hook alone (plain runc, the hook in the
#      spec, as podman's hooks.d) and behind the wrapper are refused with the precise reason
#      and leave nothing reserved; under on_state_error = "fail-open" the container runs and
#      the event log says why it has no limit.
set -uo pipefail
source "$(dirname "$0")/gpu-common.sh"   # sourced without -e: it probes with commands that may fail
set -e

start_mps_check enforce 20 enf "${1:-}"

cleanup() {
    set +e
    runc_ list -q 2>/dev/null | grep "^$PREFIX-" | while read -r id; do runc_ delete --force "$id" >/dev/null 2>&1; done
    if [ -S "$PIPE/control" ]; then
        echo quit | mps_env timeout 20 "$MPS_CONTROL" >/dev/null 2>&1
        echo "mps control daemon: quit sent" >&2
    fi
}
trap cleanup EXIT

say "# $(date -u +%FT%TZ) $(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
say "# runc=$("$RUNC" --version | head -1) vramgate=$("$BIN/vramgate" --version 2>&1 | head -1) N=$N"

# write_config FILE LABEL LIMIT [extra [enforce] lines]
write_config() {
    local file=$1 label=$2 limit=$3
    shift 3
    {
        echo "state_dir = \"$STATE_BASE/enforce-$label\""
        echo "policy = \"reject\""
        echo "[runtime]"
        echo "runtimes = [\"$RUNC\"]"
        echo "[inventory]"
        echo "backend = \"nvml\""
        echo "[enforce]"
        echo "limit = \"$limit\""
        echo "mps_pipe_directory = \"$PIPE\""
        echo "mps_log_directory = \"$LOGD\""
        for line in "$@"; do echo "$line"; done
    } >"$file"
}

# vrun CONFIG DIR ID: one container through vramgate-runtime, bounded; writes DIR/log, DIR/rc.
vrun() {
    local config=$1 dir=$2 id=$3 rc=0
    LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu" VRAMGATE_CONFIG=$config \
        timeout -k 10 "${RUN_TIMEOUT:-300}" "$BIN/vramgate-runtime" --root "$RUNC_ROOT" run "${RUN_FLAGS[@]}" \
        --bundle "$dir" "$id" </dev/null >"$dir/log" 2>&1 || rc=$?
    echo "$rc" >"$dir/rc"
    return 0
}

# job_bundle DIR REQUEST JOB_GIB JOB_SECONDS [gpu_bundle args]: a gpu_job.py container, no hooks
# of its own (the wrapper adds them).
job_bundle() { bundle "$1" - "$2" "$3" "$4" "${@:5}"; }

# env_bundle DIR REQUEST [--env K=V]...: a container that prints its environment.
env_bundle() {
    local dir=$1 request=$2
    shift 2
    "$PY" "$here/gpu_bundle.py" --template "$WORK/template/config.json" --rootfs "$ROOTFS" --bundle "$dir" \
        --annotation "vramgate.dev/memory=$request" --env NVIDIA_VISIBLE_DEVICES=0 --gpu-minors "$GPU0_MINOR" "$@" -- /usr/bin/env
}

envvar() { grep -m1 "^$2=" "$1/log" | cut -d= -f2- || true; }

# ---- 0. doctor before MPS
cfg0=$T/doctor.toml
write_config "$cfg0" doctor mps
VRAMGATE_CONFIG=$cfg0 timeout 60 "$BIN/vramgate" doctor >"$R/doctor-before-mps.txt" 2>&1 || true
cat "$R/doctor-before-mps.txt"
if grep -Eq "driver-limit +unavailable: .*nvmlDeviceSetMemoryLimits_v1.*R615" "$R/doctor-before-mps.txt"; then
    pass "doctor: the driver limit is unavailable on this driver and names R615"
else
    fail "doctor: no driver-limit line saying unavailable/R615 (see doctor-before-mps.txt)"
fi
if grep -Eq "^PROBLEM enforce .*no MPS control daemon" "$R/doctor-before-mps.txt"; then
    pass "doctor: limit = mps without a daemon is a problem"
else
    fail "doctor: limit = mps without a daemon not reported"
fi

# ---- 1. control: no limit, the hog takes what it wants
cfg1=$T/none.toml
write_config "$cfg1" none none
mkdir -p "$T/control"
job_bundle "$T/control" 4Gi 16 2
vrun "$cfg1" "$T/control" "$PREFIX-control"
if [ "$(cat "$T/control/rc")" = 0 ] && grep -q "^ok " "$T/control/log"; then
    pass "control (limit = none): a container that reserved 4Gi allocated 16 GiB"
else
    fail "control (limit = none): the 16 GiB job did not complete: rc $(cat "$T/control/rc"), $(tail -1 "$T/control/log")"
fi

# ---- 1b. the same 20 neighbours without MPS: what admission sees, for the comparison in 4
neighbours_status() {   # CONFIG LABEL: runs N neighbours, saves status mid-run as $R/status-LABEL.json
    local config=$1 label=$2 npids=()
    for i in $(seq 1 "$N"); do
        mkdir -p "$T/$label$i"
        job_bundle "$T/$label$i" 3Gi 2 "${NEIGHBOUR_SECONDS:-20}"
        vrun "$config" "$T/$label$i" "$PREFIX-$label$i" &
        npids+=($!)
    done
    wait_for_reservations "$config" "$N"
    sleep "${MID_DELAY:-8}"
    VRAMGATE_CONFIG=$config timeout 20 "$BIN/vramgate" status --json >"$R/status-$label.json" 2>&1 || true
    for p in "${npids[@]}"; do wait "$p" || true; done
}
neighbours_status "$cfg1" plain

mps_env "$MPS_CONTROL" -d
for _ in $(seq 1 50); do [ -S "$PIPE/control" ] && break; sleep 0.1; done
if [ -S "$PIPE/control" ]; then pass "mps control daemon started ($PIPE/control)"; else fail "mps control daemon did not start"; exit 1; fi
cfg=$T/mps.toml
write_config "$cfg" mps mps
VRAMGATE_CONFIG=$cfg timeout 60 "$BIN/vramgate" doctor >"$R/doctor-mps.txt" 2>&1 || true
if grep -Eq "^ok +enforce .*MPS control daemon serves" "$R/doctor-mps.txt"; then
    pass "doctor: sees the MPS daemon"
else
    fail "doctor: does not see the MPS daemon (doctor-mps.txt)"
fi

# ---- 3. what a container's environment gets
mkdir -p "$T/env" "$T/env-preset"
env_bundle "$T/env" 4Gi
vrun "$cfg" "$T/env" "$PREFIX-env"
cp "$T/env/log" "$R/env-inside-container.txt"
grep -E "^(TF_|XLA_|CUDA_MPS_|NVIDIA_GPU_MEMORY)" "$T/env/log" | sed 's/^/  /' | tee -a "$SUMMARY" || true
total_mib=$(timeout 30 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
want_fraction=$("$PY" -c "import math; print(f'{math.floor(4096 * 1000 / $total_mib) / 1000:.3f}')")
check_env() {
    local dir=$1 name=$2 want=$3 got
    got=$(envvar "$dir" "$name")
    if [ "$got" = "$want" ]; then pass "env $name=$want ($(basename "$dir"))"; else fail "env $name: want '$want', got '$got' ($(basename "$dir"))"; fi
}
check_env "$T/env" TF_FORCE_GPU_ALLOW_GROWTH true
check_env "$T/env" XLA_PYTHON_CLIENT_PREALLOCATE false
check_env "$T/env" XLA_CLIENT_MEM_FRACTION "$want_fraction"
check_env "$T/env" XLA_PYTHON_CLIENT_MEM_FRACTION "$want_fraction"
GPU0_UUID=$(timeout 30 nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
check_env "$T/env" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "$GPU0_UUID=4096M"
check_env "$T/env" CUDA_MPS_PIPE_DIRECTORY "$PIPE"
env_bundle "$T/env-preset" 4Gi --env TF_FORCE_GPU_ALLOW_GROWTH=false --env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G
vrun "$cfg" "$T/env-preset" "$PREFIX-env-preset"
cp "$T/env-preset/log" "$R/env-preset-inside-container.txt"
check_env "$T/env-preset" TF_FORCE_GPU_ALLOW_GROWTH false
check_env "$T/env-preset" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "$GPU0_UUID=4096M"

# ---- 4. the hog and its neighbours under MPS
for i in $(seq 1 "$N"); do
    mkdir -p "$T/n$i"
    job_bundle "$T/n$i" 3Gi 2 "${NEIGHBOUR_SECONDS:-20}"
done
mkdir -p "$T/hog"
job_bundle "$T/hog" 4Gi 16 5
pids=()
for i in $(seq 1 "$N"); do
    vrun "$cfg" "$T/n$i" "$PREFIX-n$i" &
    pids+=($!)
done
vrun "$cfg" "$T/hog" "$PREFIX-hog" &
pids+=($!)

# Mid-run: once every neighbour holds its reservation and has had time to grow.
wait_for_reservations "$cfg" "$N"
sleep "${MID_DELAY:-8}"
VRAMGATE_CONFIG=$cfg timeout 20 "$BIN/vramgate" status --json >"$R/status-mid.json" 2>&1 || true
VRAMGATE_CONFIG=$cfg timeout 20 "$BIN/vramgate" status >"$R/status-mid.txt" 2>&1 || true
timeout 30 nvidia-smi >"$R/nvidia-smi-mid.txt" 2>&1 || true
timeout 60 "$PY" "$here/gpu_mps_probe.py" --json "$R/nvml-mid.json" >"$R/nvml-mid.txt" 2>&1 || true
cat "$R/nvml-mid.txt"
verdict=$(grep -m1 "^VERDICT" "$R/nvml-mid.txt" || echo "VERDICT none (the probe failed: nvml-mid.txt)")
info "NVML under MPS: ${verdict#VERDICT }"
"$PY" - "$R/status-mid.json" "$N" <<'PY' | tee -a "$SUMMARY" || failures=$((failures + 1))
import collections, json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"FAIL status --json mid-run is not JSON: {e}")
    sys.exit(1)
tiers = collections.Counter()
for g in report["gpus"]:
    for r in g["reservations"]:
        tiers[r.get("tier", "(no tier field)")] += 1
print(f"INFO tiers mid-run: {dict(tiers)}")
if tiers and set(tiers) == {"mps_limit"} and sum(tiers.values()) >= int(sys.argv[2]):
    print("PASS status: every running container reports tier mps_limit")
else:
    print("FAIL status: not every container reports tier mps_limit")
    sys.exit(1)
PY
for p in "${pids[@]}"; do wait "$p" || true; done
# Admission's view with and without MPS: the same reservations, and memory used outside
# vramgate not inflated by the MPS server (clients' memory counted once).
"$PY" - "$R/status-plain.json" "$R/status-mid.json" <<'PY' | tee -a "$SUMMARY" || failures=$((failures + 1))
import json, sys
def view(path):
    g = json.load(open(path))["gpus"][0]
    mine = [r for r in g["reservations"] if "-n" in r["container_id"] or "plain" in r["container_id"]]
    return sum(r["bytes"] for r in mine) >> 20, sum(r["used"] or 0 for r in mine) >> 20, g["used_outside"] >> 20
plain, mps = view(sys.argv[1]), view(sys.argv[2])
print(f"INFO neighbours without MPS: reserved {plain[0]} MiB, used by them {plain[1]} MiB, used outside vramgate {plain[2]} MiB")
print(f"INFO neighbours under MPS:   reserved {mps[0]} MiB, used by them {mps[1]} MiB, used outside vramgate {mps[2]} MiB")
# MPS clients share the server's context, so they may use less than plain processes: what
# matters is that no memory is counted twice, i.e. "used outside vramgate" does not grow by
# the clients' memory (only by the MPS server's own few MiB).
ok = plain[0] == mps[0] and mps[2] - plain[2] <= 256
print(("PASS" if ok else "FAIL") + " admission counts MPS clients once (outside vramgate grows by the MPS server alone)")
sys.exit(0 if ok else 1)
PY

ok=0
for i in $(seq 1 "$N"); do
    if [ "$(cat "$T/n$i/rc")" = 0 ] && grep -q "^ok " "$T/n$i/log"; then
        ok=$((ok + 1))
    else
        info "neighbour $i: rc $(cat "$T/n$i/rc"): $(grep -m1 -E "FAILED|vramgate|error" "$T/n$i/log" || tail -1 "$T/n$i/log")"
    fi
done
if [ "$ok" = "$N" ]; then pass "all $N neighbours completed"; else fail "$ok of $N neighbours completed"; fi
hog_rc=$(cat "$T/hog/rc")
if grep -q "FAILED out of memory" "$T/hog/log"; then
    pass "the hog (reserved 4Gi, tried 16 GiB) failed with CUDA out-of-memory (rc $hog_rc): $(grep -m1 FAILED "$T/hog/log" | cut -c1-160)"
else
    fail "the hog was not stopped: rc $hog_rc, $(tail -2 "$T/hog/log" | tr '\n' ' ' | cut -c1-200)"
fi
mkdir -p "$R/logs"
for d in "$T"/n[0-9]* "$T"/hog "$T"/control; do cp "$d/log" "$R/logs/$(basename "$d").log"; done
cp "$STATE_BASE/enforce-mps/events.jsonl" "$R/events-mps.jsonl" 2>/dev/null || true

# ---- 5. experiment: the pinned limit keyed by ordinal
cfgo=$T/mps-ordinal.toml
write_config "$cfgo" ordinal mps 'mps_device_key = "ordinal"'
mkdir -p "$T/hog-ordinal"
job_bundle "$T/hog-ordinal" 4Gi 16 2
vrun "$cfgo" "$T/hog-ordinal" "$PREFIX-hog-ordinal"
cp "$T/hog-ordinal/log" "$R/logs/hog-ordinal.log"
if grep -q "FAILED out of memory" "$T/hog-ordinal/log"; then
    info "mps_device_key = ordinal: honoured (the hog hit out-of-memory at its 4Gi)"
else
    info "mps_device_key = ordinal: NOT honoured (rc $(cat "$T/hog-ordinal/rc"): $(tail -1 "$T/hog-ordinal/log" | cut -c1-160))"
fi

# ---- 6. limit = "driver" on a driver without the call
reserved_count() {   # CONFIG: how many reservations status lists
    VRAMGATE_CONFIG=$1 timeout 20 "$BIN/vramgate" status --json 2>/dev/null |
        "$PY" -c 'import json,sys; print(sum(len(g["reservations"]) for g in json.load(sys.stdin)["gpus"]))' 2>/dev/null || echo "?"
}
refused_for_r615() {   # DIR LABEL
    local dir=$1 label=$2
    if [ "$(cat "$dir/rc")" != 0 ] && grep -q "does not export nvmlDeviceSetMemoryLimits_v1" "$dir/log" && grep -q "R615" "$dir/log"; then
        pass "driver tier, $label: refused with the reason: $(grep -m1 -o 'vramgate: container.*' "$dir/log" | cut -c1-220)"
    else
        fail "driver tier, $label: rc $(cat "$dir/rc"), $(tail -2 "$dir/log" | tr '\n' ' ' | cut -c1-240)"
    fi
}
cfgd=$T/driver.toml
write_config "$cfgd" driver driver
mkdir -p "$T/drv-hook" "$T/drv-wrap" "$T/drv-open"
bundle "$T/drv-hook" "$cfgd" 1Gi 1 1
rc=0; runc_ run "${RUN_FLAGS[@]}" --bundle "$T/drv-hook" "$PREFIX-drv-hook" </dev/null >"$T/drv-hook/log" 2>&1 || rc=$?
echo "$rc" >"$T/drv-hook/rc"
runc_ delete --force "$PREFIX-drv-hook" >/dev/null 2>&1 || true
refused_for_r615 "$T/drv-hook" "the hook alone (plain runc, hook in the spec)"
job_bundle "$T/drv-wrap" 1Gi 1 1
vrun "$cfgd" "$T/drv-wrap" "$PREFIX-drv-wrap"
refused_for_r615 "$T/drv-wrap" "behind vramgate-runtime"
n=$(reserved_count "$cfgd")
if [ "$n" = 0 ]; then pass "driver tier: nothing left reserved after the refusals"; else fail "driver tier: $n reservation(s) left after the refusals"; fi
cfgdo=$T/driver-open.toml
write_config "$cfgdo" driver-open driver
sed -i '1i on_state_error = "fail-open"' "$cfgdo"
bundle "$T/drv-open" "$cfgdo" 1Gi 1 1
rc=0; runc_ run "${RUN_FLAGS[@]}" --bundle "$T/drv-open" "$PREFIX-drv-open" </dev/null >"$T/drv-open/log" 2>&1 || rc=$?
echo "$rc" >"$T/drv-open/rc"
runc_ delete --force "$PREFIX-drv-open" >/dev/null 2>&1 || true
events=$STATE_BASE/enforce-driver-open/events.jsonl
cp "$events" "$R/events-driver-open.jsonl" 2>/dev/null || true
if [ "$rc" = 0 ] && grep -q "^ok " "$T/drv-open/log" && grep '"fail_open"' "$events" 2>/dev/null | grep -q "R615"; then
    pass "driver tier, fail-open: the container ran without a limit and the event log says why: $(grep -m1 '"fail_open"' "$events" | cut -c1-240)"
else
    fail "driver tier, fail-open: rc $rc, $(tail -1 "$T/drv-open/log" | cut -c1-160); events: $(tail -2 "$events" 2>/dev/null | cut -c1-240)"
fi
VRAMGATE_CONFIG=$cfgd timeout 60 "$BIN/vramgate" doctor >"$R/doctor-driver.txt" 2>&1 || true
for d in drv-hook drv-wrap drv-open; do cp "$T/$d/log" "$R/logs/$d.log"; done

say "# $failures failure(s); results in $R"
[ "$failures" = 0 ]
