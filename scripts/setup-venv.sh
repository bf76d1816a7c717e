#!/usr/bin/env bash
# setup-venv.sh VENV_DIR [REQUIREMENTS]: creates the pinned Python environment for the test oracles
# (idempotent: re-installs only when the requirements file changed).
set -euo pipefail
venv=$1
req=${2:-$(dirname "$0")/../requirements-ci.txt}
stamp="$venv/.req.sha"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
py=$(command -v python3)
"$py" -m venv "$venv" 2>/dev/null || { rm -rf "$venv"; "$py" -m venv --without-pip "$venv"; \
  "$venv/bin/python" -m ensurepip -q; }
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
