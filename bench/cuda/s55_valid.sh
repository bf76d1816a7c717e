#!/usr/bin/env bash
# session 55: main's full CUDA test suites, then a CUPTI trace of the DFlash chain step
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh s55 || exit 1
B=$PWD/build-carry-m
need_bins "$B" dspec cuda_ops_test cuda_model_test || exit 1
L=$OUT/log.txt
{
  date +%T
  for t in cuda_ops_test cuda_model_test; do
    (cd /tmp && timeout 280 "$B/$t" >"$OUT/$t.log" 2>&1; echo "$t exit $?")
    grep -E "PASSED|FAILED|ERROR|LINE" "$OUT/$t.log" | tail -8
    date +%T
  done
  grep -E "prefill gemm" "$OUT/cuda_model_test.log"
  BIN=build-carry-m TRACE_WHAT=chain timeout 150 bash bench/cuda/trace.sh 2>&1 | tail -45
  date +%T
} >"$L" 2>&1
cat "$L"
