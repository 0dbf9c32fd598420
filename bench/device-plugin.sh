#!/usr/bin/env bash
# The device plugin's reaction and call costs, with the bench as kubelet: a ledger commit to
# the ListAndWatch list that shows it (target <= 1 s), Allocate (target <= 5 ms) and
# GetPreferredAllocation round trips on the plugin's socket, on 8 simulated 80 GiB GPUs with
# 500 live reservations. State on tmpfs, as /run is.
# Usage: bench/device-plugin.sh [LIVE (500)] [CHANGES (50)] [CALLS (500)]. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin vramgate-device-plugin --example device-plugin-bench
echo "$ bench/device-plugin.sh ${1:-500} ${2:-50} ${3:-500}   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
exec target/release/examples/device-plugin-bench --live "${1:-500}" --changes "${2:-50}" --calls "${3:-500}"
