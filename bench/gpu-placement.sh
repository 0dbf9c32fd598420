#!/bin/bash
# Placement on a real multi-GPU host (issue 12). Run as root on a host with 2 or more GPUs:
#
#   N=80 JOB_SECONDS=8 bench/gpu-placement.sh [pinned0] [roundrobin] [auto]
#   MIN_GPUS=1 N=20 bench/gpu-placement.sh pinned0 auto     (a smoke test on one GPU)
#
# N PyTorch jobs of mixed sizes (SIZES GiB, cycled, plus their CUDA context) start at once,
# each in its own runc container through vramgate-runtime (`run`), policy wait, in up to three
# runs:
#   baseline    without vramgate: plain runc, no request, job i pinned to GPU i mod G by hand
#               (what a host without admission control does with the same burst);
#   pinned0     every job NVIDIA_VISIBLE_DEVICES=0, only GPU 0's device node (what users do today);
#   roundrobin  job i pinned to GPU i mod G by hand, only that GPU's node;
#   auto        vramgate.dev/gpus=auto and every GPU's node, as CDI gives them: the wrapper
#               chooses the GPU (best fit) and narrows the container to it.
#   fifo, arrival, largest, longest
#               auto, and the queue's order (issue 34): no backfill, or backfill with that
#               [queue] backfill_order; each job runs JOB_SECONDS from DURATIONS (cycled, coprime
#               with SIZES) and declares vramgate.dev/expected-duration = its JOB_SECONDS +
#               DECLARE_EXTRA (its growth and start-up). Each run's event log is then replayed
#               with the same settings: the measured makespan / lower bound beside the replayed.
#                 MIN_GPUS=1 N=40 DURATIONS="3 4 5 6 7 8 9" bench/gpu-placement.sh fifo arrival longest
# Each job grows to its size in 256 MiB steps, then multiplies matrices for JOB_SECONDS s
# (bench/gpu_job.py); out-of-memory exits 3. A sampler records every second what vramgate has
# reserved and what NVML says is used, per GPU ($WORK/<run>/timeline.csv). One summary line a
# run goes to $RESULTS (default $WORK/placement.txt); targets: zero OOM and zero failures in
# every run, auto's makespan <= 1.05 x roundrobin's and <= 0.6 x pinned0's.
set -u
source "$(dirname "$0")/gpu-common.sh"
N=${N:-80}
JOB_SECONDS=${JOB_SECONDS:-8}
SIZES=${SIZES:-"2 3 4 6 8 12 16 24 32"}
DURATIONS=${DURATIONS:-}
DECLARE_EXTRA=${DECLARE_EXTRA:-4}
RESULTS=${RESULTS:-$WORK/placement.txt}
RUNS=("$@")
[ ${#RUNS[@]} -eq 0 ] && RUNS=(pinned0 roundrobin auto)
say() { echo "$*" | tee -a "$RESULTS"; }

G=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
# MIN_GPUS=1 runs the harness on one GPU (every run then lands on GPU 0): a smoke test of the
# script, the wrapper's `run` with auto and the real jobs, not the measurement.
[ "$G" -ge "${MIN_GPUS:-2}" ] || { echo "needs ${MIN_GPUS:-2} or more GPUs, found $G" >&2; exit 1; }
# index -> minor number of /dev/nvidiaN (usually equal; NVML says for sure)
mapfile -t MINOR < <("$PY" -c 'import pynvml as n; n.nvmlInit(); [print(n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(i))) for i in range(n.nvmlDeviceGetCount())]')
say "# $(date -u +%FT%TZ) $G x $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
say "# N=$N JOB_SECONDS=$JOB_SECONDS SIZES=($SIZES) runc=$("$RUNC" --version | head -1)"

# Calibrate: what a job holds beyond its own tensors (CUDA context, cuBLAS workspace, the
# matmul operands), from a 2 GiB job on the host; each request is its size plus that.
cal=$(JOB_REPORT=1 JOB_GIB=2 JOB_SECONDS=1 "$PY" "$WORK/gpu_job.py")
peak=$(echo "$cal" | awk '/^peak_bytes/ {print $2}')
OVERHEAD_MIB=$(( (peak >> 20) - 2048 + 64 ))
say "# calibration: a 2 GiB job peaks at $((peak >> 20)) MiB (NVML); request = size + ${OVERHEAD_MIB} MiB"
read -r -a SIZE_LIST <<<"$SIZES"
read -r -a DURATION_LIST <<<"${DURATIONS:-$JOB_SECONDS}"

# placement_config FILE STATE_DIR [QUEUE_LINE...]
placement_config() {
    local queue_lines
    queue_lines=$(printf '%s\n' "${@:3}")
    cat >"$1" <<TOML
state_dir = "$2"
policy = "wait"
wait_timeout = "20m"
max_wait_timeout = "1h"
[queue]
poll_interval = "200ms"
$queue_lines
[inventory]
backend = "nvml"
[runtime]
runtimes = ["$RUNC"]
hook_path = "$BIN/vramgate-hook"
TOML
}

# run_placement LABEL
run_placement() {
    local label=$1 dir=$WORK/place-$1 state=$STATE_BASE/place-$1
    rm -rf "$dir" "$state"
    mkdir -p "$dir"
    local config=$dir/config.toml
    local queue=()
    case $label in
        fifo) queue=('backfill = false') ;;
        arrival|largest|longest) queue=('backfill = true' "backfill_order = \"$label\"") ;;
    esac
    placement_config "$config" "$state" "${queue[@]}"
    local all_minors
    all_minors=$(IFS=,; echo "${MINOR[*]}")
    for i in $(seq 1 "$N"); do
        local gib=${SIZE_LIST[$(( (i - 1) % ${#SIZE_LIST[@]} ))]}
        local req=$(( gib * 1024 + OVERHEAD_MIB ))Mi
        local secs=${DURATION_LIST[$(( (i - 1) % ${#DURATION_LIST[@]} ))]}
        local gpu_args=() request=(--annotation "vramgate.dev/memory=$req")
        case $label in
            baseline)
                local g=$(( (i - 1) % G ))
                request=()
                gpu_args=(--gpu-minors "${MINOR[$g]}" --env NVIDIA_VISIBLE_DEVICES=$g) ;;
            pinned0) gpu_args=(--gpu-minors "${MINOR[0]}" --env NVIDIA_VISIBLE_DEVICES=0) ;;
            roundrobin)
                local g=$(( (i - 1) % G ))
                gpu_args=(--gpu-minors "${MINOR[$g]}" --env NVIDIA_VISIBLE_DEVICES=$g) ;;
            auto) gpu_args=(--gpu-minors "$all_minors" --annotation vramgate.dev/gpus=auto) ;;
            fifo|arrival|largest|longest)
                gpu_args=(--gpu-minors "$all_minors" --annotation vramgate.dev/gpus=auto
                    --annotation "vramgate.dev/expected-duration=$(( secs + DECLARE_EXTRA ))s") ;;
        esac
        "$PY" "$here/gpu_bundle.py" --template "$WORK/template/config.json" --rootfs "$ROOTFS" --bundle "$dir/c$i" \
            "${request[@]}" "${gpu_args[@]}" \
            --env JOB_GIB="$gib" --env JOB_SECONDS="$secs" -- "$PY" "$WORK/gpu_job.py"
    done
    # Sampler: reserved (vramgate) and used (NVML) per GPU, every second.
    (
        echo "t,$(for g in $(seq 0 $((G - 1))); do printf 'reserved%s_mib,used%s_mib,' "$g" "$g"; done)queued"
        t0=$(date +%s.%N)
        while :; do
            VRAMGATE_CONFIG=$config "$BIN/vramgate" status --json 2>/dev/null | "$PY" -c '
import json, sys, time
t0 = float(sys.argv[1])
s = json.load(sys.stdin)
cells = []
for a in sorted(s["gpus"], key=lambda g: g["index"]):
    cells += [str(a["reserved"] >> 20), str((a["total"] - a["free"]) >> 20)]
queued = len({t["container_id"] for g in s["gpus"] for t in g["queue"]})
print(f"{time.time() - t0:.1f}," + ",".join(cells) + f",{queued}")
' "$t0"
            sleep 1
        done
    ) >"$dir/timeline.csv" 2>/dev/null &
    local sampler=$!
    local t0 t1 pids=()
    t0=$(date +%s.%N)
    for i in $(seq 1 "$N"); do
        (
            s=$(date +%s.%N)
            if [ "$label" = baseline ]; then
                runc_ run "${RUN_FLAGS[@]}" --bundle "$dir/c$i" "pl-$label-$i" </dev/null >"$dir/c$i/log" 2>&1
            else
                VRAMGATE_CONFIG=$config LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu" \
                    "$BIN/vramgate-runtime" --root "$RUNC_ROOT" run "${RUN_FLAGS[@]}" --bundle "$dir/c$i" "pl-$label-$i" \
                    </dev/null >"$dir/c$i/log" 2>&1
            fi
            echo "$? $s $(date +%s.%N)" >"$dir/c$i/rc"
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    t1=$(date +%s.%N)
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    cp "$state/events.jsonl" "$dir/events.jsonl" 2>/dev/null
    local left
    left=$(left_in_ledger "$config")
    runc_ list -q 2>/dev/null | grep "^pl-$label-" | xargs -r -n1 "$RUNC" --root "$RUNC_ROOT" delete --force 2>/dev/null
    PYTHONPATH="$here" "$PY" - "$dir" "$N" "$t0" "$t1" "$G" "$left" <<'PY'
import csv, sys
from gpu_outcome import containers
d, n, t0, t1, g, left = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
ok = oom = failed = 0
reasons = {}
for log, done, _ in containers(d, n):
    if done:
        ok += 1
        continue
    if "out of memory" in log:
        oom += 1
    failed += 1
    line = next((l for l in log.splitlines() if "FAILED" in l or "vramgate:" in l), (log.strip().splitlines() or ["no output"])[-1])
    reasons[line[:140]] = reasons.get(line[:140], 0) + 1
rows = list(csv.DictReader(open(f"{d}/timeline.csv")))
per_gpu = []
for k in range(g):
    col = [int(r[f"reserved{k}_mib"]) for r in rows if r.get(f"reserved{k}_mib", "").isdigit()]
    used = [int(r[f"used{k}_mib"]) for r in rows if r.get(f"used{k}_mib", "").isdigit()]
    if col:
        per_gpu.append(f"gpu{k}: reserved mean {sum(col) / len(col) / 1024:.0f} GiB peak {max(col) / 1024:.0f} GiB, used peak {max(used) / 1024:.0f} GiB")
print(f"ok={ok} oom={oom} failed={failed} makespan={t1 - t0:.1f}s left_in_ledger={left} | " + "; ".join(per_gpu))
for r, c in reasons.items():
    print(f"#   {c}x {r}")
PY
    # The queue-order runs: the measured makespan over the lower bound of the jobs' own
    # durations (admission to release, from the event log), beside the replay of that log under
    # the same settings (every job declaring its real duration).
    case $label in
        fifo|arrival|largest|longest)
            local flags=(--backfill true --backfill-order "$label") total
            [ "$label" = fifo ] && flags=(--backfill false)
            total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
            "$BIN/vramgate" --config /dev/null replay "$dir/events.jsonl" --gpus "${G}x${total}Mi" --declared exact \
                "${flags[@]}" --json | "$PY" "$here/gpu_replay_line.py" "$t0" "$t1" ;;
    esac
}

declare -A MAKESPAN
for run in "${RUNS[@]}"; do
    line=$(run_placement "$run")
    say "$run: $line"
    MAKESPAN[$run]=$(echo "$line" | head -1 | sed -n 's/.*makespan=\([0-9.]*\)s.*/\1/p')
done
if [ -n "${MAKESPAN[auto]:-}" ] && [ -n "${MAKESPAN[roundrobin]:-}" ] && [ -n "${MAKESPAN[pinned0]:-}" ]; then
    say "$("$PY" -c "a, b, p = ${MAKESPAN[auto]}, ${MAKESPAN[roundrobin]}, ${MAKESPAN[pinned0]}; print(f'auto/roundrobin = {a / b:.3f} (target <= 1.05), auto/pinned0 = {a / p:.3f} (target <= 0.6)')")"
fi
