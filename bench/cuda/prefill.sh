#!/usr/bin/env bash
# prefill.sh: prompt-processing speed of the 27B Q4_K_M shapes on the GPU machine, with carried
# binaries (build-carry/: dspec, cuda_model_test, cuda_ops_test; see README "Carried binaries"):
# the CUDA tests, then `dspec bench --model` at 512 / 2K / 8K prompt tokens with the bf16 GEMM
# and (--exact-prefill) the exact int8 kernels side by side, 8K prompts in chunks of 256 / 1024 /
# 2048, and a per-op GPU-time profile of a 2K prompt (DSPEC_CUDA_PROFILE).
# Usage (repo root, on the GPU machine):
#   [TESTS=0] [MIX=q4_k_m] [BATCHES="256 1024 2048 8192"] [LONG="32768"] bash bench/cuda/prefill.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh prefill.sh || exit 1
B=$PWD/build-carry
need_bins "$B" dspec || exit 1
T0=$(date +%s)
t() { echo "[prefill +$(( $(date +%s) - T0 ))s] $*"; }
if [ "${TESTS:-1}" != 0 ]; then
  t "cuda_ops_test"
  (cd /tmp && timeout 200 "$B/cuda_ops_test" >"$OUT/ops_test.log" 2>&1; echo "cuda_ops_test exit $?")
  grep -E "FAILED|PASSED|ERROR|\[  FAILED|error" "$OUT/ops_test.log" | head -20
  t "cuda_model_test"
  timeout 200 "$B/cuda_model_test" >"$OUT/model_test.log" 2>&1
  echo "cuda_model_test exit $?"
  grep -E "prefill gemm|step graphs|FAILED|PASSED|ERROR|cuda vs cpu" "$OUT/model_test.log" | head -40
fi
MIX=${MIX:-q4_k_m}
t "synth 27b $MIX"
"$B/dspec" synth --preset 27b --mix "$MIX" /tmp/prefill.gguf 2>&1 | tail -1
bm() { timeout 300 "$B/dspec" bench --model /tmp/prefill.gguf --device cuda "$@" 2>&1 \
         | grep -E "^(prefill|decode|verify|  N|model|backend)" ; }
t "512 (+ exact), decode and verify 1 / 16"
bm --prompt 512 --decode 16 --reps 3 --verify 1,16 --exact-prefill
t "2048 (+ exact)"
bm --prompt 2048 --decode 4 --reps 1 --verify 1 --exact-prefill
for b in ${BATCHES:-256 1024 2048 8192}; do
  t "8192 in chunks of $b"
  bm --prompt 8192 --batch $b --decode 4 --reps 1 --verify 1
done
for n in ${LONG:-}; do # longer prompts in one chunk
  t "$n in one chunk"
  bm --prompt "$n" --decode 4 --reps 1 --verify 1
done
t "profile: 2048-token prompt"
DSPEC_CUDA_PROFILE=1 timeout 300 "$B/dspec" bench --model /tmp/prefill.gguf --device cuda \
  --prompt 2048 --decode 1 --reps 1 --verify 1 >"$OUT/profile.txt" 2>&1
grep -vE "^dspec (info|debug)" "$OUT/profile.txt" | head -40
rm -f /tmp/prefill.gguf
t "done"
