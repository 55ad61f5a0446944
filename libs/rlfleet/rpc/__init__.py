"""The rpc layer every service uses: a server bootstrap (health, reflection, metrics,
auth, size limits, graceful drain), the transport under the typed clients of
`rlfleet.clients` (deadlines, gRPC's retry policy, several addresses), and one error
hierarchy for both sides of a call (`errors`)."""

from rlfleet.lazy import lazy_exports

# each public name -> the submodule that defines it, imported on first use (so a health
# probe that needs only the client does not import the server side: prometheus, reflection)
_EXPORTS = {
    "Cancelled": "rlfleet.rpc.errors",
    "DeadlineExceeded": "rlfleet.rpc.errors",
    "FailedPrecondition": "rlfleet.rpc.errors",
    "GrpcServer": "rlfleet.rpc.server",
    "InvalidArgument": "rlfleet.rpc.errors",
    "NotFound": "rlfleet.rpc.errors",
    "ResourceExhausted": "rlfleet.rpc.errors",
    "RetryPolicy": "rlfleet.rpc.client",
    "RpcClient": "rlfleet.rpc.client",
    "RpcError": "rlfleet.rpc.errors",
    "ServerConfig": "rlfleet.rpc.server",
    "Unauthenticated": "rlfleet.rpc.errors",
    "Unavailable": "rlfleet.rpc.errors",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
