#!/usr/bin/env python3
"""The pods of bench/gpu-k8s.sh's experiment, as one kubectl List on stdout.

  gpu_k8s_pods.py with    N OVERHEAD_MIB JOB_SECONDS SIZES... : one ResourceClaimTemplate per
      size (the job's GiB plus its measured overhead, in MiB, from the DRA driver's device
      class) and N pods of the vramgate RuntimeClass, each with a claim from its size's template.
  gpu_k8s_pods.py plugin  N OVERHEAD_MIB JOB_SECONDS SIZES... : N pods of the vramgate
      RuntimeClass asking the device plugin's vramgate.dev/gpu-memory-gib (size + overhead, in
      whole GiB rounded up).
  gpu_k8s_pods.py without N GPUS JOB_SECONDS SIZES... : N privileged pods of the plain runc
      handler (every GPU's device node), pod i handed GPU i mod GPUS by CUDA_VISIBLE_DEVICES:
      what a cluster without admission control does with the same burst.

Every pod runs bench/gpu_job.py with the host's Python and PyTorch: the image is the node's
busybox image; the host's /usr, /opt and loader cache are mounted read-only at their own paths.
The pods are in namespace gpujobs, labelled job=gpu-k8s, size=<GiB>.
"""
import json
import sys

NAMESPACE = "gpujobs"
WORK = "/var/tmp/vgk8s"


def host_mounts():
    volumes, mounts = [], []
    for name, host, at, kind in [
        ("usr", "/usr", "/usr", "Directory"),
        ("opt", "/opt", "/opt", "Directory"),
        ("lib", "/usr/lib", "/lib", "Directory"),
        ("lib64", "/usr/lib64", "/lib64", "Directory"),
        ("ldcache", "/etc/ld.so.cache", "/etc/ld.so.cache", "File"),
        ("job", f"{WORK}/job", f"{WORK}/job", "Directory"),
    ]:
        volumes.append({"name": name, "hostPath": {"path": host, "type": kind}})
        mounts.append({"name": name, "mountPath": at, "readOnly": True})
    volumes.append({"name": "tmp", "emptyDir": {}})
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    return volumes, mounts


def pod(i, gib, seconds, env_extra):
    volumes, mounts = host_mounts()
    env = {
        "HOME": "/tmp",
        "PATH": "/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib",
        "PYTHONUNBUFFERED": "1",
        "JOB_GIB": str(gib),
        "JOB_SECONDS": str(seconds),
        "JOB_SHOW_GPU": "1",
    }
    env.update(env_extra)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"job-{i:03d}",
            "namespace": NAMESPACE,
            "labels": {"job": "gpu-k8s", "size": str(gib)},
        },
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "volumes": volumes,
            "containers": [
                {
                    "name": "job",
                    "image": "vramgate.test/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["/opt/torch/.venv/bin/python3", f"{WORK}/job/gpu_job.py"],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "volumeMounts": mounts,
                }
            ],
        },
    }


def main():
    mode, n = sys.argv[1], int(sys.argv[2])
    items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    if mode == "with":
        overhead, seconds, sizes = int(sys.argv[3]), sys.argv[4], [int(s) for s in sys.argv[5:]]
        for gib in sorted(set(sizes)):
            items.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"mem-{gib}gib", "namespace": NAMESPACE},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {
                                        "name": "gpu",
                                        "exactly": {
                                            "deviceClassName": "gpu-memory.vramgate.dev",
                                            "count": 1,
                                            "capacity": {"requests": {"memory": f"{gib * 1024 + overhead}Mi"}},
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            )
        for i in range(n):
            gib = sizes[i % len(sizes)]
            p = pod(i, gib, seconds, {})
            p["spec"]["runtimeClassName"] = "vramgate"
            p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"mem-{gib}gib"}]
            p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
            items.append(p)
    elif mode == "plugin":
        # The device plugin's extended resource, in whole GiB (the chart's devicePlugin.unit).
        overhead, seconds, sizes = int(sys.argv[3]), sys.argv[4], [int(s) for s in sys.argv[5:]]
        for i in range(n):
            gib = sizes[i % len(sizes)]
            p = pod(i, gib, seconds, {})
            p["spec"]["runtimeClassName"] = "vramgate"
            units = gib + -(-overhead // 1024)
            p["spec"]["containers"][0]["resources"] = {"limits": {"vramgate.dev/gpu-memory-gib": str(units)}}
            items.append(p)
    elif mode == "without":
        gpus, seconds, sizes = int(sys.argv[3]), sys.argv[4], [int(s) for s in sys.argv[5:]]
        for i in range(n):
            gib = sizes[i % len(sizes)]
            p = pod(i, gib, seconds, {"CUDA_VISIBLE_DEVICES": str(i % gpus)})
            p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
            items.append(p)
    else:
        sys.exit(f"gpu_k8s_pods.py: mode {mode!r}: with, plugin or without")
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)


if __name__ == "__main__":
    main()
