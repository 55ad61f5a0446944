"""max_connection_age_s: the server closes each connection after that long and the client
reconnects, so behind a Kubernetes Service a replica reaches whatever pods the Service
selects now (a swapped reward service), with no call failing on the way."""

from __future__ import annotations

import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.rpc.server import GrpcServer, ServerConfig
from tests.waits import scaled


def test_clients_reconnect_after_the_connection_age_and_no_call_fails() -> None:
    config = ServerConfig(max_connection_age_s=0.5, max_connection_age_grace_s=0.5)
    with GrpcServer("age", config, []) as server:
        channel = grpc.insecure_channel(server.address)
        states: list[grpc.ChannelConnectivity] = []
        lock = threading.Lock()

        def record(state: grpc.ChannelConnectivity) -> None:
            with lock:
                states.append(state)

        channel.subscribe(record, try_to_connect=True)
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + scaled(30)
        calls = 0
        while time.monotonic() < deadline:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            calls += 1
            with lock:
                ready = states.count(grpc.ChannelConnectivity.READY)
            if ready >= 3:  # connected, closed by the server, and connected again, twice
                break
            time.sleep(0.2)
        channel.close()
    assert ready >= 3, states
    assert calls >= 3


def test_without_an_age_the_connection_stays() -> None:
    with GrpcServer("no-age", ServerConfig(), []) as server:
        channel = grpc.insecure_channel(server.address)
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append, try_to_connect=True)
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(8):
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            time.sleep(0.2)
        channel.close()
    assert states.count(grpc.ChannelConnectivity.READY) == 1, states
