#!/usr/bin/env python3
"""What the hooks.d files cost a container that requests nothing, now that podman and CRI-O run
the hook for every container: prestart and poststop of vramgate-hook (100 live reservations in
the ledger, state on tmpfs) against /bin/true spawned the same way. Run as root after
`cargo build --release --bins`:  sudo bench/no-request-cost.py"""
import subprocess, time, os, json, statistics, shutil
root="/dev/shm/vg-post"; shutil.rmtree(root, ignore_errors=True); os.makedirs(root+"/state", mode=0o700); os.makedirs(root+"/bundle")
json.dump({"ociVersion":"1.0.2","process":{"args":["sh"],"env":["PATH=/bin"]},"root":{"path":"rootfs"}}, open(root+"/bundle/config.json","w"))
open(root+"/config.toml","w").write(f'state_dir = "{root}/state"\n')
ident={"pid":1,"start_time":1}
d=open("/proc/1/stat").read(); ident["start_time"]=int(d[d.rindex(")")+2:].split()[19])
ledger={"schema":1,"generation":1,"next_ticket":1,"queue":[],"reservations":[{"container_id":f"live{i}","gpus":[{"uuid":"GPU-x","bytes":1<<20}],"init":ident,"created_unix_ms":1,"waited_ms":0} for i in range(100)]}
fd=os.open(root+"/state/ledger.json", os.O_WRONLY|os.O_CREAT, 0o600); os.write(fd, json.dumps(ledger).encode()); os.close(fd)
env=dict(os.environ, VRAMGATE_CONFIG=root+"/config.toml")
hook=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "vramgate-hook")
res={"prestart, no request":[], "poststop, not in the ledger":[], "/bin/true":[]}
st=json.dumps({"ociVersion":"1.0.2","id":"plain","status":"creating","pid":os.getpid(),"bundle":root+"/bundle"}).encode()
for i in range(300):
    for name,cmd in (("prestart, no request",[hook,"prestart"]),("poststop, not in the ledger",[hook,"poststop"]),("/bin/true",["/bin/true"])):
        t=time.perf_counter(); p=subprocess.run(cmd,input=st,env=env,capture_output=True); res[name].append((time.perf_counter()-t)*1000)
        assert p.returncode==0,(name,p.stderr)
print("load", open("/proc/loadavg").read().split()[0])
for k,v in res.items(): v.sort(); print(f"{k:30} median {statistics.median(v):.3f} ms p90 {v[270]:.3f}")
shutil.rmtree(root)
