#!/usr/bin/env bash
# The time vramgate-runtime adds in front of the real runtime, measured with hyperfine:
#   create of a container with a request (spec read, hooks added, atomic rewrite, exec),
#   create of a container without one (spec read, exec), and a pass-through verb (exec only).
# The next runtime is /bin/true, so what is left after subtracting "/bin/true directly" is the
# wrapper's own cost. Targets: create with a request, median <= 2 ms; pass-through <= 0.5 ms.
# Usage: bench/runtime.sh [--runs N]   (builds the release binaries first)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
# Engines keep bundles on tmpfs (/run/containerd/..., /run/docker/...), where the fsyncs of
# the atomic rewrite are cheap: /dev/shm stands in for it. A second bundle on the disk of the
# repository shows the cost where /run is not tmpfs.
start_wrapper_bench 0 "$@"
disk=$(mktemp -d -p "$PWD/target")
trap 'rm -rf "$work" "$disk"' EXIT
# runc 1.1's default spec with a request in env and annotations (bench/spec-request.json), and
# the same without the request.
mkdir -p "$work/bundle" "$work/plain" "$disk/bundle"
cp bench/spec-request.json "$work/request.json"
jq -c 'del(.annotations["vramgate.dev/memory"]) | .process.env -= ["VRAMGATE_MEMORY=6Gi"]' \
  bench/spec-request.json >"$work/plain/config.json"
echo "spec: $(wc -c <"$work/request.json") bytes"

measure "sh -c 'cp $work/request.json $work/bundle/config.json && cp $work/request.json $disk/bundle/config.json'" \
  -n 'true create (baseline)' "/bin/true --root /run/r --log $work/log.json --log-format json create --bundle $work/bundle --pid-file $work/pid id" \
  -n 'wrapper create, request' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/bundle --pid-file $work/pid id" \
  -n 'wrapper create, request, bundle on disk' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $disk/bundle --pid-file $work/pid id" \
  -n 'wrapper create, no request' "$wrapper --root /run/r --log $work/log.json --log-format json create --bundle $work/plain --pid-file $work/pid id" \
  -n 'true state (baseline)' "/bin/true --root /run/r state id" \
  -n 'wrapper state' "$wrapper --root /run/r state id"
# The A/B the pass-through target is stated in: the wrapper in front of the real runc against
# runc alone, for `state` (containerd's most frequent call), in this same run. The container
# does not exist, so both answer with runc's error after the same work (-i).
if command -v runc >/dev/null; then
  cat >"$work/runc.toml" <<TOML
state_dir = "$work/state"
[runtime]
runtimes = ["runc"]
TOML
  VRAMGATE_CONFIG=$work/runc.toml "$hyperfine" -N -i --style basic --warmup 20 --runs "$runs" --export-json "$work/runc.json" \
    -n 'runc state (baseline)' "runc --root $work/runc state none" \
    -n 'wrapper state, then runc' "$wrapper --root $work/runc state none" >/dev/null
fi
# The floor any Rust binary pays here: an empty `fn main` linked as ours are (dynamically,
# against glibc), and /bin/true, both exec'd the same way.
floor=""
if command -v rustc >/dev/null; then
  echo 'fn main() {}' >"$work/empty.rs"
  rustc -O -C panic=abort -o "$work/empty" "$work/empty.rs"
  "$hyperfine" -N --style basic --warmup 20 --runs "$runs" --export-json "$work/floor.json" \
    -n '/bin/true' /bin/true -n 'empty Rust main' "$work/empty" >/dev/null
  floor=$work/floor.json
fi
# The --prepare above restores the spec before every run; check once that hooks do get added.
cp "$work/request.json" "$work/bundle/config.json"
"$wrapper" create --bundle "$work/bundle" id
grep -q vramgate-hook "$work/bundle/config.json" || { echo "the wrapper did not add the hooks"; exit 1; }

jq -r "$JQ_HEAD"'
    (.results[] | "  \(.command): \(.median | ms)"),
    "added by the wrapper (median - baseline median; in brackets: min - baseline min, the best",
    "estimate on a busy machine):",
    "  create with a request:    \(($m["wrapper create, request"] - $m["true create (baseline)"]) | ms) ms [\(($n["wrapper create, request"] - $n["true create (baseline)"]) | ms)] (target <= 2)",
    "  create with a request, bundle on disk: \(($m["wrapper create, request, bundle on disk"] - $m["true create (baseline)"]) | ms) ms [\(($n["wrapper create, request, bundle on disk"] - $n["true create (baseline)"]) | ms)]",
    "  create without a request: \(($m["wrapper create, no request"] - $m["true create (baseline)"]) | ms) ms [\(($n["wrapper create, no request"] - $n["true create (baseline)"]) | ms)]",
    "  pass-through (state):     \(($m["wrapper state"] - $m["true state (baseline)"]) | ms) ms [\(($n["wrapper state"] - $n["true state (baseline)"]) | ms)] (target <= 0.5)"
' "$work/r.json"
if [ -f "$work/runc.json" ]; then
  jq -r 'def ms: . * 1000 * 1000 | round / 1000;
    ([.results[] | {(.command): .median}] | add) as $m | ([.results[] | {(.command): .min}] | add) as $n
    | "  pass-through in front of runc (state): \(($m["wrapper state, then runc"] - $m["runc state (baseline)"]) | ms) ms [\(($n["wrapper state, then runc"] - $n["runc state (baseline)"]) | ms)] (target <= 0.3; runc alone: \($m["runc state (baseline)"] | ms) ms)"' "$work/runc.json"
fi
if [ -n "$floor" ]; then
  jq -r 'def ms: . * 1000 * 1000 | round / 1000;
    ([.results[] | {(.command): .median}] | add) as $m
    | "  floor: an empty dynamically linked Rust main costs \(($m["empty Rust main"] - $m["/bin/true"]) | ms) ms over /bin/true"' "$floor"
fi
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
