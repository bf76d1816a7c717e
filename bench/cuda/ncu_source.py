#!/usr/bin/env python3
"""ncu_source.py: where one kernel's instructions and stalls go, from Nsight Compute's source page.

Usage: python3 ncu_source.py SASS.csv [--top K] [--split ADDR ...]

SASS.csv is the source page of one profiled launch, exported on the GPU machine with
    ncu --set full --import-source no -k regex:KERNEL --launch-skip S --launch-count 1 -o rep CMD
    ncu -i rep.ncu-rep --page source --csv --print-source sass > SASS.csv
(e.g. CMD = `gemv_bench 2 sweep q4_K`, whose staged launches run five per shape). Prints the
warp instructions executed and the warp-state samples per opcode (with each opcode's three
largest stall reasons), then the K instructions with the most samples (default 25). --split
cuts the kernel at the given addresses (hex, the low digits the table prints, e.g. b1040): each
region's share of the executed instructions and of the samples, with its executions per pass of
the region's first instruction (session 45 found a staged-GEMM item's end this way: 230
instructions a pass against 729 for a whole pipeline stage).
"""
import csv
import re
import sys
from collections import Counter


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    top, splits, i = 25, [], 2
    while i < len(argv):
        if argv[i] == "--top":
            top, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--split":
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                splits.append(int(argv[i], 16))
                i += 1
        else:
            print("ncu_source.py: unknown argument %s" % argv[i])
            return 2
    rows = list(csv.reader(open(argv[1], newline="")))
    hi = next(k for k, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
    ix = {h: k for k, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samp_col, ex_col = ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"]
    tot_s = sum(num(r[samp_col]) for r in data) or 1.0
    tot_x = sum(num(r[ex_col]) for r in data) or 1.0
    print("%d instructions; %.0f warp instructions executed, %.0f samples" %
          (len(data), tot_x, tot_s))
    by_s, by_x, why = Counter(), Counter(), Counter()
    for r in data:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0].split(".")[0]
        by_s[op] += num(r[samp_col])
        by_x[op] += num(r[ex_col])
        for c in stalls:
            why[(op, c)] += num(r[ix[c]])
    print("\n%-10s %9s %9s  largest stall reasons" % ("opcode", "samples%", "executed%"))
    for op, _ in sorted(by_x.items(), key=lambda kv: -kv[1])[:25]:
        reasons = sorted(((why[(op, c)], c) for c in stalls), reverse=True)[:3]
        print("%-10s %9.1f %9.1f  %s" % (op, 100 * by_s[op] / tot_s, 100 * by_x[op] / tot_x,
              " ".join("%s %.0f%%" % (c[6:], 100 * v / max(by_s[op], 1)) for v, c in reasons)))
    print("\ntop %d instructions by samples" % top)
    for r in sorted(data, key=lambda r: -num(r[samp_col]))[:top]:
        reasons = sorted(((num(r[ix[c]]), c) for c in stalls), reverse=True)[:2]
        print("%6.2f%% %s %-64s %s" % (100 * num(r[samp_col]) / tot_s, r[ix["Address"]][-5:],
              r[ix["Source"]].strip()[:64], " ".join("%s %.0f" % (c[6:], v) for v, c in reasons)))
    if splits:
        mask = 0xFFFFF
        bounds = sorted(splits)
        reg_x, reg_s, first = Counter(), Counter(), {}
        for r in data:
            a = int(r[ix["Address"]], 16) & mask
            k = sum(1 for b in bounds if a >= b)
            reg_x[k] += num(r[ex_col])
            reg_s[k] += num(r[samp_col])
            first.setdefault(k, num(r[ex_col]))
        print("\nregion  from     executed%  samples%  instructions a pass")
        for k in sorted(reg_x):
            start = "start" if k == 0 else "%05x" % bounds[k - 1]
            passes = first[k] or 1.0
            print("%-7d %-8s %9.1f %9.1f %10.1f" % (k, start, 100 * reg_x[k] / tot_x,
                  100 * reg_s[k] / tot_s, reg_x[k] / passes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
