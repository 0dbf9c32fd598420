#!/usr/bin/env bash
# The DRA driver's costs, with the bench as kubelet and the scheduler and the stand-in API
# server (tests/support/apiserver.py) as the API server: NodePrepareResources round trips
# (target p99 <= 10 ms) with CLAIMS claims on 8 simulated 80 GiB GPUs, a ledger commit to the
# slice that shows it (target <= 1 s), and the driver's resident memory. State on tmpfs, as
# /run is.
# Usage: bench/dra.sh [CLAIMS (100)] [CHANGES (30)]. Needs root and scripts/fetch-k8s-schemas.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin vramgate-dra --example dra-bench
echo "$ bench/dra.sh ${1:-100} ${2:-30}   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
exec target/release/examples/dra-bench --claims "${1:-100}" --changes "${2:-30}"
