#!/usr/bin/env bash
# System packages the tests and `make run` need: a real Redis server.
# Installs from Debian's packages only when missing (we run as root here and in CI).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
if ((${#need[@]})); then
  echo "==> apt-get install ${need[*]}"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
