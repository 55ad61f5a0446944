#!/usr/bin/env bash
# What `make cluster-down` does with the local cluster's /shared (LOCAL_SHARED, by default
# /var/lib/rlfleet/shared: the runs' checkpoints, adapters and metrics, the tiny model):
#   shared-dir.sh report DIR   say that it stays, what is in it and how to remove it
#   shared-dir.sh purge DIR    remove it (PURGE=1)
# It outlives the cluster on purpose: a later `make deploy` of the same run continues from
# its newest checkpoint (--resume auto) instead of starting over.
set -euo pipefail
action=${1:?usage: $0 report|purge DIR}
dir=${2:?usage: $0 report|purge DIR}
log() { echo "cluster-down: $*" >&2; }

# Only an absolute directory below /, never / (however written): this may rm -rf it.
case "$dir" in
  /*) dir=$(realpath -m -- "$dir") ;;
  *) dir="" ;;
esac
if [ -z "$dir" ] || [ "$dir" = / ]; then
  log "refusing LOCAL_SHARED='$2' (an absolute directory other than / is needed)"
  exit 2
fi

if [ ! -d "$dir" ]; then
  exit 0
fi
case "$action" in
  report)
    runs=$(ls -1 "$dir/runs" 2>/dev/null | tr '\n' ' ' || true)
    log "kept $dir (the pods' /shared${runs:+; runs: ${runs% }}): a new deploy of the" \
        "same run resumes it from its newest checkpoint. Remove it with" \
        "'make cluster-down PURGE=1' (or rm -rf $dir)"
    ;;
  purge)
    rm -rf -- "$dir"
    log "removed $dir (runs, checkpoints, models)"
    ;;
  *) log "unknown action $action"; exit 2 ;;
esac
