#!/usr/bin/env bash
# check-symbols.sh DIR: fails if any static library libds_*.a in DIR defines a global symbol that
# does not start with ds_ or dspec_ (STYLE.md §2.2). CUDA-generated symbols are ignored.
set -euo pipefail
dir=$1
bad=0
for lib in "$dir"/libds_*.a; do
  [ -e "$lib" ] || continue
  case "$lib" in *libds_cuda.a) continue ;; esac
  syms=$(nm -g --defined-only "$lib" 2>/dev/null | awk 'NF==3 {print $3}' | grep -Ev '^(ds_|dspec_|__odr_asan|__asan|__ubsan|__sancov)' || true)
  if [ -n "$syms" ]; then
    echo "$lib: global symbols without ds_/dspec_ prefix:"
    echo "$syms" | sed 's/^/  /'
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "symbols: all global symbols prefixed"
exit $bad
