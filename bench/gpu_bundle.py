#!/usr/bin/env python3
"""Writes a runc bundle for a GPU container on the GPU host.

The rootfs is the host's own / (read-only): its python3 has torch and the driver's libraries,
so no image is needed. /sys is bind-mounted from the host (CUDA reads PCI topology there), the
/dev/nvidia* nodes are created in the container and allowed in its device cgroup, /tmp is a
tmpfs. With --hook, the vramgate hooks run at createRuntime and poststop.

usage: gpu_bundle.py --template T/config.json --bundle DIR [--hook PATH --config TOML]
                     [--gpu-minors 0,1] [--annotation k=v]... [--env K=V]... -- ARGS...

--gpu-minors keeps only these GPUs' /dev/nvidiaN nodes (nvidiactl, uvm and caps stay), as the
NVIDIA toolkit or CDI would give a container pinned to them; without it, every GPU's node.
"""
import argparse
import glob
import json
import os
import stat

p = argparse.ArgumentParser()
p.add_argument("--template", required=True, help="config.json written by `runc spec`")
p.add_argument("--bundle", required=True)
p.add_argument("--rootfs", default="/", help="a bind mount of the host's /")
p.add_argument("--hook")
p.add_argument("--config")
p.add_argument("--annotation", action="append", default=[])
p.add_argument("--env", action="append", default=[])
p.add_argument("--gpu-minors", help="comma list of GPU minor numbers whose /dev/nvidiaN to add")
p.add_argument("args", nargs="+")
a = p.parse_args()

spec = json.load(open(a.template))
spec["root"] = {"path": a.rootfs, "readonly": True}
proc = spec["process"]
proc["terminal"] = False
proc["args"] = a.args
proc["cwd"] = "/tmp"
env = [
    "PATH=" + os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
    "HOME=/tmp",
    "PYTHONUNBUFFERED=1",
]
for key in ("LD_LIBRARY_PATH", "CUDA_HOME", "PYTHONPATH"):
    if os.environ.get(key):
        env.append(f"{key}={os.environ[key]}")
proc["env"] = env + a.env

mounts = [m for m in spec["mounts"] if not m["destination"].startswith("/sys")]
mounts.append({"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro", "nosuid", "nodev"]})
mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=1g"]})
# The host's /run (the vramgate state) stays out of reach of the jobs.
mounts.append({"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=0755"]})
spec["mounts"] = mounts

linux = spec.setdefault("linux", {})
devices = linux.setdefault("devices", [])
allow = linux.setdefault("resources", {}).setdefault("devices", [])
for path in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/nvidia-caps/*")):
    st = os.stat(path)
    if not stat.S_ISCHR(st.st_mode):
        continue
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    name = os.path.basename(path)
    if a.gpu_minors is not None and name[len("nvidia"):].isdigit() and str(minor) not in a.gpu_minors.split(","):
        continue
    devices.append({"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0})
    allow.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
# The host's /dev/shm is not shared; PyTorch needs more than runc's default 64 KiB only for
# multi-process data loading, which these jobs do not do.

spec["annotations"] = dict(kv.split("=", 1) for kv in a.annotation)
if a.hook:
    def entry(stage):
        return {
            "path": a.hook,
            "args": ["vramgate-hook", stage, "--hook-timeout", "600"],
            "env": [f"VRAMGATE_CONFIG={a.config}"],
            "timeout": 600,
        }
    spec["hooks"] = {"createRuntime": [entry("createRuntime")], "poststop": [entry("poststop")]}
os.makedirs(a.bundle, exist_ok=True)
with open(os.path.join(a.bundle, "config.json"), "w") as f:
    json.dump(spec, f, indent=1)
