#!/usr/bin/env bash
# Hook wall time (admit, release, no request) with 100 live reservations, on a tmpfs state dir
# (as /run is on real hosts) and on this disk; then runc run with vramgate hooks vs /bin/true
# hooks. Results go in the README. Needs root and runc.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins --example hook-bench
bench=target/release/examples/hook-bench
$bench latency --state-root /dev/shm --live 100 --runs "${RUNS:-500}"
$bench latency --state-root /var/tmp --live 100 --runs "${RUNS:-500}"
$bench runc --runs "${RUNC_RUNS:-40}"
