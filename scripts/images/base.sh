#!/usr/bin/env bash
# Base images made from Debian's packages, for machines that reach Debian's mirror but no
# image registry (python:3.11-slim and the pause image cannot be pulled there):
#   localhost/rlfleet-base:bookworm   debootstrap --variant=minbase + python3 (3.11), venv,
#                                     CA certificates; docs, man pages and apt lists removed
#   localhost/rlfleet-redis:7.0       Debian's redis-server on that base (the chart's Redis)
#   localhost/rlfleet-prometheus:2.42 Debian's prometheus on that base (the chart's
#                                     prometheus.enabled: the local profile's Prometheus)
#   localhost/rlfleet-pause:3.4       the pod sandbox image: Kubernetes' pause.c, static
#                                     (built by scripts/k8s/build-k8s.sh)
# Built once into buildah storage of our own ($RLFLEET_CACHE/containers), then reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE_TOOL=buildah
source scripts/images/tool.sh
command -v debootstrap >/dev/null && command -v buildah >/dev/null || {
  echo "base.sh: needs debootstrap and buildah (scripts/k8s/cluster-deps.sh installs them)" >&2; exit 1; }
log() { echo "[base] $*" >&2; }
have() { buildah_store inspect --type image "$1" >/dev/null 2>&1; }

if ! have localhost/rlfleet-base:bookworm; then
  MIRROR=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  ROOT=$(mktemp -d "$CACHE/base-rootfs.XXXXXX")
  trap 'rm -rf "$ROOT"' EXIT
  log "debootstrap bookworm from $MIRROR (a few minutes, once per machine)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOT" "$MIRROR" >"$CACHE/base-debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/base-debootstrap.log" >&2; exit 1; }
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
         "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*
  c=$(buildah_store from scratch)
  buildah_store copy "$c" "$ROOT/" / >/dev/null
  buildah_store config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash "$c"
  buildah_store commit -q --rm "$c" localhost/rlfleet-base:bookworm >/dev/null
  log "built localhost/rlfleet-base:bookworm"
fi

if ! have localhost/rlfleet-redis:7.0; then
  c=$(buildah_store from localhost/rlfleet-base:bookworm)
  buildah_store run --runtime runc --isolation oci --network host "$c" -- sh -ec \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
     rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/share/doc/* /usr/share/man/*' >&2
  buildah_store config --cmd '["redis-server", "--protected-mode", "no"]' --user 999:999 "$c"
  buildah_store commit -q --rm "$c" localhost/rlfleet-redis:7.0 >/dev/null
  log "built localhost/rlfleet-redis:7.0"
fi

if ! have localhost/rlfleet-prometheus:2.42; then
  c=$(buildah_store from localhost/rlfleet-base:bookworm)
  buildah_store run --runtime runc --isolation oci --network host "$c" -- sh -ec \
    'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
     rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/share/doc/* /usr/share/man/*
     prometheus --version' >&2
  buildah_store config --entrypoint '["/usr/bin/prometheus"]' --cmd '[]' --user 65534:65534 "$c"
  buildah_store commit -q --rm "$c" localhost/rlfleet-prometheus:2.42 >/dev/null
  log "built localhost/rlfleet-prometheus:2.42"
fi

if ! have localhost/rlfleet-pause:3.4; then
  BIN=$(scripts/k8s/build-k8s.sh | tail -1)
  c=$(buildah_store from scratch)
  buildah_store copy "$c" "$BIN/pause" /pause >/dev/null
  buildah_store config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah_store commit -q --rm "$c" localhost/rlfleet-pause:3.4 >/dev/null
  log "built localhost/rlfleet-pause:3.4"
fi
echo localhost/rlfleet-base:bookworm
