# deps.sh (sourced): build dependencies on the bare GPU machine: the image's if present, else the
# Debian packages carried in build-debs/ (bench/cuda/fetch-debs.sh); sets CMAKE_EXTRA, CUDACXX.
# ---- dependencies: use the image's, else the .debs carried in build-debs/ (fetch-debs.sh) --------
PKGS="cmocka jansson libpcre2-8 libmicrohttpd"
CMAKE_EXTRA=()
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists $PKGS 2>/dev/null; then
  if ls build-debs/*.deb >/dev/null 2>&1; then
    D=/tmp/dsdeps
    rm -rf "$D"
    for f in build-debs/*.deb; do dpkg -x "$f" "$D"; done
    # libmicrohttpd.pc names gnutls in Requires.private, which pkgconf resolves even for --cflags
    sed -i '/^Requires.private/d' "$D"/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
    export LD_LIBRARY_PATH="$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_LIBDIR="$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$D"
    CMAKE_EXTRA+=(-DPKG_CONFIG_EXECUTABLE="$D/usr/bin/pkgconf")
    command -v log >/dev/null 2>&1 && log "dependencies: unpacked build-debs/*.deb into $D"
  else
    log "dependencies missing ($PKGS) and no build-debs/: run bench/cuda/fetch-debs.sh here and carry build-debs"
    return 1
  fi
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
