"""The bookkeeping of an engine's loaded LoRA adapters, shared by every engine: the
public names callers use, each mapped to the engine's own handle (PEFT's internal adapter
name for ``hf``, a ``LoRARequest`` for ``vllm``), and a fresh id for every load, so a
reload never reuses the handle of the version it replaces (a failed reload leaves the old
version serving; vLLM's prefix cache, keyed by LoRA name, never mixes two versions)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Generic, TypeVar

from rlfleet.engines.base import Engine, EngineDead, EngineError
from rlfleet.storage.adapter_versions import ADAPTER_CONFIG_FILE

H = TypeVar("H")


def check_adapter_dir(path: str | Path) -> Path:
    """`path` as a Path if it holds a PEFT LoRA adapter; EngineError otherwise."""
    p = Path(path)
    if not (p / ADAPTER_CONFIG_FILE).is_file():
        raise EngineError(f"{path}: not a LoRA adapter directory (no {ADAPTER_CONFIG_FILE})")
    return p


class LoadedAdapters(Generic[H]):
    """Public adapter name -> the engine's handle. Not locked: the engine calls it under
    the lock that serialises its loads and unloads."""

    def __init__(self, first_id: int = 0) -> None:
        self._handles: dict[str, H] = {}
        self._ids = itertools.count(first_id)

    def next_id(self) -> int:
        """An id no earlier load got (for the handle of the load about to start)."""
        return next(self._ids)

    def names(self) -> list[str]:
        return sorted(self._handles)

    def handles(self) -> list[H]:
        """The handles, in the order their names were first loaded."""
        return list(self._handles.values())

    def __contains__(self, name: object) -> bool:
        return name in self._handles

    def __len__(self) -> int:
        return len(self._handles)

    def handle(self, name: str) -> H:
        """The handle of `name`; EngineError naming the loaded ones if it is not loaded."""
        try:
            return self._handles[name]
        except KeyError:
            raise EngineError(
                f"adapter {name!r} is not loaded (loaded: {self.names()})") from None

    def install(self, name: str, handle: H) -> H | None:
        """`handle` now serves `name`; the handle it replaces (for the engine to drop)."""
        old = self._handles.get(name)
        self._handles[name] = handle
        return old

    def pop(self, name: str) -> H:
        """Forgets `name`; its handle (for the engine to drop). EngineError if not loaded."""
        handle = self.handle(name)
        del self._handles[name]
        return handle

    def clear(self) -> None:
        self._handles.clear()


class AdapterEngine(Engine):
    """An engine that serves LoRA adapters by name: what `hf` and `vllm` share. The
    subclass sets ``_adapters`` (its `LoadedAdapters`) and ``_closed`` in ``__init__``."""

    _adapters: LoadedAdapters[Any]
    _closed: bool

    @property
    def adapters(self) -> list[str]:
        return self._adapters.names()

    def check_health(self) -> None:
        """Alive until closed (an engine whose work runs in this process: what could
        die is the caller's thread, which its caller watches); `vllm` also asks its
        engine core."""
        self._check_open()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineDead("engine is closed")
