#!/bin/sh
# The images' entrypoint: `rlfleet ARGS...`, or with no arguments the image's own service
# (RLFLEET_SERVICE, set from the SERVICE build argument). exec, so SIGTERM reaches rlfleet.
set -e
if [ "$#" -eq 0 ]; then
  case "${RLFLEET_SERVICE:-}" in
    env|rollout|ckptsync) set -- "$RLFLEET_SERVICE" serve ;;
    learner) set -- learner run --config /etc/rlfleet/learner.yaml ;;
    *) echo "entrypoint: RLFLEET_SERVICE=${RLFLEET_SERVICE:-} is none of env, rollout, ckptsync, learner" >&2; exit 2 ;;
  esac
fi
exec rlfleet "$@"
