#!/usr/bin/env bash
# run.sh: the whole CUDA check in one device call: configure + build (sm_90a), ctest -L cuda, and
# the GEMV micro-benchmark (GB/s per weight type at Qwen3.5-27B shapes, N = 1..32, against the
# device-to-device copy bandwidth measured in the same run). Logs go to $OUT (build.log,
# ctest.log, bench.txt); the tail of the output is a short summary. See bench/cuda/README.md.
# Usage (repo root, on the GPU machine): bash bench/cuda/run.sh [arch]   (arch: 90a (default), 90)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCH=${1:-90a}
OUT=${OUT:-/tmp/dspec-cuda-out}
mkdir -p "$OUT"
B=build-cudarun
T0=$(date +%s)
log() { echo "[run.sh +$(( $(date +%s) - T0 ))s] $*"; }

source bench/cuda/deps.sh || exit 1
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"

# ---- build -----------------------------------------------------------------------------------------
log "configure (sm_$ARCH)"
cmake -S . -B $B "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSPEC_CUDA_ARCH="$ARCH" "${CMAKE_EXTRA[@]}" \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -q "CUDA backend ON" "$OUT/build.log" || { log "CMake did not enable CUDA"; tail -30 "$OUT/build.log"; exit 1; }
log "build"
NJ=$(nproc)
cmake --build $B -j"$NJ" --target ds_cuda cuda_ops_test >>"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
MODEL_TEST=ok
cmake --build $B -j"$NJ" --target cuda_model_test >>"$OUT/build.log" 2>&1 || MODEL_TEST="did not build (see build.log)"
log "cuda_model_test: $MODEL_TEST"

# ---- tests -----------------------------------------------------------------------------------------
log "ctest -L cuda"
ctest --test-dir $B -L cuda --output-on-failure --timeout 400 2>&1 | tee "$OUT/ctest.log" | tail -60
CT=${PIPESTATUS[0]}

# ---- benchmark -------------------------------------------------------------------------------------
log "gemv benchmark"
CUDA_INC=$(dirname "$(dirname "$CUDACXX")")/include
if gcc -std=c17 -O2 -D_GNU_SOURCE -Iinclude -Isrc -I"$CUDA_INC" -c bench/cuda/gemv_bench.c -o $B/gemv_bench.o \
   && "$CUDACXX" -o $B/gemv_bench $B/gemv_bench.o $B/libds_cuda.a $B/libds_backend.a $B/libds_dtype.a \
      $B/libds_core.a -lcublas -lpthread -lm; then
  if [ -n "${SMALL_ONLY:-}" ]; then
    timeout 120 $B/gemv_bench 200 small 2>&1 | tee "$OUT/bench_small.txt"
  else
    timeout 240 $B/gemv_bench 30 2>&1 | tee "$OUT/bench.txt"
    timeout 120 $B/gemv_bench 200 small 2>&1 | tee "$OUT/bench_small.txt"
  fi
else
  log "gemv_bench did not build"
fi

log "summary: ctest exit $CT; cuda_model_test $MODEL_TEST"
grep -E "tests passed|tests failed|\(Failed\)|Not Run|SKIPPED|FAILED" "$OUT/ctest.log" | tail -20
exit $CT
