# Sourced by the wrapper benches measured with hyperfine (placement.sh, queue-guard.sh,
# runtime.sh): the tools they need, the wrapper they measure, and its config.

# hyperfine ($HYPERFINE, else installed with apt-get) in `hyperfine`, and jq; or a line
# saying what to install.
need_hyperfine_and_jq() {
  hyperfine=${HYPERFINE:-hyperfine}
  command -v "$hyperfine" >/dev/null || apt-get install -y -qq hyperfine >/dev/null || { echo "hyperfine is required (apt-get install hyperfine)"; exit 1; }
  command -v jq >/dev/null || { echo "jq is required (apt-get install jq)"; exit 1; }
}

# The wrapper in `wrapper`: $WRAPPER as it is (before/after comparisons), else the release
# vramgate-runtime, built first where there is a toolchain (a quiet benchmark host without
# one uses the binary it has).
find_wrapper() {
  if [ -z "${WRAPPER:-}" ] && command -v cargo >/dev/null; then cargo build --release --quiet --bin vramgate-runtime; fi
  wrapper=${WRAPPER:-$PWD/target/release/vramgate-runtime}
}

# The config of a wrapper whose next runtime is /bin/true, state in $1/state, with $2 static
# GPUs of 80 GiB named GPU-bench-<i> (none: no [inventory] table).
true_runtime_config() {
  local work=$1 gpus=${2:-0} i
  echo "state_dir = \"$work/state\""
  echo "[runtime]"
  echo "runtimes = [\"/bin/true\"]"
  if [ "$gpus" -gt 0 ]; then
    echo "[inventory]"
    echo "backend = \"static\""
    for ((i = 0; i < gpus; i++)); do
      printf '[[inventory.gpus]]\nindex = %d\nuuid = "GPU-bench-%d"\nminor = %d\ntotal = "80Gi"\n' "$i" "$i" "$i"
    done
  fi
}
