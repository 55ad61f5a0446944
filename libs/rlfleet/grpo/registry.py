"""A tiny name -> function registry, the extension point for GRPO variants.

Modelled on SkyRL's ``AdvantageEstimatorRegistry`` / ``PolicyLossRegistry`` but local to the
process: a new variant is one function plus a ``@register_...("name")`` decorator in a module
that the learner imports. (SkyRL also mirrors its registries into a Ray actor; our learner
imports the same modules in every worker, so plain module state is enough.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """Functions of one kind, looked up by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register ``func`` under ``name``; a duplicate name is an error."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(func: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._functions[name] = func
            return func

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered: {sorted(self._functions)}"
            ) from None

    def unregister(self, name: str) -> None:
        """Remove a registered function (for tests and plugins that replace one)."""
        if name not in self._functions:
            raise ValueError(f"{self.kind} {name!r} is not registered")
        del self._functions[name]

    def names(self) -> list[str]:
        return sorted(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions
