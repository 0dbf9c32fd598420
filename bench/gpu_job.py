#!/usr/bin/env python3
"""A GPU job like a TensorFlow job with memory growth: grow GPU memory in 256 MiB steps up to
JOB_GIB GiB, then multiply matrices for JOB_SECONDS seconds (wall time, so a job's length does
not depend on how many share the GPU). Exit 0 on success, 3 on CUDA out-of-memory, 4 on any
other CUDA error (cuBLAS failing to allocate its workspace is one).

JOB_SHOW_GPU=1 prints how many GPUs CUDA sees and the first one's UUID (bench/gpu-k8s.sh).
JOB_REPORT=1 (run on the host, not in a container) also prints what NVML says this process
holds after creating the CUDA context and at the end: the context size and the job's peak.
"""
import os
import sys
import time

t0 = time.time()
gib = float(os.environ.get("JOB_GIB", "6"))
seconds = float(os.environ.get("JOB_SECONDS", "5"))
step = 256 << 20
report = os.environ.get("JOB_REPORT") == "1"
print(f"start {t0:.3f}", flush=True)

import torch  # noqa: E402


def nvml_used():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None


try:
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t_ctx = time.time()
    if os.environ.get("JOB_SHOW_GPU") == "1":
        # What CUDA sees in the container: how many GPUs, and the first one's UUID.
        props = torch.cuda.get_device_properties(0)
        print(f"gpus {torch.cuda.device_count()} GPU-{props.uuid}", flush=True)
    if report:
        print(f"context_bytes {nvml_used()}", flush=True)
    chunks = []
    for _ in range(int(gib * 1024) // 256):
        chunks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
        time.sleep(0.02)
    t_grown = time.time()
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    end = time.time() + seconds
    n = 0
    while time.time() < end:
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        n += 10
    if report:
        print(f"peak_bytes {nvml_used()}", flush=True)
    t1 = time.time()
    print(f"ok import+ctx {t_ctx - t0:.2f}s grow {t_grown - t_ctx:.2f}s compute {t1 - t_grown:.2f}s matmuls {n}", flush=True)
    sys.exit(0)
except torch.cuda.OutOfMemoryError as e:
    print("FAILED out of memory: " + str(e).splitlines()[0][:200], flush=True)
    os._exit(3)
except RuntimeError as e:
    print("FAILED cuda error: " + str(e).splitlines()[0][:200], flush=True)
    os._exit(4)
