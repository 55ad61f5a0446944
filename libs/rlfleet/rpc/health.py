"""Health checks from the client side (probes, `rlfleet health`, tests)."""

from __future__ import annotations

import time
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


def wait_serving(address: str, service: str = "", timeout_s: float = 30.0,
                 tls: dict[str, Path] | None = None) -> None:
    """Blocks until the service is SERVING; TimeoutError with the last status otherwise."""
    deadline = time.monotonic() + timeout_s
    status = "UNKNOWN"
    while time.monotonic() < deadline:
        status = check(address, service, timeout_s=1.0, tls=tls)
        if status == "SERVING":
            return
        time.sleep(0.1)
    what = f"{address} {service or '(server)'}"
    raise TimeoutError(f"{what} not SERVING after {timeout_s}s: {status}")
