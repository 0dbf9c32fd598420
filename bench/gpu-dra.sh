#!/usr/bin/env bash
# The DRA driver on a real GPU host (NVML inventory), with bench/dra_bench.rs as kubelet and the
# scheduler and the stand-in API server (tests/support/apiserver.py): what the slice publishes
# from NVML (product names, capacities from the driver's free memory), prepare and republish
# costs, and how long memory taken outside vramgate by a CUDA process of its own (torch,
# OUTSIDE_GIB GiB on GPU 0) takes to lower GPU 0's published capacity, and to raise it again
# once the process is gone.
#
# Usage (root, on the GPU machine): bench/gpu-dra.sh, with target/release/{vramgate-dra,
# examples/dra-bench} built and, where the machine lacks python3-jsonschema, target/gpu-dra/
# holding its Debian packages (debs/) and Kubernetes 1.36's schemas (schemas/):
#   apt-get download python3-jsonschema python3-attr python3-pyrsistent
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
WORK=${WORK:-/var/tmp/vramgate-gpu-dra}
OUTSIDE_GIB=${OUTSIDE_GIB:-10}
mkdir -p "$WORK"
schemas=${VRAMGATE_K8S_SCHEMAS:-/var/cache/vramgate-tests/k8s-json-schema-1.36}
[ -f "$schemas/_definitions.json" ] || schemas=$root/target/gpu-dra/schemas
export VRAMGATE_K8S_SCHEMAS=$schemas
if ! /usr/bin/python3 -c 'import jsonschema' 2>/dev/null; then
    for deb in "$root"/target/gpu-dra/debs/*.deb; do dpkg -x "$deb" "$WORK/py"; done
    export PYTHONPATH="$WORK/py/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
    /usr/bin/python3 -c 'import jsonschema' # fails here, loudly, if that did not help
fi
# State on a tmpfs, as /run/vramgate is on a systemd host.
state=/run/vramgate-gpu-dra
mkdir -p "$state" && chmod 0700 "$state"
config=$WORK/config.toml
cat >"$config" <<TOML
state_dir = "$state"
[inventory]
backend = "nvml"
TOML
echo "$ bench/gpu-dra.sh   ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1), $(nproc) CPUs)"
nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv,noheader
outside="${TORCH_PYTHON:-python3} -c \"import torch, time; x = torch.empty($OUTSIDE_GIB << 30, dtype=torch.uint8, device='cuda:0'); x.fill_(1); torch.cuda.synchronize(); time.sleep(600)\""
exec "$root/target/release/examples/dra-bench" --config "$config" --claims 100 --changes 20 \
    --outside-cmd "$outside" --outside-gib "$OUTSIDE_GIB"
