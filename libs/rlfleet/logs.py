"""Structured logs: one JSON object per line on stderr, with the service name.

`setup_logging` makes this the only format a process writes: the root logger's one
handler is the JSON one; warnings (`warnings.warn`) become log records; the loggers of
the libraries a service runs (grpc, ray, urllib3, transformers, peft, vllm, ...) lose the
plain-text handlers they install for themselves and propagate to the root, including a
library imported after set-up; an uncaught exception (main thread or any other) is one
JSON line with its traceback, not a bare traceback on stderr. Progress bars (the Hugging
Face libraries' tqdm bars, e.g. transformers' "Loading weights") are shown on a terminal
only; a log file or a pod's log gets none. vLLM's engine processes (started by vLLM, not
set up here) format their records with the same JSON formatter, through the logging
configuration vLLM reads from VLLM_LOGGING_CONFIG_PATH.

Every line carries the keys in `COMMON_KEYS`; `extra=` fields follow. Values of keys that
look like secrets are redacted, so a token passed by mistake in `extra=` never reaches
the log.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

COMMON_KEYS = ("ts", "level", "service", "logger", "msg")

# Who reads a process's console: "human" (a person at a terminal: short readable lines,
# the JSON lines go to a log file) or "json" (a pod's log, a pipe: JSON lines only).
# Unset, stderr being a terminal decides; a parent whose child's stderr is not the
# terminal it prints on (`make run`) sets it for the child.
# Like a JVM's: the signal that makes a service write every thread's stack to its log
DUMP_STACKS_SIGNAL = signal.SIGQUIT
CONSOLE_ENV = "RLFLEET_CONSOLE"
CONSOLE_MODES = ("human", "json")

# Top-level loggers of libraries that add a handler of their own (transformers, ray and
# vllm do, with propagation off) or may log before anything else is set up.
LIBRARY_LOGGERS = ("grpc", "ray", "urllib3", "transformers", "peft", "vllm", "accelerate",
                   "torch", "httpx", "filelock", "asyncio", "redis", "PIL")

_SECRET_HINTS = ("token", "password", "secret", "authorization", "api_key")
_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


def _redact(key: str, value: Any) -> Any:
    """Text under a key that hints at a secret, masked; a number under such a key is a
    count or a measure (num_loss_tokens, tokens_per_s), never a secret, and stays."""
    if isinstance(value, str | bytes) and any(h in key.lower() for h in _SECRET_HINTS):
        return "***"
    return value


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_") and key not in doc:
                doc[key] = _redact(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def human_console(env: Mapping[str, str] | None = None, stream: IO[str] | None = None
                  ) -> bool:
    """Whether a person reads this console: RLFLEET_CONSOLE=human|json if set (anything
    else is refused: a typo must not silently pick one), else whether `stream` (stderr)
    is a terminal."""
    env = os.environ if env is None else env
    mode = env.get(CONSOLE_ENV, "").strip().lower()
    if mode:
        if mode not in CONSOLE_MODES:
            raise ValueError(f"{CONSOLE_ENV}={env[CONSOLE_ENV]!r}: use one of "
                             f"{', '.join(CONSOLE_MODES)}")
        return mode == "human"
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def is_library_logger(name: str) -> bool:
    """Whether `name` is a library's logger (LIBRARY_LOGGERS), not the project's."""
    return _is_library(name)


def _is_library(name: str) -> bool:
    return name.split(".", 1)[0] in LIBRARY_LOGGERS


class _RoutedLogger(logging.Logger):
    """A library's logger whose records reach the root's JSON handler, once: handlers of
    its own are refused, and propagation cannot be turned off. The class of
    every logger created after `setup_logging` (it acts on library names only), and given
    to the library loggers that exist at set-up, so a library that configures itself
    later (ray.init, transformers' first get_logger) cannot add a plain-text handler."""

    @property  # type: ignore[override]
    def propagate(self) -> bool:
        return True if _is_library(self.name) else self.__dict__.get("_propagate", True)

    @propagate.setter
    def propagate(self, value: bool) -> None:
        self.__dict__["_propagate"] = value

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 - logging's name
        if _is_library(self.name):  # the root's JSON handler writes its records, once
            return
        super().addHandler(hdlr)


def _adopt(logger: logging.Logger) -> None:
    if type(logger) is logging.Logger:
        logger.__class__ = _RoutedLogger  # a subclass without state of its own
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True


def adopt_library_loggers() -> None:
    """Routes every library logger that exists now through the root (see _RoutedLogger)."""
    logging.setLoggerClass(_RoutedLogger)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name)  # created now with the routed class, if not there yet
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and _is_library(name):
            _adopt(logger)


def _log_uncaught(kind: type[BaseException], value: BaseException,
                  tb: TracebackType | None, thread: str | None = None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("rlfleet.uncaught").critical(
        "uncaught exception%s: %s", f" in thread {thread}" if thread else "", value,
        exc_info=(kind, value, tb))


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    _log_uncaught(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback,
                  args.thread.name if args.thread else None)


def _no_progress_bars() -> None:
    # Read when huggingface_hub / transformers are imported (and inherited by the processes
    # this one starts, e.g. Ray workers); a library imported already is told directly.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.disable_progress_bar()
    elif "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()


def vllm_logging_config(service: str, level: str) -> dict[str, Any]:
    """The logging.config.dictConfig vLLM applies in the processes it starts (its engine
    core): this module's JSON lines on stderr, as `service`."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter", "service": service}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json",
                              "stream": "ext://sys.stderr"}},
        "loggers": {"vllm": {"handlers": ["json"], "level": level.upper(),
                             "propagate": False}},
    }


def _configure_vllm(service: str, level: str) -> None:
    # Only where vLLM is installed (the GPU image, the vllm venv), and never over an
    # operator's own file. One file per service, rewritten with the same content.
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ or importlib.util.find_spec("vllm") is None:
        return
    path = os.path.join(tempfile.gettempdir(), f"rlfleet-vllm-logging-{service}.json")
    with open(path, "w") as f:
        json.dump(vllm_logging_config(service, level), f)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path


def setup_logging(service: str, level: str = "INFO") -> None:
    """Routes the root logger to stderr as JSON lines, with warnings, library loggers and
    uncaught exceptions. Safe to call more than once (again after a library such as Ray
    has configured itself)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    adopt_library_loggers()
    if not sys.stderr.isatty():
        _no_progress_bars()
    _configure_vllm(service, level)
    sys.excepthook = _log_uncaught
    threading.excepthook = _thread_hook
    # `kill -QUIT PID` writes every thread's stack to stderr (the process keeps running):
    # how a process that will not drain shows where it is stuck, e.g. before a SIGKILL
    faulthandler.register(DUMP_STACKS_SIGNAL, all_threads=True, chain=False)
