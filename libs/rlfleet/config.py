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


def validation_summary(exc: ValidationError) -> str:
    """A pydantic error in one line, every problem named by its field: what an operator
    reads in a pod's events or a probe's log (pydantic's own text spans several lines)."""
    problems = []
    for error in exc.errors():
        msg = error["msg"].removeprefix("Value error, ")  # a validator's own ValueError
        if not error["loc"]:  # a check of the whole model: its input is the whole config
            problems.append(msg)
            continue
        given = repr(error.get("input"))
        given = given if len(given) <= 60 else given[:57] + "..."
        problems.append(f"{'.'.join(str(p) for p in error['loc'])}: {msg} (got {given})")
    return "; ".join(problems)


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
        raise ConfigError(f"invalid {model.__name__} configuration: "
                          f"{validation_summary(exc)}") from exc


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


# -- the fleet's shared token ------------------------------------------------------------

TOKEN_NAME = "RLFLEET_AUTH_TOKEN"
AUTH_MODES = ("token", "none")


def fleet_token(auth: str | None = None, env: dict[str, str] | None = None) -> str | None:
    """The fleet's shared gRPC token, or None where auth is explicitly off.

    From RLFLEET_AUTH_TOKEN, else the file named by RLFLEET_AUTH_TOKEN_FILE. An empty token
    (the variable set to "" or whitespace, a file holding only a newline) is refused: it
    used to turn auth off silently. Without any token the service refuses to start unless
    auth is turned off explicitly: `auth` "none" (the `--insecure-no-auth` flag, `auth:
    none` in a config file, or RLFLEET_AUTH=none; `auth` None reads RLFLEET_AUTH). A
    token that is given always turns auth on, whatever `auth` says.
    """
    env = dict(os.environ if env is None else env)
    mode = (auth if auth is not None else env.get("RLFLEET_AUTH", "token")).strip().lower()
    if mode not in AUTH_MODES:
        raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, got {mode!r}")
    file = env.get(f"{TOKEN_NAME}_FILE")
    if TOKEN_NAME in env and (env[TOKEN_NAME] or not file):
        token = env[TOKEN_NAME].strip()
        if not token:
            raise ConfigError(
                f"{TOKEN_NAME} is set but empty; give the fleet's token, or turn auth off "
                "explicitly with --insecure-no-auth (RLFLEET_AUTH=none) and unset it")
        return token
    if file:
        try:
            token = Path(file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {TOKEN_NAME}_FILE: {exc.strerror}") from exc
        if not token:
            raise ConfigError(
                f"the token file named by {TOKEN_NAME}_FILE ({file}) is empty; write the "
                "fleet's token into it, or turn auth off explicitly with --insecure-no-auth "
                "(RLFLEET_AUTH=none)")
        return token
    if mode == "none":
        return None
    raise ConfigError(
        f"no auth token: set {TOKEN_NAME} (or {TOKEN_NAME}_FILE) to the fleet's shared "
        "token, or turn auth off explicitly with --insecure-no-auth (RLFLEET_AUTH=none, "
        "`auth: none` in a config file)")
