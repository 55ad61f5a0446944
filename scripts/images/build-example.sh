#!/usr/bin/env bash
# Build a user's service image (a Containerfile on top of an rlfleet image, such as
# examples/path-efficiency-reward) the way build.sh builds the local profile: offline,
# from the wheelhouse, on the local rlfleet-env image. Prints the image name.
#   scripts/images/build-example.sh DIR NAME:TAG [--tag RLFLEET_TAG]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: build-example.sh DIR NAME:TAG}; NAME=${2:?usage: build-example.sh DIR NAME:TAG}
source scripts/images/tool.sh
TAG=$(chart_app_version)
[ "${3:-}" = --tag ] && TAG=${4:?--tag needs the rlfleet image tag}
WHEELS=$(scripts/images/wheelhouse.sh local localhost/rlfleet-base:bookworm | tail -1)
LABEL=()
if [ "$IMAGE_TOOL" != docker ]; then
  # As build.sh: skipped when built from the same inputs (the directory's files, the
  # rlfleet image under it, the wheelhouse), so a cached cluster-up builds nothing.
  inputs=$( { echo "$WHEELS"; image_id "localhost/rlfleet-env:$TAG"
              find "$DIR" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
                | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-32)
  if [ "$(built_from "localhost/$NAME")" = "$inputs" ]; then
    echo "localhost/$NAME"
    exit 0
  fi
  LABEL=(--label "rlfleet.inputs=$inputs")
fi
echo "[images] building localhost/$NAME from $DIR" >&2
image_build --build-arg "RLFLEET_IMAGE=localhost/rlfleet-env:$TAG" \
  --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels -v "$WHEELS:/wheels:ro" \
  "${LABEL[@]}" -t "localhost/$NAME" -f "$DIR/Containerfile" "$DIR" >&2
echo "localhost/$NAME"
