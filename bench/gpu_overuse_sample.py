#!/usr/bin/env python3
"""Samples, every 20 ms until SIGTERM, what the processes of one pid namespace (a container's)
hold on GPU 0 by NVML, and prints one JSON line: when their sum first exceeded THRESHOLD
bytes (unix seconds), the peak sum, and the last time any of them held memory.

usage: gpu_overuse_sample.py NS_INODE THRESHOLD_BYTES
"""
import json
import os
import signal
import sys
import time

import pynvml

ns, threshold = int(sys.argv[1]), int(sys.argv[2])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
running = True
first_over = None
last_seen = None
peak = 0


def stop(*_):
    global running
    running = False


def namespace(pid):
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


signal.signal(signal.SIGTERM, stop)
while running:
    now = time.time()
    total = 0
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if namespace(p.pid) == ns:
            total += p.usedGpuMemory or 0
    if total:
        last_seen = now
    peak = max(peak, total)
    if first_over is None and total > threshold:
        first_over = now
    time.sleep(0.02)
print(json.dumps({"first_over": first_over, "peak": peak, "last_seen": last_seen}))
sys.stdout.flush()
