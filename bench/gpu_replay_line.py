"""One line for bench/gpu-placement.sh's queue-order runs: the measured makespan (argv[2] - argv[1], s)
over the lower bound of the run's own jobs, beside the replay of its event log
(`vramgate replay ... --json` on stdin)."""
import json
import sys

run = json.load(sys.stdin)[0]
measured = float(sys.argv[2]) - float(sys.argv[1])
bound = run["lower_bound_s"]
print(
    f"#   measured {measured:.1f}s / lower bound {bound:.1f}s = {measured / bound:.2f};"
    f" replayed {run['makespan_s']:.1f}s = {run['ratio']:.2f};"
    f" passed past the bound: {run['passed_past_bound']}"
)
