#!/usr/bin/env bash
# The wheels bench/gpu/run.py needs beyond what the GPU machine has. REFERENCE.md lists
# torch, transformers, peft and friends there, but no pydantic, which the learner's config
# and GRPOConfig are built on. This fetches pydantic and its dependencies at the lock's
# versions, for CPython 3.12 on x86-64 Linux, into bench/gpu/wheels (about 3 MB; carried
# to the device with the tree: `run` with carry ["bench/gpu/wheels"]).
#   bench/gpu/prepare.sh        then on the device: bash bench/gpu/device.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pins=$(grep -E '^(pydantic|pydantic-core|annotated-types|typing-extensions|typing-inspection)==' \
  requirements.txt)
rm -rf bench/gpu/wheels.tmp
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d bench/gpu/wheels.tmp \
  --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 $pins
rm -rf bench/gpu/wheels
mv bench/gpu/wheels.tmp bench/gpu/wheels
ls bench/gpu/wheels
