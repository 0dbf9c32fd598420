#!/bin/bash
# The paper's failure on a real GPU, and vramgate fixing it. Run as root on a GPU host:
#
#   JOB_GIB=6 JOB_SECONDS=5 BASELINE_N="14 16" WAIT_N="14 16 24" REJECT_N="16" bench/gpu-experiment.sh
#
# Each job grows its GPU memory in 256 MiB steps to JOB_GIB GiB (like TensorFlow's memory
# growth), then multiplies matrices for JOB_SECONDS s (bench/gpu_job.py), in its own runc
# container. Steps:
#   1. calibrate: one job on the host, NVML reading its CUDA context and its peak; the request
#      is that peak rounded up to 64 MiB (JOB_GIB + context + cuBLAS workspace) unless REQUEST_MIB is set;
#   2. K = how many requests fit on the idle GPU (vramgate's own "available"); K containers
#      at once without vramgate give one wave's time T (all fit, all should pass);
#   3. baseline: N containers at once, no vramgate (expect out-of-memory failures);
#   4. wait: N containers with the hook, policy wait: zero failures, makespan vs ceil(N/K) * T;
#   5. reject: N containers with the hook, policy reject: K run, the rest are refused at start.
# One line per run goes to $RESULTS (default $WORK/experiment.txt).
set -u
source "$(dirname "$0")/gpu-common.sh"
JOB_GIB=${JOB_GIB:-6}
JOB_SECONDS=${JOB_SECONDS:-5}
RESULTS=${RESULTS:-$WORK/experiment.txt}
RECORD_DIR=${RECORD_DIR:-$WORK/records}
mkdir -p "$RECORD_DIR"
: >"$RESULTS"
say() { echo "$*" | tee -a "$RESULTS"; }

say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
say "# JOB_GIB=$JOB_GIB JOB_SECONDS=$JOB_SECONDS runc=$("$RUNC" --version | head -1)"

# 1. calibrate
cal=$(JOB_REPORT=1 JOB_GIB=$JOB_GIB JOB_SECONDS=$JOB_SECONDS "$PY" "$WORK/gpu_job.py")
echo "$cal"
ctx=$(echo "$cal" | awk '/^context_bytes/ {print $2}')
peak=$(echo "$cal" | awk '/^peak_bytes/ {print $2}')
if [ -z "${REQUEST_MIB:-}" ]; then
    REQUEST_MIB=$(( (peak + (64 << 20) - 1) / (64 << 20) * 64 ))
fi
say "# calibration: CUDA context $((ctx >> 20)) MiB, job peak $((peak >> 20)) MiB (NVML, per process); request ${REQUEST_MIB}Mi"

avail_cfg=$WORK/avail.toml
write_config "$avail_cfg" $STATE_BASE/avail reject
avail=$(VRAMGATE_CONFIG=$avail_cfg "$BIN/vramgate" status --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gpus"][0]["available"])')
K=$(( avail / (REQUEST_MIB << 20) ))
say "# idle GPU: $((avail >> 20)) MiB available to requests -> K=$K jobs fit at once"
rm -rf $STATE_BASE/avail

# run_batch LABEL MODE N  (MODE: baseline | wait | reject); prints "ok failed refused makespan peak"
run_batch() {
    local label=$1 mode=$2 n=$3
    local dir=$WORK/$label state=$STATE_BASE/$label config=-
    rm -rf "$dir" "$state"
    mkdir -p "$dir"
    if [ "$mode" != baseline ]; then
        config=$dir/config.toml
        write_config "$config" "$state" "$mode"
    fi
    local request=-
    [ "$mode" != baseline ] && request=${REQUEST_MIB}Mi
    for i in $(seq 1 "$n"); do
        bundle "$dir/c$i" "$config" "$request" "$JOB_GIB" "$JOB_SECONDS"
    done
    "$PY" "$here/gpu_sample.py" >"$dir/peak" &
    local sampler=$!
    local t0
    t0=$(date +%s.%N)
    local pids=()
    for i in $(seq 1 "$n"); do
        start_container "$dir/c$i" "$label-$i"
        pids+=($!)
    done
    if [ "$mode" = wait ] && [ ! -f "$RECORD_DIR/wait-$n.json" ]; then
        # Mid-run: the first wave computing, the rest queued. Recorded for the fixtures.
        (
            sleep "${RECORD_AT:-9}"
            VRAMGATE_CONFIG=$config "$BIN/vramgate" status --record "$RECORD_DIR/wait-$n.json" \
                --note "$n containers of $JOB_GIB GiB, policy wait, request ${REQUEST_MIB}Mi, ${RECORD_AT:-9}s after start" >"$RECORD_DIR/wait-$n.status.txt" 2>&1
        ) &
    fi
    wait "${pids[@]}"
    local t1
    t1=$(date +%s.%N)
    kill -TERM "$sampler"
    wait "$sampler"
    local leftover=0
    if [ "$config" != - ]; then
        leftover=$(left_in_ledger "$config")
        cp "$state/events.jsonl" "$dir/events.jsonl" 2>/dev/null
    fi
    runc_ list -q 2>/dev/null | grep "^$label-" | xargs -r -n1 "$RUNC" --root "$RUNC_ROOT" delete --force 2>/dev/null
    PYTHONPATH="$here" "$PY" - "$dir" "$n" "$t0" "$t1" "$(cat "$dir/peak")" "$leftover" <<'PY'
import sys
from gpu_outcome import containers
d, n, t0, t1, peak, leftover = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
ok = failed = refused = 0
durations = []
reasons = {}
for log, done, seconds in containers(d, n):
    if done:
        ok += 1
        durations.append(seconds)
    elif "vramgate: refused" in log:
        refused += 1
    else:
        failed += 1
        line = next((l for l in log.splitlines() if "FAILED" in l), log.strip().splitlines()[-1] if log.strip() else "no output")
        reasons[line[:120]] = reasons.get(line[:120], 0) + 1
durations.sort()
med = durations[len(durations) // 2] if durations else 0
print(f"{ok} {failed} {refused} {t1 - t0:.1f} {peak} {med:.1f} {leftover}")
for r, c in reasons.items():
    print(f"#   {c}x {r}", file=sys.stderr)
PY
}

# 2. one wave
read -r ok failed refused T peak med left < <(run_batch wave baseline "$K" 2>>"$RESULTS")
say "baseline N=$K (one wave): ok=$ok failed=$failed refused=$refused makespan=${T}s peak_used=${peak}MiB median_job=${med}s"

# 3. baseline
for n in ${BASELINE_N:-14 16}; do
    read -r ok failed refused m peak med left < <(run_batch base-$n baseline "$n" 2>>"$RESULTS")
    say "baseline N=$n: ok=$ok failed=$failed refused=$refused makespan=${m}s peak_used=${peak}MiB"
done

# 4. wait
for n in ${WAIT_N:-14 16 24}; do
    read -r ok failed refused m peak med left < <(run_batch wait-$n wait "$n" 2>>"$RESULTS")
    waves=$(( (n + K - 1) / K ))
    bound=$("$PY" -c "w, t, m = $waves, $T, $m; print(f'ideal={w}x{t}s={w * t:.1f}s ratio={m / (w * t):.3f}')")
    say "wait N=$n: ok=$ok failed=$failed refused=$refused makespan=${m}s $bound peak_used=${peak}MiB left_in_ledger=$left"
done

# 5. reject
for n in ${REJECT_N:-16}; do
    read -r ok failed refused m peak med left < <(run_batch reject-$n reject "$n" 2>>"$RESULTS")
    say "reject N=$n: ok=$ok failed=$failed refused=$refused makespan=${m}s peak_used=${peak}MiB left_in_ledger=$left"
    grep -h "vramgate: refused" "$WORK"/reject-$n/c*/log | head -1 | tee -a "$RESULTS"
done
