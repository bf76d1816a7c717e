#!/usr/bin/env bash
# ab.sh: builds side by side in one device call -- A in build-carry/ (its dspec) and B in
# build-carry-b/ (dspec, cuda_ops_test, cuda_model_test), or several B builds (BS): each B's CUDA
# tests, then `dspec bench --model` of A, B..., A, B... on one synthetic 27B file (the A-A and B-B
# spreads show the noise). Carry every folder (bench/cuda/README.md "A/B of two builds").
# Usage (repo root, on the GPU machine): [PRESET=27b] [MIX=q4_k_m] [PROMPT=512] [PROMPTS=...]
#   [VERIFY=1,2,4,8,16,32] [ACCEPT=K] [TESTS=0] [BS="build-carry-b build-carry-c"] [SPEC=1]
#   [SMALL=1]
#   bash bench/cuda/ab.sh
#   (PRESET: a `dspec synth --preset`, e.g. 35b-a3b; TESTS=0 skips the CUDA tests; BS: the B
#   folders, each named by its folder in the output, tested where it holds the test binaries;
#   ACCEPT: rows each verify commits, `dspec bench --accept` (builds from session 30 on);
#   SPEC=1: also each build's speculative steps -- a DFlash block-16 chain and a DDTree of budget
#   16 over 63 steps with a synthetic drafter -- which needs models/tiny-target-q8_0.gguf in the
#   carried tree, the synthetic target's tokenizer; SMALL=1: first `gemv_bench 200 small` of each
#   build whose folder holds gemv_bench -- the launch floor, add + RMSNorm, and attention of 1 and
#   16 rows at 512 / 8K / 32K keys, the combine included; PROMPTS="32768 8192 512": the bench
#   table at each prompt length in turn instead of PROMPT alone)
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh ab.sh || exit 1
A=$PWD/build-carry
need_bins "$A" dspec || exit 1
BDIRS=()
for b in ${BS:-build-carry-b}; do
  need_bins "$PWD/$b" dspec || exit 1
  BDIRS+=("$PWD/$b")
done
label() { # A, B (build-carry-b) or the folder's name
  if [ "$1" = "$A" ]; then echo A
  elif [ "$1" = "$PWD/build-carry-b" ]; then echo B
  else basename "$1"; fi
}
if [ "${TESTS:-1}" = 1 ]; then
  for B in "${BDIRS[@]}"; do
    L=$(label "$B")
    if [ -z "${BS:-}" ] || [ -e "$B/cuda_ops_test" ] || [ -e "$B/cuda_ops_test.xz" ]; then
      need_bins "$B" cuda_ops_test cuda_model_test || exit 1
      echo "== $L: cuda_model_test, cuda_ops_test"
      timeout 120 "$B/cuda_model_test" >"$OUT/ab_${L}_model_test.log" 2>&1
      echo "cuda_model_test exit $?"
      (cd /tmp && timeout 150 "$B/cuda_ops_test" >"$OUT/ab_${L}_ops_test.log" 2>&1
       echo "cuda_ops_test exit $?")
      grep -hE "FAILED|PASSED" "$OUT/ab_${L}_model_test.log" "$OUT/ab_${L}_ops_test.log"
    fi
  done
fi
if [ -n "${SMALL:-}" ]; then # the small-op table, A and the Bs alternating, two rounds
  for round in 1 2; do
    for D in "$A" "${BDIRS[@]}"; do
      [ -e "$D/gemv_bench" ] || [ -e "$D/gemv_bench.xz" ] || continue
      need_bins "$D" gemv_bench || exit 1
      echo "== $(label "$D")$round: gemv_bench 200 small"
      timeout 60 "$D/gemv_bench" 200 small 2>&1 | grep -E "launch floor|rmsnorm|attention"
    done
  done
fi
MIX=${MIX:-q4_k_m}
TOK=()
[ -n "${SPEC:-}" ] && TOK=(--tokenizer models/tiny-target-q8_0.gguf)
"$A/dspec" synth --preset "${PRESET:-27b}" --mix "$MIX" "${TOK[@]}" /tmp/ab.gguf 2>&1 | tail -1
for round in 1 2; do
  for P in ${PROMPTS:-${PROMPT:-512}}; do
    for D in "$A" "${BDIRS[@]}"; do
      run=$(label "$D")$round
      echo "== $run (${PRESET:-27b} $MIX, prompt $P)"
      timeout 240 "$D/dspec" bench --model /tmp/ab.gguf --device cuda --prompt "$P" \
        --decode 32 --reps 5 --verify "${VERIFY:-1,2,4,8,16,32}" ${ACCEPT:+--accept "$ACCEPT"} \
        >"$OUT/ab_${PRESET:-27b}_p${P}_$run.txt" 2>&1
      grep -E "^prefill|^decode \(step|^greedy|^  N =" "$OUT/ab_${PRESET:-27b}_p${P}_$run.txt"
    done
  done
done
if [ -n "${SPEC:-}" ]; then # per step = (draft + verify + commit) / 63
  "$A/dspec" synth --draft dflash --target /tmp/ab.gguf --block 16 /tmp/ab_draft.gguf 2>&1 | tail -1
  for round in 1 2; do
    for D in "$A" "${BDIRS[@]}"; do
      for budget in 0 16; do
        echo "$(label "$D")$round budget $budget: $(timeout 120 "$D/dspec" run -m /tmp/ab.gguf \
          --draft /tmp/ab_draft.gguf --device cuda -p hello -n 64 --no-adaptive \
          --ddtree-budget $budget 2>&1 | grep -E "^speculative:")"
      done
    done
  done
  rm -f /tmp/ab_draft.gguf
fi
rm -f /tmp/ab.gguf
# the tests' verdicts again, last: a long run's output tail (the device's reply) keeps them
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests:"
  grep -HE "PASSED|FAILED" "$OUT"/ab_*_test.log 2>/dev/null | sed "s|$OUT/||"
fi
