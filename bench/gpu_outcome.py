"""What each container of a gpu-*.sh batch left in its directory <d>/c<i>: the exit status
and start and end times its wrapper wrote to `rc`, and its output in `log`. Imported by the
batch summaries of bench/gpu-experiment.sh and bench/gpu-placement.sh."""


def containers(d, n):
    """(log, ok, seconds) of containers 1..n under d: ok when the job exited 0 and printed its
    `ok ` line; seconds from its start to its end."""
    for i in range(1, n + 1):
        rc, start, end = open(f"{d}/c{i}/rc").read().split()
        log = open(f"{d}/c{i}/log", errors="replace").read()
        yield log, rc == "0" and "\nok " in "\n" + log, float(end) - float(start)
