#!/usr/bin/env bash
# session 55: gdc_state bank conflicts: op tests, logits bitwise against main (5000-token prompt
# through the chunked prefill), 8K prefill A/B, Nsight Compute of the new kernel
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s55 || exit 1
M=$PWD/build-carry-f F=$PWD/${NEW:-build-carry-g}
need_bins "$M" dspec || exit 1
need_bins "$F" dspec cuda_ops_test || exit 1
L=$OUT/log.txt
{
  date +%T
  (cd /tmp && timeout 120 "$F/cuda_ops_test" 'test_gated_delta*' >"$OUT/ops.log" 2>&1
   echo "cuda_ops_test test_gated_delta* exit $?")
  grep -E "OK|PASSED|FAILED|rror|rel" "$OUT/ops.log" | tail -12
  f=/tmp/c.gguf
  "$M/dspec" synth --preset 27b --mix q4_k_m --tokenizer models/tiny-target-q8_0.gguf $f 2>&1 | tail -1
  TOK=$(python3 -c 'print(",".join(str((i*7919)%8000+1) for i in range(5000)))')
  for b in M F; do
    B=$M; [ $b = F ] && B=$F
    timeout 120 "$B/dspec" logits -m $f --tokens "$TOK" --batch 8192 --device cuda \
      --out /tmp/l_$b.bin 2>&1 | tail -1
  done
  cmp /tmp/l_M.bin /tmp/l_F.bin && echo "logits bitwise equal ($(stat -c %s /tmp/l_F.bin) bytes)"
  python3 - <<'PY'
import numpy as np
a = np.fromfile('/tmp/l_M.bin', dtype=np.float32); b = np.fromfile('/tmp/l_F.bin', dtype=np.float32)
print('logits main vs new: rel L2 %.3e, max abs %.3e' % (np.linalg.norm(a - b) / np.linalg.norm(a), np.abs(a - b).max()))
PY
  rm -f /tmp/l_M.bin /tmp/l_F.bin
  for b in F M F M F M; do
    B=$M; [ $b = F ] && B=$F
    timeout 60 "$B/dspec" bench --model $f --device cuda --prompt 8192 --decode 1 --reps 1 \
      --verify 1 2>&1 | grep -E "^prefill|error" | sed "s/^/[$b] /"
  done
  date +%T
  timeout 120 ncu -k "regex:gdc_state" --launch-skip 12 --launch-count 1 --set full \
    "$F/dspec" bench --model $f --device cuda --prompt 4096 --decode 1 --reps 1 --verify 1 \
    >"$OUT/ncu_gdc.txt" 2>&1
  grep -E "Duration|L1/TEX Cache Throughput|L2 Cache Throughput|bank conflict|Issue Slots Busy" \
    "$OUT/ncu_gdc.txt" | head -12
  date +%T
} >"$L" 2>&1
cat "$L"
