"""Configuration from a YAML file plus environment variables, into a typed pydantic model.

Precedence, lowest to highest: model defaults < file < environment (`RLFLEET_<FIELD>`)
< explicit overrides (command-line flags). Secrets are read from the environment or from
a file named by `<NAME>_FILE` (how Kubernetes mounts Secrets), never from config files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)
ENV_PREFIX = "RLFLEET_"


class ConfigError(ValueError):
    """A configuration file or value is invalid."""


def load_config(
    model: type[T],
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> T:
    env = dict(os.environ if env is None else env)
    data: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            kind = type(loaded).__name__
            raise ConfigError(f"config file {path} must hold a mapping, got {kind}")
        data.update(loaded)
    for name in model.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in env:
            data[name] = env[key]
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid {model.__name__} configuration:\n{exc}") from exc


def read_secret(name: str, env: dict[str, str] | None = None) -> str | None:
    """The secret `name` from the environment, or from the file named by `name`_FILE."""
    env = dict(os.environ if env is None else env)
    if env.get(name):
        return env[name]
    file = env.get(f"{name}_FILE")
    if file:
        try:
            return Path(file).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read secret file for {name}: {exc.strerror}") from exc
    return None
