#!/usr/bin/env python3
"""What NVML says about GPU 0's memory while MPS clients run: the device's used memory, each
compute process NVML lists (pid, name, usedGpuMemory), and which of them is the MPS server
(nvidia-cuda-mps-server). Answers the question admission needs answered: is a client's memory
charged to the client, to the server, or to both (then a sum over processes counts it twice)?

usage: gpu_mps_probe.py [--json FILE]   (prints a report; --json also writes the raw numbers)
"""
import json
import os
import sys

import pynvml

MIB = 1 << 20


def name_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
        return os.path.basename(argv0) or "?"
    except OSError:
        return "(not visible)"


def mps_server_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and name_of(int(entry)) == "nvidia-cuda-mps-server":
            pids.append(int(entry))
    return pids


def main():
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    procs = []
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        used = p.usedGpuMemory
        procs.append({"pid": p.pid, "name": name_of(p.pid), "used": used if used is not None else None})
    servers = set(mps_server_pids())
    server_used = sum(p["used"] or 0 for p in procs if p["pid"] in servers or p["name"] == "nvidia-cuda-mps-server")
    clients = [p for p in procs if p["pid"] not in servers and p["name"] != "nvidia-cuda-mps-server"]
    clients_used = sum(p["used"] or 0 for p in clients)
    unknown = sum(1 for p in clients if p["used"] is None)
    listed = server_used + clients_used
    device_used = mem.used

    print(f"device: total {mem.total // MIB} MiB, used {device_used // MIB} MiB, free {mem.free // MIB} MiB")
    print(f"mps server pid(s) in /proc: {sorted(servers) or 'none'}")
    for p in sorted(procs, key=lambda p: p["pid"]):
        used = "unavailable" if p["used"] is None else f"{p['used'] // MIB} MiB"
        role = "SERVER" if p["pid"] in servers or p["name"] == "nvidia-cuda-mps-server" else "client"
        print(f"  pid {p['pid']:>8} {role:<6} {p['name']:<28} {used}")
    print(f"listed: server {server_used // MIB} MiB, {len(clients)} client(s) {clients_used // MIB} MiB"
          f" ({unknown} unavailable), sum {listed // MIB} MiB, device used {device_used // MIB} MiB")

    # The verdict: compare what the processes add up to with what the device has in use.
    if not servers and server_used == 0:
        verdict = "NO MPS SERVER listed by NVML: the clients did not run under MPS"
    elif clients_used == 0:
        verdict = "CHARGED TO THE SERVER ONLY: clients show no memory; attribution by client pid sees nothing, the server holds it all"
    elif server_used >= 0.8 * clients_used and listed > 1.3 * device_used:
        verdict = "CHARGED TWICE: the server's figure includes its clients' memory, and the clients list theirs too; count it once (the clients, not the server)"
    elif server_used < 0.2 * clients_used:
        verdict = "CHARGED TO THE CLIENTS: each client's own memory is listed under its pid; the server holds only its own"
    else:
        verdict = "UNCLEAR: compare the numbers above"
    print(f"VERDICT {verdict}")
    if len(sys.argv) == 3 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            json.dump({"total": mem.total, "used": device_used, "free": mem.free, "servers": sorted(servers),
                       "processes": procs, "server_used": server_used, "clients_used": clients_used,
                       "verdict": verdict}, f, indent=1)


if __name__ == "__main__":
    main()
