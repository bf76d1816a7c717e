#!/usr/bin/env bash
# fa_wg_check.sh: the warpgroup-MMA prefill attention (attention_prefill_wg.cu) on the GPU
# machine: wg_probe (wgmma.cuh's layouts against a host product), B's CUDA tests, then prefill
# of the 27B Q4_K_M shapes at 8K (A, B, A, B) and 32K tokens (A, B), and one 8K prompt of each
# with DSPEC_CUDA_PROFILE's per-op GPU times. A: build-carry (dspec), B: build-carry-b (dspec,
# cuda_ops_test, cuda_model_test, wg_probe), and C: build-carry-c (dspec) where carried, run
# after B each time. Everything goes to $OUT/log.txt, printed at the end.
# Usage (repo root, on the GPU machine): bash bench/cuda/fa_wg_check.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh fa_wg_check.sh || exit 1
A=$PWD/build-carry
B=$PWD/build-carry-b
need_bins "$A" dspec || exit 1
need_bins "$B" dspec cuda_ops_test cuda_model_test wg_probe || exit 1
C=$PWD/build-carry-c
DS=("$A" "$B")
[ -e "$C/dspec.xz" ] || [ -e "$C/dspec" ] && { need_bins "$C" dspec || exit 1; DS+=("$C"); }
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
  timeout 30 "$B/wg_probe"
  (cd /tmp && timeout 240 "$B/cuda_ops_test" >"$OUT/ops_test.log" 2>&1
   echo "cuda_ops_test exit $?")
  grep -E "prefill attention.*(wgmma|FAIL)|FAILED|PASSED|ERROR" "$OUT/ops_test.log" | head -60
  timeout 200 "$B/cuda_model_test" >"$OUT/model_test.log" 2>&1
  echo "cuda_model_test exit $?"
  grep -E "FAILED|PASSED" "$OUT/model_test.log"
  "$A/dspec" synth --preset 27b --mix q4_k_m /tmp/fw.gguf 2>&1 | tail -1
  bm() { timeout 240 "$1/dspec" bench --model /tmp/fw.gguf --device cuda --decode 4 --reps 1 \
           --verify 1 --prompt "$2" 2>&1 | grep -E "^prefill"; }
  for round in 1 2; do
    for D in "${DS[@]}"; do echo "$(basename "$D") 8K: $(bm "$D" 8192)"; done
  done
  for D in "${DS[@]}"; do echo "$(basename "$D") 32K: $(bm "$D" 32768)"; done
  for D in "${DS[@]}"; do
    echo "== $(basename "$D") profile, 8K"
    DSPEC_CUDA_PROFILE=1 timeout 240 "$D/dspec" bench --model /tmp/fw.gguf --device cuda \
      --decode 4 --reps 1 --verify 1 --prompt 8192 2>&1 |
      grep -iE "attention|gated_delta|total|prefill" | head -12
  done
  rm -f /tmp/fw.gguf
} >"$L" 2>&1
cat "$L"
