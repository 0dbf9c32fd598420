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

# What each of these benches starts with, called with the script's arguments after the
# number of static GPUs $1: the tools, the wrapper, `runs` (`--runs N`, default 300), and
# `work`, a new directory on /dev/shm (engines keep bundles and state on tmpfs, as
# /run/vramgate is) with the wrapper's config, exported as VRAMGATE_CONFIG, and an empty
# private state directory; removed at exit unless KEEP is set (for profiling).
start_wrapper_bench() {
  local gpus=$1
  shift
  runs=300
  if [ "${1:-}" = --runs ]; then runs=${2:?--runs N}; fi
  need_hyperfine_and_jq
  find_wrapper
  work=$(mktemp -d -p /dev/shm)
  trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
  true_runtime_config "$work" "$gpus" >"$work/config.toml"
  export VRAMGATE_CONFIG=$work/config.toml
  mkdir -m 0700 "$work/state"
}

# hyperfine over the commands after $1 (-n NAME COMMAND ...), each run after the command $1
# has restored the bundles; the results in $work/r.json.
measure() {
  local prepare=$1
  shift
  "$hyperfine" -N --style basic --warmup 20 --runs "$runs" --export-json "$work/r.json" --prepare "$prepare" "$@" >/dev/null
}

# The head of the jq programs that report $work/r.json: `ms` (seconds to milliseconds, three
# decimals), each command's median in $m and min in $n, and the report's first line.
JQ_HEAD='
  def ms: . * 1000 * 1000 | round / 1000;
  ([.results[] | {(.command): .median}] | add) as $m
  | ([.results[] | {(.command): .min}] | add) as $n
  | "median wall time (ms):",'
