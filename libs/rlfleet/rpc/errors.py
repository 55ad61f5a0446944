"""Errors that carry a gRPC status code: one hierarchy for both sides of a call.

Server side: servicers raise these; the server's interceptor turns them into the status
code and message, so handlers never deal with `context.abort` themselves.

Client side: the typed service clients (`rlfleet.clients`) turn every failed call into the
class of its status code (`from_grpc`), so callers write `except NotFound:` instead of
inspecting `grpc.RpcError.code()`. Such an error names where it came from (`peer`, the
address called, and `method`); a servicer that lets one escape answers UNAVAILABLE ("a
peer service failed"), never the peer's own code as if it were its own answer.
"""

from __future__ import annotations

import grpc


class RpcError(Exception):
    """A call's status: `code`, and `message` (the status details)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, peer: str | None = None, method: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.peer = peer  # the address that answered; None when raised by this process
        self.method = method  # "/rlfleet.v1.EnvService/Open" when the answer of a call

    def __str__(self) -> str:
        if self.peer is None:
            return self.message
        return f"{self.method or 'call'} at {self.peer}: {self.code.name}: {self.message}"


class Cancelled(RpcError):
    code = grpc.StatusCode.CANCELLED


class Unknown(RpcError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(RpcError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(RpcError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(RpcError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RpcError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(RpcError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(RpcError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(RpcError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(RpcError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(RpcError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(RpcError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(RpcError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(RpcError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(RpcError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(RpcError):
    code = grpc.StatusCode.UNAUTHENTICATED


# every status a call can end with, except OK
_BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    cls.code: cls for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def error_class(code: grpc.StatusCode) -> type[RpcError]:
    """The class of a status code (UNKNOWN's for a code gRPC might add later)."""
    return _BY_CODE.get(code, Unknown)


def from_grpc(err: grpc.RpcError, *, peer: str, method: str) -> RpcError:
    """The typed error for a failed call (`err` from a stub or a stream's iterator)."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    return error_class(code)(details or "", peer=peer, method=method)
