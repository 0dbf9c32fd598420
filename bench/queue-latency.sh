#!/usr/bin/env bash
# Policy wait: time from the release that makes room to the waiter's admission, and the CPU a
# waiting hook uses. Results go in the README. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bins --example hook-bench
target/release/examples/hook-bench queue --runs "${RUNS:-30}"
