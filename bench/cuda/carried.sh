#!/usr/bin/env bash
# carried.sh: the CUDA tests and the 27B tables in one short device call, with binaries built on
# the development machine (nvcc is there, no GPU) and carried in the git-ignored build-carry/:
# no build on the GPU machine, so the call spends its time on the GPU (~90 s + ~40 s start).
# Runs cuda_model_test, cuda_ops_test, then per mix: `dspec synth --preset 27b` and `dspec bench
# --model --device cuda` (decode with graphs and launched kernel by kernel, verify widths,
# prefill). Logs go to $OUT. See bench/cuda/README.md "Carried binaries".
# Usage (repo root, on the GPU machine): [CTX="8192 32768"] [ALL_CTX=1] [TESTS=0]
#   [BIN=build-carry-b] bash bench/cuda/carried.sh [mix ...]  (BIN: the carried binaries' folder)
# (default mixes: q4_k_m iq4_xs q8_0; q4_k_m gets the full verify list, the others N = 1 and 16;
# CTX adds q4_k_m runs at those prompt lengths; ALL_CTX=1 runs every mix at 512 and each CTX
# length with the full verify list, one synthetic file per mix: the issue's whole table, ~4 min
# per mix at CTX="2048 8192 32768"; NCU=1 adds an Nsight Compute pass over the GEMV /
# GEMM kernels of a 27B Q4_K_M decode and verify; SPEC_STEP=1 times a speculative chain step with
# synthetic DFlash / DFlash 2 / DSpark drafters of the 27B shapes, as model_bench.sh does)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh carried.sh || exit 1
B=$PWD/${BIN:-build-carry}
if [ "${TESTS:-1}" != 0 ]; then need_bins "$B" dspec cuda_model_test cuda_ops_test || exit 1
else need_bins "$B" dspec || exit 1; fi
T0=$(date +%s)
t() { echo "[carried +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ "${TESTS:-1}" != 0 ]; then # (TESTS=0: timing only, e.g. when the tests would not fit the carry)
  t "cuda_model_test"
  timeout 120 "$B/cuda_model_test" >"$OUT/model_test.log" 2>&1
  echo "cuda_model_test exit $?"
  grep -E "step graphs|prefill gemm|FAILED|PASSED|ERROR|cuda vs cpu" "$OUT/model_test.log" | head -40
  t "cuda_ops_test"
  (cd /tmp && timeout 200 "$B/cuda_ops_test" >"$OUT/ops_test.log" 2>&1; echo "cuda_ops_test exit $?")
  grep -E "FAILED|PASSED|ERROR" "$OUT/ops_test.log" | head -10
fi
for mix in "${@:-q4_k_m iq4_xs q8_0}"; do
  for m in $mix; do
    t "27b $m"
    # (SPEC_STEP: the bundled tokenizer makes the file runnable by `dspec run`; without it the
    # bundled models need not travel)
    TOK=()
    [ -n "${SPEC_STEP:-}" ] && TOK=(--tokenizer models/tiny-target-q8_0.gguf)
    "$B/dspec" synth --preset 27b --mix "$m" "${TOK[@]}" /tmp/carried.gguf 2>&1 | tail -1
    if [ -n "${SPEC_STEP:-}" ] && [ "$m" = q4_k_m ]; then # chain step: draft 16 + verify + commit
      for kind in dflash dflash2 dspark; do
        "$B/dspec" synth --draft $kind --target /tmp/carried.gguf --block 16 /tmp/draft.gguf \
          2>&1 | tail -1
        timeout 120 "$B/dspec" run -m /tmp/carried.gguf --draft /tmp/draft.gguf --device cuda \
          -p "hello" -n 64 --no-adaptive 2>&1 | grep -E "decode|speculative:" | sed "s/^/  $kind: /" \
          | tee -a "$OUT/spec_step_27b_q4_k_m.txt"
        rm -f /tmp/draft.gguf
      done
    fi
    V=1,16
    [ "$m" = q4_k_m ] || [ -n "${ALL_CTX:-}" ] && V=1,2,4,8,16,24,32
    timeout 150 "$B/dspec" bench --model /tmp/carried.gguf --device cuda --prompt 512 --decode 32 \
      --reps 5 --verify "$V" >"$OUT/bench_27b_$m.txt" 2>&1
    grep -vE "^dspec (info|debug)" "$OUT/bench_27b_$m.txt"
    if [ -n "${ALL_CTX:-}" ]; then # the same file at each CTX length
      for ctx in ${CTX:-}; do
        t "27b $m at context $ctx"
        timeout 200 "$B/dspec" bench --model /tmp/carried.gguf --device cuda --prompt "$ctx" \
          --decode 16 --reps 3 --verify "$V" >"$OUT/bench_27b_${m}_ctx$ctx.txt" 2>&1
        grep -vE "^dspec (info|debug)" "$OUT/bench_27b_${m}_ctx$ctx.txt"
      done
    fi
    rm -f /tmp/carried.gguf
  done
done
# CTX="8192 32768": q4_k_m again with those prompt lengths (prefill tok/s at that length, decode
# and verify at that context)
[ -n "${ALL_CTX:-}" ] && CTX=
for ctx in ${CTX:-}; do
  t "27b q4_k_m at context $ctx"
  "$B/dspec" synth --preset 27b --mix q4_k_m /tmp/carried.gguf 2>&1 | tail -1
  timeout 400 "$B/dspec" bench --model /tmp/carried.gguf --device cuda --prompt "$ctx" --decode 16 \
    --reps 3 --verify 1,16 >"$OUT/bench_27b_q4_k_m_ctx$ctx.txt" 2>&1
  grep -vE "^dspec (info|debug)" "$OUT/bench_27b_q4_k_m_ctx$ctx.txt"
  rm -f /tmp/carried.gguf
done
# NCU=1: Nsight Compute on the decode GEMV and the verify GEMM of a 27B Q4_K_M step (hardware
# counters work on the Firecracker machines; clocks left alone): memory throughput, achieved
# occupancy, registers and the top warp stall reasons of each kernel, for the next kernel work.
if [ -n "${NCU:-}" ] && command -v ncu >/dev/null 2>&1; then
  t "ncu"
  "$B/dspec" synth --preset 27b --mix q4_k_m /tmp/carried.gguf 2>&1 | tail -1
  # the 16-row prefill runs the verify-width GEMM (staged mma kernel), the decode the GEMV
  for k in mmq_staged_kernel mmv_kernel; do
    timeout 150 ncu --clock-control none -k "regex:$k" -c 8 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      "$B/dspec" bench --model /tmp/carried.gguf --device cuda --no-cuda-graphs --prompt 16 \
      --decode 2 --reps 1 --verify 1 >"$OUT/ncu_$k.txt" 2>&1
    grep -E "$k|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Duration|Stall" \
      "$OUT/ncu_$k.txt" | head -60
  done
  rm -f /tmp/carried.gguf
fi
t "done"
