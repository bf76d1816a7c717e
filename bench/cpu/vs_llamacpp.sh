#!/usr/bin/env bash
# vs_llamacpp.sh LLAMA_BENCH DSPEC MODEL.gguf [MODEL.gguf ...]: the CPU backend against llama.cpp's
# CPU backend on the same GGUF files, side by side in one run: prompt processing (PROMPT tokens,
# default 512) and decode (DECODE tokens, default 32, after PROMPT tokens of context) on THREADS
# threads (default: all CPUs).
# Each tool runs twice per file, alternating (A B A B), so a drift of the machine shows; the table
# prints each run and the ratio of the medians. llama-bench is built outside this repository
# (bench/README.md, "CPU against llama.cpp"); nothing of llama.cpp is kept here.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 LLAMA_BENCH DSPEC MODEL.gguf [MODEL.gguf ...]" >&2
  exit 2
fi
LB=$1 DS=$2
shift 2
P=${PROMPT:-512} N=${DECODE:-32} T=${THREADS:-$(nproc)}
num() { [[ ${1:-} =~ ^[0-9]+([.][0-9]+)?$ ]]; }
ds_run() { # prefill tok/s, decode tok/s (next step queued ahead, as dspec run decodes)
  local out pp tg
  out=$("$DS" bench --model "$1" --prompt "$P" --decode "$N" --verify 1 -t "$T" 2>&1) ||
    { echo "$0: dspec bench failed on $1:" >&2; echo "$out" | tail -3 >&2; return 1; }
  pp=$(grep -o '^prefill.*, [0-9.]* tok/s' <<<"$out" | grep -o '[0-9.]* tok/s$' |
       grep -o '^[0-9.]*' || true)
  tg=$(grep -o 'queued ahead [0-9.]* ms/token, [0-9.]* tok/s' <<<"$out" |
       grep -o '[0-9.]* tok/s$' | grep -o '^[0-9.]*' || true)
  num "$pp" && num "$tg" ||
    { echo "$0: no prefill / decode numbers from dspec on $1" >&2; return 1; }
  echo "$pp $tg"
}
lb_run() { # pp and tg tok/s (llama-bench's mean over -r 2): tg after a context of P tokens
  # (-d P), as dspec's decode follows its P-token prompt (llama-bench's tg alone starts empty)
  local pp tg
  pp=$("$LB" -m "$1" -t "$T" -p "$P" -n 0 -r 2 -o csv 2>/dev/null | lb_ts) || true
  tg=$("$LB" -m "$1" -t "$T" -p 0 -n "$N" -d "$P" -r 2 -o csv 2>/dev/null | lb_ts) || true
  num "$pp" && num "$tg" ||
    { echo "$0: no pp / tg numbers from llama-bench on $1 (does it take -d?)" >&2; return 1; }
  echo "$pp $tg"
}
lb_ts() { # avg_ts of the csv's one test (a csv parser: llama-bench quotes values with commas)
  python3 -c 'import csv, sys
r = list(csv.DictReader(sys.stdin))
print(r[-1]["avg_ts"] if r else "")'
}
med() { # the median (of two: their mean)
  printf '%s\n' "$@" | sort -g |
    awk '{a[NR] = $1} END {printf "%.6f", (a[int((NR + 1) / 2)] + a[int(NR / 2) + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
printf '%-28s %-9s %22s %22s\n' "model" "tool" "prefill $P tok/s" "decode tok/s"
for f in "$@"; do
  dp=() dd=() lp=() ld=()
  for rep in 1 2; do
    r=$(ds_run "$f") || exit 1
    read -r a b <<<"$r"; dp+=("$a"); dd+=("$b")
    r=$(lb_run "$f") || exit 1
    read -r a b <<<"$r"; lp+=("$a"); ld+=("$b")
  done
  name=$(basename "$f")
  printf '%-28s %-9s %22s %22s\n' "$name" dspec "${dp[*]}" "${dd[*]}"
  printf '%-28s %-9s %22s %22s\n' "" llama.cpp "$(printf '%.1f ' "${lp[@]}")" \
         "$(printf '%.1f ' "${ld[@]}")"
  printf '%-28s %-9s %22s %22s\n' "" "ratio" "$(ratio "$(med "${dp[@]}")" "$(med "${lp[@]}")")" \
         "$(ratio "$(med "${dd[@]}")" "$(med "${ld[@]}")")"
done
