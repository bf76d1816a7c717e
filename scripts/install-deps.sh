#!/usr/bin/env bash
# install-deps.sh: installs the Debian packages dspec needs, if missing (idempotent). Run as root on
# Debian 12; as another user it only reports what is missing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config python3 python3-venv libmicrohttpd-dev libjansson-dev
      libpcre2-dev libcmocka-dev bc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]} (run as root to install)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
