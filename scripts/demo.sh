#!/usr/bin/env bash
# demo.sh DSPEC: the README's main job on the bundled tiny models: plain greedy decoding, then
# speculative decoding with each bundled drafter on the same code prompt; checks that the text is
# identical and prints tau and the speedup measured in this run.
set -euo pipefail
D=${1:-build/dspec}
M=models/tiny-target-q8_0.gguf
PROMPT=$'import os\nimport sys\n\n\ndef main():\n'
N=96
tps() { grep -o 'decode [0-9.]* tok/s' "$1" | grep -o '[0-9.]*' | head -1; }
echo "== plain greedy decoding ($M)"
"$D" run -m "$M" -p "$PROMPT" -n $N --no-adaptive >/tmp/dspec-demo-plain.txt 2>/tmp/dspec-demo-plain.err
cat /tmp/dspec-demo-plain.txt; echo
base=$(tps /tmp/dspec-demo-plain.err)
echo "plain: $base tok/s"
for d in dspark-g7 dflash2-b8 dflash-b8; do
  f=models/tiny-$d-q8_0.gguf
  "$D" run -m "$M" --draft "$f" -p "$PROMPT" -n $N --no-adaptive >/tmp/dspec-demo-spec.txt \
      2>/tmp/dspec-demo-spec.err
  same=$(cmp -s /tmp/dspec-demo-plain.txt /tmp/dspec-demo-spec.txt && echo "identical text" ||
         echo "TEXT DIFFERS")
  s=$(tps /tmp/dspec-demo-spec.err)
  tau=$(grep -o 'tau [0-9.]*' /tmp/dspec-demo-spec.err | grep -o '[0-9.]*')
  printf '%-11s tau %s, %s tok/s, speedup %.2fx over plain, %s\n' "$d:" "$tau" "$s" \
      "$(echo "$s / $base" | bc -l)" "$same"
done
# The adaptive policy (default) measures spec-step and plain-step times and falls back to plain
# bursts where speculation does not pay (on a 2-core CPU with a 13 MB model, verify is compute-bound).
"$D" run -m "$M" --draft models/tiny-dspark-g7-q8_0.gguf -p "$PROMPT" -n $N >/tmp/dspec-demo-spec.txt \
    2>/tmp/dspec-demo-spec.err
s=$(tps /tmp/dspec-demo-spec.err)
printf '%-11s %s tok/s (%.2fx), %s\n' "adaptive:" "$s" "$(echo "$s / $base" | bc -l)" \
    "$(grep -o 'speculative: [0-9]* steps (+[0-9]* plain)' /tmp/dspec-demo-spec.err)"
