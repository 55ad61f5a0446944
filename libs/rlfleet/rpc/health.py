"""Health checks from the client side (probes, `rlfleet health`, tests)."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.rpc.client import open_channel


def check(address: str, service: str = "", timeout_s: float = 3.0,
          tls: dict[str, Path] | None = None) -> str:
    """The health status name ("SERVING", "NOT_SERVING", ...) or the gRPC error code name.
    `tls`: open_channel's TLS options (ca_file, cert_file, key_file) for a TLS server."""
    with open_channel(address, **(tls or {})) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
