#!/usr/bin/env bash
# Runs every cargo-fuzz target for a set time (default 60 s each) on stable Rust, then
# minimizes its corpus back into fuzz/corpus/<target>/ (commit what it adds). Nightly is not
# needed: RUSTC_BOOTSTRAP=1 lets the stable compiler take the flags cargo-fuzz passes, and the
# sanitizer is off (-s none), which stable cannot build; debug assertions (-a) stay on so that
# an integer overflow is a crash, as it is in a debug build.
#
# Usage: bench/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Installs cargo-fuzz with `cargo install` if it is missing. A crash leaves its input in
# fuzz/artifacts/<target>/ and stops the script with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"; shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(quantity oci_state spec request visible_devices config ledger)
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
jobs="$(nproc)"
for target in "${targets[@]}"; do
  echo "== $target: ${seconds}s"
  mkdir -p "corpus/$target"
  # A scratch corpus, so the committed one only gets the minimized result.
  work="$(mktemp -d)"
  cp -r "corpus/$target/." "$work/"
  status=0
  cargo fuzz run -s none -a -O "$target" "$work" -- \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 >"$work.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|thread)" "$work.log" || true
  if [ "$status" != 0 ]; then
    tail -20 "$work.log"
    echo "FOUND A CRASH in $target (exit $status): see fuzz/artifacts/$target/"; rm -rf "$work" "$work.log"; exit 1
  fi
  rm -f "$work.log"
  # Merge: keep only inputs that add coverage.
  cargo fuzz cmin -s none -a -O "$target" "$work" >/dev/null 2>&1 || true
  rm -rf "corpus/$target"; mkdir -p "corpus/$target"
  cp "$work"/* "corpus/$target/" 2>/dev/null || true
  echo "   corpus/$target: $(ls "corpus/$target" | wc -l) inputs"
  rm -rf "$work"
done
