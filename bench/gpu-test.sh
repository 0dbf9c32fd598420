#!/bin/bash
# Tests against real NVML and real GPU containers (runc). Run as root on a GPU host; not CI.
#   bench/gpu-test.sh [RECORD_DIR]
# Prints PASS/FAIL per test; exits 1 when any failed. RECORD_DIR receives the recorded NVML
# answers (fixtures for tests/it/nvml_fixtures.rs).
set -u
source "$(dirname "$0")/gpu-common.sh"
RECORD_DIR=${1:-$WORK/records}
mkdir -p "$RECORD_DIR"
T=$WORK/test
rm -rf "$T" $STATE_BASE/gputest
mkdir -p "$T"
cfg=$T/config.toml
write_config "$cfg" $STATE_BASE/gputest reject
export VRAMGATE_CONFIG=$cfg

echo "== 1. doctor sees NVML and the driver"
"$BIN/vramgate" doctor | tee "$T/doctor.txt"
if grep -q "^ok .*inventory .*NVML .*driver" "$T/doctor.txt"; then pass doctor-nvml; else fail doctor-nvml; fi

echo "== 2. status reports the card's total as nvidia-smi does"
smi=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
ours=$("$BIN/vramgate" status --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gpus"][0]["total"] >> 20)')
if [ "$smi" = "$ours" ]; then pass "total ${ours} MiB"; else fail "total: nvidia-smi $smi MiB, vramgate $ours MiB"; fi

echo "== 3. attribution: reserved vs used, over-reservation, memory outside any reservation"
"$PY" -c "import torch,time; x=torch.empty(1<<30, dtype=torch.uint8, device='cuda'); print('ready', flush=True); time.sleep(60)" >"$T/outside.log" 2>&1 &
outside=$!
bundle "$T/a" "$cfg" 3Gi 2 20
bundle "$T/b" "$cfg" 1Gi 3 20
start_container "$T/a" gputest-a
pa=$!
start_container "$T/b" gputest-b
pb=$!
# Until both have grown (import torch, context, 2 or 3 GiB).
for _ in $(seq 1 60); do
    sleep 1
    "$BIN/vramgate" status --json >"$T/status.json" 2>&1 || continue
    "$PY" - "$T/status.json" <<'PY' && break
import json, sys
g = json.load(open(sys.argv[1]))["gpus"][0]
used = {r["container_id"]: r["used"] or 0 for r in g["reservations"]}
sys.exit(0 if used.get("gputest-a", 0) >= 2 << 30 and used.get("gputest-b", 0) >= 3 << 30 else 1)
PY
done
"$BIN/vramgate" status | tee "$T/status.txt"
"$BIN/vramgate" status --record "$RECORD_DIR/attribution.json" \
    --note "container a reserves 3Gi and grows to 2 GiB; container b reserves 1Gi and grows to 3 GiB; a host process outside any container holds 1 GiB"
cp "$T/status.txt" "$RECORD_DIR/attribution.status.txt"
"$PY" - "$T/status.json" "$outside" <<'PY' && pass attribution || fail attribution
import json, sys
g = json.load(open(sys.argv[1]))["gpus"][0]
outside_pid = int(sys.argv[2])
r = {x["container_id"]: x for x in g["reservations"]}
a, b = r["gputest-a"], r["gputest-b"]
problems = []
if not (2 << 30 <= a["used"] <= a["bytes"]) or a["over_reservation"]:
    problems.append(f"a: used {a['used']} of {a['bytes']}, over={a['over_reservation']}")
if not (b["used"] >= 3 << 30 and b["over_reservation"]):
    problems.append(f"b: used {b['used']} of {b['bytes']}, over={b['over_reservation']}")
out = [p for p in g["outside_processes"] if p["pid"] == outside_pid]
if not out or out[0]["used"] < 1 << 30:
    problems.append(f"outside process {outside_pid} not reported with >= 1 GiB: {g['outside_processes']}")
if g["used_outside"] < 1 << 30:
    problems.append(f"used_outside {g['used_outside']} < 1 GiB")
# b took 2 GiB more than it reserved: the account must show it as used outside reservations.
print("; ".join(problems) or f"a used {a['used'] >> 20} MiB of {a['bytes'] >> 20}; b used {b['used'] >> 20} MiB of {b['bytes'] >> 20} (over); outside {g['used_outside'] >> 20} MiB")
sys.exit(1 if problems else 0)
PY
wait $pa $pb
kill $outside 2>/dev/null; wait $outside 2>/dev/null
for c in a b; do
    if [ "$(cut -d' ' -f1 "$T/$c/rc")" = 0 ]; then pass "container $c ran to the end"; else fail "container $c: $(tail -2 "$T/$c/log")"; fi
done
left=$("$BIN/vramgate" status --json | "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)["gpus"][0]["reservations"]))')
if [ "$left" = 0 ]; then pass "poststop released both"; else fail "$left reservations left"; fi

echo "== 4. a request larger than the card is refused before the container starts"
bundle "$T/big" "$cfg" 500Gi 1 1
runc_ run "${RUN_FLAGS[@]}" --bundle "$T/big" gputest-big </dev/null >"$T/big.log" 2>&1
# runc quotes the hook's stderr inside its own error line.
if grep -q "vramgate: refused container gputest-big: it requests 500.0 GiB on GPU 0, more than the GPU can ever hold" "$T/big.log" && ! grep -q "^start" "$T/big.log"; then
    pass "never-fits refused: $(grep -m1 'vramgate: refused' "$T/big.log" | cut -c1-160)…"
else
    fail "never-fits: $(cat "$T/big.log")"
fi
runc_ delete --force gputest-big 2>/dev/null

echo "== 5. missing driver library: one clear line from the hook and from status"
bad=$T/bad.toml
write_config "$bad" $STATE_BASE/gputest reject
echo 'nvml_library = "/nonexistent/libnvidia-ml.so.1"' >>"$bad"
bundle "$T/nolib" "$bad" 1Gi 1 1
runc_ run "${RUN_FLAGS[@]}" --bundle "$T/nolib" gputest-nolib </dev/null >"$T/nolib.log" 2>&1
rc=$?
if [ $rc != 0 ] && grep -qF 'vramgate: cannot load the NVIDIA management library \"/nonexistent/libnvidia-ml.so.1\"' "$T/nolib.log" && ! grep -q "^start" "$T/nolib.log"; then
    pass "runc refused the container: $(grep -o 'stderr: vramgate: cannot load[^(]*' "$T/nolib.log")…"
else
    fail "hook with missing library (rc $rc): $(cat "$T/nolib.log")"
fi
runc_ delete --force gputest-nolib 2>/dev/null
# The hook itself, as a runtime sees it: exit 1 and exactly one line on stderr.
sleep 60 &
sleeper=$!
err=$(echo "{\"ociVersion\":\"1.0.2\",\"id\":\"gputest-nolib2\",\"status\":\"creating\",\"pid\":$sleeper,\"bundle\":\"$T/nolib\"}" |
    VRAMGATE_CONFIG=$bad "$BIN/vramgate-hook" createRuntime 2>&1 >/dev/null)
rc=$?
kill $sleeper
if [ $rc = 1 ] && [ "$(echo "$err" | wc -l)" = 1 ] && echo "$err" | grep -q '^vramgate: cannot load the NVIDIA management library "/nonexistent/libnvidia-ml.so.1"'; then
    pass "hook: exit 1, one line"
else
    fail "hook directly (rc $rc): $err"
fi
out=$(VRAMGATE_CONFIG=$bad "$BIN/vramgate" status 2>&1)
if [ $? != 0 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "cannot load the NVIDIA management library"; then
    pass "status: one line, exit 1"
else
    fail "status with missing library: $out"
fi

rm -rf $STATE_BASE/gputest
[ $failures = 0 ] && echo "ALL PASSED" || echo "$failures FAILED"
exit $((failures > 0))
