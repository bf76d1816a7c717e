#!/usr/bin/env bash
# prefill_cache.sh: the prefill weight cache (`--prefill-cache`, docs/cuda.md "Prefill weight
# cache") on the GPU machine, carried binaries in build-carry/ (dspec, cuda_ops_test,
# cuda_model_test): the GEMM op test (cached rows bitwise the tiles') and the model tests (a
# prompt's logits with the cache bitwise those without), then `dspec bench --model` of the 27B
# Q4_K_M shapes at PROMPTS tokens, each prompt timed without and then with the cache in one
# process. Everything goes to $OUT/log.txt, printed at the end.
# Usage (repo root, on the GPU machine): [PROMPTS="512 2048 8192"] [GIB=64] \
#   bash bench/cuda/prefill_cache.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh prefill_cache.sh || exit 1
B=$PWD/build-carry
need_bins "$B" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  (cd /tmp && timeout 200 "$B/cuda_ops_test" 'test_matmul_gemm' >"$OUT/ops.log" 2>&1
   echo "cuda_ops_test test_matmul_gemm exit $?")
  grep -E "prefill cache|PASSED|FAILED" "$OUT/ops.log" | tail -6
  timeout 300 "$B/cuda_model_test" >"$OUT/model.log" 2>&1
  echo "cuda_model_test exit $?"
  grep -E "prefill gemm|PASSED|FAILED" "$OUT/model.log" | tail -8
  "$B/dspec" synth --preset 27b --mix q4_k_m /tmp/pc.gguf 2>&1 | tail -1
  for P in ${PROMPTS:-512 2048 8192}; do
    timeout 240 "$B/dspec" bench --model /tmp/pc.gguf --device cuda --prompt "$P" --decode 1 \
      --reps 1 --verify 1 --prefill-cache "${GIB:-64}" 2>&1 \
      | grep -E "^prefill|prefill cache|memory in use|error" | sed "s/^/[$P] /"
  done
  rm -f /tmp/pc.gguf
} >"$L" 2>&1
cat "$L"
