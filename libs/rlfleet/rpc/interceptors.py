"""Server interceptors: shared-token auth, a bound on how long a call may wait for its
request, error mapping, Prometheus metrics, and one log line per failed call.

grpc runs interceptors on the server's polling thread when a call's headers arrive, before
its body; the handler they return runs on a worker thread. Two consequences shape this
module:

- An unauthenticated call is refused by a handler that never reads its request: a worker
  sends UNAUTHENTICATED at once, the body is neither waited for nor parsed (a 60 MiB body
  is never buffered), and a client that sends headers and no body holds nothing.
- A unary handler's worker blocks until the request arrives. Every handler is therefore
  served as request-streaming: the worker starts at the headers, reads the request under
  `RequestReaper`'s bound, and a call whose request does not arrive in time ends with
  DEADLINE_EXCEEDED, freeing the worker, whoever the caller is (health checks need no
  token and are bounded the same way).
"""

from __future__ import annotations

import collections
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from rlfleet.limits import InputTooLarge, UnservableSampling
from rlfleet.rpc.callproof import ANSWER_HEADER, answer_key, check_proof, make_answer, proof_key
from rlfleet.rpc.callproof import SCHEME as PROOF_SCHEME
from rlfleet.rpc.errors import InvalidArgument, RpcError

log = logging.getLogger(__name__)

RPC_REQUESTS = Counter(
    "rlfleet_grpc_requests_total", "gRPC requests handled, by final status code",
    ["grpc_service", "grpc_method", "grpc_code"],
)
REQUEST_TIMEOUTS = Counter(
    "rlfleet_grpc_request_timeouts_total",
    "calls ended with DEADLINE_EXCEEDED because their request did not arrive in time",
    ["grpc_service", "grpc_method"])
RPC_LATENCY = Histogram(
    "rlfleet_grpc_request_seconds",
    "gRPC handling time in seconds",
    ["grpc_service", "grpc_method"],
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


# How loud a failed call is: the server's own failures are errors, a caller that went away
# is routine, anything else (a refused or bad request, a peer down) a warning.
_ERROR_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                          grpc.StatusCode.DATA_LOSS})


def log_failed_call(service: str, method: str, code: grpc.StatusCode, details: str,
                    seconds: float | None = None, exc: BaseException | None = None) -> None:
    """The one log line of a call that ended with `code` != OK (the traceback with it for
    an unhandled error). Every path that ends a call with a status passes here once."""
    level = (logging.ERROR if code in _ERROR_CODES
             else logging.INFO if code is grpc.StatusCode.CANCELLED else logging.WARNING)
    extra: dict[str, Any] = {"grpc_service": service, "grpc_method": method,
                             "grpc_code": code.name, "details": details}
    if seconds is not None:
        extra["seconds"] = round(seconds, 4)
    if exc is not None:
        log.log(level, "unhandled error in %s/%s", service, method, extra=extra,
                exc_info=(type(exc), exc, exc.__traceback__))
    else:
        log.log(level, "rpc failed: %s/%s %s", service, method, code.name, extra=extra)


def _details(context: grpc.ServicerContext) -> str:
    details = getattr(context, "details", None)
    value = details() if callable(details) else None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


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


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str
            ) -> grpc.RpcMethodHandler:
    """A handler that answers `code` without reading the request: request-streaming, so
    grpc starts it at the headers and never receives (or parses) the body."""

    def refuse(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            refuse, response_serializer=handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(
        refuse, response_serializer=handler.response_serializer)


def answering(handler: grpc.RpcMethodHandler, metadata: tuple[tuple[str, str], ...]
              ) -> grpc.RpcMethodHandler:
    """`handler`, sending `metadata` as the response headers before its behaviour runs
    (the answer's proof: `rlfleet.rpc.callproof`)."""

    def wrap(behaviour: Callable, _streaming: bool) -> Callable:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            context.send_initial_metadata(metadata)
            return behaviour(request, context)
        return run

    return _replace_behaviour(handler, wrap)


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls (UNAUTHENTICATED, at the headers: the request is never read, see
    `refusal`) whose `authorization` is neither a valid per-call proof
    (`rlfleet.rpc.callproof`, what rlfleet's clients send) nor `Bearer <token>` (tools);
    answers a proven call with the server's own proof in the response headers."""

    def __init__(self, token: str) -> None:
        if not token or not token.strip():
            raise ValueError("auth token must be non-empty")
        self._expected = f"Bearer {token}".encode()
        self._key = proof_key(token)
        self._answer_key = answer_key(token)

    def _authorized(self, given: str | bytes, method: str) -> bool:
        value = given.decode("utf-8", "replace") if isinstance(given, bytes) else given
        if value.startswith(f"{PROOF_SCHEME} "):
            return check_proof(self._key, value, method)
        return hmac.compare_digest(value.encode(), self._expected)

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        method = handler_call_details.method
        if method.startswith(UNAUTHENTICATED_SERVICES):
            return continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if self._authorized(given, method):
            handler = continuation(handler_call_details)
            value = given.decode("utf-8", "replace") if isinstance(given, bytes) else given
            if handler is None or not value.startswith(f"{PROOF_SCHEME} "):
                return handler  # a tool's bearer token: it checks no answer
            return answering(handler, ((ANSWER_HEADER,
                                        make_answer(self._answer_key, method, value)),))
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, name = _split(method)
        RPC_REQUESTS.labels(service, name, grpc.StatusCode.UNAUTHENTICATED.name).inc()
        log_failed_call(service, name, grpc.StatusCode.UNAUTHENTICATED,
                        "missing or wrong auth token")
        return refusal(handler, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")


class RequestCutOff(Exception):
    """A request read that the reaper ended (it has logged the call's failure)."""


class RequestReaper:
    """Ends calls whose request message does not arrive within `bound_s`.

    Every wait for a request message registers here (deadlines are in arrival order, so a
    deque is the schedule); one thread cancels the calls still waiting at their deadline,
    with DEADLINE_EXCEEDED, which wakes their worker."""

    def __init__(self, bound_s: float, name: str = "rpc") -> None:
        if bound_s <= 0:
            raise ValueError("bound_s must be > 0")
        self.bound_s = bound_s
        self.expired = 0
        self._waits: collections.deque[list] = collections.deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"{name}-request-reaper",
                                        daemon=True)
        self._thread.start()

    def wait_for(self, context: grpc.ServicerContext, receive: Callable[[], Any],
                 method: str = "", signal_cut_off: bool = False) -> Any:
        """`receive()` (a blocking read of one request message of the call to `method`, a
        full method name), cut off at the bound; with `signal_cut_off` a read that the cut-off
        ended raises RequestCutOff rather than what grpc raised."""
        # deadline, call, done, method, cut off (set by the reaper before it cancels)
        entry = [time.monotonic() + self.bound_s, context, False, method, False]
        with self._cond:
            self._waits.append(entry)
            if len(self._waits) == 1:
                self._cond.notify()
        try:
            return receive()
        except (StopIteration, grpc.RpcError):
            if entry[4] and signal_cut_off:
                # grpc may report the cancelled read as "no message" before the call shows
                # as inactive: the caller must know it was this cut-off, already logged
                raise RequestCutOff(method) from None
            raise
        finally:
            entry[2] = True
            entry[1] = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._waits or self._waits[0][2]):
                    if self._waits:
                        self._waits.popleft()
                    else:
                        self._cond.wait()
                if self._stopped:
                    return
                entry = self._waits[0]
                left = entry[0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._waits.popleft()
            context = entry[1]
            if context is not None and not entry[2]:
                entry[4] = True
                self.expired += 1
                service, method = _split(entry[3])
                REQUEST_TIMEOUTS.labels(service, method).inc()
                details = (f"the request did not arrive within {self.bound_s:g}s of the "
                           "call's headers")
                log_failed_call(service, method, grpc.StatusCode.DEADLINE_EXCEEDED, details,
                                self.bound_s)
                _cancel(context, grpc.StatusCode.DEADLINE_EXCEEDED, details)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()


def _cancel(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """Ends the call from another thread with `code` (grpc's public `cancel` can only say
    CANCELLED; the underlying call can carry a status)."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        if call is not None:
            call.cancel(code.value[0], details.encode())
            return
    except Exception:  # noqa: BLE001 - fall back to a plain cancel
        log.debug("cancel with status failed", exc_info=True)
    context.cancel()


class _Bounded:
    """A request iterator whose every read waits at most the reaper's bound."""

    def __init__(self, iterator: Iterator[Any], context: grpc.ServicerContext,
                 reaper: RequestReaper, method: str) -> None:
        self._it = iterator
        self._context = context
        self._reaper = reaper
        self._method = method

    def __iter__(self) -> _Bounded:
        return self

    def __next__(self) -> Any:
        return self._reaper.wait_for(self._context, lambda: next(self._it), self._method)


class RequestBoundInterceptor(grpc.ServerInterceptor):
    """Serves every handler as request-streaming so that its worker starts at the headers
    and reads the request under `reaper`'s bound (unary handlers get their one message
    read for them). Must be the outermost interceptor: it sees the final handler."""

    def __init__(self, reaper: RequestReaper) -> None:
        self.reaper = reaper

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        reaper = self.reaper
        method = handler_call_details.method
        deserialize = handler.request_deserializer
        if handler.request_streaming:
            behaviour = handler.stream_stream or handler.stream_unary

            def streaming(request_iterator: Any, context: grpc.ServicerContext) -> Any:
                return behaviour(_Bounded(request_iterator, context, reaper, method), context)

            make = (grpc.stream_stream_rpc_method_handler if handler.response_streaming
                    else grpc.stream_unary_rpc_method_handler)
            return make(streaming, request_deserializer=deserialize,
                        response_serializer=handler.response_serializer)
        behaviour = handler.unary_stream or handler.unary_unary

        def first(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            """The one request message; otherwise the call ends here (abort raises)."""
            try:
                return reaper.wait_for(context, lambda: next(request_iterator), method,
                                       signal_cut_off=True)
            except RequestCutOff:
                # the reaper logged it and ended the call; nothing more to say
                context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request")
            except (StopIteration, grpc.RpcError):
                pass  # no message: the call ended (cancelled, too large) or the client
                # closed its side without sending one
            if context.is_active():
                details = "the call requires exactly one request message"
                log_failed_call(*_split(method), grpc.StatusCode.INVALID_ARGUMENT, details)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)
            # ended already: the reaper logged its cut-off; a caller that left is not news
            context.abort(grpc.StatusCode.CANCELLED, "the call ended before its request")

        if handler.response_streaming:

            def unary_stream(request_iterator: Any, context: grpc.ServicerContext
                             ) -> Iterator[Any]:
                yield from behaviour(first(request_iterator, context), context)

            return grpc.stream_stream_rpc_method_handler(
                unary_stream, request_deserializer=deserialize,
                response_serializer=handler.response_serializer)

        def unary_unary(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            return behaviour(first(request_iterator, context), context)

        return grpc.stream_unary_rpc_method_handler(
            unary_unary, request_deserializer=deserialize,
            response_serializer=handler.response_serializer)


class ErrorsAndMetricsInterceptor(grpc.ServerInterceptor):
    """Maps RpcError to its status code, hides internal errors behind INTERNAL, counts
    every call by method and final code, and logs each failed call once (an unhandled
    error with its traceback)."""

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, method = _split(handler_call_details.method)

        def record(start: float, code: grpc.StatusCode, details: str = "",
                   exc: BaseException | None = None) -> None:
            seconds = time.perf_counter() - start
            RPC_LATENCY.labels(service, method).observe(seconds)
            RPC_REQUESTS.labels(service, method, code.name).inc()
            if code is not grpc.StatusCode.OK:
                log_failed_call(service, method, code, details, seconds, exc)

        def reject_malformed(request: Any, context: grpc.ServicerContext) -> None:
            if isinstance(request, MalformedRequest):
                raise InvalidArgument(f"malformed request: cannot parse message ({request.error})")

        def fail(exc: Exception, start: float, context: grpc.ServicerContext) -> None:
            """Records the call and aborts it with the status `exc` stands for."""
            exc = domain_status(exc)
            if isinstance(exc, RpcError):
                details = bounded_details(exc.message)
                record(start, exc.code, details)
                context.abort(exc.code, details)
            details = f"internal error ({type(exc).__name__})"
            record(start, grpc.StatusCode.INTERNAL, details, exc)
            context.abort(grpc.StatusCode.INTERNAL, details)

        def final_code(context: grpc.ServicerContext) -> grpc.StatusCode:
            code = context.code()
            return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK

        def on_error(exc: Exception, start: float, context: grpc.ServicerContext) -> None:
            """Records the call and turns the exception into a status; always raises."""
            peer_failed = isinstance(exc, RpcError) and exc.peer is not None  # typed client
            if isinstance(exc, grpc.RpcError) or peer_failed:
                if not context.is_active():  # the client went away mid-stream
                    record(start, grpc.StatusCode.CANCELLED, "the client went away")
                    raise exc
                # an outgoing call to a peer failed: this service cannot answer now (never
                # the peer's own code, as if it were this service's answer)
                code = exc.code if isinstance(exc, RpcError) else (
                    exc.code() if callable(getattr(exc, "code", None)) else None)
                name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
                details = f"a peer service failed: {name}"
                record(start, grpc.StatusCode.UNAVAILABLE, details)
                context.abort(grpc.StatusCode.UNAVAILABLE, details)
            if _is_abort(exc):  # the handler already chose a status
                record(start, final_code(context), _details(context))
                raise exc
            fail(exc, start, context)

        def wrap(behaviour: Callable, streaming: bool) -> Callable:
            if streaming:

                def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                    start = time.perf_counter()
                    try:
                        reject_malformed(request, context)
                        yield from behaviour(request, context)
                    except Exception as exc:  # noqa: BLE001 - mapped to a status
                        on_error(exc, start, context)
                    record(start, final_code(context), _details(context))

                return stream

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                start = time.perf_counter()
                try:
                    reject_malformed(request, context)
                    response = behaviour(request, context)
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    on_error(exc, start, context)
                record(start, final_code(context), _details(context))
                return response

            return unary

        return _replace_behaviour(handler, wrap)


def domain_status(exc: Exception) -> Exception:
    """The status a domain error raised deep in a handler stands for: an input over a
    bound (rlfleet.limits.InputTooLarge, e.g. an env's image) or a sampling setting the
    engine cannot serve is the caller's, the same from every replica: INVALID_ARGUMENT,
    which no client re-sends. Anything else is returned as it is."""
    if isinstance(exc, InputTooLarge | UnservableSampling):
        return InvalidArgument(str(exc))
    return exc


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
