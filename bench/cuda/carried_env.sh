# carried_env.sh (sourced from the repo root by carried.sh, profile.sh, ab.sh): what the scripts
# that run carried binaries on the GPU machine share: $OUT for logs, the carried .debs (deps.sh),
# the image's CUDA runtime on the library path, and need_bins to check the carried binaries.
# Usage: source bench/cuda/carried_env.sh NAME || exit 1   (NAME prefixes the error messages)
CARRIED_NAME=${1:-carried}
OUT=${OUT:-/tmp/dspec-cuda-out}
mkdir -p "$OUT"
if ! source bench/cuda/deps.sh >/dev/null 2>&1; then
  echo "$CARRIED_NAME: dependencies missing (carry build-debs: bench/cuda/README.md)"
  return 1
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

# need_bins DIR NAME...: every DIR/NAME executable (unpacked from DIR/NAME.xz where only that was
# carried), else a message and a failing status.
need_bins() {
  local d=$1 f
  shift
  for f in "$@"; do
    if [ ! -x "$d/$f" ] && [ -f "$d/$f.xz" ]; then   # carried compressed: the 64 MiB carry limit
      { xz -dc "$d/$f.xz" 2>/dev/null || python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$d/$f.xz"; } >"$d/$f" && chmod +x "$d/$f"
    fi
    [ -x "$d/$f" ] || { echo "$CARRIED_NAME: $d/$f missing (see bench/cuda/README.md)"; return 1; }
  done
}
