"""A Redis connection that survives Redis restarts: commands retry with backoff on
connection errors, and the password comes from the environment, never from code."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rlfleet.config import read_secret


def connect(url: str, *, password: str | None = None) -> redis.Redis:
    """A client for `url` (redis://host:port/db). The password, if not given and not in the
    URL, is read from REDIS_PASSWORD / REDIS_PASSWORD_FILE."""
    password = password or read_secret("REDIS_PASSWORD")
    kwargs = {"password": password} if password and "@" not in url else {}
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=10.0,
        health_check_interval=5,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=8),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        **kwargs,
    )
