#!/usr/bin/env bash
# vramgate replay's figures, written to bench/results/replay/:
#   validation  the two 20-job runs measured on one H100 (bench/results/placement-smoke-h100-1gpu,
#               from bench/gpu-placement.sh), replayed from their own event logs: makespan
#               against the measured one (target within 10 %), admission order identical;
#   placement   the 80-job mix of bench/gpu-placement.sh (sizes 2 3 4 6 8 12 16 24 32 GiB cycled,
#               plus the 748 MiB CUDA context, all arriving at once, policy wait) on 2, 4 and 8
#               simulated 141 GiB GPUs: auto best-fit and spread, pinned round-robin, all on
#               GPU 0, backfill off and on. Job durations follow the smoke runs (admission to
#               release was 9 to 14 s for 4 s of compute: 10 s + 0.06 s/GiB), plus the 4 s more
#               compute the 80-job run does (JOB_SECONDS=8);
#   sharing     the same 80-job mix on 2 x 141 GiB, auto best-fit, against exclusive GPUs (one job
#               per whole GPU, FIFO, as nvidia.com/gpu: 1 hands them out): makespan, waits, mean
#               reserved share, and how much shorter the shared makespan is;
#   packing     which waiter that fits goes first ([queue] backfill_order): the burst of issue 34
#               (80 jobs, 2 to 32 GiB plus 1 GiB of context, 7 to 13 s, all at once, policy wait)
#               on 1, 2, 4 and 8 x 141 GiB, auto best-fit: FIFO (no backfill), today's backfill
#               (arrival), largest and longest (declared durations exact, and off by up to
#               +-50 %); then the two measured H100 runs' own event logs, which declare nothing
#               (declared=exact gives longest their real durations). Makespan / lower bound, p95
#               and max wait, and how many admissions passed a waiter past the backfill bound
#               (must be 0);
#   speed       a week of a busy 8-GPU host (a job a minute, 10,080 jobs, about 60 % of its
#               memory reserved on average) replayed, timed.
# Usage: bench/replay.sh   (builds the release binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v cargo >/dev/null; then cargo build --release --quiet --bin vramgate; fi
vg() { ./target/release/vramgate --config /dev/null replay "$@"; }
out=bench/results/replay
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

{
  echo "# $(date -u +%FT%TZ) validation: replay of the measured H100 runs (bench/results/placement-smoke-h100-1gpu)"
  for run in pinned0:48.6 auto:43.2; do
    name=${run%%:*} measured=${run##*:}
    log=bench/results/placement-smoke-h100-1gpu/place-$name/events.jsonl
    vg "$log" --gpus 1x81559Mi --json >"$work/$name.json"
    python3 - "$log" "$work/$name.json" "$name" "$measured" <<'PY'
import json, sys
log, rep, name, measured = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
real = [json.loads(l) for l in open(log)]
real_order = [e["container"] for e in real if e["event"] in ("admit", "admit_after_wait")]
o = json.load(open(rep))[0]
print(f"{name:8} measured makespan {measured:.1f} s, replayed {o['makespan_s']:.1f} s "
      f"({(o['makespan_s'] / measured - 1) * 100:+.1f} %, target within 10 %); admission order "
      f"{'identical' if o['admission_order'] == real_order else 'DIFFERENT'} ({len(real_order)} admissions)")
PY
  done
} | tee "$out/validation.txt"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sizes = [2, 3, 4, 6, 8, 12, 16, 24, 32]
for gpus in (2, 4, 8):
    for layout in ("auto", "roundrobin", "pinned0"):
        with open(f"{work}/{layout}-{gpus}.jsonl", "w") as f:
            for i in range(80):
                gib = sizes[i % len(sizes)]
                pin = {"auto": "auto", "roundrobin": str(i % gpus), "pinned0": "0"}[layout]
                f.write(json.dumps({"id": f"job-{i}", "arrival": 0, "memory": f"{gib * 1024 + 748}Mi",
                                    "duration": round(10 + 0.06 * gib + 4, 2), "gpus": pin,
                                    "policy": "wait", "timeout": "2h"}) + "\n")
PY
{
  echo "# $(date -u +%FT%TZ) placement: 80 jobs of bench/gpu-placement.sh's mix on G x 141 GiB"
  for gpus in 2 4 8; do
    echo "## $gpus GPUs"
    for backfill in false true; do
      vg "$work/auto-$gpus.jsonl" --gpus "${gpus}x141Gi" --backfill $backfill --compare strategy=best-fit,spread \
        | sed "s/^strategy=/auto backfill=$backfill strategy=/"
      for layout in roundrobin pinned0; do
        vg "$work/$layout-$gpus.jsonl" --gpus "${gpus}x141Gi" --backfill $backfill | tail -n +2 \
          | sed "s/^[^ ]* [^ ]*\( backfill\)\?/$layout backfill=$backfill/"
      done
    done
  done
} | tee "$out/placement.txt"

{
  echo "# $(date -u +%FT%TZ) sharing: the 80-job mix on 2 x 141 GiB, shared (auto best-fit) against exclusive GPUs"
  for backfill in false true; do
    echo "## backfill=$backfill"
    vg "$work/auto-2.jsonl" --gpus 2x141Gi --backfill $backfill --compare sharing=exclusive,shared
  done
} | tee "$out/sharing.txt"

python3 - "$work" <<'PY'
import json, random, sys
work = sys.argv[1]
sizes = [2, 3, 4, 6, 8, 12, 16, 24, 32]
random.seed(34)
for name, declared in (("exact", lambda d: d), ("noisy", lambda d: round(d * random.uniform(0.5, 1.5), 1))):
    with open(f"{work}/burst-{name}.jsonl", "w") as f:
        for i in range(80):
            gib, seconds = sizes[i % len(sizes)], 7 + i % 7
            f.write(json.dumps({"id": f"job-{i}", "arrival": 0, "memory": f"{gib + 1}Gi", "duration": seconds,
                                "expected_duration": declared(seconds), "gpus": "auto", "policy": "wait",
                                "timeout": "2h"}) + "\n")
PY
packing_rows() {  # WORKLOAD GPUS LABEL [replay flags...]: FIFO, then each backfill order
  local workload=$1 gpus=$2 label=$3
  shift 3
  { vg "$workload" --gpus "$gpus" --backfill false --json "$@"
    vg "$workload" --gpus "$gpus" --backfill true --compare backfill-order=arrival,largest,longest --json "$@"
  } | python3 bench/packing_table.py "$label"
}
{
  echo "# $(date -u +%FT%TZ) packing: [queue] backfill_order on the 80-job burst and on the measured H100 runs (backfill_bound 30s)"
  printf '%-36s %-26s %8s %8s %6s %8s %8s %4s %6s\n' workload order makespan "lower b" ratio "p95 wait" "max wait" jobs passed
  for gpus in 1 2 4 8; do
    for declared in exact noisy; do
      packing_rows "$work/burst-$declared.jsonl" "${gpus}x141Gi" "burst ${gpus}x141Gi, declared $declared"
    done
  done
  for run in pinned0 auto; do
    log=bench/results/placement-smoke-h100-1gpu/place-$run/events.jsonl
    packing_rows "$log" 1x81559Mi "H100 $run log, nothing declared"
    packing_rows "$log" 1x81559Mi "H100 $run log, declared exact" --declared exact
  done
} | tee "$out/packing.txt"

python3 - "$work/week.jsonl" <<'PY'
import json, random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    for i in range(7 * 24 * 60):
        gib = random.choice([2, 4, 8, 12, 16, 24, 40, 80])
        f.write(json.dumps({"arrival": i * 60 + random.random() * 60, "memory": f"{gib}Gi",
                            "duration": round(random.expovariate(1 / 1800), 1), "gpus": "auto",
                            "policy": "wait", "timeout": "6h"}) + "\n")
PY
{
  echo "# $(date -u +%FT%TZ) speed: a week of an 8 x 141 GiB host, 10,080 jobs (one a minute, mean 30 min), on $(nproc) CPUs"
  start=$(date +%s.%N)
  vg "$work/week.jsonl" --gpus 8x141Gi 2>/dev/null
  end=$(date +%s.%N)
  python3 -c "print(f'replayed in {$end - $start:.1f} s wall time')"
} | tee "$out/speed.txt"
