#!/usr/bin/env python3
"""Watches bench/gpu-k8s.sh's pods (namespace gpujobs) until every one has ended, then writes
one line a pod and a summary.

  gpu_k8s_observe.py LABEL LIMIT_S TSV   (kubectl on PATH, KUBECONFIG set)

Every 2 s it reads the pods and the claims (a generated claim is deleted once its pod ends, so
the device each pod's claim was allocated is noted while it is there) and the slices (each
device's uuid attribute). At the end, each pod's log gives what CUDA saw (`gpus N UUID`) and
how the job ended (bench/gpu_job.py: exit 0 ok, 3 out of memory, 4 another CUDA error).
TSV columns: pod, size GiB, phase, exit code, outcome, claimed device, its uuid, the GPUs CUDA
saw, the UUID CUDA saw, created, started, finished (seconds from the first creation).
"""
import datetime
import json
import subprocess
import sys
import time


def kubectl(*args):
    out = subprocess.run(["kubectl", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def get(kind, ns=True):
    args = ["get", kind, "-o", "json"] + (["-n", "gpujobs"] if ns else [])
    return json.loads(kubectl(*args))["items"]


def ts(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def main():
    label, limit, tsv = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    began = time.time()
    device_of = {}  # pod name -> device
    uuid_of = {}  # device -> uuid
    pending_reasons = set()
    peak_pending = 0
    while True:
        pods = get("pods")
        for claim in get("resourceclaims"):
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
            owner = [o["name"] for o in claim["metadata"].get("ownerReferences", []) if o["kind"] == "Pod"]
            if results and owner:
                device_of[owner[0]] = results[0]["device"]
        for s in get("resourceslices", ns=False):
            for d in s["spec"].get("devices", []):
                u = d.get("attributes", {}).get("uuid", {}).get("string")
                if u:
                    uuid_of[d["name"]] = u
        pending = [p for p in pods if p["status"].get("phase") == "Pending"]
        peak_pending = max(peak_pending, sum(1 for p in pending if not p["spec"].get("nodeName")))
        for p in pending:
            for c in p["status"].get("conditions", []):
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message"):
                    pending_reasons.add(c["message"][:200])
        done = [p for p in pods if p["status"].get("phase") in ("Succeeded", "Failed")]
        if pods and len(done) == len(pods):
            break
        if time.time() - began > limit:
            print(f"{label}: {len(done)} of {len(pods)} pods ended within {limit:.0f} s; stopping there", flush=True)
            break
        time.sleep(2)
    rows, outcomes = [], {}
    t0 = min(ts(p["metadata"]["creationTimestamp"]) for p in pods)
    last = t0
    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        name = p["metadata"]["name"]
        term = {}
        for cs in p["status"].get("containerStatuses", []):
            term = cs.get("state", {}).get("terminated") or {}
        code = term.get("exitCode")
        try:
            log = kubectl("logs", "-n", "gpujobs", name)
        except RuntimeError as e:
            log = str(e)
        seen = [l.split() for l in log.splitlines() if l.startswith("gpus ")]
        gpus, seen_uuid = (seen[0][1], seen[0][2]) if seen else ("-", "-")
        outcome = {0: "ok", 3: "oom", 4: "cuda-error"}.get(code, "ended" if code is not None else "not-ended")
        if code not in (None, 0, 3, 4):
            outcome = f"exit-{code}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        device = device_of.get(name, "-")
        started, finished = ts(term.get("startedAt")), ts(term.get("finishedAt"))
        if finished:
            last = max(last, finished)
        rel = lambda t: f"{t - t0:.1f}" if t else "-"
        rows.append(
            [name, p["metadata"]["labels"].get("size", "-"), p["status"].get("phase", "-"), str(code), outcome,
             device, uuid_of.get(device, "-"), gpus, seen_uuid,
             rel(ts(p["metadata"]["creationTimestamp"])), rel(started), rel(finished)]
        )
    with open(tsv, "w") as f:
        f.write("pod\tgib\tphase\texit\toutcome\tdevice\tdevice_uuid\tcuda_gpus\tcuda_uuid\tcreated\tstarted\tfinished\n")
        for r in rows:
            f.write("\t".join(r) + "\n")
    mismatched = [r[0] for r in rows if r[5] != "-" and (r[7] != "1" or r[8] != r[6])]
    print(f"{label}: {len(pods)} pods, makespan {last - t0:.1f} s (first creation to last finish); outcomes "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())), flush=True)
    if device_of:
        print(f"{label}: {len(device_of)} pods had a claim allocated; {len(mismatched)} saw other than exactly "
              f"their claim's GPU {mismatched[:5]}; at most {peak_pending} pods waited unscheduled at once", flush=True)
    for r in sorted(pending_reasons)[:3]:
        print(f"{label}: a scheduler's reason seen: {r}", flush=True)


if __name__ == "__main__":
    main()
