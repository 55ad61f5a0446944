"""The client side of the rpc layer: deadlines on every call, retries with exponential
backoff and jitter on UNAVAILABLE, and calls spread over several addresses.

A call is retried only on UNAVAILABLE (the peer is down or restarting), which gRPC
guarantees the server did not process when the connection failed before sending; every
other status is the answer and goes back to the caller.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from rlfleet.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor
):
    """Adds the shared token to every call (works on plaintext channels, unlike
    call credentials)."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), self._metadata]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001
        return continuation(self._with_token(details), request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):  # noqa: ANN001
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def open_channel(
    address: str,
    *,
    token: str | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
) -> grpc.Channel:
    """A channel with rlfleet's message limits, optional TLS/mTLS and the shared token."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Fail fast on a dead peer instead of queueing behind reconnect backoff.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if ca_file:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca_file.read_bytes(),
            private_key=key_file.read_bytes() if key_file else None,
            certificate_chain=cert_file.read_bytes() if cert_file else None,
        )
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(token))
    return channel


def client_tls_from_env(env: dict[str, str] | None = None) -> dict[str, Path] | None:
    """TLS options for a process without service settings (the learner), from the same
    variables the services read: RLFLEET_TLS_CA (else RLFLEET_TLS_CLIENT_CA) is the CA
    that signed the servers; RLFLEET_TLS_CERT / RLFLEET_TLS_KEY the client certificate.
    None when no CA is set (plaintext)."""
    env = dict(os.environ if env is None else env)
    ca = env.get("RLFLEET_TLS_CA") or env.get("RLFLEET_TLS_CLIENT_CA")
    if not ca:
        return None
    tls = {"ca_file": Path(ca)}
    if env.get("RLFLEET_TLS_CERT") and env.get("RLFLEET_TLS_KEY"):
        tls.update(cert_file=Path(env["RLFLEET_TLS_CERT"]), key_file=Path(env["RLFLEET_TLS_KEY"]))
    return tls


class RpcClient:
    """Calls one service over one or more addresses.

    `call(stub_cls, "Method", request)` picks the next address round-robin; on UNAVAILABLE
    it backs off and tries the next address, up to `max_attempts` in all. Every call has a
    deadline (`timeout_s`, or the client default).
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        max_attempts: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        tls: dict[str, Path] | None = None,
    ) -> None:
        addrs = [addresses] if isinstance(addresses, str) else list(addresses)
        addrs = [a.strip() for a in addrs if a and a.strip()]
        if not addrs:
            raise ValueError("RpcClient needs at least one address")
        if timeout_s <= 0 or max_attempts < 1:
            raise ValueError("timeout_s must be > 0 and max_attempts >= 1")
        self.addresses = addrs
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._token = token
        self._tls = tls or {}
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._next = itertools.count()

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = open_channel(address, token=self._token, **self._tls)
            return self._channels[address]

    def _order(self) -> Iterator[str]:
        start = next(self._next)
        n = len(self.addresses)
        for i in range(self.max_attempts):
            yield self.addresses[(start + i) % n]

    def _sleep(self, attempt: int) -> None:
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        time.sleep(delay * (0.5 + random.random() / 2))

    def call(
        self, stub_cls: type, method: str, request: Any, *, timeout_s: float | None = None
    ) -> Any:
        last: grpc.RpcError | None = None
        for attempt, address in enumerate(self._order()):
            stub = stub_cls(self.channel(address))
            try:
                return getattr(stub, method)(request, timeout=timeout_s or self.timeout_s)
            except grpc.RpcError as err:
                if err.code() not in RETRYABLE:
                    raise
                last = err
                log.warning(
                    "rpc unavailable, retrying",
                    extra={"address": address, "method": method, "attempt": attempt + 1},
                )
                if attempt + 1 < self.max_attempts:
                    self._sleep(attempt)
        assert last is not None
        raise last

    def stream(
        self, stub_cls: type, method: str, request: Any, *, timeout_s: float | None = None,
        address: str | None = None,
    ) -> Iterator[Any]:
        """A server-streaming call on one address (no automatic retry: a stream may have
        delivered part of its answer; the caller decides, e.g. by idempotency key)."""
        stub = stub_cls(self.channel(address or next(self._order())))
        return getattr(stub, method)(request, timeout=timeout_s or self.timeout_s)

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
