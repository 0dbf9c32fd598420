#!/usr/bin/env bash
# The exporter under hostile load: 10,000 connections to `vramgate exporter` that never finish
# a request (half send nothing, half stop inside their request head), 50 scrapes of /metrics
# while they are open, and the exporter's threads, resident memory and open files (from
# /proc/<pid>/status and /proc/<pid>/fd) before, during, after its request timeout closed
# them, and after. The measurement is tests/prometheus.rs's load test, which also asserts the
# bounds; this prints its figures. Loopback only. Needs root and an open-files hard limit
# of at least 10,256 (ulimit -Hn).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "$ bench/exporter-load.sh   ($(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), ulimit -Hn $(ulimit -Hn))"
cargo test --release --quiet --test prometheus \
  the_exporter_answers_scrapes_under_ten_thousand_idle_and_slow_connections -- --nocapture 2>&1 |
  grep -E '^(baseline|[0-9]+ connections|50 scrapes|after|test result)'
