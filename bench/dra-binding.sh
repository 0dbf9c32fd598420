#!/usr/bin/env bash
# Allocation to bind on the suite's one-node Kubernetes 1.36.3, with and without the DRA
# driver's binding conditions (src/dra/claim_watch.rs): PODS pods one after another, each with a
# 1Gi claim; the median extra is what answering the scheduler's binding conditions costs
# (target <= 200 ms). Usage: bench/dra-binding.sh [PODS (10)]. Needs root and
# scripts/fetch-kubernetes (the suite's node); no other test node may run.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "$ bench/dra-binding.sh ${1:-10}   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
exec cargo bench --quiet --bench dra-binding -- "${1:-10}"
