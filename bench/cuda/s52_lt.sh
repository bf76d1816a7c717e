#!/usr/bin/env bash
# s52_lt.sh: the prefill GEMM through cuBLASLt's fastest bitwise-equivalent algorithm (gemm.cu
# "cuBLASLt") against main, on the GPU machine. Carried: build-carry-f/dspec (main, with the FFN
# op), build-carry-l/{dspec,cuda_ops_test,cuda_model_test,gemm_algos} (the change; gemm_algos
# built by hand: bench/cuda/gemm_algos.cu). GEMM op tests, model tests, gemm_algos (which
# algorithms give the heuristic's first choice's bits), then `dspec bench --model
# --prefill-cache all` of the 27B Q4_K_M at PROMPTS tokens.
# Usage (repo root): [PROMPTS="8192"] [TESTS=1] [ALGOS=1] bash bench/cuda/s52_lt.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s52_lt.sh || exit 1
M=$PWD/build-carry-f F=$PWD/build-carry-l
need_bins "$M" dspec || exit 1
need_bins "$F" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name --format=csv,noheader
  if [ "${TESTS:-1}" = 1 ]; then
    (cd /tmp && timeout 150 stdbuf -oL "$F/cuda_ops_test" 'test_*gemm*' >"$OUT/ops.log" 2>&1
     echo "cuda_ops_test test_*gemm* exit $?")
    grep -E "cuBLASLt|PASSED|FAILED|rror|not bitwise" "$OUT/ops.log" | tail -12
    timeout 100 stdbuf -oL "$F/cuda_model_test" >"$OUT/model.log" 2>&1
    echo "cuda_model_test exit $?"
    grep -E "prefill gemm|PASSED|FAILED" "$OUT/model.log" | tail -10
  fi
  if [ "${ALGOS:-1}" = 1 ] && [ -x "$F/gemm_algos" ]; then # (which algorithms share lt[0]'s bits)
    timeout 120 "$F/gemm_algos" 8192 10 >"$OUT/gemm_algos.txt" 2>&1
    grep -E "best|prompt" "$OUT/gemm_algos.txt"
  fi
  [ -f /tmp/s52.gguf ] || "$F/dspec" synth --preset 27b --mix q4_k_m /tmp/s52.gguf 2>&1 | tail -1
  for P in ${PROMPTS:-8192}; do
    for b in M F; do
      B=$M; [ $b = F ] && B=$F
      timeout 120 "$B/dspec" bench --model /tmp/s52.gguf --device cuda --prompt "$P" \
        --decode 1 --reps 1 --verify 1 --prefill-cache all 2>&1 \
        | grep -E "^prefill|prefill cache|warm-up|cuBLASLt algorithm|error" | sed "s/^/[$b $P] /"
    done
  done
} >"$L" 2>&1
cat "$L"
