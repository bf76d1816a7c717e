#!/usr/bin/env bash
# s52_ffn.sh: session 52's dense FFN op (backend.h ffn_swiglu: a prompt chunk's gate / up / SwiGLU
# on bf16 intermediates) against main, on the GPU machine. Carried: build-carry-m/dspec (main),
# build-carry-f/{dspec,cuda_ops_test,cuda_model_test} (the change). Runs the FFN and GEMM op
# tests, the model tests, then `dspec bench --model` of the 27B Q4_K_M shapes at PROMPTS tokens,
# each build default and with `--prefill-cache all`, ROUNDS times alternating.
# (rounds after the first: PROMPTS2, default 8192; the first round's 512-token runs also time
# decode and the 1- and 16-row verify)
# Usage (repo root): [PROMPTS="8192 512"] [PROMPTS2=8192] [ROUNDS=2] [TESTS=1] [ALGOS=1] \
#   [MODEL_S=300 (the model tests' time limit)] \
#   bash bench/cuda/s52_ffn.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s52_ffn.sh || exit 1
M=$PWD/build-carry-m F=$PWD/build-carry-f
need_bins "$M" dspec || exit 1
need_bins "$F" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  if [ "${TESTS:-1}" = 1 ]; then
    (cd /tmp && timeout 200 stdbuf -oL "$F/cuda_ops_test" 'test_ffn_swiglu' >"$OUT/ops.log" 2>&1
     echo "cuda_ops_test test_ffn_swiglu exit $?")
    grep -E "ffn|PASSED|FAILED|rror" "$OUT/ops.log" | tail -12
    timeout "${MODEL_S:-300}" stdbuf -oL "$F/cuda_model_test" >"$OUT/model.log" 2>&1
    echo "cuda_model_test exit $?"
    grep -E "prefill gemm|PASSED|FAILED" "$OUT/model.log" | tail -12
  fi
  [ -f /tmp/s52.gguf ] || "$F/dspec" synth --preset 27b --mix q4_k_m /tmp/s52.gguf 2>&1 | tail -1
  for r in $(seq "${ROUNDS:-2}"); do
    if [ "$r" = 2 ] && [ "${ALGOS:-1}" = 1 ] && [ -x "$F/gemm_algos" ]; then # (after round 1)
      timeout 120 "$F/gemm_algos" 8192 10 2>&1 | tee "$OUT/gemm_algos.txt" \
        | grep -E "best|prompt|algos:"
    fi
    PS=${PROMPTS:-8192 512}
    [ "$r" -gt 1 ] && PS=${PROMPTS2:-8192}
    for P in $PS; do
      for b in M F; do
        B=$M; [ $b = F ] && B=$F
        DV=(--decode 1 --reps 1 --verify 1)
        [ "$r" = 1 ] && [ "$P" = 512 ] && DV=(--decode 32 --reps 5 --verify 1,16)
        timeout 150 "$B/dspec" bench --model /tmp/s52.gguf --device cuda --prompt "$P" \
          "${DV[@]}" --prefill-cache all 2>&1 \
          | grep -E "^prefill|prefill cache|queued ahead|N =  *(1|16):|error" \
          | sed "s/^/[$b $P r$r] /"
      done
    done
  done
} >"$L" 2>&1
cat "$L"
