#!/usr/bin/env bash
# On the GPU machine: pydantic from the wheels bench/gpu/prepare.sh fetched, installed into
# a folder of this run's own (the machine's Python is left as it is), then the benchmark.
#   bash bench/gpu/device.sh [run.py's flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
shopt -s nullglob
wheels=(bench/gpu/wheels/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
  echo "bench/gpu/device.sh: no wheels in bench/gpu/wheels: run bench/gpu/prepare.sh here first" >&2
  exit 2
fi
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}"
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" exec python3 bench/gpu/run.py "$@"
