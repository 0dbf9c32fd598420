#!/usr/bin/env bash
# The exporter under hostile load: 10,000 connections to `vramgate exporter` that never finish
# a request (half send nothing, half stop inside their request head), 50 scrapes of /metrics
# while they are open, and the exporter's threads, resident memory and open files (from
# /proc/<pid>/status and /proc/<pid>/fd) before, during, after its request timeout closed
# them, and after. The load is bench/exporter_load.rs's; it measures and writes the figures
# down (bench/results/exporter-load-2core.txt on the 2-core VM), asserting nothing about them.
# What must hold on any machine (no thread per connection, scrapes answered, stalled
# connections closed at the request timeout) is tests/it/prometheus.rs's, on fewer connections.
# Usage: bench/exporter-load.sh [CONNECTIONS (10000)] [SCRAPES (50)]. Loopback only. Needs an
# open-files hard limit above CONNECTIONS + 256 (ulimit -Hn).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins --example exporter-load
echo "$ bench/exporter-load.sh ${1:-10000} ${2:-50}   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), ulimit -Hn $(ulimit -Hn))"
exec target/release/examples/exporter-load --connections "${1:-10000}" --scrapes "${2:-50}"
