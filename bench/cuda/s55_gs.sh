#!/usr/bin/env bash
# session 55: gated norm half-warp rows + gdc_state register state: tests, logits bitwise against
# main (5000-token prompt), kernel times (Nsight Compute), 8K prefill A/B (M = main, F = branch)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s55 || exit 1
M=$PWD/build-carry-m F=$PWD/build-carry-t
need_bins "$M" dspec || exit 1
need_bins "$F" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  date +%T
  for t in cuda_ops_test cuda_model_test; do
    (cd /tmp && timeout 200 "$F/$t" >"$OUT/$t.log" 2>&1; echo "$t exit $?")
    grep -E "PASSED|FAILED|ERROR|LINE" "$OUT/$t.log" | tail -6
  done
  f=/tmp/c.gguf
  "$M/dspec" synth --preset 27b --mix q4_k_m --tokenizer models/tiny-target-q8_0.gguf $f 2>&1 | tail -1
  TOK=$(python3 -c 'print(",".join(str((i*7919)%8000+1) for i in range(5000)))')
  for b in M F; do
    B=$M; [ $b = F ] && B=$F
    timeout 120 "$B/dspec" logits -m $f --tokens "$TOK" --batch 8192 --device cuda \
      --out /tmp/l_$b.bin 2>&1 | tail -1
  done
  cmp /tmp/l_M.bin /tmp/l_F.bin && echo "logits bitwise equal ($(stat -c %s /tmp/l_F.bin) bytes)"
  rm -f /tmp/l_M.bin /tmp/l_F.bin
  for b in M F; do
    B=$M; [ $b = F ] && B=$F
    timeout 120 ncu -k "regex:gdc_state|gated_warp" --launch-skip 12 --launch-count 6 \
      --metrics gpu__time_duration.sum "$B/dspec" bench --model $f --device cuda --prompt 4096 \
      --decode 1 --reps 1 --verify 1 2>&1 | grep -E "gdc_state|gated_warp|duration" \
      | paste - - | awk -v b=$b '{print "[" b "] " $2, $(NF)}'
  done
  for b in F M F M F M; do
    B=$M; [ $b = F ] && B=$F
    timeout 60 "$B/dspec" bench --model $f --device cuda --prompt 8192 --decode 1 --reps 1 \
      --verify 1 2>&1 | grep -E "^prefill|error" | sed "s/^/[$b] /"
  done
  date +%T
} >"$L" 2>&1
cat "$L"
