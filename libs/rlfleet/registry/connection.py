"""A Redis connection that survives Redis restarts: commands retry with backoff on
connection errors, and the password comes from the environment, never from code."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rlfleet.config import ConfigError, read_secret


class _Retry(Retry):
    """Retries connection errors, except a refused password: redis-py reports it as a
    ConnectionError too, but retrying cannot fix it and would only hide it for seconds."""

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # noqa: ANN001, ANN201
        def retryable(error: Exception) -> bool:
            if isinstance(error, redis.AuthenticationError):
                return False
            return is_retryable(error) if is_retryable else True

        return super().call_with_retry(do, fail, retryable, with_failure_count)


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
        retry=_Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=8),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        **kwargs,
    )


def verify_credentials(client: redis.Redis) -> None:
    """Raises ConfigError when Redis refuses the credentials (a wrong or missing password
    is a configuration error, not an outage). A Redis that is down passes: services wait
    for it and reconnect."""
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise ConfigError(
            f"Redis refused the credentials ({exc}); check REDIS_PASSWORD / "
            "REDIS_PASSWORD_FILE (or the password in the Redis URL)") from None
    except (redis.ConnectionError, redis.TimeoutError):
        pass
