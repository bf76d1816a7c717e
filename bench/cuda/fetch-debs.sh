#!/usr/bin/env bash
# fetch-debs.sh: downloads (here, on the development machine) the Debian packages the build needs
# that the device image may lack (pkg-config, cmocka, jansson, pcre2, libmicrohttpd) into
# build-debs/ (ignored by git: /build*/), for run.sh to unpack on the device. ~1.6 MB.
# Usage: bash bench/cuda/fetch-debs.sh   (then pass carry=["build-debs"] to the device call)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-debs
cd build-debs
apt-get download libcmocka0 libcmocka-dev libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev \
  libmicrohttpd12 libmicrohttpd-dev pkgconf pkgconf-bin libpkgconf3
ls -la
