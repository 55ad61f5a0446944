"""Vision-tower outputs computed once per distinct image.

LoRA adapts the language model only, so the vision tower (and its merger) is frozen for
the engines and for the learner: an image's features are a pure function of its pixels.
A maze frame is a pure function of (maze, agent cell), and the G episodes of a group walk
the same maze, so the same frames come back turn after turn and step after step. On the
tiny policy the tower is about half of a forward pass over a frame_only prompt; this
module runs it once per distinct frame and keeps the result in a bounded LRU cache.

Items are PIL images or PNG bytes. PNG bytes are keyed by their sha256 and decoded only
on a miss (the learner gets frames as PNGs from the trajectories); PIL images are keyed
by a hash of their pixels.

Only valid while no vision parameter trains: :func:`vision_is_frozen` says so, and
callers that train the tower must not use a cache.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from rlfleet.policy.loading import PolicyProcessor

ImageLike = Image.Image | bytes

DEFAULT_MAX_BYTES = 256 << 20  # ~5,000 tiny-model frames, ~160 8B frames at 225 px


@dataclass(frozen=True)
class VisionFeatures:
    """What the language model takes from one image."""

    grid: tuple[int, int, int]  # (t, h, w) patch grid, before the spatial merge
    embeds: torch.Tensor  # (tokens, hidden): one row per <|image_pad|> of the image
    deepstack: tuple[torch.Tensor, ...]  # (tokens, hidden) per deepstack layer

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embeds, *self.deepstack))


def image_key(item: ImageLike) -> bytes:
    """A content key: sha256 of PNG bytes, or of a PIL image's mode, size and pixels."""
    if isinstance(item, bytes | bytearray | memoryview):
        return b"png:" + hashlib.sha256(item).digest()
    h = hashlib.sha256(f"{item.mode}:{item.size}".encode())
    h.update(item.tobytes())
    return b"pil:" + h.digest()


def as_image(item: ImageLike) -> Image.Image:
    if isinstance(item, Image.Image):
        return item
    with Image.open(io.BytesIO(item)) as img:
        return img.convert("RGB")


def vision_is_frozen(model: torch.nn.Module) -> bool:
    """True when no parameter of the vision tower (or a LoRA inside it) trains."""
    return not any(p.requires_grad for name, p in model.named_parameters() if ".visual." in name
                   or name.startswith("visual."))


def encoder_outputs(features: Sequence[VisionFeatures]) -> dict:
    """``mm_encoder_outputs`` for Qwen3-VL's forward, in the order of ``features``."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import (
        BaseModelOutputWithDeepstackFeatures,
    )

    layers = len(features[0].deepstack) if features else 0
    return {"image": BaseModelOutputWithDeepstackFeatures(
        pooler_output=tuple(f.embeds for f in features),
        deepstack_features=[tuple(f.deepstack[k] for f in features) for k in range(layers)],
    )}


class VisionEncoder:
    """The frozen vision tower of ``model`` behind an LRU cache bounded in bytes.

    Thread-safe; misses of one call are computed in one batched pass without gradients.
    """

    def __init__(self, model: torch.nn.Module, processor: PolicyProcessor, *,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        get_base = getattr(model, "get_base_model", None)
        self._model = get_base() if callable(get_base) else model  # ...ForConditionalGeneration
        self.processor = processor
        self.max_bytes = max_bytes
        self._cache: OrderedDict[bytes, VisionFeatures] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._bytes = 0

    def encode(self, items: Sequence[ImageLike],
               keys: Sequence[bytes] | None = None) -> list[VisionFeatures]:
        """The features of every item, in order (computing the misses once each);
        ``keys``: the items' :func:`image_key`, where the caller has them already."""
        keys = [image_key(item) for item in items] if keys is None else list(keys)
        out: dict[bytes, VisionFeatures] = {}
        with self._lock:
            for key in keys:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    out[key] = hit
        missing: dict[bytes, ImageLike] = {}
        for key, item in zip(keys, items, strict=True):
            if key not in out and key not in missing:
                missing[key] = item
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            computed = self._compute([as_image(i) for i in missing.values()])
            with self._lock:
                for key, feats in zip(missing, computed, strict=True):
                    out[key] = feats
                    self._store(key, feats)
        return [out[key] for key in keys]

    def _store(self, key: bytes, feats: VisionFeatures) -> None:
        if feats.nbytes > self.max_bytes:
            return
        if key in self._cache:
            return
        self._cache[key] = feats
        self._bytes += feats.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.nbytes

    @torch.no_grad()
    def _compute(self, images: list[Image.Image]) -> list[VisionFeatures]:
        model = self._model
        device = next(model.parameters()).device
        px = self.processor.image_processor(images=images, return_tensors="pt")
        grid = px["image_grid_thw"].to(device)
        vision = model.model.get_image_features(px["pixel_values"].to(device), grid,
                                                return_dict=True)
        deep = vision.deepstack_features or []
        return [
            VisionFeatures(
                grid=tuple(int(x) for x in grid[i].tolist()),
                embeds=vision.pooler_output[i].detach(),
                deepstack=tuple(layer[i].detach() for layer in deep),
            )
            for i in range(len(images))
        ]
