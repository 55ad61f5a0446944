"""Loading a policy (model + processor) from a local HF directory, tiny or real.

The same code loads the tiny directory built by :mod:`rlfleet.policy.tiny` and a real
Qwen3-VL checkpoint (e.g. a VisGym SFT Qwen3-VL-8B on /shared): local files only, never a
download. The processor is built by hand because ``AutoProcessor`` on a directory without
a video processor silently returns only the tokenizer, and Qwen's video processor needs
torchvision, which these machines do not have.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from PIL import Image
from transformers import AutoTokenizer, PreTrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor


class PolicyProcessor(Qwen3VLProcessor):
    """Qwen3-VL processor without a video processor (images only, no torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            chat_template=chat_template,
            **kwargs,
        )

    @property
    def merge_size(self) -> int:
        return int(self.image_processor.merge_size)

    def image_token_count(self, image: Image.Image) -> int:
        """How many ``<|image_pad|>`` tokens this image becomes (after any resize)."""
        width, height = image.size
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        return int(patches) // self.merge_size**2


def _check_local_dir(path: Path) -> Path:
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a local model directory (no config.json); models are never "
            "downloaded: build the tiny one with ensure_tiny_model() or mount the checkpoint"
        )
    return path


# -- what a checkpoint must hold ---------------------------------------------------------

# The tokens rlfleet's chat encoding and image placeholders need (Qwen's ChatML + vision).
QWEN_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ModelLoadError(FileNotFoundError):
    """A model directory that is not a usable checkpoint; `missing` names each problem."""

    def __init__(self, path: Path, missing: list[str]) -> None:
        self.path = path
        self.missing = missing
        lines = "\n".join(f"  - {m}" for m in missing)
        super().__init__(
            f"{path} is not a complete Qwen3-VL checkpoint (models are never downloaded; "
            f"copy the whole Hugging Face model directory there). Missing:\n{lines}")


def _read_json(path: Path, problems: list[str]) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problems.append(f"{path.name}: unreadable JSON ({exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: not a JSON object")
        return None
    return data


def checkpoint_problems(path: str | Path) -> list[str]:
    """What keeps ``path`` from loading as a policy checkpoint, each as a short line; []
    for a complete one. Reads file names and small JSON files only (never the weights).

    A checkpoint is a Hugging Face Qwen3-VL model directory: ``config.json`` with
    ``model_type: qwen3_vl`` and a class of `SUPPORTED_ARCHITECTURES` in
    ``architectures``; the weights (``model.safetensors``, or the shards an
    ``*.index.json`` lists, every one present); a tokenizer (``tokenizer.json``, or
    ``vocab.json`` + ``merges.txt``) and ``tokenizer_config.json``, with Qwen's special
    tokens (`QWEN_SPECIAL_TOKENS`); the chat template (``chat_template.jinja`` or in
    ``tokenizer_config.json``); and ``preprocessor_config.json`` (the image processor:
    patch and merge size)."""
    path = Path(path)
    if not path.is_dir():
        return [f"the directory itself ({path} does not exist or is not a directory)"]
    problems: list[str] = []
    config_path = path / "config.json"
    if not config_path.is_file():
        problems.append("config.json (the model configuration)")
    else:
        config = _read_json(config_path, problems)
        if config is not None and config.get("model_type") != "qwen3_vl":
            problems.append(f"config.json: model_type is {config.get('model_type')!r}, "
                            "expected 'qwen3_vl'")
        # `model_class` picks the class from here (as AutoModel does)
        architectures = (config or {}).get("architectures")
        if config is not None and not (isinstance(architectures, list) and any(
                a in SUPPORTED_ARCHITECTURES for a in architectures)):
            problems.append(f"config.json: architectures is {architectures!r}, expected a "
                            f"list naming one of {list(SUPPORTED_ARCHITECTURES)}")
    index = next((path / i for i in _WEIGHT_INDEXES if (path / i).is_file()), None)
    if index is not None:
        data = _read_json(index, problems)
        shards = sorted(set((data or {}).get("weight_map", {}).values()))
        if data is not None and not shards:
            problems.append(f"{index.name}: its weight_map lists no weight files")
        absent = [shard for shard in shards if not (path / shard).is_file()]
        if absent:
            problems.append(f"weights: {len(absent)} of the {len(shards)} files {index.name} "
                            f"lists, e.g. {absent[0]}")
    elif not any((path / w).is_file() for w in _WEIGHT_FILES):
        problems.append("weights (model.safetensors, or model-*.safetensors with "
                        "model.safetensors.index.json)")
    if not (path / "tokenizer.json").is_file() and not (
            (path / "vocab.json").is_file() and (path / "merges.txt").is_file()):
        problems.append("the tokenizer (tokenizer.json, or vocab.json + merges.txt)")
    if not (path / "tokenizer_config.json").is_file():
        problems.append("tokenizer_config.json")
    else:
        text = "".join(
            (path / name).read_text(errors="replace")
            for name in ("tokenizer.json", "tokenizer_config.json", "added_tokens.json",
                         "special_tokens_map.json")
            if (path / name).is_file())
        absent = [t for t in QWEN_SPECIAL_TOKENS if t not in text]
        if absent:
            problems.append("Qwen's special tokens in the tokenizer: " + ", ".join(absent))
        # The chat is encoded with the checkpoint's own template (rlfleet.policy.chat),
        # which the tokenizer loads from one of these two places.
        tokenizer_config = _read_json(path / "tokenizer_config.json", problems) or {}
        if not (path / "chat_template.jinja").is_file() and \
                not tokenizer_config.get("chat_template"):
            problems.append("the chat template (chat_template.jinja, or chat_template in "
                            "tokenizer_config.json)")
    preprocessor = path / "preprocessor_config.json"
    if not preprocessor.is_file():
        problems.append("preprocessor_config.json (the image processor: patch_size, "
                        "merge_size)")
    else:
        data = _read_json(preprocessor, problems)
        if data is not None:
            absent = [k for k in ("patch_size", "merge_size") if k not in data]
            if absent:
                problems.append(f"preprocessor_config.json: no {' or '.join(absent)}")
    return problems


def check_checkpoint(path: str | Path) -> Path:
    """``path`` if it is a complete checkpoint; ModelLoadError naming everything that is
    missing otherwise (see `checkpoint_problems`)."""
    path = Path(path)
    problems = checkpoint_problems(path)
    if problems:
        raise ModelLoadError(path, problems)
    return path


def load_processor(path: str | Path) -> PolicyProcessor:
    """The processor (tokenizer + image processor + chat template) saved in ``path``."""
    path = _check_local_dir(Path(path))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path, local_files_only=True)
    return PolicyProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
    )


# The architectures rlfleet trains and serves, by the class name a checkpoint's
# config.json gives in ``architectures``: the chat codec, the mrope positions of
# rlfleet.policy.logprobs and the vision placeholders are Qwen3-VL's.
SUPPORTED_ARCHITECTURES = ("Qwen3VLForConditionalGeneration",)


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture rlfleet cannot train or serve."""


def model_class(path: str | Path) -> type[PreTrainedModel]:
    """The transformers class of the checkpoint in ``path``, chosen as ``AutoModel`` does,
    from ``architectures`` in its config.json, among `SUPPORTED_ARCHITECTURES`."""
    path = _check_local_dir(Path(path))
    config = json.loads((path / "config.json").read_text())
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list):
        raise UnsupportedModelError(f"{path}/config.json: architectures must be a list, "
                                    f"got {architectures!r}")
    for name in architectures:
        if name in SUPPORTED_ARCHITECTURES:
            return getattr(transformers, name)
    raise UnsupportedModelError(
        f"{path}/config.json names architectures {architectures or 'none'} (model_type "
        f"{config.get('model_type')!r}); rlfleet supports {list(SUPPORTED_ARCHITECTURES)}")


def load_policy(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
) -> tuple[PreTrainedModel, PolicyProcessor]:
    """Load ``(model, processor)`` from a local directory, model in eval mode on ``device``.

    ``dtype=None`` keeps the dtype the checkpoint was saved in (float32 for tiny, bf16 for
    the real 8B); pass ``torch.float32`` for exact CPU work.
    """
    path = _check_local_dir(Path(path))
    check_checkpoint(path)  # one clear error naming every missing piece
    model = model_class(path).from_pretrained(
        path, local_files_only=True, dtype=dtype if dtype is not None else "auto"
    )
    model.to(device)
    model.eval()
    return model, load_processor(path)


def stop_token_ids(processor: PolicyProcessor) -> list[int]:
    """Token ids that end an assistant turn: ``<|im_end|>`` only (see ChatCodec)."""
    return [int(processor.tokenizer.convert_tokens_to_ids("<|im_end|>"))]


VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def vision_token_ids(processor: object) -> list[int]:
    """Ids of the vision placeholder tokens, which are outside the policy's action space:
    engines never sample them and every logprob is normalised without them (a generated
    placeholder would break the image positions of every later turn)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    unk = getattr(tokenizer, "unk_token_id", None)
    return sorted({int(i) for i in ids if i is not None and i != unk})
