"""JSON log lines mask text under keys that look like secrets, and only text: a count
under such a key (num_loss_tokens) is a figure people read, not a secret."""

from __future__ import annotations

import json
import logging

from rlfleet.logs import JsonFormatter


def line(**extra: object) -> dict:
    record = logging.LogRecord("rlfleet", logging.INFO, __file__, 1, "msg", None, None)
    record.__dict__.update(extra)
    return json.loads(JsonFormatter("test").format(record))


def test_text_under_a_secret_looking_key_is_masked() -> None:
    doc = line(auth_token="s3cr3t", password=b"pw", api_key="k", Authorization="Bearer x")
    assert {doc[k] for k in ("auth_token", "password", "api_key", "Authorization")} == {"***"}


def test_numbers_under_such_keys_stay() -> None:
    doc = line(loss_num_loss_tokens=5120, tokens_per_s=812.5, token_count=0)
    assert (doc["loss_num_loss_tokens"], doc["tokens_per_s"], doc["token_count"]) == \
        (5120, 812.5, 0)
