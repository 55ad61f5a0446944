"""Argparse helpers of the `rlfleet` command, importable without any heavy library.

Registering a sub-command must cost nothing (`rlfleet health` is a readiness probe with a
5 s budget), yet a flag's choices and default belong where the library defines them (a
settings model, `rlfleet.policy.contexts.CONTEXTS`, ...), which may import pydantic or
torch. So choices and shown defaults are *deferred*: read from their definition the first
time argparse needs them (to check a value given for that flag, or to print its help).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# A settings model named without importing it: "package.module:ClassName".
SettingsRef = str

# what --log-level takes: the logging module's level names
LOG_LEVELS = tuple(logging.getLevelNamesMapping())


class Deferred(Sequence[str]):
    """A sequence of names loaded on first use (argparse only iterates `choices` and tests
    membership, when the flag is given or its help is printed)."""

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._names: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(str(n) for n in self._load())
        return self._names

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __repr__(self) -> str:
        return repr(list(self._get()))


def attribute(ref: str) -> Any:
    """The object that `"package.module:NAME"` names (imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def field_choices(settings: SettingsRef | type, field: str) -> Deferred:
    """Choices from the `Literal[...]` type of a settings model's field, read on use."""
    def load() -> Sequence[str]:
        annotation = _model(settings).model_fields[field].annotation
        choices = typing.get_args(annotation)
        if typing.get_origin(annotation) is not typing.Literal or not choices:
            raise TypeError(f"{settings}.{field} is not a Literal of names")
        return choices

    return Deferred(load)


def _model(settings: SettingsRef | type) -> Any:
    return attribute(settings) if isinstance(settings, str) else settings


def _field_default(settings: SettingsRef | type, field: str) -> object:
    info = _model(settings).model_fields[field]
    if info.default_factory is not None:
        return info.default_factory()
    return info.default


def field_description(settings: SettingsRef | type, field: str) -> str:
    """The description of a settings model's field, written once on the model
    (`Field(description=...)`); a subclass that only changes the default (a service's
    port) keeps its base's."""
    for cls in _model(settings).__mro__:
        info = getattr(cls, "model_fields", {}).get(field)
        if info is not None and info.description:
            return info.description
    return ""


# argparse prints a flag's help only when it has some: a placeholder until it is shown
_DESCRIBED = "(the settings field's description)"


def add_setting(
    parser: argparse.ArgumentParser,
    flag: str,
    settings: SettingsRef | type,
    help: str | None = None,  # noqa: A002 - argparse's own name for it
    **kwargs: Any,
) -> argparse.Action:
    """A flag that overrides one field of a settings model (`--max-batch` -> `max_batch`).

    Its argparse default stays None, so a flag that is not given leaves the value of
    --config / RLFLEET_<KEY> / the model in place; its help shows the model's default and,
    unless `help` is given, the field's description (read when the help is printed)."""
    field = kwargs.pop("dest", None) or flag.lstrip("-").replace("-", "_")
    action = parser.add_argument(flag, dest=field, default=None, help=help or _DESCRIBED,
                                 **kwargs)
    action.shown_default = lambda: _field_default(settings, field)  # type: ignore[attr-defined]
    if help is None:
        action.described = lambda: field_description(settings, field)  # type: ignore[attr-defined]
    return action


def address(text: str) -> str:
    """An argparse type: HOST:PORT (or [IPv6]:PORT) with a port in 1..65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or host in ("[]",):
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise argparse.ArgumentTypeError(f"not HOST:PORT (write IPv6 as [ADDR]:PORT): {text!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (1-65535) in {text!r}: {port!r}")
    return text


def optional_address(text: str) -> str:
    """An argparse type: HOST:PORT, or '' where a setting's '' means none."""
    return text if text == "" else address(text)


def directory(text: str) -> Path:
    """An argparse type: an existing directory (a model, the runs root, ...)."""
    path = Path(text).expanduser()
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise argparse.ArgumentTypeError(f"{what}: {text}")
    return path


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def setting_assignment(text: str) -> tuple[str, str]:
    """An argparse type: KEY=VALUE, KEY a field of the settings, a nested one dotted
    (`grpo.kl_coef=0.01`); VALUE is read as YAML when the settings load."""
    key, sep, value = text.partition("=")
    if not sep or not key or not all(part.isidentifier() for part in key.split(".")):
        raise argparse.ArgumentTypeError(
            f"not KEY=VALUE (KEY a field, nested ones dotted: grpo.kl_coef=0.01): {text!r}")
    return key, value


def add_set_flag(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE`, repeatable: any field of the settings model, the ones without a
    flag of their own included (`load_config`'s overrides, above file and environment)."""
    parser.add_argument("--set", dest="set_values", action="append", default=[],
                        type=setting_assignment, metavar="KEY=VALUE",
                        help="set any field of the settings, nested ones dotted "
                             "(grpo.kl_coef=0.01; VALUE is YAML: 0.5, true, [0.9, 0.95]); "
                             "repeatable; above --config and RLFLEET_<KEY> (default: none)")


def assignments(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The nested overrides that `--set` pairs name; VALUE parsed as YAML ("" stays "")."""
    import yaml

    from rlfleet.config import merged, nested

    out: dict[str, Any] = {}
    for key, text in pairs:
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            value = text  # a plain string that YAML cannot read stays as written
        out = merged(out, nested(key, value))
    return out


def one_line(message: object) -> str:
    """A multi-line error (a heading, then "  - item" lines) as one line for a command's
    exit message: "heading item; item"."""
    head, *items = [line.strip() for line in str(message).splitlines() if line.strip()]
    rest = "; ".join(item.removeprefix("- ") for item in items)
    return f"{head} {rest}" if rest else head


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every flag's default: the argparse default, or for a settings flag the
    model's; help that already says its default is left as written."""

    def _metavar_formatter(self, action: argparse.Action,
                           default_metavar: str | None) -> Callable[[int], tuple[str, ...]]:
        if default_metavar is None and isinstance(action.choices, Deferred):
            # add_argument's own check that metavar fits nargs (the only caller without a
            # default metavar): it must not load the deferred names
            return lambda size: (action.dest,) * size
        return super()._metavar_formatter(action, default_metavar)

    def _get_help_string(self, action: argparse.Action) -> str:
        described = getattr(action, "described", None)
        text = described().replace("%", "%%") if described is not None else action.help or ""
        if "default" in text.lower() or action.default is argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text  # a required positional has no default
        shown = getattr(action, "shown_default", None)
        default = shown() if shown is not None else action.default
        if isinstance(default, str) and default == "":
            default = "''"
        if default is None:
            default = "none"
        return f"{text} (default: {str(default).replace('%', '%%')})"


class DocHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """HelpFormatter that prints the description as written (a command's module
    docstring, paragraphs and all)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults and whose errors are one line;
    sub-parsers inherit its class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        # one line, not the usage block: a probe's log or a pod's events show all of it
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def add_common_args(parser: argparse.ArgumentParser, settings: SettingsRef | type) -> None:
    """The flags every service has; `settings` is its ServiceSettings subclass (or where it
    is defined), whose defaults (ports, ...) the help shows."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML settings file (env RLFLEET_<KEY> overrides it, flags "
                             "override both; default: none)")
    add_set_flag(parser)
    add_setting(parser, "--host", settings)  # help: the fields' descriptions
    add_setting(parser, "--port", settings, type=int)
    add_setting(parser, "--metrics-port", settings, type=int)
    add_setting(parser, "--log-level", settings, type=str.upper, choices=LOG_LEVELS)
    parser.add_argument("--insecure-no-auth", dest="auth", action="store_const", const="none",
                        default=None,
                        help="serve without the shared token (default: the token "
                             "RLFLEET_AUTH_TOKEN[_FILE] is required)")


def add_learner_args(parser: argparse.ArgumentParser) -> None:
    """The flags of `rlfleet learner run` that set its config (rlfleet.learner_config:
    `flag_overrides` reads them), above the file and the environment."""
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="learner YAML (see configs/)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps to train (default: the config's)")
    parser.add_argument("--run", default=None, help="run name (default: the config's)")
    add_set_flag(parser)
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="Prometheus port, metrics.port (above RLFLEET_METRICS_PORT; "
                             "default: the config's, else no endpoint)")
    parser.add_argument("--metrics-host", default=None,
                        help="address of the metrics endpoint, metrics.host (above "
                             "RLFLEET_HOST; default: the config's, 127.0.0.1)")
