"""The server bootstrap every rlfleet service uses.

One call gives a service: gRPC health checking (grpc.health.v1), server reflection, a
Prometheus /metrics endpoint, optional shared-token auth and (m)TLS, message size limits,
a bound on concurrent RPCs (overload answers RESOURCE_EXHAUSTED instead of queueing
forever), and a graceful drain on SIGTERM: health turns NOT_SERVING, new calls are
refused, calls in flight get `grace_s` to finish.

Slow or hostile clients cannot freeze a server: unauthenticated calls are refused at the
headers without reading the body; every call's request must arrive within
`request_timeout_s` of its headers; and the worker pool has a thread for every call the
server admits (`max_concurrent_rpcs`), so an admitted call never queues behind calls that
wait for their request; beyond that bound calls are refused at the headers.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from rlfleet.limits import MAX_MESSAGE_BYTES
from rlfleet.rpc.interceptors import (
    AuthInterceptor,
    ErrorsAndMetricsInterceptor,
    RequestBoundInterceptor,
    RequestReaper,
)
from rlfleet.rpc.tls import ServerFiles, server_credentials

log = logging.getLogger(__name__)


class BindError(OSError):
    """A port a server was asked to listen on cannot be had; the message says which and
    why (in use, or an address that is not this machine's), in one line for the operator."""


def unbindable(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (in use, not this machine's address, unknown
    host), or None if it can. Tried with a plain socket first because gRPC's own failure
    names no reason and logs a C-core error line before raising."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        return f"unknown host {host!r} ({getattr(exc, 'strerror', None) or exc})"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC and http do
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "address already in use (another process listens there)"
            return exc.strerror or str(exc)
    return None


# A function that adds one servicer to the server and returns its full service name,
# e.g. lambda s: add_EnvServiceServicer_to_server(servicer, s) or "rlfleet.v1.EnvService".
Registration = Callable[[grpc.Server], str]


@dataclass
class TlsConfig:
    """A server's TLS files (checked when the server is built: rpc.tls.TlsFileError names a
    bad one; reloaded when they change on disk)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None  # set: clients must present a cert it signed (mTLS)

    def files(self) -> ServerFiles:
        return ServerFiles(Path(self.cert_file), Path(self.key_file),
                           Path(self.client_ca_file) if self.client_ca_file else None)


@dataclass
class ServerConfig:
    port: int = 0  # 0 picks a free port (tests)
    host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint; 0 picks a free port
    max_workers: int = 64  # at least; the pool grows to max_concurrent_rpcs threads
    max_concurrent_rpcs: int | None = 1024
    auth_token: str | None = None
    tls: TlsConfig | None = None
    grace_s: float = 10.0
    request_timeout_s: float = 20.0  # a call's request must arrive this soon after headers
    # Close each client connection after this long (GOAWAY; calls in flight get the grace).
    # Behind a Kubernetes Service a gRPC connection otherwise stays on the pod it first
    # reached: a changed selector (a swapped reward service) or new pods are never seen.
    # None: connections live as long as the clients keep them.
    max_connection_age_s: float | None = None
    max_connection_age_grace_s: float = 30.0
    options: list[tuple[str, int]] = field(default_factory=list)


class GrpcServer:
    def __init__(self, name: str, config: ServerConfig, registrations: Sequence[Registration]):
        self.name = name
        self.config = config
        # Bad TLS files refuse here (rpc.tls.TlsFileError, one line), before anything starts.
        credentials = server_credentials(config.tls.files()) if config.tls else None
        # outermost first: the request bound sees the final handler (auth's refusals too)
        self._reaper = RequestReaper(config.request_timeout_s, name)
        interceptors: list[grpc.ServerInterceptor] = [RequestBoundInterceptor(self._reaper)]
        if config.auth_token is not None:
            interceptors.append(AuthInterceptor(config.auth_token))  # refuses "" too
        interceptors.append(ErrorsAndMetricsInterceptor())
        # A thread for every admitted call: a call waiting for its request (bounded) holds
        # one, and must not make the calls behind it wait for a free worker.
        workers = max(config.max_workers, config.max_concurrent_rpcs or 1024)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name),
            interceptors=interceptors,
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
                *(
                    [("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
                     ("grpc.max_connection_age_grace_ms",
                      int(config.max_connection_age_grace_s * 1000))]
                    if config.max_connection_age_s else []
                ),
                *config.options,
            ],
        )
        self.health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.service_names = [register(self._server) for register in registrations]
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server
        )
        address = f"{config.host}:{config.port}"
        reason = unbindable(config.host, config.port)
        if reason is None:
            try:
                if credentials is not None:
                    self.port = self._server.add_secure_port(address, credentials)
                else:
                    self.port = self._server.add_insecure_port(address)
            except RuntimeError:  # grpcio >= 1.60 raises where it returned 0 before
                self.port = 0
            reason = "gRPC could not bind it" if self.port == 0 else None
        if reason is not None:
            self._reaper.stop()
            raise BindError(f"cannot listen for {name} gRPC on {address}: {reason}")
        self.metrics_port: int | None = None
        self._metrics_httpd = None
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self, serving: bool = True) -> GrpcServer:
        """Starts listening. `serving=False` keeps health NOT_SERVING until the service says
        it is ready (e.g. a rollout replica that is still loading its adapter)."""
        if self.config.metrics_port is not None:
            try:
                httpd, _ = start_http_server(self.config.metrics_port, addr=self.config.host)
            except OSError as exc:
                self._reaper.stop()
                self._server.stop(0)
                where = f"{self.config.host}:{self.config.metrics_port}"
                reason = (unbindable(self.config.host, self.config.metrics_port)
                          or exc.strerror or str(exc))
                raise BindError(f"cannot listen for {self.name} metrics on {where}: "
                                f"{reason}") from None
            self._metrics_httpd = httpd
            self.metrics_port = httpd.server_address[1]
        self.set_serving(serving)
        self._server.start()
        log.info(
            "serving",
            extra={"address": self.address, "metrics_port": self.metrics_port,
                   "services": self.service_names, "auth": bool(self.config.auth_token),
                   "tls": bool(self.config.tls),
                   "request_timeout_s": self.config.request_timeout_s},
        )
        return self

    def set_serving(self, serving: bool, service: str | None = None) -> None:
        """Health status of one service, or of the whole server (and each service)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in [service] if service is not None else ["", *self.service_names]:
            self.health.set(name, status)

    def stop(self, grace_s: float | None = None) -> None:
        """Drains: NOT_SERVING first (so load balancers move away), then stops."""
        if self._stopped.is_set():
            return
        self.health.enter_graceful_shutdown()
        grace = self.config.grace_s if grace_s is None else grace_s
        self._server.stop(grace).wait()
        self._reaper.stop()
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
        self._stopped.set()
        log.info("stopped", extra={"address": self.address})

    def wait(self) -> None:
        # In slices, not one blocking wait: Python runs a signal's handler in the main
        # thread only, and a SIGTERM the kernel hands to another thread (it may, when the
        # main thread already has a signal pending) sets a flag that a main thread blocked
        # on a lock never sees; a service then ignored its SIGTERM until killed (seen in
        # tests/integration/test_json_logs.py).
        while not self._stopped.wait(0.5):
            pass

    def install_signal_handlers(self, on_stop: Callable[[], None] | None = None) -> None:
        """SIGTERM/SIGINT drain the server (in a thread: signal handlers must return fast)."""

        def handle(signum: int, _frame: object) -> None:
            log.info("signal received, draining", extra={"signal": signal.Signals(signum).name})

            def drain() -> None:
                if on_stop is not None:
                    on_stop()
                self.stop()

            threading.Thread(target=drain, name="drain", daemon=True).start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def __enter__(self) -> GrpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(grace_s=0)

