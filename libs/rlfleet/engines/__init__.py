"""Inference engines that host the policy for rollouts: ``hf`` (transformers, CPU/GPU)
and ``vllm``. All implement :class:`rlfleet.engines.base.Engine`; `ENGINES` finds an
engine's class by name (importing its module only then: ``vllm`` exists only in the vLLM
environment)."""

from collections.abc import Callable
from importlib import import_module

from rlfleet.engines.base import (
    Engine,
    EngineDead,
    EngineError,
    FinishReason,
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from rlfleet.registries import Registry


def _is_engine_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Engine)


def _engine_class(module: str, name: str) -> Callable[[], type[Engine]]:
    return lambda: getattr(import_module(module), name)


ENGINES: Registry[type[Engine]] = Registry("engine", is_kind=_is_engine_class,
                                           name_of=lambda cls: cls.name)
ENGINES.add("hf", _engine_class("rlfleet.engines.hf", "HFEngine"))
ENGINES.add("vllm", _engine_class("rlfleet.engines.vllm", "VLLMEngine"))

__all__ = [
    "ENGINES",
    "Engine",
    "EngineDead",
    "EngineError",
    "FinishReason",
    "Generation",
    "GenerationRequest",
    "SamplingConfig",
]
