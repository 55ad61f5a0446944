#!/usr/bin/env bash
# Build a user's service image (a Containerfile on top of an rlfleet image, such as
# examples/path-efficiency-reward) the way build.sh builds the local profile: offline,
# from the wheelhouse, on the local rlfleet-env image. Prints the image name.
#   scripts/images/build-example.sh DIR NAME:TAG [--tag RLFLEET_TAG]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: build-example.sh DIR NAME:TAG}; NAME=${2:?usage: build-example.sh DIR NAME:TAG}
TAG=${4:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/rlfleet/Chart.yaml)}
source scripts/images/tool.sh
WHEELS=$(scripts/images/wheelhouse.sh local localhost/rlfleet-base:bookworm | tail -1)
image_build --build-arg "RLFLEET_IMAGE=localhost/rlfleet-env:$TAG" \
  --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels -v "$WHEELS:/wheels:ro" \
  -t "localhost/$NAME" -f "$DIR/Containerfile" "$DIR" >&2
echo "localhost/$NAME"
