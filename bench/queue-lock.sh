#!/usr/bin/env bash
# Lock acquisitions per admission and release -> admission time with hundreds of waiters that
# cannot fit, FIFO and backfill (see `queue_lock` in bench/hook_bench.rs for the set-up). Real
# hook processes; every lock counted by vramgate itself (VRAMGATE_LOCK_LOG). Needs root.
# Usage: bench/queue-lock.sh [WAITERS (200)] [ROUNDS (30)]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release --quiet --bins --example hook-bench
bench=$target/release/examples/hook-bench
waiters=${1:-200}
rounds=${2:-30}
echo "# $(uname -n), $(nproc) CPUs, $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# bench/queue-lock.sh $waiters $rounds"
for run in "fifo other" "backfill other" "backfill same"; do
    set -- $run
    "$bench" queue-lock --order "$1" --crowd "$2" --waiters "$waiters" --rounds "$rounds"
done
