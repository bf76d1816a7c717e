#!/usr/bin/env python3
"""ncu_table.py: the kernels of one step from two Nsight Compute CSVs (profile.sh), by difference.

Usage: ncu_table.py BASE.csv RUN.csv [DIVISOR]
Groups kernels by name (template arguments kept) and grid x block, subtracts BASE from RUN, divides
by DIVISOR (steps in the difference) and prints count and GPU time per step, largest first.
Standard library only."""
import csv
import re
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    agg = defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r.get("Metric Name") not in (None, "gpu__time_duration.sum"):
            continue
        try:
            ns = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        name = re.sub(r"\(.*$", "", r["Kernel Name"]).replace("void ", "")
        key = (name, r.get("Grid Size", ""), r.get("Block Size", ""))
        agg[key][0] += 1
        agg[key][1] += ns
    return agg


def main():
    base, run = load(sys.argv[1]), load(sys.argv[2])
    div = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    diff = {}
    for k in set(base) | set(run):
        n = run.get(k, [0, 0.0])[0] - base.get(k, [0, 0.0])[0]
        t = run.get(k, [0, 0.0])[1] - base.get(k, [0, 0.0])[1]
        if n:
            diff[k] = (n / div, t / div / 1e3)
    tot_n = sum(v[0] for v in diff.values())
    tot_t = sum(v[1] for v in diff.values())
    print(f"per step: {tot_n:.0f} kernels, {tot_t / 1e3:.3f} ms GPU time")
    by_name = defaultdict(lambda: [0.0, 0.0])
    for (name, _, _), (n, t) in diff.items():
        by_name[name][0] += n
        by_name[name][1] += t
    print(f"{'kernel':60s} {'count':>7s} {'us':>9s} {'%':>5s}")
    for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:60]:60s} {n:7.0f} {t:9.1f} {100 * t / tot_t:5.1f}")
    print(f"\n{'kernel, grid, block (top 40)':60s} {'count':>7s} {'us':>9s} {'us/each':>8s}")
    for (name, g, b), (n, t) in sorted(diff.items(), key=lambda kv: -kv[1][1])[:40]:
        print(f"{(name[:34] + ' ' + g + ' ' + b)[:60]:60s} {n:7.0f} {t:9.1f} {t / n:8.2f}")


if __name__ == "__main__":
    main()
