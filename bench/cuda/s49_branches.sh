#!/usr/bin/env bash
# s49_branches.sh: session 49's two prepared branches measured in one device call, carried
# builds only (nvcc on the development machine): A = main in build-carry/ (dspec), B =
# wip/s49-fw-softmax in build-carry-b/ (dspec, cuda_ops_test), C = wip/s49-gdn-take in
# build-carry-c/ (dspec, cuda_ops_test, cuda_model_test). B's attention op tests, C's op and model
# tests, prefill of the 27B Q4_K_M shapes at 8K and 32K tokens (A, B, A, B), then decode and
# verify N = 1 / 16 of A and C (bench/cuda/ab.sh; no chain step: the three builds and the tree
# stay under the 64 MiB carry only without the bundled models). Everything goes to $OUT/log.txt,
# printed at the end.
# Usage (repo root, on the GPU machine): bash bench/cuda/s49_branches.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s49_branches.sh || exit 1
A=$PWD/build-carry
B=$PWD/build-carry-b
C=$PWD/build-carry-c
need_bins "$A" dspec || exit 1
need_bins "$B" dspec cuda_ops_test || exit 1
need_bins "$C" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name --format=csv,noheader
  (cd /tmp && timeout 120 "$B/cuda_ops_test" 'test_attention*' >"$OUT/b_ops.log" 2>&1
   echo "B cuda_ops_test (attention) exit $?")
  grep -E "wgmma|PASSED|FAILED" "$OUT/b_ops.log" | tail -8
  (cd /tmp && timeout 240 "$C/cuda_ops_test" >"$OUT/c_ops.log" 2>&1
   echo "C cuda_ops_test exit $?")
  grep -E "gdn take|PASSED|FAILED" "$OUT/c_ops.log" | tail -12
  timeout 200 "$C/cuda_model_test" >"$OUT/c_model.log" 2>&1
  echo "C cuda_model_test exit $?"
  grep -E "PASSED|FAILED" "$OUT/c_model.log"
  "$A/dspec" synth --preset 27b --mix q4_k_m /tmp/s49.gguf 2>&1 | tail -1
  for P in 8192 32768; do
    for round in 1 2; do
      for D in "$A" "$B"; do
        echo "$(basename "$D") $P: $(timeout 200 "$D/dspec" bench --model /tmp/s49.gguf \
          --device cuda --prompt "$P" --decode 1 --reps 1 --verify 1 2>&1 | grep ^prefill)"
      done
    done
  done
  rm -f /tmp/s49.gguf
  BS=build-carry-c PROMPT=512 VERIFY=1,16 TESTS=0 bash bench/cuda/ab.sh >"$OUT/ab.txt" 2>&1
  grep -E "^==|^greedy|N = +1:|N = +16:" "$OUT/ab.txt"
} >"$L" 2>&1
cat "$L"
