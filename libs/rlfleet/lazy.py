"""Lazy package exports (PEP 562): `from rlfleet.policy import load_policy` keeps working,
while importing a light submodule of the package (`rlfleet.policy.contexts`, the CLI's
`rlfleet.sft.cli`) no longer imports torch and transformers through the package's
`__init__`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: `exports` maps each public name to the
    submodule that defines it, imported on first access and then cached on the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
