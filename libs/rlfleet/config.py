"""Configuration from a YAML file plus environment variables, into a typed pydantic model.

The one config system of every service and the learner. Precedence, lowest to highest:
model defaults < file < environment < explicit overrides (command-line flags).

The environment names each field `RLFLEET_<FIELD>`, a nested one with `__` between the
levels (`RLFLEET_GRPO__KL_COEF`, `RLFLEET_FLEET__REDIS_URL`), as pydantic-settings reads
them; a list or mapping field takes JSON (`RLFLEET_OPTIM__BETAS='[0.9, 0.95]'`). A model
may also accept a few shorter names a deployment sets for every pod (`aliases`).

Secrets are read from the environment or from a file named by `<NAME>_FILE` (how
Kubernetes mounts Secrets), never from config files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.exceptions import SettingsError

from rlfleet.policy.profiles import known_profile

T = TypeVar("T", bound=BaseModel)
ENV_PREFIX = "RLFLEET_"


class ClosedModel(BaseModel):
    """The base of every configuration and record model: unknown keys are refused, so a
    misspelt field is an error, never silently ignored. A subclass adds to the config
    (``frozen``, ``strict``) and keeps this."""

    model_config = ConfigDict(extra="forbid")


# A policy profile's name as a settings field: any entry of rlfleet.policy.profiles'
# registry (rlfleet's own or a package's), checked when the settings load.
ProfileName = Annotated[str, AfterValidator(known_profile)]


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
    env: Mapping[str, str] | None = None,
    aliases: Mapping[str, str] | None = None,
    what: str | None = None,
) -> T:
    """`model` from defaults, the YAML file at `path`, the environment (`env`, default
    os.environ) and `overrides` (None values are not given), in that order.

    `aliases`: other environment names for dotted fields ({"RLFLEET_REDIS_URL":
    "fleet.redis_url"}), read below the canonical `RLFLEET_FLEET__REDIS_URL` and ignored
    when empty. `what` names the configuration in errors (default: the model's name)."""
    env = dict(os.environ if env is None else env)
    data = read_config_file(path) if path else {}
    for name, dotted in (aliases or {}).items():
        value = env.pop(name, "")
        if value:
            data = merged(data, nested(dotted, value))
    data = merged(data, env_values(model, env))
    data = merged(data, {k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid {what or model.__name__ + ' configuration'}: "
                          f"{validation_summary(exc)}") from exc


EXTENDS_KEY = "extends"


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds, with the files it builds on resolved;
    ConfigError for anything else.

    A file may build on another: `extends: <path>` (relative to the file itself) takes
    that file's settings and lays this file's over them, section by section, so a variant
    states only what differs. Every key an overlay sets must be one its base has: a
    misspelt or misplaced key would otherwise add a setting nobody reads. A chain may be
    as long as it needs, never a cycle."""
    return _resolved(Path(path), ())


def _resolved(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    here = path.resolve()
    if here in chain:
        names = " -> ".join(str(p) for p in (*chain, here))
        raise ConfigError(f"config file {path}: `{EXTENDS_KEY}` forms a cycle ({names})")
    data = _read_mapping(path)
    base_name = data.pop(EXTENDS_KEY, None)
    if base_name is None:
        return data
    if not isinstance(base_name, str) or not base_name.strip():
        raise ConfigError(f"config file {path}: `{EXTENDS_KEY}` must name a file, "
                          f"got {base_name!r}")
    base_path = path.parent / base_name
    if not base_path.is_file():
        raise ConfigError(f"config file {path}: `{EXTENDS_KEY}: {base_name}` names no "
                          f"file ({base_path} does not exist)")
    base = _resolved(base_path, (*chain, here))
    unknown = _keys_not_in(data, base)
    if unknown:
        raise ConfigError(
            f"config file {path} sets {', '.join(unknown)}, which its base {base_path} "
            "does not have: a variant only changes what its base states (add the "
            "setting to the base, or check its spelling and section)")
    return merged(base, data)


def _keys_not_in(top: Mapping[str, Any], base: Mapping[str, Any],
                 prefix: str = "") -> list[str]:
    """The dotted keys of `top` that `base` lacks (a section is compared key by key)."""
    missing = []
    for key, value in top.items():
        name = f"{prefix}{key}"
        if key not in base:
            missing.append(name)
        elif isinstance(value, Mapping) and isinstance(base[key], Mapping):
            missing.extend(_keys_not_in(value, base[key], f"{name}."))
    return missing


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping, "
                          f"got {type(loaded).__name__}")
    return loaded


class _GivenEnv(EnvSettingsSource):
    """pydantic-settings' reading of the environment, over a given mapping (a test's, a
    Ray job's) instead of the process's. It reads the model's fields only, so it works
    for plain models too: no model here reads the environment on construction."""

    def __init__(self, model: type[BaseModel], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(model, case_sensitive=False, env_prefix=ENV_PREFIX,  # type: ignore[arg-type]
                         env_nested_delimiter="__")

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._given.items()}


def env_values(model: type[BaseModel], env: Mapping[str, str]) -> dict[str, Any]:
    """The fields of `model` that `env` sets, nested as the model is (values unparsed,
    except JSON for list and mapping fields)."""
    try:
        return _GivenEnv(model, env)()
    except SettingsError as exc:
        raise ConfigError(
            f"invalid {model.__name__} environment: {exc}: a list, mapping or section "
            f"field takes JSON ({ENV_PREFIX}<FIELD>='...'), a section's own fields "
            f"{ENV_PREFIX}<SECTION>__<FIELD>") from exc


def nested(dotted: str, value: object) -> dict[str, Any]:
    """{"a": {"b": value}} for "a.b"."""
    keys = dotted.split(".")
    tree: dict[str, Any] = {keys[-1]: value}
    for key in reversed(keys[:-1]):
        tree = {key: tree}
    return tree


def merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `top`, mapping by mapping (a nested section is merged, not
    replaced)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


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


def read_token_file(path: str | Path, what: str, remedy: str = "") -> str:
    """The token in the file at `path`, without surrounding whitespace; ConfigError that
    names `what` ("RLFLEET_AUTH_TOKEN_FILE", "Ray token file") when the file cannot be read
    or holds only whitespace (an empty token would turn auth off silently). `remedy` is
    appended to the empty-file error."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"the {what} {path} is empty{remedy}")
    return token


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
        return read_token_file(
            file, f"token file named by {TOKEN_NAME}_FILE",
            "; write the fleet's token into it, or turn auth off explicitly with "
            "--insecure-no-auth (RLFLEET_AUTH=none)")
    if mode == "none":
        return None
    raise ConfigError(
        f"no auth token: set {TOKEN_NAME} (or {TOKEN_NAME}_FILE) to the fleet's shared "
        "token, or turn auth off explicitly with --insecure-no-auth (RLFLEET_AUTH=none, "
        "`auth: none` in a config file)")


# -- TLS of a process's outgoing clients --------------------------------------------------


class ClientTls(ClosedModel):
    """The files a process's outgoing gRPC clients use for TLS: the services' (their
    `tls_*` settings) and the learner's (its `tls` section). The fleet has one CA, so the
    CA that signed the servers defaults to the one that signs client certificates."""

    ca: Path | None = Field(None, description="the CA that signed the servers this process "
                            "calls (default: client_ca, the fleet's one CA); none: plaintext")
    client_ca: Path | None = Field(None, description="the fleet's client CA, the servers' "
                                   "CA when ca is not set")
    cert: Path | None = Field(None, description="this process's client certificate (with key)")
    key: Path | None = Field(None, description="the key of cert")
    ip_server_name: str | None = Field(
        None, description="the name to check on a server called at an IP address (rollout "
        "replicas register their pod address, which no certificate names; the chart sets the "
        "rollout Service's name); none: the address itself")

    def options(self) -> dict[str, Any] | None:
        """The `tls=` options of `rlfleet.clients`; None without a CA (plaintext). A
        certificate without its key (or the reverse) is passed on, for the channel to
        refuse (rpc.tls.TlsFileError), never dropped into a call without one."""
        ca = self.ca or self.client_ca
        if ca is None:
            return None
        tls: dict[str, Any] = {"ca_file": ca}
        if self.cert:
            tls["cert_file"] = self.cert
        if self.key:
            tls["key_file"] = self.key
        if self.ip_server_name:
            tls["ip_server_name"] = self.ip_server_name
        return tls
