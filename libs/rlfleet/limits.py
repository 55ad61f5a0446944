"""Size bounds for everything that crosses the network.

The transport caps a whole message (MAX_MESSAGE_BYTES); the services check the fields
below so that one huge field is refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED and a
clear message instead of an out-of-memory or a slow death.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one gRPC message, either direction
MAX_BATCH = 1024  # items in one batched env/reward call
MAX_ACTION_TEXT_BYTES = 8 * 1024  # one policy answer
MAX_TASK_NAME_BYTES = 64
MAX_EPISODE_ID_BYTES = 64
MAX_SEED = 2**53 - 1
MIN_GRID, MAX_GRID = 5, 63
MAX_TURNS = 1000
MAX_CELL_PX = 64
MAX_GROUP_SIZE = 64
MAX_NEW_TOKENS = 4096
MAX_IDEMPOTENCY_KEY_BYTES = 128
MAX_TRAJECTORY_TOKENS = 65536
MAX_RUN_NAME_BYTES = 64
MAX_REPLICAS = 1024
MAX_WAIT_S = 3600.0

# Images entering a replica (an env's observations, a chat's image parts), checked from
# the header before a pixel is decoded. The largest frame rlfleet's maze renders is
# MAX_GRID x MAX_CELL_PX = 4032 px square (16.3 M pixels, a few hundred KB of PNG);
# VisGym's frames, which the 8B profile serves, are 225 px square (9 x 9 at 25 px, 15 a
# prompt): far inside. Beyond these an image costs the replica seconds and gigabytes to
# decode. The rollout service's settings may lower or raise them.
MAX_IMAGE_BYTES = 4 * 1024 * 1024  # one encoded image
MAX_IMAGE_PIXELS = 4096 * 4096  # one decoded image, width x height
MAX_PROMPT_IMAGE_BYTES = 32 * 1024 * 1024  # every image of one prompt, encoded
MAX_PROMPT_IMAGE_PIXELS = 64 * 1024 * 1024  # every image of one prompt, decoded


class InputTooLarge(ValueError):
    """An input over one of these bounds; the message names its size and the bound (a
    gRPC service answers INVALID_ARGUMENT: rlfleet.rpc.interceptors)."""


@dataclass(frozen=True)
class ImageBounds:
    """The image bounds a replica applies (its settings; these defaults otherwise)."""

    image_bytes: int = MAX_IMAGE_BYTES
    image_pixels: int = MAX_IMAGE_PIXELS
    prompt_bytes: int = MAX_PROMPT_IMAGE_BYTES
    prompt_pixels: int = MAX_PROMPT_IMAGE_PIXELS

    def check_image_bytes(self, size: int) -> None:
        if size > self.image_bytes:
            raise InputTooLarge(f"an image of {size} bytes is over the limit of "
                                f"{self.image_bytes} bytes per image")

    def check_image_size(self, width: int, height: int) -> None:
        """The decoded size, read from the header before any pixel is decoded."""
        if width * height > self.image_pixels:
            raise InputTooLarge(f"an image of {width}x{height} = {width * height} pixels is "
                                f"over the limit of {self.image_pixels} pixels per image")

    def check_prompt(self, images: int, size: int, pixels: int) -> None:
        """All the images of one prompt: `size` bytes encoded, `pixels` decoded."""
        if size > self.prompt_bytes:
            raise InputTooLarge(f"a prompt's {images} images of {size} bytes are over the "
                                f"limit of {self.prompt_bytes} bytes per prompt")
        if pixels > self.prompt_pixels:
            raise InputTooLarge(f"a prompt's {images} images of {pixels} pixels are over "
                                f"the limit of {self.prompt_pixels} pixels per prompt")


# Sampling settings each engine serves. vLLM's SamplingParams refuses a temperature above
# 2 (and a top_p outside (0, 1]); transformers samples at any positive temperature, up to
# rlfleet's own bound. rlfleet's vllm engine records the logprobs of the full
# distribution only with top-k and top-p off (rlfleet.engines.vllm.check_sampling).
MAX_TEMPERATURE = {"hf": 5.0, "vllm": 2.0}
MAX_TOP_K = 100_000
TRUNCATION_ENGINES = ("hf",)  # the engines that sample with top_k / top_p < 1


class UnservableSampling(ValueError):
    """A sampling setting an engine does not serve; the message names the setting and
    the bound (a replica answers INVALID_ARGUMENT: rlfleet.rpc.interceptors)."""


def strictest_max_temperature() -> float:
    """The highest temperature every engine rlfleet ships serves."""
    return min(MAX_TEMPERATURE.values())


def check_sampling(engine: str, temperature: float, top_p: float = 1.0, top_k: int = 0
                   ) -> None:
    """UnservableSampling when `engine` (a name of rlfleet.names.ENGINE_NAMES) cannot
    sample with these settings (top_p 0 means 1, top_k 0 no top-k)."""
    high = MAX_TEMPERATURE.get(engine, strictest_max_temperature())
    if not 0.0 <= temperature <= high:  # NaN fails too
        raise UnservableSampling(f"temperature {temperature:g} is outside what the {engine} "
                                 f"engine serves: 0..{high:g}")
    if not 0.0 <= top_p <= 1.0:
        raise UnservableSampling(f"top_p {top_p:g} is outside (0, 1] (0 means 1)")
    if not 0 <= top_k <= MAX_TOP_K:
        raise UnservableSampling(f"top_k {top_k} is outside 0..{MAX_TOP_K} (0: no top-k)")
    top_p = top_p or 1.0
    truncated = temperature > 0 and (top_k > 0 or top_p < 1)
    if truncated and engine not in TRUNCATION_ENGINES:
        raise UnservableSampling(
            f"top_k {top_k} / top_p {top_p:g}: the {engine} engine records logprobs after "
            "top-k/top-p truncation, rlfleet before it: sample with top_k 0 and top_p 1 "
            f"(or use the {' or '.join(TRUNCATION_ENGINES)} engine)")
