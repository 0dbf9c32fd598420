#!/usr/bin/env bash
# What placement costs at create: vramgate-runtime `create` of a container with
# `vramgate.dev/gpus=auto` on 8 simulated GPUs whose ledger holds 500 live reservations,
# against `create` of a container without a request, measured with hyperfine. The next
# runtime is /bin/true, so the difference is the wrapper's admission: lock, ledger read,
# liveness window, static inventory, best fit over 8 GPUs, atomic ledger write, event line,
# spec narrowed and rewritten. Target (issue 12): at most 2.5 ms median over the create
# without a request.
# Usage: bench/placement.sh [--runs N]   (builds the release binaries first)
#        WRAPPER=/path/to/vramgate-runtime bench/placement.sh --runs N   (that binary, no build;
#        for before/after comparisons); KEEP=1 keeps the work dir on /dev/shm for profiling.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
start_wrapper_bench 8 "$@"

# 500 live reservations (owned by pid 1, which lives as long as the machine), spread over the
# 8 GPUs, written as a ledger the state directory starts from before every run.
python3 - "$work/ledger.json" <<'PY'
import json, sys
start = int(open("/proc/1/stat").read().rsplit(")", 1)[1].split()[19])
reservations = [
    {
        "container_id": f"live-{n}",
        "gpus": [{"uuid": f"GPU-bench-{n % 8}", "bytes": 1 << 30}],
        "init": {"pid": 1, "start_time": start},
        "created_unix_ms": 1,
        "waited_ms": 0,
    }
    for n in range(500)
]
ledger = {"schema": 1, "generation": 1, "next_ticket": 1, "reservations": reservations, "queue": []}
json.dump(ledger, open(sys.argv[1], "w"))
PY
mkdir -p "$work/auto" "$work/plain"
jq -c '.annotations["vramgate.dev/gpus"] = "auto" | .annotations["vramgate.dev/memory"] = "1Gi"' \
  bench/spec-request.json >"$work/auto.json"
jq -c 'del(.annotations["vramgate.dev/memory"]) | .process.env -= ["VRAMGATE_MEMORY=6Gi"]' \
  bench/spec-request.json >"$work/plain/config.json"
restore="sh -c 'cp $work/auto.json $work/auto/config.json && install -m 0600 $work/ledger.json $work/state/ledger.json'"
eval "$restore"
# Once, checked: the auto container is placed and its spec names the GPU.
"$wrapper" create --bundle "$work/auto" check
grep -q 'GPU-bench-' "$work/auto/config.json" || { echo "the wrapper did not place the container"; exit 1; }

measure "$restore" \
  -n 'wrapper create, auto, 8 GPUs, 500 live' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/auto --pid-file $work/pid id" \
  -n 'wrapper create, no request' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/plain --pid-file $work/pid id"
jq -r "$JQ_HEAD"'
    (.results[] | "  \(.command): \(.median | ms)"),
    "placement adds (median - median; in brackets min - min): \(($m["wrapper create, auto, 8 GPUs, 500 live"] - $m["wrapper create, no request"]) | ms) ms [\(($n["wrapper create, auto, 8 GPUs, 500 live"] - $n["wrapper create, no request"]) | ms)] (target <= 2.5)"
' "$work/r.json"
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
