"""The rpc layer over real gRPC on loopback: auth, error mapping, retries, deadlines,
overload, graceful drain, metrics."""

from __future__ import annotations

import threading
import time
import urllib.request

import grpc
import pytest

from rlfleet.local.procs import free_port
from rlfleet.rpc import (
    FailedPrecondition,
    GrpcServer,
    InvalidArgument,
    NotFound,
    RpcClient,
    ServerConfig,
    Unavailable,
)
from rlfleet.rpc.health import check
from rlfleet.v1 import env_pb2, env_pb2_grpc

SERVICE = "rlfleet.v1.EnvService"


class ScriptedEnv(env_pb2_grpc.EnvServiceServicer):
    """An EnvService whose behaviour is chosen by the task name of the first spec."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def Open(self, request, context):  # noqa: N802, ANN001, ANN201
        self.calls += 1
        what = request.tasks[0].task if request.tasks else ""
        if what == "invalid":
            raise InvalidArgument("bad spec")
        if what == "missing":
            raise NotFound("no such thing")
        if what == "done":
            raise FailedPrecondition("episode over")
        if what == "boom":
            raise RuntimeError("secret internal detail")
        if what == "unavailable":
            raise Unavailable("restarting")
        if what == "slow":
            self.release.wait(5)
        return env_pb2.OpenResponse(episodes=[env_pb2.Episode(episode_id="ok")])


def make_server(**config) -> tuple[GrpcServer, ScriptedEnv]:  # noqa: ANN003
    servicer = ScriptedEnv()
    server = GrpcServer(
        "test",
        ServerConfig(port=0, metrics_port=0, **config),
        [lambda s: env_pb2_grpc.add_EnvServiceServicer_to_server(servicer, s) or SERVICE],
    )
    return server.start(), servicer


def open_request(task: str = "") -> env_pb2.OpenRequest:
    from rlfleet.v1 import common_pb2

    return env_pb2.OpenRequest(tasks=[common_pb2.TaskSpec(task=task)])


@pytest.fixture
def server():
    srv, servicer = make_server()
    yield srv, servicer
    servicer.release.set()
    srv.stop(0)


def test_errors_map_to_status_codes(server) -> None:
    srv, _ = server
    client = RpcClient(srv.address, timeout_s=5)
    cases = {
        "invalid": grpc.StatusCode.INVALID_ARGUMENT,
        "missing": grpc.StatusCode.NOT_FOUND,
        "done": grpc.StatusCode.FAILED_PRECONDITION,
        "boom": grpc.StatusCode.INTERNAL,
    }
    for task, code in cases.items():
        with pytest.raises(grpc.RpcError) as err:
            client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request(task))
        assert err.value.code() == code
    # internal errors do not leak their message to the caller
    with pytest.raises(grpc.RpcError) as err:
        client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request("boom"))
    assert "secret" not in err.value.details()
    # and the server is still up
    assert client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request()).episodes


def test_malformed_bytes_are_invalid_argument(server) -> None:
    srv, _ = server
    with grpc.insecure_channel(srv.address) as channel:
        raw = channel.unary_unary(f"/{SERVICE}/Open", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\x0a\xff\xff\xff\xff", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_metrics(server) -> None:
    srv, _ = server
    assert check(srv.address) == "SERVING"
    assert check(srv.address, SERVICE) == "SERVING"
    RpcClient(srv.address).call(env_pb2_grpc.EnvServiceStub, "Open", open_request())
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics").read().decode()
    assert ('rlfleet_grpc_requests_total{grpc_code="OK",grpc_method="Open",'
            'grpc_service="rlfleet.v1.EnvService"}') in text


def test_auth_token_required_but_probes_open() -> None:
    srv, _ = make_server(auth_token="s3cret-token")
    try:
        stub_call = (env_pb2_grpc.EnvServiceStub, "Open", open_request())
        for token in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as err:
                RpcClient(srv.address, token=token).call(*stub_call)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert RpcClient(srv.address, token="s3cret-token").call(*stub_call).episodes
        assert check(srv.address) == "SERVING"  # health needs no token
    finally:
        srv.stop(0)


def test_client_retries_unavailable_on_another_address(server) -> None:
    srv, servicer = server
    dead = f"127.0.0.1:{free_port()}"
    client = RpcClient([dead, srv.address], timeout_s=5, max_attempts=3, backoff_s=0.01)
    for _ in range(4):  # whichever address comes first, each call succeeds
        assert client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request()).episodes
    assert servicer.calls == 4


def test_client_gives_up_after_max_attempts() -> None:
    client = RpcClient([f"127.0.0.1:{free_port()}"], timeout_s=2, max_attempts=2, backoff_s=0.01)
    with pytest.raises(grpc.RpcError) as err:
        client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_non_retryable_errors_are_not_retried(server) -> None:
    srv, servicer = server
    client = RpcClient([srv.address, srv.address], max_attempts=4)
    with pytest.raises(grpc.RpcError):
        client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request("invalid"))
    assert servicer.calls == 1


def test_deadline_fires(server) -> None:
    srv, _ = server
    with pytest.raises(grpc.RpcError) as err:
        RpcClient(srv.address).call(
            env_pb2_grpc.EnvServiceStub, "Open", open_request("slow"), timeout_s=0.2
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_overload_is_resource_exhausted() -> None:
    srv, servicer = make_server(max_concurrent_rpcs=1)
    try:
        client = RpcClient(srv.address, timeout_s=10)
        t = threading.Thread(
            target=client.call, args=(env_pb2_grpc.EnvServiceStub, "Open", open_request("slow"))
        )
        t.start()
        while servicer.calls == 0:
            time.sleep(0.01)
        with pytest.raises(grpc.RpcError) as err:
            client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        servicer.release.set()
        t.join()
    finally:
        srv.stop(0)


def test_graceful_stop_finishes_calls_in_flight() -> None:
    srv, servicer = make_server(grace_s=5)
    result: dict = {}

    def slow_call() -> None:
        client = RpcClient(srv.address, timeout_s=10)
        result["reply"] = client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request("slow"))

    t = threading.Thread(target=slow_call)
    t.start()
    while servicer.calls == 0:
        time.sleep(0.01)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    time.sleep(0.2)
    servicer.release.set()
    t.join(10)
    stopper.join(10)
    assert result["reply"].episodes[0].episode_id == "ok"
    assert check(srv.address, timeout_s=1) != "SERVING"


def _header_only(address: str, method: str, metadata: tuple = ()):  # noqa: ANN202
    """A call that sends its headers and never a body (no client deadline)."""
    release = threading.Event()

    def never():  # noqa: ANN202
        release.wait()
        return
        yield b""

    channel = grpc.insecure_channel(address)
    call = channel.stream_unary(method, request_serializer=lambda b: b,
                                response_deserializer=lambda b: b).future(
        never(), metadata=metadata or None)
    return call, release, channel


def test_a_request_that_never_arrives_is_cut_off_by_the_server() -> None:
    srv, _ = make_server(request_timeout_s=0.5, auth_token="s3cret-token")
    try:
        method = f"/{SERVICE}/Open"
        unauth = _header_only(srv.address, method)
        held = _header_only(srv.address, method, (("authorization", "Bearer s3cret-token"),))
        probe = _header_only(srv.address, "/grpc.health.v1.Health/Check")
        # refused at the headers: the body is never waited for
        with pytest.raises(grpc.RpcError) as err:
            unauth[0].result(timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for call, _, _ in (held, probe):  # authenticated or not: cut off by the server
            with pytest.raises(grpc.RpcError) as err:
                call.result(timeout=10)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not arrive" in err.value.details()
        for _, release, channel in (unauth, held, probe):
            release.set()
            channel.close()
        assert check(srv.address) == "SERVING"
        assert RpcClient(srv.address, token="s3cret-token").call(
            env_pb2_grpc.EnvServiceStub, "Open", open_request()).episodes
    finally:
        srv.stop(0)


def test_an_empty_token_never_turns_auth_off(tmp_path) -> None:  # noqa: ANN001
    from rlfleet.config import ConfigError, fleet_token

    with pytest.raises(ValueError):
        GrpcServer("test", ServerConfig(auth_token=""), [])
    newline = tmp_path / "token"
    newline.write_text("\n")
    for env in ({"RLFLEET_AUTH_TOKEN": ""}, {"RLFLEET_AUTH_TOKEN": " \n"},
                {"RLFLEET_AUTH_TOKEN_FILE": str(newline)},
                {"RLFLEET_AUTH_TOKEN": "", "RLFLEET_AUTH": "none"}, {}):
        with pytest.raises(ConfigError):
            fleet_token(env=env)
    assert fleet_token(env={"RLFLEET_AUTH": "none"}) is None  # explicitly off
    assert fleet_token("none", env={}) is None
    assert fleet_token(env={"RLFLEET_AUTH": "none", "RLFLEET_AUTH_TOKEN": "t"}) == "t"
    newline.write_text("t0k\n")
    assert fleet_token(env={"RLFLEET_AUTH_TOKEN_FILE": str(newline)}) == "t0k"


def test_retry_policy_is_gRPCs_service_config_for_the_named_methods() -> None:
    import json

    from rlfleet.rpc.client import RetryPolicy, service_config

    config = json.loads(service_config("rlfleet.v1.EnvService", {"Close", "ListTasks"},
                                       RetryPolicy()))
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "rlfleet.v1.EnvService", "method": "Close"},
                              {"service": "rlfleet.v1.EnvService", "method": "ListTasks"}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert method["retryPolicy"]["maxAttempts"] == 4
    assert service_config("rlfleet.v1.EnvService", set(), RetryPolicy()) is None
    assert service_config(None, set(), RetryPolicy(max_attempts=1)) is None
    for bad in ({"max_attempts": 6}, {"max_attempts": 0}, {"initial_backoff_s": 0},
                {"initial_backoff_s": 3.0, "max_backoff_s": 1.0}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_only_the_idempotent_methods_are_resent(server) -> None:
    srv, servicer = server
    once = RpcClient(srv.address, service=SERVICE, idempotent={"ListTasks"}, backoff_s=0.01)
    with pytest.raises(grpc.RpcError) as err:
        once.call(env_pb2_grpc.EnvServiceStub, "Open", open_request("unavailable"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.calls == 1  # not named idempotent: answered once
    resent = RpcClient(srv.address, service=SERVICE, idempotent={"Open"}, backoff_s=0.01)
    with pytest.raises(grpc.RpcError):
        resent.call(env_pb2_grpc.EnvServiceStub, "Open", open_request("unavailable"))
    assert servicer.calls == 1 + resent.policy.max_attempts  # re-sent by the channel
