#!/usr/bin/env bash
# s50_branches.sh: session 50's two prepared branches measured in one device call, carried
# builds only (nvcc on the development machine): A = main in build-carry/ (dspec), P =
# wip/s50-prefill-cache in build-carry-b/ (dspec, cuda_ops_test, cuda_model_test), G =
# wip/s50-gdc in build-carry-c/ (dspec, cuda_ops_test). P's GEMM op test (cached rows bitwise the
# tiles') and model tests (a prompt's logits with the cache bitwise those without), G's gated
# delta and attention prologue op tests (G: the chunk state kernel's leaner copies and the
# prologue's row blocks); prefill of the 27B Q4_K_M shapes at 8K and 32K tokens (A, G, A, G) and at 512
# / 2K (A, G); then P's bench at 512 / 2K / 8K, each prompt without and with `--prefill-cache 64`
# in one process; `DSPEC_CUDA_PROFILE`'s per-op times of an 8K prompt of A and G; NCU=1 adds
# Nsight Compute's full sections of one 8K-prompt launch of `gdc_state_kernel` of A and G
# (gdc_A.txt / gdc_G.txt). Everything goes to $OUT/log.txt, printed at the end.
# QUICK=1 leaves out the 32K prompts and the profile.
# Usage (repo root, on the GPU machine): [NCU=1] [QUICK=1] bash bench/cuda/s50_branches.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s50_branches.sh || exit 1
A=$PWD/build-carry
P=$PWD/build-carry-b
G=$PWD/build-carry-c
need_bins "$A" dspec || exit 1
need_bins "$P" dspec cuda_ops_test cuda_model_test || exit 1
need_bins "$G" dspec cuda_ops_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  (cd /tmp && timeout 120 "$P/cuda_ops_test" 'test_matmul_gemm' >"$OUT/p_ops.log" 2>&1
   echo "P cuda_ops_test test_matmul_gemm exit $?")
  grep -E "PASSED|FAILED" "$OUT/p_ops.log" | tail -4
  timeout 240 "$P/cuda_model_test" >"$OUT/p_model.log" 2>&1
  echo "P cuda_model_test exit $?"
  grep -E "prefill gemm|PASSED|FAILED" "$OUT/p_model.log" | tail -6
  (cd /tmp && timeout 120 "$G/cuda_ops_test" 'test_gated_delta*' >"$OUT/g_ops.log" 2>&1
   echo "G cuda_ops_test test_gated_delta* exit $?")
  grep -E "gated delta prefill|PASSED|FAILED" "$OUT/g_ops.log" | tail -10
  (cd /tmp && timeout 120 "$G/cuda_ops_test" 'test_attn_prologue' >"$OUT/g_pro.log" 2>&1
   echo "G cuda_ops_test test_attn_prologue exit $?")
  grep -E "PASSED|FAILED" "$OUT/g_pro.log" | tail -4
  "$A/dspec" synth --preset 27b --mix q4_k_m /tmp/s50.gguf 2>&1 | tail -1
  pre() { # dir prompt
    echo "$(basename "$1") $2: $(timeout 200 "$1/dspec" bench --model /tmp/s50.gguf \
      --device cuda --prompt "$2" --decode 1 --reps 1 --verify 1 2>&1 | grep ^prefill)"
  }
  for N in 8192 32768; do # (QUICK=1: 8K only, and no per-op profile)
    [ -n "${QUICK:-}" ] && [ $N = 32768 ] && continue
    for round in 1 2; do pre "$A" $N; pre "$G" $N; done
  done
  for N in 512 2048; do pre "$A" $N; pre "$G" $N; done
  for D in "$A" "$G"; do
    [ -n "${QUICK:-}" ] && break
    echo "$(basename "$D"): DSPEC_CUDA_PROFILE, 8K prompt"
    DSPEC_CUDA_PROFILE=1 timeout 200 "$D/dspec" bench --model /tmp/s50.gguf --device cuda \
      --decode 1 --reps 1 --verify 1 --prompt 8192 2>&1 |
      grep -iE "gated_delta|attn_prologue|total" | head -8
    if [ -n "${NCU:-}" ]; then # (the bench's 256-row warm-up runs 48 launches first)
      n=$([ "$D" = "$A" ] && echo A || echo G)
      timeout 300 ncu -k regex:gdc_state_kernel --launch-skip 50 --launch-count 1 --set full \
        -o "$OUT/gdc_$n" "$D/dspec" bench --model /tmp/s50.gguf --device cuda --prompt 8192 \
        --decode 1 --reps 1 --verify 1 >"$OUT/ncu_$n.log" 2>&1
      ncu -i "$OUT/gdc_$n.ncu-rep" --page details >"$OUT/gdc_$n.txt" 2>&1
      grep -E "Duration|Executed Ipc|Issue Slots Busy|Eligible|Registers|Executed Instructions" \
        "$OUT/gdc_$n.txt" | head -12 | sed "s/^/$n /"
    fi
  done
  for N in 512 2048 8192; do
    timeout 240 "$P/dspec" bench --model /tmp/s50.gguf --device cuda --prompt "$N" --decode 1 \
      --reps 1 --verify 1 --prefill-cache 64 2>&1 \
      | grep -E "^prefill|memory in use|error" | sed "s/^/P $N: /"
  done
  rm -f /tmp/s50.gguf
} >"$L" 2>&1
cat "$L"
