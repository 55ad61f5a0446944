"""Inference engines that host the policy for rollouts: ``hf`` (transformers, CPU/GPU)
and ``vllm``. All implement :class:`rlfleet.engines.base.Engine`."""

from rlfleet.engines.base import (
    Engine,
    EngineError,
    FinishReason,
    Generation,
    GenerationRequest,
    SamplingConfig,
)

__all__ = [
    "Engine",
    "EngineError",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "SamplingConfig",
]
