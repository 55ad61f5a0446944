"""The policy: the tiny Qwen3-VL profile, loading, chat encoding and sequence logprobs.

- ``ensure_tiny_model(cache_dir)`` / ``build_tiny_model(out_dir, seed)``: the ``tiny``
  profile, built locally (no downloads).
- ``load_policy(path) -> (model, processor)``: a tiny directory or a real Qwen3-VL
  checkpoint (``qwen3-vl-8b`` profile), local files only.
- ``ChatCodec`` / ``Transcript``: OpenAI-style messages -> one multi-turn token sequence
  (prompt, turn, observation delta, turn, ...) with a loss mask on generated tokens.
- ``sequence_logprobs``: per-token logprobs of whole sequences with images, one pass.
"""

from rlfleet.policy.chat import (
    ChatCodec,
    ChatFormatError,
    Encoded,
    Transcript,
    image_from_part,
    image_to_data_url,
)
from rlfleet.policy.loading import (
    PROFILES,
    PolicyProcessor,
    load_policy,
    load_processor,
    stop_token_ids,
)
from rlfleet.policy.logprobs import (
    ModelBatch,
    collate,
    forward_logits,
    mrope_positions,
    sequence_logprobs,
    token_logprobs,
    unwrap,
)
from rlfleet.policy.profiles import resolve_model_dir
from rlfleet.policy.tiny import PIXELS_PER_TOKEN, TinySpec, build_tiny_model, ensure_tiny_model

__all__ = [
    "PIXELS_PER_TOKEN",
    "PROFILES",
    "ChatCodec",
    "ChatFormatError",
    "Encoded",
    "ModelBatch",
    "PolicyProcessor",
    "TinySpec",
    "Transcript",
    "build_tiny_model",
    "collate",
    "ensure_tiny_model",
    "forward_logits",
    "image_from_part",
    "image_to_data_url",
    "load_policy",
    "load_processor",
    "mrope_positions",
    "resolve_model_dir",
    "sequence_logprobs",
    "stop_token_ids",
    "token_logprobs",
    "unwrap",
]
