"""Domain errors that carry a gRPC status code.

Servicers raise these; the server's interceptor turns them into the status code and
message, so handlers never deal with `context.abort` themselves.
"""

from __future__ import annotations

import grpc


class RpcError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(RpcError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RpcError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RpcError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(RpcError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(RpcError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RpcError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
