#!/usr/bin/env bash
# ab.sh: two builds side by side in one device call -- A in build-carry/ (its dspec) and B in
# build-carry-b/ (dspec, cuda_ops_test, cuda_model_test): B's CUDA tests, then `dspec bench
# --model` of A, B, A, B on one synthetic 27B file (the A-A and B-B spreads show the noise).
# Carry both folders (bench/cuda/README.md "A/B of two builds").
# Usage (repo root, on the GPU machine): [PRESET=27b] [MIX=q4_k_m] [PROMPT=512]
#   [VERIFY=1,2,4,8,16,32] [TESTS=0] bash bench/cuda/ab.sh
#   (PRESET: a `dspec synth --preset`, e.g. 35b-a3b; TESTS=0 skips B's CUDA tests)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh ab.sh || exit 1
A=$PWD/build-carry B=$PWD/build-carry-b
need_bins "$A" dspec && need_bins "$B" dspec cuda_ops_test cuda_model_test || exit 1
if [ "${TESTS:-1}" = 1 ]; then
  echo "== B: cuda_model_test, cuda_ops_test"
  timeout 120 "$B/cuda_model_test" >"$OUT/ab_model_test.log" 2>&1; echo "cuda_model_test exit $?"
  (cd /tmp && timeout 150 "$B/cuda_ops_test" >"$OUT/ab_ops_test.log" 2>&1; echo "cuda_ops_test exit $?")
  grep -hE "FAILED|PASSED" "$OUT/ab_model_test.log" "$OUT/ab_ops_test.log"
fi
MIX=${MIX:-q4_k_m}
"$B/dspec" synth --preset "${PRESET:-27b}" --mix "$MIX" /tmp/ab.gguf 2>&1 | tail -1
for run in A1 B1 A2 B2; do
  D=$A; [ "${run:0:1}" = B ] && D=$B
  echo "== $run (${PRESET:-27b} $MIX, prompt ${PROMPT:-512})"
  timeout 240 "$D/dspec" bench --model /tmp/ab.gguf --device cuda --prompt "${PROMPT:-512}" \
    --decode 32 --reps 5 --verify "${VERIFY:-1,2,4,8,16,32}" \
    >"$OUT/ab_${PRESET:-27b}_p${PROMPT:-512}_$run.txt" 2>&1
  grep -E "^prefill|^decode \(step|^greedy|^  N =" "$OUT/ab_${PRESET:-27b}_p${PROMPT:-512}_$run.txt"
done
rm -f /tmp/ab.gguf
