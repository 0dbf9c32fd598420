# Sourced by the gpu-*.sh scripts: finds runc and the binaries, makes a work dir and a spec
# template. GPU containers use the host's / read-only as rootfs (see gpu_bundle.py).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${VRAMGATE_BIN:-$here/../target/release}
PY=$(command -v python3)
WORK=${WORK:-/var/tmp/vramgate-gpu-bench}   # not under /tmp: containers get a fresh /tmp
mkdir -p "$WORK"
RUNC_ROOT=/run/vramgate-bench-runc

# runc from PATH, else from the .debs in $DEBS (apt-get download runc libseccomp2).
if [ -z "${RUNC:-}" ]; then
    if command -v runc >/dev/null; then
        RUNC=$(command -v runc)
    else
        for deb in "${DEBS:-$here/../debs}"/*.deb; do dpkg -x "$deb" "$WORK/debs"; done
        export LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        RUNC=$WORK/debs/usr/sbin/runc
    fi
fi
runc_() { LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu" "$RUNC" --root "$RUNC_ROOT" "$@"; }
# `runc run` flags; --no-pivot is added below when pivot_root is refused on this host.
RUN_FLAGS=()
cp "$here/gpu_job.py" "$WORK/gpu_job.py"

# State directories live on a tmpfs, as the default /run/vramgate does on any systemd host
# (on this VM /run is not a tmpfs, and fsync on its disk would be measured instead).
STATE_BASE=/run/vramgate-bench
mkdir -p "$STATE_BASE"
mountpoint -q "$STATE_BASE" || mount -t tmpfs -o mode=0755 tmpfs "$STATE_BASE"

# The containers' rootfs: the host's / bound on a directory of its own (pivot_root cannot
# switch to the very mount it runs on), read-only in the container.
ROOTFS=$WORK/rootfs
mkdir -p "$ROOTFS"
if ! mountpoint -q "$ROOTFS"; then
    mount --rbind / "$ROOTFS" && mount --make-rslave "$ROOTFS"
fi
if [ ! -f "$WORK/template/config.json" ]; then
    mkdir -p "$WORK/template"
    (cd "$WORK/template" && LD_LIBRARY_PATH="$WORK/debs/usr/lib/x86_64-linux-gnu" "$RUNC" spec)
fi

# write_config FILE STATE_DIR POLICY
write_config() {
    cat >"$1" <<TOML
state_dir = "$2"
policy = "$3"
wait_timeout = "10m"
max_wait_timeout = "1h"
[inventory]
backend = "nvml"
TOML
}

# GPU 0's /dev/nvidiaN minor: a container pinned to GPU 0 gets only that GPU's node, as the
# NVIDIA toolkit would give it (vramgate takes the device nodes in a spec as the GPUs it uses).
GPU0_MINOR=$("$PY" -c 'import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(0)))' 2>/dev/null || echo 0)

# bundle DIR CONFIG|- REQUEST|- JOB_GIB JOB_SECONDS [extra gpu_bundle args...]
bundle() {
    local dir=$1 config=$2 request=$3 gib=$4 secs=$5
    shift 5
    local hook=()
    [ "$config" != - ] && hook=(--hook "$BIN/vramgate-hook" --config "$config")
    local ann=()
    [ "$request" != - ] && ann=(--annotation "vramgate.dev/memory=$request")
    "$PY" "$here/gpu_bundle.py" --template "$WORK/template/config.json" --rootfs "$ROOTFS" --bundle "$dir" "${hook[@]}" "${ann[@]}" \
        --env NVIDIA_VISIBLE_DEVICES=0 --gpu-minors "$GPU0_MINOR" --env JOB_GIB="$gib" --env JOB_SECONDS="$secs" "$@" -- "$PY" "$WORK/gpu_job.py"
}

# start_container DIR ID: runs it in the background; writes DIR/log and DIR/rc ("rc start end").
start_container() {
    local dir=$1 id=$2
    (
        s=$(date +%s.%N)
        runc_ run "${RUN_FLAGS[@]}" --bundle "$dir" "$id" </dev/null >"$dir/log" 2>&1
        rc=$?
        echo "$rc $s $(date +%s.%N)" >"$dir/rc"
    ) &
}

# Probe: a GPU container that only lists the GPU, with pivot_root and else without it.
probe_dir=$WORK/probe
rm -rf "$probe_dir"
"$PY" "$here/gpu_bundle.py" --template "$WORK/template/config.json" --rootfs "$ROOTFS" --bundle "$probe_dir" \
    -- "$PY" -c 'import torch; print("probe", torch.cuda.get_device_name(0))' >/dev/null
if ! runc_ run --bundle "$probe_dir" vramgate-probe-$$ </dev/null >"$probe_dir/log" 2>&1; then
    runc_ delete --force vramgate-probe-$$ 2>/dev/null
    echo "runc with pivot_root failed ($(tail -1 "$probe_dir/log")); trying --no-pivot" >&2
    RUN_FLAGS=(--no-pivot)
    runc_ run --no-pivot --bundle "$probe_dir" vramgate-probe-$$ </dev/null >"$probe_dir/log" 2>&1 ||
        { echo "cannot run a GPU container here: $(cat "$probe_dir/log")" >&2; exit 1; }
fi
echo "container probe: $(cat "$probe_dir/log") ${RUN_FLAGS[*]}" >&2

# PASS/FAIL/INFO lines of the checks, also appended to $SUMMARY where a script keeps one
# (summary_in); `failures` counts the FAILs for the exit status.
failures=0
say() { if [ -n "${SUMMARY:-}" ]; then echo "$*" | tee -a "$SUMMARY"; else echo "$*"; fi; }
pass() { say "PASS $*"; }
fail() { say "FAIL $*"; failures=$((failures + 1)); }
info() { say "INFO $*"; }

# Results go to the directory $1, with an empty summary.txt that say/pass/fail/info fill.
summary_in() {
    R=$1
    mkdir -p "$R"
    SUMMARY=$R/summary.txt
    : >"$SUMMARY"
}

# MPS's control binary (on PATH or in /usr/local/nvidia/bin) in MPS_CONTROL, or a FAIL and exit.
find_mps_control() {
    export PATH="$PATH:/usr/local/nvidia/bin"
    MPS_CONTROL=$(command -v nvidia-cuda-mps-control) || { say "FAIL nvidia-cuda-mps-control not found"; exit 1; }
}

# Waits (60 s at most) until `vramgate status` under the config $1 lists $2 reservations.
wait_for_reservations() {
    local config=$1 want=$2 n
    for _ in $(seq 1 60); do
        sleep 1
        n=$(VRAMGATE_CONFIG=$config timeout 20 "$BIN/vramgate" status --json 2>/dev/null |
            "$PY" -c 'import json,sys; print(sum(len(g["reservations"]) for g in json.load(sys.stdin)["gpus"]))' 2>/dev/null || echo 0)
        [ "$n" -ge "$want" ] && break
    done
}

# How many reservations and tickets the ledger under the config $1 still holds.
left_in_ledger() {
    VRAMGATE_CONFIG=$1 "$BIN/vramgate" status --json |
        "$PY" -c 'import json,sys; print(sum(len(g["reservations"]) + len(g["queue"]) for g in json.load(sys.stdin)["gpus"]))'
}

# The set-up of an MPS check named $1 (enforce, overuse) of N neighbours ($NEIGHBOURS, else
# $2) whose containers' ids start with PREFIX ($3 and this shell's pid): results in $4 (else
# $OUT, else $WORK/$1) with its summary, MPS's control binary, and fresh directories: T for
# its runs, PIPE and LOGD for the MPS daemon (not under /tmp: the containers get a /tmp of
# their own), and the state directories of earlier runs gone. mps_env runs a command against
# that daemon.
start_mps_check() {
    local name=$1
    N=${NEIGHBOURS:-$2}
    PREFIX=$3$$
    summary_in "${4:-${OUT:-$WORK/$name}}"
    find_mps_control
    T=$WORK/$name-run
    PIPE=$WORK/mps-pipe
    LOGD=$WORK/mps-log
    rm -rf "$T" "$PIPE" "$LOGD" "$STATE_BASE/$name"-*
    mkdir -p "$T" "$PIPE" "$LOGD"
}
mps_env() { CUDA_MPS_PIPE_DIRECTORY=$PIPE CUDA_MPS_LOG_DIRECTORY=$LOGD "$@"; }
