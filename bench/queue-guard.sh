#!/usr/bin/env bash
# What the queue guard costs a create that may wait but is admitted at once: vramgate-runtime
# `create` of a container with `vramgate.dev/policy=wait` against the same container with
# `policy=reject`, on one simulated 80 GiB GPU with an empty ledger, measured with hyperfine.
# The next runtime is /bin/true. The guard (src/runtime/queue_guard.rs) starts only once a
# create has queued, so the difference should be the wait policy's own set-up alone; when the
# guard started before every wait-policy create, this measured +13.1 ms median
# (bench/results/queue-guard-2core.txt).
# Usage: bench/queue-guard.sh [--runs N]   (builds the release binaries first)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
start_wrapper_bench 1 "$@"
for policy in wait reject; do
  jq -c --arg p "$policy" '.annotations["vramgate.dev/gpus"] = "0" | .annotations["vramgate.dev/memory"] = "1Gi" | .annotations["vramgate.dev/policy"] = $p' \
    bench/spec-request.json >"$work/$policy.json"
  mkdir -p "$work/$policy"
done
restore="sh -c 'cp $work/wait.json $work/wait/config.json && cp $work/reject.json $work/reject/config.json && rm -f $work/state/ledger.json'"
eval "$restore"
measure "$restore" \
  -n 'create, policy wait (guard)' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/wait --pid-file $work/pid id" \
  -n 'create, policy reject' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/reject --pid-file $work/pid id"
jq -r "$JQ_HEAD"'
    (.results[] | "  \(.command): \(.median | ms) (p95 \([.times[]] | sort | .[(length * 95 / 100 | floor)] | ms))"),
    "the guard adds (median - median): \(($m["create, policy wait (guard)"] - $m["create, policy reject"]) | ms) ms"
' "$work/r.json"
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
