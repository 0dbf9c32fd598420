#!/bin/bash
# Metrics against a real GPU: `vramgate exporter` on the NVML backend, scraped during a busy
# run of real GPU containers and compared with nvidia-smi. Run as root on a GPU host, with the
# release binaries in target/release (cargo build --release --bins); not CI.
#   bench/gpu-metrics.sh [N (24)] [JOB_GIB (6)]
# N containers start at once under policy wait, each growing to JOB_GIB GiB; those beyond the
# card queue. Once the first wave has grown, one scrape of /metrics is compared with
#   nvidia-smi --query-gpu=memory.used,memory.total --format=csv
# taken just before and just after it. Prints PASS/FAIL per check, the scrape time and the
# exporter's resident memory with NVML loaded; exits 1 when a check failed. The whole output
# goes to bench/results/gpu-metrics-<gpu>.txt, the scrape itself next to it.
set -u
source "$(dirname "$0")/gpu-common.sh"
N=${1:-24}
JOB_GIB=${2:-6}
JOB_SECONDS=${JOB_SECONDS:-10}
# The job's peak is JOB_GIB plus its CUDA context and cuBLAS workspace (about 800 MiB on the
# H200, see the README's experiment): request that, so admitted jobs stay within it.
REQUEST_MIB=${REQUEST_MIB:-$((JOB_GIB * 1024 + 800))}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | awk '{print tolower($2)}')
RESULTS=$here/results/gpu-metrics-${gpu_name:-gpu}.txt
T=$WORK/metrics
rm -rf "$T" $STATE_BASE/metrics
mkdir -p "$T"
exec > >(tee "$RESULTS") 2>&1
echo "# bench/gpu-metrics.sh $N $JOB_GIB   $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0)"

cfg=$T/config.toml
write_config "$cfg" $STATE_BASE/metrics wait
export VRAMGATE_CONFIG=$cfg
"$BIN/vramgate" exporter --listen 127.0.0.1:0 2>"$T/exporter.log" &
exporter=$!
trap 'kill $exporter 2>/dev/null' EXIT
for _ in $(seq 1 50); do
    grep -q "serving http://" "$T/exporter.log" && break
    sleep 0.1
done
url=$(grep -o 'http://[^ ]*' "$T/exporter.log" | head -1)
[ -n "$url" ] || { echo "the exporter did not start: $(cat "$T/exporter.log")"; exit 1; }
echo "exporter pid $exporter at $url"

for i in $(seq 1 "$N"); do
    bundle "$T/c$i" "$cfg" "${REQUEST_MIB}Mi" "$JOB_GIB" "$JOB_SECONDS"
done
pids=()
for i in $(seq 1 "$N"); do
    start_container "$T/c$i" "gpumetrics-$i"
    pids+=($!)
done

# Until the first wave has grown: every admitted container uses at least JOB_GIB GiB.
"$PY" - "$url" "$JOB_GIB" <<'PY' || fail "the first wave did not grow within 120 s"
import sys, time, urllib.request
url, gib = sys.argv[1], int(sys.argv[2])
for _ in range(240):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    used = [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("vramgate_container_used_bytes{")]
    reserved = [l for l in text.splitlines() if l.startswith("vramgate_container_reserved_bytes{")]
    if reserved and len(used) == len(reserved) and min(used) >= gib << 30:
        sys.exit(0)
    time.sleep(0.5)
sys.exit(1)
PY

# The moment: nvidia-smi, one scrape, nvidia-smi again.
smi() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv -i 0; }
smi >"$T/smi-before.csv"
curl_start=$(date +%s.%N)
"$PY" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$url" >"$T/scrape.prom"
curl_end=$(date +%s.%N)
smi >"$T/smi-after.csv"
cp "$T/scrape.prom" "${RESULTS%.txt}.prom"
echo "nvidia-smi before the scrape:"; cat "$T/smi-before.csv"
echo "nvidia-smi after the scrape:"; cat "$T/smi-after.csv"
echo "the scrape (GPU 0 and counters):"
grep -E '^vramgate_(gpu_|queue_length|requests_total)' "$T/scrape.prom" | grep -v 'gpu="[1-9]'

"$PY" - "$T" "$N" "$JOB_GIB" "$REQUEST_MIB" <<'PY'
import csv, sys
d, n, gib, request_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
MI = 1 << 20

def smi(name):
    rows = list(csv.reader(open(f"{d}/{name}")))
    used, total = (int(v.strip().split()[0]) for v in rows[1][:2])
    return used, total

samples = {}
for line in open(f"{d}/scrape.prom"):
    if line.startswith("#") or not line.strip():
        continue
    series, value = line.rsplit(" ", 1)
    samples[series] = float(value)

def gpu0(name):
    return next(v for s, v in samples.items() if s.startswith(name + "{") and 'gpu="0"' in s)

def per_container(name):
    return {s.split('container_id="')[1].split('"')[0]: v for s, v in samples.items()
            if s.startswith(name + "{") and 'gpu="0"' in s}

(used_before, total_smi), (used_after, _) = smi("smi-before.csv"), smi("smi-after.csv")
total = gpu0("vramgate_gpu_memory_total_bytes")
free = gpu0("vramgate_gpu_memory_free_bytes")
used = (total - free) / MI
checks = []
checks.append((int(total) // MI == total_smi, f"total: vramgate {int(total) // MI} MiB, nvidia-smi {total_smi} MiB"))
# Jobs grow in 256 MiB steps between the reads, and nvidia-smi's memory.used leaves out the
# memory the driver reserves for itself (NVML's v2 memory info), which total - free includes.
low, high = min(used_before, used_after) - 256, max(used_before, used_after) + 1024
checks.append((low <= used <= high, f"used: vramgate total - free {used:.0f} MiB, nvidia-smi {used_before} then {used_after} MiB (accepted {low}..{high})"))
reserved = per_container("vramgate_container_reserved_bytes")
used_by = per_container("vramgate_container_used_bytes")
over = per_container("vramgate_container_over_reservation")
running = len(reserved)
checks.append((running > 0 and all(v == request_mib * MI for v in reserved.values()),
               f"{running} reservations of {request_mib} MiB each"))
checks.append((set(used_by) == set(reserved) and all(v >= gib << 30 for v in used_by.values()),
               f"used where NVML attributes it: {len(used_by)} containers, {min(used_by.values(), default=0) / MI:.0f}..{max(used_by.values(), default=0) / MI:.0f} MiB"))
checks.append((not any(over.values()), f"none over its reservation: {sum(over.values()):.0f} flagged"))
attributed = sum(used_by.values()) / MI
checks.append((attributed <= used, f"attributed {attributed:.0f} MiB <= used {used:.0f} MiB; used outside vramgate {gpu0('vramgate_gpu_memory_used_outside_bytes') / MI:.0f} MiB"))
queued = gpu0("vramgate_queue_length")
checks.append((queued == n - running, f"queue: {queued:.0f} waiting + {running} running = {n}"))
for ok, what in checks:
    print(("PASS " if ok else "FAIL ") + what)
sys.exit(0 if all(ok for ok, _ in checks) else 1)
PY
[ $? = 0 ] || failures=$((failures + 1))
if command -v promtool >/dev/null; then
    if promtool check metrics <"$T/scrape.prom"; then pass "promtool check metrics"; else fail "promtool check metrics"; fi
else
    echo "promtool is not installed: the lint of the scrape was skipped"
fi

# The cost on this host, NVML loaded: 20 scrapes during the run, and the exporter's memory.
"$PY" - "$url" <<'PY'
import statistics, sys, time, urllib.request
times = []
for _ in range(20):
    t = time.perf_counter()
    urllib.request.urlopen(sys.argv[1], timeout=5).read()
    times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(f"scrape during the run (NVML, process lists): median {statistics.median(times):.2f} ms, max {times[-1]:.2f} ms, n=20")
PY
awk -v s="$curl_start" -v e="$curl_end" 'BEGIN { printf "the scrape compared above took %.1f ms (a python start included)\n", (e - s) * 1000 }'
grep -E 'VmRSS|VmHWM' /proc/$exporter/status | tr -s ' \t' ' ' | sed 's/^/exporter /'

wait "${pids[@]}"
runc_ list -q 2>/dev/null | grep "^gpumetrics-" | xargs -r -n1 "$RUNC" --root "$RUNC_ROOT" delete --force 2>/dev/null
sleep 1
"$PY" - "$url" "$N" <<'PY' && pass "after the run: nothing reserved, all $N counted as admitted" || fail "after the run"
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
s = dict(l.rsplit(" ", 1) for l in text.splitlines() if l and not l.startswith("#"))
admitted = float(s['vramgate_requests_total{outcome="admitted"}']) + float(s['vramgate_requests_total{outcome="admitted_after_wait"}'])
left = [k for k in s if k.startswith("vramgate_container_reserved_bytes{")]
print(f"admitted {admitted:.0f}, waited {s['vramgate_queue_wait_seconds_count']}, reservations left {len(left)}")
sys.exit(0 if admitted == int(sys.argv[2]) and not left else 1)
PY
kill $exporter 2>/dev/null
wait $exporter 2>/dev/null
rm -rf $STATE_BASE/metrics
[ $failures = 0 ] && echo "ALL PASSED" || echo "$failures FAILED"
exit $((failures > 0))
