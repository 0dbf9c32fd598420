#!/usr/bin/env bash
# Metrics cost: one scrape of `vramgate exporter` with 1,000 live reservations on 8 simulated
# GPUs (target <= 20 ms), the exporter's resident memory (target <= 20 MiB), and
# `vramgate metrics --textfile-dir` as a timer would run it. State on tmpfs, as /run is.
# Usage: bench/metrics.sh [LIVE (1000)] [SCRAPES (200)]. Needs root (the state dir is root's).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins --example metrics-bench
echo "$ bench/metrics.sh ${1:-1000} ${2:-200}   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg))"
exec target/release/examples/metrics-bench --live "${1:-1000}" --scrapes "${2:-200}"
