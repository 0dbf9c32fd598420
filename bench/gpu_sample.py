#!/usr/bin/env python3
"""Samples GPU 0's used memory (NVML) every 100 ms until SIGTERM; prints the peak in MiB."""
import signal
import sys
import time

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
peak = 0
running = True


def stop(*_):
    global running
    running = False


signal.signal(signal.SIGTERM, stop)
while running:
    peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(h).used)
    time.sleep(0.1)
print(peak >> 20)
sys.stdout.flush()
