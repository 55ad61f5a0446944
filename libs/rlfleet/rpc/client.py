"""The client side of the rpc layer, under the typed service clients (`rlfleet.clients`):
deadlines on every call, gRPC's own retries for idempotent methods, and failing over
between several addresses.

Retries are gRPC's service-config `retryPolicy` on the channel: a call answered
UNAVAILABLE (the peer down or restarting, the connection lost) is re-sent with
exponential backoff and jitter, inside the call's one deadline, and only for the methods
the client names as idempotent (re-sending one that the peer may have applied changes
nothing). Every other status is the answer and goes back to the caller.

A channel's policy retries on that channel only; moving on to another address when one
is down is something a service config cannot say for a list of host names (it would need
one resolver name for all of them), so `RpcClient.call` does that itself: each address
once, for the methods it retries, within the same deadline.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rlfleet.limits import MAX_MESSAGE_BYTES
from rlfleet.rpc.callproof import ANSWER_HEADER, answer_key, check_answer, make_proof, proof_key
from rlfleet.rpc.interceptors import UNAUTHENTICATED_SERVICES
from rlfleet.rpc.tls import TlsFileError, client_credentials, files_stamp, is_ip_target

log = logging.getLogger(__name__)

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
MAX_ATTEMPTS = 5  # gRPC's ceiling for a retryPolicy's maxAttempts


@dataclass(frozen=True)
class RetryPolicy:
    """How a channel retries UNAVAILABLE: `max_attempts` in all (1 = never), the n-th
    retry after a random wait below min(initial * multiplier**(n-1), max) seconds."""

    max_attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_attempts must be in 1..{MAX_ATTEMPTS} (gRPC's retry "
                             f"policy allows at most {MAX_ATTEMPTS}), got {self.max_attempts}")
        if self.initial_backoff_s <= 0 or self.max_backoff_s < self.initial_backoff_s \
                or self.backoff_multiplier <= 0:
            raise ValueError("backoffs must be > 0, max_backoff_s >= initial_backoff_s and "
                             "backoff_multiplier > 0")


def service_config(service: str | None, methods: Collection[str], policy: RetryPolicy
                   ) -> str | None:
    """The channel's `grpc.service_config` JSON: `policy` for `methods` of `service`
    (every method of every service when `service` is None); None when nothing retries."""
    if policy.max_attempts < 2 or (service is not None and not methods):
        return None
    names = ([{}] if service is None
             else [{"service": service, "method": m} for m in sorted(methods)])
    return json.dumps({"methodConfig": [{
        "name": names,
        "retryPolicy": {
            "maxAttempts": policy.max_attempts,
            "initialBackoff": f"{policy.initial_backoff_s:.3f}s",
            "maxBackoff": f"{policy.max_backoff_s:.3f}s",
            "backoffMultiplier": policy.backoff_multiplier,
            "retryableStatusCodes": sorted(code.name for code in RETRYABLE),
        },
    }]})


class UnprovenAnswer(grpc.RpcError):
    """An answer whose sender did not prove it holds the fleet's token (no valid
    `rlfleet-answer-proof` header): refused as UNAUTHENTICATED, whatever it carried."""

    def __init__(self, method: str) -> None:
        super().__init__(method)
        self._details = (f"{method}: the peer did not prove it belongs to the fleet (no valid "
                         "answer proof); its answer is refused")

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self._details

    def result(self, timeout: float | None = None) -> Any:  # the unary outcome's protocol
        raise self

    def exception(self, timeout: float | None = None) -> Exception:
        return self

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def __str__(self) -> str:
        return self._details


class _ProvenStream:
    """A server-streaming call whose first message is handed out only once the answer's
    headers carry a valid proof; everything else is the call's."""

    def __init__(self, call: Any, method: str, proven: Callable[[Any], bool]) -> None:
        self._call = call
        self._method = method
        self._proven = proven
        self._checked = False

    def __iter__(self) -> _ProvenStream:
        return self

    def __next__(self) -> Any:
        if not self._checked:
            if not self._proven(self._call):
                # a call that failed raises its own error here; one that answered, or
                # ended, without the proof is refused
                try:
                    next(self._call)
                except StopIteration:
                    pass
                self._call.cancel()
                raise UnprovenAnswer(self._method)
            self._checked = True
        return next(self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor
):
    """Proves every call with the shared token (`rlfleet.rpc.callproof`: a per-call MAC,
    never the token itself, so a peer that is not the fleet's learns no secret), and takes
    an answer only with the server's proof for that call (a peer that is not the fleet's
    has nothing accepted). Works on plaintext channels, unlike call credentials."""

    def __init__(self, token: str) -> None:
        self._key = proof_key(token)
        self._answer_key = answer_key(token)

    def _with_token(self, details: grpc.ClientCallDetails
                    ) -> tuple[grpc.ClientCallDetails, str, str]:
        method = details.method.decode() if isinstance(details.method, bytes) \
            else details.method
        proof = make_proof(self._key, method)
        metadata = [*(details.metadata or ()), ("authorization", proof)]
        return (_CallDetails(details.method, details.timeout, metadata, details.credentials,
                             details.wait_for_ready, details.compression), method, proof)

    def _prover(self, method: str, proof: str) -> Callable[[Any], bool]:
        def proven(call: Any) -> bool:
            value = dict(call.initial_metadata() or ()).get(ANSWER_HEADER)
            return isinstance(value, str) and check_answer(self._answer_key, value, method,
                                                           proof)
        return proven

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001
        details, method, proof = self._with_token(details)
        outcome = continuation(details, request)
        if method.startswith(UNAUTHENTICATED_SERVICES) or outcome.exception() is not None:
            return outcome  # a probe's answer, or the call's own failure
        return outcome if self._prover(method, proof)(outcome) else UnprovenAnswer(method)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001
        details, method, proof = self._with_token(details)
        call = continuation(details, request)
        if method.startswith(UNAUTHENTICATED_SERVICES):
            return call
        return _ProvenStream(call, method, self._prover(method, proof))


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
    server_name: str | None = None,
    ip_server_name: str | None = None,
    config: str | None = None,
) -> grpc.Channel:
    """A channel with rlfleet's message limits, optional TLS/mTLS, the shared token and
    `config`, a service config (`service_config`: the retry policy).

    With `ca_file` the server must present a certificate that CA signed, for the name the
    channel checks: `server_name` if given, else `ip_server_name` when `address` is an IP
    address (a replica registers its pod address, which no certificate of the fleet names),
    else the address's host. `cert_file`/`key_file`: the client certificate (mTLS). A file
    that cannot be used raises rpc.tls.TlsFileError, naming it; there is no plaintext
    fallback."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Fail fast on a dead peer instead of queueing behind reconnect backoff.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if config is not None:
        options += [("grpc.enable_retries", 1), ("grpc.service_config", config)]
    if ca_file:
        name = server_name or (ip_server_name if is_ip_target(address) else None)
        if name:
            options.append(("grpc.ssl_target_name_override", name))
        creds = grpc.ssl_channel_credentials(**client_credentials(ca_file, cert_file, key_file))
        channel = grpc.secure_channel(address, creds, options=options)
    elif cert_file or key_file or server_name:
        raise TlsFileError(f"client TLS for {address}: a certificate, key or server name is "
                           "given without a CA to check the server with (RLFLEET_TLS_CA or "
                           "RLFLEET_TLS_CLIENT_CA); refusing to call in plaintext")
    else:
        channel = grpc.insecure_channel(address, options=options)
    if token:
        channel = grpc.intercept_channel(channel, _TokenInterceptor(token))
    return channel


class RpcClient:
    """The transport: calls one service over one or more addresses (raw grpc.RpcError on
    failure; the typed clients in `rlfleet.clients` map it).

    `service` and `idempotent` name the methods the channels retry (`RetryPolicy` built
    from `max_attempts`, `backoff_s`, `max_backoff_s`); without `service`, every method is
    retried (a tool's or test's raw client). `call(stub_cls, "Method", request)` starts at
    the next address round-robin and, for a retried method answered UNAVAILABLE, tries the
    others in turn. Every call has one deadline (`timeout_s`, or the client default) over
    all of its attempts.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        service: str | None = None,
        idempotent: Collection[str] = (),
        token: str | None = None,
        timeout_s: float = 30.0,
        max_attempts: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        tls: dict[str, Path] | None = None,
        wait_for_ready: bool = False,
    ) -> None:
        addrs = [addresses] if isinstance(addresses, str) else list(addresses)
        addrs = [a.strip() for a in addrs if a and a.strip()]
        if not addrs:
            raise ValueError("RpcClient needs at least one address")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.addresses = addrs
        self.timeout_s = timeout_s
        self.service = service
        self.idempotent = frozenset(idempotent)
        self.wait_for_ready = wait_for_ready
        self.policy = RetryPolicy(max_attempts, backoff_s, max(backoff_s, max_backoff_s))
        self._config = service_config(service, self.idempotent, self.policy)
        self._token = token
        self._tls = tls or {}
        if self._tls.get("ca_file"):  # bad files refuse now, not at the first call
            client_credentials(self._tls["ca_file"], self._tls.get("cert_file"),
                               self._tls.get("key_file"))
        self._tls_stamp = self._stamp() if self._tls else None
        self._channels: dict[str, grpc.Channel] = {}
        self._retired: list[grpc.Channel] = []
        self._lock = threading.Lock()
        self._next = itertools.count()

    def _stamp(self) -> tuple:
        return files_stamp(*(v for k, v in sorted(self._tls.items()) if k.endswith("_file")))

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            stamp = self._stamp() if self._tls else None
            if stamp != self._tls_stamp:
                # Renewed certificate files: new channels use them; calls in flight finish
                # on the old ones (closed with the client).
                self._tls_stamp = stamp
                self._retired.extend(self._channels.values())
                self._channels.clear()
                log.info("TLS files changed, reconnecting with them")
            if address not in self._channels:
                self._channels[address] = open_channel(
                    address, token=self._token, config=self._config, **self._tls)
            return self._channels[address]

    def retries(self, method: str) -> bool:
        """Whether `method` is retried on UNAVAILABLE (by the channel, and on the next
        address)."""
        return self.policy.max_attempts > 1 and (
            self.service is None or method in self.idempotent)

    def _order(self) -> list[str]:
        start = next(self._next)
        n = len(self.addresses)
        return [self.addresses[(start + i) % n] for i in range(n)]

    def call(
        self, stub_cls: type, method: str, request: Any, *, timeout_s: float | None = None
    ) -> Any:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        order = self._order()
        # Waiting for a peer to become ready only where nothing else could answer sooner:
        # one address, and a method that is safe to send again.
        wait = self.wait_for_ready and len(order) == 1 and self.retries(method)
        for i, address in enumerate(order):
            stub = stub_cls(self.channel(address))
            try:
                return getattr(stub, method)(
                    request, timeout=max(0.001, deadline - time.monotonic()),
                    wait_for_ready=wait)
            except grpc.RpcError as err:
                last = i + 1 == len(order) or time.monotonic() >= deadline
                if err.code() not in RETRYABLE or not self.retries(method) or last:
                    raise
                log.warning("rpc unavailable, trying the next address",
                            extra={"address": address, "method": method,
                                   "next": order[i + 1]})
        raise AssertionError("unreachable: the last address raises or returns")

    def stream(
        self, stub_cls: type, method: str, request: Any, *, timeout_s: float | None = None,
        address: str | None = None,
    ) -> Any:
        """A server-streaming call on one address: the grpc call object (iterate it for
        the messages; `cancel()` ends it). The channel retries it, if it is one of the
        retried methods, only until the first message arrives (gRPC commits a call then)."""
        stub = stub_cls(self.channel(address or self._order()[0]))
        return getattr(stub, method)(request, timeout=timeout_s or self.timeout_s)

    def close(self) -> None:
        with self._lock:
            for channel in [*self._channels.values(), *self._retired]:
                channel.close()
            self._channels.clear()
            self._retired.clear()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
