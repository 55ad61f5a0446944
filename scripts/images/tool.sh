# Sourced by the image scripts: picks the image builder and gives it one set of flags.
#   IMAGE_TOOL=docker|podman|buildah overrides the choice (docker only where a daemon
#   answers: `docker --version` alone is just the client).
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
if [ -z "${IMAGE_TOOL:-}" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then IMAGE_TOOL=docker
  elif command -v podman >/dev/null; then IMAGE_TOOL=podman
  elif command -v buildah >/dev/null; then IMAGE_TOOL=buildah
  else
    echo "images: no image builder: docker (with a daemon), podman or buildah is needed (apt-get install buildah)" >&2
    exit 1
  fi
fi
# buildah/podman: storage of our own under the cache, runc with cgroupfs, and ulimits this
# machine allows (no CAP_SYS_RESOURCE, so the defaults fail).
STORE=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver overlay)
case "$IMAGE_TOOL" in
  docker) image_build() { docker build "$@"; }; image_push() { docker push "$1"; } ;;
  podman|buildah)
    image_build() {
      "$IMAGE_TOOL" "${STORE[@]}" build --runtime runc --cgroup-manager cgroupfs --layers \
        --network host --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 "$@"
    }
    image_push() { "$IMAGE_TOOL" "${STORE[@]}" push "$1"; }
    ;;
  *) echo "images: IMAGE_TOOL is docker, podman or buildah, not $IMAGE_TOOL" >&2; exit 1 ;;
esac
buildah_store() { buildah "${STORE[@]}" "$@"; }
# The images' default tag: the chart's appVersion (run from the repository root).
chart_app_version() { sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/rlfleet/Chart.yaml; }
# The label rlfleet.inputs of IMAGE (a hash of what it was built from, set by the build
# scripts so an unchanged image is not rebuilt); empty when there is no such image.
built_from() {
  buildah_store inspect --type image --format '{{index .OCIv1.Config.Labels "rlfleet.inputs"}}' \
    "$1" 2>/dev/null || true
}
# The ID of an image in our storage (a base's identity in an inputs hash).
image_id() { buildah_store inspect --type image --format '{{.FromImageID}}' "$1"; }
