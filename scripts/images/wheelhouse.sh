#!/usr/bin/env bash
# Wheels for an offline image build: every requirement pyproject.toml declares for EXTRAS,
# at the lock's versions, built or fetched by the host's pip (which reaches PyPI and this
# machine's local torch CPU wheel) into $RLFLEET_CACHE/wheelhouse/<hash>; then completed by
# pip inside the base image, whose Python (Debian's 3.11.2) needs a few packages the host's
# does not (environment markers: redis wants async-timeout before 3.11.3). Cached by the
# hash of pyproject.toml and the lock. Prints the folder.
#   scripts/images/wheelhouse.sh EXTRAS [BASE_IMAGE]
set -euo pipefail
cd "$(dirname "$0")/../.."
EXTRAS=${1:?usage: wheelhouse.sh EXTRAS}
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
key=$(cat pyproject.toml requirements.txt | sha256sum | cut -c1-16)
DIR="$CACHE/wheelhouse/$EXTRAS-$key"
if [ -f "$DIR/.complete" ]; then echo "$DIR"; exit 0; fi
mkdir -p "$DIR"
echo "[wheelhouse] pip wheel for extras '$EXTRAS' into $DIR" >&2
python3 scripts/images/declared_deps.py "$EXTRAS" > "$DIR/requirements-declared.txt"
# The build stage's tools too (protoc for the stubs, setuptools for the rlfleet wheel).
printf '%s\n' grpcio-tools "setuptools>=68" wheel >> "$DIR/requirements-declared.txt"
"$PY" -m pip wheel -q --wheel-dir "$DIR" -c requirements.txt -r "$DIR/requirements-declared.txt" >&2
BASE=${2:-}
if [ -n "$BASE" ]; then
  IMAGE_TOOL=buildah; source scripts/images/tool.sh
  cp requirements.txt "$DIR/requirements-lock.txt"
  c=$(buildah_store from "$BASE")
  trap 'buildah_store rm "$c" >/dev/null 2>&1 || true' EXIT
  # The host's CA bundle: pip inside reaches PyPI through whatever the host trusts.
  buildah_store run --runtime runc --isolation oci --network host -v "$DIR:/wheels" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    -e PIP_CERT=/etc/ssl/certs/ca-certificates.crt "$c" -- sh -ec \
    'python3 -m venv /tmp/pip && /tmp/pip/bin/pip download -q -d /wheels --find-links /wheels \
       -c /wheels/requirements-lock.txt -r /wheels/requirements-declared.txt' >&2
fi
touch "$DIR/.complete"
echo "$DIR"
