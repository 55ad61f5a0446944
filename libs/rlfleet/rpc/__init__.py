"""The rpc layer every service uses: a server bootstrap (health, reflection, metrics,
auth, size limits, graceful drain) and a client (deadlines, retries, several addresses)."""

from rlfleet.rpc.client import RpcClient
from rlfleet.rpc.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RpcError,
    Unavailable,
)
from rlfleet.rpc.server import GrpcServer, ServerConfig

__all__ = [
    "FailedPrecondition",
    "GrpcServer",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "RpcClient",
    "RpcError",
    "ServerConfig",
    "Unavailable",
]
