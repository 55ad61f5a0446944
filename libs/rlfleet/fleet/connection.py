"""A Redis connection that survives Redis restarts: commands retry with backoff on
connection errors, and the password comes from the environment, never from code."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from rlfleet.config import ConfigError, read_secret


class FleetAuthError(ConfigError):
    """Redis refused the credentials: a configuration error, never an outage."""


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


def credentials_error(exc: BaseException) -> FleetAuthError:
    """The one message for a refused Redis password (never the password itself)."""
    return FleetAuthError(
        f"Redis refused the credentials ({exc}); check REDIS_PASSWORD / "
        "REDIS_PASSWORD_FILE (or the password in the Redis URL)")


def verify_credentials(client: redis.Redis) -> None:
    """Raises FleetAuthError (a ConfigError) when Redis refuses the credentials (a wrong
    or missing password is a configuration error, not an outage). A Redis that is down
    passes at once (one attempt, no retries): services wait for it and reconnect."""
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    probe = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs))
    try:
        probe.ping()
    except redis.AuthenticationError as exc:
        raise credentials_error(exc) from None
    except (redis.ConnectionError, redis.TimeoutError):
        pass
    finally:
        probe.close()
        probe.connection_pool.disconnect()


def fleet_store_full(exc: BaseException) -> bool:
    """Redis refused a write because it is out of memory (maxmemory reached with the
    noeviction policy): "OOM command not allowed when used memory > 'maxmemory'"."""
    return isinstance(exc, redis.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and "OOM command not allowed" in str(exc))


def fleet_unavailable_reason(exc: BaseException) -> str | None:
    """Why a Redis error means "the fleet store cannot answer now, retry" (None: it does
    not): unreachable, full, read-only (a replica after failover), loading its data."""
    if isinstance(exc, redis.AuthenticationError):
        return "Redis refused the service's credentials (check REDIS_PASSWORD)"
    if isinstance(exc, redis.BusyLoadingError):
        return "the fleet store (Redis) is loading its dataset"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"the fleet store (Redis) is unreachable ({type(exc).__name__})"
    if fleet_store_full(exc):
        return ("the fleet store (Redis) is full: used memory is over maxmemory and the "
                "policy is noeviction, so Redis refuses writes (OOM); nothing was recorded")
    if isinstance(exc, redis.ReadOnlyError):
        return "the fleet store (Redis) is read-only (a replica, e.g. after a failover)"
    return None
