"""What `rlfleet eval` checks before it starts anything: that the model directory is a
policy checkpoint, and that an adapter was made for it (every module it adapts is a
linear layer of the model with the shapes the adapter's A and B matrices need). Reads
safetensors headers and small JSON files only, never the weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rlfleet.policy.loading import checkpoint_problems
from rlfleet.storage.adapter_versions import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE

PEFT_PREFIX = "base_model.model."
_MAX_HEADER = 100 << 20  # a safetensors header past this is not one


class EvalInputError(ValueError):
    """A model or adapter directory `rlfleet eval` cannot evaluate (the message says
    what is wrong, in one line)."""


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape from a safetensors file's header."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > _MAX_HEADER:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise EvalInputError(f"{path} is not a safetensors file ({exc})") from None
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def model_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every weight's shape of a checkpoint (one file, or the shards its index lists)."""
    index = model_dir / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    shapes: dict[str, list[int]] = {}
    for name in files:
        shapes.update(tensor_shapes(model_dir / name))
    return shapes


def check_model(model_dir: Path) -> Path:
    """`model_dir`, or EvalInputError naming what keeps it from being a policy checkpoint."""
    problems = checkpoint_problems(model_dir)
    if problems:
        raise EvalInputError(f"--model {model_dir} is not a model directory: it lacks "
                             + "; ".join(problems))
    return model_dir


def check_adapter(adapter_dir: Path, model_dir: Path) -> Path:
    """`adapter_dir`, or EvalInputError when it is not a LoRA adapter (adapter_config.json
    + adapter_model.safetensors, as PEFT and the learner write them) of `model_dir`."""
    missing = [n for n in (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE)
               if not (adapter_dir / n).is_file()]
    if missing:
        raise EvalInputError(f"--adapter {adapter_dir} is not a LoRA adapter directory: it "
                             f"lacks {' and '.join(missing)}")
    adapter = tensor_shapes(adapter_dir / ADAPTER_WEIGHTS_FILE)
    base = model_shapes(model_dir)
    pairs: dict[str, dict[str, list[int]]] = {}
    for key, shape in adapter.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0].removeprefix(PEFT_PREFIX)
                pairs.setdefault(module, {})[part] = shape
    if not pairs:
        raise EvalInputError(f"--adapter {adapter_dir}: {ADAPTER_WEIGHTS_FILE} holds no "
                             "LoRA weights (lora_A / lora_B)")
    for module, parts in sorted(pairs.items()):
        weight = base.get(f"{module}.weight")
        if weight is None:
            raise EvalInputError(
                f"--adapter {adapter_dir} does not match --model {model_dir}: it adapts "
                f"{module}, which the model does not have")
        a, b = parts.get("lora_A"), parts.get("lora_B")
        if a is None or b is None or len(weight) != 2 or a[1] != weight[1] \
                or b[0] != weight[0] or a[0] != b[1]:
            raise EvalInputError(
                f"--adapter {adapter_dir} does not match --model {model_dir}: {module} is "
                f"{weight[0]}x{weight[1]} in the model, the adapter's A is {a} and B {b}"
                if len(weight) == 2 else
                f"--adapter {adapter_dir} does not match --model {model_dir}: {module}")
    return adapter_dir
