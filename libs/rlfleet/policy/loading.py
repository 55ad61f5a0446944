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
from PIL import Image
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

PROFILES = ("tiny", "qwen3-vl-8b")


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


def load_policy(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
) -> tuple[Qwen3VLForConditionalGeneration, PolicyProcessor]:
    """Load ``(model, processor)`` from a local directory, model in eval mode on ``device``.

    ``dtype=None`` keeps the dtype the checkpoint was saved in (float32 for tiny, bf16 for
    the real 8B); pass ``torch.float32`` for exact CPU work.
    """
    path = _check_local_dir(Path(path))
    config = json.loads((path / "config.json").read_text())
    if config.get("model_type") != "qwen3_vl":
        raise ValueError(f"{path}: model_type {config.get('model_type')!r}, expected 'qwen3_vl'")
    model = Qwen3VLForConditionalGeneration.from_pretrained(
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
