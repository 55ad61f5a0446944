"""The policy: the tiny Qwen3-VL profile, loading, chat encoding and sequence logprobs.

- ``ensure_tiny_model(cache_dir)`` / ``build_tiny_model(out_dir, seed)``: the ``tiny``
  profile, built locally (no downloads).
- ``load_policy(path) -> (model, processor)``: a tiny directory or a real Qwen3-VL
  checkpoint (``qwen3-vl-8b`` profile), local files only.
- ``ChatCodec`` / ``Transcript``: OpenAI-style messages -> one multi-turn token sequence
  (prompt, turn, observation delta, turn, ...) with a loss mask on generated tokens.
- ``sequence_logprobs``: per-token logprobs of whole sequences with images, one pass.
"""

from rlfleet.lazy import lazy_exports

# each public name -> the submodule that defines it, imported on first use
_EXPORTS = {
    "ChatCodec": "rlfleet.policy.chat",
    "ChatFormatError": "rlfleet.policy.chat",
    "Encoded": "rlfleet.policy.chat",
    "ModelBatch": "rlfleet.policy.logprobs",
    "PIXELS_PER_TOKEN": "rlfleet.policy.tiny",
    "SERVING_PROFILES": "rlfleet.policy.profiles",
    "ServingProfile": "rlfleet.policy.profiles",
    "PolicyProcessor": "rlfleet.policy.loading",
    "TinySpec": "rlfleet.policy.tiny",
    "Transcript": "rlfleet.policy.chat",
    "build_tiny_model": "rlfleet.policy.tiny",
    "collate": "rlfleet.policy.logprobs",
    "ensure_tiny_model": "rlfleet.policy.tiny",
    "forward_logits": "rlfleet.policy.logprobs",
    "image_from_part": "rlfleet.policy.chat",
    "image_to_data_url": "rlfleet.policy.chat",
    "load_policy": "rlfleet.policy.loading",
    "load_processor": "rlfleet.policy.loading",
    "mrope_positions": "rlfleet.policy.logprobs",
    "resolve_model_dir": "rlfleet.policy.profiles",
    "sequence_logprobs": "rlfleet.policy.logprobs",
    "stop_token_ids": "rlfleet.policy.loading",
    "token_logprobs": "rlfleet.policy.logprobs",
    "unwrap": "rlfleet.policy.logprobs",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
