#!/usr/bin/env bash
# fa_wg_check.sh: the warpgroup-MMA prefill attention (attention_prefill_wg.cu) on the GPU
# machine: wg_probe (wgmma.cuh's layouts against a host product), B's CUDA tests, then prefill
# of the 27B Q4_K_M shapes at 8K (A, B, A, B) and 32K tokens (A, B), and one 8K prompt of each
# with DSPEC_CUDA_PROFILE's per-op GPU times. A: build-carry (dspec), B: build-carry-b (dspec,
# cuda_ops_test, cuda_model_test, wg_probe), and C: build-carry-c (dspec) where carried, run
# after B each time. NCU=1 adds Nsight Compute's full sections of one 8K-prompt launch of B's
# kernel (fw_ncu.txt; the source page summarised by ncu_source.py into fw_src.txt). Everything
# goes to $OUT/log.txt, printed at the end.
# Usage (repo root, on the GPU machine): [NCU=1] bash bench/cuda/fa_wg_check.sh
set -u
cd "$(dirname "$0")/../.."
source bench/cuda/carried_env.sh fa_wg_check.sh || exit 1
A=$PWD/build-carry
B=$PWD/build-carry-b
need_bins "$A" dspec || exit 1
need_bins "$B" dspec cuda_ops_test cuda_model_test wg_probe || exit 1
C=$PWD/build-carry-c
DS=("$A" "$B")
[ -e "$C/dspec.xz" ] || [ -e "$C/dspec" ] && { need_bins "$C" dspec || exit 1; DS+=("$C"); }
L=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
  timeout 30 "$B/wg_probe"
  (cd /tmp && timeout 240 "$B/cuda_ops_test" >"$OUT/ops_test.log" 2>&1
   echo "cuda_ops_test exit $?")
  grep -E "prefill attention.*(wgmma|FAIL)|FAILED|PASSED|ERROR" "$OUT/ops_test.log" | head -60
  timeout 200 "$B/cuda_model_test" >"$OUT/model_test.log" 2>&1
  echo "cuda_model_test exit $?"
  grep -E "FAILED|PASSED" "$OUT/model_test.log"
  "$A/dspec" synth --preset 27b --mix q4_k_m /tmp/fw.gguf 2>&1 | tail -1
  bm() { timeout 240 "$1/dspec" bench --model /tmp/fw.gguf --device cuda --decode 4 --reps 1 \
           --verify 1 --prompt "$2" 2>&1 | grep -E "^prefill"; }
  for round in 1 2; do
    for D in "${DS[@]}"; do echo "$(basename "$D") 8K: $(bm "$D" 8192)"; done
  done
  for D in "${DS[@]}"; do echo "$(basename "$D") 32K: $(bm "$D" 32768)"; done
  for D in "${DS[@]}"; do
    echo "== $(basename "$D") profile, 8K"
    DSPEC_CUDA_PROFILE=1 timeout 240 "$D/dspec" bench --model /tmp/fw.gguf --device cuda \
      --decode 4 --reps 1 --verify 1 --prompt 8192 2>&1 |
      grep -iE "attention|gated_delta|total|prefill" | head -12
  done
  if [ -n "${NCU:-}" ]; then # (the bench's 256-row warm-up prompt runs 16 launches first)
    timeout 300 ncu -k regex:fw_kernel --launch-skip 20 --launch-count 1 --set full \
      --import-source no -o "$OUT/fw" "$B/dspec" bench --model /tmp/fw.gguf --device cuda \
      --prompt 8192 --decode 1 --reps 1 --verify 1 >"$OUT/ncu_run.log" 2>&1
    echo "ncu exit $?"
    ncu -i "$OUT/fw.ncu-rep" --page details >"$OUT/fw_ncu.txt" 2>&1
    ncu -i "$OUT/fw.ncu-rep" --page source --csv --print-source sass >"$OUT/fw_sass.csv" 2>&1
    python3 bench/cuda/ncu_source.py "$OUT/fw_sass.csv" --top 30 >"$OUT/fw_src.txt" 2>&1
    grep -E "Duration|Throughput|Busy|Issue Slots|Eligible|Registers|Achieved Occ" \
      "$OUT/fw_ncu.txt" | head -30
  fi
  rm -f /tmp/fw.gguf
} >"$L" 2>&1
cat "$L"
