#!/usr/bin/env bash
# tiny_spec.sh: speculative decoding on the GPU with the bundled tiny models: for each drafter,
# CUDA speculative output == CUDA plain greedy output (lossless on the device), tau and tok/s;
# then the target's decode/verify step times on CUDA. Logs to $OUT.
# Usage (repo root, GPU machine): bash bench/cuda/tiny_spec.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dspec-cuda-out}
mkdir -p "$OUT"
B=build-cudarun
source bench/cuda/deps.sh || exit 1
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DDSPEC_CUDA_ARCH=90a "${CMAKE_EXTRA[@]}" \
  >"$OUT/build.log" 2>&1 && cmake --build $B -j"$(nproc)" --target dspec >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
D=$B/dspec
M=models/tiny-target-q8_0.gguf
# (the third prompt, ~900 tokens, spans several 256-row pieces and exercises the prefill kernels:
# the speculative path must cut it into the same chunks as plain decoding to stay identical)
LONG=$(for i in $(seq 1 60); do printf 'def f%d(x):\n    return x * %d + %d\n\n' $i $i $((i*7)); done)
for P in $'import os\nimport sys\n\n\ndef main():\n' "The ls command lists" "$LONG"; do
  $D run -m $M --device cuda -p "$P" -n 128 --no-adaptive >/tmp/plain.txt 2>/tmp/plain.err
  echo "plain: $(grep -o 'decode [0-9.]* tok/s' /tmp/plain.err)"
  for d in dspark-g7 dflash2-b8 dflash-b8 dflash-b16; do
    for extra in "" "--ddtree-budget 16" "--ddtree-budget 16 --ddtree-raw" "--ddtree-budget 48"; do
      $D run -m $M --device cuda --draft models/tiny-$d-q8_0.gguf -p "$P" -n 128 --no-adaptive \
         $extra >/tmp/spec.txt 2>/tmp/spec.err
      rc=$?
      same=$(cmp -s /tmp/plain.txt /tmp/spec.txt && echo identical || echo DIFFERS)
      echo "$d $extra: rc $rc, $same, $(grep -o 'decode [0-9.]* tok/s' /tmp/spec.err)," \
           "$(grep -o 'tau [0-9.]*' /tmp/spec.err)"
      [ $rc -ne 0 ] && tail -3 /tmp/spec.err
    done
  done
done 2>&1 | tee "$OUT/tiny_spec.txt"
# sampled speculative decoding on the device (T = 0.7): runs, tau, and seeded reproducibility
P=$'import os\nimport sys\n\n\ndef main():\n'
for d in dspark-g7 dflash2-b8; do
  for extra in "" "--ddtree-budget 16"; do
    $D run -m $M --device cuda --draft models/tiny-$d-q8_0.gguf -p "$P" -n 128 --no-adaptive \
       --temp 0.7 --seed 7 $extra >/tmp/a.txt 2>/tmp/a.err; rc=$?
    $D run -m $M --device cuda --draft models/tiny-$d-q8_0.gguf -p "$P" -n 128 --no-adaptive \
       --temp 0.7 --seed 7 $extra >/tmp/b.txt 2>/dev/null
    echo "T=0.7 $d $extra: rc $rc, $(cmp -s /tmp/a.txt /tmp/b.txt && echo reproducible || echo NOT-REPRODUCIBLE)," \
         "$(grep -o 'decode [0-9.]* tok/s' /tmp/a.err), $(grep -o 'tau [0-9.]*' /tmp/a.err)"
  done
done 2>&1 | tee -a "$OUT/tiny_spec.txt"
$D run -m $M --device cuda -p "$P" -n 128 --temp 0.7 --seed 7 2>&1 >/dev/null | grep -o 'decode [0-9.]* tok/s' | sed 's/^/T=0.7 plain: /' | tee -a "$OUT/tiny_spec.txt"
$D bench --model $M --device cuda --prompt 256 --decode 64 --reps 9 --verify 1,2,4,8,16,32 \
  2>&1 | tee "$OUT/bench_tiny_cuda.txt"
$D bench --model $M --prompt 256 --decode 64 --reps 5 --verify 1,2,4,8,16,32 -t 16 \
  2>&1 | tee "$OUT/bench_tiny_cpu16.txt"
