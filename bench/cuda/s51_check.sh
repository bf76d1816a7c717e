#!/usr/bin/env bash
# s51_check.sh: main after session 51's merges (M, carried in build-carry-m/: dspec,
# cuda_ops_test, cuda_model_test) against the main before them (A, build-carry/: dspec) in one
# device call: M's whole CUDA suite, then the 27B Q4_K_M (synthetic) decode and verify N = 1 / 16
# at 512 tokens of context (A, M, A, M), the 8K prompt of each, and `DSPEC_CUDA_PROFILE`'s
# gated delta and attention prologue times of an 8K prompt. Everything goes to $OUT/log.txt.
# Usage (repo root, on the GPU machine): bash bench/cuda/s51_check.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s51_check.sh || exit 1
A=$PWD/build-carry
M=$PWD/build-carry-m
need_bins "$A" dspec || exit 1
need_bins "$M" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  (cd /tmp && timeout 200 "$M/cuda_ops_test" >"$OUT/ops.log" 2>&1; echo "M cuda_ops_test exit $?")
  grep -E "^\[  (PASSED|FAILED)" "$OUT/ops.log" | tail -6
  timeout 200 "$M/cuda_model_test" >"$OUT/model.log" 2>&1; echo "M cuda_model_test exit $?"
  grep -E "prefill gemm|^\[  (PASSED|FAILED)" "$OUT/model.log" | tail -12
  "$A/dspec" synth --preset 27b --mix q4_k_m /tmp/s51.gguf 2>&1 | tail -1
  for round in 1 2; do
    for D in "$A" "$M"; do
      timeout 200 "$D/dspec" bench --model /tmp/s51.gguf --device cuda --prompt 512 --decode 32 \
        --reps 3 --verify 1,16 2>&1 | grep -E "^decode|greedy decode|N =  *(1|16):" |
        sed "s|^|$(basename "$D"): |"
    done
  done
  for D in "$A" "$M"; do
    echo "$(basename "$D"): DSPEC_CUDA_PROFILE, 8K prompt"
    DSPEC_CUDA_PROFILE=1 timeout 200 "$D/dspec" bench --model /tmp/s51.gguf --device cuda \
      --decode 1 --reps 1 --verify 1 --prompt 8192 2>&1 |
      grep -iE "^prefill|gated_delta|attn_prologue|total" | head -8
  done
  rm -f /tmp/s51.gguf
} >"$L" 2>&1
cat "$L"
