#!/usr/bin/env bash
# Kubernetes on the GPU machine (issue 55): the suite's one-node Kubernetes 1.36.3
# (tools/testnode, the code the real-node tests use) on a GPU host, with an NVML inventory and
# the chart in DRA mode from this package's node image, then real CUDA pods. Run as root on
# the GPU host, in steps (each well under the GPU machine's 10-minute call):
#
#   bench/gpu-k8s.sh stash FILE...   copy carried files into $W/parts (they go over in pieces:
#                                    the Kubernetes binaries, containerd 2.1, runc, the CNI
#                                    plugins, helm and a static busybox as gpuk8s-part.*, one
#                                    xz tar split in three; vramgate's binaries and node image
#                                    as vg.tar.xz); see "Carrying" below
#   bench/gpu-k8s.sh up              unpack, start the node, import the node image, helm install
#                                    (DRA, the exporter, the watch with over_use = "kill")
#   bench/gpu-k8s.sh slice           the slice's capacities against NVML, and a process outside
#                                    Kubernetes lowering its GPU's capacity
#   bench/gpu-k8s.sh with            N pods at once, each a claim of its job's size + overhead
#   bench/gpu-k8s.sh without         the same burst on the plain runc handler, GPUs by hand
#   bench/gpu-k8s.sh plugin          the release upgraded to the device plugin, a burst asking
#                                    vramgate.dev/gpu-memory-gib
#   bench/gpu-k8s.sh down            helm uninstall, testnode down
#
# Results: $OUT (the device tool's folder) or $W/out: gpu-k8s.txt (the summary lines), and
# pods-<run>.tsv (one line a pod: its GPU, what CUDA saw, its outcome, its times).
#
# Carrying (on the build machine; what travels is at most 64 MiB a call):
#   stage=$(mktemp -d); mkdir -p $stage/{k8s,containerd/usr,runc,cni,bin,helm}
#   cp -r <kubernetes cache>/bin $stage/k8s/; cp <containerd 2.1>/usr/bin $stage/containerd/usr/ -r
#   cp /usr/sbin/runc $stage/runc/; cp /usr/lib/cni/{bridge,host-local,loopback,portmap} $stage/cni/
#   cp /bin/busybox $stage/bin/; cp <helm> $stage/helm/
#   tar -C $stage -cf - . | xz -T2 -6 | split -n 3 -d - gpuk8s-part.
#   scripts/package --no-build && scripts/build-image; tar -cJf vg.tar.xz bin/ image/
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
W=${VG_K8S_WORK:-/var/tmp/vgk8s}
NODE=$W/node
RESULTS=${OUT:-$W/out}
mkdir -p "$W/parts" "$RESULTS"
N=${N:-80}
JOB_SECONDS=${JOB_SECONDS:-8}
SIZES=${SIZES:-"2 3 4 6 8 12 16 24 32"}
LIMIT=${LIMIT:-420}
STEP_MIB=256

say() { echo "$*" | tee -a "$RESULTS/gpu-k8s.txt"; }
die() { echo "gpu-k8s: $*" >&2; exit 1; }

export VRAMGATE_KUBERNETES=$W/opt/k8s VRAMGATE_CONTAINERD_2=$W/opt/containerd
export PATH=$W/opt/k8s/bin:$W/opt/helm:$W/vg/bin:$PATH
[ -f "$NODE/kube/admin.kubeconfig" ] && export KUBECONFIG=$NODE/kube/admin.kubeconfig

helm_() { HELM_CONFIG_HOME=$W/helm HELM_CACHE_HOME=$W/helm HELM_DATA_HOME=$W/helm helm "$@"; }

# burst MODE ARG: the pods of gpu_k8s_pods.py MODE (ARG: the overhead, or the GPU count) at
# once, followed until every one has ended; one summary line and pods-MODE.tsv.
burst() {
    local mode=$1 arg=$2
    # shellcheck disable=SC2086
    python3 "$here/gpu_k8s_pods.py" "$mode" "$N" "$arg" "$JOB_SECONDS" $SIZES >"$W/$mode.json"
    kubectl apply -f "$W/$mode.json" >/dev/null || die "applying the pods failed"
    python3 "$here/gpu_k8s_observe.py" "$mode" "$LIMIT" "$RESULTS/pods-$mode.tsv" | tee -a "$RESULTS/gpu-k8s.txt"
}

ctr_() { "$W/opt/containerd/usr/bin/ctr" --address "$NODE/containerd/containerd.sock" -n k8s.io "$@"; }

cmd_stash() {
    for f in "$@"; do cp "$f" "$W/parts/" || die "cannot copy $f"; done
    ls -la "$W/parts"
}

cmd_up() {
    mkdir -p "$W/opt" "$W/vg" "$W/job"
    if [ ! -x "$W/opt/k8s/bin/kubelet" ]; then
        for p in 00 01 02; do [ -f "$W/parts/gpuk8s-part.$p" ] || die "$W/parts/gpuk8s-part.$p is missing: stash it first"; done
        cat "$W/parts"/gpuk8s-part.0{0,1,2} | xz -d -T0 | tar -x -C "$W/opt" || die "unpacking the parts failed"
    fi
    [ -f "$W/parts/vg.tar.xz" ] || die "$W/parts/vg.tar.xz is missing: stash it first"
    tar -C "$W/vg" -xJf "$W/parts/vg.tar.xz" || die "unpacking vg.tar.xz failed"
    # What the node needs on the host: runc on PATH, the CNI plugins where containerd's config
    # names them, a static busybox for the node's app image.
    install -m 0755 "$W/opt/runc/runc" /usr/local/sbin/runc
    mkdir -p /usr/lib/cni && cp "$W/opt/cni/"* /usr/lib/cni/
    [ -x /usr/bin/busybox ] || install -m 0755 "$W/opt/bin/busybox" /usr/bin/busybox
    cp "$here/gpu_job.py" "$W/job/"
    cat >"$W/extra.toml" <<TOML
policy = "wait"
[inventory]
backend = "nvml"
nvml_library = "$(ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}')"
[enforce]
cdi_spec_dirs = ["$NODE/containerd/cdi"]
over_use = "kill"
TOML
    say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=count,name,memory.total,driver_version --format=csv,noheader | head -1); $(nproc) cores; kernel $(uname -r)"
    local t0=$SECONDS
    testnode up --dir "$NODE" --config-extra "$W/extra.toml" --vramgate-bin "$W/vg/bin" || die "testnode up failed"
    export KUBECONFIG=$NODE/kube/admin.kubeconfig
    say "testnode up: Ready in $((SECONDS - t0)) s; $(kubectl version -o json | python3 -c 'import json,sys; print("server", json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
    ctr_ images import --base-name registry.example/vramgate "$W/vg/image/"*.oci.tar >/dev/null || die "importing the node image failed"
    # The node as the chart's pods find it (what tests/kube_helm.rs's prepare does): labelled,
    # the node's RuntimeClass left to the release, its config in a directory of its own.
    local node
    node=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
    kubectl label node "$node" vramgate.dev/ready=true --overwrite >/dev/null
    kubectl delete runtimeclass vramgate --ignore-not-found --wait=true >/dev/null
    mkdir -p "$NODE/etc-vramgate" "$NODE/etc-cdi"
    # The ledger's directory, as the package's tmpfiles entry makes it (root's alone).
    install -d -m 0700 "$NODE/state"
    ln -f "$NODE/config.toml" "$NODE/etc-vramgate/config.toml" || die "cannot link the node's config.toml"
    python3 - "$NODE" "$W" >"$W/values.json" <<'PY'
import json, subprocess, sys
node, w = sys.argv[1], sys.argv[2]
info = json.load(open(f"{node}/node.json"))
state = [l.split("=", 1)[1].strip().strip('"') for l in open(info["vramgate_config"]) if l.startswith("state_dir")][0]
nvml = subprocess.run(["sh", "-c", "ldconfig -p | awk '/libnvidia-ml.so.1 / {print $NF; exit}'"], capture_output=True, text=True).stdout.strip()
kubelet = info["kubelet_root"]
json.dump({
    "image": {"tag": "0.1.0", "pullPolicy": "Never"},
    "nvmlLibrary": nvml,
    "hostNetwork": True,
    "apiServer": {"host": "127.0.0.1", "port": int(info["api_server"].rsplit(":", 1)[1])},
    "exporter": {"enabled": True, "port": 9835},
    "watch": {"enabled": True},
    "hostPaths": {
        "config": f"{node}/etc-vramgate",
        "state": state,
        "containerdTasks": info["containerd"]["state"] + "/io.containerd.runtime.v2.task",
        "cdi": info["cdi_dir"],
        "cdiStatic": f"{node}/etc-cdi",
        "kubeletPluginsRegistry": f"{kubelet}/plugins_registry",
        "kubeletPlugins": f"{kubelet}/plugins",
        "devicePlugins": "/var/lib/kubelet/device-plugins",
        "hook": f"{w}/vg/bin/vramgate-hook",
    },
}, sys.stdout, indent=1)
PY
    t0=$SECONDS
    helm_ upgrade --install vramgate "$repo/charts/vramgate" -n kube-system --wait --timeout 5m -f "$W/values.json" >"$RESULTS/helm.log" 2>&1 \
        || { kubectl get pods -A -o wide; kubectl describe pods -n kube-system | tail -40; die "helm install failed: $(tail -3 "$RESULTS/helm.log")"; }
    wait_rollout vramgate-dra vramgate-exporter vramgate-watch
    say "helm install (DRA, exporter, watch): $((SECONDS - t0)) s; $(kubectl get pods -n kube-system --no-headers | awk '{print $1, $3}' | tr '\n' ' ')"
}

# Helm's --wait can return before a DaemonSet has scheduled its pod: wait for each rollout.
wait_rollout() {
    for ds in "$@"; do
        kubectl rollout status "daemonset/$ds" -n kube-system --timeout=120s >/dev/null \
            || die "DaemonSet $ds did not roll out: $(kubectl get pods -n kube-system --no-headers | tr '\n' ' ')"
    done
}

# The slice's capacity of each GPU against NVML's total less what runs outside Kubernetes.
slice_check() {
    local label=$1
    python3 - "$label" "$STEP_MIB" <<'PY' | tee -a "$RESULTS/gpu-k8s.txt"
import json, subprocess, sys
import pynvml as n
label, step = sys.argv[1], int(sys.argv[2]) << 20
slices = json.loads(subprocess.run(["kubectl", "get", "resourceslices", "-o", "json"], capture_output=True, text=True, check=True).stdout)["items"]
cap = {}
for s in slices:
    for d in s["spec"].get("devices", []):
        u = d.get("attributes", {}).get("uuid", {}).get("string")
        cap[u] = d.get("capacity", {}).get("memory", {}).get("value")
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    u = n.nvmlDeviceGetUUID(h)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    procs = sum(p.usedGpuMemory or 0 for p in n.nvmlDeviceGetComputeRunningProcesses(h))
    print(f"{label}: GPU {i} {u}: NVML total {mem.total >> 20} MiB, used {mem.used >> 20} MiB, processes {procs >> 20} MiB; slice capacity {cap.get(u)}")
PY
}

cmd_slice() {
    slice_check "slice at rest"
    # A process outside Kubernetes takes 20 GiB of GPU 1 (or 0): the capacity must drop.
    local g=$(( $(nvidia-smi -L | wc -l) - 1 ))
    CUDA_VISIBLE_DEVICES=$g JOB_GIB=20 JOB_SECONDS=40 python3 "$W/job/gpu_job.py" >"$W/outside.log" 2>&1 &
    local pid=$!
    sleep 25
    slice_check "slice with 20 GiB used outside Kubernetes on GPU $g"
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    sleep 12
    slice_check "slice after that process ended"
}

# A job's overhead beyond its own tensors (context, cuBLAS, operands), measured on the host.
overhead_mib() {
    local cal peak
    cal=$(JOB_REPORT=1 JOB_GIB=2 JOB_SECONDS=1 python3 "$W/job/gpu_job.py")
    peak=$(echo "$cal" | awk '/^peak_bytes/ {print $2}')
    echo $(( (peak >> 20) - 2048 + 64 ))
}

clear_jobs() {
    kubectl delete namespace gpujobs --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
}

cmd_with() {
    clear_jobs
    local overhead
    overhead=$(overhead_mib)
    say "# with vramgate: N=$N JOB_SECONDS=$JOB_SECONDS SIZES=($SIZES); request = size + $overhead MiB (a 2 GiB job's measured peak + 64 MiB), rounded up to the ${STEP_MIB}Mi step by the scheduler"
    slice_check "before the burst"
    burst with "$overhead"
    sleep 5
    say "after: vramgate status: $(vramgate --config "$NODE/etc-vramgate/config.toml" status 2>&1 | tr '\n' ' ' | cut -c1-400)"
    slice_check "after the burst"
    clear_jobs
}

# A shorter burst in device-plugin mode: the release upgraded to the device plugin (DRA off),
# each pod asking vramgate.dev/gpu-memory-gib; kubelet's Allocate picks the GPU.
cmd_plugin() {
    clear_jobs
    local overhead t0=$SECONDS
    helm_ upgrade vramgate "$repo/charts/vramgate" -n kube-system --wait --timeout 5m -f "$W/values.json" \
        --set dra.enabled=false --set devicePlugin.enabled=true >>"$RESULTS/helm.log" 2>&1 || die "helm upgrade to the device plugin failed"
    wait_rollout vramgate-device-plugin vramgate-exporter vramgate-watch
    say "helm upgrade to the device plugin: $((SECONDS - t0)) s; node offers vramgate.dev/gpu-memory-gib $(kubectl get nodes -o jsonpath='{.items[0].status.allocatable.vramgate\.dev/gpu-memory-gib}')"
    overhead=$(overhead_mib)
    say "# device plugin: N=$N JOB_SECONDS=$JOB_SECONDS SIZES=($SIZES); request = size + $overhead MiB in whole GiB"
    burst plugin "$overhead"
    clear_jobs
}

cmd_without() {
    clear_jobs
    local g
    g=$(nvidia-smi -L | wc -l)
    say "# without vramgate: N=$N on $g GPUs, plain runc handler, privileged, pod i on GPU i mod $g (CUDA_VISIBLE_DEVICES)"
    burst without "$g"
    clear_jobs
}

cmd_down() {
    helm_ uninstall vramgate -n kube-system --wait >/dev/null 2>&1
    testnode down --dir "$NODE"
}

step=${1:-}
shift || true
case $step in
    stash) cmd_stash "$@" ;;
    up) cmd_up ;;
    slice) cmd_slice ;;
    with) cmd_with ;;
    without) cmd_without ;;
    plugin) cmd_plugin ;;
    down) cmd_down ;;
    *) die "usage: bench/gpu-k8s.sh stash FILE... | up | slice | with | without | down" ;;
esac
