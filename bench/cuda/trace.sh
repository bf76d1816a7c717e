#!/usr/bin/env bash
# trace.sh: the in-graph kernel timeline of a 27B Q4_K_M decode, a DFlash chain (verify 16) and
# a DDTree (budget 16), or a prompt's kernels (prefill), with kernel_trace.c (CUPTI, loaded
# through CUDA_INJECTION64_PATH), summarised by trace_table.py. Carried binaries as carried.sh: BIN (default build-carry) holds
# dspec and libkernel_trace.so (and libcupti.so.13 where the GPU machine lacks it). Build the
# library on the development machine:
#   gcc -std=c17 -O2 -shared -fPIC -I/usr/local/cuda/include bench/cuda/kernel_trace.c \
#     -o build-carry/libkernel_trace.so -L/usr/local/cuda/lib64 -lcupti
# Usage (repo root, on the GPU machine):
#   [BIN=build-carry-b] [TRACE_WHAT=chain] [TRACE_ARGS="--temp 0.8 --top-k 40"] \
#     bash bench/cuda/trace.sh
#   (TRACE_WHAT: any of decode, chain, tree (DDTree budget 16), prefill (`dspec bench` of a
#   TRACE_PROMPT-token prompt, default 8192, in one chunk, and of its 256-token warm-up: the
#   kernels outside graphs, trace_table.py --eager); default "decode chain";
#   TRACE_ARGS: more `dspec run` options, e.g. a sampler)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh trace.sh || exit 1
B=$PWD/${BIN:-build-carry}
need_bins "$B" dspec || exit 1
[ -f "$B/libcupti.so.13.xz" ] && { need_bins "$B" libcupti.so.13 || exit 1; }
[ -f "$B/libkernel_trace.so" ] || { echo "trace.sh: $B/libkernel_trace.so missing"; exit 1; }
export LD_LIBRARY_PATH=$B:/usr/local/cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH
"$B/dspec" synth --preset 27b --mix q4_k_m --tokenizer models/tiny-target-q8_0.gguf /tmp/tr.gguf \
  2>&1 | tail -1
"$B/dspec" synth --draft dflash --target /tmp/tr.gguf --block 16 /tmp/trd.gguf 2>&1 | tail -1
W=$(mktemp -d)
for what in ${TRACE_WHAT:-decode chain}; do
  ARGS=(run -m /tmp/tr.gguf --device cuda -p hello -n 48)
  [ $what = chain ] && ARGS=(run -m /tmp/tr.gguf --draft /tmp/trd.gguf --device cuda -p hello \
    -n 32 --no-adaptive)
  [ $what = tree ] && ARGS=(run -m /tmp/tr.gguf --draft /tmp/trd.gguf --device cuda -p hello \
    -n 32 --no-adaptive --ddtree-budget 16)
  TABLE=(--graph-kernels 300)
  if [ $what = prefill ]; then
    ARGS=(bench --model /tmp/tr.gguf --device cuda --prompt "${TRACE_PROMPT:-8192}" --decode 2 \
      --reps 1 --verify 1)
    TABLE=(--eager)
  fi
  # shellcheck disable=SC2206
  ARGS+=(${TRACE_ARGS:-})
  (cd "$W" && CUDA_INJECTION64_PATH=$B/libkernel_trace.so "$B/dspec" "${ARGS[@]}" 2>&1 \
    | grep -E "tok/s|speculative:|^prefill")
  echo "== $what"
  python3 bench/cuda/trace_table.py "$W/kernel_trace.csv" "${TABLE[@]}" \
    | tee "$OUT/trace_$what.txt"
  xz -T4 -c "$W/kernel_trace.csv" >"$OUT/trace_$what.csv.xz"
done
rm -rf "$W" /tmp/tr.gguf /tmp/trd.gguf
