#!/usr/bin/env python3
"""Packing over many job mixes: `vramgate replay`'s makespan / lower bound for FIFO and each
backfill order, as a distribution (median and worst per order and per family).

Each mix is 80 jobs (policy wait, gpus auto, each declaring its real duration) on 2 x 143104Mi
(an H200's memory) from one family and one seed:
  uniform     sizes uniform 2..32 GiB, durations uniform 5..15 s, all arriving at once
  bimodal     70 % small (2..8 GiB), 30 % large (40..72 GiB), durations uniform 5..15 s, at once
  heavytail   sizes uniform 2..32 GiB, durations Pareto (alpha 1.5, from 3 s, at most 120 s),
              at once
  staggered   sizes uniform 2..32 GiB, durations uniform 5..15 s, Poisson arrivals at about 1.2
              times what the GPUs can run (so a queue builds), not all at once
  bimodal-stg the bimodal mix with those staggered arrivals
The lower bound is replay's: the larger of the work (GiB x s) over the GPUs' memory and the
latest arrival plus its duration. It knows nothing of packing, so a mix of large jobs can sit
above it whatever the order.

Seeds 1..5 are the tuning set (`--tuning`), seeds 101..120 the evaluation set (the default):
figures reported are from mixes nothing was tuned on.

Usage: bench/replay_mixes.py [--vramgate PATH] [--tuning] [--seeds A..B] [--bound 30s] [--rows]
       [--replay-args='--strategy spread']
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

GIB_MIB = 1024
GPUS = "2x143104Mi"
JOBS = 80
ORDERS = ["fifo", "arrival", "largest", "longest"]


def uniform_size(rng):
    return rng.uniform(2, 32)


def bimodal_size(rng):
    return rng.uniform(2, 8) if rng.random() < 0.7 else rng.uniform(40, 72)


def uniform_duration(rng):
    return rng.uniform(5, 15)


def pareto_duration(rng):
    return min(3 * rng.paretovariate(1.5), 120)


def at_once(rng, jobs):
    return [0.0] * len(jobs)


def poisson(rng, jobs):
    # Work arriving at 1.2 x the GPUs' memory-seconds per second: a queue builds, then drains.
    capacity_gib = 2 * 143104 / GIB_MIB
    work = sum(gib * seconds for gib, seconds in jobs)
    span = work / capacity_gib / 1.2
    rate = len(jobs) / span
    t, out = 0.0, []
    for _ in jobs:
        out.append(round(t, 3))
        t += rng.expovariate(rate)
    return out


FAMILIES = {
    "uniform": (uniform_size, uniform_duration, at_once),
    "bimodal": (bimodal_size, uniform_duration, at_once),
    "heavytail": (uniform_size, pareto_duration, at_once),
    "staggered": (uniform_size, uniform_duration, poisson),
    "bimodal-stg": (bimodal_size, uniform_duration, poisson),
}


def mix(family, seed):
    size, duration, arrivals = FAMILIES[family]
    rng = random.Random(f"{family}-{seed}")
    jobs = [(size(rng), duration(rng)) for _ in range(JOBS)]
    times = arrivals(rng, jobs)
    lines = []
    for i, ((gib, seconds), arrival) in enumerate(zip(jobs, times)):
        seconds = round(seconds, 2)
        lines.append(json.dumps({
            "id": f"{family}-{seed}-{i}", "arrival": arrival, "memory": f"{round(gib * GIB_MIB)}Mi",
            "duration": seconds, "expected_duration": seconds, "gpus": "auto", "policy": "wait",
            "timeout": "2h",
        }))
    return "\n".join(lines) + "\n"


def replay(vramgate, path, bound, extra):
    """The ratios of one mix: {order: (ratio, passed_past_bound, admitted)}."""
    common = [vramgate, "--config", "/dev/null", "replay", path, "--gpus", GPUS, "--json"] + extra
    out = {}
    fifo = json.loads(subprocess.check_output(common + ["--backfill", "false"]))
    out["fifo"] = fifo[0]
    orders = json.loads(subprocess.check_output(
        common + ["--backfill", "true", "--backfill-bound", bound,
                  "--compare", "backfill-order=arrival,largest,longest"]))
    for run in orders:
        out[run["setting"].split("=", 1)[1]] = run
    return {o: (r["ratio"], r["passed_past_bound"], r["admitted"]) for o, r in out.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vramgate", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "vramgate"))
    parser.add_argument("--tuning", action="store_true", help="seeds 1..5 instead of 101..120")
    parser.add_argument("--seeds", help="A..B, overriding --tuning")
    parser.add_argument("--bound", default="30s", help="backfill_bound")
    parser.add_argument("--rows", action="store_true", help="print every mix's row")
    parser.add_argument("--replay-args", default="", help="more flags for vramgate replay")
    args = parser.parse_args()
    if args.seeds:
        a, b = args.seeds.split("..")
        seeds = range(int(a), int(b) + 1)
    else:
        seeds = range(1, 6) if args.tuning else range(101, 121)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for family in FAMILIES:
            for seed in seeds:
                path = os.path.join(work, f"{family}-{seed}.jsonl")
                with open(path, "w") as f:
                    f.write(mix(family, seed))
                r = replay(args.vramgate, path, args.bound, args.replay_args.split())
                results[(family, seed)] = r
                if args.rows:
                    print(f"{family:12} seed {seed:4} " + " ".join(
                        f"{o}={r[o][0]:.3f}" for o in ORDERS), flush=True)
    print(f"# {len(seeds)} seeds ({seeds.start}..{seeds.stop - 1}) x {len(FAMILIES)} families, "
          f"{JOBS} jobs each on {GPUS}, backfill_bound {args.bound} {args.replay_args}; "
          "makespan / lower bound")
    print(f"{'family':12} " + " ".join(f"{o + ' med':>12} {o + ' max':>12}" for o in ORDERS))
    for family in list(FAMILIES) + ["all"]:
        rows = [r for (f, _), r in results.items() if family in ("all", f)]
        cells = []
        for o in ORDERS:
            ratios = sorted(r[o][0] for r in rows)
            cells.append(f"{statistics.median(ratios):12.3f} {ratios[-1]:12.3f}")
        print(f"{family:12} " + " ".join(cells))
    passed = sum(r[o][1] for r in results.values() for o in ORDERS)
    short = sum(JOBS - r[o][2] for r in results.values() for o in ORDERS)
    print(f"admissions that passed a waiter past the bound: {passed}; jobs not admitted: {short}")


if __name__ == "__main__":
    sys.exit(main())
