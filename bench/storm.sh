#!/usr/bin/env bash
# The storm benchmark: 64 container starts at once on one simulated GPU (all decided
# correctly, admissions/s, p99 hook latency; target <= 50 ms), and hook latency with 1,000
# live reservations in the ledger (target: median <= 5 ms). Real hook processes, state on
# tmpfs like /run. Usage: bench/storm.sh [ROUNDS (5)] [SAMPLES (200)]. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin vramgate-hook
exec cargo bench --quiet --bench storm -- "${1:-5}" "${2:-200}"
