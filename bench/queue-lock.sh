#!/usr/bin/env bash
# Lock acquisitions per admission and release -> admission time with hundreds of waiters that
# cannot fit, FIFO and backfill (see `queue_lock` in bench/hook_bench.rs for the set-up). Real
# hook processes; every lock counted by vramgate itself (VRAMGATE_LOCK_LOG). Needs root.
# Usage: bench/queue-lock.sh [WAITERS (200)] [ROUNDS (30)]
# HOOK_BENCH=<built hook-bench> runs that one (with the vramgate-hook of the directory above
# its examples/) and builds nothing: where there is no cargo (the GPU machine), or to compare
# a build of older code.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${HOOK_BENCH:-}" ]; then
    bench=$HOOK_BENCH
else
    target=${CARGO_TARGET_DIR:-target}
    cargo build --release --quiet --bins --example hook-bench
    bench=$target/release/examples/hook-bench
fi
waiters=${1:-200}
rounds=${2:-30}
rev=$(git rev-parse --short HEAD 2>/dev/null || echo "no git")
if git rev-parse HEAD >/dev/null 2>&1 && ! git diff --quiet; then rev="$rev+dirty"; fi
echo "# $(uname -n), $(nproc) CPUs, $rev, load $(cut -d' ' -f1-3 /proc/loadavg), $bench"
echo "# fs.inotify.max_user_instances $(cat /proc/sys/fs/inotify/max_user_instances)"
echo "# bench/queue-lock.sh $waiters $rounds"
for run in "fifo other" "backfill other" "backfill same"; do
    set -- $run
    "$bench" queue-lock --order "$1" --crowd "$2" --waiters "$waiters" --rounds "$rounds"
done
