#!/usr/bin/env bash
# model_bench.sh: target-model speed on the GPU machine in one device call: builds dspec (sm_90a),
# writes synthetic Qwen3.5 files with the real shapes and quant mixes (`dspec synth`), and runs
# `dspec bench --model --device cuda` (decode tok/s and verify-step time for N = 1..32 against the
# copy-bandwidth roofline measured in the same run; prefill tok/s). Also checks CUDA logits
# against the CPU on a converted fixture. SPEC_STEP=1 also times a speculative chain step (block
# 16: draft + verify + commit; random weights accept nothing, so every step is one full step) with
# synthetic DFlash / DFlash 2 / DSpark drafters of the preset's shapes. Logs go to $OUT.
# Usage (repo root, on the GPU machine): bash bench/cuda/model_bench.sh [preset:mix ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dspec-cuda-out}
mkdir -p "$OUT"
B=build-cudarun
T0=$(date +%s)
log() { echo "[model_bench +$(( $(date +%s) - T0 ))s] $*"; }
source bench/cuda/deps.sh || exit 1
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S . -B $B "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSPEC_CUDA_ARCH=90a "${CMAKE_EXTRA[@]}" \
  >"$OUT/build.log" 2>&1 && cmake --build $B -j"$(nproc)" --target dspec >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
log "built"
D=$B/dspec
# CUDA vs CPU logits on a 256-wide synthetic model (sanity before timing); the 64-wide HF fixtures
# use head dims the CUDA kernels do not instantiate (refused at load, checked here too)
$D convert tests/fixtures/target/dense_b/hf_f32 /tmp/fx.gguf --type f32 --quiet >/dev/null 2>&1
$D logits -m /tmp/fx.gguf --tokens 1,2,3 --device cuda 2>&1 | tail -1 | tee "$OUT/fixture.txt"
$D synth --preset tiny --mix q4_k_m /tmp/tiny.gguf 2>/dev/null
TOK=1,5,77,300,12,511,0,42,42,9,260,100,7,8,450,3
$D logits -m /tmp/tiny.gguf --tokens "$TOK" --out /tmp/l_cpu.bin
$D logits -m /tmp/tiny.gguf --tokens "$TOK" --out /tmp/l_cuda.bin --device cuda
python3 - <<'PY' | tee -a "$OUT/fixture.txt"
import numpy as np
a = np.fromfile('/tmp/l_cpu.bin', dtype=np.float32); b = np.fromfile('/tmp/l_cuda.bin', dtype=np.float32)
print('synthetic tiny q4_k_m: cuda vs cpu logits rel L2 %.3e' % (np.linalg.norm(a - b) / np.linalg.norm(a)))
PY
# each argument: preset:mix[:layers] (layers: fewer than the preset's, to fit a time budget)
for spec in "${@:-27b:q4_k_m}"; do
  IFS=: read -r preset mix layers <<<"$spec"
  f=/tmp/synth_${preset}_${mix}.gguf
  LAY=(); [ -n "$layers" ] && LAY=(--layers "$layers")
  log "synth $preset $mix ${layers:+($layers layers)}"
  # (the bundled tokenizer makes the file runnable by `dspec run`, for the speculative step below)
  $D synth --preset "$preset" --mix "$mix" "${LAY[@]}" --tokenizer models/tiny-target-q8_0.gguf \
     "$f" 2>&1 | tail -1
  if [ -n "${SPEC_STEP:-}" ]; then # a full chain step (draft + verify + commit) per drafter kind
    for kind in dflash dflash2 dspark; do
      $D synth --draft $kind --target "$f" --block 16 /tmp/draft_$kind.gguf 2>&1 | tail -1
      $D run -m "$f" --draft /tmp/draft_$kind.gguf --device cuda -p "hello" -n 64 --no-adaptive \
         2>&1 | grep -E "decode|speculative:" | sed "s/^/  $kind: /" | tee -a "$OUT/spec_step_${preset}_${mix}.txt"
      rm -f /tmp/draft_$kind.gguf
    done
  fi
  log "bench $preset $mix"
  $D bench --model "$f" --device cuda --prompt 512 --decode 32 --reps ${REPS:-7} \
     --verify ${VERIFY:-1,2,4,8,16,24,32} 2>&1 | tee "$OUT/bench_${preset}_${mix}.txt"
  [ -n "${NO_PROFILE:-}" ] && { rm -f "$f"; continue; }
  log "profile $preset $mix (decode-heavy run, per-op GPU time)"
  DSPEC_CUDA_PROFILE=1 $D bench --model "$f" --device cuda --prompt 64 --decode 64 --reps 3 \
     --verify 1,16 >"$OUT/profile_${preset}_${mix}.txt" 2>&1
  head -45 "$OUT/profile_${preset}_${mix}.txt" | grep -A40 "cuda profile"
  rm -f "$f"
done
log "done"
