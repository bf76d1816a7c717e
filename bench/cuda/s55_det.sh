#!/usr/bin/env bash
# session 55: which change moves the 5000-token logits: main twice, gated-norm-only (U), gdc-only (V)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s55 || exit 1
M=$PWD/build-carry-m U=$PWD/build-carry-u V=$PWD/build-carry-v
need_bins "$M" dspec || exit 1
need_bins "$U" dspec || exit 1
need_bins "$V" dspec || exit 1
L=$OUT/log.txt
{
  date +%T
  f=/tmp/c.gguf
  "$M/dspec" synth --preset 27b --mix q4_k_m --tokenizer models/tiny-target-q8_0.gguf $f 2>&1 | tail -1
  TOK=$(python3 -c 'print(",".join(str((i*7919)%8000+1) for i in range(5000)))')
  for b in M1 U M2 V; do
    B=$M; [ $b = U ] && B=$U; [ $b = V ] && B=$V
    timeout 120 "$B/dspec" logits -m $f --tokens "$TOK" --batch 8192 --device cuda \
      --out /tmp/l_$b.bin 2>&1 | tail -1
  done
  python3 - <<'PY'
import numpy as np
V = 248320
a = np.memmap('/tmp/l_M1.bin', dtype=np.float32, mode='r').reshape(-1, V)
for o in ['M2', 'U', 'V']:
    b = np.memmap('/tmp/l_%s.bin' % o, dtype=np.float32, mode='r').reshape(-1, V)
    first, num, den, mx = -1, 0.0, 0.0, 0.0
    for r0 in range(0, a.shape[0], 500):
        x = np.asarray(a[r0:r0 + 500], dtype=np.float64); y = np.asarray(b[r0:r0 + 500], dtype=np.float64)
        d = x - y
        if first < 0:
            rows = np.nonzero(np.any(d != 0, axis=1))[0]
            if len(rows): first = r0 + int(rows[0])
        num += float((d * d).sum()); den += float((x * x).sum()); mx = max(mx, float(np.abs(d).max()))
    am = int((a[:, :].argmax(axis=1) != b[:, :].argmax(axis=1)).sum())
    print('M1 vs %s: first differing row %d, rel L2 %.3e, max abs %.3e, argmax differs on %d rows' % (o, first, (num / den) ** 0.5, mx, am))
PY
  rm -f /tmp/l_*.bin
  date +%T
} >"$L" 2>&1
cat "$L"
