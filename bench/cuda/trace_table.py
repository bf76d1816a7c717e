#!/usr/bin/env python3
"""trace_table.py: where a replayed step graph spends its time, from kernel_trace.c's CSV.

Usage: python3 trace_table.py kernel_trace.csv [--graph-kernels N] [--top K] [--eager]
                                                 [--by-launch]

Splits the kernels of replayed graphs into step instances (a run of one graph id; a node id
seen again starts the next instance), takes the graphs with at least N kernels (default 300:
decode and verify steps, not commits), and prints per graph: the median instance's span (first
kernel start to last kernel end), GPU busy time (union of kernel intervals), the idle time
inside the step, the time from one instance's end to the next's start (host pass and whatever
ran between), and per kernel kind (name without template arguments) over that instance: count,
share (the summed extensions: how far each kernel's end moved the latest end so far; under
programmatic launch kernels start early and wait, so their durations overlap and over-count),
summed durations, and the idle time just before the kind's kernels (start minus the latest end
so far, when positive): the price of a launch or a copy that breaks the chain.
--eager: the kernels launched outside graphs instead (a prompt's prefill, an eager draft), all of
them as one run, by kind: count, share, durations (the share is the right column under
programmatic launch: the prompt's chunked gated delta measured 686 us of "duration" per prep
launch that was ~100 us of its own).
--by-launch: kinds split by launch shape (grid x*y*z / block threads), so that one kernel's
matrix shapes get rows of their own (a GEMV's weight bytes / its "us each" is the bandwidth that
shape reaches inside the step: bench/RESULTS.md session 30).
"""
import csv
import re
import statistics
import sys
from collections import defaultdict


def kind(name):
    m = re.match(r"_ZN?(\d+)", name)      # mangled (CUPTI's default): the first identifier
    if m:
        i = m.end()
        return name[i:i + int(m.group(1))]
    n = re.sub(r"<.*", "", name)         # template arguments
    n = re.sub(r"\(.*", "", n)           # parameter list
    return n.split("::")[-1].split(" ")[-1].strip() or name[:40]


def key_of(k, by_launch):
    """The row a kernel is counted in: its kind, or its kind and launch shape."""
    if not by_launch:
        return kind(k["name"])
    return f"{kind(k['name'])} {k['grid']}/{k['block']}"


def instances(rows):
    cur, seen, out = None, set(), []
    for r in rows:
        g, node = r["graph"], r["node"]
        if g == 0:
            cur = None
            continue
        if cur is None or cur["graph"] != g or node in seen:
            cur = {"graph": g, "k": []}
            seen = set()
            out.append(cur)
        seen.add(node)
        cur["k"].append(r)
    return out


def analyse(inst):
    """Span, GPU busy time, and per kernel: the idle time before it and its extension (how far
    its end moved the latest end so far: its share of the step, the extensions sum to busy)."""
    ks = inst["k"]
    t0 = min(k["start"] for k in ks)
    t1 = max(k["end"] for k in ks)
    busy, idle_before, ext = 0, [], []
    hi = t0
    for k in ks:  # (sorted by start)
        gap = k["start"] - hi
        idle_before.append(max(gap, 0))
        e = max(0, k["end"] - max(k["start"], hi))
        ext.append(e)
        busy += e
        hi = max(hi, k["end"])
    return t0, t1, busy, idle_before, ext


def eager(rows, top, by_launch):
    """The kernels outside graphs as one run (analyse's accounting), by kind."""
    ks = [r for r in rows if r["graph"] == 0]
    if not ks:
        print("no kernels outside graphs")
        return 1
    t0, t1, busy, idle, ext = analyse({"k": ks})
    print(f"{len(ks)} kernels outside graphs: span {(t1 - t0) / 1e6:.2f} ms, GPU busy "
          f"{busy / 1e6:.2f} ms")
    agg = defaultdict(lambda: [0, 0, 0])
    for k, e in zip(ks, ext):
        a = agg[key_of(k, by_launch)]
        a[0] += 1
        a[1] += e
        a[2] += k["end"] - k["start"]
    print(f"  {'kernel kind':<32} {'count':>6} {'share ms':>9} {'us each':>9} {'durations ms':>13}")
    for name, (n, e, d) in sorted(agg.items(), key=lambda x: -x[1][1])[:top]:
        print(f"  {name[:32]:<32} {n:>6} {e / 1e6:>9.2f} {e / n / 1e3:>9.1f} {d / 1e6:>13.2f}")
    return 0


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 1
    min_k = int(args[args.index("--graph-kernels") + 1]) if "--graph-kernels" in args else 300
    top = int(args[args.index("--top") + 1]) if "--top" in args else 25
    rows = []
    with open(args[0]) as f:
        for r in csv.DictReader(f):
            if r["what"] != "K":
                continue
            rows.append({"start": int(r["start"]), "end": int(r["end"]), "graph": int(r["graph"]),
                         "node": int(r["node"]), "name": r["name"],
                         "grid": f"{r['grid_x_or_bytes']}x{r['grid_y']}x{r['grid_z']}",
                         "block": r["block"]})
    rows.sort(key=lambda r: r["start"])
    by_launch = "--by-launch" in args
    if "--eager" in args:
        return eager(rows, top, by_launch)
    insts = instances(rows)
    by_graph = defaultdict(list)
    for i, inst in enumerate(insts):
        inst["i"] = i
        by_graph[inst["graph"]].append(inst)
    for g, lst in by_graph.items():
        lst = [x for x in lst if len(x["k"]) >= min_k]
        if not lst:
            continue
        stats = []
        for inst in lst:
            t0, t1, busy, idle, ext = analyse(inst)
            nxt = insts[inst["i"] + 1] if inst["i"] + 1 < len(insts) else None
            between = None
            if nxt is not None:
                between = min(k["start"] for k in nxt["k"]) - t1
            stats.append((t1 - t0, busy, t0, t1, inst, idle, between, ext))
        stats.sort(key=lambda s: s[0])
        span, busy, t0, t1, inst, idle, _, ext = stats[len(stats) // 2]
        betw = [s[6] for s in stats if s[6] is not None]
        print(f"graph {g}: {len(lst)} replays of {len(inst['k'])} kernels; median span "
              f"{span / 1e3:.1f} us, GPU busy {busy / 1e3:.1f} us, idle inside the step "
              f"{(span - busy) / 1e3:.1f} us; summed kernel durations "
              f"{sum(k['end'] - k['start'] for k in inst['k']) / 1e3:.1f} us")
        if betw:
            print(f"  end of a replay to the next graph kernel: median "
                  f"{statistics.median(betw) / 1e3:.1f} us")
        agg = defaultdict(lambda: [0, 0, 0, 0])
        for k, gap, e in zip(inst["k"], idle, ext):
            a = agg[key_of(k, by_launch)]
            a[0] += 1
            a[1] += e
            a[2] += k["end"] - k["start"]
            a[3] += gap
        print(f"  {'kernel kind':<32} {'count':>6} {'share us':>9} {'us each':>8} "
              f"{'durations us':>13} {'idle before us':>15}")
        for name, (n, e, d, gap) in sorted(agg.items(), key=lambda x: -(x[1][1] + x[1][3]))[:top]:
            print(f"  {name[:32]:<32} {n:>6} {e / 1e3:>9.1f} {e / n / 1e3:>8.2f} {d / 1e3:>13.1f} "
                  f"{gap / 1e3:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
