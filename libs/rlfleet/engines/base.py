"""The inference-engine interface every rollout backend implements (hf, vllm).

An engine hosts one base policy plus any number of named LoRA adapters and turns
batches of already-tokenised prompts (with their images) into sampled continuations.

Conventions every implementation follows, so trajectories from any engine train the
same way:

* Prompts arrive as token ids with the vision placeholders already expanded: each image
  appears as ``<|vision_start|>`` + N x ``<|image_pad|>`` + ``<|vision_end|>`` where N is
  the number of merged patches of that image (``rlfleet.policy.ChatCodec`` produces this).
  ``images`` lists the PIL images in the order their placeholders occur. Engines never
  re-apply a chat template and never resize the images.
* Stopping: generation ends when the model emits ``<|im_end|>`` (the end of an assistant
  turn; the token IS included in ``token_ids`` and in ``logprobs``; ``finish_reason ==
  "stop"``) or after ``max_new_tokens`` tokens (``finish_reason == "length"``).
* Logprobs: one float per generated token, the log-probability of that token under the
  sampling distribution *before* truncation:
    - temperature T > 0: ``log_softmax(logits / T)[token]``. top-k / top-p restrict what
      may be sampled but are NOT applied to the recorded value (the learner recomputes
      exactly this quantity with ``rlfleet.policy.sequence_logprobs``);
    - greedy (T == 0): ``log_softmax(logits)[token]`` (i.e. T = 1 scoring of the argmax).
* The action space excludes the vision placeholders (``<|vision_start|>``,
  ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``; ``vision_token_ids``): they are
  never sampled, and the softmax above is taken over the remaining vocabulary, by the
  engines and by ``sequence_logprobs`` alike. A generated placeholder would break the
  image positions of every later turn.
* Reproducibility: a request with its own ``GenerationRequest.seed`` is sampled from
  that seed; otherwise, with ``SamplingConfig.seed`` set, request i of a batch is sampled
  as if seeded with ``seed + i``. Either way the same engine, requests, params and
  adapter give the same tokens, and the result of one request does not depend on the
  batch it rides in (up to floating-point differences from padding), so requests with
  their own seeds can share any batch.
* Adapters: ``adapter=None`` means the base model with every adapter disabled.
  ``load_adapter(name, path)`` reads a PEFT LoRA directory (``adapter_config.json`` +
  ``adapter_model.safetensors``); loading an existing name again replaces it in place.
* Health: ``check_health()`` raises ``EngineDead`` once the engine can serve nothing
  more, and ``generate`` and adapter loads then raise ``EngineDead`` (not a plain
  ``EngineError``), so a caller tells a dead engine from a request it refused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image

from rlfleet.policy.loading import vision_token_ids

__all__ = ["Engine", "EngineDead", "EngineError", "Generation", "GenerationRequest",
           "SamplingConfig", "request_seed", "vision_token_ids"]

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingConfig:
    """How to sample. ``temperature == 0`` means greedy; ``top_k == 0`` means no top-k."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    """One prompt: token ids with image placeholders expanded, its images in order, and
    optionally its own sampling seed."""

    prompt_ids: list[int]
    images: list[Image.Image] = field(default_factory=list)
    seed: int | None = None


def request_seed(params: SamplingConfig, index: int, request: GenerationRequest) -> int | None:
    """The seed request ``index`` of a batch is sampled with (None: unseeded)."""
    if request.seed is not None:
        return int(request.seed)
    return None if params.seed is None else int(params.seed) + index


@dataclass
class Generation:
    """The continuation of one request. ``logprobs`` is parallel to ``token_ids``."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason


class EngineError(RuntimeError):
    """An engine cannot do what was asked (unknown adapter, bad request, ...)."""


class EngineDead(EngineError):
    """The engine can serve nothing any more (its worker or engine process died, or it
    reports itself dead, or it was closed): only a new engine, i.e. a restarted replica,
    serves again."""


class Engine(ABC):
    """A policy host. Implementations must be usable from one thread at a time."""

    name: str

    @abstractmethod
    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingConfig,
        adapter: str | None = None,
    ) -> list[Generation]:
        """Sample one continuation per request (batched); results in request order.

        Raises ``EngineError`` for an adapter that is not loaded.
        """

    @abstractmethod
    def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) the LoRA adapter in directory ``path`` under ``name``."""

    @abstractmethod
    def unload_adapter(self, name: str) -> None:
        """Forget adapter ``name``. Raises ``EngineError`` if it is not loaded."""

    @abstractmethod
    def check_health(self) -> None:
        """Returns while the engine can serve; raises ``EngineDead`` (naming why) once it
        cannot. Cheap and safe to call from any thread, at any time."""

    @property
    def adapters(self) -> list[str]:
        """Names of the loaded adapters (implementations override when they can)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Release the model and any workers; the engine is unusable afterwards."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
