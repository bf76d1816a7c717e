#!/usr/bin/env bash
# session 55 call 8: main's cuda_ops_test (FFN tolerance), Nsight Compute of the prefill attention,
# gated norm, prologue and gate kernels at 8K
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s55 || exit 1
B=$PWD/build-carry-m
need_bins "$B" dspec cuda_ops_test || exit 1
L=$OUT/log.txt
{
  date +%T
  (cd /tmp && timeout 200 "$B/cuda_ops_test" >"$OUT/cuda_ops_test.log" 2>&1; echo "cuda_ops_test exit $?")
  grep -E "PASSED|FAILED|ERROR|LINE|ffn q4_K/q6_K 512x768 N=100 mode 0" "$OUT/cuda_ops_test.log" | tail -8
  "$B/dspec" synth --preset 27b --mix q4_k_m /tmp/p.gguf 2>&1 | tail -1
  timeout 300 ncu -k "regex:fw_kernel|gated_warp|prologue_rows|ew_flat" --launch-skip 8 \
    --launch-count 4 --set full --import-source no \
    "$B/dspec" bench --model /tmp/p.gguf --device cuda --prompt 8192 --decode 1 --reps 1 \
    --verify 1 >"$OUT/ncu_full.txt" 2>&1
  echo "ncu exit $?"
  grep -E "^  [a-z_].*\(|Duration|L1/TEX Cache|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots|Eligible Warps|Achieved Occupancy|Registers Per|bank conflict|Tensor" "$OUT/ncu_full.txt" | cut -c1-160 | head -80
  date +%T
} >"$L" 2>&1
cat "$L"
