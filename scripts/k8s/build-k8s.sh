#!/usr/bin/env bash
# Build (once per machine) the binaries of a real, single-node Kubernetes:
#   etcd                      from Debian's etcd-server package (3.4)
#   kube-apiserver, kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#                             built in one pass from Debian bookworm's kubernetes source
#                             package (1.20.2): the Go packages they share compile once;
#                             without the in-tree cloud providers or dockershim
#   pause                     the pod sandbox's process, from the same tree's pause.c
# There is no Docker here and no other registry, so kind/k3s/envtest binaries cannot be
# downloaded; Debian's source package is the one route. The result is cached under
# ${RLFLEET_CACHE:-$HOME/.cache/rlfleet}/k8s/bin and reused; a second run is a no-op.
#
# Prints the bin directory on stdout (last line). Exits non-zero with a reason on failure,
# so the deploy tests fail loudly instead of skipping.
set -euo pipefail

CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
K8S="$CACHE/k8s"
BIN="$K8S/bin"
WORK="$K8S/build"
mkdir -p "$BIN" "$WORK"

log() { echo "[build-k8s] $*" >&2; }

COMPONENTS=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy)
have() { [ -x "$BIN/$1" ] && "$BIN/$1" --version >/dev/null 2>&1; }
missing_components() { local c; for c in "${COMPONENTS[@]}"; do have "$c" || echo "$c"; done; }
have_etcd() { [ -x "$BIN/etcd" ] && "$BIN/etcd" --version >/dev/null 2>&1; }

# One build at a time per machine (parallel test sessions, make -j).
exec 9>"$K8S/.lock"
flock 9

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    log "need Debian packages ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})"
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
  fi
}

if ! have_etcd; then
  apt_install etcd-server
  ln -sf "$(command -v etcd || echo /usr/bin/etcd)" "$BIN/etcd"
  have_etcd || { log "etcd not usable after install"; exit 1; }
fi

MISSING=($(missing_components))
if [ ${#MISSING[@]} -eq 0 ] && [ -x "$BIN/pause" ]; then
  echo "$BIN"
  exit 0
fi

apt_install golang-go rsync dpkg-dev golang-github-modern-go-reflect2-dev make gcc libc6-dev

# deb-src lines in a private APT configuration: the system's sources are left untouched.
# They mirror the system's own deb entries (same mirror, same suites) as deb-src.
APTD="$WORK/apt"
mkdir -p "$APTD/lists/partial" "$APTD/archives/partial" "$APTD/sources.list.d"
: > "$APTD/sources.list"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -e "$f" ] || continue
  sed -e 's/^Types:.*/Types: deb-src/' "$f" > "$APTD/sources.list.d/$(basename "$f")"
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb \(.*\)/deb-src \1/p' /etc/apt/sources.list > "$APTD/sources.list"
fi
if ! ls "$APTD"/sources.list.d/*.sources >/dev/null 2>&1 && [ ! -s "$APTD/sources.list" ]; then
  echo "deb-src http://deb.debian.org/debian bookworm main" > "$APTD/sources.list"
fi
APTOPTS=(-o "Dir::Etc::SourceList=$APTD/sources.list" -o "Dir::Etc::SourceParts=$APTD/sources.list.d"
         -o "Dir::State::Lists=$APTD/lists" -o "Dir::Cache::archives=$APTD/archives"
         -o "APT::Sandbox::User=root")

SRC=$(ls -d "$WORK"/kubernetes-*/ 2>/dev/null | head -1 || true)
if [ -z "$SRC" ] || [ ! -f "$SRC/Makefile" ]; then
  log "fetching Debian's kubernetes source package"
  apt-get "${APTOPTS[@]}" update >&2
  rm -rf "$WORK"/kubernetes*
  (cd "$WORK" && apt-get "${APTOPTS[@]}" source --download-only kubernetes >&2 \
    && dpkg-source --no-check -x kubernetes_*.dsc >&2)
  SRC=$(ls -d "$WORK"/kubernetes-*/ | head -1)
fi
SRC=${SRC%/}
log "source: $SRC"

# Vendored reflect2 (2019) crashes on Go >= 1.18 (it reads runtime internals); Debian's
# packaged copy is fixed. Swap it in.
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
if [ -d "$SRC/vendor/github.com/modern-go/reflect2" ] && [ -d "$R2" ]; then
  rsync -a --delete --exclude '*_test.go' --exclude 'go.mod' --exclude 'go.sum' \
    "$R2/" "$SRC/vendor/github.com/modern-go/reflect2/"
fi

# Build tags (Kubernetes' own; hack/lib/golang.sh passes GOFLAGS' -tags to go build):
#   providerless  no in-tree cloud providers (AWS, Azure, GCE, OpenStack, vSphere SDKs):
#                 the node here is no cloud's, and those SDKs were half the compile
#   dockerless    no dockershim in the kubelet: it talks CRI to containerd (node.sh)
# Measured on 2 cores: 5 min 45 s against 10 min 52 s without the tags (user CPU 8:56
# against 17:28), and binaries of about half the size.
export GOCACHE="$WORK/gocache" GOPATH="$WORK/gopath" GO111MODULE=on
export GOFLAGS="-mod=vendor -tags=providerless,dockerless"
export GOTOOLCHAIN=local KUBE_VERBOSE=0
if [ ${#MISSING[@]} -gt 0 ]; then
  log "building ${MISSING[*]} in one pass (about 6 minutes on 2 cores, once per machine)"
  WHAT=$(printf 'cmd/%s ' "${MISSING[@]}")
  (cd "$SRC" && make WHAT="${WHAT% }" >&2)
  for c in "${MISSING[@]}"; do
    OUT=$(find "$SRC/_output" -type f -name "$c" -perm -u+x | head -1)
    [ -n "$OUT" ] || { log "build produced no $c binary"; exit 1; }
    cp "$OUT" "$BIN/$c.tmp" && mv "$BIN/$c.tmp" "$BIN/$c"
    have "$c" || { log "built $c does not run"; exit 1; }
    log "$("$BIN/$c" --version 2>&1 | head -1) ($c)"
  done
fi
# The pod sandbox's pause process: no registry holds a pause image we can pull, so the
# image is built from this binary (scripts/k8s/images.sh).
PAUSE_C=$(find "$SRC/build/pause" -name pause.c | head -1)
[ -n "$PAUSE_C" ] || { log "no pause.c in the source tree"; exit 1; }
gcc -Os -static -Wall -o "$BIN/pause.tmp" "$PAUSE_C" && strip "$BIN/pause.tmp" && mv "$BIN/pause.tmp" "$BIN/pause"
# The source tree, tarballs and Go build cache are ~2 GB; the binary is all that is needed.
rm -rf "$WORK"
echo "$BIN"
