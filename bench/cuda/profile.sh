#!/usr/bin/env bash
# profile.sh: per-kernel GPU time of one 27B decode step and one 16-row verify step, from Nsight
# Compute's gpu__time_duration (one pass per kernel, caches and clocks left alone), with the
# carried binaries (bench/cuda/README.md "Carried binaries"). Three eager runs of `dspec bench
# --model --no-cuda-graphs` that differ by 4 decode steps / by one verify width give the step's
# kernels by difference; bench/cuda/ncu_table.py turns the CSVs into the table.
# Usage (repo root, on the GPU machine): [MIX=q4_k_m] [BIN=build-carry-b] [PROMPT=64]
#   [KERNELS=regex] bash bench/cuda/profile.sh
# (BIN: the folder of the carried dspec, default build-carry; PROMPT: the context the steps run
# at; KERNELS: profile only the kernels whose names match, e.g. 'attn_' at PROMPT=8192, which
# keeps a long prompt's prefill out of Nsight's way; DETAIL=regex: also Nsight's full sections
# for the 17th launch of the first kernel matching it, in ncu_detail.txt)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh profile.sh || exit 1
B=$PWD/${BIN:-build-carry}
need_bins "$B" dspec || exit 1
MIX=${MIX:-q4_k_m}
PROMPT=${PROMPT:-64}
KSEL=()
[ -n "${KERNELS:-}" ] && KSEL=(-k "regex:$KERNELS")
command -v ncu >/dev/null || { echo "profile.sh: ncu not on PATH"; exit 1; }
"$B/dspec" synth --preset 27b --mix "$MIX" /tmp/profile.gguf 2>&1 | tail -1
run() { # name decode verify
  timeout 240 ncu "${KSEL[@]}" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --log-file "$OUT/ncu_$1.csv" \
    "$B/dspec" bench --model /tmp/profile.gguf --device cuda --no-cuda-graphs --prompt "$PROMPT" \
    --decode "$2" --reps 1 --verify "$3" >"$OUT/ncu_$1.log" 2>&1
  echo "profile $1: exit $?, $(wc -l <"$OUT/ncu_$1.csv") lines"
}
run base 1 1
run dec5 5 1
run ver16 1 1,16
if [ -n "${DETAIL:-}" ]; then
  timeout 240 ncu -k "regex:$DETAIL" --launch-skip 16 --launch-count 1 --set full \
    "$B/dspec" bench --model /tmp/profile.gguf --device cuda --no-cuda-graphs --prompt "$PROMPT" \
    --decode 1 --reps 1 --verify 1 >"$OUT/ncu_detail.txt" 2>&1
  echo "profile detail: exit $?"
fi
rm -f /tmp/profile.gguf
