#!/usr/bin/env bash
# Build rlfleet's images with whatever builder this machine has (docker with a daemon, else
# podman, else buildah), from the one Dockerfile at the repository root.
#
#   scripts/images/build.sh [--profile hyperpod|local] [--prefix REGISTRY/] [--tag TAG]
#                           [--push] [--dry-run] [SERVICE...]
#
#   hyperpod (default)  each service on its official base (python slim, vLLM, Ray), extras
#                       of that service only; pulled from their registries
#   local               every service on a Debian base built here from Debian's packages
#                       (base.sh), CPU torch, installed offline from a wheelhouse that the
#                       host's pip fills (this machine reaches PyPI but no image registry);
#                       rollout and learner both get the learner's extras, so their large
#                       torch layer is one layer, stored and loaded once
#
# buildah and podman keep their images under $RLFLEET_CACHE/containers (storage of our
# own: nothing host-wide is touched). Prints the built image names, one a line.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=scripts/images
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
PROFILE=hyperpod PREFIX="" TAG="" PUSH=0 DRY=0 SERVICES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --push) PUSH=1; shift ;;
    --dry-run) DRY=1; shift ;;   # print the build commands, build nothing
    -*) echo "build.sh: unknown option $1" >&2; exit 2 ;;
    *) SERVICES+=("$1"); shift ;;
  esac
done
[ ${#SERVICES[@]} -gt 0 ] || SERVICES=(env rollout learner ckptsync)
# The local profile's images are named as the chart's values-local.yaml pulls them.
[ -z "$PREFIX" ] && [ "$PROFILE" = local ] && PREFIX=localhost/
[ -z "$PREFIX" ] || PREFIX="${PREFIX%/}/"
log() { echo "[images] $*" >&2; }

source "$HERE/tool.sh"   # IMAGE_TOOL and the builder's flags (image_build, image_push)
[ -n "$TAG" ] || TAG=$(chart_app_version)

case "$PROFILE" in
  hyperpod|local) ;;
  *) echo "build.sh: --profile is hyperpod or local, not $PROFILE" >&2; exit 2 ;;
esac

EXTRA_FLAGS=()
if [ "$DRY" = 1 ]; then
  image_build() { echo "$IMAGE_TOOL build $*"; }
  image_push() { echo "$IMAGE_TOOL push $*"; }
fi
if [ "$PROFILE" = local ] && [ "$DRY" = 0 ]; then
  "$HERE/base.sh" >/dev/null
  WHEELS=$("$HERE/wheelhouse.sh" local localhost/rlfleet-base:bookworm | tail -1)
  # Offline: pip inside the build sees only the wheelhouse, mounted read-only.
  EXTRA_FLAGS+=(--build-arg BASE_IMAGE=localhost/rlfleet-base:bookworm
                --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels
                -v "$WHEELS:/wheels:ro")
fi

base_of() {  # the official base image of a service (the hyperpod profile)
  case "$1" in
    rollout) echo "vllm/vllm-openai:v0.33.0" ;;
    learner) echo "rayproject/ray:2.60.0-py311-gpu" ;;
    *) echo "python:3.11-slim-bookworm" ;;
  esac
}

# The local profile's builds are skipped when an image of that name was built from the
# same inputs: the files the build context lets in (.dockerignore), the Dockerfile, the
# build arguments and the base image. The hash is the image's label rlfleet.inputs. (The
# builder's layer cache would reuse every layer too, but only after sending the context
# and checking each step: minutes per image on 2 cores, for nothing.)
inputs_hash() {  # build arguments...
  { printf '%s\n' "$@"
    cat Dockerfile .dockerignore
    image_id localhost/rlfleet-base:bookworm
    find pyproject.toml requirements.txt README.md protos libs services warm-starts/tiny-sft-feedback \
         scripts/images/declared_deps.py scripts/images/entrypoint.sh -type f \
         ! -path 'libs/rlfleet/v1/*_pb2*' ! -path '*/__pycache__/*' ! -name '*.pyc' \
         ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

for svc in "${SERVICES[@]}"; do
  case "$svc" in env|rollout|learner|ckptsync) ;; *) echo "build.sh: unknown service $svc" >&2; exit 2 ;; esac
  name="${PREFIX}rlfleet-$svc:$TAG"
  args=(--build-arg "SERVICE=$svc" -t "$name")
  if [ "$PROFILE" = local ]; then
    case "$svc" in rollout|learner) args+=(--build-arg EXTRAS=learner) ;; *) args+=(--build-arg "EXTRAS=$svc") ;; esac
  else
    args+=(--build-arg "EXTRAS=$svc" --build-arg "BASE_IMAGE=$(base_of "$svc")")
    # vLLM's image keeps its CUDA torch: no lock (the lock pins the CPU build).
    [ "$svc" = rollout ] && args+=(--build-arg LOCK=)
    [ "$svc" = learner ] && args+=(--build-arg UID=1000)
  fi
  if [ "$PROFILE" = local ] && [ "$DRY" = 0 ] && [ "$IMAGE_TOOL" != docker ]; then
    inputs=$(inputs_hash "${args[@]}")
    if [ "$(built_from "$name")" = "$inputs" ]; then
      log "$name is up to date (inputs $inputs)"
      echo "$name"
      continue
    fi
    args+=(--label "rlfleet.inputs=$inputs")
  fi
  log "building $name ($PROFILE profile, $IMAGE_TOOL)"
  image_build "${args[@]}" "${EXTRA_FLAGS[@]}" -f Dockerfile . >&2
  [ "$PUSH" = 1 ] && image_push "$name" >&2
  echo "$name"
done
