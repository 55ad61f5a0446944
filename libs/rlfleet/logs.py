"""Structured logs: one JSON object per line on stderr, with the service name.

Values of keys that look like secrets are redacted, so a token passed by mistake in
`extra=` never reaches the log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_SECRET_HINTS = ("token", "password", "secret", "authorization", "api_key")
_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


def _redact(key: str, value: Any) -> Any:
    return "***" if any(h in key.lower() for h in _SECRET_HINTS) else value


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                doc[key] = _redact(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(service: str, level: str = "INFO") -> None:
    """Routes the root logger to stderr as JSON lines. Safe to call more than once."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
