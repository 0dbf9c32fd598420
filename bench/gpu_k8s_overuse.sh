#!/usr/bin/env bash
# bench/gpu-k8s.sh's over-use step (issue 55 item 3): two claims' pods of 4 GiB + overhead on
# one GPU; job-000 grows to 16 GiB, past its claim; job-001 stays at 4 GiB. The chart's watch
# (over_use = "kill") must stop job-000 and not job-001, and the exporter must show both.
# Run after `bench/gpu-k8s.sh up`, with its PATH and KUBECONFIG.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
W=${VG_K8S_WORK:-/var/tmp/vgk8s}
R=${OUT:-$W/out}/overuse.txt
kubectl delete namespace gpujobs --ignore-not-found --wait=true >/dev/null 2>&1
python3 "$here/gpu_k8s_pods.py" with 2 "${OVERHEAD_MIB:-748}" 60 4 4 | python3 -c '
import json, sys
l = json.load(sys.stdin)
for it in l["items"]:
    if it["kind"] == "Pod" and it["metadata"]["name"] == "job-000":
        for e in it["spec"]["containers"][0]["env"]:
            if e["name"] == "JOB_GIB":
                e["value"] = "16"
json.dump(l, sys.stdout)' >"$W/overuse.json"
kubectl apply -f "$W/overuse.json" >/dev/null
{
    sleep 25
    echo "## 25 s after: the pods, their claims' devices"
    kubectl get pods -n gpujobs -o wide
    kubectl get resourceclaims -n gpujobs -o custom-columns=NAME:.metadata.name,POD:.metadata.ownerReferences[0].name,DEVICE:.status.allocation.devices.results[0].device
    echo "## the exporter's metrics naming the pods"
    python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9835/metrics").read().decode())' | grep -E 'job-00[01]' | head -12
    echo "## the watch's log"
    kubectl logs -n kube-system -l app.kubernetes.io/name=vramgate-watch --tail 8
    echo "## the pods' events"
    kubectl get events -n gpujobs --sort-by=.lastTimestamp | tail -8
    echo "## the jobs' logs"
    for p in job-000 job-001; do echo "$p: $(kubectl logs -n gpujobs $p 2>&1 | tail -3 | tr '\n' ' ')"; done
    sleep 45
    echo "## 70 s after"
    kubectl get pods -n gpujobs -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,EXIT:.status.containerStatuses[0].state.terminated.exitCode,REASON:.status.containerStatuses[0].state.terminated.reason
} 2>&1 | tee "$R"
kubectl delete namespace gpujobs --ignore-not-found --wait=false >/dev/null 2>&1
