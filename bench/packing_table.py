"""Rows of bench/replay.sh's packing table from `vramgate replay --json` output on stdin.

Usage: vramgate replay ... --json | python3 bench/packing_table.py LABEL
(stdin may hold several JSON arrays one after another, one per replay run).
"""
import json
import sys


def main() -> None:
    label = sys.argv[1]
    text = sys.stdin.read()
    decoder = json.JSONDecoder()
    rows, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        runs, at = decoder.raw_decode(text, at)
        rows += runs
    for run in rows:
        setting = run["setting"]
        order = setting if setting.startswith("backfill-order=") else "fifo (no backfill)"
        wait = run["wait_s"]
        print(
            f"{label:36} {order:26} {run['makespan_s']:7.1f}s {run['lower_bound_s']:7.1f}s"
            f" {run['ratio']:6.2f} {wait['p95']:7.1f}s {wait['max']:7.1f}s"
            f" {run['admitted']:4} {run['passed_past_bound']:6}"
        )


if __name__ == "__main__":
    main()
