#!/usr/bin/env bash
# check.sh: the standard first device call of a session, in one call: B's CUDA tests and the
# A/B table of ab.sh (27B Q4_K_M, prompt 512), the same at an 8K prompt (prefill at that length,
# decode and verify at that context), the 35B-A3B MoE, and B's speculative chain step with the
# synthetic drafters (carried.sh SPEC_STEP=1, Q4_K_M only). A in build-carry/ (dspec), B in
# build-carry-b/ (dspec, cuda_ops_test, cuda_model_test); SPEC_STEP needs
# models/tiny-target-q8_0.gguf in the carried tree (the tokenizer of the synthetic target).
# GEMV=1 first runs B's gemv_bench (carried in build-carry-b/) on the decode GEMV's forms; QUICK=1
# stops after the prompt-512 table. The logs end up in $OUT/check.tgz (the device tool brings
# back 8 files), with a summary of B's tests printed last.
# Usage (repo root, on the GPU machine): [GEMV=1] [QUICK=1] bash bench/cuda/check.sh   (~5 min)
set -u
cd "$(dirname "$0")/../.."
finish() {
  echo "=== B's tests"
  grep -hE "FAILED|PASSED" "$OUT"/ab_*test.log 2>/dev/null | tail -20
  (cd "$OUT" && tar czf check.tgz --exclude=check.tgz --remove-files ./* 2>/dev/null)
}
OUT=${OUT:-/tmp/dspec-cuda-out}
if [ "${GEMV:-0}" = 1 ]; then
  echo "=== B: gemv_bench mmv"
  source bench/cuda/carried_env.sh check.sh && need_bins build-carry-b gemv_bench &&
    timeout 300 build-carry-b/gemv_bench 30 mmv >"$OUT/gemv_mmv.txt" 2>&1
  awk '($2 == "ffn_up" || $2 == "ffn_down") && $3 == 1' "$OUT/gemv_mmv.txt" # (N = 1)
fi
echo "=== 27B, prompt 512"
VERIFY=${VERIFY:-1,4,8,16,32} bash bench/cuda/ab.sh 2>&1 | grep -vE "N =   1:"
[ "${QUICK:-0}" = 1 ] && { finish; exit 0; }
echo "=== 27B, prompt 8192"
PROMPT=8192 VERIFY=1,16 TESTS=0 bash bench/cuda/ab.sh 2>&1 | grep -E "^==|^prefill|^decode \(step|^greedy|N =  16"
echo "=== 35B-A3B"
PRESET=35b-a3b VERIFY=1,16 TESTS=0 bash bench/cuda/ab.sh 2>&1 | grep -E "^==|^prefill|^decode \(step|^greedy|N =  16"
echo "=== B: chain step"
TESTS=0 SPEC_STEP=1 BIN=build-carry-b bash bench/cuda/carried.sh q4_k_m 2>&1 |
  grep -E "speculative|^decode \(step|^greedy|N =  16"
finish
