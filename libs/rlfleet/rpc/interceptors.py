"""Server interceptors: shared-token auth, error mapping and Prometheus metrics."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from rlfleet.rpc.errors import InvalidArgument, RpcError

log = logging.getLogger(__name__)

RPC_REQUESTS = Counter(
    "rlfleet_grpc_requests_total", "gRPC requests handled", ["grpc_service", "method", "code"]
)
RPC_LATENCY = Histogram(
    "rlfleet_grpc_request_seconds",
    "gRPC handling time",
    ["grpc_service", "method"],
    buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60, 300),
)

# Probes and tooling must reach these without the shared token.
UNAUTHENTICATED_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def _split(method: str) -> tuple[str, str]:
    _, service, name = method.split("/", 2) if method.count("/") >= 2 else ("", "?", method)
    return service, name


class MalformedRequest:
    """Stands in for a request whose bytes did not parse, so the handler wrapper can answer
    INVALID_ARGUMENT (grpc itself would answer INTERNAL)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's fault
            return MalformedRequest(exc)

    return parse


def _replace_behaviour(
    handler: grpc.RpcMethodHandler, wrap: Callable[[Callable, bool], Callable]
) -> grpc.RpcMethodHandler:
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
    )
    for attr, make, streaming in kinds:
        behaviour = getattr(handler, attr)
        if behaviour:
            return make(
                wrap(behaviour, streaming),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
    raise ValueError("handler has no behaviour")


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must be non-empty")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        method = handler_call_details.method
        if method.startswith(UNAUTHENTICATED_SERVICES):
            return continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if isinstance(given, str):
            given = given.encode()
        if hmac.compare_digest(given, self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None

        def deny(behaviour: Callable, streaming: bool) -> Callable:
            def aborted(request: Any, context: grpc.ServicerContext) -> Any:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

            return aborted

        return _replace_behaviour(handler, deny)


class ErrorsAndMetricsInterceptor(grpc.ServerInterceptor):
    """Maps RpcError to its status code, hides internal errors behind INTERNAL (logged with
    the traceback), and counts every call by method and final code."""

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, method = _split(handler_call_details.method)

        def record(start: float, code: grpc.StatusCode) -> None:
            RPC_LATENCY.labels(service, method).observe(time.perf_counter() - start)
            RPC_REQUESTS.labels(service, method, code.name).inc()

        def reject_malformed(request: Any, context: grpc.ServicerContext) -> None:
            if isinstance(request, MalformedRequest):
                raise InvalidArgument(f"malformed request: cannot parse message ({request.error})")

        def fail(exc: Exception, context: grpc.ServicerContext) -> None:
            if isinstance(exc, RpcError):
                context.abort(exc.code, bounded_details(exc.message))
            log.exception("unhandled error in %s/%s", service, method)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")

        def final_code(context: grpc.ServicerContext) -> grpc.StatusCode:
            code = context.code()
            return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK

        def on_error(exc: Exception, start: float, context: grpc.ServicerContext) -> None:
            """Records the call and turns the exception into a status; always raises."""
            if isinstance(exc, grpc.RpcError):
                if not context.is_active():  # the client went away mid-stream
                    record(start, grpc.StatusCode.CANCELLED)
                    raise exc
                # an outgoing call to a peer failed: this service cannot answer now
                code = exc.code() if callable(getattr(exc, "code", None)) else None
                name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
                record(start, grpc.StatusCode.UNAVAILABLE)
                context.abort(grpc.StatusCode.UNAVAILABLE, f"a peer service failed: {name}")
            if _is_abort(exc):  # the handler already chose a status
                record(start, final_code(context))
                raise exc
            record(start, exc.code if isinstance(exc, RpcError) else grpc.StatusCode.INTERNAL)
            fail(exc, context)

        def wrap(behaviour: Callable, streaming: bool) -> Callable:
            if streaming:

                def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                    start = time.perf_counter()
                    try:
                        reject_malformed(request, context)
                        yield from behaviour(request, context)
                    except Exception as exc:  # noqa: BLE001 - mapped to a status
                        on_error(exc, start, context)
                    record(start, final_code(context))

                return stream

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                start = time.perf_counter()
                try:
                    reject_malformed(request, context)
                    response = behaviour(request, context)
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    on_error(exc, start, context)
                record(start, final_code(context))
                return response

            return unary

        return _replace_behaviour(handler, wrap)


# Status details travel percent-encoded in a trailer; clients drop trailers over 8-16 KiB
# and report RESOURCE_EXHAUSTED instead of the real status. Messages that quote a client's
# oversized input (a 10 KiB run name) are cut well below that.
MAX_DETAILS_BYTES = 1024


def bounded_details(message: str) -> str:
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_DETAILS_BYTES:
        return message
    return data[:MAX_DETAILS_BYTES].decode("utf-8", "ignore") + "... (truncated)"


def _is_abort(exc: Exception) -> bool:
    # grpc raises a bare Exception from context.abort(); it is already a status.
    return type(exc) is Exception
