#!/usr/bin/env bash
# repro.sh: is a long prompt's CUDA prefill the same bits in every process? Runs `dspec logits`
# of one TOKENS-token prompt (default 5000, in one chunk) RUNS times (default 4), each in its own
# process, with the carried binary in BIN (default build-carry; bench/cuda/README.md "Carried
# binaries"), and prints each run's hash of all rows' logits with the cuBLASLt algorithm each
# GEMM shape chose in that process (gemm.cu logs it at info level), and where the run's logits
# first differ from run 1's (numpy): differing hashes with differing choices point at the
# per-process choice, with the same choices at a race. (Session 56: 6 of 9 processes differed,
# choices alike, from a race in gdc_state_kernel; after its fix 5 of 5 agreed. To find such a
# layer, `dspec logits --dump-hidden` of two processes compared layer by layer.)
# Usage (repo root, on the GPU machine): [BIN=build-carry-m] [RUNS=4] [TOKENS=5000] \
#   bash bench/cuda/repro.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh repro.sh || exit 1
B=$PWD/${BIN:-build-carry}
need_bins "$B" dspec || exit 1
f=/tmp/repro.gguf
"$B/dspec" synth --preset 27b --mix q4_k_m --tokenizer models/tiny-target-q8_0.gguf $f 2>&1 \
  | tail -1
TOK=$(python3 -c "print(','.join(str((i * 7919) % 8000 + 1) for i in range(${TOKENS:-5000})))")
for r in $(seq "${RUNS:-4}"); do
  timeout 120 "$B/dspec" logits -m $f --tokens "$TOK" --batch 8192 --device cuda -v \
    --out /tmp/repro.bin 2>"$OUT/repro_$r.log" >/dev/null
  e=$?
  [ "$r" = 1 ] && cp /tmp/repro.bin /tmp/repro1.bin
  # against run 1: the first row whose logits differ and the largest difference
  d=$(python3 - /tmp/repro1.bin /tmp/repro.bin "${TOKENS:-5000}" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(f, dtype=np.float32) for f in sys.argv[1:3])
n = int(sys.argv[3])
if a.size != b.size:
    print("sizes differ")
else:
    v = a.size // n
    rows = np.nonzero((a.reshape(n, v) != b.reshape(n, v)).any(axis=1))[0]
    print("same as run 1" if rows.size == 0 else
          f"{rows.size} rows differ from run 1, the first {rows[0]}, max |diff| "
          f"{np.abs(a - b).max():.3g}")
PY
)
  echo "run $r: exit $e, logits $(sha256sum /tmp/repro.bin | cut -c1-16) ($d)," \
    "choices: $(grep -o 'GEMM [0-9]* x [0-9]* x [0-9]*-row bucket ([a-z0-9]* out): cuBLASLt algorithm [0-9]*' \
    "$OUT/repro_$r.log" | sed 's/-row bucket//; s/ out)//; s/(//; s/: cuBLASLt algorithm/ ->/' \
    | paste -sd';')"
done | tee "$OUT/repro.txt"
rm -f $f /tmp/repro.bin /tmp/repro1.bin
