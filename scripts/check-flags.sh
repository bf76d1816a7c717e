#!/usr/bin/env bash
# check-flags.sh DSPEC README: fails if a long option that a `dspec <command> --help` prints (run,
# serve, logits, tokenize, info, tensor, convert, synth, bench and its --model / --spec forms) is
# not named in README.md (the brief: every flag in --help and the README), or if a help fails.
set -uo pipefail
dspec=$1 readme=$2
bad=0 n=0
for args in "run" "serve" "logits" "tokenize" "info" "tensor" "convert" "synth" "bench" \
            "bench --model" "bench --spec --model"; do
  # shellcheck disable=SC2086 # (args splits into the command and its mode flags on purpose)
  if ! help=$("$dspec" $args --help 2>&1); then
    echo "dspec $args --help failed:"
    echo "$help" | sed 's/^/  /'
    bad=1
    continue
  fi
  for f in $(grep -oE -- '--[a-z0-9][a-z0-9-]*' <<<"$help" | sort -u); do
    n=$((n + 1))
    if ! grep -qE -- "${f}([^a-z0-9-]|\$)" "$readme"; then
      echo "dspec $args: $f is not in $readme"
      bad=1
    fi
  done
done
[ $bad -eq 0 ] && echo "flags: all $n long options of the --help texts are in $readme"
exit $bad
