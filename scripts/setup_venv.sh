#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv from requirements.txt,
# the lock (scripts/lock.sh writes it), the host-only tools of requirements-host.txt
# (TensorBoard: not in the images), then rlfleet itself, editable, without dependencies.
# Idempotent: a stamp holding the hash of requirements.txt + pyproject.toml skips the
# install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON_BOOTSTRAP:-python3.11}
command -v "$PY" >/dev/null || PY=python3
stamp=.venv/.rlfleet-stamp
want=$(cat requirements.txt requirements-host.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
echo "==> setting up .venv (Python: $($PY --version))"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q -c requirements.txt -r requirements-host.txt
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
echo "==> .venv ready"
