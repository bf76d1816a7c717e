#!/usr/bin/env bash
# racecheck.sh: compute-sanitizer's racecheck (shared-memory hazards, cp.async groups read before
# they landed included) over the CUDA op tests of the kernels that stage data in shared memory,
# with a carried cuda_ops_test in BIN (default build-carry; bench/cuda/README.md "Carried
# binaries"). Each test runs under the sanitizer for at most LIMIT seconds (default 70; it is
# ~50-100x slower: the 27B-shaped cases may not finish, the hazards found until then are printed).
# A race that only changes a few bits of a few rows passes the tests' tolerances; this finds it
# (session 56: gdc_state_kernel read a copy group before it landed, prompt rows differed from
# run to run). Usage (repo root, on the GPU machine):
#   [BIN=build-carry-b] [LIMIT=70] [TESTS="test_gated_delta test_attention_prefill"] \
#     bash bench/cuda/racecheck.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
source bench/cuda/carried_env.sh racecheck.sh || exit 1
B=$PWD/${BIN:-build-carry}
need_bins "$B" cuda_ops_test || exit 1
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cd /tmp || exit 1
for t in ${TESTS:-test_gated_delta test_gated_delta_prefill test_attention_prefill \
  test_attention test_gated_rmsnorm test_matmul_small}; do
  echo "== $t"
  timeout "${LIMIT:-70}" "$CS" --tool racecheck --racecheck-report hazard --print-limit 10 \
    "$B/cuda_ops_test" "$t" >"$OUT/racecheck_$t.log" 2>&1
  e=$?
  [ $e = 124 ] && echo "(stopped after ${LIMIT:-70} s)" || echo "exit $e"
  grep -E "RACECHECK SUMMARY" "$OUT/racecheck_$t.log"
  grep -E "Read Thread|Write Thread" "$OUT/racecheck_$t.log" | sed 's/.*) at //' | sort \
    | uniq -c | head -6
done
